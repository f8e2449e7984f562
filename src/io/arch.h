/* The MoE architectures strata computes, each as a description that the model loader (model.c)
 * and the graph read: which tensors a layer has, how it routes, what its attention is. Adding an
 * architecture is one entry in arch.c (and, when it brings a new kind of attention, routing or
 * activation, that kind in the kernels that compute it). Names and keys follow llama.cpp's
 * LLM_ARCH_* / LLM_KV_* / LLM_TENSOR_* tables (llama-arch.cpp) and its per-architecture graph
 * builders (src/models/<arch>.cpp), commit de3ff815ea7d. */
#ifndef ST_ARCH_H
#define ST_ARCH_H

#include <stdint.h>

struct st_arch {
  const char *name;          /* general.architecture, and the prefix of its hyper-parameter keys */
  uint32_t id;               /* enum st_arch_id (model.h) */
  uint32_t attn_kind;        /* enum st_attn_kind */
  uint32_t rope_kind;        /* enum st_rope_kind */
  uint32_t gating;           /* enum st_gating when the file has no expert_gating_func key */
  uint32_t ffn_act;          /* enum st_ffn_act */
  const char *ffn_norm;      /* the FFN norm's tensor: "ffn_norm" or "post_attention_norm" */
  uint32_t swa_pattern;      /* sliding layers every swa_pattern layers (llama.cpp's set_swa_pattern); 0: none */
  unsigned qk_norm : 1;      /* attn_q_norm / attn_k_norm, per head, before RoPE */
  unsigned qkv_bias : 1;     /* attn_q/k/v.bias */
  unsigned o_bias : 1;       /* attn_output.bias */
  unsigned sinks : 1;        /* attn_sinks.weight: one logit per head in the softmax's denominator */
  unsigned router_bias : 1;  /* ffn_gate_inp.bias added to the router's logits */
  unsigned expert_bias : 1;  /* ffn_{gate,up,down}_exps.bias */
  unsigned shared : 1;       /* ffn_*_shexp where expert_shared_count > 0 */
  unsigned weights_norm : 1; /* expert_weights_norm when the file has no such key */
};

/* The description of GGUF architecture `name`, or NULL when strata does not compute it. */
const struct st_arch *st_arch_find(const char *name);

/* The description of `id` (enum st_arch_id; ST_ASSERT on an unknown one). */
const struct st_arch *st_arch_of(uint32_t id);

/* The names strata computes, comma-separated, for messages ("qwen3moe, deepseek2, ..."). */
const char *st_arch_names(void);

#endif
