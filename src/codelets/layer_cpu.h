/* The per-head and per-token CPU math of a qwen3moe layer, shared by the prompt-path codelets
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

/* Bytes of one KV-cache row of hd elements of kv_type (ST_TYPE_F32 or ST_TYPE_F16). */
uint64_t st_kv_row_bytes(int kv_type, int hd);

/* Stores n floats x into a KV-cache row of kv_type: copied (F32; x may be the row itself) or
 * rounded to nearest even (F16, st_f32_to_fp16 per element). */
void st_kv_store(int kv_type, const float *x, void *row, int64_t n);

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

#endif
