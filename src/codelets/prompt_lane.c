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
#include "io/model.h"

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

/* Adds bias[0 .. n) to T rows of out `stride` apart (a NULL bias adds nothing). */
static void add_bias_rows(float *out, int64_t stride, int T, const float *bias, int64_t n) {
  if (!bias) return;
  for (int t = 0; t < T; t++)
    for (int64_t j = 0; j < n; j++) out[(size_t)t * stride + j] += bias[j];
}

/* Layer l's K and V planes of KV head g (MLA: one plane). */
static uint8_t *kv_plane(const struct st_decode_ctx *c, const struct st_decode_layer *L, int g, int v) {
  const uint64_t rb = st_kv_row_bytes(c->kv_type, c->head_dim);
  return (uint8_t *)L->kv + ((size_t)g * c->kv_planes + (size_t)v) * (size_t)L->kv_rows * rb;
}

/* MLA: a head's query rows (qk_nope + n_rot) and the q rows of all heads. */
static int mla_qk(const struct st_decode_ctx *c) { return c->qk_nope + c->rope.n_rot; }

/* Token range of token-tile item i. */
static void tile_of(const struct st_prompt_ctx *p, int64_t i, int *t0, int *t1) {
  *t0 = (int)(i * p->tile);
  *t1 = (int)min64(p->T, *t0 + p->tile);
}

/* xn quantised for layer l's products (the head's at l == n_layer), tokens [t0, t1), as the decode
 * lanes do it (st_lane_xn_act): rows of that layout's st_q8_row_bytes, xnr the second term. */
static void quantize_xn(const struct st_prompt_ctx *p, int l, int t0, int t1) {
  const struct st_decode_ctx *c = p->dc;
  int two;
  const uint32_t act = st_lane_xn_act(c, l, &two);
  if (act == ST_TYPE_COUNT) return;
  const uint64_t rb = st_q8_row_bytes(act, c->n_embd);
  const float *x = p->xn + (size_t)t0 * c->n_embd;
  st_quantize_act(act, x, c->n_embd, t1 - t0, c->n_embd, p->xnq + (size_t)t0 * rb);
  if (two) st_quantize_act_residual(act, x, c->n_embd, t1 - t0, c->n_embd, p->xnq + (size_t)t0 * rb, p->xnr + (size_t)t0 * rb);
}

/* ---- attention (attention_cpu) -------------------------------------------------------------- */

static void item_norm(const struct st_prompt_ctx *p, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const int d = c->n_embd, hd = c->head_dim;
  int t0, t1;
  tile_of(p, i, &t0, &t1);
  for (int t = t0; t < t1; t++) {
    st_rmsnorm(p->x + (size_t)t * d, c->layers[0].attn_norm, p->xn + (size_t)t * d, d, c->eps);
    st_rope_conf_table(p->rope + (size_t)t * hd, &c->rope, p->pos0 + t);
  }
  quantize_xn(p, 0, t0, t1);
}

/* MLA's QKV items: blocks of kv_a_mqa's rows first, then of q_a (or wq). */
static int64_t mla_qkv_items(const struct st_prompt_ctx *p) {
  const struct st_decode_ctx *c = p->dc;
  const int64_t q = c->q_lora ? c->q_lora : (int64_t)c->n_head * mla_qk(c);
  return div_up64(c->head_dim, p->rows_qkv) + div_up64(q, p->rows_qkv);
}

static void item_qkv_mla(const struct st_prompt_ctx *p, const struct st_decode_layer *L, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const int d = c->n_embd, R = p->rows_qkv;
  const int64_t nkv = div_up64(c->head_dim, R);
  const struct st_wdesc *w = i < nkv ? &L->wkv_a_d : c->q_lora ? &L->wq_a_d : &L->wq_d;
  const void *W = i < nkv ? L->wkv_a : c->q_lora ? L->wq_a : L->wq;
  const int64_t n = i < nkv ? c->head_dim : c->q_lora ? c->q_lora : (int64_t)c->n_head * mla_qk(c);
  float *out = i < nkv ? p->kvnew : c->q_lora ? p->qa : p->q;
  const int64_t r0 = (i < nkv ? i : i - nkv) * R, r1 = min64(n, r0 + R);
  /* the queries' matrix on xnq as the decode lanes' (st_dense_q8); kv_a_mqa in float32 (the cache keeps it) */
  if (i >= nkv && dense_q8(c, w)) st_matmul_q8(w->type, W, w->row_bytes, r0, r1, p->xnq, p->T, d, out + r0, n);
  else st_matmul(w->type, W, w->row_bytes, r0, r1, p->xn, d, p->T, d, out + r0, n);
}

static void item_qkv(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  if (c->mla) {
    item_qkv_mla(p, L, i);
    return;
  }
  const int hd = c->head_dim, d = c->n_embd, G = c->n_head_kv, qw = c->n_head / G * hd;
  const int64_t qrows = (int64_t)c->n_head * hd, kvrows = (int64_t)G * hd, R = p->rows_qkv;
  /* K and V first: their float32 products take longer than a Q block, and the phase's last items
   * should be its shortest */
  int64_t r0 = i * R < 2 * kvrows ? qrows + i * R : i * R - 2 * kvrows;
  if (r0 < qrows) { /* rows_qkv divides head_dim: the block lies in one group */
    const int g = (int)(r0 / qw);
    float *out = p->q + ((size_t)g * p->cap) * qw + (size_t)(r0 - (int64_t)g * qw);
    st_dense_rows(st_lane_xn_terms(c, l, &L->wq_d, ST_DENSE_QO), L->wq_d.type, L->wq, L->wq_d.row_bytes, r0, r0 + R, p->xn, d,
                  p->xnq, p->xnr, p->T, d, out, qw);
    add_bias_rows(out, qw, p->T, L->bq ? L->bq + r0 : NULL, R);
    return;
  }
  r0 -= qrows;
  const int v = r0 >= kvrows;
  if (v) r0 -= kvrows;
  const int g = (int)(r0 / hd);
  const struct st_wdesc *w = v ? &L->wv_d : &L->wk_d;
  float *out = p->kvnew + ((size_t)(v * G + g) * p->cap) * hd + (size_t)(r0 - (int64_t)g * hd);
  /* K and V on two-term int8 activations or float32 ones, as attention_cpu (their rounding stays in
   * the cache) */
  st_dense_rows(st_lane_xn_terms(c, l, w, ST_DENSE_KV), w->type, v ? L->wv : L->wk, w->row_bytes, r0, r0 + R, p->xn, d, p->xnq,
                p->xnr, p->T, d, out, hd);
  const float *b = v ? L->bv : L->bk;
  add_bias_rows(out, hd, p->T, b ? b + r0 : NULL, R);
}

/* MLA, token tile: the q LoRA's norm; the latent normed and the key part roped, cached. */
static void item_mla_norm(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const int hd = c->head_dim;
  const uint64_t rb = st_kv_row_bytes(c->kv_type, hd);
  int t0, t1;
  tile_of(p, i, &t0, &t1);
  for (int t = t0; t < t1; t++) {
    if (c->q_lora) st_rmsnorm(p->qa + (size_t)t * c->q_lora, L->q_a_norm, p->qa + (size_t)t * c->q_lora, c->q_lora, c->eps);
    if (c->q_lora && dense_q8(c, &L->wq_b_d))
      st_quantize_act(ST_TYPE_Q8_0, p->qa + (size_t)t * c->q_lora, c->q_lora, 1, c->q_lora,
                      p->qaq + (size_t)t * st_q8_row_bytes(ST_TYPE_Q8_0, c->q_lora));
    float *kv = p->kvnew + (size_t)t * hd;
    st_rmsnorm(kv, L->kv_a_norm, kv, c->kv_lora, c->eps);
    st_rope_conf_apply(kv + c->kv_lora, &c->rope, p->rope + (size_t)t * hd);
    st_kv_store(c->kv_type, kv, kv_plane(c, L, 0, 0) + (size_t)((p->pos0 + t) % L->kv_rows) * rb, hd, hd);
  }
}

/* MLA: row blocks of q_b over the chunk's normed q LoRA outputs. */
static void item_qb(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const int64_t n = (int64_t)c->n_head * mla_qk(c), r0 = i * p->rows_qkv, r1 = min64(n, r0 + p->rows_qkv);
  if (dense_q8(c, &L->wq_b_d)) st_matmul_q8(L->wq_b_d.type, L->wq_b, L->wq_b_d.row_bytes, r0, r1, p->qaq, p->T, c->q_lora, p->q + r0, n);
  else st_matmul(L->wq_b_d.type, L->wq_b, L->wq_b_d.row_bytes, r0, r1, p->qa, c->q_lora, p->T, c->q_lora, p->q + r0, n);
}

static void item_rope(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const int hd = c->head_dim, G = c->n_head_kv, nq = c->n_head / G, qw = nq * hd;
  if (c->mla) { /* head i: the rope part roped, the no-rope part absorbed by k_b (decode_lane.c's mla_query) */
    const int qk = mla_qk(c), h = (int)i;
    for (int t = 0; t < p->T; t++) {
      float *qh = p->q + ((size_t)t * c->n_head + h) * qk, *qm = p->qm + ((size_t)t * c->n_head + h) * hd;
      st_rope_conf_apply(qh + c->qk_nope, &c->rope, p->rope + (size_t)t * hd);
      memcpy(qm + c->kv_lora, qh + c->qk_nope, sizeof(float) * (size_t)c->rope.n_rot);
    }
    st_matmul(L->wk_b_d.type, L->wk_b, L->wk_b_d.row_bytes, (int64_t)h * c->kv_lora, (int64_t)(h + 1) * c->kv_lora,
              p->q + (size_t)h * qk, (int64_t)c->n_head * qk, p->T, c->qk_nope, p->qm + (size_t)h * hd, (int64_t)c->n_head * hd);
    return;
  }
  if (i < c->n_head) {
    const int g = (int)i / nq, hh = (int)i % nq;
    for (int t = 0; t < p->T; t++) {
      float *qh = p->q + ((size_t)g * p->cap + t) * qw + (size_t)hh * hd;
      if (L->q_norm) st_rmsnorm(qh, L->q_norm, qh, hd, c->eps);
      st_rope_conf_apply(qh, &c->rope, p->rope + (size_t)t * hd);
    }
    return;
  }
  const int g = (int)i - c->n_head;
  const uint64_t rb = st_kv_row_bytes(c->kv_type, hd);
  uint8_t *kc = kv_plane(c, L, g, 0), *vc = kv_plane(c, L, g, 1);
  for (int t = 0; t < p->T; t++) {
    float *kt = p->kvnew + ((size_t)g * p->cap + t) * hd;
    const float *vt = p->kvnew + ((size_t)(G + g) * p->cap + t) * hd;
    if (L->k_norm) st_rmsnorm(kt, L->k_norm, kt, hd, c->eps);
    st_rope_conf_apply(kt, &c->rope, p->rope + (size_t)t * hd);
    const size_t row = (size_t)((p->pos0 + t) % L->kv_rows);
    st_kv_store(c->kv_type, kt, kc + row * rb, hd, hd);
    st_kv_store(c->kv_type, vt, vc + row * rb, hd, hd);
  }
}

/* Item i: group i % G, token tile ntiles - 1 - i / G (the longest rows first). */
static void item_attn(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const int hd = c->head_dim, G = c->n_head_kv, nq = c->n_head / G, qw = nq * hd;
  const int ntiles = (int)div_up64(p->T, p->tile_attn), g = (int)(i % G), tile = ntiles - 1 - (int)(i / G);
  const int t0 = tile * p->tile_attn, tt = (int)min64(p->T - t0, p->tile_attn);
  const struct st_decode_layer *L = &c->layers[l];
  struct st_attn_conf ac = c->attn_conf;
  ac.sinks = L->sinks ? L->sinks + (size_t)g * nq : NULL;
  ac.window = L->swa ? c->attn_conf.window : 0;
  ac.ring = L->kv_rows;
  const uint8_t *kc = kv_plane(c, L, g, 0);
  float *o = lane_scratch(p), *score = o + (size_t)p->tile_attn * qw;
  const int64_t n_score = p->scratch_floats - (int64_t)p->tile_attn * qw, stride = L->wo_d.n;
  if (c->mla) { /* one KV head: the latent's weighted sums of every head, then v_b per head */
    const int hv = c->head_dim_v;
    st_attend_tokens_conf(p->qm + (size_t)t0 * c->n_head * hd, tt, nq, hd, p->pos0 + t0, c->kv_type, kc, kc, o, score,
                          n_score, &ac);
    for (int h = 0; h < c->n_head; h++)
      st_matmul(L->wv_b_d.type, L->wv_b, L->wv_b_d.row_bytes, (int64_t)h * hv, (int64_t)(h + 1) * hv,
                o + (size_t)h * c->kv_lora, (int64_t)c->n_head * c->kv_lora, tt, c->kv_lora,
                p->attn + (size_t)t0 * stride + (size_t)h * hv, stride);
    return;
  }
  st_attend_tokens_conf(p->q + ((size_t)g * p->cap + t0) * qw, tt, nq, hd, p->pos0 + t0, c->kv_type, kc, kv_plane(c, L, g, 1),
                        o, score, n_score, &ac);
  for (int t = 0; t < tt; t++)
    memcpy(p->attn + (size_t)(t0 + t) * stride + (size_t)g * qw, o + (size_t)t * qw, sizeof(float) * (size_t)qw);
}

/* ---- output projection (linear_cpu), residual, router (router_cpu) --------------------------- */

static void item_qattn(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_wdesc *w = &p->dc->layers[l].wo_d;
  const int n = (int)w->n;
  const uint64_t rb = st_q8_row_bytes(w->type, n);
  int t0, t1;
  tile_of(p, i, &t0, &t1);
  const float *a = p->attn + (size_t)t0 * n;
  st_quantize_act(w->type, a, n, t1 - t0, n, p->attnq + (size_t)t0 * rb);
  if (st_lane_o_terms(p->dc, l) == 2) st_quantize_act_residual(w->type, a, n, t1 - t0, n, p->attnq + (size_t)t0 * rb, p->attnr + (size_t)t0 * rb);
}

static void item_oproj(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_wdesc *w = &c->layers[l].wo_d;
  const int n = (int)w->n, d = c->n_embd;
  const int64_t r0 = i * p->rows_o, r1 = min64(d, r0 + p->rows_o);
  st_dense_rows(st_lane_o_terms(c, l), w->type, c->layers[l].wo, w->row_bytes, r0, r1, p->attn, n, p->attnq, p->attnr, p->T, n,
                p->xo + r0, d);
  add_bias_rows(p->xo + r0, d, p->T, c->layers[l].bo ? c->layers[l].bo + r0 : NULL, r1 - r0);
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
  if (L->fq_x) /* the fixed FFN's input (decode_lane.c's item_qx, row by row) */
    for (int t = t0; t < t1; t++) st_quantize_act(L->fgate_d.type, p->ffn_in + (size_t)t * d, d, 1, d, p->xfq + (size_t)t * L->fq_x);
  if (L->dense) return; /* no router */
  float *logits = p->rlogits + (size_t)t0 * E;
  st_matmul(L->router_d.type, L->router, L->router_d.row_bytes, 0, E, p->ffn_in + (size_t)t0 * d, d, t1 - t0, d, logits, E);
  add_bias_rows(logits, E, t1 - t0, L->router_b, E);
  for (int t = t0; t < t1; t++) {
    struct st_route *r = p->route + ((size_t)l * p->cap + t) * c->k;
    st_route_gated(p->rlogits + (size_t)t * E, E, c->k, c->gating, L->probs_b, c->n_group, c->n_group_used, c->w_norm,
                   c->w_scale, r);
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

/* The FFN's activation of n gate and up values (gpt-oss: the expert's biases first, the clamped
 * SwiGLU), as decode_lane.c's ffn_act. */
static void ffn_act(const struct st_decode_ctx *c, float *g, float *u, const float *gb, const float *ub, int64_t n, float *act) {
  if (gb)
    for (int64_t j = 0; j < n; j++) g[j] += gb[j];
  if (ub)
    for (int64_t j = 0; j < n; j++) u[j] += ub[j];
  if (c->ffn_act == ST_ACT_SWIGLU_OAI) st_swiglu_oai(g, u, act, n);
  else
    for (int64_t j = 0; j < n; j++) act[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
}

/* The fixed FFN's gate/up item: rows f0 .. of its gate and up over all T tokens (float32). */
static void fixed_gateup(const struct st_prompt_ctx *p, const struct st_decode_layer *L, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const int R = p->rows_gateup, d = c->n_embd, ff = L->fixed_ff, T = p->T;
  const int64_t f0 = i * R, f1 = min64(ff, f0 + R), nf = f1 - f0;
  float *g = lane_scratch(p), *u = g + (size_t)T * R;
  if (L->fq_x) {
    st_matmul_q8(L->fgate_d.type, L->fgate, L->fgate_d.row_bytes, f0, f1, p->xfq, T, d, g, nf);
    st_matmul_q8(L->fup_d.type, L->fup, L->fup_d.row_bytes, f0, f1, p->xfq, T, d, u, nf);
  } else {
    st_matmul(L->fgate_d.type, L->fgate, L->fgate_d.row_bytes, f0, f1, p->ffn_in, d, T, d, g, nf);
    st_matmul(L->fup_d.type, L->fup, L->fup_d.row_bytes, f0, f1, p->ffn_in, d, T, d, u, nf);
  }
  for (int t = 0; t < T; t++) {
    float *act = p->actf + (size_t)t * ff + f0;
    ffn_act(c, g + (size_t)t * nf, u + (size_t)t * nf, NULL, NULL, nf, act);
    if (L->fq_a)
      st_quantize_act(L->fdown_d.type, act, nf, 1, nf, p->afq + (size_t)t * L->fq_a + st_q8_row_bytes(L->fdown_d.type, f0));
  }
}

static void item_gateup(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const int R = p->rows_gateup, per = (int)div_up64(c->n_ff, R), d = c->n_embd, ff = c->n_ff;
  const int64_t n_exp = L->dense ? 0 : (int64_t)c->n_expert * per;
  if (i >= n_exp) {
    fixed_gateup(p, L, i - n_exp);
    return;
  }
  const int e = p->eorder[i / per];
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
    ffn_act(c, g + (size_t)r * nf, u + (size_t)r * nf, L->gate_b ? L->gate_b + (size_t)e * ff + f0 : NULL,
            L->up_b ? L->up_b + (size_t)e * ff + f0 : NULL, nf, act);
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
  const int R = p->rows_down, d = c->n_embd, ff = c->n_ff, per = (int)div_up64(d, R);
  const int64_t n_exp = L->dense ? 0 : (int64_t)c->n_expert * per;
  if (i >= n_exp) { /* the fixed FFN's down rows over all T tokens, weight 1 */
    const int64_t r0 = (i - n_exp) * R, r1 = min64(d, r0 + R);
    if (L->fq_a) st_matmul_q8(L->fdown_d.type, L->fdown, L->fdown_d.row_bytes, r0, r1, p->afq, p->T, L->fixed_ff, p->eoutf + r0, d);
    else st_matmul(L->fdown_d.type, L->fdown, L->fdown_d.row_bytes, r0, r1, p->actf, L->fixed_ff, p->T, L->fixed_ff, p->eoutf + r0, d);
    return;
  }
  const int e = p->eorder[i / per];
  const int row0 = p->grp[e], n = p->grp[e + 1] - row0;
  if (n == 0) return;
  const int64_t r0 = (i % per) * R, r1 = min64(d, r0 + R);
  const struct ffn_layout f = ffn_layout(c, L);
  const void *dw = expert_mat(c, l, e, 2);
  float *out = p->eout + (size_t)row0 * d + r0;
  if (f.qa) st_matmul_q8(L->down_d.type, dw, L->down_d.row_bytes, r0, r1, p->aq + (size_t)row0 * f.qa, n, ff, out, d);
  else st_matmul(L->down_d.type, dw, L->down_d.row_bytes, r0, r1, p->act + (size_t)row0 * ff, ff, n, ff, out, d);
  const float *db = L->down_b ? L->down_b + (size_t)e * d + r0 : NULL;
  for (int r = 0; r < n; r++) {
    const float w = p->row_w[row0 + r];
    if (db)
      for (int64_t j = 0; j < r1 - r0; j++) out[(size_t)r * d + j] += db[j];
    for (int64_t j = 0; j < r1 - r0; j++) out[(size_t)r * d + j] *= w;
  }
}

/* x = h + the token's expert rows added in slot order, then the next layer's norm (or the
 * output norm) into xn. */
static void item_combine(const struct st_prompt_ctx *p, int l, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const struct st_decode_layer *L = &c->layers[l];
  const int d = c->n_embd, k = L->dense ? 0 : c->k;
  const float *norm = l + 1 < c->n_layer ? c->layers[l + 1].attn_norm : c->output_norm;
  int t0, t1;
  tile_of(p, i, &t0, &t1);
  for (int t = t0; t < t1; t++) {
    float *x = p->x + (size_t)t * d;
    const float *h = p->h + (size_t)t * d, *fx = L->fixed_ff ? p->eoutf + (size_t)t * d : NULL;
    for (int j = 0; j < d; j++) {
      float acc = 0.0f;
      for (int s = 0; s < k; s++) acc += p->eout[(size_t)p->row_of[t * c->k + s] * d + j];
      if (fx) acc = k ? acc + fx[j] : fx[j];
      x[j] = acc + h[j];
    }
    st_rmsnorm(x, norm, p->xn + (size_t)t * d, d, c->eps);
  }
  quantize_xn(p, l + 1, t0, t1);
}

static void item_head(const struct st_prompt_ctx *p, int64_t i) {
  const struct st_decode_ctx *c = p->dc;
  const int64_t r0 = i * p->rows_head, r1 = min64(c->n_vocab, r0 + p->rows_head);
  const int terms = st_lane_xn_terms(c, c->n_layer, &c->output_d, ST_DENSE_HEAD);
  const uint64_t rb = st_q8_row_bytes(c->output_d.type, c->n_embd) * (uint64_t)p->out_row0;
  st_dense_rows(terms, c->output_d.type, c->output, c->output_d.row_bytes, r0, r1, p->xn + (size_t)p->out_row0 * c->n_embd,
                c->n_embd, p->xnq + rb, p->xnr + rb, p->n_out, c->n_embd, p->logits + r0, c->n_vocab);
}

static void run_item(const struct st_prompt_ctx *p, int kind, int l, int64_t i) {
  switch (kind) {
  case ST_PP_NORM: item_norm(p, i); break;
  case ST_PP_QKV: item_qkv(p, l, i); break;
  case ST_PP_ROPE: item_rope(p, l, i); break;
  case ST_PP_ATTN: item_attn(p, l, i); break;
  case ST_PP_QATTN: item_qattn(p, l, i); break;
  case ST_PP_MLANORM: item_mla_norm(p, l, i); break;
  case ST_PP_QB: item_qb(p, l, i); break;
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
    const int moe = !Ly->dense, fixed = Ly->fixed_ff > 0;
    PHASE(ST_PP_QKV, l, c->mla ? mla_qkv_items(p) : (int64_t)(c->n_head + 2 * c->n_head_kv) * hd / p->rows_qkv);
    PHASE(ST_PP_MLANORM, l, c->mla ? tiles : 0);
    PHASE(ST_PP_QB, l, c->mla && c->q_lora ? div_up64((int64_t)c->n_head * mla_qk(c), p->rows_qkv) : 0);
    PHASE(ST_PP_ROPE, l, c->mla ? c->n_head : c->n_head + c->n_head_kv);
    PHASE(ST_PP_ATTN, l, (int64_t)c->n_head_kv * div_up64(T, p->tile_attn));
    PHASE(ST_PP_QATTN, l, st_lane_o_terms(c, l) ? tiles : 0);
    PHASE(ST_PP_OPROJ, l, div_up64(c->n_embd, p->rows_o));
    PHASE(ST_PP_ROUTE, l, tiles);
    PHASE(ST_PP_SORT, l, moe);
    PHASE(ST_PP_QX, l, moe ? tiles : 0);
    PHASE(ST_PP_GATEUP, l, (moe ? (int64_t)E * div_up64(c->n_ff, p->rows_gateup) : 0) + (fixed ? div_up64(Ly->fixed_ff, p->rows_gateup) : 0));
    PHASE(ST_PP_QA, l, moe && f.qa && !qa_in_gateup(p, &f, Ly) ? div_up64((int64_t)T * c->k, p->rows_qa) : 0);
    PHASE(ST_PP_DOWN, l, (moe ? (int64_t)E : 0) * div_up64(c->n_embd, p->rows_down) + (fixed ? div_up64(c->n_embd, p->rows_down) : 0));
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
