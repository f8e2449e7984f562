/* The layers' tasks of a decode step (graph/decode.h). With the dense work on the primary GPU:
 *   decode_layer  (CUDA0, ordered)  for each layer of a span of STRATA_LAYER_SPAN layers (default
 *                                   12; one task, one CUDA graph), the previous layer's
 *                                   combine, attention with the KV append, the output projection,
 *                                   FFN norm, router and top-k, and the layer's cached experts; a
 *                                   layer the CPU pool has a pair of also publishes its routing
 *                                   and FFN input to the mailbox
 *   cpu_pool lanes (one per CPU worker, once per token: st_decode_submit_lanes) the CPU pool's
 *                                   experts of every such layer, through the mailbox
 * and the output head (layer n_layer) adds the last layer's experts, norms and projects. The GPU
 * tasks carry consecutive starpu_task::workerorder values, so CUDA0 queues them on its stream in
 * submission order; nothing links them to the lanes but the mailbox's flags (codelets/decode.h).
 * Without a GPU one lane task per CPU worker runs the token's work items (submitted with the head;
 * STRATA_LANE_TOKEN=0: one per worker and layer, each up to the end of its layer). */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "config.h"
#include "graph/batch.h"
#include "graph/decode.h"
#include "graph/engine.h"


static struct st_target on_worker(const struct st_engine *e, int32_t where, int worker, unsigned order) {
  struct st_target t = {where, worker, NULL, NULL, order};
  return st_engine_traced(e, t);
}

/* One lane task per CPU worker of `kind` (ST_LANE_TOKEN: up to the end of layer l). */
static int submit_lanes(struct st_engine *e, int l, int kind) {
  struct st_decode *d = e->dec;
  int rc = 0;
  for (int i = 0; i < d->n_lanes && !rc; i++) {
    const struct st_lane_args a = {&d->ctx, kind, l};
    rc = st_submit_decode_lane(&a, NULL, 0, on_worker(e, STARPU_CPU, d->lane_worker[i], 0),
                               d->lane_names[(size_t)l * d->n_lanes + i]);
    d->tasks_last++; /* counted in e->stats by st_decode_step once the step runs for a token */
  }
  return rc;
}

int st_decode_submit_lanes(struct st_engine *e) {
  struct st_decode *d = e->dec;
  int any = 0;
  for (uint32_t l = 0; l < e->hp.n_layer; l++) any |= d->layer_cpu[l];
  d->pool_lanes = d->gpu && any;
  return d->pool_lanes ? submit_lanes(e, (int)e->hp.n_layer, ST_LANE_EXPERTS) : 0;
}

size_t st_decode_task_bufs_max(const struct st_engine *e, int n_layers) {
  /* layer_bufs' most a layer (MLA: one plane a KV head, fewer), the head's 2 */
  return (size_t)n_layers * (W_COUNT + 2 * (size_t)e->hp.n_head_kv + 3 + ST_MLA_W) + 2;
}

/* Appends layer l's handles of a GPU decode task and their modes (codelets/decode.h's order) at
 * bufs + nb; returns the new count. A layer without q/k norms (gpt-oss), a router (a dense layer)
 * or wk, wv (MLA; wq too with a q LoRA) passes its attention norm in their places; the kernels read
 * none of them (decode.cu). */
static int layer_bufs(const struct st_engine *e, int l, starpu_data_handle_t *bufs, enum starpu_data_access_mode *modes,
                      int nb) {
  const int G = (int)e->hp.n_head_kv, mla = e->hp.attn_kind == ST_ATTN_MLA;
  const struct st_layer *W = &e->model->layers[l];
  const struct st_weight *ws[W_COUNT];
  st_engine_layer_weights(W, ws);
  for (int i = 0; i < W_COUNT; i++) {
    modes[nb] = STARPU_R;
    bufs[nb++] = e->h_layer[(size_t)l * W_COUNT + (ws[i]->data ? i : W_ATTN_NORM)];
  }
  for (int g = 0; g < G; g++) /* K and V of each KV head; MLA: the one plane of latent rows */
    for (int p = 0; p < (mla ? 1 : 2); p++) {
      modes[nb] = STARPU_RW;
      bufs[nb++] = e->h_kv[((size_t)l * G + g) * 2 + p];
    }
  for (int i = 0; i < 3 && e->h_fixed[(size_t)l * 3]; i++) { /* a fixed FFN */
    modes[nb] = STARPU_R;
    bufs[nb++] = e->h_fixed[(size_t)l * 3 + i];
  }
  for (int i = 0; i < ST_MLA_W && mla; i++) { /* MLA's matrices and norms (an absent one: the attention norm) */
    const starpu_data_handle_t h = e->h_mla[(size_t)l * ST_MLA_W + i];
    modes[nb] = STARPU_R;
    bufs[nb++] = h ? h : e->h_layer[(size_t)l * W_COUNT + W_ATTN_NORM];
  }
  return nb;
}

int st_decode_submit_layer(struct st_engine *e, int l) {
  struct st_decode *d = e->dec;
  const int L = (int)e->hp.n_layer;
  if (!d->gpu) return e->lane_token && l < L ? 0 : submit_lanes(e, l, ST_LANE_TOKEN);
#ifndef ST_HAVE_CUDA
  (void)L;
  return st_set_error(ST_ERUNTIME, "a GPU decode step in a build without CUDA"); /* d->gpu needs a CUDA worker */
#else
  if (l < L && l % d->span) return 0; /* its span's task, submitted at the span's first layer, runs it */
  const int n = l < L ? (l + d->span < L ? d->span : L - l) : 1;
  const struct st_decode_gpu_args a = {.ctx = &d->ctx, .layer = l, .n_layers = n, .pos = d->ctx.pos};
  starpu_data_handle_t *bufs = d->span_bufs;
  enum starpu_data_access_mode *modes = d->span_modes;
  int nb = 0;
  if (l < L) {
    for (int i = l; i < l + n; i++) nb = layer_bufs(e, i, bufs, modes, nb);
  } else {
    modes[0] = modes[1] = STARPU_R;
    bufs[nb++] = e->h_output_norm;
    bufs[nb++] = e->h_output;
  }
  const int rc = st_submit_decode_gpu(&a, sizeof a, bufs, modes, nb, on_worker(e, STARPU_CUDA, d->primary_worker, ++d->order),
                                      d->layer_names[l]);
  d->tasks_last++;
  return rc;
#endif
}
