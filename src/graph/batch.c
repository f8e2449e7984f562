/* The per-task path's task graph of one batch (graph/batch.h): a prompt chunk of T tokens, or one
 * decode token when the decode step (graph/decode.h) does not run it. Every layer is submitted as
 * attention, attention-output slices and the router; the host then reads the layer's routing table
 * and submits each tier's expert-row tasks and the combine that adds their rows in a fixed order;
 * the output head last. The batch's activations are registered for the batch and unregistered
 * after it. */
#include <stdlib.h>
#include <string.h>

#include "codelets/codelets.h"
#include "codelets/dot.h"
#include "codelets/quant.h"
#include "common.h"
#include "graph/batch.h"
#include "graph/engine.h"
#include "graph/recorder.h"
#include "tiers/arena.h"
#include "tiers/placement.h"

#define traced st_engine_traced

/* The graph key of a dense task of a T-token batch at layer l (l = n_layer: the output head):
 * 0 (plain launches) unless graphs are on and it is a decode step. */
static int graph_key(const struct st_engine *e, int T, uint32_t l, int site) {
  return e->cuda_graphs && T == 1 ? 1 + (int)l * GRAPH_SITES + site : 0;
}

/* Handles of one batch: registered over the engine's buffers for T rows. */
struct batch {
  int T;
  starpu_data_handle_t x, h, ffn_in, routing;
  starpu_data_handle_t *attn; /* [n_head_kv] */
  starpu_data_handle_t *xo;   /* [n_slices_o] */
};

/* The experts of one layer: submits the expert-row tasks and the combine. Reads the routing
 * table (the host waits for the router here), so it is called after the layer's router is
 * submitted. The primary cache's experts go to CUDA0 in one grouped task; an uncached expert with
 * --prompt-stream's rows or more in a prompt chunk gets a task of its own on CUDA0 (StarPU copies
 * its weights there); each other CPU-pool expert gets its own task (sliced into
 * ROWS_PER_EXPERT_TASK rows). Output rows are laid out task after task in expert_out; the combine
 * finds each (token, slot) through its source table. */
static int submit_moe(struct st_engine *e, struct batch *b, uint32_t l) {
  const struct st_hparams *hp = &e->hp;
  const struct st_layer *L = &e->model->layers[l];
  const struct st_placement *pl = &e->placement;
  const int T = b->T, k = (int)hp->n_expert_used, d = (int)hp->n_embd, E = (int)hp->n_expert;
  int rc = 0;

  const double t_wait = st_now();
  starpu_data_acquire(b->routing, STARPU_R);
  e->stats.wait_routing_s += st_now() - t_wait;
  const struct st_route *route = e->routing;
  if (e->routing_trace)
    for (int i = 0; i < T * k; i++)
      e->routing_trace[((size_t)l * e->n_ctx + e->n_past) * k + i] = route[i].expert;

  /* rows of each expert, in token order: counting sort by expert */
  int *count = calloc((size_t)E + 1, sizeof(int));
  int *fill = malloc(sizeof(int) * (size_t)E);
  int *order = malloc(sizeof(int) * (size_t)T * k); /* (t*k+j) sorted by expert */
  struct st_combine_args *ca = malloc(sizeof *ca + sizeof ca->src[0] * (size_t)T * k);
  struct st_expert_rows_args *ea = malloc(st_expert_rows_args_size(E, T * k, T));
  const int parts = e->ff_parts;
  starpu_data_handle_t *outs = malloc(sizeof(starpu_data_handle_t) * ((size_t)T * k * parts + 2 + ST_MAX_CACHES));
  starpu_data_handle_t *bufs = malloc(sizeof(starpu_data_handle_t) * (2 + 3 * (size_t)E));
  if (!count || !fill || !order || !ca || !ea || !outs || !bufs) {
    rc = st_set_error(ST_ENOMEM, "out of memory routing layer %u", l);
    starpu_data_release(b->routing);
    goto done;
  }
  for (int i = 0; i < T * k && !rc; i++)
    if (route[i].expert < 0 || route[i].expert >= E || !(route[i].weight == route[i].weight))
      { /* layer l - 1's output (its experts) or layer l's attention made it */
        char what[96];
        snprintf(what, sizeof what, "the router input of layer %u (token %d)", l, e->n_past + i / k);
        rc = st_engine_nonfinite(e, (int)l - 1, (int)l, what);
      }
  if (rc) {
    starpu_data_release(b->routing);
    goto done;
  }
  for (int i = 0; i < T * k; i++) {
    count[route[i].expert + 1]++;
    e->route_counts[(size_t)l * E + route[i].expert]++;
    e->live_counts[(size_t)l * E + route[i].expert]++;
  }
  for (int x = 0; x < E; x++) count[x + 1] += count[x];
  memcpy(fill, count, sizeof(int) * (size_t)E);
  for (int i = 0; i < T * k; i++) order[fill[route[i].expert]++] = i;

  *ca = (struct st_combine_args){.T = T, .k = k, .n_embd = d, .graph_key = graph_key(e, T, l, GRAPH_COMBINE)};
  const struct st_expert_rows_args base = {.n_embd = d, .n_ff = (int)hp->n_ff_exp, .layer = (int)l,
                                           .ff0 = 0, .ff1 = (int)hp->n_ff_exp, .n_out_rows = 0,
                                           .gate = st_engine_wdesc(&L->gate_exps), .up = st_engine_wdesc(&L->up_exps),
                                           .down = st_engine_wdesc(&L->down_exps), .cublas_rows = e->cublas_rows, .mmq = e->mmq,
                                           .int8_dot = e->int8_dot};
  int n_out = 0, row_cursor = 0;
  /* Adds rows [s, s + n) of expert x's sorted entries to the task being built in `ea`. */
#define ADD_EXPERT(x, s, n)                                                                    \
  do {                                                                                         \
    struct st_expert_group *grp = st_expert_groups(ea) + ea->n_experts;                       \
    *grp = (struct st_expert_group){(x), ea->n_rows, (n)};                                     \
    for (int r = 0; r < (n); r++) {                                                            \
      const int i = order[(s) + r];                                                            \
      rows_tmp[ea->n_rows + r] = (struct st_expert_row){.token = i / k, .weight = route[i].weight}; \
      ca->src[i] = (struct st_combine_src){.buf = n_out, .row = ea->n_rows + r, .parts = 1};   \
    }                                                                                          \
    ea->n_rows += (n);                                                                         \
    ea->n_experts++;                                                                           \
  } while (0)
  struct st_expert_row *rows_tmp = malloc(sizeof *rows_tmp * (size_t)T * k);
  if (!rows_tmp) rc = st_set_error(ST_ENOMEM, "out of memory routing layer %u", l);

  /* Experts a GPU cache owns but does not compute in this batch: the peer's rows of a prompt chunk
   * beyond --peer-prefill-rows stay on the primary (its weights streamed there by StarPU). */
  uint8_t *on_primary = calloc((size_t)E, 1);
  if (!on_primary && !rc) rc = st_set_error(ST_ENOMEM, "out of memory routing layer %u", l);

  /* 1. the GPU caches: every cached expert routed in this layer, one task per card */
  for (int c = 0; c < pl->n_caches && !rc; c++) {
    const struct st_expert_cache *C = &pl->cache[c];
    const int tier = 1 + c;
    if (C->n_slots == 0) continue;
    int budget = st_placement_rows_budget(pl, c, T, k, e->peer_prefill_rows);
    *ea = base;
    for (int x = 0; x < E; x++)
      if (count[x + 1] > count[x] && (int)st_placement_tier(pl, l, (uint32_t)x) == tier) {
        if (count[x + 1] - count[x] > budget) {
          on_primary[x] = 1;
          continue;
        }
        budget -= count[x + 1] - count[x];
        const starpu_data_handle_t *hc = st_expert_cache_handles(pl, c, pl->slot[(size_t)l * E + x]);
        for (int m = 0; m < 3; m++) bufs[1 + 3 * ea->n_experts + m] = hc[m];
        ADD_EXPERT(x, count[x], count[x + 1] - count[x]);
      }
    if (ea->n_experts == 0) continue;
    memcpy(st_expert_rows(ea), rows_tmp, sizeof *rows_tmp * (size_t)ea->n_rows);
    int out_rows = ea->n_rows;
    if (e->remote_opt && C->role == ST_ROLE_HELPER) {
      /* --remote-expert-opt: one partial sum per token, its rows summed in top-k slot order; the
       * combine takes it in the slot of the token's first expert on this card */
      int32_t *off = st_expert_reduce(ea), *idx = off + T + 1;
      int *row_of = malloc(sizeof(int) * (size_t)T * k);
      if (!row_of) {
        rc = st_set_error(ST_ENOMEM, "out of memory routing layer %u", l);
        break;
      }
      for (int i = 0; i < T * k; i++) row_of[i] = -1;
      for (int g = 0; g < ea->n_experts; g++) {
        const struct st_expert_group *grp = st_expert_groups(ea) + g;
        for (int r = 0; r < grp->n_rows; r++) row_of[order[count[grp->expert] + r]] = grp->row0 + r;
      }
      int o = 0, n_idx = 0;
      for (int t = 0; t < T; t++) {
        int first = -1;
        for (int j = 0; j < k; j++)
          if (row_of[t * k + j] >= 0) {
            if (first < 0) {
              first = j;
              off[o] = n_idx;
            }
            idx[n_idx++] = row_of[t * k + j];
            ca->src[t * k + j] = (struct st_combine_src){.buf = n_out, .row = o, .parts = j == first};
          }
        if (first >= 0) o++;
      }
      off[o] = n_idx;
      /* the table was written for T rows: move red_idx next to the o + 1 offsets actually used */
      memmove(off + o + 1, idx, sizeof(int32_t) * (size_t)n_idx);
      ea->n_out_rows = o;
      out_rows = o;
      free(row_of);
    }
    bufs[0] = b->ffn_in;
    outs[1 + n_out] = st_engine_reg(e->expert_out + (size_t)row_cursor * d, (uint64_t)out_rows * d, 4);
    bufs[1 + 3 * ea->n_experts] = outs[1 + n_out];
    rc = st_submit_expert_rows(ea, bufs, traced(e, st_placement_expert_target(pl, tier)),
                               e->layer_names[(size_t)l * st_engine_names_per_layer(e) + 2 + c]);
    e->stats.expert_tasks[tier]++;
    e->stats.expert_entries[tier] += (uint64_t)ea->n_rows;
    if (C->worker != st_placement_dense_target(pl, l).worker) {
      /* the layer's activations cross to this card and its rows come back */
      e->stats.tier_bytes[tier] += 4ull * d * ((uint64_t)T + (uint64_t)out_rows);
      e->stats.tier_bytes_unpacked[tier] += 4ull * d * ((uint64_t)T + (uint64_t)T * k);
    }
    e->stats.tasks++;
    row_cursor += out_rows;
    n_out++;
  }
  /* 2. the peer's rows beyond its prompt share: per expert on the primary */
  for (int x = 0; x < E && !rc; x++) {
    if (!on_primary[x]) continue;
    const int n = count[x + 1] - count[x];
    *ea = base;
    ADD_EXPERT(x, count[x], n);
    memcpy(st_expert_rows(ea), rows_tmp, sizeof *rows_tmp * (size_t)n);
    const starpu_data_handle_t *he = st_engine_expert_handles(e, l, (uint32_t)x);
    outs[1 + n_out] = st_engine_reg(e->expert_out + (size_t)row_cursor * d, (uint64_t)n * d, 4);
    starpu_data_handle_t tb[5] = {b->ffn_in, he[0], he[1], he[2], outs[1 + n_out]};
    rc = st_submit_expert_rows(ea, tb, traced(e, st_placement_expert_target(pl, ST_TIER_PRIMARY)),
                               e->expert_names[(size_t)l * E + x]);
    e->stats.expert_tasks[ST_TIER_PRIMARY]++;
    e->stats.expert_entries[ST_TIER_PRIMARY] += (uint64_t)n;
    e->stats.tasks++;
    row_cursor += n;
    n_out++;
  }
  /* 3. experts outside the caches: one with e->prompt_stream rows or more in a prompt chunk runs
   *    on CUDA0, its weights copied there from the pinned arena once for all its rows (on StarPU's
   *    copy streams, overlapping the tasks before it); the others on the CPU pool, per expert (or
   *    slice of its rows), one task per FFN slice */
  for (int x = 0; x < E && !rc; x++) {
    if (st_placement_tier(pl, l, (uint32_t)x) != ST_TIER_CPU_POOL || count[x + 1] == count[x]) continue;
    const int n_x = count[x + 1] - count[x];
    if (e->prompt_stream && T > 1 && n_x >= e->prompt_stream && st_host_arena_streamable(&e->arena, l, (uint32_t)x)) {
      *ea = base;
      ADD_EXPERT(x, count[x], n_x);
      memcpy(st_expert_rows(ea), rows_tmp, sizeof *rows_tmp * (size_t)n_x);
      outs[1 + n_out] = st_engine_reg(e->expert_out + (size_t)row_cursor * d, (uint64_t)n_x * d, 4);
      /* handles of this task alone: StarPU frees the weights' GPU copies once it is done, so that
       * they never pile up there. (Kept on CUDA0 and only marked starpu_data_wont_use, they were
       * freed no sooner than StarPU needed room, and it could need that room outside its own
       * allocations: the kernels' scratch.) */
      starpu_data_handle_t hs[3];
      st_engine_expert_handles_once(e, l, (uint32_t)x, hs);
      starpu_data_handle_t tb[5] = {b->ffn_in, hs[0], hs[1], hs[2], outs[1 + n_out]};
      const struct st_target tgt = {STARPU_CUDA, pl->cuda0_worker, NULL, NULL, 0};
      rc = st_submit_expert_rows(ea, tb, traced(e, tgt), e->stream_names[(size_t)l * E + x]);
      for (int m = 0; m < 3; m++) starpu_data_unregister_submit(hs[m]);
      if (!rc) {
        e->stats.stream_tasks++;
        e->stats.stream_entries += (uint64_t)n_x;
        e->stats.stream_bytes += st_pair_bytes_layer(e->model, l);
        e->stats.tasks++;
      }
      row_cursor += n_x;
      n_out++;
      continue;
    }
    const starpu_data_handle_t *he = st_engine_expert_handles(e, l, (uint32_t)x);
    for (int s = count[x]; s < count[x + 1] && !rc; s += ROWS_PER_EXPERT_TASK) {
      const int n = count[x + 1] - s < ROWS_PER_EXPERT_TASK ? count[x + 1] - s : ROWS_PER_EXPERT_TASK;
      *ea = base;
      ADD_EXPERT(x, s, n);
      for (int r = 0; r < n; r++) ca->src[order[s + r]].parts = parts;
      memcpy(st_expert_rows(ea), rows_tmp, sizeof *rows_tmp * (size_t)n);
      for (int p = 0; p < parts && !rc; p++) {
        ea->ff0 = p * (int)hp->n_ff_exp / parts;
        ea->ff1 = (p + 1) * (int)hp->n_ff_exp / parts;
        outs[1 + n_out] = st_engine_reg(e->expert_out + (size_t)row_cursor * d, (uint64_t)n * d, 4);
        starpu_data_handle_t tb[5] = {b->ffn_in, he[0], he[1], he[2], outs[1 + n_out]};
        rc = st_submit_expert_rows(ea, tb, traced(e, st_placement_expert_target(pl, ST_TIER_CPU_POOL)),
                                   e->expert_names[(size_t)l * E + x]);
        e->stats.expert_tasks[ST_TIER_CPU_POOL]++;
        e->stats.tasks++;
        row_cursor += n;
        n_out++;
      }
      e->stats.expert_entries[ST_TIER_CPU_POOL] += (uint64_t)n;
    }
  }
  free(on_primary);
#undef ADD_EXPERT
  free(rows_tmp);
  starpu_data_release(b->routing);
  if (!rc) {
    ca->n_out = n_out;
    outs[0] = b->h;
    outs[1 + n_out] = b->x;
    rc = st_submit_combine(ca, outs, n_out + 2, traced(e, st_placement_dense_target(pl, l)),
                           e->layer_names[(size_t)l * st_engine_names_per_layer(e) + 1]);
    e->stats.tasks++;
  }
  for (int i = 0; i < n_out; i++) starpu_data_unregister_submit(outs[1 + i]);
done:
  free(count);
  free(fill);
  free(order);
  free(ca);
  free(ea);
  free(outs);
  free(bufs);
  return rc;
}

static int submit_layer(struct st_engine *e, struct batch *b, uint32_t l) {
  const struct st_hparams *hp = &e->hp;
  const struct st_layer *L = &e->model->layers[l];
  starpu_data_handle_t *hw = e->h_layer + (size_t)l * W_COUNT;
  const char **names = e->layer_names + (size_t)l * st_engine_names_per_layer(e);
  const int G = (int)hp->n_head_kv, nq = (int)(hp->n_head / hp->n_head_kv);
  const struct st_target dense = traced(e, st_placement_dense_target(&e->placement, l));
  int rc = 0;
  const int per_task = e->attn_groups_per_task;
  for (int g = 0; g < G && !rc; g += per_task) {
    struct st_attention_args a = {.T = b->T, .pos0 = e->n_past, .n_ctx = e->n_ctx,
                                  .n_embd = (int)hp->n_embd, .head_dim = (int)hp->head_dim,
                                  .n_q = nq, .group0 = g, .n_groups = per_task, .eps = hp->rms_eps,
                                  .rope_theta = hp->rope_theta, .wq = st_engine_wdesc(&L->wq),
                                  .wk = st_engine_wdesc(&L->wk), .wv = st_engine_wdesc(&L->wv),
                                  .graph_key = graph_key(e, b->T, l, GRAPH_ATTENTION), .cublas_rows = e->cublas_rows,
                                  .int8_dot = e->int8_dot, .kv_type = e->kv_type, .flash_mma = e->flash_mma};
    starpu_data_handle_t bufs[7 + 3 * per_task];
    const starpu_data_handle_t fixed[7] = {b->x, hw[W_ATTN_NORM], hw[W_Q], hw[W_K], hw[W_V], hw[W_Q_NORM], hw[W_K_NORM]};
    memcpy(bufs, fixed, sizeof fixed);
    for (int i = 0; i < per_task; i++) {
      const size_t ikv = ((size_t)l * G + g + i) * 2;
      bufs[7 + 2 * i] = e->h_kv[ikv];
      bufs[8 + 2 * i] = e->h_kv[ikv + 1];
      bufs[7 + 2 * per_task + i] = b->attn[g + i];
    }
    rc = st_submit_attention(&a, bufs, dense, names[NAME_ATTN + g / per_task]);
    e->stats.tasks++;
  }
  const int so = (int)hp->n_embd / e->n_slices_o;
  for (int s = 0; s < e->n_slices_o && !rc; s++) {
    struct st_linear_args a = {.T = b->T, .in_row0 = 0, .n_in = G, .has_norm = 0,
                               .r0 = (int64_t)s * so, .r1 = (int64_t)(s + 1) * so, .w = st_engine_wdesc(&L->wo),
                               .graph_key = graph_key(e, b->T, l, GRAPH_ATTN_OUTPUT), .cublas_rows = e->cublas_rows,
                               .int8_dot = e->int8_dot};
    starpu_data_handle_t bufs[2 + G];
    bufs[0] = hw[W_O];
    for (int g = 0; g < G; g++) bufs[1 + g] = b->attn[g];
    bufs[1 + G] = b->xo[s];
    rc = st_submit_linear(&a, bufs, 2 + G, dense, names[NAME_ATTN + G + s]);
    e->stats.tasks++;
  }
  if (rc) return rc;
  {
    struct st_router_args a = {.T = b->T, .n_embd = (int)hp->n_embd, .n_expert = (int)hp->n_expert,
                               .k = (int)hp->n_expert_used, .n_xo = e->n_slices_o,
                               .eps = hp->rms_eps, .w = st_engine_wdesc(&L->router),
                               .graph_key = graph_key(e, b->T, l, GRAPH_ROUTER), .cublas_rows = e->cublas_rows};
    const int nb = 6 + e->n_slices_o;
    starpu_data_handle_t bufs[nb];
    bufs[0] = b->x;
    for (int s = 0; s < e->n_slices_o; s++) bufs[1 + s] = b->xo[s];
    bufs[1 + e->n_slices_o] = hw[W_FFN_NORM];
    bufs[2 + e->n_slices_o] = hw[W_ROUTER];
    bufs[3 + e->n_slices_o] = b->h;
    bufs[4 + e->n_slices_o] = b->ffn_in;
    bufs[5 + e->n_slices_o] = b->routing;
    rc = st_submit_router(&a, bufs, nb, dense, names[0]);
    e->stats.tasks++;
  }
  return rc ? rc : submit_moe(e, b, l);
}

/* Output head over rows [row0, row0 + T_out) of x into e->logits ([T_out][n_vocab]). */
static int submit_head(struct st_engine *e, struct batch *b, int row0, int T_out) {
  const struct st_hparams *hp = &e->hp;
  const int V = (int)hp->n_vocab, S = e->n_slices_head;
  const int rows = st_div_up(V, S);
  starpu_data_handle_t *out = malloc(sizeof(starpu_data_handle_t) * (size_t)S);
  float *slices = malloc(sizeof(float) * (size_t)T_out * V);
  if (!out || !slices) {
    free(out);
    free(slices);
    return st_set_error(ST_ENOMEM, "out of memory for logits");
  }
  int rc = 0, submitted = 0;
  for (int s = 0; s < S && !rc; s++) {
    const int r0 = s * rows, r1 = r0 + rows < V ? r0 + rows : V;
    struct st_linear_args a = {.T = T_out, .in_row0 = row0, .n_in = 1, .has_norm = 1,
                               .r0 = r0, .r1 = r1, .eps = hp->rms_eps, .w = st_engine_wdesc(&e->model->output),
                               .graph_key = graph_key(e, b->T, hp->n_layer, 0), .cublas_rows = e->cublas_rows,
                               .int8_dot = e->int8_dot, .dense_kind = ST_DENSE_HEAD};
    out[s] = st_engine_reg(slices + (size_t)T_out * r0, (uint64_t)T_out * (r1 - r0), 4);
    starpu_data_handle_t bufs[4] = {e->h_output, e->h_output_norm, b->x, out[s]};
    rc = st_submit_linear(&a, bufs, 4, traced(e, st_placement_dense_target(&e->placement, e->hp.n_layer)), e->head_names[s]);
    e->stats.tasks++;
    submitted++;
  }
  for (int s = 0; s < submitted; s++) starpu_data_unregister(out[s]); /* waits for the task */
  if (!rc)
    for (int s = 0; s < S; s++) {
      const int r0 = s * rows, r1 = r0 + rows < V ? r0 + rows : V;
      for (int t = 0; t < T_out; t++)
        memcpy(e->logits + (size_t)t * V + r0, slices + (size_t)T_out * r0 + (size_t)t * (r1 - r0),
               sizeof(float) * (size_t)(r1 - r0));
    }
  free(out);
  free(slices);
  return rc;
}

int st_batch_eval(struct st_engine *e, const int32_t *ids, int T, int want_logits, int all_logits) {
  const struct st_hparams *hp = &e->hp;
  const size_t d = hp->n_embd, k = hp->n_expert_used;
  const size_t qg = (size_t)(hp->n_head / hp->n_head_kv) * hp->head_dim;
  const int fit = st_engine_chunk_fits(e, T, e->prefill_cap, all_logits);
  if (fit) return fit;
  st_engine_embed(e, ids, T, e->x);

  struct batch b = {.T = T};
  starpu_data_handle_t attn[hp->n_head_kv], xo[e->n_slices_o];
  b.attn = attn;
  b.xo = xo;
  b.x = st_engine_reg(e->x, (uint64_t)T * d, 4);
  b.h = st_engine_reg(e->h, (uint64_t)T * d, 4);
  b.ffn_in = st_engine_reg(e->ffn_in, (uint64_t)T * d, 4);
  b.routing = st_engine_reg(e->routing, (uint64_t)T * k, sizeof(struct st_route));
  for (uint32_t g = 0; g < hp->n_head_kv; g++) attn[g] = st_engine_reg(e->attn + (size_t)g * T * qg, (uint64_t)T * qg, 4);
  const size_t so = d / (size_t)e->n_slices_o;
  for (int s = 0; s < e->n_slices_o; s++) xo[s] = st_engine_reg(e->xo + (size_t)s * T * so, (uint64_t)T * so, 4);

  int rc = 0;
  for (uint32_t l = 0; l < hp->n_layer && !rc; l++) rc = submit_layer(e, &b, l);
  if (!rc && want_logits) rc = all_logits ? submit_head(e, &b, 0, T) : submit_head(e, &b, T - 1, 1);
  const double t_wait = st_now();
  starpu_task_wait_for_all();
  /* nothing reads the activations on the host after the batch (the next one embeds into e->x
   * again; the logits came back through the head's own handles): no copy back from the GPU, where
   * their last values are (about 200 MB for a 4,096-token chunk of qwen3-30b-a3b) */
  starpu_data_unregister_no_coherency(b.x);
  starpu_data_unregister_no_coherency(b.h);
  starpu_data_unregister_no_coherency(b.ffn_in);
  starpu_data_unregister(b.routing); /* the host read it last (submit_moe): no copy */
  for (uint32_t g = 0; g < hp->n_head_kv; g++) starpu_data_unregister_no_coherency(attn[g]);
  for (int s = 0; s < e->n_slices_o; s++) starpu_data_unregister_no_coherency(xo[s]);
  e->stats.wait_end_s += st_now() - t_wait;
  return rc;
}

