/* The MoE architectures strata computes, each as a description that the model loader (model.c)
 * and the graph read: which tensors a layer has, how it routes, what its attention is. Adding an
 * architecture is one entry in arch.c (and, when it brings a new kind of attention, routing or
 * activation, that kind in the kernels that compute it). Names and keys follow llama.cpp's
 * LLM_ARCH_* / LLM_KV_* / LLM_TENSOR_* tables (llama-arch.cpp) and its per-architecture graph
 * builders (src/models/<arch>.cpp), commit de3ff815ea7d. */
#ifndef ST_ARCH_H
#define ST_ARCH_H

#include <stddef.h>
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
  unsigned qk_norm_optional : 1; /* ... when the file has them (GLM-4.5 355B has none, GLM-4.5-Air has them) */
  unsigned qkv_bias : 1;     /* attn_q/k/v.bias */
  unsigned o_bias : 1;       /* attn_output.bias */
  unsigned sinks : 1;        /* attn_sinks.weight: one logit per head in the softmax's denominator */
  unsigned router_bias : 1;  /* ffn_gate_inp.bias added to the router's logits */
  unsigned expert_bias : 1;  /* ffn_{gate,up,down}_exps.bias */
  unsigned shared : 1;       /* ffn_*_shexp where expert_shared_count > 0 */
  unsigned weights_norm : 1; /* expert_weights_norm when the file has no such key */
  unsigned gpu : 1;          /* the GPU decode step's kernels compute it (graph/decode_bufs.c st_decode_gpu_arch,
                                codelets/cuda/decode.cu); without, StarPU starts no CUDA worker unless asked */
};

struct st_hparams;

/* What a tensor of a layer holds (how mkmodel fills it; the loader checks norms and biases are F32). */
enum st_tensor_kind {
  ST_TK_NORM,    /* RMSNorm weights */
  ST_TK_BIAS,    /* a bias, or the sinks, or the selection bias (F32) */
  ST_TK_MATRIX,  /* a projection into a layer's working space */
  ST_TK_OUT,     /* a projection that adds into the residual stream (attn_output, the FFNs' down) */
  ST_TK_ROUTER,  /* ffn_gate_inp (F32 in llama.cpp's files) */
};

/* One tensor a layer has: blk.N.<suffix>, its dims (ne[0] the dot product's length), where the
 * loader puts it (an offset into struct st_layer), whether it may be absent. */
struct st_layer_tensor {
  char suffix[40];
  int nd;
  uint64_t ne[3];
  uint8_t kind;     /* enum st_tensor_kind */
  uint8_t optional; /* the loader takes it when present (exp_probs_b) */
  size_t field;     /* offsetof(struct st_layer, ...) of its struct st_weight */
};
#define ST_LAYER_MAX_TENSORS 32

/* The tensors layer il of architecture A has with hyper-parameters hp (loader and mkmodel read
 * the same list), into out[ST_LAYER_MAX_TENSORS]; returns how many. Dense layers (il <
 * n_layer_dense) have the dense FFN instead of the router and experts. */
int st_arch_layer_tensors(const struct st_arch *A, const struct st_hparams *hp, uint32_t il, struct st_layer_tensor *out);

/* The description of GGUF architecture `name`, or NULL when strata does not compute it. */
const struct st_arch *st_arch_find(const char *name);

/* The description of `id` (enum st_arch_id; ST_ASSERT on an unknown one). */
const struct st_arch *st_arch_of(uint32_t id);

/* Whether the GPU decode step computes architecture `id`: its st_arch::gpu, or its name in the
 * comma-separated list of STRATA_GPU_ARCHS (doc/tuning.md: kernels written but not yet checked
 * against the architecture's fixtures on a GPU, for trying them). */
int st_arch_on_gpu(uint32_t id);

/* The names strata computes, comma-separated, for messages ("qwen3moe, deepseek2, ..."). */
const char *st_arch_names(void);

#endif
