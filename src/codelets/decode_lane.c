/* The decode lanes (decode.h): a group of CPU tasks, one per CPU worker, that share a sequence of
 * work items through two counters. A lane claims the next item (compare-and-swap while it is below
 * the lane's bound), waits until every item of the previous phases is done (items of phase p
 * start only once `done` reaches the phase's first index: since items are claimed in order, the
 * earlier ones were all claimed by running lanes, so the wait always ends), runs it and counts it
 * done. A lane may help with earlier layers' items (its bound is the end of its own layer), so a
 * lane that starts early never waits on work nobody has claimed, whatever order the scheduler
 * runs the tasks in. Each output element is computed by one item with fixed arithmetic (the
 * kernels of dot.h and layer_cpu.h, as the prompt-path codelets use them), so a decode step gives
 * the same bits as the prompt path on one token and does not depend on the number of lanes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codelets/decode.h"
#include "codelets/dot.h"
#include "codelets/layer_cpu.h"
#include "codelets/quant.h"
#include "common.h"
#include "io/model.h"

static int64_t div_up64(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* What an item needs beyond the context: the layer's routing and FFN input (CPU-only: the
 * context's; GPU layers: the mailbox), and the slots the CPU pool computes. */
struct lane_state {
  const struct st_decode_ctx *c;
  struct st_lane_sync *sync;
  const struct st_route *route; /* the layer's k entries */
  const float *ffn_in;
  int slots[64];                /* the layer's CPU-pool slots (top-k positions), in slot order */
  int n_slots;
  const uint8_t *xq_gate, *xq_up; /* quantised ffn_in, or NULL (float32 activations) */
  float *eout;                  /* [k][n_embd]: the slots' weighted expert rows */
  float *scratch;
};

static const void *expert_mat(const struct st_decode_ctx *c, int layer, int e, int which) {
  return c->expert_src[((size_t)layer * c->n_expert + (size_t)e) * 3 + which];
}

static uint64_t aq_row_bytes(const struct st_decode_ctx *c, const struct st_decode_layer *L) {
  return c->int8_dot ? st_q8_row_bytes(L->down_d.type, c->n_ff) : 0;
}

/* Whether each gate/up item quantises its own rows of act for down (blocks of 32, as many whole
 * blocks as the item has rows), so that no QA phase is needed: the same bytes, one barrier less. */
static int qa_in_gateup(const struct st_decode_ctx *c, const struct st_decode_layer *L) {
  return aq_row_bytes(c, L) && c->rows_gateup % 32 == 0 && st_q8_row_bytes(L->down_d.type, 32) > 0;
}

/* Rows [r0, r1) of W (desc w) times the row x [n], into out[0 .. r1 - r0). */
static void rows(const struct st_wdesc *w, const void *W, int64_t r0, int64_t r1, const float *x, float *out) {
  st_matmul(w->type, W, w->row_bytes, r0, r1, x, w->n, 1, w->n, out, r1 - r0);
}

/* Whether MLA's query matrix W takes q8_0 activations (st_dense_q8); the GQA and head products
 * follow st_lane_xn_terms, the output projection st_lane_o_terms (st_dense_terms). */
static int dense_q8(const struct st_decode_ctx *c, const struct st_wdesc *w) { return st_dense_q8(w->type, w->n, c->int8_dot); }

uint32_t st_lane_xn_act(const struct st_decode_ctx *c, int l, int *two) {
  const int64_t d = c->n_embd;
  *two = 0;
  if (l >= c->n_layer) {
    const int head = ST_DENSE_HEAD;
    return st_dense_act(1, &c->output_d.type, &head, d, c->int8_dot, two);
  }
  const struct st_decode_layer *L = &c->layers[l];
  if (c->mla) return dense_q8(c, st_q_in(L)) ? ST_TYPE_Q8_0 : ST_TYPE_COUNT;
  const uint32_t types[3] = {L->wq_d.type, L->wk_d.type, L->wv_d.type};
  const int kinds[3] = {ST_DENSE_QO, ST_DENSE_KV, ST_DENSE_KV};
  return st_dense_act(3, types, kinds, d, c->int8_dot, two);
}

int st_lane_xn_terms(const struct st_decode_ctx *c, int l, const struct st_wdesc *w, int kind) {
  int two;
  return st_dense_terms_on(st_lane_xn_act(c, l, &two), w->type, c->n_embd, c->int8_dot, kind);
}

/* xn quantised for layer l's products (the head's at l == n_layer) as st_lane_xn_act says (after
 * each norm into xn). */
static void quantize_xn(const struct st_decode_ctx *c, int l) {
  int two;
  const uint32_t act = st_lane_xn_act(c, l, &two);
  if (act == ST_TYPE_COUNT) return;
  st_quantize_act(act, c->xn, c->n_embd, 1, c->n_embd, c->xnq);
  if (two) st_quantize_act_residual(act, c->xn, c->n_embd, 1, c->n_embd, c->xnq, c->xnr);
}

int st_lane_o_terms(const struct st_decode_ctx *c, int l) {
  const struct st_wdesc *w = &c->layers[l].wo_d;
  return st_dense_terms(w->type, w->n, c->int8_dot, ST_DENSE_QO);
}

/* ---- the items ---------------------------------------------------------------------------- */

/* Adds bias[0 .. n) to v (a NULL bias adds nothing). */
static void add_bias(float *v, const float *bias, int64_t n) {
  if (bias)
    for (int64_t i = 0; i < n; i++) v[i] += bias[i];
}

/* One matrix of the QKV phase: its rows go to out, their bias with them. */
struct proj {
  const struct st_wdesc *d;
  const void *w;
  float *out;
  const float *bias;
  int64_t rows;
  int q8; /* 1: takes xnq; 2: xnq and xnr (st_lane_xn_terms; MLA's q: st_dense_q8) */
};

/* The QKV phase's matrices of layer l (returns how many): GQA wq, wk, wv; MLA q_a (or wq), kv_a_mqa. */
static int qkv_projs(const struct st_decode_ctx *c, const struct st_decode_layer *L, struct proj *p) {
  if (c->mla) {
    int n = 0;
    if (c->q_lora) p[n++] = (struct proj){&L->wq_a_d, L->wq_a, c->qa, NULL, c->q_lora, dense_q8(c, &L->wq_a_d)};
    else p[n++] = (struct proj){&L->wq_d, L->wq, c->q, NULL, (int64_t)c->n_head * (c->qk_nope + c->rope.n_rot), dense_q8(c, &L->wq_d)};
    p[n++] = (struct proj){&L->wkv_a_d, L->wkv_a, c->kvnew, NULL, c->head_dim, 0};
    return n;
  }
  const int64_t qrows = (int64_t)c->n_head * c->head_dim, kvrows = (int64_t)c->n_head_kv * c->head_dim;
  const int l = (int)(L - c->layers);
  p[0] = (struct proj){&L->wq_d, L->wq, c->q, L->bq, qrows, st_lane_xn_terms(c, l, &L->wq_d, ST_DENSE_QO)};
  /* the new K and V rows in float32 (kvnew [2][G][hd]); item_rope stores them in the cache */
  p[1] = (struct proj){&L->wk_d, L->wk, c->kvnew, L->bk, kvrows, st_lane_xn_terms(c, l, &L->wk_d, ST_DENSE_KV)};
  p[2] = (struct proj){&L->wv_d, L->wv, c->kvnew + kvrows, L->bv, kvrows, st_lane_xn_terms(c, l, &L->wv_d, ST_DENSE_KV)};
  return 3;
}

static int64_t qkv_items(const struct st_decode_ctx *c, const struct st_decode_layer *L) {
  struct proj p[3];
  int64_t n = 0;
  for (int i = 0, np = qkv_projs(c, L, p); i < np; i++) n += div_up64(p[i].rows, c->rows_qkv);
  return n;
}

static void item_qkv(struct lane_state *s, int l, int64_t i) {
  const struct st_decode_ctx *c = s->c;
  const struct st_decode_layer *L = &c->layers[l];
  const int R = c->rows_qkv;
  struct proj p[3];
  const int np = qkv_projs(c, L, p);
  int j = 0;
  for (; j < np - 1 && i >= div_up64(p[j].rows, R); j++) i -= div_up64(p[j].rows, R);
  const int64_t r0 = i * R, r1 = r0 + R < p[j].rows ? r0 + R : p[j].rows;
  st_dense_rows(p[j].q8, p[j].d->type, p[j].w, p[j].d->row_bytes, r0, r1, c->xn, p[j].d->n, c->xnq, c->xnr, 1, p[j].d->n,
                p[j].out + r0, r1 - r0);
  add_bias(p[j].out + r0, p[j].bias ? p[j].bias + r0 : NULL, r1 - r0);
}

/* Layer l's K and V planes of KV head g (V: NULL with one plane). */
static uint8_t *kv_plane(const struct st_decode_ctx *c, const struct st_decode_layer *L, int g, int v) {
  const uint64_t rb = st_kv_row_bytes(c->kv_type, c->head_dim);
  return (uint8_t *)L->kv + ((size_t)g * c->kv_planes + (size_t)v) * (size_t)L->kv_rows * rb;
}

/* MLA: the q LoRA's norm; the latent normed and the key part roped, cached as the token's row. */
static void item_mla_norm(struct lane_state *s, int l) {
  const struct st_decode_ctx *c = s->c;
  const struct st_decode_layer *L = &c->layers[l];
  if (c->q_lora) st_rmsnorm(c->qa, L->q_a_norm, c->qa, c->q_lora, c->eps);
  if (c->q_lora && dense_q8(c, &L->wq_b_d)) st_quantize_act(ST_TYPE_Q8_0, c->qa, c->q_lora, 1, c->q_lora, c->qaq);
  float *kv = c->kvnew;
  st_rmsnorm(kv, L->kv_a_norm, kv, c->kv_lora, c->eps);
  st_rope_conf_apply(kv + c->kv_lora, &c->rope, c->rope_cs);
  const uint64_t rb = st_kv_row_bytes(c->kv_type, c->head_dim);
  st_kv_store(c->kv_type, kv, kv_plane(c, L, 0, 0) + (size_t)(c->pos % L->kv_rows) * rb, c->head_dim, c->head_dim);
}

/* MLA: rows of q_b over the normed q LoRA output. */
static void item_qb(struct lane_state *s, int l, int64_t i) {
  const struct st_decode_ctx *c = s->c;
  const struct st_decode_layer *L = &c->layers[l];
  const int64_t n = (int64_t)c->n_head * (c->qk_nope + c->rope.n_rot), r0 = i * c->rows_qkv;
  const int64_t r1 = r0 + c->rows_qkv < n ? r0 + c->rows_qkv : n;
  if (dense_q8(c, &L->wq_b_d)) st_matmul_q8(L->wq_b_d.type, L->wq_b, L->wq_b_d.row_bytes, r0, r1, c->qaq, 1, c->q_lora, c->q + r0, r1 - r0);
  else rows(&L->wq_b_d, L->wq_b, r0, r1, c->qa, c->q + r0);
}

/* MLA, head h: its query's rope part roped, its no-rope part absorbed by k_b into the latent's
 * space: qm[h] = [k_b[h] q_nope, q_pe], a query against the cached rows. */
static void mla_query(const struct st_decode_ctx *c, const struct st_decode_layer *L, int h) {
  const int qk = c->qk_nope + c->rope.n_rot;
  float *qh = c->q + (size_t)h * qk, *qm = c->qm + (size_t)h * c->head_dim;
  st_rope_conf_apply(qh + c->qk_nope, &c->rope, c->rope_cs);
  st_matmul(L->wk_b_d.type, L->wk_b, L->wk_b_d.row_bytes, (int64_t)h * c->kv_lora, (int64_t)(h + 1) * c->kv_lora, qh,
            c->qk_nope, 1, c->qk_nope, qm, c->kv_lora);
  memcpy(qm + c->kv_lora, qh + c->qk_nope, sizeof(float) * (size_t)c->rope.n_rot);
}

static void item_rope(struct lane_state *s, int l, int64_t i) {
  const struct st_decode_ctx *c = s->c;
  const struct st_decode_layer *L = &c->layers[l];
  const int hd = c->head_dim;
  if (c->mla) {
    mla_query(c, L, (int)i);
    return;
  }
  const float *cs = c->rope_cs; /* made once a token by the EMBNORM item (a table took about 5 us) */
  if (i < c->n_head) {
    float *qh = c->q + (size_t)i * hd;
    if (L->q_norm) st_rmsnorm(qh, L->q_norm, qh, hd, c->eps);
    st_rope_conf_apply(qh, &c->rope, cs);
    return;
  }
  const int g = (int)i - c->n_head;
  const uint64_t rb = st_kv_row_bytes(c->kv_type, hd);
  float *kt = c->kvnew + (size_t)g * hd;
  if (L->k_norm) st_rmsnorm(kt, L->k_norm, kt, hd, c->eps);
  st_rope_conf_apply(kt, &c->rope, cs);
  const size_t row = (size_t)(c->pos % L->kv_rows);
  st_kv_store(c->kv_type, kt, kv_plane(c, L, g, 0) + row * rb, hd, hd);
  st_kv_store(c->kv_type, c->kvnew + (size_t)(c->n_head_kv + g) * hd, kv_plane(c, L, g, 1) + row * rb, hd, hd);
}

static void item_attn(struct lane_state *s, int l, int64_t h) {
  const struct st_decode_ctx *c = s->c;
  const struct st_decode_layer *L = &c->layers[l];
  const int hd = c->head_dim, g = (int)h / (c->n_head / c->n_head_kv);
  struct st_attn_conf ac = c->attn_conf;
  ac.sinks = L->sinks ? L->sinks + h : NULL;
  ac.window = L->swa ? c->attn_conf.window : 0;
  ac.ring = L->kv_rows;
  const uint8_t *kc = kv_plane(c, L, g, 0);
  if (!c->mla) {
    st_attend_tokens_conf(c->q + (size_t)h * hd, 1, 1, hd, c->pos, c->kv_type, kc, kv_plane(c, L, g, 1),
                          c->attn + (size_t)h * hd, s->scratch, c->pos + 1, &ac);
    return;
  }
  /* MLA: the latent's weighted sum (V = the first kv_lora values of each cached row), then v_b */
  float *olat = s->scratch + c->n_ctx + 16;
  st_attend_tokens_conf(c->qm + (size_t)h * hd, 1, 1, hd, c->pos, c->kv_type, kc, kc, olat, s->scratch, c->pos + 1, &ac);
  const int hv = c->head_dim_v;
  st_matmul(L->wv_b_d.type, L->wv_b, L->wv_b_d.row_bytes, (int64_t)h * hv, (int64_t)(h + 1) * hv, olat, c->kv_lora, 1,
            c->kv_lora, c->attn + (size_t)h * hv, hv);
}

static void item_resnorm(struct lane_state *s, int l) {
  const struct st_decode_ctx *c = s->c;
  st_rmsnorm(c->h, c->layers[l].ffn_norm, c->ffn_in, c->n_embd, c->eps);
}

/* Softmax and top-k of the layer's router logits; a non-finite choice is recorded (the host
 * reports it after the step) and replaced by expert 0 so that later items stay in bounds. */
static void item_topk(struct lane_state *s, int l) {
  const struct st_decode_ctx *c = s->c;
  struct st_route *r = c->route + (size_t)l * c->k;
  st_route_gated(c->rlogits, c->n_expert, c->k, c->gating, c->layers[l].probs_b, c->n_group, c->n_group_used, c->w_norm,
                 c->w_scale, r);
  for (int j = 0; j < c->k; j++)
    if (r[j].expert < 0 || r[j].expert >= c->n_expert || !(r[j].weight == r[j].weight)) {
      if (!__atomic_exchange_n(&s->sync->error, 1, __ATOMIC_RELAXED)) s->sync->error_layer = l;
      if (r[j].expert < 0 || r[j].expert >= c->n_expert) r[j].expert = 0;
    }
}

/* ffn_in quantised for gate (and for up when its layout differs), as expert_rows_cpu does; and
 * for the fixed FFN (st_fixed_q8). */
static void item_qx(struct lane_state *s, int l) {
  const struct st_decode_ctx *c = s->c;
  const struct st_decode_layer *L = &c->layers[l];
  if (L->fq_x) st_quantize_act(L->fgate_d.type, s->ffn_in, c->n_embd, 1, c->n_embd, c->xfq);
  if (L->dense) return;
  const uint64_t qg = st_q8_row_bytes(L->gate_d.type, c->n_embd), qu = st_q8_row_bytes(L->up_d.type, c->n_embd);
  if (qg) st_quantize_act(L->gate_d.type, s->ffn_in, c->n_embd, 1, c->n_embd, c->xq);
  if (qu && qu != qg) st_quantize_act(L->up_d.type, s->ffn_in, c->n_embd, 1, c->n_embd, c->xq + qg);
}

/* The layer's quantised FFN inputs (what item_qx wrote), or NULL for float32 activations. */
static void lane_xq(struct lane_state *s, const struct st_decode_layer *L) {
  const struct st_decode_ctx *c = s->c;
  const uint64_t qg = c->int8_dot ? st_q8_row_bytes(L->gate_d.type, c->n_embd) : 0;
  const uint64_t qu = c->int8_dot ? st_q8_row_bytes(L->up_d.type, c->n_embd) : 0;
  s->xq_gate = qg ? c->xq : NULL;
  s->xq_up = qu ? (qu == qg ? c->xq : c->xq + qg) : NULL;
}

/* act = the FFN's activation of gate and up rows f0 .. f0 + n (gate in g, up in u; both get the
 * expert's biases first when it has them). */
static void ffn_act(const struct st_decode_ctx *c, float *g, float *u, const float *gb, const float *ub, int64_t n,
                    float *act) {
  add_bias(g, gb, n);
  add_bias(u, ub, n);
  if (c->ffn_act == ST_ACT_SWIGLU_OAI) st_swiglu_oai(g, u, act, n);
  else
    for (int64_t f = 0; f < n; f++) act[f] = g[f] / (1.0f + expf(-g[f])) * u[f];
}

/* The fixed FFN's item (slot k): rows f0 .. of its gate and up, float32 activations. */
static void fixed_gateup(struct lane_state *s, const struct st_decode_layer *L, int64_t f0) {
  const struct st_decode_ctx *c = s->c;
  const int64_t f1 = f0 + c->rows_gateup < L->fixed_ff ? f0 + c->rows_gateup : L->fixed_ff, d = c->n_embd;
  float *g = s->scratch, *u = g + c->rows_gateup, *act = c->act + (size_t)c->k * c->n_ff_max + f0;
  if (L->fq_x) {
    st_matmul_q8(L->fgate_d.type, L->fgate, L->fgate_d.row_bytes, f0, f1, c->xfq, 1, d, g, f1 - f0);
    st_matmul_q8(L->fup_d.type, L->fup, L->fup_d.row_bytes, f0, f1, c->xfq, 1, d, u, f1 - f0);
  } else {
    st_matmul(L->fgate_d.type, L->fgate, L->fgate_d.row_bytes, f0, f1, s->ffn_in, d, 1, d, g, f1 - f0);
    st_matmul(L->fup_d.type, L->fup, L->fup_d.row_bytes, f0, f1, s->ffn_in, d, 1, d, u, f1 - f0);
  }
  ffn_act(c, g, u, NULL, NULL, f1 - f0, act);
  if (L->fq_a) st_quantize_act(L->fdown_d.type, act, f1 - f0, 1, f1 - f0, c->afq + st_q8_row_bytes(L->fdown_d.type, f0));
}

static void item_gateup(struct lane_state *s, int l, int64_t i) {
  const struct st_decode_ctx *c = s->c;
  const struct st_decode_layer *L = &c->layers[l];
  const int R = c->rows_gateup, per = (int)div_up64(c->n_ff, R);
  if (i >= (int64_t)s->n_slots * per) {
    fixed_gateup(s, L, (i - (int64_t)s->n_slots * per) * R);
    return;
  }
  const int slot = s->slots[i / per];
  const int64_t f0 = (i % per) * R, f1 = f0 + R < c->n_ff ? f0 + R : c->n_ff;
  const int e = s->route[slot].expert, d = c->n_embd;
  float *g = s->scratch, *u = g + R;
  const void *gw = expert_mat(c, l, e, 0), *uw = expert_mat(c, l, e, 1);
  if (s->xq_gate) st_matmul_q8(L->gate_d.type, gw, L->gate_d.row_bytes, f0, f1, s->xq_gate, 1, d, g, f1 - f0);
  else st_matmul(L->gate_d.type, gw, L->gate_d.row_bytes, f0, f1, s->ffn_in, d, 1, d, g, f1 - f0);
  if (s->xq_up) st_matmul_q8(L->up_d.type, uw, L->up_d.row_bytes, f0, f1, s->xq_up, 1, d, u, f1 - f0);
  else st_matmul(L->up_d.type, uw, L->up_d.row_bytes, f0, f1, s->ffn_in, d, 1, d, u, f1 - f0);
  float *act = c->act + (size_t)slot * c->n_ff_max + f0;
  ffn_act(c, g, u, L->gate_b ? L->gate_b + (size_t)e * c->n_ff + f0 : NULL, L->up_b ? L->up_b + (size_t)e * c->n_ff + f0 : NULL,
          f1 - f0, act);
  if (qa_in_gateup(c, L))
    st_quantize_act(L->down_d.type, act, f1 - f0, 1, f1 - f0,
                    c->aq + (size_t)slot * aq_row_bytes(c, L) + st_q8_row_bytes(L->down_d.type, f0));
}

static void item_qa(struct lane_state *s, int l, int64_t i) {
  const struct st_decode_ctx *c = s->c;
  const struct st_decode_layer *L = &c->layers[l];
  const int slot = s->slots[i];
  st_quantize_act(L->down_d.type, c->act + (size_t)slot * c->n_ff_max, c->n_ff, 1, c->n_ff,
                  c->aq + (size_t)slot * aq_row_bytes(c, L));
}

static void item_down(struct lane_state *s, int l, int64_t i) {
  const struct st_decode_ctx *c = s->c;
  const struct st_decode_layer *L = &c->layers[l];
  const int R = c->rows_down, per = (int)div_up64(c->n_embd, R), ff = c->n_ff;
  const int fixed = i >= (int64_t)s->n_slots * per; /* the fixed FFN's rows, weight 1 */
  const int slot = fixed ? c->k : s->slots[i / per];
  const int64_t r0 = (i % per) * R, r1 = r0 + R < c->n_embd ? r0 + R : c->n_embd;
  float *out = s->eout + (size_t)slot * c->n_embd + r0;
  if (fixed) {
    if (L->fq_a) st_matmul_q8(L->fdown_d.type, L->fdown, L->fdown_d.row_bytes, r0, r1, c->afq, 1, L->fixed_ff, out, r1 - r0);
    else rows(&L->fdown_d, L->fdown, r0, r1, c->act + (size_t)c->k * c->n_ff_max, out);
    return;
  }
  const int e = s->route[slot].expert;
  const void *dw = expert_mat(c, l, e, 2);
  const uint64_t qa = aq_row_bytes(c, L);
  if (qa) st_matmul_q8(L->down_d.type, dw, L->down_d.row_bytes, r0, r1, c->aq + (size_t)slot * qa, 1, ff, out, r1 - r0);
  else st_matmul(L->down_d.type, dw, L->down_d.row_bytes, r0, r1, c->act + (size_t)slot * c->n_ff_max, ff, 1, ff, out, r1 - r0);
  add_bias(out, L->down_b ? L->down_b + (size_t)e * c->n_embd + r0 : NULL, r1 - r0);
  const float w = s->route[slot].weight;
  for (int64_t r = 0; r < r1 - r0; r++) out[r] *= w;
}

/* Rows of x = h + the slots' rows added in slot order (as combine_cpu), then the fixed FFN's row
 * (the shared expert's after the routed ones, as llama.cpp adds it). */
static void item_combine(struct lane_state *s, int l, int64_t i) {
  const struct st_decode_ctx *c = s->c;
  const struct st_decode_layer *L = &c->layers[l];
  const int d = c->n_embd, k = L->dense ? 0 : c->k;
  const int64_t r0 = i * c->rows_combine, r1 = r0 + c->rows_combine < d ? r0 + c->rows_combine : d;
  const float *fx = L->fixed_ff ? c->eout + (size_t)c->k * d : NULL;
  for (int64_t r = r0; r < r1; r++) {
    float acc = 0.0f;
    for (int j = 0; j < k; j++) acc += c->eout[(size_t)j * d + r];
    if (fx) acc = k ? acc + fx[r] : fx[r];
    c->x[r] = acc + c->h[r];
  }
}

/* The next norm of x into xn, quantised for the next layer's products. */
static void item_norm(struct lane_state *s, int l) {
  const struct st_decode_ctx *c = s->c;
  const int d = c->n_embd;
  const float *norm = l + 1 < c->n_layer ? c->layers[l + 1].attn_norm : c->output_norm;
  st_rmsnorm(c->x, norm, c->xn, d, c->eps);
  quantize_xn(c, l + 1);
}

/* Whether layer L's ffn_in is quantised for gate and up (or the fixed FFN: st_fixed_q8). */
static int layer_qx(const struct st_decode_ctx *c, const struct st_decode_layer *L) {
  const int int8_x = !L->dense && c->int8_dot &&
                     (st_q8_row_bytes(L->gate_d.type, c->n_embd) || st_q8_row_bytes(L->up_d.type, c->n_embd));
  return int8_x || L->fq_x;
}

/* Whether the CPU-only plan's TOPK item also quantises ffn_in (QX's work; a router layer). */
static int topk_qx(const struct st_decode_ctx *c, const struct st_decode_layer *L) { return !L->dense && layer_qx(c, L); }

static void run_item(struct lane_state *s, int kind, int l, int64_t i) {
  const struct st_decode_ctx *c = s->c;
  const struct st_decode_layer *L = l < c->n_layer ? &c->layers[l] : NULL;
  switch (kind) {
  case ST_LP_EMBNORM:
    st_rope_conf_table(c->rope_cs, &c->rope, c->pos);
    st_rmsnorm(c->x, c->layers[0].attn_norm, c->xn, c->n_embd, c->eps);
    quantize_xn(c, 0);
    break;
  case ST_LP_QKV: item_qkv(s, l, i); break;
  case ST_LP_MLANORM: item_mla_norm(s, l); break;
  case ST_LP_QB: item_qb(s, l, i); break;
  case ST_LP_ROPE: item_rope(s, l, i); break;
  case ST_LP_ATTN: item_attn(s, l, i); break;
  case ST_LP_QATTN:
    st_quantize_act(L->wo_d.type, c->attn, L->wo_d.n, 1, L->wo_d.n, c->attnq);
    if (st_lane_o_terms(c, l) == 2) st_quantize_act_residual(L->wo_d.type, c->attn, L->wo_d.n, 1, L->wo_d.n, c->attnq, c->attnr);
    break;
  case ST_LP_OPROJ: {
    const int64_t r0 = i * c->rows_o, r1 = r0 + c->rows_o < c->n_embd ? r0 + c->rows_o : c->n_embd;
    st_dense_rows(st_lane_o_terms(c, l), L->wo_d.type, L->wo, L->wo_d.row_bytes, r0, r1, c->attn, L->wo_d.n, c->attnq, c->attnr, 1,
                  L->wo_d.n, c->xo + r0, r1 - r0);
    add_bias(c->xo + r0, L->bo ? L->bo + r0 : NULL, r1 - r0);
    for (int64_t r = r0; r < r1; r++) c->h[r] = c->x[r] + c->xo[r];
    break;
  }
  case ST_LP_RESNORM: item_resnorm(s, l); break;
  case ST_LP_RLOGITS: {
    const int64_t r0 = i * c->rows_router, r1 = r0 + c->rows_router < c->n_expert ? r0 + c->rows_router : c->n_expert;
    rows(&L->router_d, L->router, r0, r1, c->ffn_in, c->rlogits + r0);
    add_bias(c->rlogits + r0, L->router_b ? L->router_b + r0 : NULL, r1 - r0);
    break;
  }
  case ST_LP_TOPK:
    item_topk(s, l);
    if (topk_qx(c, L)) item_qx(s, l);
    break;
  case ST_LP_QX: item_qx(s, l); break;
  case ST_LP_GATEUP: item_gateup(s, l, i); break;
  case ST_LP_QA: item_qa(s, l, i); break;
  case ST_LP_DOWN: item_down(s, l, i); break;
  case ST_LP_COMBINE: item_combine(s, l, i); break;
  case ST_LP_NORM: item_norm(s, l); break;
  case ST_LP_HEAD: {
    const int64_t r0 = i * c->rows_head, r1 = r0 + c->rows_head < c->n_vocab ? r0 + c->rows_head : c->n_vocab;
    st_dense_rows(st_lane_xn_terms(c, c->n_layer, &c->output_d, ST_DENSE_HEAD), c->output_d.type, c->output,
                  c->output_d.row_bytes, r0, r1, c->xn, c->n_embd, c->xnq, c->xnr, 1, c->n_embd, c->logits + r0, r1 - r0);
    break;
  }
  default: ST_ASSERT(0 && "unknown lane phase");
  }
}

/* Per-layer set-up before an item of a new layer runs (CPU-only: routing and slots from the
 * context; every slot is the CPU pool's). */
static void enter_layer_cpu(struct lane_state *s, int l) {
  const struct st_decode_ctx *c = s->c;
  s->route = c->route + (size_t)l * c->k;
  s->ffn_in = c->ffn_in;
  s->eout = c->eout;
  s->n_slots = l < c->n_layer && c->layers[l].dense ? 0 : c->k;
  for (int j = 0; j < c->k; j++) s->slots[j] = j;
  if (l < c->n_layer) lane_xq(s, &c->layers[l]);
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The running lane's row of the stats (its StarPU worker). */
static int lane_index(void) {
  const int w = starpu_worker_get_id();
  return w < 0 ? 0 : w;
}

/* Runs items of a plan (n_phases phases, starts[p] .. starts[p + 1], of kind[p] in layer[p])
 * below `bound`. Returns the done count this lane's last item reached (0 if it ran none): the
 * lane that returns the plan's item count finished the last one. */
static int64_t run_plan(struct lane_state *s, const int64_t *starts, const int16_t *kind, const int16_t *layer,
                        int n_phases, int64_t bound, int cpu_only) {
  int p = 0, cur_layer = -1;
  int64_t reached = 0;
  struct st_lane_stats *st = s->c->stats ? &s->c->stats[lane_index()] : NULL;
  struct st_lane_walls *wl = s->c->walls;
  for (int64_t i; (i = st_lane_claim(s->sync, bound)) >= 0;) {
    while (p < n_phases && starts[p + 1] <= i) p++;
    ST_ASSERT(p < n_phases);
    if (cpu_only && layer[p] != cur_layer) {
      cur_layer = layer[p];
      enter_layer_cpu(s, cur_layer);
    }
    const uint64_t t0 = st ? now_ns() : 0;
    if (st && i == 0) __atomic_store_n(&wl->last_ns, t0, __ATOMIC_RELAXED);
    st_lane_wait_at_least(&s->sync->done, starts[p]);
    const uint64_t t1 = st ? now_ns() : 0;
    run_item(s, kind[p], layer[p], i - starts[p]);
    reached = __atomic_add_fetch(&s->sync->done, 1, __ATOMIC_ACQ_REL);
    if (st) {
      const uint64_t t2 = now_ns();
      st->wait_ns[kind[p]] += t1 - t0;
      st->busy_ns[kind[p]] += t2 - t1;
      st->items[kind[p]]++;
      if (reached == starts[p + 1]) { /* this lane finished the phase */
        wl->wall_ns[kind[p]] += t2 - __atomic_load_n(&wl->last_ns, __ATOMIC_RELAXED);
        wl->phases[kind[p]]++;
        __atomic_store_n(&wl->last_ns, t2, __ATOMIC_RELAXED);
      }
    }
  }
  return reached;
}

static float *worker_scratch(const struct st_decode_ctx *c) {
  const int w = starpu_worker_get_id();
  return c->scratch + (size_t)(w < 0 ? 0 : w) * (size_t)c->scratch_floats;
}

void st_mail_wait(const uint32_t *p, uint32_t want, const uint32_t *abort_seq) {
  for (unsigned spins = 0; __atomic_load_n(p, __ATOMIC_ACQUIRE) != want; spins++) {
    if (__atomic_load_n(abort_seq, __ATOMIC_ACQUIRE) == want) return;
    if (spins < (1u << 14)) __builtin_ia32_pause();
    else sched_yield();
  }
}

/* The CPU-pool experts of GPU layer l: once the router kernel has written the layer's routing and
 * FFN input to the mailbox, the slots whose pair the CPU pool owns, then the local plan QX, GATEUP,
 * QA, DOWN over them (every lane computes the same plan from the same input) into the mailbox's
 * rows; the lane that counts the last item done (every lane, when there is none) raises cpu_seq. */
static void lane_experts_layer(const struct st_decode_ctx *c, int l, float *scratch) {
  const struct st_decode_layer *L = &c->layers[l];
  const struct st_decode_mail *m = &c->mail;
  const uint32_t seq = c->seq;
  const uint64_t t0 = c->stats ? now_ns() : 0;
  st_mail_wait(&m->xin_seq[(size_t)l * ST_MAIL_FLAG_STRIDE], seq, m->abort_seq);
  if (c->stats) {
    struct st_lane_stats *st = &c->stats[lane_index()];
    st->wait_ns[ST_LP_KINDS] += now_ns() - t0;
    st->items[ST_LP_KINDS]++;
  }
  if (__atomic_load_n(m->abort_seq, __ATOMIC_ACQUIRE) == seq) return;
  struct lane_state s = {.c = c, .sync = &((struct st_lane_sync *)c->sync)[l], .scratch = scratch};
  const struct st_route *route = m->xroute + (size_t)l * c->k;
  s.route = route;
  s.ffn_in = m->xffn + (size_t)l * c->n_embd;
  s.eout = m->cpu_out + (size_t)l * c->k * c->n_embd;
  for (int j = 0; j < c->k && j < 64; j++) {
    const int e = route[j].expert;
    if (e >= 0 && e < c->n_expert && c->tier[(size_t)l * c->n_expert + e] == 0) s.slots[s.n_slots++] = j;
  }
  lane_xq(&s, L);
  const int64_t n = s.n_slots, per_gu = div_up64(c->n_ff, c->rows_gateup), per_dn = div_up64(c->n_embd, c->rows_down);
  const int int8 = s.xq_gate || s.xq_up;
  const int64_t counts[4] = {n && int8 ? 1 : 0, n * per_gu, aq_row_bytes(c, L) && !qa_in_gateup(c, L) ? n : 0, n * per_dn};
  const int16_t kinds[4] = {ST_LP_QX, ST_LP_GATEUP, ST_LP_QA, ST_LP_DOWN}, layers[4] = {(int16_t)l, (int16_t)l, (int16_t)l, (int16_t)l};
  int64_t starts[5] = {0};
  for (int p = 0; p < 4; p++) starts[p + 1] = starts[p] + counts[p];
  uint32_t *done_flag = &m->cpu_seq[(size_t)l * ST_MAIL_FLAG_STRIDE];
  if (starts[4] == 0) {
    __atomic_store_n(done_flag, seq, __ATOMIC_RELEASE);
    return;
  }
  if (run_plan(&s, starts, kinds, layers, 4, starts[4], 0) == starts[4]) __atomic_store_n(done_flag, seq, __ATOMIC_RELEASE);
}

/* GPU mode: the CPU-pool experts of every layer the pool has a pair of, in layer order. */
static void lane_experts(const struct st_decode_ctx *c) {
  float *scratch = worker_scratch(c);
  for (int l = 0; l < c->n_layer; l++)
    if (c->layer_cpu[l]) lane_experts_layer(c, l, scratch);
}

static void decode_lane_cpu(void *buffers[], void *cl_arg) {
  const struct st_lane_args *a = cl_arg;
  const struct st_decode_ctx *c = a->ctx;
  (void)buffers;
  if (a->kind == ST_LANE_EXPERTS) {
    lane_experts(c);
    return;
  }
  struct lane_state s = {.c = c, .sync = (struct st_lane_sync *)c->sync, .scratch = worker_scratch(c)};
  run_plan(&s, c->phase_start, c->phase_kind, c->phase_layer, c->n_phases, c->layer_end[a->layer], 1);
}

int st_lane_token_plan(struct st_decode_ctx *c) {
  const int L = c->n_layer, per_layer = 16;
  const int P = 1 + per_layer * L + 1;
  c->phase_start = calloc((size_t)P + 1, sizeof *c->phase_start);
  c->phase_kind = calloc((size_t)P, sizeof *c->phase_kind);
  c->phase_layer = calloc((size_t)P, sizeof *c->phase_layer);
  c->layer_end = calloc((size_t)L + 1, sizeof *c->layer_end);
  if (!c->phase_start || !c->phase_kind || !c->phase_layer || !c->layer_end)
    return st_set_error(ST_ENOMEM, "out of memory for the decode plan");
  int p = 0;
  int64_t at = 0;
#define PHASE(kind_, layer_, n_)                                                                        \
  do {                                                                                                  \
    c->phase_kind[p] = (int16_t)(kind_);                                                                \
    c->phase_layer[p] = (int16_t)(layer_);                                                              \
    c->phase_start[p++] = at;                                                                           \
    at += (n_);                                                                                         \
  } while (0)
  PHASE(ST_LP_EMBNORM, 0, 1);
  for (int l = 0; l < L; l++) {
    const struct st_decode_layer *Ly = &c->layers[l];
    const int moe = !Ly->dense, k = moe ? c->k : 0;
    PHASE(ST_LP_QKV, l, qkv_items(c, Ly));
    PHASE(ST_LP_MLANORM, l, c->mla ? 1 : 0);
    PHASE(ST_LP_QB, l, c->mla && c->q_lora ? div_up64((int64_t)c->n_head * (c->qk_nope + c->rope.n_rot), c->rows_qkv) : 0);
    PHASE(ST_LP_ROPE, l, c->mla ? c->n_head : c->n_head + c->n_head_kv);
    PHASE(ST_LP_ATTN, l, c->n_head);
    PHASE(ST_LP_QATTN, l, st_lane_o_terms(c, l) ? 1 : 0);
    PHASE(ST_LP_OPROJ, l, div_up64(c->n_embd, c->rows_o));
    PHASE(ST_LP_RESNORM, l, 1);
    PHASE(ST_LP_RLOGITS, l, moe ? div_up64(c->n_expert, c->rows_router) : 0);
    PHASE(ST_LP_TOPK, l, moe);
    PHASE(ST_LP_QX, l, layer_qx(c, Ly) && !topk_qx(c, Ly) ? 1 : 0);
    PHASE(ST_LP_GATEUP, l, (int64_t)k * div_up64(c->n_ff, c->rows_gateup) + div_up64(Ly->fixed_ff, c->rows_gateup));
    PHASE(ST_LP_QA, l, moe && aq_row_bytes(c, Ly) && !qa_in_gateup(c, Ly) ? c->k : 0);
    PHASE(ST_LP_DOWN, l, (int64_t)(k + (Ly->fixed_ff > 0)) * div_up64(c->n_embd, c->rows_down));
    PHASE(ST_LP_COMBINE, l, div_up64(c->n_embd, c->rows_combine));
    PHASE(ST_LP_NORM, l, 1);
    c->layer_end[l] = at;
  }
  PHASE(ST_LP_HEAD, L, div_up64(c->n_vocab, c->rows_head));
#undef PHASE
  c->phase_start[p] = at;
  c->layer_end[L] = at;
  c->n_phases = p;
  ST_ASSERT(p == P);
  return 0;
}

static struct starpu_codelet decode_lane_cl = {
    .cpu_funcs = {decode_lane_cpu},
    .cpu_funcs_name = {"decode_lane_cpu"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "decode_lane",
};

int st_submit_decode_lane(const struct st_lane_args *a, starpu_data_handle_t *bufs, int nbufs, struct st_target tgt,
                          const char *name) {
  enum starpu_data_access_mode modes[1] = {STARPU_R};
  return st_submit_task(&decode_lane_cl, bufs, modes, nbufs, a, sizeof *a, tgt, name);
}

void st_lane_stats_print(const struct st_decode_ctx *c, int n_lanes, FILE *f) {
  const struct st_lane_walls *wl = c->walls;
  if (!c->stats || !wl || !wl->steps) return;
  static const char *names[ST_LP_KINDS + 1] = {"embnorm", "qkv",     "mlanorm", "qb",   "rope",    "attn",
                                               "qattn",   "oproj",   "resnorm", "rlogits", "topk", "qx",
                                               "gateup",  "qa",      "down",    "combine", "norm",    "head",
                                               "mailwait"};
  const double n = (double)wl->steps;
  const unsigned nw = starpu_worker_get_count();
  fprintf(f, "strata: lane stats (STRATA_LANE_STATS=1), %d lanes, per decode step over %.0f steps:\n", n_lanes, n);
  fprintf(f, "  %-9s %9s %9s %13s %13s %11s\n", "phase", "items", "wall ms", "busy lane-ms", "wait lane-ms", "busy lanes");
  double tw = 0, tb = 0, tt = 0;
  for (int k = 0; k <= ST_LP_KINDS; k++) {
    double busy = 0, wait = 0, items = 0;
    for (unsigned w = 0; w < nw; w++) {
      busy += (double)c->stats[w].busy_ns[k];
      wait += (double)c->stats[w].wait_ns[k];
      items += (double)c->stats[w].items[k];
    }
    const double wall = k < ST_LP_KINDS ? (double)wl->wall_ns[k] : 0.0;
    if (!items) continue;
    tw += wall, tb += busy, tt += wait;
    fprintf(f, "  %-9s %9.1f %9.3f %13.3f %13.3f %11.2f\n", names[k], items / n, wall / n * 1e-6, busy / n * 1e-6,
            wait / n * 1e-6, wall > 0 ? busy / wall : 0.0);
  }
  fprintf(f, "  %-9s %9s %9.3f %13.3f %13.3f %11.2f\n", "total", "", tw / n * 1e-6, tb / n * 1e-6, tt / n * 1e-6,
          tw > 0 ? tb / tw : 0.0);
}
