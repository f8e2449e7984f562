// The decode step's mat-vec products alone, timed on a GPU host (issue #20): mmv.cuh's streaming
// core on the qwen3-30b-a3b shapes in Q8_0 (Q, K and V as one 5120 x 2048 product; the output
// projection, 2048 x 4096; gate and up of 8 routed experts, 2 x 768 x 2048 each; down, 2048 x 768
// each), with jobs that find their rows as decode.cu's do (the routing table, then the slot table),
// launched back to back as programmatic dependents in one CUDA graph over 8 copies of the weights
// (so that the 50 MB L2 holds none of them), next to a plain read of the same bytes: the share of
// memory bandwidth the core reaches and the fixed cost per launch. Not a test: it checks nothing.
// Build: scripts/gpu-mmv.sh's header says how; run: mmv-bench [replays].
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "codelets/cuda/common.cuh"
#include "codelets/cuda/decode_kernels.cuh"

#include "bench-check.cuh"

namespace {

constexpr uint32_t TY = ST_TYPE_Q8_0;
constexpr int D = 2048, FF = 768, QKV = 5120, QD = 4096, K = 8, NE = 16, E = 128, SETS = 8;

// The ceiling: every byte of the ranges read once with 16-byte loads, four in flight per thread.
struct ranges {
  const uint4 *p[K + 1];
  int64_t n16[K + 1];
  int n;
};
__global__ void __launch_bounds__(MMV_THREADS) k_read(const __grid_constant__ ranges rg, uint32_t *sink) {
  st_dev_griddep_launch();
  uint32_t acc = 0;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int r = 0; r < rg.n; r++) {
    const uint4 *p = rg.p[r];
    const int64_t n16 = rg.n16[r];
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; u++) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
      for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
      const uint4 v = __ldcs(p + i);
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  st_dev_griddep_wait();
  if (acc == 0x9e3779b9u) sink[0] = acc;
}


struct set {
  uint8_t *qkv, *o, *experts; // experts: NE x (gate, up, down)
  float *router;              // [E][D] float32 (the router stays float32)
  const uint8_t *const *slots; // device: NE slot pointers
};

constexpr uint64_t RB_D = D / 32 * 34, RB_QD = QD / 32 * 34, RB_FF = FF / 32 * 34;
constexpr uint64_t GATE = (uint64_t)FF * RB_D, EXPERT = 2 * GATE + (uint64_t)D * RB_FF;

struct ctx {
  set s[SETS];
  st_route *route; // K entries: experts 0, 2, 4, ... until dk_gateup's block 0 writes 0..7 (equal logits)
  float *x, *xq, *act, *out, *q;
  int8_t *xq8; // x quantised (D)
  float *h, *ffn_in, *logits, *xn, *ones; // the router's and dk_pre's rows
  int32_t *counters, *pos;                // [E]: last-block counters; the position and step number
  uint32_t *sink;
  int most, q8;
  cudaStream_t st;
};

// Launches a decode kernel as decode.cu's stream_launch does: at most the resident blocks (times
// grid_scale), a multiple of mult.
template <typename Kern, typename... Args>
void stream(Kern kernel, int groups, size_t smem, const ctx &c, int pdl, double grid_scale, int mult, Args... args) {
  int64_t most = (int64_t)(mmv_resident_blocks(kernel, smem) * grid_scale);
  most = most / mult * mult > 0 ? most / mult * mult : mult;
  st_cuda_launch(kernel, dim3((unsigned)(groups < most ? groups : most)), dim3(MMV_THREADS), smem, c.st, pdl, args...);
}

// One launch of kind k over set i: 0 QKV, 1 output projection, 2 gate/up, 3 down (decode_kernels.cuh's
// kernels and jobs); read: the ceiling; c.q8: the int8 kernels of gate/up and down.
// The routing dk_gateup and dk_down select from c's logits: softmax top-k, as qwen3moe's router.
static route_src bench_route_src(const ctx &c) {
  route_src rs = {};
  rs.logits = c.logits, rs.E = E, rs.k = K, rs.d = D, rs.w_scale = 1.0f, rs.route = c.route, rs.ffn_in = c.ffn_in;
  rs.seq = (const uint32_t *)(c.pos + 1);
  return rs;
}

template <bool Q8> void one_as(const ctx &c, int kind, int i, bool read, int pdl, double grid_scale, double *bytes) {
  const set &s = c.s[i];
  const size_t smem = mmv_pipe_bytes<TY>();
  ranges rg = {};
  if (kind <= 1) {
    const int64_t n = kind == 0 ? D : QD, rows = kind == 0 ? QKV : D;
    const uint64_t rb = kind == 0 ? RB_D : RB_QD;
    const uint8_t *W = kind == 0 ? s.qkv : s.o;
    const int R = mmv_stream_rows<TY>(n);
    dk_segs g = {};
    // QKV as decode.cu launches it: Q's rows on x quantised (the int8 kernels), K's and V's on float32
    const int64_t q_rows = kind == 0 && Q8 ? QD : 0;
    if (q_rows) g.s[g.n++] = dk_seg{W, rb, q_rows, c.q, (q_rows + R - 1) / R, 1};
    g.s[g.n++] = dk_seg{W + q_rows * rb, rb, rows - q_rows, c.q + q_rows, (rows - q_rows + R - 1) / R, 0};
    int groups = 0;
    for (int p = 0; p < g.n; p++) groups += (int)g.s[p].groups;
    rg.p[0] = (const uint4 *)W, rg.n16[0] = (int64_t)(rows * rb / 16), rg.n = 1;
    if (!read) {
      if (q_rows) stream(dk_mv<TY, true>, groups, smem, c, pdl, grid_scale, 1, g, groups, kind == 0 ? c.x : c.xq, (const int8_t *)c.xq8, n);
      else stream(dk_mv<TY, false>, groups, smem, c, pdl, grid_scale, 1, g, groups, kind == 0 ? c.x : c.xq, (const int8_t *)NULL, n);
    }
  } else if (kind == 2) {
    const int H = mmv_stream_rows<TY>(D) / 2, per = (FF + H - 1) / H;
    const gateup_job<Q8> j = {c.route, s.slots, NE, FF, H, per, GATE, RB_D, Q8 ? (const void *)c.xq8 : c.x, c.act};
    rg.n = K;
    for (int e = 0; e < K; e++) rg.p[e] = (const uint4 *)(s.experts + 2 * e * EXPERT), rg.n16[e] = (int64_t)(2 * GATE / 16);
    const route_src rs = bench_route_src(c);
    if (!read) stream(dk_gateup<TY, Q8>, per * K, smem + sizeof(float) * E, c, pdl, grid_scale, 1, j, rs, per * K, (int64_t)D);
  } else if (kind == 4) {
    constexpr uint32_t RT = ST_TYPE_F32;
    const int R = dk_router_rows<RT>(D); // its rows a block, as decode.cu launches it
    const size_t dyn = mmv_pipe_bytes<RT>() + sizeof(float) * D;
    rg.p[0] = (const uint4 *)s.router, rg.n16[0] = (int64_t)E * D * 4 / 16, rg.n = 1;
    if (!read)
      st_cuda_launch(dk_router<RT>, dim3((unsigned)((E + R - 1) / R)), dim3(MMV_THREADS), dyn, c.st, pdl, (const float *)c.x, (const float *)c.q,
             (const float *)c.ones, 1e-6f, D, (const uint8_t *)s.router, (uint64_t)D * 4, E, c.h, c.ffn_in, c.logits,
             Q8 ? c.xq8 : (int8_t *)NULL, (const float *)NULL, (const float *)NULL);
  } else if (kind == 5) { // dk_pre: the combine of 8 cached slots and the attention norm
    rg.n = 0;
    if (!read)
      st_cuda_launch(dk_pre, dim3(1), dim3(PRE_THREADS), sizeof(float) * D, c.st, pdl, (const st_route *)c.route, s.slots, NE, (const float *)c.out,
             (const float *)c.out, (const uint32_t *)NULL, (const uint32_t *)(c.pos + 1), (const float *)c.h, K, D, 1,
             (const float *)c.x, (const int32_t *)c.pos, c.pos, c.counters, 0, c.x, (const float *)c.ones, 1e-6f, c.xn,
             Q8 ? c.xq8 : (int8_t *)NULL, (const float *)NULL, (uint64_t *)NULL, 0);
  } else {
    const int R = mmv_stream_rows<TY>(FF), per = (D + R - 1) / R;
    const down_job<Q8> j = {c.route, NULL, s.slots, NE, D, R, per, FF, K, 2 * GATE, RB_FF, c.act, c.out, NULL};
    const route_src rs = bench_route_src(c); // dk_down's own selection, as dk_gateup's
    rg.n = K;
    for (int e = 0; e < K; e++) rg.p[e] = (const uint4 *)(s.experts + 2 * e * EXPERT + 2 * GATE), rg.n16[e] = (int64_t)(D * RB_FF / 16);
    if (!read)
      stream(dk_down<TY, Q8>, per * K, smem + (Q8 ? st_q8_stride(FF) : 0) + sizeof(float) * E, c, pdl, grid_scale, Q8 ? K : 1, j, rs,
             per * K, (int64_t)FF);
  }
  double b = 0;
  for (int r = 0; r < rg.n; r++) b += 16.0 * rg.n16[r];
  *bytes += b;
  if (read) st_cuda_launch(k_read, dim3((unsigned)(c.most * grid_scale)), dim3(MMV_THREADS), 0, c.st, pdl, rg, c.sink);
}
void one(const ctx &c, int kind, int i, bool read, int pdl, double grid_scale, double *bytes) {
  if (c.q8)
    one_as<true>(c, kind, i, read, pdl, grid_scale, bytes);
  else
    one_as<false>(c, kind, i, read, pdl, grid_scale, bytes);
}

// µs per replayed sequence of `layers` x kinds, and its bytes; per_layer: a CUDA graph per layer (as
// the engine's decode step has), its first kernel without a programmatic edge, else one graph.
double timed(const ctx &c, const std::vector<int> &kinds, bool read, int pdl, double grid_scale, int layers, int replays,
             double *bytes, bool per_layer = false) {
  const int n_graphs = per_layer ? layers : 1;
  std::vector<cudaGraph_t> g(n_graphs);
  std::vector<cudaGraphExec_t> ge(n_graphs);
  *bytes = 0;
  for (int gi = 0; gi < n_graphs; gi++) {
    CK(cudaStreamBeginCapture(c.st, cudaStreamCaptureModeThreadLocal));
    for (int l = per_layer ? gi : 0; l < (per_layer ? gi + 1 : layers); l++)
      for (size_t i = 0; i < kinds.size(); i++) one(c, kinds[i], l % SETS, read, per_layer && i == 0 ? 0 : pdl, grid_scale, bytes);
    CK(cudaStreamEndCapture(c.st, &g[gi]));
    CK(cudaGraphInstantiate(&ge[gi], g[gi], 0));
  }
  for (int gi = 0; gi < n_graphs; gi++) CK(cudaGraphLaunch(ge[gi], c.st));
  CK(cudaStreamSynchronize(c.st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, c.st));
  for (int r = 0; r < replays; r++)
    for (int gi = 0; gi < n_graphs; gi++) CK(cudaGraphLaunch(ge[gi], c.st));
  CK(cudaEventRecord(b, c.st));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  for (int gi = 0; gi < n_graphs; gi++) {
    CK(cudaGraphExecDestroy(ge[gi]));
    CK(cudaGraphDestroy(g[gi]));
  }
  return 1e3 * ms / replays;
}

} // namespace

int main(int argc, char **argv) {
  const int replays = argc > 1 ? atoi(argv[1]) : 20, layers = 48;
  ctx c = {};
  CK(cudaStreamCreateWithFlags(&c.st, cudaStreamNonBlocking));
  for (int i = 0; i < SETS; i++) {
    set &s = c.s[i];
    CK(cudaMalloc(&s.qkv, (size_t)QKV * RB_D));
    CK(cudaMalloc(&s.o, (size_t)D * RB_QD));
    CK(cudaMalloc(&s.experts, (size_t)NE * EXPERT));
    CK(cudaMemset(s.qkv, 0x11, (size_t)QKV * RB_D));
    CK(cudaMemset(s.o, 0x11, (size_t)D * RB_QD));
    CK(cudaMemset(s.experts, 0x11, (size_t)NE * EXPERT));
    CK(cudaMalloc(&s.router, (size_t)E * D * 4));
    CK(cudaMemset(s.router, 0, (size_t)E * D * 4)); // equal logits: top-k takes experts 0..7 (< NE)
    std::vector<const uint8_t *> h(NE);
    for (int e = 0; e < NE; e++) h[e] = s.experts + (size_t)e * EXPERT;
    CK(cudaMalloc((void **)&s.slots, NE * sizeof(void *)));
    CK(cudaMemcpy((void *)s.slots, h.data(), NE * sizeof(void *), cudaMemcpyHostToDevice));
  }
  st_route hr[K];
  for (int j = 0; j < K; j++) hr[j] = st_route{2 * j, 0.125f};
  CK(cudaMalloc(&c.route, sizeof hr));
  CK(cudaMemcpy(c.route, hr, sizeof hr, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&c.x, D * 4));
  CK(cudaMalloc(&c.xq, QD * 4));
  CK(cudaMalloc(&c.act, K * FF * 4));
  CK(cudaMalloc(&c.out, K * D * 4));
  CK(cudaMalloc(&c.q, QKV * 4));
  CK(cudaMalloc(&c.sink, 4));
  CK(cudaMemset(c.x, 0, D * 4));
  CK(cudaMemset(c.xq, 0, QD * 4));
  CK(cudaMemset(c.act, 0, K * FF * 4));
  CK(cudaMalloc(&c.xq8, st_q8_stride(D)));
  CK(cudaMemset(c.xq8, 0, st_q8_stride(D)));
  CK(cudaMalloc(&c.h, D * 4));
  CK(cudaMalloc(&c.ffn_in, D * 4));
  CK(cudaMalloc(&c.logits, E * 4));
  CK(cudaMemset(c.logits, 0, E * 4)); // equal logits until a router writes them (zero weights): experts 0..7
  CK(cudaMalloc(&c.xn, D * 4));
  CK(cudaMalloc(&c.ones, D * 4));
  CK(cudaMemset(c.h, 0, D * 4));
  CK(cudaMemset(c.out, 0, K * D * 4));
  CK(cudaMemset(c.q, 0, QKV * 4));
  {
    std::vector<float> one(D, 1.0f);
    CK(cudaMemcpy(c.ones, one.data(), D * 4, cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&c.counters, E * 4));
  CK(cudaMemset(c.counters, 0, E * 4));
  CK(cudaMalloc(&c.pos, 2 * 4));
  CK(cudaMemset(c.pos, 0, 2 * 4));
  CK(cudaFuncSetAttribute(dk_router<ST_TYPE_F32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          (int)(mmv_pipe_bytes<ST_TYPE_F32>() + sizeof(float) * D)));
  CK(cudaFuncSetAttribute(dk_down<TY, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          (int)(mmv_pipe_bytes<TY>() + st_q8_stride(FF) + sizeof(float) * E)));
  c.most = mmv_resident_blocks(dk_mv<TY, false>, mmv_pipe_bytes<TY>());
  printf("resident blocks: %d; staging %zu B per block; %d layers x %d replays\n", c.most, mmv_pipe_bytes<TY>(), layers,
         replays);
  const char *names[6] = {"QKV 5120x2048", "output 2048x4096", "gate+up 8x2x768x2048", "down 8x2048x768",
                          "router f32 128x2048", "dk_pre (combine, norm)"};
  printf("%-26s %-10s %6s %10s %8s %8s\n", "product", "kernel", "grid", "us/launch", "MB", "GB/s");
  for (int k = 0; k < 7; k++) {
    const std::vector<int> kinds = k < 6 ? std::vector<int>{k} : std::vector<int>{5, 0, 1, 4, 2, 3};
    const char *nm = k < 6 ? names[k] : "layer: all six (no attention)";
    for (int v = 0; v < 5; v++) {
      const bool read = v == 2;
      if (k == 5 && (v == 1 || v == 2 || v == 4)) continue;
      const double scale = v == 1 || v == 4 ? 0.5 : 1.0;
      const int pdl = 1;
      c.q8 = v >= 3;
      double bytes = 0;
      const double us = timed(c, kinds, read, pdl, scale, layers, replays, &bytes) / layers;
      bytes /= layers;
      const char *vn[5] = {"f32 x", "f32 x", "read", "int8 x", "int8 x"};
      printf("%-26s %-10s %5.2fx %10.2f %8.2f %8.0f\n", nm, vn[v], scale, us, bytes / 1e6, bytes / us / 1e3);
    }
  }
  // a layer's mat-vec kernels in the engine's order (int8 activations, no attention), with and
  // without PDL, in one CUDA graph or a graph a layer (as the engine's decode step has)
  printf("\n%-40s %5s %8s %10s\n", "layer (no attention), int8 x", "PDL", "graphs", "us/layer");
  c.q8 = 1;
  for (int pdl = 0; pdl < 2; pdl++)
    for (int per = 0; per < 2; per++) {
      double bytes = 0;
      const double us = timed(c, {0, 1, 4, 2, 3, 5}, false, pdl, 1.0, layers, replays, &bytes, per) / layers;
      printf("%-40s %5d %8s %10.2f\n", "QKV, O, router, gate+up, down, dk_pre", pdl, per ? "a layer" : "one", us);
    }
  return 0;
}
