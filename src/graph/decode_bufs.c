/* The decode step's persistent buffers (graph/decode.h): the host buffers the lanes work in, the
 * primary GPU's buffers its graphs replay over, the mailbox between the two (pinned host memory the
 * GPU maps: a layer's routing and FFN input for the CPU pool, the CPU pool's rows back, the head's
 * logits and the step's routing, their flags; codelets/decode.h), all made and registered once per
 * engine, so that every task of every step sees the same addresses. */
#include <stdlib.h>
#include <string.h>

#include "codelets/dot.h"
#include "codelets/layer_cpu.h"
#include "codelets/quant.h"
#include "common.h"
#include "config.h"
#include "graph/decode.h"
#include "graph/engine.h"
#include "io/arch.h"
#include "tiers/arena.h"
#ifdef ST_HAVE_CUDA
#include "codelets/cuda/cuda_codelets.h"
#endif

#define MAX_SLOTS 64   /* top-k entries a lane handles (decode_lane.c) */
#define MAX_KV_HEADS 32 /* ST_CUDA_MAX_KV_HEADS */

#ifdef ST_HAVE_CUDA
/* Whether the decode step's GPU kernels (cuda/decode.cu) take every matrix of the model. */
static int gpu_layouts_ok(const struct st_engine *e) {
  const struct st_weight *head = &e->model->output;
  if (!st_cuda_mmv_takes(head->type, head->row_bytes, (int64_t)head->ne[0])) return 0;
  for (uint32_t l = 0; l < e->hp.n_layer; l++) {
    const struct st_layer *L = &e->model->layers[l];
    /* (an absent matrix passes: MLA's wk and wv, a dense layer's router and experts) */
    const struct st_weight *w[11] = {&L->wq,        &L->wk,        &L->wv,        &L->wo,   &L->router, &L->gate_exps,
                                     &L->up_exps,   &L->down_exps, &L->wq_a,      &L->wq_b, &L->wkv_a};
    for (int i = 0; i < 11; i++)
      if (!st_cuda_mmv_takes(w[i]->type, w[i]->row_bytes, (int64_t)w[i]->ne[0])) return 0;
  }
  /* the streaming mat-vec takes rows of up to 8 chunks (8192 weights); gate and up share a group
   * of rows while a row is at most 4 chunks (the hidden size at most 4096) */
  const struct st_hparams *hp = &e->hp;
  const uint64_t o_in = (uint64_t)hp->n_head * (hp->attn_kind == ST_ATTN_MLA ? hp->head_dim_v : hp->head_dim);
  return hp->n_embd <= 4096 && o_in <= 8192 && hp->n_ff_exp <= 8192 && hp->q_lora <= 8192;
}
#endif

int st_decode_gpu_arch(const struct st_engine *e, const char **why) {
  const struct st_hparams *hp = &e->hp;
  *why = NULL;
  if (hp->arch == ST_ARCH_QWEN3MOE) return 1;
  if (!st_arch_on_gpu(hp->arch))
    *why = "its GPU kernels are not yet checked against its fixtures on a GPU; STRATA_GPU_ARCHS=NAME runs them";
  else if (hp->n_rot > hp->head_dim || hp->n_rot % 2 || (hp->rope_kind != ST_ROPE_NEOX && hp->attn_kind != ST_ATTN_MLA))
    *why = "a normal-order RoPE on the GPU outside MLA";
  else if (hp->attn_kind == ST_ATTN_MLA && (hp->n_head_kv != 1 || hp->n_swa > 0 || hp->head_dim != hp->kv_lora + hp->n_rot))
    *why = "an MLA layout the GPU kernels do not take (one cached latent row of kv_lora + rope values a token)";
  else if ((hp->gating != ST_GATING_SOFTMAX_WEIGHT && hp->gating != ST_GATING_SIGMOID) || hp->n_expert_used > 32)
    *why = "a routing the GPU kernels do not take";
  else if (hp->n_group > 1 && hp->n_group_used < hp->n_group &&
           (hp->gating != ST_GATING_SIGMOID || hp->n_group > 32 || hp->n_expert % hp->n_group))
    *why = "a group limit the GPU kernels do not take (sigmoid routing, at most 32 equal groups)";
#ifdef ST_HAVE_CUDA
  else if (hp->n_swa > 0 && (int)hp->n_swa > st_cuda_attn_short_keys((int)hp->head_dim, e->kv_type == ST_TYPE_F32 ? 4 : 2))
    *why = "a sliding window longer than the GPU's short-context attention takes";
#endif
  return *why == NULL;
}

int st_decode_supported(const struct st_engine *e, const char **why) {
  const struct st_hparams *hp = &e->hp;
  *why = NULL;
  if (!e->decode_graph) *why = "STRATA_DECODE_GRAPH=0";
  else if (e->placement.cuda0_worker >= 0 && !st_decode_gpu_arch(e, why)) return 0;
  else if (e->placement.n_caches > 1) *why = "helper caches, the peer tier and layer splits keep the per-task decode path";
  else if (hp->n_expert_used > MAX_SLOTS) *why = "more than 64 experts per token";
  else if (hp->n_head_kv > MAX_KV_HEADS || hp->n_head % hp->n_head_kv) *why = "an unusual attention head layout";
#ifdef ST_HAVE_CUDA
  else if (e->placement.cuda0_worker >= 0 && !gpu_layouts_ok(e)) *why = "a weight layout the decode step's GPU kernels do not take";
#endif
  return *why == NULL;
}

/* Places `count` items of `type` at offset `at` of the block at `base` (dst left alone while
 * base is 0: the first pass only counts) and moves `at` on to the next multiple of `align`. */
#define CARVE(base, at, align, dst, type, count)                                               \
  do {                                                                                         \
    if (base) (dst) = (type *)(void *)((uintptr_t)(base) + (at));                              \
    (at) += (sizeof(type) * (size_t)(count) + (align) - 1) & ~(size_t)((align) - 1);           \
  } while (0)

/* The largest power of two <= cap dividing n. */
static int pow2_divisor(int n, int cap) {
  int r = 1;
  while (r * 2 <= cap && n % (r * 2) == 0) r *= 2;
  return r;
}

static struct st_wdesc desc_of(const struct st_weight *w) { return (struct st_wdesc){w->type, w->row_bytes, (int64_t)w->ne[0]}; }

/* Bytes of a quantised activation row of n for the widest layout any layer's `which` matrix needs. */
static uint64_t q8_row_max(const struct st_engine *e, int which, int64_t n) {
  uint64_t most = 0;
  for (uint32_t l = 0; l < e->hp.n_layer; l++) {
    const struct st_layer *L = &e->model->layers[l];
    const struct st_weight *w = which == 0 ? &L->gate_exps : which == 1 ? &L->up_exps : &L->down_exps;
    const uint64_t b = st_q8_row_bytes(w->type, n);
    most = b > most ? b : most;
  }
  return most;
}

static int make_names(struct st_decode *d, const struct st_engine *e) {
  const int L = (int)e->hp.n_layer, lanes = d->n_lanes;
  const size_t n = (size_t)(L + 1) + (size_t)(L + 1) * lanes;
  d->names = malloc(n * 64);
  d->layer_names = malloc(sizeof(char *) * (size_t)(L + 1));
  d->lane_names = malloc(sizeof(char *) * (size_t)(L + 1) * lanes);
  if (!d->names || !d->layer_names || !d->lane_names)
    return st_set_error(ST_ENOMEM, "out of memory for task names");
  char *p = d->names;
  const char *gpu = e->placement.n_caches ? e->placement.cache[0].name : "CUDA0";
  for (int l = 0; l <= L; l++) {
    const int last = l + d->span - 1 < L ? l + d->span - 1 : L - 1; /* GPU mode: l's span, when l starts one */
    if (l < L && d->gpu && last > l) snprintf(p, 64, "decode_layer L%d-%d %.16s", l, last, gpu);
    else if (l < L) snprintf(p, 64, "decode_layer L%d %s", l, gpu);
    else snprintf(p, 64, "output_head %s", gpu);
    d->layer_names[l] = p;
    p += 64;
    for (int i = 0; i < lanes; i++) {
      if (d->gpu) snprintf(p, 64, "expert_rows CPU lane %d", i); /* once per token, l == L */
      else if (l < L) snprintf(p, 64, "decode_lane L%d lane %d", l, i);
      else if (e->lane_token) snprintf(p, 64, "decode_lane token lane %d", i); /* every layer and the head */
      else snprintf(p, 64, "decode_lane head lane %d", i);
      d->lane_names[(size_t)l * lanes + i] = p;
      p += 64;
    }
  }
  return 0;
}

/* Carves the host block: each array 64-byte aligned; with base NULL only counts. */
static size_t carve_host(struct st_decode *d, const struct st_engine *e, uint8_t *base) {
  const struct st_hparams *hp = &e->hp;
  struct st_decode_ctx *c = &d->ctx;
  const size_t dm = hp->n_embd, k = hp->n_expert_used, ff = hp->n_ff_exp;
  /* q and attn: GQA n_head x head_dim; MLA n_head x (qk_nope + n_rot) and n_head x head_dim_v */
  const size_t qw_q = (size_t)hp->n_head * (hp->attn_kind == ST_ATTN_MLA ? hp->qk_nope + hp->n_rot : hp->head_dim);
  const size_t qw_o = (size_t)hp->n_head * hp->head_dim_v;
  const size_t qw = qw_q > qw_o ? qw_q : qw_o;
  size_t at = 0;
#define TAKE(dst, type, count) CARVE(base, at, 64, dst, type, count)
  TAKE(c->x, float, dm);
  TAKE(c->h, float, dm);
  TAKE(c->xn, float, dm);
  TAKE(c->q, float, qw);
  TAKE(c->attn, float, qw);
  TAKE(c->qa, float, hp->q_lora + 1);
  TAKE(c->qaq, uint8_t, st_q8_row_bytes(ST_TYPE_Q8_0, (int64_t)hp->q_lora) + 1);
  TAKE(c->qm, float, (size_t)hp->n_head * hp->head_dim);
  uint64_t fx = 0, fa = 0; /* the fixed FFNs' widest quantised rows */
  for (uint32_t l = 0; l < hp->n_layer && d->layers; l++) {
    fx = d->layers[l].fq_x > fx ? d->layers[l].fq_x : fx;
    fa = d->layers[l].fq_a > fa ? d->layers[l].fq_a : fa;
  }
  TAKE(c->xfq, uint8_t, fx + 1);
  TAKE(c->afq, uint8_t, fa + 1);
  TAKE(c->kvnew, float, 2 * (size_t)hp->n_head_kv * hp->head_dim);
  TAKE(c->rope_cs, float, (size_t)hp->head_dim + 2); /* n_rot <= head_dim (MLA: kv_lora + n_rot) */
  TAKE(c->xo, float, dm);
  TAKE(c->ffn_in, float, dm);
  TAKE(c->rlogits, float, hp->n_expert);
  TAKE(c->act, float, (k + 1) * (size_t)c->n_ff_max);
  TAKE(c->eout, float, (k + 1) * dm);
  TAKE(c->logits, float, d->gpu ? 1 : hp->n_vocab);
  TAKE(c->route, struct st_route, (size_t)hp->n_layer * k);
  TAKE(c->xq, uint8_t, q8_row_max(e, 0, dm) + q8_row_max(e, 1, dm) + 1);
  TAKE(c->aq, uint8_t, k * q8_row_max(e, 2, (int64_t)ff) + 1);
  TAKE(c->xnq, uint8_t, st_q8_row_bytes_max((int64_t)dm) + 1); /* whichever layout st_lane_xn_act picks */
  TAKE(c->xnr, uint8_t, st_q8_row_bytes_max((int64_t)dm) + 1);
  TAKE(c->attnq, uint8_t, st_q8_row_bytes_max((int64_t)qw) + 1);
  TAKE(c->attnr, uint8_t, st_q8_row_bytes_max((int64_t)qw) + 1);
  TAKE(c->scratch, float, (size_t)c->scratch_floats * starpu_worker_get_count());
  TAKE(c->sync, struct st_lane_sync, hp->n_layer + 1);
#undef TAKE
  return at;
}

#ifdef ST_HAVE_CUDA
/* Carves the mailbox at base (host or device addresses of the same memory) into m: flags on their
 * own cache lines, rows 64-byte aligned; with base 0 only counts. */
static size_t carve_mail(const struct st_engine *e, uintptr_t base, struct st_decode_mail *m) {
  const struct st_hparams *hp = &e->hp;
  const size_t L = hp->n_layer, k = hp->n_expert_used, dm = hp->n_embd;
  size_t at = 0;
#define TAKE(dst, type, count) CARVE(base, at, 64, dst, type, count)
  TAKE(m->xin_seq, uint32_t, L * ST_MAIL_FLAG_STRIDE);
  TAKE(m->cpu_seq, uint32_t, L * ST_MAIL_FLAG_STRIDE);
  TAKE(m->abort_seq, uint32_t, ST_MAIL_FLAG_STRIDE);
  TAKE(m->xroute, struct st_route, L * k);
  TAKE(m->xffn, float, L * dm);
  TAKE(m->cpu_out, float, L * k * dm);
  TAKE(m->pos_seq, int32_t, ST_MAIL_FLAG_STRIDE);
  TAKE(m->emb, float, dm);
  TAKE(m->head_seq, uint32_t, ST_MAIL_FLAG_STRIDE);
  TAKE(m->logits, float, hp->n_vocab);
  TAKE(m->argmax, int32_t, 2);
  TAKE(m->route, struct st_route, L * k);
  TAKE(m->stamps, uint64_t, 8);
#undef TAKE
  return at;
}

/* Carves the primary GPU's block (256-byte aligned arrays); with base 0 only counts. */
static size_t carve_dev(struct st_decode *d, const struct st_engine *e, uintptr_t base) {
  const struct st_hparams *hp = &e->hp;
  struct st_decode_dev *D = &d->ctx.dev;
  const size_t dm = hp->n_embd, qw = (size_t)hp->n_head * hp->head_dim, k = hp->n_expert_used, ff = hp->n_ff_exp;
  const size_t G = hp->n_head_kv, hd = hp->head_dim;
  const int mla = hp->attn_kind == ST_ATTN_MLA;
  size_t part = st_cuda_decode_part_floats(e->n_ctx, (int)hp->n_head, (int)hd);
  if (mla) {
    const size_t mp = st_cuda_mla_part_floats(e->n_ctx, (int)hp->n_head, (int)hp->kv_lora);
    part = mp > part ? mp : part;
  }
  size_t at = 0;
#define TAKE(dst, type, count) CARVE(base, at, 256, dst, type, count)
  TAKE(D->x, float, dm);
  TAKE(D->h, float, dm);
  TAKE(D->xn, float, dm);
  TAKE(D->q, float, qw);
  TAKE(D->kvnew, float, 2 * G * hd);
  TAKE(D->attn, float, qw);
  TAKE(D->xo, float, dm);
  TAKE(D->ffn_in, float, dm);
  TAKE(D->rlogits, float, hp->n_expert);
  TAKE(D->act, float, k * ff);
  TAKE(D->gpu_out, float, (k + 1) * dm);
  TAKE(D->fgu, float, 2 * (size_t)d->ctx.n_ff_max);
  TAKE(D->fact, float, (size_t)d->ctx.n_ff_max);
  TAKE(D->part, float, part);
  TAKE(D->route, struct st_route, (size_t)hp->n_layer * k);
  TAKE(D->sel_tag, uint64_t, (size_t)hp->n_layer * k);
  TAKE(D->pos, int32_t, 2);
  TAKE(D->counters, int32_t, hp->n_head);
  TAKE(D->amax, uint64_t, 2);
  TAKE(D->ffn_q, int8_t, st_decode_q8_bytes(dm));
  TAKE(D->xnq, int8_t, st_decode_q8_bytes(dm));
  TAKE(D->attnq, int8_t, st_decode_q8_bytes(qw));
  TAKE(D->rope, float, (size_t)e->n_ctx * hd);
  TAKE(D->slot_ptr, const uint8_t *, (size_t)hp->n_layer * hp->n_expert);
  TAKE(D->qa, float, mla ? hp->q_lora + 1 : 1);
  TAKE(D->qm, float, mla ? (size_t)hp->n_head * hd : 1);
  TAKE(D->olat, float, mla ? (size_t)hp->n_head * hp->kv_lora : 1);
#undef TAKE
  return at;
}
#endif

#ifdef ST_HAVE_CUDA
/* Copies n bytes of host memory to the primary GPU's address dst. */
static int to_primary(const struct st_decode *d, uintptr_t dst, const void *src, size_t n) {
  const int rc = starpu_interface_copy((uintptr_t)src, 0, STARPU_MAIN_RAM, dst, 0, d->primary_node, n, NULL);
  return rc ? st_set_error(ST_ERUNTIME, "copying %zu bytes to the primary GPU failed (%d)", n, rc) : 0;
}

/* Another architecture's per-layer vectors (st_decode_dev_layer) in one block on the primary GPU, and
 * a RoPE table the host computes (YaRN or an mscale: st_rope_conf_table, the CPU's floats). */
static int upload_arch(struct st_decode *d, const struct st_engine *e) {
  const struct st_hparams *hp = &e->hp;
  struct st_decode_ctx *c = &d->ctx;
  const int L = (int)hp->n_layer;
  /* the route table starts at zero: a dense layer's entries stay (expert 0, weight 0); so do the
   * position and step number (step 0: the mailbox's first step, 1, is past it for dk_pre's wait) and
   * the selection tags (step 0: none) */
  {
    _Static_assert(sizeof(struct st_route) == sizeof(uint64_t), "a route entry and a selection tag: the same zeros");
    const size_t n = sizeof(struct st_route) * hp->n_layer * hp->n_expert_used;
    void *z = calloc(1, n > 2 * sizeof(int32_t) ? n : 2 * sizeof(int32_t));
    int rc = z ? to_primary(d, (uintptr_t)c->dev.route, z, n) : st_set_error(ST_ENOMEM, "out of memory");
    if (!rc) rc = to_primary(d, (uintptr_t)c->dev.sel_tag, z, n);
    if (!rc) rc = to_primary(d, (uintptr_t)c->dev.pos, z, 2 * sizeof(int32_t));
    free(z);
    if (rc) return rc;
  }
  /* [n_ctx][hd / 2] (cos, sin), as st_cuda_rope_table's; a partial RoPE fills n_rot / 2 pairs a row */
  if (c->rope.yarn || c->rope.mscale != 1.0f || c->rope.n_rot != (int)hp->head_dim) {
    const size_t per = (size_t)hp->head_dim, n = (size_t)e->n_ctx * per;
    float *t = malloc(sizeof(float) * n);
    if (!t) return st_set_error(ST_ENOMEM, "out of memory for the RoPE table");
    for (int p = 0; p < e->n_ctx; p++) st_rope_conf_table(t + (size_t)p * per, &c->rope, p);
    const int rc = to_primary(d, (uintptr_t)c->dev.rope, t, sizeof(float) * n);
    free(t);
    if (rc) return rc;
    c->rope_uploaded = 1;
  }
  if (hp->arch == ST_ARCH_QWEN3MOE) return 0;
  d->dlayers = calloc((size_t)L, sizeof *d->dlayers);
  if (!d->dlayers) return st_set_error(ST_ENOMEM, "out of memory for the decode step");
  const size_t E = hp->n_expert, ff = hp->n_ff_exp, dm = hp->n_embd, qw = (size_t)hp->n_head * hp->head_dim,
               kw = (size_t)hp->n_head_kv * hp->head_dim;
  for (int pass = 0; pass < 2; pass++) {
    size_t at = 0;
    for (int l = 0; l < L; l++) {
      const struct st_decode_layer *H = &d->layers[l];
      struct st_decode_dev_layer *X = &d->dlayers[l];
      const float *src[10] = {H->bq, H->bk, H->bv, H->bo, H->sinks, H->router_b, H->gate_b, H->up_b, H->down_b, H->probs_b};
      const size_t count[10] = {qw, kw, kw, dm, hp->n_head, E, E * ff, E * ff, E * dm, E};
      const float **dst[10] = {&X->bq, &X->bk, &X->bv, &X->bo, &X->sinks, &X->router_b, &X->gate_b, &X->up_b, &X->down_b,
                               &X->probs_b};
      for (int i = 0; i < 10; i++) {
        if (!src[i]) continue;
        if (pass) {
          *dst[i] = (const float *)(d->extra_block + at);
          const int rc = to_primary(d, d->extra_block + at, src[i], sizeof(float) * count[i]);
          if (rc) return rc;
        }
        at += (sizeof(float) * count[i] + 255) & ~(size_t)255;
      }
    }
    if (!pass) {
      d->extra_bytes = at ? at : 256;
      d->extra_block = starpu_malloc_on_node(d->primary_node, d->extra_bytes);
      if (!d->extra_block)
        return st_set_error(ST_ENOMEM, "the decode step's biases need %.1f MiB on the primary GPU", d->extra_bytes / 1048576.0);
    }
  }
  c->dlayers = d->dlayers;
  return 0;
}
#endif

int st_decode_lane_rows_env(int *rows) {
  for (int i = 0; i < ST_LANE_ROW_KINDS; i++) rows[i] = 0;
  const char *v = getenv("STRATA_LANE_ROWS");
  if (!v || !*v) return 0;
  static const char *names[ST_LANE_ROW_KINDS] = {"qkv", "o", "router", "gateup", "down", "combine", "head"};
  for (const char *p = v; *p;) {
    const char *eq = strchr(p, '=');
    int k = -1;
    for (int i = 0; eq && i < ST_LANE_ROW_KINDS; i++)
      if ((size_t)(eq - p) == strlen(names[i]) && !strncmp(p, names[i], strlen(names[i]))) k = i;
    char *end = NULL;
    const long x = k >= 0 ? strtol(eq + 1, &end, 10) : 0;
    if (k < 0 || end == eq + 1 || (*end && *end != ',') || x < 1 || x > 65536)
      return st_set_error(ST_EINVAL, "STRATA_LANE_ROWS=%s: expected name=rows,... with names qkv, o, router, gateup, down, "
                          "combine, head and rows 1..65536 (doc/tuning.md)", v);
    rows[k] = (int)x;
    p = *end ? end + 1 : end;
  }
  return 0;
}

int st_decode_init(struct st_engine *e) {
  const struct st_hparams *hp = &e->hp;
  struct st_decode *d = calloc(1, sizeof *d);
  if (!d) return st_set_error(ST_ENOMEM, "out of memory for the decode step");
  e->dec = d;
  struct st_decode_ctx *c = &d->ctx;
  const int L = (int)hp->n_layer, E = (int)hp->n_expert;
  d->gpu = e->placement.cuda0_worker >= 0;
  d->primary_worker = e->placement.cuda0_worker;
  d->primary_node = e->placement.cuda0_node;
  *c = (struct st_decode_ctx){.n_layer = L, .n_embd = (int)hp->n_embd, .n_head = (int)hp->n_head,
                              .n_head_kv = (int)hp->n_head_kv, .head_dim = (int)hp->head_dim, .n_expert = E,
                              .k = (int)hp->n_expert_used, .n_ff = (int)hp->n_ff_exp, .n_vocab = (int)hp->n_vocab,
                              .n_ctx = e->n_ctx, .eps = hp->rms_eps, .rope_theta = hp->rope_theta,
                              .kv_type = e->kv_type, .int8_dot = e->int8_dot, .pdl = e->pdl, .mxfp4_int8 = e->mxfp4_int8,
                              .presubmit = e->presubmit,
                              .tier = e->placement.tier,
                              .output = e->model->output.data, .output_norm = e->model->output_norm.data,
                              .output_d = desc_of(&e->model->output)};
  c->rows_qkv = pow2_divisor((int)hp->head_dim, 64);
  if (hp->attn_kind == ST_ATTN_MLA) c->rows_qkv = 16;
  c->rows_o = 32;
  c->rows_router = 8; /* 16 items for 128 experts (32 rows: 4 of 15 lanes busy, 4.5 % of a CPU token) */
  c->rows_gateup = 32;
  c->rows_down = 32; /* 64 items per slot for a hidden size of 2048: 14 lanes stay busy on one expert */
  c->rows_combine = 128; /* 16 items: one lane gathering every slot's rows took 28 us a layer (15 lanes) */
  c->rows_head = 512;
  int *rows[ST_LANE_ROW_KINDS] = {&c->rows_qkv, &c->rows_o, &c->rows_router, &c->rows_gateup, &c->rows_down, &c->rows_combine,
                                  &c->rows_head};
  for (int i = 0; i < ST_LANE_ROW_KINDS; i++)
    if (e->lane_rows[i]) *rows[i] = e->lane_rows[i];
  /* attention's scores (and MLA's latent output after them), or gate and up rows */
  c->scratch_floats = (int64_t)(e->n_ctx > 2 * c->rows_gateup ? e->n_ctx : 2 * c->rows_gateup) + 16 + (int64_t)hp->head_dim;
  c->graph_key0 = st_engine_graph_keys_used(e);
  c->smem_set = &d->smem_set;

  d->layers = calloc((size_t)L, sizeof *d->layers);
  d->expert_src = malloc(sizeof(void *) * (size_t)L * E * 3);
  d->layer_cpu = calloc((size_t)L, 1);
  if (!d->layers || !d->expert_src || !d->layer_cpu) return st_set_error(ST_ENOMEM, "out of memory for the decode step");
  c->kv_planes = st_engine_kv_planes(hp);
  c->mla = hp->attn_kind == ST_ATTN_MLA;
  c->q_lora = (int)hp->q_lora;
  c->kv_lora = (int)hp->kv_lora;
  c->qk_nope = (int)hp->qk_nope;
  c->head_dim_v = (int)hp->head_dim_v;
  c->gating = (int)hp->gating;
  c->n_group = (int)hp->n_group;
  c->n_group_used = (int)hp->n_group_used;
  c->w_norm = hp->w_norm;
  c->w_scale = hp->w_scale;
  c->ffn_act = (int)hp->ffn_act;
  st_rope_conf_init(&c->rope, (int)hp->n_rot, hp->rope_kind == ST_ROPE_NEOX, hp->rope_theta, hp->yarn_factor,
                    (int)hp->yarn_orig_ctx, hp->yarn_beta_fast, hp->yarn_beta_slow, hp->rope_mscale);
  c->attn_conf = (struct st_attn_conf){hp->kq_scale, c->mla ? (int)hp->kv_lora : (int)hp->head_dim, (int)hp->head_dim, NULL,
                                       (int)hp->n_swa, 0};
  c->n_ff_max = (int)hp->n_ff_exp;
  for (int l = 0; l < L; l++) {
    const struct st_layer *W = &e->model->layers[l];
    const int fixed = W->dense ? (int)hp->n_ff : (int)hp->n_ff_shexp;
    if (fixed > c->n_ff_max) c->n_ff_max = fixed;
  }
  size_t kv_at = 0; /* layer l's cache after the earlier layers' (st_engine_kv_layer_bytes) */
  for (int l = 0; l < L; l++) {
    const struct st_layer *W = &e->model->layers[l];
    d->layers[l] = (struct st_decode_layer){
        .attn_norm = W->attn_norm.data, .q_norm = W->q_norm.data, .k_norm = W->k_norm.data,
        .ffn_norm = W->ffn_norm.data, .wq = W->wq.data, .wk = W->wk.data, .wv = W->wv.data, .wo = W->wo.data,
        .router = W->router.data, .wq_d = desc_of(&W->wq), .wk_d = desc_of(&W->wk), .wv_d = desc_of(&W->wv),
        .wo_d = desc_of(&W->wo), .router_d = desc_of(&W->router), .gate_d = desc_of(&W->gate_exps),
        .up_d = desc_of(&W->up_exps), .down_d = desc_of(&W->down_exps),
        .gate_bytes = st_expert_bytes(&W->gate_exps), .up_bytes = st_expert_bytes(&W->up_exps),
        .kv = (uint8_t *)e->kv + kv_at, .kv_rows = st_engine_kv_rows(e, (uint32_t)l),
        .bq = W->bq.data, .bk = W->bk.data, .bv = W->bv.data, .bo = W->bo.data, .sinks = W->sinks.data,
        .router_b = W->router_b.data, .probs_b = W->probs_b.data, .gate_b = W->gate_exps_b.data,
        .up_b = W->up_exps_b.data, .down_b = W->down_exps_b.data, .dense = W->dense, .swa = W->swa,
        .wq_a = W->wq_a.data, .wq_b = W->wq_b.data, .wkv_a = W->wkv_a.data, .wk_b = W->wk_b.data, .wv_b = W->wv_b.data,
        .q_a_norm = W->q_a_norm.data, .kv_a_norm = W->kv_a_norm.data, .wq_a_d = desc_of(&W->wq_a),
        .wq_b_d = desc_of(&W->wq_b), .wkv_a_d = desc_of(&W->wkv_a), .wk_b_d = desc_of(&W->wk_b), .wv_b_d = desc_of(&W->wv_b)};
    kv_at += (size_t)st_engine_kv_layer_bytes(e, (uint32_t)l);
    struct st_decode_layer *D = &d->layers[l];
    const struct st_weight *fg = W->dense ? &W->ffn_gate : &W->gate_shexp, *fu = W->dense ? &W->ffn_up : &W->up_shexp,
                           *fd = W->dense ? &W->ffn_down : &W->down_shexp;
    if (fg->data) {
      D->fgate = fg->data, D->fup = fu->data, D->fdown = fd->data;
      D->fgate_d = desc_of(fg), D->fup_d = desc_of(fu), D->fdown_d = desc_of(fd);
      D->fixed_ff = (int)fg->ne[1];
      st_fixed_q8(D, (int)hp->n_embd, e->int8_dot);
    }
    for (int x = 0; x < E; x++)
      for (int i = 0; i < 3; i++)
        d->expert_src[((size_t)l * E + x) * 3 + i] = st_host_arena_src(e->placement.arena, e->model, (uint32_t)l, (uint32_t)x, i);
  }
  c->layers = d->layers;
  c->expert_src = d->expert_src;
  c->layer_cpu = d->layer_cpu;

  /* lanes: one per CPU worker, in worker order */
  const unsigned nw = starpu_worker_get_count();
  d->lane_worker = malloc(sizeof(int) * (nw ? nw : 1));
  if (!d->lane_worker) return st_set_error(ST_ENOMEM, "out of memory for the decode step");
  for (unsigned w = 0; w < nw; w++)
    if (starpu_worker_get_type((int)w) == STARPU_CPU_WORKER) d->lane_worker[d->n_lanes++] = (int)w;
  if (d->n_lanes == 0) return st_set_error(ST_ERUNTIME, "the decode step needs a CPU worker");

  d->host_bytes = carve_host(d, e, NULL);
  if (posix_memalign(&d->host_block, 4096, d->host_bytes)) {
    d->host_block = NULL;
    return st_set_error(ST_ENOMEM, "out of memory for the decode buffers (%.1f MiB)", d->host_bytes / 1048576.0);
  }
  memset(d->host_block, 0, d->host_bytes);
  carve_host(d, e, d->host_block);
  if (e->lane_stats) {
    c->stats = calloc(nw ? nw : 1, sizeof *c->stats);
    c->walls = calloc(1, sizeof *c->walls);
    if (!c->stats || !c->walls) return st_set_error(ST_ENOMEM, "out of memory for the lane stats");
  }
  d->span = e->layer_span > 0 && e->layer_span < L ? e->layer_span : L;
  d->span_bufs = malloc(sizeof *d->span_bufs * st_decode_task_bufs_max(e, d->span));
  d->span_modes = malloc(sizeof *d->span_modes * st_decode_task_bufs_max(e, d->span));
  if (!d->span_bufs || !d->span_modes) return st_set_error(ST_ENOMEM, "out of memory for the decode step");
  int rc = make_names(d, e);
  if (!rc && !d->gpu) rc = st_lane_token_plan(c);
#ifdef ST_HAVE_CUDA
  if (!rc && d->gpu) {
    char why[256];
    if (!st_cuda_host_register(d->host_block, d->host_bytes, why, sizeof why))
      fprintf(stderr, "strata: decode buffers not pinned (%s): transfers stage through pageable memory\n", why);
    const size_t bytes = carve_dev(d, e, 0);
    d->dev_block = starpu_malloc_on_node(d->primary_node, bytes);
    if (!d->dev_block) return st_set_error(ST_ENOMEM, "the decode buffers need %.1f MiB on the primary GPU", bytes / 1048576.0);
    c->dev.bytes = bytes;
    carve_dev(d, e, d->dev_block);
    d->mail_bytes = carve_mail(e, 0, &c->mail);
    uintptr_t dmail = 0;
    d->mail_block = st_cuda_host_alloc_mapped(d->mail_bytes, starpu_worker_get_devid(d->primary_worker), &dmail, why, sizeof why);
    if (!d->mail_block) return st_set_error(ST_ERUNTIME, "the decode step's mailbox (%zu bytes of mapped host memory): %s", d->mail_bytes, why);
    memset(d->mail_block, 0, d->mail_bytes);
    carve_mail(e, (uintptr_t)d->mail_block, &c->mail);
    carve_mail(e, dmail, &c->dmail);
    rc = upload_arch(d, e);
  }
#endif
  if (!rc) rc = st_decode_tables_update(e);
  return rc;
}

void st_decode_free(struct st_engine *e) {
  struct st_decode *d = e->dec;
  if (!d) return;
  if (d->dev_block) starpu_free_on_node(d->primary_node, d->dev_block, d->ctx.dev.bytes);
  if (d->extra_block) starpu_free_on_node(d->primary_node, d->extra_block, d->extra_bytes);
  free(d->dlayers);
#ifdef ST_HAVE_CUDA
  if (d->host_block && d->gpu) st_cuda_host_unregister(d->host_block);
  if (d->mail_block) st_cuda_host_free_mapped(d->mail_block);
#endif
  free(d->host_block);
  free(d->layers);
  free(d->expert_src);
  free(d->layer_cpu);
  free(d->span_bufs);
  free(d->span_modes);
  free(d->lane_worker);
  free(d->names);
  free(d->layer_names);
  free(d->lane_names);
  free(d->ctx.phase_start);
  free(d->ctx.phase_kind);
  free(d->ctx.phase_layer);
  free(d->ctx.layer_end);
  st_lane_stats_print(&d->ctx, d->n_lanes, stderr);
  free(d->ctx.stats);
  free(d->ctx.walls);
  free(d);
  e->dec = NULL;
}
