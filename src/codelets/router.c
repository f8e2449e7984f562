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
#include "io/model.h"

/* The k best of score[0..E) among allowed experts (allow NULL: all), highest first, ties to the
 * lower id, into r[].expert (-1 when none is left). The chosen ones are marked in taken: scanning
 * r[] for each candidate took about 9 us a layer, a serial step of every CPU decode token. */
static void top_k(const float *score, const uint8_t *allow, int E, int k, struct st_route *r) {
  uint8_t taken[E];
  memset(taken, 0, sizeof taken);
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      if ((allow && !allow[e]) || taken[e]) continue;
      if (best < 0 || score[e] > score[best]) best = e;
    }
    r[j].expert = best;
    if (best >= 0) taken[best] = 1;
  }
}

void st_route_topk(float *l, int E, int k, struct st_route *r) {
  float mx = -INFINITY;
  for (int e = 0; e < E; e++) mx = fmaxf(mx, l[e]);
  double sum = 0.0;
  for (int e = 0; e < E; e++) {
    l[e] = expf(l[e] - mx);
    sum += l[e];
  }
  for (int e = 0; e < E; e++) l[e] = (float)(l[e] / sum);
  top_k(l, NULL, E, k, r); /* highest probability first, ties to the lower expert id */
  double wsum = 0.0;
  for (int j = 0; j < k; j++) {
    r[j].weight = l[r[j].expert];
    wsum += r[j].weight;
  }
  for (int j = 0; j < k; j++) r[j].weight = (float)(r[j].weight / wsum);
}

void st_route_gated(float *l, int E, int k, int gating, const float *bias, int n_group, int n_group_used, int w_norm,
                    float w_scale, struct st_route *r) {
  if (gating == ST_GATING_SOFTMAX && w_norm && w_scale == 1.0f) {
    st_route_topk(l, E, k, r);
    return;
  }
  float sel[E];
  uint8_t allow[E];
  if (gating == ST_GATING_SOFTMAX_WEIGHT) {
    top_k(l, NULL, E, k, r);
    float mx = -INFINITY;
    for (int j = 0; j < k; j++) mx = r[j].expert >= 0 ? fmaxf(mx, l[r[j].expert]) : NAN;
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += r[j].weight = r[j].expert >= 0 ? expf(l[r[j].expert] - mx) : NAN;
    for (int j = 0; j < k; j++) r[j].weight = (float)(r[j].weight / sum);
  } else {
    if (gating == ST_GATING_SIGMOID) {
      for (int e = 0; e < E; e++) l[e] = 1.0f / (1.0f + expf(-l[e]));
    } else { /* softmax */
      float mx = -INFINITY;
      for (int e = 0; e < E; e++) mx = fmaxf(mx, l[e]);
      double sum = 0.0;
      for (int e = 0; e < E; e++) sum += l[e] = expf(l[e] - mx);
      for (int e = 0; e < E; e++) l[e] = (float)(l[e] / sum);
    }
    for (int e = 0; e < E; e++) sel[e] = bias ? l[e] + bias[e] : l[e];
    const uint8_t *mask = NULL;
    if (n_group > 1 && n_group_used < n_group) {
      /* a group's score: the sum of its two best selection scores; the n_group_used best groups stay */
      const int per = E / n_group;
      float gscore[n_group];
      for (int g = 0; g < n_group; g++) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) {
          if (sel[e] > b1) b2 = b1, b1 = sel[e];
          else if (sel[e] > b2) b2 = sel[e];
        }
        gscore[g] = b1 + b2;
      }
      memset(allow, 0, sizeof allow);
      for (int j = 0; j < n_group_used; j++) {
        int best = -1;
        for (int g = 0; g < n_group; g++)
          if (!allow[g * per] && (best < 0 || gscore[g] > gscore[best])) best = g;
        if (best >= 0) memset(allow + best * per, 1, (size_t)per);
      }
      mask = allow;
    }
    top_k(sel, mask, E, k, r);
    for (int j = 0; j < k; j++) r[j].weight = r[j].expert >= 0 ? l[r[j].expert] : NAN;
  }
  if (w_norm) {
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += r[j].weight;
    if (sum < 6.103515625e-5) sum = 6.103515625e-5;
    for (int j = 0; j < k; j++) r[j].weight = (float)(r[j].weight / sum);
  }
  if (w_scale != 1.0f)
    for (int j = 0; j < k; j++) r[j].weight *= w_scale;
}

void st_swiglu_oai(const float *g, const float *u, float *out, int64_t n) {
  const float limit = 7.0f, alpha = 1.702f;
  for (int64_t i = 0; i < n; i++) {
    const float x = fminf(g[i], limit), y = fmaxf(fminf(u[i], limit), -limit);
    out[i] = x / (1.0f + expf(-alpha * x)) * (y + 1.0f);
  }
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
