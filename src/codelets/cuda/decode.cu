// CUDA variants of the decode step's GPU tasks (decode.h): a layer's dense work with its cached
// experts, and the output head, each one CUDA graph captured once and replayed
// (st_cuda_graph_replay) over the engine's persistent device buffers, the token's position and the
// step number read from device memory. A layer the CPU pool has pairs of hands its routing and FFN
// input to the CPU pool through the mailbox (dk_router's last block) and the next layer's dk_pre
// takes the pool's rows from it (codelets/decode.h).
//
// A layer is eight kernels: dk_pre (the previous layer's combine and the attention norm), dk_mv
// (Q, K and V in one launch when their types agree), rope_append and attend_decode_all
// (attention.cu), dk_mv (the output projection), dk_router (residual, FFN norm, router logits and,
// in the last block to finish, softmax, top-k and the mailbox), dk_gateup (gate, up and SwiGLU of every cached
// routed expert) and dk_down (down, weighted). The mat-vec products share mmv.cuh's block core with
// st_cuda_matmul and st_cuda_grouped_matmul, and every other step repeats the float operations of
// the per-task kernels (rmsnorm_kernel, combine_token, residual_piece, swiglu, softmax_topk), so a
// decode step gives the same bits as the per-task path (STRATA_DECODE_GRAPH=0).
#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"
#include "codelets/cuda/mmv.cuh"
#include "codelets/decode.h"
#include "common.h"

namespace {

#define PRE_THREADS 1024
#define NORM_THREADS 256 /* rmsnorm_kernel's block: its sums' order */

// The mailbox's flags (codelets/decode.h): system-scope acquire loads and release stores on
// mapped host memory.
__device__ __forceinline__ uint32_t dk_flag_load(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void dk_flag_store(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Once every thread of the block has written its part of the mailbox: fence (system scope), then
// *flag = *seq (every thread of the block calls it).
__device__ __forceinline__ void dk_raise(uint32_t *flag, const uint32_t *seq) {
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) dk_flag_store(flag, *seq);
}

// x = h + the k slots' rows added in slot order (combine != 0: a slot whose pair is in this card's
// cache, slot_ptr != NULL, from gpu_out, the others from the mailbox's rows cpu_out, once the CPU
// pool has raised *cpu_flag to the step number *seq when a slot is the CPU pool's and cpu_flag is
// set; plain adds, as combine_token), else (layer 0) x = the mailbox's embedding row `emb`, with
// the step's position and number copied from the mailbox to pos[0..1] and the n_counters fused
// kernels' counters zeroed; then xn = RMSNorm(x) * w as rmsnorm_kernel computes it. One block;
// dynamic shared memory: d floats.
__global__ void __launch_bounds__(PRE_THREADS)
    dk_pre(const st_route *route, const uint8_t *const *slot_ptr, int n_expert, const float *gpu_out,
           const float *cpu_out, const uint32_t *cpu_flag, const uint32_t *seq, const float *h, int k, int d,
           int combine, const float *emb, const int32_t *pos_seq, int32_t *pos, int32_t *counters, int n_counters,
           float *x, const float *w, float eps, float *xn) {
  extern __shared__ float xs[];
  __shared__ const float *src[64];
  __shared__ int from_cpu[64], any_cpu;
  __shared__ float red[32];
  st_dev_griddep_launch();
  if (combine) {
    if (threadIdx.x == 0) any_cpu = 0;
    __syncthreads();
    if ((int)threadIdx.x < k) {
      const int e = min(max(route[threadIdx.x].expert, 0), n_expert - 1);
      from_cpu[threadIdx.x] = !slot_ptr[e];
      src[threadIdx.x] = (slot_ptr[e] ? gpu_out : cpu_out) + (size_t)threadIdx.x * d;
      if (!slot_ptr[e]) atomicOr(&any_cpu, 1);
    }
    __syncthreads();
    if (threadIdx.x == 0 && cpu_flag && any_cpu)
      for (const uint32_t want = *seq; dk_flag_load(cpu_flag) != want;) __nanosleep(128);
    __syncthreads();
    // two of the thread's elements at a time, every load of a row group in flight (the mailbox's
    // rows cross the bus); each element's sum in slot order
    for (int i0 = threadIdx.x; i0 < d; i0 += 2 * blockDim.x) {
      const int i1 = i0 + blockDim.x, two = i1 < d;
      float acc0 = 0.0f, acc1 = 0.0f;
      for (int j0 = 0; j0 < k; j0 += 8) {
        float v0[8], v1[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
          if (j0 + u < k) {
            const float *r = src[j0 + u];
            v0[u] = from_cpu[j0 + u] ? __ldcv(r + i0) : r[i0];
            v1[u] = two ? (from_cpu[j0 + u] ? __ldcv(r + i1) : r[i1]) : 0.0f;
          }
#pragma unroll
        for (int u = 0; u < 8; u++)
          if (j0 + u < k) acc0 = __fadd_rn(acc0, v0[u]), acc1 = __fadd_rn(acc1, v1[u]);
      }
      x[i0] = xs[i0] = __fadd_rn(acc0, h[i0]);
      if (two) x[i1] = xs[i1] = __fadd_rn(acc1, h[i1]);
    }
  } else {
    if (threadIdx.x < 2) pos[threadIdx.x] = __ldcv(pos_seq + threadIdx.x);
    for (int i = threadIdx.x; i < n_counters; i += blockDim.x) counters[i] = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      const float v = __ldcv(emb + i);
      x[i] = v;
      xs[i] = v;
    }
  }
  __syncthreads();
  float ss = 0.0f;
  if (threadIdx.x < NORM_THREADS)
    for (int i = threadIdx.x; i < d; i += NORM_THREADS) ss = fmaf(xs[i], xs[i], ss);
  ss = st_warp_sum(ss);
  if ((threadIdx.x & 31) == 0 && threadIdx.x < NORM_THREADS) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.0f;
  for (int i = 0; i < NORM_THREADS / 32; i++) tot += red[i];
  const float scale = rsqrtf(tot / (float)d + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) xn[i] = xs[i] * scale * w[i];
}

// Up to three matrices of one type times the same vector in one launch: the row groups of segment
// 0, then those of segment 1, ... (mmv_stream_rows(n) rows each).
struct dk_seg {
  const uint8_t *W;
  uint64_t row_bytes;
  int64_t rows;
  float *out;
  int64_t groups;
};
struct dk_segs {
  dk_seg s[3];
  int n;
};

struct mv_job {
  static constexpr bool static_rows = true, x_shared = false;
  const dk_segs *g;
  const float *xv;
  int R;
  __device__ int seg(int64_t &grp) const {
    int i = 0;
    while (i + 1 < g->n && grp >= g->s[i].groups) grp -= g->s[i].groups, i++;
    return i;
  }
  __device__ int count(int64_t grp) const {
    const int i = seg(grp);
    return (int)min((int64_t)R, g->s[i].rows - grp * R);
  }
  __device__ const uint8_t *row(int64_t grp, int r) const {
    const int i = seg(grp);
    return g->s[i].W + (uint64_t)(grp * R + r) * g->s[i].row_bytes;
  }
  __device__ const float *x(int64_t) const { return xv; }
  __device__ void put(int64_t grp, const float *res, int nr) const {
    const int i = seg(grp);
    if ((int)threadIdx.x < nr) g->s[i].out[grp * R + threadIdx.x] = res[threadIdx.x];
  }
};

template <uint32_t TYPE>
__global__ void MMV_BOUNDS(1) dk_mv(const __grid_constant__ dk_segs g, int64_t n_groups, const float *x, int64_t n) {
  extern __shared__ uint4 dyn_smem[];
  __shared__ mmv_pipe<TYPE> sm;
  st_dev_griddep_launch();
  mmv_table<TYPE>(sm.kv);
  const mv_job job = {&g, x, mmv_stream_rows<TYPE>(n)};
  mmv_stream(sm, dyn_smem, job, n_groups, n, [] { st_dev_griddep_wait(); });
}

// h = x + xo (residual_piece), ffn_in = RMSNorm(h) * w (rmsnorm_kernel), both computed by every
// block into shared memory and written by block 0; then the router logits of the block's rows; the
// last block to finish (*counter, reset by it) runs softmax and top-k into route and, when pub_flag
// is set, publishes the routing and ffn_in to the mailbox (pub_route, pub_x), fences (system scope)
// and raises *pub_flag to the step number *seq. Dynamic shared memory: the staging buffers, then
// d + E floats.
struct router_job {
  static constexpr bool static_rows = true, x_shared = true;
  const uint8_t *W;
  uint64_t row_bytes;
  int E, R;
  const float *xs;
  float *logits;
  __device__ int count(int64_t g) const { return (int)min((int64_t)R, (int64_t)E - g * R); }
  __device__ const uint8_t *row(int64_t g, int r) const { return W + (uint64_t)(g * R + r) * row_bytes; }
  __device__ const float *x(int64_t) const { return xs; }
  __device__ void put(int64_t g, const float *res, int nr) const {
    if ((int)threadIdx.x < nr) logits[g * R + threadIdx.x] = res[threadIdx.x];
  }
};

template <uint32_t TYPE>
__global__ void MMV_BOUNDS(1) dk_router(const float *x, const float *xo, const float *w, float eps, int d, const uint8_t *W,
                                        uint64_t row_bytes, int E, int k, float *h, float *ffn_in, float *logits,
                                        st_route *route, int *counter, st_route *pub_route, float *pub_x,
                                        uint32_t *pub_flag, const uint32_t *seq) {
  extern __shared__ uint4 dyn_smem[];
  float *xs = (float *)((uint8_t *)dyn_smem + mmv_pipe_bytes<TYPE>());
  __shared__ mmv_pipe<TYPE> sm;
  __shared__ float red[32];
  __shared__ int last;
  st_dev_griddep_launch();
  mmv_table<TYPE>(sm.kv);
  const int R = mmv_stream_rows<TYPE>(d);
  const router_job job = {W, row_bytes, E, R, xs, logits};
  mmv_stream(sm, dyn_smem, job, (E + R - 1) / R, d, [&] {
    st_dev_griddep_wait();
    // every load of the thread first (d <= 4096, gpu_layouts_ok), then the sums in element order
    constexpr int PER = 4096 / MMV_THREADS;
    float xv[PER], wv[PER];
#pragma unroll
    for (int u = 0; u < PER; u++) {
      const int i = threadIdx.x + u * MMV_THREADS;
      xv[u] = i < d ? x[i] + xo[i] : 0.0f;
      wv[u] = i < d ? w[i] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < PER; u++) {
      const int i = threadIdx.x + u * MMV_THREADS;
      if (i >= d) break;
      ss = fmaf(xv[u], xv[u], ss);
      if (blockIdx.x == 0) h[i] = xv[u];
    }
    ss = st_block_sum(ss, red);
    const float scale = rsqrtf(ss / (float)d + eps);
#pragma unroll
    for (int u = 0; u < PER; u++) {
      const int i = threadIdx.x + u * MMV_THREADS;
      if (i >= d) break;
      const float v = xv[u] * scale * wv[u];
      xs[i] = v;
      if (blockIdx.x == 0) ffn_in[i] = v;
    }
  }); // the stream's barriers order the writes to xs before the first group's reads
  __threadfence(); // each writer's logits are visible device-wide before the block counts itself done
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  float *l = xs + d;
  for (int e = threadIdx.x; e < E; e += blockDim.x) l[e] = __ldcg(logits + e);
  __syncthreads();
  if (threadIdx.x < 32) st_dev_softmax_topk(l, E, k, route);
  if (threadIdx.x == 0) *counter = 0;
  if (!pub_flag) return;
  __syncthreads(); // the routing is written
  for (int i = threadIdx.x; i < d; i += blockDim.x) pub_x[i] = xs[i];
  if ((int)threadIdx.x < k) pub_route[threadIdx.x] = route[threadIdx.x];
  dk_raise(pub_flag, seq);
}

// The cached pair of routing slot j (NULL: another tier computes it).
__device__ __forceinline__ const uint8_t *dk_slot(const st_route *route, const uint8_t *const *slot_ptr, int n_expert,
                                                  int j) {
  return slot_ptr[min(max(route[j].expert, 0), n_expert - 1)];
}

// act[j][r] = silu(gate_r x) * up_r x for the ff rows of every routing slot j whose pair is in this
// card's cache (swiglu's float operations). A group is (slot j, H rows): its first H rows from
// gate, its last H from up (H = mmv_stream_rows(n) / 2; rows past ff repeat the last one).
struct gateup_job {
  static constexpr bool static_rows = false, x_shared = false;
  const st_route *route;
  const uint8_t *const *slot_ptr;
  int n_expert, ff, H;
  int64_t per; // groups per slot
  uint64_t up_off, row_bytes;
  const float *xv;
  float *act;
  __device__ int count(int64_t g) const { return dk_slot(route, slot_ptr, n_expert, (int)(g / per)) ? 2 * H : 0; }
  __device__ const uint8_t *row(int64_t g, int r) const {
    const uint8_t *p = dk_slot(route, slot_ptr, n_expert, (int)(g / per));
    const int64_t rr = min((g % per) * H + r % H, (int64_t)ff - 1);
    return p + (r < H ? 0 : up_off) + (uint64_t)rr * row_bytes;
  }
  __device__ const float *x(int64_t) const { return xv; }
  __device__ void put(int64_t g, const float *res, int nr) const {
    const int64_t j = g / per, r0 = (g % per) * H;
    if (nr && (int)threadIdx.x < H && r0 + threadIdx.x < ff) {
      const float gv = res[threadIdx.x], uv = res[H + threadIdx.x];
      act[j * ff + r0 + threadIdx.x] = gv / (1.0f + expf(-gv)) * uv;
    }
  }
};

template <uint32_t TYPE>
__global__ void MMV_BOUNDS(1) dk_gateup(const __grid_constant__ gateup_job job, int64_t n_groups, int64_t n) {
  extern __shared__ uint4 dyn_smem[];
  __shared__ mmv_pipe<TYPE> sm;
  st_dev_griddep_launch();
  mmv_table<TYPE>(sm.kv);
  mmv_stream(sm, dyn_smem, job, n_groups, n, [] { st_dev_griddep_wait(); });
}

// out[j][r] = weight_j * down_r act[j] for the d rows of every routing slot j whose pair is in this
// card's cache (the grouped kernel's scaling). A group is (slot j, R rows).
struct down_job {
  static constexpr bool static_rows = false, x_shared = false;
  const st_route *route;
  const uint8_t *const *slot_ptr;
  int n_expert, d, R;
  int64_t per, ff;
  uint64_t down_off, row_bytes;
  const float *act;
  float *out;
  __device__ int count(int64_t g) const {
    return dk_slot(route, slot_ptr, n_expert, (int)(g / per)) ? (int)min((int64_t)R, d - (g % per) * R) : 0;
  }
  __device__ const uint8_t *row(int64_t g, int r) const {
    return dk_slot(route, slot_ptr, n_expert, (int)(g / per)) + down_off + (uint64_t)((g % per) * R + r) * row_bytes;
  }
  __device__ const float *x(int64_t g) const { return act + (g / per) * ff; }
  __device__ void put(int64_t g, const float *res, int nr) const {
    const int64_t j = g / per;
    if ((int)threadIdx.x < nr) out[j * d + (g % per) * R + threadIdx.x] = res[threadIdx.x] * route[j].weight;
  }
};

template <uint32_t TYPE>
__global__ void MMV_BOUNDS(1) dk_down(const __grid_constant__ down_job job, int64_t n_groups, int64_t n) {
  extern __shared__ uint4 dyn_smem[];
  __shared__ mmv_pipe<TYPE> sm;
  st_dev_griddep_launch();
  mmv_table<TYPE>(sm.kv);
  mmv_stream(sm, dyn_smem, job, n_groups, n, [] { st_dev_griddep_wait(); });
}

// ---- launchers ---------------------------------------------------------------------------------

struct mv_part {
  uint32_t type;
  const void *W;
  uint64_t row_bytes;
  int64_t rows;
  float *out;
};

// out_i = W_i x for the parts (x: n floats), one dk_mv launch per run of parts of one type.
void mv_launch(const mv_part *parts, int n_parts, const float *x, int64_t n, int pdl, cudaStream_t st) {
  for (int i = 0; i < n_parts;) {
    const int i0 = i;
    const uint32_t type = parts[i].type;
    while (i < n_parts && i - i0 < 3 && parts[i].type == type) i++;
    mmv_dispatch(type, [&](auto ty) {
      constexpr uint32_t TY = decltype(ty)::value;
      const int R = mmv_stream_rows<TY>(n);
      dk_segs g = {};
      int64_t groups = 0;
      for (int p = i0; p < i; p++, g.n++) {
        g.s[g.n] = dk_seg{(const uint8_t *)parts[p].W, parts[p].row_bytes, parts[p].rows, parts[p].out,
                          (parts[p].rows + R - 1) / R};
        groups += g.s[g.n].groups;
      }
      auto kernel = dk_mv<TY>;
      static const int most = mmv_resident_blocks(kernel, mmv_pipe_bytes<TY>());
      st_cuda_launch(kernel, dim3((unsigned)(groups < most ? groups : most)), dim3(MMV_THREADS), mmv_pipe_bytes<TY>(), st,
                     pdl, g, groups, x, n);
    });
  }
}

// Lets every decode kernel of every format take the dynamic shared memory it asks for (the float
// formats' staging buffers pass the default 48 KiB): once per engine (a device reset at StarPU's
// shutdown forgets the attributes), on the primary GPU's worker thread, before any capture.
void allow_smem(const st_decode_ctx *c) {
  if (*c->smem_set) return;
  *c->smem_set = 1;
  const int n_embd = c->n_embd, n_expert = c->n_expert;
  for (uint32_t t = 0; t < ST_TYPE_COUNT; t++)
    mmv_dispatch(t, [&](auto ty) {
      constexpr uint32_t TY = decltype(ty)::value;
      const int p = (int)mmv_pipe_bytes<TY>(), r = p + (int)sizeof(float) * (n_embd + n_expert);
      ST_CUDA_CHECK(cudaFuncSetAttribute(dk_mv<TY>, cudaFuncAttributeMaxDynamicSharedMemorySize, p));
      ST_CUDA_CHECK(cudaFuncSetAttribute(dk_gateup<TY>, cudaFuncAttributeMaxDynamicSharedMemorySize, p));
      ST_CUDA_CHECK(cudaFuncSetAttribute(dk_down<TY>, cudaFuncAttributeMaxDynamicSharedMemorySize, p));
      ST_CUDA_CHECK(cudaFuncSetAttribute(dk_router<TY>, cudaFuncAttributeMaxDynamicSharedMemorySize, r));
    });
}

// Whether the current device takes programmatic dependent launches (compute capability 9.0 or more).
int pdl_ok() {
  static int known[64]; // per device: 0 unknown, 1 no, 2 yes
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return cudaGetLastError(), 0;
  if (!known[dev]) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) cudaGetLastError();
    known[dev] = major >= 9 ? 2 : 1;
  }
  return known[dev] == 2;
}

// What a layer's graph reads besides the context: the weight and KV device pointers of the task.
struct layer_graph {
  const st_decode_gpu_args *a;
  const void *w[9]; // attn_norm wq wk wv wo q_norm k_norm ffn_norm router
  float *k[ST_CUDA_MAX_KV_HEADS], *v[ST_CUDA_MAX_KV_HEADS];
};

// The cached experts of layer l; pdl: the first kernel may overlap the previous one of the graph.
void experts_body(const st_decode_ctx *c, int l, int pdl, cudaStream_t st) {
  const st_decode_dev &D = c->dev;
  const st_decode_layer *L = &c->layers[l];
  const int k = c->k, d = c->n_embd, ff = c->n_ff;
  const st_route *route = D.route + (size_t)l * k;
  const uint8_t *const *slots = D.slot_ptr + (size_t)l * c->n_expert;
  mmv_dispatch(L->gate_d.type, [&](auto ty) {
    constexpr uint32_t TY = decltype(ty)::value;
    const int H = mmv_stream_rows<TY>(d) / 2; // gpu_layouts_ok: at least 1
    const int64_t per_g = (ff + H - 1) / H;
    const gateup_job gj = {route, slots, c->n_expert, ff, H, per_g, L->gate_bytes, L->gate_d.row_bytes, D.ffn_in, D.act};
    auto kernel = dk_gateup<TY>;
    static const int most = mmv_resident_blocks(kernel, mmv_pipe_bytes<TY>());
    const int64_t groups = per_g * k;
    st_cuda_launch(kernel, dim3((unsigned)(groups < most ? groups : most)), dim3(MMV_THREADS), mmv_pipe_bytes<TY>(), st,
                   pdl, gj, groups, (int64_t)d);
  });
  mmv_dispatch(L->down_d.type, [&](auto ty) {
    constexpr uint32_t TY = decltype(ty)::value;
    const int Rd = mmv_stream_rows<TY>(ff);
    const int64_t per_d = (d + Rd - 1) / Rd;
    const down_job dj = {route, slots, c->n_expert, d, Rd, per_d, ff, L->gate_bytes + L->up_bytes, L->down_d.row_bytes,
                         D.act, D.gpu_out};
    auto kernel = dk_down<TY>;
    static const int most = mmv_resident_blocks(kernel, mmv_pipe_bytes<TY>());
    const int64_t groups = per_d * k;
    st_cuda_launch(kernel, dim3((unsigned)(groups < most ? groups : most)), dim3(MMV_THREADS), mmv_pipe_bytes<TY>(), st,
                   pdl, dj, groups, (int64_t)ff);
  });
}

// The step number in device memory (after the position).
const uint32_t *dev_seq(const st_decode_dev &D) { return (const uint32_t *)(D.pos + 1); }

// dk_pre over layer l's input (combine: add layer l - 1's expert rows first, waiting for the CPU
// pool's rows in the mailbox when wait_cpu) with norm w; the first kernel of its graph.
void pre_launch(const st_decode_ctx *c, int l, int combine, int wait_cpu, const float *w, cudaStream_t st) {
  const st_decode_dev &D = c->dev;
  const int lp = l > 0 ? l - 1 : 0;
  const float *rows = c->dmail.cpu_out + (size_t)lp * c->k * c->n_embd;
  const uint32_t *flag = wait_cpu ? c->dmail.cpu_seq + (size_t)lp * ST_MAIL_FLAG_STRIDE : NULL;
  dk_pre<<<1, PRE_THREADS, sizeof(float) * (size_t)c->n_embd, st>>>(
      D.route + (size_t)lp * c->k, D.slot_ptr + (size_t)lp * c->n_expert, c->n_expert, D.gpu_out, rows, flag,
      dev_seq(D), D.h, c->k, c->n_embd, combine, c->dmail.emb, c->dmail.pos_seq, D.pos, D.counters, c->n_head + 1, D.x,
      w, c->eps, D.xn);
}

void layer_body(const void *args, cudaStream_t st) {
  const layer_graph *g = (const layer_graph *)args;
  const st_decode_gpu_args *a = g->a;
  const st_decode_ctx *c = a->ctx;
  const st_decode_dev &D = c->dev;
  const st_decode_layer *L = &c->layers[a->layer];
  const int d = c->n_embd, hd = c->head_dim, G = c->n_head_kv, Hq = c->n_head, E = c->n_expert;
  const int pdl = c->pdl && pdl_ok();
  pre_launch(c, a->layer, a->combine, a->has_cpu_in, (const float *)g->w[0], st);
  const mv_part qkv[3] = {{L->wq_d.type, g->w[1], L->wq_d.row_bytes, (int64_t)Hq * hd, D.q},
                          {L->wk_d.type, g->w[2], L->wk_d.row_bytes, (int64_t)G * hd, D.kvnew},
                          {L->wv_d.type, g->w[3], L->wv_d.row_bytes, (int64_t)G * hd, D.kvnew + (size_t)G * hd}};
  mv_launch(qkv, 3, D.xn, d, pdl, st);
  st_cuda_rope_append(D.q, Hq, D.kvnew, G, hd, (const float *)g->w[5], (const float *)g->w[6], c->eps, D.pos,
                      c->rope_theta, g->k, g->v, pdl, st);
  st_cuda_attend_decode_all(D.q, Hq, G, hd, g->k, g->v, D.pos, D.part, D.counters, D.attn, pdl, st);
  const mv_part o = {L->wo_d.type, g->w[4], L->wo_d.row_bytes, d, D.xo};
  mv_launch(&o, 1, D.attn, (int64_t)Hq * hd, pdl, st);
  mmv_dispatch(L->router_d.type, [&](auto ty) {
    constexpr uint32_t TY = decltype(ty)::value;
    const int Rr = mmv_stream_rows<TY>(d);
    auto kernel = dk_router<TY>;
    const size_t dyn = mmv_pipe_bytes<TY>() + sizeof(float) * ((size_t)d + (size_t)E);
    const st_decode_mail &M = c->dmail;
    const size_t l = (size_t)a->layer;
    st_cuda_launch(kernel, dim3((unsigned)((E + Rr - 1) / Rr)), dim3(MMV_THREADS), dyn, st, pdl, D.x, D.xo,
                   (const float *)g->w[7], c->eps, d, (const uint8_t *)g->w[8], L->router_d.row_bytes, E, c->k, D.h,
                   D.ffn_in, D.rlogits, D.route + l * c->k, D.counters + Hq, M.xroute + l * c->k, M.xffn + l * d,
                   a->has_xin ? M.xin_seq + l * ST_MAIL_FLAG_STRIDE : (uint32_t *)NULL, dev_seq(D));
  });
  experts_body(c, a->layer, pdl, st);
}

struct head_graph {
  const st_decode_gpu_args *a;
  const float *norm;
  const void *w;
};

// The step's routing to the mailbox (n entries), then, once every write of the step to the
// mailbox is out (the head's logits came from the previous kernel), *flag = *seq. One block.
__global__ void dk_head_done(const st_route *route, int n, st_route *to, uint32_t *flag, const uint32_t *seq) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) to[i] = route[i];
  dk_raise(flag, seq);
}

void head_body(const void *args, cudaStream_t st) {
  const head_graph *g = (const head_graph *)args;
  const st_decode_ctx *c = g->a->ctx;
  const st_decode_dev &D = c->dev;
  pre_launch(c, c->n_layer, 1, g->a->has_cpu_in, g->norm, st);
  const mv_part head = {c->output_d.type, g->w, c->output_d.row_bytes, c->n_vocab, c->dmail.logits};
  mv_launch(&head, 1, D.xn, c->n_embd, c->pdl && pdl_ok(), st);
  dk_head_done<<<1, 256, 0, st>>>(D.route, c->n_layer * c->k, c->dmail.route, c->dmail.head_seq, dev_seq(D));
}

// Graph keys: graph_key0 + 3 l the task of layer l, graph_key0 + 3 n_layer the head.
int key_of(const st_decode_ctx *c, int layer, int kind) { return c->graph_key0 + 3 * layer + kind; }

void decode_gpu_run(void *buffers[], void *cl_arg);

void decode_gpu_cuda(void *buffers[], void *cl_arg) {
  const double t0 = st_cuda_now_ns();
  decode_gpu_run(buffers, cl_arg);
  st_cuda_decode_host_time(t0);
}

// FNV-1a over the words that went into a graph's kernel arguments.
struct sig_hash {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t v) {
    for (int b = 0; b < 8; b++) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  void add(const void *p) { add((uint64_t)(uintptr_t)p); }
};

void decode_gpu_run(void *buffers[], void *cl_arg) {
  const st_decode_gpu_args *a = (const st_decode_gpu_args *)cl_arg;
  const st_decode_ctx *c = a->ctx;
  cudaStream_t st = starpu_cuda_get_local_stream();
  allow_smem(c);
  sig_hash sig;
  if (a->layer == c->n_layer) {
    head_graph g = {a, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]), (const void *)STARPU_VECTOR_GET_PTR(buffers[1])};
    sig.add(g.norm);
    sig.add(g.w);
    sig.add((uint64_t)a->has_cpu_in);
    st_cuda_graph_replay(st, key_of(c, c->n_layer, 0), sig.h, head_body, &g);
    ST_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int G = c->n_head_kv;
  layer_graph g;
  g.a = a;
  for (int i = 0; i < 9; i++) {
    g.w[i] = (const void *)STARPU_VECTOR_GET_PTR(buffers[i]);
    sig.add(g.w[i]);
  }
  for (int gi = 0; gi < G; gi++) {
    g.k[gi] = (float *)STARPU_VECTOR_GET_PTR(buffers[9 + 2 * gi]);
    g.v[gi] = (float *)STARPU_VECTOR_GET_PTR(buffers[10 + 2 * gi]);
    sig.add(g.k[gi]);
    sig.add(g.v[gi]);
  }
  sig.add((uint64_t)(a->combine | a->has_cpu_in << 1 | a->has_xin << 2));
  st_cuda_graph_replay(st, key_of(c, a->layer, 0), sig.h, layer_body, &g);
  ST_CUDA_CHECK(cudaGetLastError());
}

starpu_codelet decode_gpu_cl = [] {
  starpu_codelet cl = {};
  cl.cuda_funcs[0] = decode_gpu_cuda;
  cl.cuda_flags[0] = STARPU_CUDA_ASYNC;
  cl.nbuffers = STARPU_VARIABLE_NBUFFERS;
  cl.name = "decode_layer";
  return cl;
}();

} // namespace

extern "C" int st_cuda_mmv_takes(uint32_t type, uint64_t row_bytes, int64_t n) {
  bool ok = false;
  mmv_dispatch(type, [&](auto ty) {
    constexpr uint32_t T = decltype(ty)::value;
    int dev = 0, smem = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
      cudaGetLastError();
    ok = n % mmv_format<T>::QK == 0 && row_bytes % mmv_format<T>::ALIGN == 0 &&
         mmv_pipe_bytes<T>() + sizeof(float) * (4096 + 1024) <= (size_t)smem;
  });
  return ok;
}

extern "C" int st_submit_decode_gpu(const st_decode_gpu_args *a, size_t args_size, starpu_data_handle_t *bufs, int nbufs,
                                    st_target tgt, const char *name) {
  enum starpu_data_access_mode modes[16 + 2 * ST_CUDA_MAX_KV_HEADS];
  if (nbufs > (int)(sizeof modes / sizeof modes[0])) return st_set_error(ST_EINVAL, "%s: too many buffers", name);
  const st_decode_ctx *c = a->ctx;
  for (int i = 0; i < nbufs; i++) modes[i] = STARPU_R;
  if (a->layer < c->n_layer)
    for (int i = 0; i < 2 * c->n_head_kv; i++) modes[9 + i] = STARPU_RW;
  return st_submit_task(&decode_gpu_cl, bufs, modes, nbufs, a, args_size, tgt, name);
}

