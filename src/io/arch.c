/* The architecture descriptions (arch.h). Sources per entry: llama.cpp's graph builder for the
 * architecture (src/models/<arch>.cpp) and its hyper-parameter loading (llama-model.cpp), which
 * decide what strata computes; Hugging Face transformers' modelling files for the same models
 * agree with them on the fixtures (../shared/fixtures/README.md, archs/). */
#include "io/arch.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "io/model.h"

static const struct st_arch archs[ST_ARCH_COUNT] = {
    /* Qwen3-MoE: GQA with per-head q/k RMSNorm, NEOX RoPE, softmax routing renormalised over the k */
    {.name = "qwen3moe", .id = ST_ARCH_QWEN3MOE, .attn_kind = ST_ATTN_GQA, .rope_kind = ST_ROPE_NEOX,
     .gating = ST_GATING_SOFTMAX, .ffn_act = ST_ACT_SILU, .ffn_norm = "ffn_norm", .qk_norm = 1, .weights_norm = 1,
     .gpu = 1},
    /* DeepSeek-V2/V3, Kimi K2: MLA, normal (adjacent-pair) RoPE on the key's rope part, leading
     * dense layers, shared experts; softmax gating unless expert_gating_func says sigmoid (V3) */
    {.name = "deepseek2", .id = ST_ARCH_DEEPSEEK2, .attn_kind = ST_ATTN_MLA, .rope_kind = ST_ROPE_NORM,
     .gating = ST_GATING_SOFTMAX, .ffn_act = ST_ACT_SILU, .ffn_norm = "ffn_norm", .shared = 1,
     .gpu = 1 /* mla.cuh: the fixtures on CUDA0 and the gates passed on an H200, 2026-12-05 */},
    /* gpt-oss: GQA with biases and sinks, sliding window on every other layer (the even ones),
     * NEOX RoPE with YaRN, router bias, top-k of the logits then a softmax over them, expert
     * biases and the clamped SwiGLU */
    {.name = "gpt-oss", .id = ST_ARCH_GPT_OSS, .attn_kind = ST_ATTN_GQA, .rope_kind = ST_ROPE_NEOX,
     .gating = ST_GATING_SOFTMAX_WEIGHT, .ffn_act = ST_ACT_SWIGLU_OAI, .ffn_norm = "post_attention_norm",
     .swa_pattern = 2, .qkv_bias = 1, .o_bias = 1, .sinks = 1, .router_bias = 1, .expert_bias = 1,
     .gpu = 1},
    /* GLM-4.5 / 4.6: GQA with q/k/v biases and q/k norm, partial NEOX RoPE, leading dense layers,
     * a shared expert, sigmoid gating with the correction bias and groups */
    {.name = "glm4moe", .id = ST_ARCH_GLM4MOE, .attn_kind = ST_ATTN_GQA, .rope_kind = ST_ROPE_NEOX,
     .gating = ST_GATING_SIGMOID, .ffn_act = ST_ACT_SILU, .ffn_norm = "post_attention_norm", .qk_norm = 1,
     .qk_norm_optional = 1, .qkv_bias = 1, .shared = 1, .weights_norm = 1,
     .gpu = 1 /* the fixtures on CUDA0 and the gates passed on an H200, 2026-12-05 */},
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

int st_arch_on_gpu(uint32_t id) {
  const struct st_arch *A = st_arch_of(id);
  if (A->gpu) return 1;
  const char *list = getenv("STRATA_GPU_ARCHS");
  const size_t n = strlen(A->name);
  for (const char *p = list; p && *p;) {
    const char *end = strchr(p, ',');
    const size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && !strncmp(p, A->name, n)) return 1;
    p = end ? end + 1 : NULL;
  }
  return 0;
}

const char *st_arch_names(void) { return "qwen3moe, deepseek2, gpt-oss, glm4moe"; }

int st_arch_layer_tensors(const struct st_arch *A, const struct st_hparams *hp, uint32_t il, struct st_layer_tensor *out) {
  const uint64_t d = hp->n_embd, nh = hp->n_head, hd = hp->head_dim, E = hp->n_expert, ff = hp->n_ff_exp;
  const uint64_t q = nh * hd, kv = (uint64_t)hp->n_head_kv * hd, o_in = nh * hp->head_dim_v;
  int n = 0;
#define T(suffix_, nd_, kind_, opt_, field_, ...)                                                                   \
  do {                                                                                                             \
    ST_ASSERT(n < ST_LAYER_MAX_TENSORS);                                                                           \
    out[n] = (struct st_layer_tensor){.nd = nd_, .ne = {__VA_ARGS__}, .kind = kind_, .optional = opt_,             \
                                      .field = offsetof(struct st_layer, field_)};                                 \
    snprintf(out[n++].suffix, sizeof out[0].suffix, "%s", suffix_);                                                \
  } while (0)
  T("attn_norm.weight", 1, ST_TK_NORM, 0, attn_norm, d);
  if (A->attn_kind == ST_ATTN_MLA) {
    const uint64_t qk = hp->qk_nope + hp->n_rot;
    if (hp->q_lora) {
      T("attn_q_a.weight", 2, ST_TK_MATRIX, 0, wq_a, d, hp->q_lora);
      T("attn_q_a_norm.weight", 1, ST_TK_NORM, 0, q_a_norm, hp->q_lora);
      T("attn_q_b.weight", 2, ST_TK_MATRIX, 0, wq_b, hp->q_lora, nh * qk);
    } else {
      T("attn_q.weight", 2, ST_TK_MATRIX, 0, wq, d, nh * qk);
    }
    T("attn_kv_a_mqa.weight", 2, ST_TK_MATRIX, 0, wkv_a, d, hp->kv_lora + hp->n_rot);
    T("attn_kv_a_norm.weight", 1, ST_TK_NORM, 0, kv_a_norm, hp->kv_lora);
    T("attn_k_b.weight", 3, ST_TK_MATRIX, 0, wk_b, hp->qk_nope, hp->kv_lora, nh);
    T("attn_v_b.weight", 3, ST_TK_MATRIX, 0, wv_b, hp->kv_lora, hp->head_dim_v, nh);
  } else {
    T("attn_q.weight", 2, ST_TK_MATRIX, 0, wq, d, q);
    T("attn_k.weight", 2, ST_TK_MATRIX, 0, wk, d, kv);
    T("attn_v.weight", 2, ST_TK_MATRIX, 0, wv, d, kv);
    if (A->qk_norm) {
      T("attn_q_norm.weight", 1, ST_TK_NORM, A->qk_norm_optional, q_norm, hd);
      T("attn_k_norm.weight", 1, ST_TK_NORM, A->qk_norm_optional, k_norm, hd);
    }
    if (A->qkv_bias) {
      T("attn_q.bias", 1, ST_TK_BIAS, 0, bq, q);
      T("attn_k.bias", 1, ST_TK_BIAS, 0, bk, kv);
      T("attn_v.bias", 1, ST_TK_BIAS, 0, bv, kv);
    }
    if (A->sinks) T("attn_sinks.weight", 1, ST_TK_BIAS, 0, sinks, nh);
  }
  T("attn_output.weight", 2, ST_TK_OUT, 0, wo, o_in, d);
  if (A->o_bias) T("attn_output.bias", 1, ST_TK_BIAS, 0, bo, d);
  char norm[40];
  snprintf(norm, sizeof norm, "%s.weight", A->ffn_norm);
  T(norm, 1, ST_TK_NORM, 0, ffn_norm, d);
  if (il < hp->n_layer_dense) {
    T("ffn_gate.weight", 2, ST_TK_MATRIX, 0, ffn_gate, d, hp->n_ff);
    T("ffn_up.weight", 2, ST_TK_MATRIX, 0, ffn_up, d, hp->n_ff);
    T("ffn_down.weight", 2, ST_TK_OUT, 0, ffn_down, hp->n_ff, d);
    return n;
  }
  T("ffn_gate_inp.weight", 2, ST_TK_ROUTER, 0, router, d, E);
  if (A->router_bias) T("ffn_gate_inp.bias", 1, ST_TK_BIAS, 0, router_b, E);
  /* the selection bias (e_score_correction_bias): DeepSeek-V3 and GLM-4.5 files have it */
  if (hp->gating == ST_GATING_SIGMOID) T("exp_probs_b.bias", 1, ST_TK_BIAS, 1, probs_b, E);
  T("ffn_gate_exps.weight", 3, ST_TK_MATRIX, 0, gate_exps, d, ff, E);
  T("ffn_up_exps.weight", 3, ST_TK_MATRIX, 0, up_exps, d, ff, E);
  T("ffn_down_exps.weight", 3, ST_TK_OUT, 0, down_exps, ff, d, E);
  if (A->expert_bias) {
    T("ffn_gate_exps.bias", 2, ST_TK_BIAS, 0, gate_exps_b, ff, E);
    T("ffn_up_exps.bias", 2, ST_TK_BIAS, 0, up_exps_b, ff, E);
    T("ffn_down_exps.bias", 2, ST_TK_BIAS, 0, down_exps_b, d, E);
  }
  if (hp->n_ff_shexp) {
    T("ffn_gate_shexp.weight", 2, ST_TK_MATRIX, 0, gate_shexp, d, hp->n_ff_shexp);
    T("ffn_up_shexp.weight", 2, ST_TK_MATRIX, 0, up_shexp, d, hp->n_ff_shexp);
    T("ffn_down_shexp.weight", 2, ST_TK_OUT, 0, down_shexp, hp->n_ff_shexp, d);
  }
#undef T
  return n;
}
