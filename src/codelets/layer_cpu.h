/* The per-head and per-token CPU math of a MoE layer (qwen3moe, and what the other architectures of
 * io/arch.h add: partial, normal-order and YaRN RoPE, sinks, sliding windows, other routings), shared by the prompt-path codelets
 * (attention.c, router.c) and the decode lanes (decode_lane.c), so that a token computed either
 * way gives the same bits. */
#ifndef ST_LAYER_CPU_H
#define ST_LAYER_CPU_H

#include "codelets/codelets.h"

/* NEOX RoPE of one head in place: v[i] and v[i + hd/2] rotated by pos * theta^(-2i/hd) (the
 * rotation llama.cpp applies for qwen3moe, LLAMA_ROPE_TYPE_NEOX). hd even. */
void st_rope_neox(float *v, int hd, int pos, float theta);

/* The same in two steps, for several heads at one position: st_rope_table writes the hd / 2
 * (cos, sin) pairs of pos into cs [hd], st_rope_apply rotates one head with them (st_rope_neox's
 * bits). */
void st_rope_table(float *cs, int hd, int pos, float theta);
void st_rope_apply(float *v, int hd, const float *cs);

/* RoPE as an architecture configures it (llama.cpp's ggml_rope_ext): the first n_rot dims of a
 * head rotate, NEOX (i with i + n_rot / 2) or normal (2i with 2i + 1) order, by pos * theta^(-2i /
 * n_rot); with YaRN (freq_scale < 1, ext_factor 1) each pair's angle mixes the interpolated and
 * extrapolated ones by the ramp between corr0 and corr1, and cos and sin are scaled by mscale
 * (ggml's rope_yarn, ggml_rope_yarn_corr_dims). */
struct st_rope_conf {
  int n_rot, neox;
  float theta;
  int yarn;                  /* 0: plain RoPE (st_rope_table's bits) */
  float freq_scale, corr0, corr1, mscale;
};

/* The configuration of n_rot dims, base theta, kind neox or normal; YaRN when yarn_factor > 0 with
 * the original context and the two betas (llama.cpp's defaults: 32 and 1); cos and sin times
 * mscale (model.h's rope_mscale; 1: plain RoPE's bits). */
void st_rope_conf_init(struct st_rope_conf *rc, int n_rot, int neox, float theta, float yarn_factor, int orig_ctx,
                       float beta_fast, float beta_slow, float mscale);

/* The n_rot / 2 (cos, sin) pairs of pos into cs [n_rot]; plain NEOX RoPE gives st_rope_table's bits. */
void st_rope_conf_table(float *cs, const struct st_rope_conf *rc, int pos);

/* Rotates the first n_rot dims of one head with a table from st_rope_conf_table (NEOX: st_rope_apply's bits). */
void st_rope_conf_apply(float *v, const struct st_rope_conf *rc, const float *cs);

/* What an attention call adds to st_attend_tokens' causal softmax: the q.k scale, the value rows'
 * length and stride (MLA reads V as the first hd_v values of the cached K rows), one sink logit
 * per query head in the denominator (gpt-oss; NULL none), a sliding window (token at position p
 * sees keys p - window + 1 .. p; 0 none). */
struct st_attn_conf {
  float scale;
  int hd_v;            /* values per output row */
  int v_row;           /* elements between two V rows (hd_v or more) */
  const float *sinks;  /* [nq] or NULL */
  int window;
  int ring;            /* rows of the K and V planes: key j at row j % ring (a sliding layer's ring
                          buffer; 0 or at least every position: row j) */
};

/* st_attend_tokens with an st_attn_conf (out [T][nq][hd_v]); with conf {1 / sqrtf(hd), hd, hd,
 * NULL, 0, 0} it is st_attend_tokens, bit for bit, and a ring gives the same bits as a full cache. */
void st_attend_tokens_conf(const float *q, int T, int nq, int hd, int pos0, int kv_type, const void *kc, const void *vc,
                           float *out, float *score, int64_t score_floats, const struct st_attn_conf *ac);

/* Bytes of one KV-cache row of hd elements of kv_type: ST_TYPE_F32 or ST_TYPE_F16, or ST_TYPE_Q8_0
 * (hd a multiple of 32): the q8_0 cache's row, hd int8 quants q and then hd / 32 fp16 scales d, value
 * i = d[i / 32] q[i], each 32 quantised as ggml's Q8_0 (st_quantize_row_q8_0: d = max|x| / 127, q =
 * round(x / d)) but the quants and scales apart, so that a GPU reads 8 quants with one aligned load
 * (1.0625 bytes a value, as llama.cpp's -ctk q8_0). */
uint64_t st_kv_row_bytes(int kv_type, int hd);

/* Stores n floats x (n / hd rows of hd) into KV-cache rows of kv_type from `row` (st_kv_row_bytes
 * apart): copied (F32; x may be the row itself), rounded to nearest even (F16, st_f32_to_fp16 per
 * element) or quantised (Q8_0). */
void st_kv_store(int kv_type, const float *x, void *row, int64_t n, int hd);

/* The n values (n / hd rows of hd) of KV-cache rows of kv_type from `row` as floats, exactly
 * (st_kv_store's inverse up to its rounding). */
void st_kv_load(int kv_type, const void *row, float *x, int64_t n, int hd);

/* Causal softmax attention of one query head qh [hd] over the first n_keys rows of the head's
 * K and V caches (kc, vc [n_keys][hd] of kv_type: ST_TYPE_F32 or ST_TYPE_F16, read back to
 * float32): scores scaled by 1/sqrt(hd), softmax (sum in double), o [hd] = sum of p_j v_j in key
 * order. score: n_keys floats of caller scratch. */
void st_attend_head(const float *qh, int kv_type, const void *kc, const void *vc, int n_keys, int hd, float *score,
                    float *o);

/* The same for T tokens at positions pos0.. of nq query heads each (q and out [T][nq][hd]; token
 * t sees the first pos0 + t + 1 keys), in tiles of tokens whose scores fit score_floats (caller
 * scratch of at least pos0 + T floats): the scores of a tile in one st_matmul, P V with each V row
 * read once per tile. Every (token, head) row gets st_attend_head's bits: the same scores, the
 * same softmax, its P V added in key order with st_axpy. */
void st_attend_tokens(const float *q, int T, int nq, int hd, int pos0, int kv_type, const void *kc, const void *vc,
                      float *out, float *score, int64_t score_floats);

/* One token's routing from its E router logits (overwritten with the softmax): softmax, top-k
 * by selection (highest first, ties to the lower expert id), weights renormalised to sum to 1
 * (qwen3moe's norm_topk_prob). r: k entries. With non-finite logits the weights are NaN. */
void st_route_topk(float *logits, int E, int k, struct st_route *r);

/* A token's routing by the other gatings of model.h (ST_GATING_SIGMOID with selection bias `bias`
 * (NULL: none) and groups n_group / n_group_used (0: none); ST_GATING_SOFTMAX_WEIGHT;
 * ST_GATING_SOFTMAX without renormalisation), then weights renormalised when w_norm (sum clamped
 * at 6.103515625e-5 as llama.cpp's) and times w_scale; ties go to the lower expert id; `logits`
 * [E] is overwritten. For ST_GATING_SOFTMAX with w_norm and w_scale 1 it is st_route_topk. */
void st_route_gated(float *logits, int E, int k, int gating, const float *bias, int n_group, int n_group_used, int w_norm,
                    float w_scale, struct st_route *r);

/* gpt-oss's clamped SwiGLU of n gate and up values (limit 7, alpha 1.702): out[i] = (clamp(u, -7, 7)
 * + 1) * g' * sigmoid(1.702 g'), g' = min(g, 7) (llama.cpp's swiglu_oai). */
void st_swiglu_oai(const float *g, const float *u, float *out, int64_t n);

#endif
