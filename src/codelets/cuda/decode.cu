// CUDA variants of the decode step's GPU tasks (decode.h): a layer's dense work, its cached experts
// and the output head, each one CUDA graph captured once and replayed (st_cuda_graph_replay) over
// the engine's persistent device buffers, the token's position read from device memory.
//
// A layer is eight kernels: dk_pre (the previous layer's combine and the attention norm), dk_mv
// (Q, K and V in one launch when their types agree), rope_append and attend_decode_all
// (attention.cu), dk_mv (the output projection), dk_router (residual, FFN norm, router logits and,
// in the last block to finish, softmax and top-k), dk_gateup (gate, up and SwiGLU of every cached
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

// x = h + the k slots' rows added in slot order (combine != 0: a slot whose pair is in this card's
// cache, slot_ptr != NULL, from gpu_out, the others from cpu_out; plain adds, as combine_token),
// else x as it is; then xn = RMSNorm(x) * w as rmsnorm_kernel computes it. One block; dynamic
// shared memory: d floats.
__global__ void __launch_bounds__(PRE_THREADS)
    dk_pre(const st_route *route, const uint8_t *const *slot_ptr, int n_expert, const float *gpu_out,
           const float *cpu_out, const float *h, int k, int d, int combine, float *x, const float *w, float eps,
           float *xn) {
  extern __shared__ float xs[];
  __shared__ const float *src[64];
  __shared__ float red[32];
  if (combine) {
    if ((int)threadIdx.x < k) {
      const int e = min(max(route[threadIdx.x].expert, 0), n_expert - 1);
      src[threadIdx.x] = (slot_ptr[e] ? gpu_out : cpu_out) + (size_t)threadIdx.x * d;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < k; j++) acc = __fadd_rn(acc, src[j][i]);
      const float v = __fadd_rn(acc, h[i]);
      x[i] = v;
      xs[i] = v;
    }
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x) xs[i] = x[i];
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

// Up to three matrices of one type times the same vector in one launch: the blocks of segment 0,
// then those of segment 1, ... (mmv_block_rows(n) rows each).
struct dk_seg {
  const uint8_t *W;
  uint64_t row_bytes;
  int64_t rows;
  float *out;
  int64_t blocks;
};
struct dk_segs {
  dk_seg s[3];
  int n;
};

template <uint32_t TYPE>
__global__ void MMV_BOUNDS(1) dk_mv(const __grid_constant__ dk_segs g, const float *x, int64_t n) {
  __shared__ mmv_smem<TYPE, 1> sm;
  mmv_table<TYPE>(sm.kv);
  int64_t b = blockIdx.x;
  int i = 0;
  while (i + 1 < g.n && b >= g.s[i].blocks) b -= g.s[i].blocks, i++;
  const int R = mmv_block_rows(n);
  const int64_t rb = b * R;
  const int nr = (int)min((int64_t)R, g.s[i].rows - rb);
  if ((int)threadIdx.x < nr) sm.rows[threadIdx.x] = g.s[i].W + (uint64_t)(rb + threadIdx.x) * g.s[i].row_bytes;
  mmv_block<TYPE, 1>(sm, nr, n, x, n, 1);
  if ((int)threadIdx.x < nr) g.s[i].out[rb + threadIdx.x] = sm.res[threadIdx.x];
}

// h = x + xo (residual_piece), ffn_in = RMSNorm(h) * w (rmsnorm_kernel), both computed by every
// block into shared memory and written by block 0; then the router logits of the block's rows; the
// last block to finish (*counter, reset by it) runs softmax and top-k into route. Dynamic shared
// memory: d + E floats.
template <uint32_t TYPE>
__global__ void MMV_BOUNDS(1) dk_router(const float *x, const float *xo, const float *w, float eps, int d, const uint8_t *W,
                                        uint64_t row_bytes, int E, int k, float *h, float *ffn_in, float *logits,
                                        st_route *route, int *counter) {
  extern __shared__ float xs[];
  __shared__ mmv_smem<TYPE, 1> sm;
  __shared__ float red[32];
  __shared__ int last;
  mmv_table<TYPE>(sm.kv);
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = x[i] + xo[i];
    xs[i] = v;
    ss = fmaf(v, v, ss);
    if (blockIdx.x == 0) h[i] = v;
  }
  ss = st_block_sum(ss, red);
  const float scale = rsqrtf(ss / (float)d + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = xs[i] * scale * w[i];
    xs[i] = v;
    if (blockIdx.x == 0) ffn_in[i] = v;
  }
  const int R = mmv_block_rows(d);
  const int64_t rb = (int64_t)blockIdx.x * R;
  const int nr = (int)min((int64_t)R, (int64_t)E - rb);
  if ((int)threadIdx.x < nr) sm.rows[threadIdx.x] = W + (uint64_t)(rb + threadIdx.x) * row_bytes;
  mmv_block<TYPE, 1>(sm, nr, d, xs, d, 1); // its first barrier orders the writes to xs before the reads
  if ((int)threadIdx.x < nr) logits[rb + threadIdx.x] = sm.res[threadIdx.x];
  __threadfence(); // each writer's logits are visible device-wide before the block counts itself done
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  float *l = xs + d;
  for (int e = threadIdx.x; e < E; e += blockDim.x) l[e] = __ldcg(logits + e);
  __syncthreads();
  if (threadIdx.x < 32) st_dev_softmax_topk(l, E, k, route);
  if (threadIdx.x == 0) *counter = 0;
}

// The slot's cached pair of routing slot blockIdx.y (NULL: another tier computes it).
__device__ __forceinline__ const uint8_t *dk_slot(const st_route *route, const uint8_t *const *slot_ptr, int n_expert) {
  return slot_ptr[min(max(route[blockIdx.y].expert, 0), n_expert - 1)];
}

// act[j][r] = silu(gate_r x) * up_r x for the ff rows of routing slot j = blockIdx.y when its pair is
// in this card's cache (swiglu's float operations): half of a block's rows from gate, half from up.
template <uint32_t TYPE>
__global__ void MMV_BOUNDS(1) dk_gateup(const st_route *route, const uint8_t *const *slot_ptr, int n_expert,
                                        uint64_t up_off, uint64_t row_bytes, int ff, const float *x, int64_t n,
                                        float *act) {
  __shared__ mmv_smem<TYPE, 1> sm;
  const uint8_t *p = dk_slot(route, slot_ptr, n_expert);
  if (!p) return; // the whole block
  mmv_table<TYPE>(sm.kv);
  const int R = mmv_block_rows(n), H = R >= 2 ? R / 2 : 1;
  const int64_t rb = (int64_t)blockIdx.x * H;
  const int nr = (int)min((int64_t)H, (int64_t)ff - rb);
  float g, u;
  if (R >= 2) {
    if ((int)threadIdx.x < 2 * H) {
      const int r = (int)threadIdx.x % H;
      sm.rows[threadIdx.x] = p + ((int)threadIdx.x < H ? 0 : up_off) + (uint64_t)min(rb + r, (int64_t)ff - 1) * row_bytes;
    }
    mmv_block<TYPE, 1>(sm, 2 * H, n, x, n, 1);
    g = sm.res[threadIdx.x % H];
    u = sm.res[H + threadIdx.x % H];
  } else {
    if (threadIdx.x == 0) sm.rows[0] = p + (uint64_t)rb * row_bytes;
    mmv_block<TYPE, 1>(sm, 1, n, x, n, 1);
    g = sm.res[0];
    if (threadIdx.x == 0) sm.rows[0] = p + up_off + (uint64_t)rb * row_bytes;
    mmv_block<TYPE, 1>(sm, 1, n, x, n, 1);
    u = sm.res[0];
  }
  if ((int)threadIdx.x < nr) act[(int64_t)blockIdx.y * ff + rb + threadIdx.x] = g / (1.0f + expf(-g)) * u;
}

// out[j][r] = weight_j * down_r act[j] for the d rows of routing slot j = blockIdx.y when its pair
// is in this card's cache (the grouped kernel's scaling).
template <uint32_t TYPE>
__global__ void MMV_BOUNDS(1) dk_down(const st_route *route, const uint8_t *const *slot_ptr, int n_expert,
                                      uint64_t down_off, uint64_t row_bytes, int d, const float *act, int64_t ff,
                                      float *out) {
  __shared__ mmv_smem<TYPE, 1> sm;
  const uint8_t *p = dk_slot(route, slot_ptr, n_expert);
  if (!p) return;
  mmv_table<TYPE>(sm.kv);
  const int R = mmv_block_rows(ff);
  const int64_t rb = (int64_t)blockIdx.x * R;
  const int nr = (int)min((int64_t)R, (int64_t)d - rb);
  if ((int)threadIdx.x < nr) sm.rows[threadIdx.x] = p + down_off + (uint64_t)(rb + threadIdx.x) * row_bytes;
  mmv_block<TYPE, 1>(sm, nr, ff, act + (int64_t)blockIdx.y * ff, ff, 1);
  if ((int)threadIdx.x < nr) out[(int64_t)blockIdx.y * d + rb + threadIdx.x] = sm.res[threadIdx.x] * route[blockIdx.y].weight;
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
void mv_launch(const mv_part *parts, int n_parts, const float *x, int64_t n, cudaStream_t st) {
  const int R = mmv_block_rows(n);
  for (int i = 0; i < n_parts;) {
    dk_segs g = {};
    int64_t blocks = 0;
    const uint32_t type = parts[i].type;
    for (; i < n_parts && g.n < 3 && parts[i].type == type; i++, g.n++) {
      g.s[g.n] = dk_seg{(const uint8_t *)parts[i].W, parts[i].row_bytes, parts[i].rows, parts[i].out,
                        (parts[i].rows + R - 1) / R};
      blocks += g.s[g.n].blocks;
    }
    mmv_dispatch(type, [&](auto ty) {
      dk_mv<decltype(ty)::value><<<(unsigned)blocks, MMV_THREADS, 0, st>>>(g, x, n);
    });
  }
}

template <typename K> void allow_dyn_smem(K kernel, size_t dyn) {
  if (dyn > 48 * 1024) ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn));
}

// What a layer's graph reads besides the context: the weight and KV device pointers of the task.
struct layer_graph {
  const st_decode_gpu_args *a;
  const void *w[9]; // attn_norm wq wk wv wo q_norm k_norm ffn_norm router
  float *k[ST_CUDA_MAX_KV_HEADS], *v[ST_CUDA_MAX_KV_HEADS];
  int n_chunks;
};

void experts_body(const st_decode_ctx *c, int l, cudaStream_t st) {
  const st_decode_dev &D = c->dev;
  const st_decode_layer *L = &c->layers[l];
  const int k = c->k, d = c->n_embd, ff = c->n_ff;
  const st_route *route = D.route + (size_t)l * k;
  const uint8_t *const *slots = D.slot_ptr + (size_t)l * c->n_expert;
  const int Rg = mmv_block_rows(d), H = Rg >= 2 ? Rg / 2 : 1;
  mmv_dispatch(L->gate_d.type, [&](auto ty) {
    dk_gateup<decltype(ty)::value><<<dim3((unsigned)((ff + H - 1) / H), (unsigned)k), MMV_THREADS, 0, st>>>(
        route, slots, c->n_expert, L->gate_bytes, L->gate_d.row_bytes, ff, D.ffn_in, d, D.act);
  });
  const int Rd = mmv_block_rows(ff);
  mmv_dispatch(L->down_d.type, [&](auto ty) {
    dk_down<decltype(ty)::value><<<dim3((unsigned)((d + Rd - 1) / Rd), (unsigned)k), MMV_THREADS, 0, st>>>(
        route, slots, c->n_expert, L->gate_bytes + L->up_bytes, L->down_d.row_bytes, d, D.act, ff, D.gpu_out);
  });
}

// dk_pre over layer l's input (combine: add layer l - 1's expert rows first) with norm w.
void pre_launch(const st_decode_ctx *c, int l, int combine, const float *w, cudaStream_t st) {
  const st_decode_dev &D = c->dev;
  const int lp = l > 0 ? l - 1 : 0;
  dk_pre<<<1, PRE_THREADS, sizeof(float) * (size_t)c->n_embd, st>>>(
      D.route + (size_t)lp * c->k, D.slot_ptr + (size_t)lp * c->n_expert, c->n_expert, D.gpu_out, D.cpu_out, D.h, c->k,
      c->n_embd, combine, D.x, w, c->eps, D.xn);
}

void layer_body(const void *args, cudaStream_t st) {
  const layer_graph *g = (const layer_graph *)args;
  const st_decode_gpu_args *a = g->a;
  const st_decode_ctx *c = a->ctx;
  const st_decode_dev &D = c->dev;
  const st_decode_layer *L = &c->layers[a->layer];
  const int d = c->n_embd, hd = c->head_dim, G = c->n_head_kv, Hq = c->n_head, E = c->n_expert;
  pre_launch(c, a->layer, a->combine, (const float *)g->w[0], st);
  const mv_part qkv[3] = {{L->wq_d.type, g->w[1], L->wq_d.row_bytes, (int64_t)Hq * hd, D.q},
                          {L->wk_d.type, g->w[2], L->wk_d.row_bytes, (int64_t)G * hd, D.kvnew},
                          {L->wv_d.type, g->w[3], L->wv_d.row_bytes, (int64_t)G * hd, D.kvnew + (size_t)G * hd}};
  mv_launch(qkv, 3, D.xn, d, st);
  st_cuda_rope_append(D.q, Hq, D.kvnew, G, hd, (const float *)g->w[5], (const float *)g->w[6], c->eps, D.pos,
                      c->rope_theta, g->k, g->v, st);
  st_cuda_attend_decode_all(D.q, Hq, G, hd, g->k, g->v, D.pos, g->n_chunks, D.part, D.counters, D.attn, st);
  const mv_part o = {L->wo_d.type, g->w[4], L->wo_d.row_bytes, d, D.xo};
  mv_launch(&o, 1, D.attn, (int64_t)Hq * hd, st);
  const int Rr = mmv_block_rows(d);
  const size_t dyn = sizeof(float) * ((size_t)d + (size_t)E);
  mmv_dispatch(L->router_d.type, [&](auto ty) {
    auto kernel = dk_router<decltype(ty)::value>;
    allow_dyn_smem(kernel, dyn);
    kernel<<<(unsigned)((E + Rr - 1) / Rr), MMV_THREADS, dyn, st>>>(
        D.x, D.xo, (const float *)g->w[7], c->eps, d, (const uint8_t *)g->w[8], L->router_d.row_bytes, E, c->k, D.h,
        D.ffn_in, D.rlogits, D.route + (size_t)a->layer * c->k, D.counters + Hq);
  });
  if (a->experts) experts_body(c, a->layer, st);
}

struct head_graph {
  const st_decode_gpu_args *a;
  const float *norm;
  const void *w;
  float *out;
};

void head_body(const void *args, cudaStream_t st) {
  const head_graph *g = (const head_graph *)args;
  const st_decode_ctx *c = g->a->ctx;
  const st_decode_dev &D = c->dev;
  pre_launch(c, c->n_layer, 1, g->norm, st);
  const mv_part head = {c->output_d.type, g->w, c->output_d.row_bytes, c->n_vocab, g->out};
  mv_launch(&head, 1, D.xn, c->n_embd, st);
  ST_CUDA_CHECK(cudaMemcpyAsync(g->out + c->n_vocab, D.route, sizeof(st_route) * (size_t)c->n_layer * c->k,
                                cudaMemcpyDeviceToDevice, st));
}

struct experts_graph {
  const st_decode_ctx *c;
  int layer;
};

void experts_graph_body(const void *args, cudaStream_t st) {
  const experts_graph *g = (const experts_graph *)args;
  experts_body(g->c, g->layer, st);
}

// Graph keys: graph_key0 + 3 l + (0 the dense task, 1 the experts task), graph_key0 + 3 n_layer the head.
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
  const st_decode_dev &D = c->dev;
  cudaStream_t st = starpu_cuda_get_local_stream();
  sig_hash sig;
  if (a->layer == c->n_layer) {
    head_graph g = {a, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]), (const void *)STARPU_VECTOR_GET_PTR(buffers[1]),
                    NULL};
    int b = 2;
    if (a->has_cpu_in) {
      ST_CUDA_CHECK(cudaMemcpyAsync(D.cpu_out, (const void *)STARPU_VECTOR_GET_PTR(buffers[b]),
                                    sizeof(float) * (size_t)c->k * c->n_embd, cudaMemcpyDeviceToDevice, st));
      b++;
    }
    g.out = (float *)STARPU_VECTOR_GET_PTR(buffers[b]);
    sig.add(g.norm);
    sig.add(g.w);
    sig.add(g.out);
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
  g.n_chunks = st_cuda_attn_chunks(a->pos + 1);
  sig.add((uint64_t)g.n_chunks);
  sig.add((uint64_t)(a->combine | a->experts << 1));
  int b = 9 + 2 * G;
  if (a->layer == 0) { // the token's embedding row and position (cl_arg: staged before cudaMemcpyAsync returns)
    ST_CUDA_CHECK(cudaMemcpyAsync(D.x, a->emb, sizeof(float) * (size_t)c->n_embd, cudaMemcpyHostToDevice, st));
    ST_CUDA_CHECK(cudaMemcpyAsync(D.pos, &a->pos, sizeof(int32_t), cudaMemcpyHostToDevice, st));
    ST_CUDA_CHECK(cudaMemsetAsync(D.counters, 0, sizeof(int32_t) * (size_t)(c->n_head + 1), st));
  }
  if (a->has_cpu_in) {
    ST_CUDA_CHECK(cudaMemcpyAsync(D.cpu_out, (const void *)STARPU_VECTOR_GET_PTR(buffers[b]),
                                  sizeof(float) * (size_t)c->k * c->n_embd, cudaMemcpyDeviceToDevice, st));
    b++;
  }
  st_cuda_graph_replay(st, key_of(c, a->layer, 0), sig.h, layer_body, &g);
  if (a->has_xin) { // the CPU pool's input: routing, then the FFN input
    uint8_t *xin = (uint8_t *)STARPU_VECTOR_GET_PTR(buffers[b]);
    const size_t rb = sizeof(st_route) * (size_t)c->k;
    ST_CUDA_CHECK(cudaMemcpyAsync(xin, D.route + (size_t)a->layer * c->k, rb, cudaMemcpyDeviceToDevice, st));
    ST_CUDA_CHECK(cudaMemcpyAsync(xin + rb, D.ffn_in, sizeof(float) * (size_t)c->n_embd, cudaMemcpyDeviceToDevice, st));
  }
  ST_CUDA_CHECK(cudaGetLastError());
}

void decode_experts_cuda(void *buffers[], void *cl_arg) {
  (void)buffers;
  const double t0 = st_cuda_now_ns();
  const st_decode_experts_args *a = (const st_decode_experts_args *)cl_arg;
  experts_graph g = {a->ctx, a->layer};
  st_cuda_graph_replay(starpu_cuda_get_local_stream(), key_of(a->ctx, a->layer, 1), 1, experts_graph_body, &g);
  ST_CUDA_CHECK(cudaGetLastError());
  st_cuda_decode_host_time(t0);
}

starpu_codelet decode_gpu_cl = [] {
  starpu_codelet cl = {};
  cl.cuda_funcs[0] = decode_gpu_cuda;
  cl.cuda_flags[0] = STARPU_CUDA_ASYNC;
  cl.nbuffers = STARPU_VARIABLE_NBUFFERS;
  cl.name = "decode_layer";
  return cl;
}();

starpu_codelet decode_experts_cl = [] {
  starpu_codelet cl = {};
  cl.cuda_funcs[0] = decode_experts_cuda;
  cl.cuda_flags[0] = STARPU_CUDA_ASYNC;
  cl.nbuffers = 0;
  cl.name = "decode_experts";
  return cl;
}();

} // namespace

extern "C" int st_cuda_mmv_takes(uint32_t type, uint64_t row_bytes, int64_t n) {
  bool ok = false;
  mmv_dispatch(type, [&](auto ty) {
    constexpr uint32_t T = decltype(ty)::value;
    ok = n % mmv_format<T>::QK == 0 && row_bytes % mmv_format<T>::ALIGN == 0;
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
  if (a->layer == c->n_layer || a->has_xin) modes[nbufs - 1] = STARPU_W;
  return st_submit_task(&decode_gpu_cl, bufs, modes, nbufs, a, args_size, tgt, name);
}

extern "C" int st_submit_decode_experts(const st_decode_experts_args *a, st_target tgt, const char *name) {
  return st_submit_task(&decode_experts_cl, NULL, NULL, 0, a, sizeof *a, tgt, name);
}
