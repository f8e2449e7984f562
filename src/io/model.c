/* Loading and checking a MoE GGUF (see model.h) by its architecture's description (arch.h). Key
 * names follow llama.cpp's LLM_KV_* table; tensor names and shapes follow its LLM_TENSOR_* table
 * (ne[0] is the input dimension of a matrix). */
#include "io/model.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/quant.h"
#include "common.h"
#include "io/arch.h"
#include "io/gguf.h"
#include "io/tokenizer.h"

static int get_u32(const struct st_gguf *g, const char *key, uint32_t *out) {
  uint64_t v;
  int rc = st_gguf_get_u64(g, key, &v);
  if (rc) return rc;
  if (v == 0 || v > (1u << 24)) return st_set_error(ST_EFORMAT, "%s = %" PRIu64 " is out of range", key, v);
  *out = (uint32_t)v;
  return 0;
}

/* Finds `name`, checks dims against want[0..nd) and that its type is one strata computes. */
static int find_weight(const struct st_gguf *g, const char *name, int nd, const uint64_t *want,
                       int norm, struct st_weight *w) {
  const struct st_gguf_tensor *t = st_gguf_find_tensor(g, name);
  if (!t) return st_set_error(ST_EFORMAT, "missing tensor %s", name);
  int ok = 1;
  for (int i = 0; i < ST_GGUF_MAX_DIMS; i++) ok &= t->ne[i] == (i < nd ? want[i] : 1);
  if (!ok)
    return st_set_error(ST_EFORMAT,
                        "tensor %s has shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64 "], expected [%" PRIu64
                        ", %" PRIu64 ", %" PRIu64 "] for this architecture",
                        name, t->ne[0], t->ne[1], t->ne[2], want[0], nd > 1 ? want[1] : 1,
                        nd > 2 ? want[2] : 1);
  const struct st_type_info *ti = st_type_info(t->type);
  if (!ti->computed || (norm && t->type != ST_TYPE_F32))
    return st_unsupported_type(ST_EUNSUP, t->type, name, g->path, ti->computed ? "strata reads norms as f32" : NULL);
  snprintf(w->name, sizeof w->name, "%s", name);
  w->data = t->data;
  w->type = t->type;
  memcpy(w->ne, t->ne, sizeof w->ne);
  w->row_bytes = st_row_bytes(t->type, t->ne[0]);
  return 0;
}

/* `<arch>.<key>` into buf. */
static const char *akey(char *buf, size_t n, const struct st_arch *A, const char *key) {
  snprintf(buf, n, "%s.%s", A->name, key);
  return buf;
}

/* Optional unsigned key (0 allowed): *out untouched when absent. */
static int opt_u32(const struct st_gguf *g, const struct st_arch *A, const char *key, uint32_t *out) {
  char k[128];
  uint64_t v;
  if (!st_gguf_find_kv(g, akey(k, sizeof k, A, key))) return 0;
  int rc = st_gguf_get_u64(g, k, &v);
  if (rc) return rc;
  if (v > (1u << 24)) return st_set_error(ST_EFORMAT, "%s = %" PRIu64 " is out of range", k, v);
  *out = (uint32_t)v;
  return 0;
}

static int opt_f32(const struct st_gguf *g, const struct st_arch *A, const char *key, float *out) {
  char k[128];
  return st_gguf_find_kv(g, akey(k, sizeof k, A, key)) ? st_gguf_get_f32(g, k, out) : 0;
}

static int load_hparams(const struct st_gguf *g, const struct st_arch *A, struct st_hparams *hp) {
  char k[128];
  int rc = 0;
  hp->arch = A->id;
  hp->attn_kind = A->attn_kind;
  hp->rope_kind = A->rope_kind;
  hp->gating = A->gating;
  hp->ffn_act = A->ffn_act;
  hp->w_norm = A->weights_norm;
  hp->w_scale = 1.0f;
  hp->swa_pattern = A->swa_pattern;
  rc = rc ? rc : get_u32(g, akey(k, sizeof k, A, "block_count"), &hp->n_layer);
  rc = rc ? rc : get_u32(g, akey(k, sizeof k, A, "embedding_length"), &hp->n_embd);
  rc = rc ? rc : get_u32(g, akey(k, sizeof k, A, "attention.head_count"), &hp->n_head);
  rc = rc ? rc : get_u32(g, akey(k, sizeof k, A, "attention.head_count_kv"), &hp->n_head_kv);
  rc = rc ? rc : get_u32(g, akey(k, sizeof k, A, "expert_count"), &hp->n_expert);
  rc = rc ? rc : get_u32(g, akey(k, sizeof k, A, "expert_used_count"), &hp->n_expert_used);
  rc = rc ? rc : get_u32(g, akey(k, sizeof k, A, "expert_feed_forward_length"), &hp->n_ff_exp);
  rc = rc ? rc : get_u32(g, akey(k, sizeof k, A, "context_length"), &hp->n_ctx_train);
  if (rc) return rc;
  /* the NextN (multi-token prediction) blocks after the last layer are not part of the forward pass */
  uint32_t nextn = 0;
  if ((rc = opt_u32(g, A, "nextn_predict_layers", &nextn))) return rc;
  if (nextn >= hp->n_layer) return st_set_error(ST_EFORMAT, "nextn_predict_layers %u leaves no layer of %u", nextn, hp->n_layer);
  hp->n_layer -= nextn;
  if (hp->n_layer > 4096) /* the largest models have a few hundred; guards the per-layer allocations */
    return st_set_error(ST_EFORMAT, "block_count %u is out of range (at most 4096 layers)", hp->n_layer);
  hp->head_dim = hp->n_embd / hp->n_head;
  if ((rc = opt_u32(g, A, "attention.key_length", &hp->head_dim))) return rc;
  uint32_t vlen = hp->head_dim;
  if ((rc = opt_u32(g, A, "attention.value_length", &vlen))) return rc;
  hp->rope_theta = 10000.0f;
  hp->rms_eps = 1e-6f;
  if ((rc = opt_f32(g, A, "rope.freq_base", &hp->rope_theta)) ||
      (rc = opt_f32(g, A, "attention.layer_norm_rms_epsilon", &hp->rms_eps)))
    return rc;
  /* float keys a file could carry wrong: refused here, by name, rather than as overflowing activations */
  if (!(hp->rope_theta > 0.0f) || !isfinite(hp->rope_theta))
    return st_set_error(ST_EFORMAT, "%s.rope.freq_base = %g is not a positive number", A->name, hp->rope_theta);
  if (!(hp->rms_eps > 0.0f) || !(hp->rms_eps < 1.0f))
    return st_set_error(ST_EFORMAT, "%s.attention.layer_norm_rms_epsilon = %g is out of range (0, 1)", A->name, hp->rms_eps);
  hp->n_rot = hp->head_dim;
  if ((rc = opt_u32(g, A, "rope.dimension_count", &hp->n_rot))) return rc;
  /* YaRN (rope.scaling.type yarn): llama.cpp's ext_factor 1, attention factor 1 */
  if (st_gguf_find_kv(g, akey(k, sizeof k, A, "rope.scaling.type"))) {
    char *type = NULL;
    if ((rc = st_gguf_get_str(g, k, &type))) return rc;
    const int yarn = !strcmp(type, "yarn"), none = !strcmp(type, "none");
    if (!yarn && !none) rc = st_set_error(ST_EUNSUP, "rope.scaling.type %s (strata computes none and yarn)", type);
    free(type);
    if (rc) return rc;
    if (yarn) {
      hp->yarn_factor = 1.0f;
      hp->yarn_beta_fast = 32.0f;
      hp->yarn_beta_slow = 1.0f;
      hp->yarn_orig_ctx = hp->n_ctx_train;
      if ((rc = opt_f32(g, A, "rope.scaling.factor", &hp->yarn_factor)) ||
          (rc = opt_u32(g, A, "rope.scaling.original_context_length", &hp->yarn_orig_ctx)) ||
          (rc = opt_f32(g, A, "rope.scaling.yarn_beta_fast", &hp->yarn_beta_fast)) ||
          (rc = opt_f32(g, A, "rope.scaling.yarn_beta_slow", &hp->yarn_beta_slow)))
        return rc;
      if (!(hp->yarn_factor >= 1.0f) || !(hp->yarn_factor < 1e6f) || hp->yarn_orig_ctx == 0 ||
          !(hp->yarn_beta_fast > 0.0f && hp->yarn_beta_fast < 1e6f) || !(hp->yarn_beta_slow > 0.0f && hp->yarn_beta_slow < 1e6f))
        return st_set_error(ST_EFORMAT, "rope.scaling.factor %g / original_context_length %u / yarn_beta_fast %g / "
                            "yarn_beta_slow %g are out of range", hp->yarn_factor, hp->yarn_orig_ctx, hp->yarn_beta_fast,
                            hp->yarn_beta_slow);
      if (hp->yarn_factor == 1.0f) hp->yarn_factor = 0.0f; /* no scaling */
    }
  }
  /* llama.cpp's YaRN attention factor (llama_context's cparams.yarn_attn_factor, then rope_yarn's
   * correction, then deepseek2's kq_scale): yarn_log_multiplier (deepseek2's converter writes 0.1
   * mscale_all_dim), rope.scaling.attn_factor */
  float log_mul = 0.0f, attn_factor = 1.0f;
  if ((rc = opt_f32(g, A, "rope.scaling.yarn_log_multiplier", &log_mul)) ||
      (rc = opt_f32(g, A, "rope.scaling.attn_factor", &attn_factor)))
    return rc;
  if (!(fabsf(log_mul) < 100.0f) || !(attn_factor > 0.0f && attn_factor < 100.0f))
    return st_set_error(ST_EFORMAT, "rope.scaling.yarn_log_multiplier %g / attn_factor %g are out of range", log_mul, attn_factor);
  if (A->id == ST_ARCH_DEEPSEEK2) log_mul /= 0.1f; /* [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX] */
  const double ln_f = hp->yarn_factor > 0 ? log((double)hp->yarn_factor) : 0.0;
  double yaf = 1.0;
  if (hp->yarn_factor > 0) {
    const double m = A->id == ST_ARCH_DEEPSEEK2 && log_mul != 1.0f ? log_mul : 1.0;
    yaf = log_mul != 0.0f ? (0.1 * m * ln_f + 1.0) / (0.1 * log_mul * ln_f + 1.0) : 1.0 + 0.1 * ln_f;
    yaf /= 1.0 + 0.1 * ln_f;
  }
  yaf *= attn_factor;
  const double rope_mscale = yaf * (1.0 + 0.1 * ln_f);
  hp->rope_mscale = (float)rope_mscale; /* deepseek2 with YaRN: 1, its correction goes into kq_scale */
  if ((rc = opt_u32(g, A, "attention.sliding_window", &hp->n_swa))) return rc;
  if (!hp->swa_pattern) hp->n_swa = 0;
  if ((rc = opt_u32(g, A, "leading_dense_block_count", &hp->n_layer_dense)) ||
      (rc = opt_u32(g, A, "feed_forward_length", &hp->n_ff)))
    return rc;
  if (hp->n_layer_dense >= hp->n_layer)
    return st_set_error(ST_EFORMAT, "leading_dense_block_count %u leaves no MoE layer of %u", hp->n_layer_dense, hp->n_layer);
  if (hp->n_layer_dense && !hp->n_ff) return st_set_error(ST_EFORMAT, "dense layers without feed_forward_length");
  uint32_t n_shared = 0;
  if (A->shared && (rc = opt_u32(g, A, "expert_shared_count", &n_shared))) return rc;
  hp->n_ff_shexp = n_shared * hp->n_ff_exp;
  uint32_t func = 0;
  if ((rc = opt_u32(g, A, "expert_gating_func", &func))) return rc;
  if (func == 1) hp->gating = ST_GATING_SOFTMAX;
  else if (func == 2) hp->gating = ST_GATING_SIGMOID;
  else if (func == 3) hp->gating = ST_GATING_SOFTMAX_WEIGHT;
  else if (func) return st_set_error(ST_EUNSUP, "expert_gating_func %u (strata computes 1 softmax, 2 sigmoid, 3 softmax weight)", func);
  if ((rc = opt_u32(g, A, "expert_group_count", &hp->n_group)) ||
      (rc = opt_u32(g, A, "expert_group_used_count", &hp->n_group_used)) ||
      (rc = opt_f32(g, A, "expert_weights_scale", &hp->w_scale)))
    return rc;
  if (st_gguf_find_kv(g, akey(k, sizeof k, A, "expert_weights_norm")) && (rc = st_gguf_get_bool(g, k, &hp->w_norm))) return rc;
  if (hp->n_group > 1 && (hp->n_expert % hp->n_group || hp->n_group_used == 0 || hp->n_group_used > hp->n_group ||
                          hp->n_expert / hp->n_group < 2 || hp->n_expert_used > hp->n_expert / hp->n_group * hp->n_group_used))
    return st_set_error(ST_EFORMAT, "expert_group_count %u / expert_group_used_count %u do not fit %u experts, %u used",
                        hp->n_group, hp->n_group_used, hp->n_expert, hp->n_expert_used);
  if (!(hp->w_scale > 0.0f) || !(hp->w_scale < 1e6f))
    return st_set_error(ST_EFORMAT, "expert_weights_scale %g is out of range", hp->w_scale);
  hp->head_dim_v = vlen;
  hp->kq_scale = 1.0f / sqrtf((float)hp->head_dim);
  if (A->attn_kind == ST_ATTN_MLA) {
    /* the cached row is the latent (value_length = kv_lora_rank) and the rope part */
    uint32_t klen_mla = 0, vlen_mla = 0;
    if (!st_gguf_find_kv(g, akey(k, sizeof k, A, "attention.key_length_mla")))
      return st_set_error(ST_EUNSUP, "a deepseek2 file from before llama.cpp split attn_kv_b into attn_k_b and attn_v_b (no "
                          "%s): strata computes the absorbed MLA form; re-convert the model with a current "
                          "convert_hf_to_gguf.py", k);
    if ((rc = opt_u32(g, A, "attention.q_lora_rank", &hp->q_lora)) ||
        (rc = get_u32(g, akey(k, sizeof k, A, "attention.kv_lora_rank"), &hp->kv_lora)) ||
        (rc = get_u32(g, akey(k, sizeof k, A, "attention.key_length_mla"), &klen_mla)) ||
        (rc = get_u32(g, akey(k, sizeof k, A, "attention.value_length_mla"), &vlen_mla)))
      return rc;
    if (hp->n_head_kv != 1 || hp->head_dim != hp->kv_lora + hp->n_rot || vlen != hp->kv_lora || klen_mla <= hp->n_rot)
      return st_set_error(ST_EUNSUP, "an MLA layout strata does not compute (head_count_kv %u, key_length %u, value_length %u, "
                          "kv_lora_rank %u, rope dims %u, key_length_mla %u): it computes llama.cpp's absorbed form",
                          hp->n_head_kv, hp->head_dim, vlen, hp->kv_lora, hp->n_rot, klen_mla);
    hp->qk_nope = klen_mla - hp->n_rot;
    hp->head_dim_v = vlen_mla;
    /* deepseek2.cpp: mscale = attn_factor_org (1 + 0.1 log_mul ln(1 / freq_scale)), its square in
     * kq_scale; RoPE itself unscaled (yaf cancels rope_yarn's correction) */
    const double mscale = rope_mscale * (1.0 + 0.1 * log_mul * ln_f);
    hp->kq_scale = (float)(mscale * mscale / sqrt((double)klen_mla));
  } else if (vlen != hp->head_dim) {
    return st_set_error(ST_EUNSUP, "value_length %u differs from key_length %u", vlen, hp->head_dim);
  }
  if (hp->n_head % hp->n_head_kv)
    return st_set_error(ST_EFORMAT, "head_count %u is not a multiple of head_count_kv %u", hp->n_head, hp->n_head_kv);
  if (hp->n_expert_used > hp->n_expert)
    return st_set_error(ST_EFORMAT, "expert_used_count %u exceeds expert_count %u", hp->n_expert_used, hp->n_expert);
  if (hp->n_rot % 2 || hp->n_rot == 0 || hp->n_rot > hp->head_dim)
    return st_set_error(ST_EFORMAT, "rope.dimension_count %u: RoPE needs an even count up to key_length %u", hp->n_rot,
                        hp->head_dim);
  if (A->attn_kind == ST_ATTN_GQA && hp->head_dim % 2)
    return st_set_error(ST_EFORMAT, "key_length %u is odd (RoPE needs pairs)", hp->head_dim);
  return 0;
}

static int load_layer(const struct st_gguf *g, const struct st_arch *A, const struct st_hparams *hp, uint32_t il,
                      struct st_layer *L) {
  struct st_layer_tensor spec[ST_LAYER_MAX_TENSORS];
  const int n = st_arch_layer_tensors(A, hp, il, spec);
  L->dense = il < hp->n_layer_dense;
  L->swa = hp->n_swa > 0 && il % hp->swa_pattern < hp->swa_pattern - 1;
  for (int i = 0; i < n; i++) {
    char name[96];
    snprintf(name, sizeof name, "blk.%u.%s", il, spec[i].suffix);
    if (spec[i].optional && !st_gguf_find_tensor(g, name)) continue;
    const int f32 = spec[i].kind == ST_TK_NORM || spec[i].kind == ST_TK_BIAS;
    struct st_weight *w = (struct st_weight *)(void *)((uint8_t *)L + spec[i].field);
    int rc = find_weight(g, name, spec[i].nd, spec[i].ne, f32, w);
    if (rc) return rc;
    if (!f32 && w->type == ST_TYPE_Q8_0 && spec[i].ne[0] % ST_QK8_0)
      return st_set_error(ST_EFORMAT, "%s: row length %" PRIu64 " is not a multiple of 32", name, spec[i].ne[0]);
  }
  return 0;
}

static int load_tensors(struct st_model *m, const struct st_arch *A) {
  const struct st_gguf *g = m->gguf;
  struct st_hparams *hp = &m->hp;
  const uint64_t d = hp->n_embd;
  int rc;
  const struct st_gguf_tensor *emb = st_gguf_find_tensor(g, "token_embd.weight");
  if (!emb) return st_set_error(ST_EFORMAT, "missing tensor token_embd.weight");
  if (emb->ne[1] == 0 || emb->ne[1] > (1u << 24))
    return st_set_error(ST_EFORMAT, "token_embd.weight has %" PRIu64 " rows", emb->ne[1]);
  hp->n_vocab = (uint32_t)emb->ne[1];
  if ((rc = find_weight(g, "token_embd.weight", 2, (uint64_t[]){d, hp->n_vocab}, 0, &m->tok_embd)) ||
      (rc = find_weight(g, "output_norm.weight", 1, (uint64_t[]){d}, 1, &m->output_norm)))
    return rc;
  if (st_gguf_find_tensor(g, "output.weight")) {
    if ((rc = find_weight(g, "output.weight", 2, (uint64_t[]){d, hp->n_vocab}, 0, &m->output))) return rc;
  } else {
    m->output = m->tok_embd;
    m->tied_output = 1;
  }
  m->layers = calloc(hp->n_layer, sizeof *m->layers);
  if (!m->layers) return st_set_error(ST_ENOMEM, "out of memory for %u layers", hp->n_layer);
  for (uint32_t il = 0; il < hp->n_layer; il++)
    if ((rc = load_layer(g, A, hp, il, &m->layers[il]))) return rc;
  return 0;
}

int st_model_load(const char *path, struct st_model **out) {
  *out = NULL;
  struct st_gguf *g = NULL;
  int rc = st_gguf_open(path, &g);
  if (rc) return rc; /* the reader's message already names the file */
  rc = st_model_from_gguf(g, out);
  if (rc && !strstr(st_last_error(), path)) st_error_context(rc, path); /* the message names the file once */
  return rc;
}

/* Every tensor of a block ("blk.N.") within the file's block_count (the layers and the NextN blocks
 * after them), as llama.cpp checks by its tensor count: a file whose metadata lists fewer layers
 * than its tensors hold is refused, not run as the smaller model. */
static int check_blocks(const struct st_model *m, const struct st_arch *A) {
  uint32_t nextn = 0;
  int rc = opt_u32(m->gguf, A, "nextn_predict_layers", &nextn);
  const uint64_t blocks = (uint64_t)m->hp.n_layer + nextn;
  for (uint64_t i = 0; i < m->gguf->n_tensors && !rc; i++) {
    const struct st_gguf_str *n = &m->gguf->tensor[i].name;
    unsigned long b = 0;
    size_t k = 4;
    if (n->len < 6 || memcmp(n->ptr, "blk.", 4)) continue;
    while (k < n->len && k < 14 && n->ptr[k] >= '0' && n->ptr[k] <= '9') b = b * 10 + (unsigned long)(n->ptr[k++] - '0');
    if (k > 4 && b >= blocks)
      rc = st_set_error(ST_EFORMAT, "tensor %.*s belongs to block %lu, but %s.block_count is %llu: the metadata and the "
                        "tensors disagree", (int)(n->len < 200 ? n->len : 200), n->ptr, b, A->name,
                        (unsigned long long)blocks);
  }
  return rc;
}

int st_model_from_gguf(struct st_gguf *g, struct st_model **out) {
  *out = NULL;
  struct st_model *m = calloc(1, sizeof *m);
  if (!m) {
    st_gguf_close(g);
    return st_set_error(ST_ENOMEM, "out of memory");
  }
  m->gguf = g;
  char *arch = NULL;
  const struct st_arch *A = NULL;
  int rc = st_gguf_get_str(m->gguf, "general.architecture", &arch);
  if (!rc && !(A = st_arch_find(arch)))
    rc = st_set_error(ST_EUNSUP, "unsupported architecture %s (strata runs %s)", arch, st_arch_names());
  free(arch);
  if (!rc) rc = load_hparams(m->gguf, A, &m->hp);
  if (!rc) rc = load_tensors(m, A);
  if (!rc) rc = check_blocks(m, A);
  if (!rc) rc = st_tokenizer_load(m->gguf, &m->tok);
  if (!rc && st_tokenizer_n_vocab(m->tok) > (int32_t)m->hp.n_vocab)
    rc = st_set_error(ST_EFORMAT, "tokenizer has %d ids but token_embd.weight only %u rows",
                      st_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
  if (rc) {
    st_model_free(m);
    return rc;
  }
  *out = m;
  return 0;
}

void st_model_free(struct st_model *m) {
  if (!m) return;
  if (m->tok) st_tokenizer_free(m->tok);
  free(m->layers);
  st_gguf_close(m->gguf);
  free(m);
}
