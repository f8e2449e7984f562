// CUDA variants of the decode step's GPU tasks (decode.h): a layer's dense work, its cached experts
// and the output head, each one CUDA graph captured once and replayed (st_cuda_graph_replay) over
// the engine's persistent device buffers, the token's position read from device memory. The kernels
// are the prompt codelets' decode kernels (rmsnorm, the mat-vec products, q/k norm and RoPE, the
// split-K attention, softmax top-k, the grouped expert products) plus the few glue kernels below,
// with the same float operations, so a decode step gives the same bits as the per-task path.
#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"
#include "codelets/decode.h"
#include "common.h"

namespace {

// x = h + the k slots' rows added in slot order: a slot whose pair is in this card's cache
// (slot_ptr != NULL) from gpu_out, the others from cpu_out (as combine_token: plain adds).
__global__ void combine_rows(const st_route *route, const uint8_t *const *slot_ptr, int n_expert, const float *gpu_out,
                             const float *cpu_out, const float *h, int k, int d, float *x) {
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
      const int e = min(max(route[j].expert, 0), n_expert - 1);
      const float *src = slot_ptr[e] ? gpu_out : cpu_out;
      acc = __fadd_rn(acc, src[(size_t)j * d + i]);
    }
    x[i] = __fadd_rn(acc, h[i]);
  }
}

// h = x + xo (the residual after attention, as residual_piece)
__global__ void residual(const float *x, const float *xo, int d, float *h) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < d; i += gridDim.x * blockDim.x) h[i] = x[i] + xo[i];
}

// The grouped products' descriptors of the layer's cached slots (the others get 0 rows), the
// routing weights, and each slot's input row (the token's FFN input).
__global__ void expert_desc(const st_route *route, const uint8_t *const *slot_ptr, int n_expert, int k, uint64_t gate_bytes,
                            uint64_t up_bytes, st_cuda_group *desc, float *wts, const float *ffn_in, int d, float *xg) {
  const int j = blockIdx.x;
  const st_route r = route[j];
  const uint8_t *p = slot_ptr[min(max(r.expert, 0), n_expert - 1)];
  if (threadIdx.x == 0) {
    const int n = p ? 1 : 0;
    desc[j] = st_cuda_group{p, j, n};
    desc[k + j] = st_cuda_group{p + gate_bytes, j, n};
    desc[2 * k + j] = st_cuda_group{p + gate_bytes + up_bytes, j, n};
    wts[j] = r.weight;
  }
  for (int i = threadIdx.x; i < d; i += blockDim.x) xg[(size_t)j * d + i] = ffn_in[i];
}

__global__ void swiglu_rows(float *g, const float *u, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// FNV-1a over the words that went into a graph's kernel arguments.
struct sig_hash {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t v) {
    for (int b = 0; b < 8; b++) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  void add(const void *p) { add((uint64_t)(uintptr_t)p); }
};

// What a layer's graph reads besides the context: the weight and KV device pointers of the task.
struct layer_graph {
  const st_decode_gpu_args *a;
  const void *w[9];     // attn_norm wq wk wv wo q_norm k_norm ffn_norm router
  float *k[ST_CUDA_MAX_KV_HEADS], *v[ST_CUDA_MAX_KV_HEADS];
  int n_chunks;
};

void experts_body(const st_decode_ctx *c, int l, cudaStream_t st) {
  const st_decode_dev &D = c->dev;
  const st_decode_layer *L = &c->layers[l];
  const int k = c->k, d = c->n_embd, ff = c->n_ff;
  st_cuda_group *desc = (st_cuda_group *)D.desc;
  expert_desc<<<k, 256, 0, st>>>(D.route + (size_t)l * k, D.slot_ptr + (size_t)l * c->n_expert, c->n_expert, k,
                                 L->gate_bytes, L->up_bytes, desc, D.wts, D.ffn_in, d, D.xg);
  st_cuda_grouped_matmul(L->gate_d.type, L->gate_d.row_bytes, desc, k, 1, ff, D.xg, d, NULL, D.gate, st);
  st_cuda_grouped_matmul(L->up_d.type, L->up_d.row_bytes, desc + k, k, 1, ff, D.xg, d, NULL, D.up, st);
  swiglu_rows<<<(unsigned)(((int64_t)k * ff + 255) / 256), 256, 0, st>>>(D.gate, D.up, (int64_t)k * ff);
  st_cuda_grouped_matmul(L->down_d.type, L->down_d.row_bytes, desc + 2 * k, k, 1, d, D.gate, ff, D.wts, D.gpu_out, st);
}

void combine_body(const st_decode_ctx *c, int l, cudaStream_t st) {
  const st_decode_dev &D = c->dev;
  combine_rows<<<1, 256, 0, st>>>(D.route + (size_t)l * c->k, D.slot_ptr + (size_t)l * c->n_expert, c->n_expert,
                                  D.gpu_out, D.cpu_out, D.h, c->k, c->n_embd, D.x);
}

void layer_body(const void *args, cudaStream_t st) {
  const layer_graph *g = (const layer_graph *)args;
  const st_decode_gpu_args *a = g->a;
  const st_decode_ctx *c = a->ctx;
  const st_decode_dev &D = c->dev;
  const st_decode_layer *L = &c->layers[a->layer];
  const int d = c->n_embd, hd = c->head_dim, G = c->n_head_kv, Hq = c->n_head, nq = Hq / G;
  if (a->combine) combine_body(c, a->layer - 1, st);
  st_cuda_rmsnorm(D.x, (const float *)g->w[0], D.xn, 1, d, c->eps, st);
  st_cuda_matmul(L->wq_d.type, g->w[1], L->wq_d.row_bytes, 0, (int64_t)Hq * hd, D.xn, d, 1, d, D.q, Hq * hd, st);
  st_cuda_matmul(L->wk_d.type, g->w[2], L->wk_d.row_bytes, 0, (int64_t)G * hd, D.xn, d, 1, d, D.kvnew, G * hd, st);
  st_cuda_matmul(L->wv_d.type, g->w[3], L->wv_d.row_bytes, 0, (int64_t)G * hd, D.xn, d, 1, d, D.kvnew + G * hd, G * hd,
                 st);
  st_cuda_qk_norm_rope_dev(D.q, Hq, hd, (const float *)g->w[5], c->eps, D.pos, c->rope_theta, st);
  st_cuda_kv_append(D.kvnew, G, hd, (const float *)g->w[6], c->eps, D.pos, c->rope_theta, g->k, g->v, st);
  for (int gi = 0; gi < G; gi++)
    st_cuda_attend_decode(D.q + (size_t)gi * nq * hd, g->k[gi], g->v[gi], nq, hd, D.pos, g->n_chunks, D.part,
                          D.attn + (size_t)gi * nq * hd, st);
  st_cuda_matmul(L->wo_d.type, g->w[4], L->wo_d.row_bytes, 0, d, D.attn, (int64_t)Hq * hd, 1, (int64_t)Hq * hd, D.xo, d,
                 st);
  residual<<<(d + 255) / 256, 256, 0, st>>>(D.x, D.xo, d, D.h);
  st_cuda_rmsnorm(D.h, (const float *)g->w[7], D.ffn_in, 1, d, c->eps, st);
  st_cuda_matmul(L->router_d.type, g->w[8], L->router_d.row_bytes, 0, c->n_expert, D.ffn_in, d, 1, d, D.rlogits,
                 c->n_expert, st);
  st_cuda_softmax_topk(D.rlogits, 1, c->n_expert, c->k, D.route + (size_t)a->layer * c->k, st);
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
  combine_body(c, c->n_layer - 1, st);
  st_cuda_rmsnorm(D.x, g->norm, D.xn, 1, c->n_embd, c->eps, st);
  st_cuda_matmul(c->output_d.type, g->w, c->output_d.row_bytes, 0, c->n_vocab, D.xn, c->n_embd, 1, c->n_embd, g->out,
                 c->n_vocab, st);
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
  if (a->layer == 0) // the token's embedding row (cl_arg: staged before cudaMemcpyAsync returns)
    ST_CUDA_CHECK(cudaMemcpyAsync(D.x, a->emb, sizeof(float) * (size_t)c->n_embd, cudaMemcpyHostToDevice, st));
  if (a->layer == 0) ST_CUDA_CHECK(cudaMemcpyAsync(D.pos, &a->pos, sizeof(int32_t), cudaMemcpyHostToDevice, st));
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
