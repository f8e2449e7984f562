/* The qwen3moe model as strata computes it: hyper-parameters from the `qwen3moe.*` GGUF keys and
 * the tensors llama.cpp's converter writes (token_embd, output_norm, output, blk.N.attn_*,
 * blk.N.ffn_*_exps, blk.N.ffn_gate_inp). Shapes and types are checked at load time so the
 * compute kernels never see a tensor they cannot handle. */
#ifndef ST_MODEL_H
#define ST_MODEL_H

#include <stdint.h>

struct st_gguf;
struct st_tokenizer;

/* A weight tensor inside the mapped GGUF file. Rows are ne[0] elements, `row_bytes` apart;
 * a 3-D expert tensor holds ne[2] experts of ne[1] rows each. */
struct st_weight {
  char name[96];    /* the tensor's name (a copy: GGUF strings are not NUL-terminated) */
  const void *data; /* into the read-only mapping */
  uint32_t type;    /* enum st_type */
  uint64_t ne[4];
  uint64_t row_bytes;
};

struct st_hparams {
  uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim;
  uint32_t n_expert, n_expert_used, n_ff_exp;
  uint32_t n_ctx_train, n_vocab;
  float rope_theta, rms_eps;
};

struct st_layer {
  struct st_weight attn_norm, wq, wk, wv, wo, q_norm, k_norm;
  struct st_weight ffn_norm, router, gate_exps, up_exps, down_exps;
};

struct st_model {
  struct st_gguf *gguf; /* owned */
  struct st_hparams hp;
  struct st_weight tok_embd, output_norm, output; /* output == tok_embd when tied */
  int tied_output;
  struct st_layer *layers; /* hp.n_layer entries, owned */
  struct st_tokenizer *tok; /* owned */
};

/* Loads `path`: checks the architecture is qwen3moe (else ST_EUNSUP "unsupported architecture
 * <name>"), reads the hyper-parameters, finds every tensor and checks its shape against them
 * (ST_EFORMAT naming the tensor, expected and found shapes) and its type (ST_EUNSUP
 * "unsupported tensor type <type> (id <n>) for <tensor> in <file>", st_unsupported_type), and loads
 * the tokenizer. Messages name the file (the others start with it). *out is owned by the caller: st_model_free(). */
int st_model_load(const char *path, struct st_model **out);
void st_model_free(struct st_model *m);

/* Bytes of one expert's slice of a 3-D expert tensor. */
static inline uint64_t st_expert_bytes(const struct st_weight *w) { return w->row_bytes * w->ne[1]; }
static inline const void *st_expert_ptr(const struct st_weight *w, uint32_t e) {
  return (const uint8_t *)w->data + (uint64_t)e * st_expert_bytes(w);
}

#endif
