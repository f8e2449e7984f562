/* The prompt lanes (prompt.h): a CPU-only prompt chunk's work items and the lane codelet that
 * runs them. Each item computes its outputs with the kernels and the float operations of the
 * per-task path's codelets (attention.c, linear.c, router.c, expert_rows.c, combine.c), so the two
 * paths give the same bits; the comments name the codelet each item mirrors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/dot.h"
#include "codelets/layer_cpu.h"
#include "codelets/prompt.h"
#include "codelets/quant.h"
#include "common.h"

static int64_t div_up64(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Whether W's product takes q8_0 activations (st_dense_matmul's rule, dot.h). */
static int dense_q8(const struct st_decode_ctx *c, const struct st_wdesc *w) { return st_dense_q8(w->type, w->n, c->int8_dot); }

/* A layer's activation layouts for its experts (expert_rows_cpu's rule): bytes of a quantised row
 * for gate and for up (0: float32 activations), whether up has its own copy, and the down side's. */
struct ffn_layout {
  uint64_t qg, qu, qa;
  int up_own, need_f;
};

static struct ffn_layout ffn_layout(const struct st_decode_ctx *c, const struct st_decode_layer *L) {
  struct ffn_layout f = {0};
  if (c->int8_dot) {
    f.qg = st_q8_row_bytes(L->gate_d.type, c->n_embd);
    f.qu = st_q8_row_bytes(L->up_d.type, c->n_embd);
    f.qa = st_q8_row_bytes(L->down_d.type, c->n_ff);
  }
  f.up_own = f.qu && f.qu != f.qg;
  f.need_f = !f.qg || !f.qu;
  return f;
}

/* Whether each gate/up item quantises its own act rows for down (down in blocks of 32, item rows
 * a multiple of 32): the QA phase is then empty (the decode lanes' rule). */
static int qa_in_gateup(const struct st_prompt_ctx *p, const struct ffn_layout *f, const struct st_decode_layer *L) {
  return f->qa && p->rows_gateup % 32 == 0 && st_q8_row_bytes(L->down_d.type, 32) > 0;
}

static float *lane_scratch(const struct st_prompt_ctx *p) {
  const int w = starpu_worker_get_id();
  return p->scratch + (size_t)(w < 0 ? 0 : w) * (size_t)p->scratch_floats;
}

static const void *expert_mat(const struct st_decode_ctx *c, int layer, int e, int which) {
  return c->expert_src[((size_t)layer * c->n_expert + (size_t)e) * 3 + which];
}

/* Token range of token-tile item i. */
static void tile_of(const struct st_prompt_ctx *p, int64_t i, int *t0, int *t1) {
  *t0 = (int)(i * p->tile);
  *t1 = (int)min64(p->T, *t0 + p->tile);
}

/* xn quantised for layer l's wq (when it takes q8_0 activations), tokens [t0, t1). */
static void quantize_xn(const struct st_prompt_ctx *p, int l, int t0, int t1) {
  const struct st_decode_ctx *c = p->dc;
  if (l >= c->n_layer || !dense_q8(c, &c->layers[l].wq_d)) return;
  const uint64_t rb = st_q8_row_bytes(ST_TYPE_Q8_0, c->n_embd);
  st_quantize_act(ST_TYPE_Q8_0, p->xn + (size_t)t0 * c->n_embd, c->n_embd, t1 - t0, c->n_embd, p->xnq + (size_t)t0 * rb);
}

/* ---- attention (attention_cpu) -------------------------------------------------------------- */

static void item_norm(const struct st_prompt_ctx *p, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const int d = c->n_embd, hd = c->head_dim;
  int t0, t1;
  tile_of(p, i, &t0, &t1);
  for (int t = t0; t < t1; t++) {
    st_rmsnorm(p->x + (size_t)t * d, c->layers[0].attn_norm, p->xn + (size_t)t * d, d, c->eps);
    st_rope_table(p->rope + (size_t)t * hd, hd, p->pos0 + t, c->rope_theta);
  }
  quantize_xn(p, 0, t0, t1);
}

static void item_qkv(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const int hd = c->head_dim, d = c->n_embd, G = c->n_head_kv, qw = c->n_head / G * hd;
  const int64_t qrows = (int64_t)c->n_head * hd, kvrows = (int64_t)G * hd, R = p->rows_qkv;
  /* K and V first: their float32 products take longer than a Q block, and the phase's last items
   * should be its shortest */
  int64_t r0 = i * R < 2 * kvrows ? qrows + i * R : i * R - 2 * kvrows;
  if (r0 < qrows) { /* rows_qkv divides head_dim: the block lies in one group */
    const int g = (int)(r0 / qw);
    float *out = p->q + ((size_t)g * p->cap) * qw + (size_t)(r0 - (int64_t)g * qw);
    if (dense_q8(c, &L->wq_d)) st_matmul_q8(L->wq_d.type, L->wq, L->wq_d.row_bytes, r0, r0 + R, p->xnq, p->T, d, out, qw);
    else st_matmul(L->wq_d.type, L->wq, L->wq_d.row_bytes, r0, r0 + R, p->xn, d, p->T, d, out, qw);
    return;
  }
  r0 -= qrows;
  const int v = r0 >= kvrows;
  if (v) r0 -= kvrows;
  const int g = (int)(r0 / hd);
  const struct st_wdesc *w = v ? &L->wv_d : &L->wk_d;
  float *out = p->kvnew + ((size_t)(v * G + g) * p->cap) * hd + (size_t)(r0 - (int64_t)g * hd);
  /* K and V on float32 activations, as attention_cpu (their rounding stays in the cache) */
  st_matmul(w->type, v ? L->wv : L->wk, w->row_bytes, r0, r0 + R, p->xn, d, p->T, d, out, hd);
}

static void item_rope(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const int hd = c->head_dim, G = c->n_head_kv, nq = c->n_head / G, qw = nq * hd;
  if (i < c->n_head) {
    const int g = (int)i / nq, hh = (int)i % nq;
    for (int t = 0; t < p->T; t++) {
      float *qh = p->q + ((size_t)g * p->cap + t) * qw + (size_t)hh * hd;
      st_rmsnorm(qh, L->q_norm, qh, hd, c->eps);
      st_rope_apply(qh, hd, p->rope + (size_t)t * hd);
    }
    return;
  }
  const int g = (int)i - c->n_head;
  const uint64_t rb = st_kv_row_bytes(c->kv_type, hd);
  uint8_t *kc = (uint8_t *)L->kv + (size_t)g * 2 * (size_t)c->n_ctx * rb, *vc = kc + (size_t)c->n_ctx * rb;
  for (int t = 0; t < p->T; t++) {
    float *kt = p->kvnew + ((size_t)g * p->cap + t) * hd;
    const float *vt = p->kvnew + ((size_t)(G + g) * p->cap + t) * hd;
    st_rmsnorm(kt, L->k_norm, kt, hd, c->eps);
    st_rope_apply(kt, hd, p->rope + (size_t)t * hd);
    st_kv_store(c->kv_type, kt, kc + (size_t)(p->pos0 + t) * rb, hd);
    st_kv_store(c->kv_type, vt, vc + (size_t)(p->pos0 + t) * rb, hd);
  }
}

/* Item i: group i % G, token tile ntiles - 1 - i / G (the longest rows first). */
static void item_attn(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const int hd = c->head_dim, G = c->n_head_kv, nq = c->n_head / G, qw = nq * hd;
  const int ntiles = (int)div_up64(p->T, p->tile_attn), g = (int)(i % G), tile = ntiles - 1 - (int)(i / G);
  const int t0 = tile * p->tile_attn, tt = (int)min64(p->T - t0, p->tile_attn);
  const uint64_t rb = st_kv_row_bytes(c->kv_type, hd);
  const uint8_t *kc = (const uint8_t *)c->layers[l].kv + (size_t)g * 2 * (size_t)c->n_ctx * rb, *vc = kc + (size_t)c->n_ctx * rb;
  float *o = lane_scratch(p), *score = o + (size_t)p->tile_attn * qw;
  st_attend_tokens(p->q + ((size_t)g * p->cap + t0) * qw, tt, nq, hd, p->pos0 + t0, c->kv_type, kc, vc, o, score,
                   p->scratch_floats - (int64_t)p->tile_attn * qw);
  for (int t = 0; t < tt; t++)
    memcpy(p->attn + (size_t)(t0 + t) * c->n_head * hd + (size_t)g * qw, o + (size_t)t * qw, sizeof(float) * (size_t)qw);
}

/* ---- output projection (linear_cpu), residual, router (router_cpu) --------------------------- */

static void item_qattn(const struct st_prompt_ctx *p, int64_t i) {
  const int n = p->dc->n_head * p->dc->head_dim;
  int t0, t1;
  tile_of(p, i, &t0, &t1);
  st_quantize_act(ST_TYPE_Q8_0, p->attn + (size_t)t0 * n, n, t1 - t0, n, p->attnq + (size_t)t0 * st_q8_row_bytes(ST_TYPE_Q8_0, n));
}

static void item_oproj(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_wdesc *w = &c->layers[l].wo_d;
  const int n = c->n_head * c->head_dim, d = c->n_embd;
  const int64_t r0 = i * p->rows_o, r1 = min64(d, r0 + p->rows_o);
  if (dense_q8(c, w)) st_matmul_q8(w->type, c->layers[l].wo, w->row_bytes, r0, r1, p->attnq, p->T, n, p->xo + r0, d);
  else st_matmul(w->type, c->layers[l].wo, w->row_bytes, r0, r1, p->attn, n, p->T, n, p->xo + r0, d);
}

/* Token tile: h = x + xo, ffn_in = RMSNorm(h), the router's logits (every row for the tile's
 * tokens: the router is small), softmax and top-k per token (router_cpu). A non-finite choice is
 * recorded in the sync block (the host finds the token afterwards) and its expert replaced by 0 so
 * that later items stay in bounds. */
static void item_route(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const int d = c->n_embd, E = c->n_expert;
  int t0, t1;
  tile_of(p, i, &t0, &t1);
  for (int t = t0; t < t1; t++) {
    float *h = p->h + (size_t)t * d;
    for (int j = 0; j < d; j++) h[j] = p->x[(size_t)t * d + j] + p->xo[(size_t)t * d + j];
    st_rmsnorm(h, L->ffn_norm, p->ffn_in + (size_t)t * d, d, c->eps);
  }
  float *logits = p->rlogits + (size_t)t0 * E;
  st_matmul(L->router_d.type, L->router, L->router_d.row_bytes, 0, E, p->ffn_in + (size_t)t0 * d, d, t1 - t0, d, logits, E);
  for (int t = t0; t < t1; t++) {
    struct st_route *r = p->route + ((size_t)l * p->cap + t) * c->k;
    st_route_topk(p->rlogits + (size_t)t * E, E, c->k, r);
    for (int j = 0; j < c->k; j++)
      if (r[j].expert < 0 || r[j].expert >= E || !(r[j].weight == r[j].weight)) {
        if (!__atomic_exchange_n(&p->sync->error, 1, __ATOMIC_RELAXED)) p->sync->error_layer = l;
        if (r[j].expert < 0 || r[j].expert >= E) r[j].expert = 0;
      }
  }
}

/* ---- experts (expert_rows_cpu) and combine (combine_cpu) ------------------------------------- */

/* The chunk's T * k entries by expert, each expert's in entry (token) order: a counting sort. */
static void item_sort(const struct st_prompt_ctx *p, int l) {
  const struct st_decode_ctx *c = p->dc;
  const int E = c->n_expert, n = p->T * c->k;
  const struct st_route *r = p->route + (size_t)l * p->cap * c->k;
  int32_t *fill = (int32_t *)(void *)lane_scratch(p);
  memset(p->grp, 0, sizeof(int32_t) * (size_t)(E + 1));
  for (int i = 0; i < n; i++) p->grp[r[i].expert + 1]++;
  for (int e = 0; e < E; e++) p->grp[e + 1] += p->grp[e];
  memcpy(fill, p->grp, sizeof(int32_t) * (size_t)E);
  for (int i = 0; i < n; i++) {
    const int row = fill[r[i].expert]++;
    p->row_tok[row] = i / c->k;
    p->row_w[row] = r[i].weight;
    p->row_of[i] = row;
  }
  /* the order the expert items take the experts: most rows first (ties by id), so that the
   * phases end on the smallest items (a counting sort by row count, descending) */
  int32_t *by = fill; /* [T + 2] counts of each row count, reused */
  memset(by, 0, sizeof(int32_t) * (size_t)(p->T + 2));
  for (int e = 0; e < E; e++) by[p->T - (p->grp[e + 1] - p->grp[e]) + 1]++;
  for (int v = 0; v <= p->T; v++) by[v + 1] += by[v];
  for (int e = 0; e < E; e++) p->eorder[by[p->T - (p->grp[e + 1] - p->grp[e])]++] = e;
}

/* Each token's FFN input in its layouts, copied to its k sorted rows. */
static void item_qx(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const struct ffn_layout f = ffn_layout(c, L);
  const int d = c->n_embd, k = c->k;
  uint8_t *tmp = (uint8_t *)lane_scratch(p);
  int t0, t1;
  tile_of(p, i, &t0, &t1);
  for (int t = t0; t < t1; t++) {
    const float *x = p->ffn_in + (size_t)t * d;
    if (f.qg) st_quantize_act(L->gate_d.type, x, d, 1, d, tmp);
    if (f.up_own) st_quantize_act(L->up_d.type, x, d, 1, d, tmp + f.qg);
    for (int j = 0; j < k; j++) {
      const size_t row = (size_t)p->row_of[t * k + j];
      if (f.qg) memcpy(p->xsg + row * f.qg, tmp, f.qg);
      if (f.up_own) memcpy(p->xsu + row * f.qu, tmp + f.qg, f.qu);
      if (f.need_f) memcpy(p->xsf + row * d, x, sizeof(float) * (size_t)d);
    }
  }
}

static void item_gateup(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const int R = p->rows_gateup, per = (int)div_up64(c->n_ff, R), e = p->eorder[i / per], d = c->n_embd, ff = c->n_ff;
  const int row0 = p->grp[e], n = p->grp[e + 1] - row0;
  if (n == 0) return;
  const int64_t f0 = (i % per) * R, f1 = min64(ff, f0 + R), nf = f1 - f0;
  const struct ffn_layout f = ffn_layout(c, L);
  float *g = lane_scratch(p), *u = g + (size_t)n * R;
  const void *gw = expert_mat(c, l, e, 0), *uw = expert_mat(c, l, e, 1);
  if (f.qg) st_matmul_q8(L->gate_d.type, gw, L->gate_d.row_bytes, f0, f1, p->xsg + (size_t)row0 * f.qg, n, d, g, nf);
  else st_matmul(L->gate_d.type, gw, L->gate_d.row_bytes, f0, f1, p->xsf + (size_t)row0 * d, d, n, d, g, nf);
  if (f.qu)
    st_matmul_q8(L->up_d.type, uw, L->up_d.row_bytes, f0, f1, (f.up_own ? p->xsu : p->xsg) + (size_t)row0 * f.qu, n, d, u, nf);
  else st_matmul(L->up_d.type, uw, L->up_d.row_bytes, f0, f1, p->xsf + (size_t)row0 * d, d, n, d, u, nf);
  const int qa_here = qa_in_gateup(p, &f, L);
  for (int r = 0; r < n; r++) {
    float *act = p->act + (size_t)(row0 + r) * ff + f0;
    const float *gr = g + (size_t)r * nf, *ur = u + (size_t)r * nf;
    for (int64_t j = 0; j < nf; j++) act[j] = gr[j] / (1.0f + expf(-gr[j])) * ur[j];
    if (qa_here)
      st_quantize_act(L->down_d.type, act, nf, 1, nf, p->aq + (size_t)(row0 + r) * f.qa + st_q8_row_bytes(L->down_d.type, f0));
  }
}

static void item_qa(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const int64_t r0 = i * p->rows_qa, r1 = min64((int64_t)p->T * c->k, r0 + p->rows_qa);
  const struct ffn_layout f = ffn_layout(c, L);
  st_quantize_act(L->down_d.type, p->act + (size_t)r0 * c->n_ff, c->n_ff, r1 - r0, c->n_ff, p->aq + (size_t)r0 * f.qa);
}

static void item_down(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const int R = p->rows_down, d = c->n_embd, ff = c->n_ff, per = (int)div_up64(d, R), e = p->eorder[i / per];
  const int row0 = p->grp[e], n = p->grp[e + 1] - row0;
  if (n == 0) return;
  const int64_t r0 = (i % per) * R, r1 = min64(d, r0 + R);
  const struct ffn_layout f = ffn_layout(c, L);
  const void *dw = expert_mat(c, l, e, 2);
  float *out = p->eout + (size_t)row0 * d + r0;
  if (f.qa) st_matmul_q8(L->down_d.type, dw, L->down_d.row_bytes, r0, r1, p->aq + (size_t)row0 * f.qa, n, ff, out, d);
  else st_matmul(L->down_d.type, dw, L->down_d.row_bytes, r0, r1, p->act + (size_t)row0 * ff, ff, n, ff, out, d);
  for (int r = 0; r < n; r++) {
    const float w = p->row_w[row0 + r];
    for (int64_t j = 0; j < r1 - r0; j++) out[(size_t)r * d + j] *= w;
  }
}

/* x = h + the token's expert rows added in slot order, then the next layer's norm (or the
 * output norm) into xn. */
static void item_combine(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const int d = c->n_embd, k = c->k;
  const float *norm = l + 1 < c->n_layer ? c->layers[l + 1].attn_norm : c->output_norm;
  int t0, t1;
  tile_of(p, i, &t0, &t1);
  for (int t = t0; t < t1; t++) {
    float *x = p->x + (size_t)t * d;
    const float *h = p->h + (size_t)t * d;
    for (int j = 0; j < d; j++) {
      float acc = 0.0f;
      for (int s = 0; s < k; s++) acc += p->eout[(size_t)p->row_of[t * k + s] * d + j];
      x[j] = acc + h[j];
    }
    st_rmsnorm(x, norm, p->xn + (size_t)t * d, d, c->eps);
  }
  quantize_xn(p, l + 1, t0, t1);
}

static void item_head(const struct st_prompt_ctx *p, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const int64_t r0 = i * p->rows_head, r1 = min64(c->n_vocab, r0 + p->rows_head);
  st_matmul(c->output_d.type, c->output, c->output_d.row_bytes, r0, r1, p->xn + (size_t)p->out_row0 * c->n_embd, c->n_embd,
            p->n_out, c->n_embd, p->logits + r0, c->n_vocab);
}

static void run_item(const struct st_prompt_ctx *p, int kind, int l, int64_t i) {
  switch (kind) {
  case ST_PP_NORM: item_norm(p, i); break;
  case ST_PP_QKV: item_qkv(p, l, i); break;
  case ST_PP_ROPE: item_rope(p, l, i); break;
  case ST_PP_ATTN: item_attn(p, l, i); break;
  case ST_PP_QATTN: item_qattn(p, i); break;
  case ST_PP_OPROJ: item_oproj(p, l, i); break;
  case ST_PP_ROUTE: item_route(p, l, i); break;
  case ST_PP_SORT: item_sort(p, l); break;
  case ST_PP_QX: item_qx(p, l, i); break;
  case ST_PP_GATEUP: item_gateup(p, l, i); break;
  case ST_PP_QA: item_qa(p, l, i); break;
  case ST_PP_DOWN: item_down(p, l, i); break;
  case ST_PP_COMBINE: item_combine(p, l, i); break;
  case ST_PP_HEAD: item_head(p, i); break;
  default: ST_ASSERT(0 && "unknown prompt phase");
  }
}

/* ---- the plan and the lane ----------------------------------------------------------------- */

int st_prompt_alloc_plan(struct st_prompt_ctx *p) {
  const int L = p->dc->n_layer, P = 1 + (ST_PP_KINDS - 2) * L + 1;
  p->phase_start = calloc((size_t)P + 1, sizeof *p->phase_start);
  p->phase_kind = calloc((size_t)P, sizeof *p->phase_kind);
  p->phase_layer = calloc((size_t)P, sizeof *p->phase_layer);
  p->layer_end = calloc((size_t)L + 1, sizeof *p->layer_end);
  if (!p->phase_start || !p->phase_kind || !p->phase_layer || !p->layer_end)
    return st_set_error(ST_ENOMEM, "out of memory for the prompt lanes' plan");
  return 0;
}

void st_prompt_free_plan(struct st_prompt_ctx *p) {
  free(p->phase_start);
  free(p->phase_kind);
  free(p->phase_layer);
  free(p->layer_end);
}

void st_prompt_plan(struct st_prompt_ctx *p) {
  const struct st_decode_ctx *c = p->dc;
  const int L = c->n_layer, hd = c->head_dim, T = p->T, E = c->n_expert;
  const int64_t tiles = div_up64(T, p->tile);
  int n = 0;
  int64_t at = 0;
#define PHASE(kind_, layer_, count_)                                                                    \
  do {                                                                                                  \
    p->phase_kind[n] = (int16_t)(kind_);                                                                \
    p->phase_layer[n] = (int16_t)(layer_);                                                              \
    p->phase_start[n++] = at;                                                                           \
    at += (count_);                                                                                     \
  } while (0)
  PHASE(ST_PP_NORM, 0, tiles);
  for (int l = 0; l < L; l++) {
    const struct st_decode_layer *Ly = &c->layers[l];
    const struct ffn_layout f = ffn_layout(c, Ly);
    PHASE(ST_PP_QKV, l, (int64_t)(c->n_head + 2 * c->n_head_kv) * hd / p->rows_qkv);
    PHASE(ST_PP_ROPE, l, c->n_head + c->n_head_kv);
    PHASE(ST_PP_ATTN, l, (int64_t)c->n_head_kv * div_up64(T, p->tile_attn));
    PHASE(ST_PP_QATTN, l, dense_q8(c, &Ly->wo_d) ? tiles : 0);
    PHASE(ST_PP_OPROJ, l, div_up64(c->n_embd, p->rows_o));
    PHASE(ST_PP_ROUTE, l, tiles);
    PHASE(ST_PP_SORT, l, 1);
    PHASE(ST_PP_QX, l, tiles);
    PHASE(ST_PP_GATEUP, l, (int64_t)E * div_up64(c->n_ff, p->rows_gateup));
    PHASE(ST_PP_QA, l, f.qa && !qa_in_gateup(p, &f, Ly) ? div_up64((int64_t)T * c->k, p->rows_qa) : 0);
    PHASE(ST_PP_DOWN, l, (int64_t)E * div_up64(c->n_embd, p->rows_down));
    PHASE(ST_PP_COMBINE, l, tiles);
    p->layer_end[l] = at;
  }
  PHASE(ST_PP_HEAD, L, p->n_out > 0 ? div_up64(c->n_vocab, p->rows_head) : 0);
#undef PHASE
  p->phase_start[n] = at;
  p->layer_end[L] = at;
  p->n_phases = n;
}

/* Claims items below the lane's bound in order; each waits for the phases before it (decode.h). */
static void prompt_lane_cpu(void *buffers[], void *cl_arg) {
  const struct st_prompt_lane_args *a = cl_arg;
  const struct st_prompt_ctx *p = a->ctx;
  (void)buffers;
  const int64_t bound = p->layer_end[a->layer];
  int ph = 0;
  for (int64_t i; (i = st_lane_claim(p->sync, bound)) >= 0;) {
    while (ph < p->n_phases && p->phase_start[ph + 1] <= i) ph++;
    ST_ASSERT(ph < p->n_phases);
    st_lane_wait_at_least(&p->sync->done, p->phase_start[ph]);
    run_item(p, p->phase_kind[ph], p->phase_layer[ph], i - p->phase_start[ph]);
    __atomic_add_fetch(&p->sync->done, 1, __ATOMIC_ACQ_REL);
  }
}

static struct starpu_codelet prompt_lane_cl = {
    .cpu_funcs = {prompt_lane_cpu},
    .cpu_funcs_name = {"prompt_lane_cpu"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "prompt_lane",
};

int st_submit_prompt_lane(const struct st_prompt_lane_args *a, struct st_target tgt, const char *name) {
  return st_submit_task(&prompt_lane_cl, NULL, NULL, 0, a, sizeof *a, tgt, name);
}
