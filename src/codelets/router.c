/* The residual after attention, the FFN norm and the MoE router (see codelets.h). Top-k over the
 * softmax of the router logits, renormalised over the chosen k, as llama.cpp's qwen3moe graph
 * (softmax gating, expert_weights_norm) and Hugging Face's Qwen3MoeSparseMoeBlock with
 * norm_topk_prob do. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/codelets.h"
#include "config.h"
#ifdef ST_HAVE_CUDA
#include "codelets/cuda/cuda_codelets.h"
#endif
#include "codelets/dot.h"
#include "codelets/layer_cpu.h"

void st_route_topk(float *l, int E, int k, struct st_route *r) {
  float mx = -INFINITY;
  for (int e = 0; e < E; e++) mx = fmaxf(mx, l[e]);
  double sum = 0.0;
  for (int e = 0; e < E; e++) {
    l[e] = expf(l[e] - mx);
    sum += l[e];
  }
  for (int e = 0; e < E; e++) l[e] = (float)(l[e] / sum);
  /* top-k by selection: highest probability first, ties to the lower expert id */
  double wsum = 0.0;
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      int taken = 0;
      for (int i = 0; i < j; i++) taken |= r[i].expert == e;
      if (!taken && (best < 0 || l[e] > l[best])) best = e;
    }
    r[j] = (struct st_route){best, l[best]};
    wsum += l[best];
  }
  for (int j = 0; j < k; j++) r[j].weight = (float)(r[j].weight / wsum);
}

static void router_cpu(void *buffers[], void *cl_arg) {
  const struct st_router_args *a = cl_arg;
  const int T = a->T, d = a->n_embd, E = a->n_expert, k = a->k, piece = d / a->n_xo;
  const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
  const float *ffn_norm = (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + a->n_xo]);
  const void *rw = (const void *)STARPU_VECTOR_GET_PTR(buffers[2 + a->n_xo]);
  float *h = (float *)STARPU_VECTOR_GET_PTR(buffers[3 + a->n_xo]);
  float *ffn_in = (float *)STARPU_VECTOR_GET_PTR(buffers[4 + a->n_xo]);
  struct st_route *routing = (struct st_route *)STARPU_VECTOR_GET_PTR(buffers[5 + a->n_xo]);

  for (int i = 0; i < a->n_xo; i++) {
    const float *xo = (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + i]);
    for (int t = 0; t < T; t++)
      for (int j = 0; j < piece; j++)
        h[(size_t)t * d + i * piece + j] = x[(size_t)t * d + i * piece + j] + xo[(size_t)t * piece + j];
  }
  for (int t = 0; t < T; t++) st_rmsnorm(h + (size_t)t * d, ffn_norm, ffn_in + (size_t)t * d, d, a->eps);

  float *logits = malloc(sizeof(float) * (size_t)T * E);
  st_matmul(a->w.type, rw, a->w.row_bytes, 0, E, ffn_in, d, T, d, logits, E);
  for (int t = 0; t < T; t++) st_route_topk(logits + (size_t)t * E, E, k, routing + (size_t)t * k);
  free(logits);
}

static struct starpu_perfmodel router_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "st_router",
};

static struct starpu_codelet router_cl = {
    .cpu_funcs = {router_cpu},
    .cpu_funcs_name = {"router_cpu"},
#ifdef ST_HAVE_CUDA
    .cuda_funcs = {st_router_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &router_model,
    .name = "router",
};

int st_submit_router(const struct st_router_args *a, starpu_data_handle_t *bufs, int nbufs,
                     struct st_target tgt, const char *name) {
  enum starpu_data_access_mode modes[nbufs];
  for (int i = 0; i < nbufs; i++) modes[i] = i < nbufs - 3 ? STARPU_R : STARPU_W;
  return st_submit_task(&router_cl, bufs, modes, nbufs, a, sizeof *a, tgt, name);
}
