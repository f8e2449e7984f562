/* The prompt lanes' buffers, plan and submission (graph/prompt.h). The lanes reuse the engine's
 * batch buffers (x, h, ffn_in, xo, attn, expert_out, logits) and the decode step's CPU-only
 * context (weights, KV cache, experts); the rest is allocated here once per engine for chunks of
 * up to the engine's prompt chunk. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/dot.h"
#include "codelets/prompt.h"
#include "codelets/quant.h"
#include "common.h"
#include "graph/decode.h"
#include "graph/engine.h"
#include "graph/prompt.h"
#include "tiers/placement.h"

/* Items' sizes: tokens per token-tile item and per attention item, weight rows per item. */
#define TILE 8
#define TILE_ATTN 16
#define ROWS_O 64
#define ROWS_GATEUP 64
#define ROWS_DOWN 128
#define ROWS_HEAD 512
#define ROWS_QA 32

struct st_prompt {
  struct st_prompt_ctx ctx;
  void *block; /* the buffers below the engine's, one allocation */
  size_t bytes;
  int n_lanes;
  const int *lane_worker;  /* the decode step's: one lane per CPU worker */
  char *names;             /* task names (StarPU keeps the pointers) */
  const char **lane_names; /* [n_layer + 1][n_lanes] */
};

/* The largest per-row byte count any layer needs for `which` (0 gate, 1 up, 2 down) quantised, 0
 * when none takes int8 activations. */
static uint64_t q8_max(const struct st_engine *e, int which) {
  uint64_t most = 0;
  for (uint32_t l = 0; l < e->hp.n_layer && e->int8_dot; l++) {
    const struct st_layer *L = &e->model->layers[l];
    const struct st_weight *w = which == 0 ? &L->gate_exps : which == 1 ? &L->up_exps : &L->down_exps;
    const uint64_t b = st_q8_row_bytes(w->type, (int64_t)(which == 2 ? e->hp.n_ff_exp : e->hp.n_embd));
    most = b > most ? b : most;
  }
  return most;
}

/* Whether some layer's up matrix takes int8 activations of another layout than gate's
 * (prompt_lane.c's up_own: a second quantised copy of each row). */
static int any_up_own(const struct st_engine *e) {
  for (uint32_t l = 0; l < e->hp.n_layer && e->int8_dot; l++) {
    const struct st_layer *L = &e->model->layers[l];
    const uint64_t qg = st_q8_row_bytes(L->gate_exps.type, e->hp.n_embd), qu = st_q8_row_bytes(L->up_exps.type, e->hp.n_embd);
    if (qu && qu != qg) return 1;
  }
  return 0;
}

/* Whether some layer's gate or up takes float32 activations (prompt_lane.c's need_f). */
static int any_float_ffn(const struct st_engine *e) {
  for (uint32_t l = 0; l < e->hp.n_layer; l++) {
    const struct st_layer *L = &e->model->layers[l];
    if (!e->int8_dot || !st_q8_row_bytes(L->gate_exps.type, e->hp.n_embd) || !st_q8_row_bytes(L->up_exps.type, e->hp.n_embd))
      return 1;
  }
  return 0;
}

#define CARVE(base, at, dst, type, count)                                                      \
  do {                                                                                         \
    if (base) (dst) = (type *)(void *)((uintptr_t)(base) + (at));                              \
    (at) += (sizeof(type) * (size_t)(count) + 63) & ~(size_t)63;                               \
  } while (0)

/* Carves the lanes' own buffers at base (with base NULL only counts). */
static size_t carve(struct st_prompt_ctx *p, const struct st_engine *e, uint8_t *base, unsigned n_workers) {
  const struct st_hparams *hp = &e->hp;
  const size_t cap = (size_t)p->cap, d = hp->n_embd, hd = hp->head_dim, G = hp->n_head_kv, k = hp->n_expert_used;
  const size_t mla = hp->attn_kind == ST_ATTN_MLA, rows = cap * k;
  /* a token's query rows: GQA n_head x head_dim; MLA the larger of q_b's (qk_nope + n_rot per head)
   * and the absorbed queries' (head_dim) */
  const size_t qw_all = (size_t)hp->n_head * (mla && hp->qk_nope + hp->n_rot > hd ? hp->qk_nope + hp->n_rot : hd);
  size_t fixed = 0; /* the widest fixed FFN (shared expert or dense layer) */
  for (uint32_t l = 0; l < hp->n_layer; l++) {
    const size_t f = e->model->layers[l].dense ? hp->n_ff : hp->n_ff_shexp;
    fixed = f > fixed ? f : fixed;
  }
  const uint64_t qg = q8_max(e, 0), qu = q8_max(e, 1), qa = q8_max(e, 2);
  size_t at = 0;
  CARVE(base, at, p->xn, float, cap * d);
  CARVE(base, at, p->xnq, uint8_t, cap * st_q8_row_bytes_max((int64_t)d) + 1); /* st_lane_xn_act's layout */
  CARVE(base, at, p->xnr, uint8_t, cap * st_q8_row_bytes_max((int64_t)d) + 1);
  CARVE(base, at, p->q, float, cap * qw_all);
  CARVE(base, at, p->kvnew, float, 2 * G * cap * hd);
  CARVE(base, at, p->attnq, uint8_t, cap * st_q8_row_bytes_max((int64_t)qw_all) + 1); /* wo's layout */
  CARVE(base, at, p->attnr, uint8_t, cap * st_q8_row_bytes_max((int64_t)qw_all) + 1);
  CARVE(base, at, p->rope, float, cap * hd);
  CARVE(base, at, p->qa, float, mla ? cap * hp->q_lora + 1 : 1);
  CARVE(base, at, p->qaq, uint8_t, mla ? cap * st_q8_row_bytes(ST_TYPE_Q8_0, (int64_t)hp->q_lora) + 1 : 1);
  CARVE(base, at, p->qm, float, mla ? cap * qw_all : 1);
  CARVE(base, at, p->actf, float, cap * fixed + 1);
  CARVE(base, at, p->eoutf, float, fixed ? cap * d : 1);
  uint64_t fx = 0, fa = 0; /* the fixed FFNs' widest quantised rows (the decode lanes' rule) */
  for (uint32_t l = 0; l < hp->n_layer; l++) {
    const struct st_decode_layer *D = &e->dec->layers[l];
    fx = D->fq_x > fx ? D->fq_x : fx;
    fa = D->fq_a > fa ? D->fq_a : fa;
  }
  CARVE(base, at, p->xfq, uint8_t, cap * fx + 1);
  CARVE(base, at, p->afq, uint8_t, cap * fa + 1);
  CARVE(base, at, p->rlogits, float, cap * hp->n_expert);
  CARVE(base, at, p->route, struct st_route, (size_t)hp->n_layer * rows);
  CARVE(base, at, p->grp, int32_t, hp->n_expert + 1);
  CARVE(base, at, p->row_tok, int32_t, rows);
  CARVE(base, at, p->row_w, float, rows);
  CARVE(base, at, p->row_of, int32_t, rows);
  CARVE(base, at, p->eorder, int32_t, hp->n_expert);
  CARVE(base, at, p->xsg, uint8_t, rows * qg + 1);
  CARVE(base, at, p->xsu, uint8_t, any_up_own(e) ? rows * qu + 1 : 1);
  CARVE(base, at, p->xsf, float, any_float_ffn(e) ? rows * d : 1);
  CARVE(base, at, p->act, float, rows * hp->n_ff_exp);
  CARVE(base, at, p->aq, uint8_t, rows * qa + 1);
  CARVE(base, at, p->scratch, float, (size_t)p->scratch_floats * n_workers);
  CARVE(base, at, p->sync, struct st_lane_sync, 1);
  return at;
}
#undef CARVE

static int make_names(struct st_prompt *pr, const struct st_engine *e) {
  const int L = (int)e->hp.n_layer;
  const size_t n = (size_t)(L + 1) * pr->n_lanes;
  pr->names = malloc(n * 64);
  pr->lane_names = malloc(sizeof(char *) * n);
  if (!pr->names || !pr->lane_names) return st_set_error(ST_ENOMEM, "out of memory for task names");
  for (int l = 0; l <= L; l++)
    for (int i = 0; i < pr->n_lanes; i++) {
      char *s = pr->names + ((size_t)l * pr->n_lanes + i) * 64;
      if (l < L) snprintf(s, 64, "prompt_lane L%d lane %d", l, i);
      else snprintf(s, 64, "prompt_lane head lane %d", i);
      pr->lane_names[(size_t)l * pr->n_lanes + i] = s;
    }
  return 0;
}

int st_prompt_init(struct st_engine *e) {
  const struct st_hparams *hp = &e->hp;
  if (!e->prompt_lanes || !e->dec || e->dec->gpu || e->ff_parts != 1) return 0;
  struct st_prompt *pr = calloc(1, sizeof *pr);
  if (!pr) return st_set_error(ST_ENOMEM, "out of memory for the prompt lanes");
  e->prompt = pr;
  struct st_prompt_ctx *p = &pr->ctx;
  const int qw = (int)(hp->n_head / hp->n_head_kv * hp->head_dim);
  *p = (struct st_prompt_ctx){.dc = &e->dec->ctx, .cap = e->prefill_cap, .x = e->x, .h = e->h, .ffn_in = e->ffn_in,
                              .xo = e->xo, .attn = e->attn, .eout = e->expert_out, .logits = e->logits,
                              .tile = TILE, .tile_attn = TILE_ATTN, .rows_qkv = e->dec->ctx.rows_qkv, .rows_o = ROWS_O,
                              .rows_gateup = ROWS_GATEUP, .rows_down = ROWS_DOWN,
                              .rows_head = ROWS_HEAD, .rows_qa = ROWS_QA};
  /* a worker's scratch: an attention item's output tile and scores (st_attend_tokens tiles its
   * tokens to fit them; at least one token's rows over n_ctx keys), a gate/up item's two row blocks, the
   * sort's fill counts, a quantised FFN input row */
  const int64_t score = (int64_t)TILE_ATTN * (hp->n_head / hp->n_head_kv) * e->n_ctx;
  const int64_t one_token = (int64_t)(hp->n_head / hp->n_head_kv) * e->n_ctx; /* a one-token tile's scores */
  const int64_t attn_f = (int64_t)TILE_ATTN * qw + (score < (1 << 20) ? score : one_token > (1 << 20) ? one_token : (1 << 20));
  const int64_t gu_f = 2 * (int64_t)p->cap * ROWS_GATEUP;
  const int64_t row_f = (int64_t)(q8_max(e, 0) + q8_max(e, 1)) / 4 + hp->n_expert + p->cap + 16;
  const int64_t most = attn_f > gu_f ? attn_f : gu_f;
  p->scratch_floats = (most > row_f ? most : row_f) + 16;
  const unsigned nw = starpu_worker_get_count();
  pr->bytes = carve(p, e, NULL, nw);
  if (posix_memalign(&pr->block, 4096, pr->bytes)) {
    pr->block = NULL;
    return st_set_error(ST_ENOMEM, "out of memory for the prompt lanes' buffers (%.1f MiB)", pr->bytes / 1048576.0);
  }
  memset(pr->block, 0, pr->bytes);
  carve(p, e, pr->block, nw);
  pr->n_lanes = e->dec->n_lanes;
  pr->lane_worker = e->dec->lane_worker;
  int rc = st_prompt_alloc_plan(p);
  if (!rc) rc = make_names(pr, e);
  return rc;
}

void st_prompt_free(struct st_engine *e) {
  struct st_prompt *pr = e->prompt;
  if (!pr) return;
  st_prompt_free_plan(&pr->ctx);
  free(pr->block);
  free(pr->names);
  free(pr->lane_names);
  free(pr);
  e->prompt = NULL;
}

/* The chunk's routing after the lanes: the first non-finite choice (layer, then token) as the
 * per-task path reports it, then the counts it keeps (profiles, the adaptive cache, stats). */
static int count_routing(struct st_engine *e, const struct st_prompt_ctx *p) {
  const struct st_hparams *hp = &e->hp;
  const int k = (int)hp->n_expert_used, E = (int)hp->n_expert, T = p->T;
  if (p->sync->error)
    for (uint32_t l = 0; l < hp->n_layer; l++)
      for (int i = 0; i < T * k; i++) {
        const struct st_route r = p->route[(size_t)l * p->cap * k + i];
        if (r.expert < 0 || r.expert >= E || !(r.weight == r.weight)) {
          char what[96];
          snprintf(what, sizeof what, "the router input of layer %u (token %d)", l, e->n_past + i / k);
          return st_engine_nonfinite(e, (int)l - 1, (int)l, what);
        }
      }
  for (uint32_t l = 0; l < hp->n_layer; l++) {
    if (e->model->layers[l].dense) continue; /* no routing */
    st_engine_count_routes(e, l, p->route + (size_t)l * p->cap * k, T);
    e->stats.expert_tasks[ST_TIER_CPU_POOL] += (uint64_t)e->prompt->n_lanes;
    e->stats.expert_entries[ST_TIER_CPU_POOL] += (uint64_t)T * k;
  }
  return 0;
}

int st_prompt_eval(struct st_engine *e, const int32_t *ids, int T, int want_logits, int all_logits) {
  struct st_prompt *pr = e->prompt;
  struct st_prompt_ctx *p = &pr->ctx;
  const struct st_hparams *hp = &e->hp;
  const int L = (int)hp->n_layer;
  const int fit = st_engine_chunk_fits(e, T, p->cap, all_logits);
  if (fit) return fit;
  st_engine_embed(e, ids, T, p->x);
  p->T = T;
  p->pos0 = e->n_past;
  p->n_out = want_logits ? (all_logits ? T : 1) : 0;
  p->out_row0 = all_logits ? 0 : T - 1;
  st_prompt_plan(p);
  memset(p->sync, 0, sizeof *p->sync);
  int rc = 0;
  for (int l = 0; l <= L && !rc; l++) {
    if (l == L && !p->n_out) break;
    for (int i = 0; i < pr->n_lanes && !rc; i++) {
      const struct st_prompt_lane_args a = {p, l};
      const struct st_target tgt = {STARPU_CPU, pr->lane_worker[i], NULL, NULL, 0};
      rc = st_submit_prompt_lane(&a, st_engine_traced(e, tgt), pr->lane_names[(size_t)l * pr->n_lanes + i]);
      e->stats.tasks++;
    }
  }
  const double t_wait = st_now();
  /* after a failed submission the lanes already submitted stop at their bounds: every item below
   * a bound is claimed in order by a running lane, so none waits forever (decode_lane.c) */
  starpu_task_wait_for_all();
  e->stats.wait_end_s += st_now() - t_wait;
  return rc ? rc : count_routing(e, p);
}
