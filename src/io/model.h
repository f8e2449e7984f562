/* A MoE model as strata computes it: hyper-parameters from the `<arch>.*` GGUF keys and the
 * tensors llama.cpp's converter writes (token_embd, output_norm, output, blk.N.attn_*,
 * blk.N.ffn_*_exps, blk.N.ffn_gate_inp, and per architecture the biases, sinks, shared experts,
 * leading dense FFNs and MLA projections). What each architecture has is a description
 * (io/arch.c, struct st_arch) that the loader and the graph read; shapes and types are checked
 * at load time so the compute kernels never see a tensor they cannot handle. */
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

/* The architectures strata computes (io/arch.h describes each). */
enum st_arch_id { ST_ARCH_QWEN3MOE, ST_ARCH_DEEPSEEK2, ST_ARCH_GPT_OSS, ST_ARCH_GLM4MOE, ST_ARCH_COUNT };

/* How a token's experts and their weights come from the router's logits z (llama.cpp's
 * expert_gating_func and its callers in build_moe_ffn). */
enum st_gating {
  ST_GATING_SOFTMAX,        /* p = softmax(z); the k largest p; weights p, renormalised when
                               expert_weights_norm (qwen3moe: always) */
  ST_GATING_SIGMOID,        /* s = sigmoid(z); selection by s + exp_probs_b within the
                               expert_group_used_count groups whose two best selection scores sum
                               highest; weights s (renormalised when expert_weights_norm), times
                               expert_weights_scale (deepseek2, glm4moe: expert_gating_func 2) */
  ST_GATING_SOFTMAX_WEIGHT, /* the k largest z (with the router bias); weights softmax over those k
                               (gpt-oss) */
};

/* The attention a layer computes. */
enum st_attn_kind {
  ST_ATTN_GQA, /* q, k, v projections, n_head_kv KV heads of head_dim, K and V cached */
  ST_ATTN_MLA, /* DeepSeek's multi-head latent attention (attn_q_a/q_b, attn_kv_a_mqa, attn_k_b,
                  attn_v_b), in the absorbed form: one cached row per token, the normed latent
                  (kv_lora_rank) then the roped key part (n_rot), which is both K and, its first
                  kv_lora_rank values, V of every head */
};

enum st_rope_kind {
  ST_ROPE_NEOX, /* rotate dims i and i + n_rot / 2 (llama.cpp's LLAMA_ROPE_TYPE_NEOX) */
  ST_ROPE_NORM, /* rotate dims 2i and 2i + 1 (LLAMA_ROPE_TYPE_NORM: deepseek2) */
};

enum st_ffn_act {
  ST_ACT_SILU,       /* silu(gate) * up */
  ST_ACT_SWIGLU_OAI, /* gpt-oss: gate = min(gate, 7), up = clamp(up, -7, 7), (up + 1) * gate * sigmoid(1.702 gate) */
};

struct st_hparams {
  uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim; /* head_dim: a cached K row's length (MLA: kv_lora + n_rot) */
  uint32_t n_expert, n_expert_used, n_ff_exp;
  uint32_t n_ctx_train, n_vocab;
  float rope_theta, rms_eps;
  /* what the architecture adds (qwen3moe: the zero values, except n_rot = head_dim) */
  uint32_t arch;             /* enum st_arch_id */
  uint32_t attn_kind;        /* enum st_attn_kind */
  uint32_t rope_kind;        /* enum st_rope_kind */
  uint32_t n_rot;            /* dims RoPE rotates (rope.dimension_count; partial rotary below head_dim) */
  float yarn_factor;         /* rope.scaling.factor with rope.scaling.type yarn, else 0 (no YaRN) */
  uint32_t yarn_orig_ctx;    /* rope.scaling.original_context_length */
  float yarn_beta_fast, yarn_beta_slow;
  float rope_mscale;         /* RoPE's cos and sin are scaled by it (llama.cpp's YaRN attention factor
                                times its rope_yarn correction: 1 + 0.1 ln factor for gpt-oss, 1 without
                                YaRN and for deepseek2, whose correction goes into kq_scale) */
  float kq_scale;            /* scale of q.k before the softmax: 1 / sqrt(the unabsorbed key length),
                                deepseek2 with YaRN times mscale^2 (1 + 0.1 mscale_all_dim ln factor)^2 */
  uint32_t head_dim_v;       /* a head's attention output (MLA: value_length_mla; else head_dim) */
  uint32_t n_swa;            /* sliding_window in tokens on the sliding layers (0: none) */
  uint32_t swa_pattern;      /* layer l slides when l % swa_pattern < swa_pattern - 1 (llama.cpp's) */
  uint32_t n_layer_dense;    /* leading_dense_block_count: layers 0.. with a dense FFN and no experts */
  uint32_t n_ff;             /* feed_forward_length: the dense layers' FFN */
  uint32_t n_ff_shexp;       /* the shared expert's FFN (0: none) */
  uint32_t gating;           /* enum st_gating */
  uint32_t n_group, n_group_used; /* expert_group_count / _used_count (0: no groups) */
  float w_scale;             /* expert_weights_scale (1 when absent) */
  int w_norm;                /* expert_weights_norm */
  uint32_t ffn_act;          /* enum st_ffn_act */
  /* MLA */
  uint32_t q_lora, kv_lora, qk_nope;
};

/* An absent tensor has data NULL (and ne zero). */
struct st_layer {
  struct st_weight attn_norm, wq, wk, wv, wo, q_norm, k_norm;
  struct st_weight ffn_norm, router, gate_exps, up_exps, down_exps;
  /* per architecture (io/arch.c) */
  struct st_weight bq, bk, bv, bo, sinks;               /* gpt-oss, glm4moe: biases; gpt-oss: one sink logit per head */
  struct st_weight router_b, probs_b;                   /* ffn_gate_inp.bias (gpt-oss), exp_probs_b.bias (selection bias) */
  struct st_weight gate_exps_b, up_exps_b, down_exps_b; /* gpt-oss: [n_expert][rows] */
  struct st_weight ffn_gate, ffn_up, ffn_down;          /* a leading dense layer's FFN */
  struct st_weight gate_shexp, up_shexp, down_shexp;    /* the shared expert */
  struct st_weight wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, wk_b, wv_b; /* MLA */
  int dense;                                            /* no router, no experts: the dense FFN */
  int swa;                                              /* sliding-window attention */
};

struct st_model {
  struct st_gguf *gguf; /* owned */
  struct st_hparams hp;
  struct st_weight tok_embd, output_norm, output; /* output == tok_embd when tied */
  int tied_output;
  struct st_layer *layers; /* hp.n_layer entries, owned */
  struct st_tokenizer *tok; /* owned */
};

/* Loads `path`: checks the architecture is one io/arch.h describes (else ST_EUNSUP "unsupported
 * architecture <name>"), reads the hyper-parameters, finds every tensor and checks its shape against them
 * (ST_EFORMAT naming the tensor, expected and found shapes) and its type (ST_EUNSUP
 * "unsupported tensor type <type> (id <n>) for <tensor> in <file>", st_unsupported_type), and loads
 * the tokenizer. Messages name the file (the others start with it). *out is owned by the caller: st_model_free(). */
int st_model_load(const char *path, struct st_model **out);

/* The same checks on an opened GGUF (st_gguf_open or st_gguf_open_buffer: the fuzz target), which
 * the model owns from then on, also on failure (closed with it). Messages do not name the file. */
int st_model_from_gguf(struct st_gguf *g, struct st_model **out);
void st_model_free(struct st_model *m);

/* Bytes of one expert's slice of a 3-D expert tensor. */
static inline uint64_t st_expert_bytes(const struct st_weight *w) { return w->row_bytes * w->ne[1]; }
static inline const void *st_expert_ptr(const struct st_weight *w, uint32_t e) {
  return (const uint8_t *)w->data + (uint64_t)e * st_expert_bytes(w);
}

#endif
