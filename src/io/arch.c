/* The architecture descriptions (arch.h). Sources per entry: llama.cpp's graph builder for the
 * architecture (src/models/<arch>.cpp) and its hyper-parameter loading (llama-model.cpp), which
 * decide what strata computes; Hugging Face transformers' modelling files for the same models
 * agree with them on the fixtures (../shared/fixtures/README.md, archs/). */
#include "io/arch.h"

#include <string.h>

#include "common.h"
#include "io/model.h"

static const struct st_arch archs[ST_ARCH_COUNT] = {
    /* Qwen3-MoE: GQA with per-head q/k RMSNorm, NEOX RoPE, softmax routing renormalised over the k */
    {.name = "qwen3moe", .id = ST_ARCH_QWEN3MOE, .attn_kind = ST_ATTN_GQA, .rope_kind = ST_ROPE_NEOX,
     .gating = ST_GATING_SOFTMAX, .ffn_act = ST_ACT_SILU, .ffn_norm = "ffn_norm", .qk_norm = 1, .weights_norm = 1},
    /* DeepSeek-V2/V3, Kimi K2: MLA, normal (adjacent-pair) RoPE on the key's rope part, leading
     * dense layers, shared experts; softmax gating unless expert_gating_func says sigmoid (V3) */
    {.name = "deepseek2", .id = ST_ARCH_DEEPSEEK2, .attn_kind = ST_ATTN_MLA, .rope_kind = ST_ROPE_NORM,
     .gating = ST_GATING_SOFTMAX, .ffn_act = ST_ACT_SILU, .ffn_norm = "ffn_norm", .shared = 1},
    /* gpt-oss: GQA with biases and sinks, sliding window on every other layer (the even ones),
     * NEOX RoPE with YaRN, router bias, top-k of the logits then a softmax over them, expert
     * biases and the clamped SwiGLU */
    {.name = "gpt-oss", .id = ST_ARCH_GPT_OSS, .attn_kind = ST_ATTN_GQA, .rope_kind = ST_ROPE_NEOX,
     .gating = ST_GATING_SOFTMAX_WEIGHT, .ffn_act = ST_ACT_SWIGLU_OAI, .ffn_norm = "post_attention_norm",
     .swa_pattern = 2, .qkv_bias = 1, .o_bias = 1, .sinks = 1, .router_bias = 1, .expert_bias = 1},
    /* GLM-4.5 / 4.6: GQA with q/k/v biases and q/k norm, partial NEOX RoPE, leading dense layers,
     * a shared expert, sigmoid gating with the correction bias and groups */
    {.name = "glm4moe", .id = ST_ARCH_GLM4MOE, .attn_kind = ST_ATTN_GQA, .rope_kind = ST_ROPE_NEOX,
     .gating = ST_GATING_SIGMOID, .ffn_act = ST_ACT_SILU, .ffn_norm = "post_attention_norm", .qk_norm = 1,
     .qkv_bias = 1, .shared = 1, .weights_norm = 1},
};

const struct st_arch *st_arch_find(const char *name) {
  for (int i = 0; i < ST_ARCH_COUNT; i++)
    if (!strcmp(archs[i].name, name)) return &archs[i];
  return NULL;
}

const struct st_arch *st_arch_of(uint32_t id) {
  ST_ASSERT(id < ST_ARCH_COUNT);
  return &archs[id];
}

const char *st_arch_names(void) { return "qwen3moe, deepseek2, gpt-oss, glm4moe"; }
