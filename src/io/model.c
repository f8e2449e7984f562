/* Loading and checking a qwen3moe GGUF (see model.h). Key names follow llama.cpp's
 * LLM_KV_* table for the qwen3moe architecture; tensor names and shapes follow its
 * LLM_TENSOR_* table (ne[0] is the input dimension of a matrix). */
#include "io/model.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/quant.h"
#include "common.h"
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

static int load_hparams(const struct st_gguf *g, struct st_hparams *hp) {
  int rc = 0;
  rc = rc ? rc : get_u32(g, "qwen3moe.block_count", &hp->n_layer);
  rc = rc ? rc : get_u32(g, "qwen3moe.embedding_length", &hp->n_embd);
  rc = rc ? rc : get_u32(g, "qwen3moe.attention.head_count", &hp->n_head);
  rc = rc ? rc : get_u32(g, "qwen3moe.attention.head_count_kv", &hp->n_head_kv);
  rc = rc ? rc : get_u32(g, "qwen3moe.expert_count", &hp->n_expert);
  rc = rc ? rc : get_u32(g, "qwen3moe.expert_used_count", &hp->n_expert_used);
  rc = rc ? rc : get_u32(g, "qwen3moe.expert_feed_forward_length", &hp->n_ff_exp);
  rc = rc ? rc : get_u32(g, "qwen3moe.context_length", &hp->n_ctx_train);
  if (rc) return rc;
  if (st_gguf_find_kv(g, "qwen3moe.attention.key_length")) {
    if ((rc = get_u32(g, "qwen3moe.attention.key_length", &hp->head_dim))) return rc;
  } else {
    hp->head_dim = hp->n_embd / hp->n_head;
  }
  uint32_t vlen = hp->head_dim;
  if (st_gguf_find_kv(g, "qwen3moe.attention.value_length") &&
      (rc = get_u32(g, "qwen3moe.attention.value_length", &vlen)))
    return rc;
  if (vlen != hp->head_dim)
    return st_set_error(ST_EUNSUP, "value_length %u differs from key_length %u", vlen, hp->head_dim);
  hp->rope_theta = 10000.0f;
  if (st_gguf_find_kv(g, "qwen3moe.rope.freq_base") &&
      (rc = st_gguf_get_f32(g, "qwen3moe.rope.freq_base", &hp->rope_theta)))
    return rc;
  hp->rms_eps = 1e-6f;
  if (st_gguf_find_kv(g, "qwen3moe.attention.layer_norm_rms_epsilon") &&
      (rc = st_gguf_get_f32(g, "qwen3moe.attention.layer_norm_rms_epsilon", &hp->rms_eps)))
    return rc;
  if (hp->n_head % hp->n_head_kv)
    return st_set_error(ST_EFORMAT, "head_count %u is not a multiple of head_count_kv %u", hp->n_head, hp->n_head_kv);
  if (hp->n_expert_used > hp->n_expert)
    return st_set_error(ST_EFORMAT, "expert_used_count %u exceeds expert_count %u", hp->n_expert_used, hp->n_expert);
  if (hp->head_dim % 2)
    return st_set_error(ST_EFORMAT, "key_length %u is odd (RoPE needs pairs)", hp->head_dim);
  return 0;
}

static int load_tensors(struct st_model *m) {
  const struct st_gguf *g = m->gguf;
  struct st_hparams *hp = &m->hp;
  const uint64_t d = hp->n_embd, q = (uint64_t)hp->n_head * hp->head_dim,
                 kv = (uint64_t)hp->n_head_kv * hp->head_dim;
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
  const uint64_t E = hp->n_expert, ff = hp->n_ff_exp, hd = hp->head_dim;
  for (uint32_t il = 0; il < hp->n_layer; il++) {
    struct st_layer *L = &m->layers[il];
    struct {
      const char *suffix;
      int nd;
      uint64_t ne[3];
      int norm;
      struct st_weight *w;
    } spec[] = {
        {"attn_norm", 1, {d}, 1, &L->attn_norm},
        {"attn_q", 2, {d, q}, 0, &L->wq},
        {"attn_k", 2, {d, kv}, 0, &L->wk},
        {"attn_v", 2, {d, kv}, 0, &L->wv},
        {"attn_output", 2, {q, d}, 0, &L->wo},
        {"attn_q_norm", 1, {hd}, 1, &L->q_norm},
        {"attn_k_norm", 1, {hd}, 1, &L->k_norm},
        {"ffn_norm", 1, {d}, 1, &L->ffn_norm},
        {"ffn_gate_inp", 2, {d, E}, 0, &L->router},
        {"ffn_gate_exps", 3, {d, ff, E}, 0, &L->gate_exps},
        {"ffn_up_exps", 3, {d, ff, E}, 0, &L->up_exps},
        {"ffn_down_exps", 3, {ff, d, E}, 0, &L->down_exps},
    };
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
      char name[96];
      snprintf(name, sizeof name, "blk.%u.%s.weight", il, spec[i].suffix);
      if ((rc = find_weight(g, name, spec[i].nd, spec[i].ne, spec[i].norm, spec[i].w))) return rc;
      if (!spec[i].norm && spec[i].w->type == ST_TYPE_Q8_0 && spec[i].ne[0] % ST_QK8_0)
        return st_set_error(ST_EFORMAT, "%s: row length %" PRIu64 " is not a multiple of 32", name, spec[i].ne[0]);
    }
  }
  return 0;
}

int st_model_load(const char *path, struct st_model **out) {
  *out = NULL;
  struct st_model *m = calloc(1, sizeof *m);
  if (!m) return st_set_error(ST_ENOMEM, "out of memory");
  int rc = st_gguf_open(path, &m->gguf);
  if (rc) {
    free(m);
    return rc; /* the reader's message already names the file */
  }
  char *arch = NULL;
  rc = st_gguf_get_str(m->gguf, "general.architecture", &arch);
  if (!rc && strcmp(arch, "qwen3moe") != 0)
    rc = st_set_error(ST_EUNSUP, "unsupported architecture %s (strata runs qwen3moe)", arch);
  free(arch);
  if (!rc) rc = load_hparams(m->gguf, &m->hp);
  if (!rc) rc = load_tensors(m);
  if (!rc) rc = st_tokenizer_load(m->gguf, &m->tok);
  if (!rc && st_tokenizer_n_vocab(m->tok) > (int32_t)m->hp.n_vocab)
    rc = st_set_error(ST_EFORMAT, "tokenizer has %d ids but token_embd.weight only %u rows",
                      st_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
  if (rc) {
    if (!strstr(st_last_error(), path)) st_error_context(rc, path); /* the message names the file once */
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
