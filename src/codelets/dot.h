/* Dot products and row-block matrix products of quantised weights with float32 activations,
 * the CPU kernels every codelet builds on. Weights are dequantised on the fly (F32, F16, BF16,
 * Q8_0: w = d * q; with AVX2 or AVX-512 every block format of quant.h (Q4_0..Q5_1, Q2_K..Q6_K,
 * IQ4_NL, IQ4_XS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) decoded in SIMD registers, each weight equal to
 * st_dequantize_row's; the scalar path decodes them with st_dequantize_row one weight row at a
 * time), multiplied in float32 and accumulated in float32 SIMD lanes.
 * Determinism: the result for one (weight row, activation row) pair depends only on those two
 * rows, never on how many rows or tokens a call covers, so logits do not depend on the prompt
 * chunk size, the task slicing or the StarPU worker a task runs on. */
#ifndef ST_DOT_H
#define ST_DOT_H

#include <stdint.h>

/* Which SIMD path the kernels use on this CPU: "avx512", "avx2" or "scalar". */
const char *st_dot_isa(void);

/* Forces a SIMD path (for tests): 0 scalar, 1 avx2, 2 avx512, 3 avx512 with the integer kernels
 * also using VBMI (needs AVX-512 VNNI, VBMI and GFNI; the float kernels run as at 2); ignored when
 * unsupported. Returns the path in use afterwards. */
int st_dot_force_isa(int level);

/* out[t * ldo + (r - r0)] = dot(W[r], x[t * ldx .. + n]) for r in [r0, r1), t in [0, T).
 * W: rows of `n` elements of `type` (any type st_type_info marks computed), `row_bytes` apart.
 * n must be a multiple of the type's block size. */
void st_matmul(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1,
               const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo);

/* ---- integer dot products on quantised activations (STRATA_INT8_DOT, doc/tuning.md) ----------
 * The activations of a call are quantised once to int8 per token row, and each weight block's
 * integer quants are multiplied with them in integer arithmetic (AVX-512 VNNI vpdpbusd/vpdpwssd,
 * AVX2 vpmaddubsw + vpmaddwd, or scalar), as ggml's CPU backend does (ggml-quants.c
 * quantize_row_q8_0 / quantize_row_q8_K and the vec_dot_*_q8_* kernels). Two activation layouts
 * (the grid formats' rows also carry a plane-order copy, st_q8_row_bytes):
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL weights pair with blocks of 32 (st_act_q8_0: one float
 * scale; Q4_1's and Q5_1's min term uses the sums of the activation quants, eight at a time);
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S weights with super-blocks
 * of 256 (st_act_q8_K: one float scale and the per-16 sums of the quants, which carry the K
 * formats' min and offset terms; the grid i-quants multiply their unsigned grid magnitudes with
 * the activation quants signed by the weights' sign bits).
 * Determinism: integer sums are exact; the float part (one scale product per block or
 * super-block, fmaf into fixed accumulators, a fixed reduction tree) is written the same way in
 * every ISA, so scalar, AVX2 and AVX-512 VNNI give the same bits, and a (weight row, token) pair's
 * result does not depend on the token count. Cost: the activations carry ~1/254 of their block's
 * max |x| of rounding error (about 1e-3 relative on a dot product; tests/test_quant prints it). */
typedef struct {
  float d;        /* x ≈ d * qs */
  int8_t qs[32];
} st_act_q8_0;
typedef struct {
  float d;
  int8_t qs[256];
  int16_t bsums[16]; /* sum of qs[16k .. 16k + 15] */
} st_act_q8_K;

/* Bytes of one activation row of `n` elements quantised for weights of `type`: n / 32 *
 * sizeof(st_act_q8_0) or n / 256 * sizeof(st_act_q8_K), for the grid formats (IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S) plus 256 bytes per super-block (the same quants in the plane order the AVX2
 * and AVX-512 kernels read: after the blocks, byte 64 q + k of super-block b's 256 is its quant
 * 4 k + q), for IQ2_XXS, IQ1_S and IQ1_M plus n bytes and n / 32 floats (the quants and the block
 * scales again, contiguous, for the AVX-512 kernel); 0 when `type` has no integer kernel or n is not a multiple of its block size
 * (callers then use st_matmul). */
uint64_t st_q8_row_bytes(uint32_t type, int64_t n);

/* Quantises T rows of n floats (x[t * ldx ..]) for weights of `type` into xq (T rows of
 * st_q8_row_bytes(type, n) bytes, caller-owned): per block d = max|x| / 127, q = round(x / d).
 * The same float operations at every ISA (built without FMA contraction), so every kernel sees
 * the same quants. */
void st_quantize_act(uint32_t type, const float *x, int64_t ldx, int64_t T, int64_t n, void *xq);

/* The float values one quantised activation row stands for (d * q), for tests. */
void st_dequantize_act(uint32_t type, const void *xq, float *out, int64_t n);

/* The second term of two-term int8 activations: the rows' rounding error r = x - d q (q, d:
 * st_quantize_act's rows xq of the same x; each product and difference rounded to float)
 * quantised by st_quantize_act into xr (caller-owned, xq's layout). Then x ≈ d q + d' q' within
 * d' / 2 per element, at most max|x| / 64,516 in a block (xq alone: max|x| / 254). `type` as
 * st_quantize_act's (blocks of 32 or super-blocks of 256, as the type's rows are quantised). */
void st_quantize_act_residual(uint32_t type, const float *x, int64_t ldx, int64_t T, int64_t n, const void *xq,
                              void *xr);

/* st_matmul_q8 on two-term activations: out[t * ldo + (r - r0)] = W[r]·xq[t] + W[r]·xr[t] (each
 * product st_matmul_q8's, then one float addition), so the same bits at every ISA level and for
 * any rows or token count. Where the activations' rounding would stay in the KV cache (K and V,
 * st_dense_q8's weights) this keeps float32's precision in practice at the integer kernels'
 * speed (twice their work; tests/test_quant prints its error against float64). */
void st_matmul_q8_2(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1, const void *xq,
                    const void *xr, int64_t T, int64_t n, float *out, int64_t ldo);

/* As st_matmul, with the activations quantised by st_quantize_act (rows st_q8_row_bytes(type, n)
 * bytes apart): out[t * ldo + (r - r0)] = dot(W[r], xq[t]). `type` must have
 * st_q8_row_bytes(type, n) > 0. */
void st_matmul_q8(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1, const void *xq,
                  int64_t T, int64_t n, float *out, int64_t ldo);

/* The integer kernels st_matmul_q8 uses at the current level: "avx512vbmi" (level 3: AVX-512
 * VNNI, VBMI and GFNI; the grids of IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S through byte permutes, or the
 * lookups st_dot_grid_lookup chooses; the IQ2_XS/IQ3_XXS sign parity through gf2p8affineqb),
 * "avx512vnni" (level 2 on a CPU with AVX-512 VNNI), "avx2" (level 2 without VNNI, or level 1)
 * or "scalar". */
const char *st_dot_q8_isa(void);

/* How the level-3 ("avx512vbmi") integer kernels look up the grids: 0 two-source byte permutes
 * (vpermi2b over the grids' byte planes); 1 the IQ2_XS and IQ2_S grids by gathers (vpgatherdd of
 * each entry's code word from a table of 32-bit words, 16 entries per instruction) and the
 * IQ3_XXS and IQ3_S grids by pairs of one-source vpermb (on the Xeons one vpermi2b is three uops,
 * two on port 5; one vpermb is one). Both give the same bits. Default: 1 on Intel CPUs with AMX,
 * Sapphire Rapids and later (the GPU host's Xeon, 16 threads, against 0 in the same binary: IQ2_S
 * 1.7-1.9 times, IQ2_XS 1.1-1.2 times, IQ3_S 1.0-1.3 times, IQ3_XXS 1.0-1.2 times), 0 elsewhere
 * (on Zen 4 both are slower: gathers 1.3-1.9 times, vpermb pairs 1.1 times; Ice Lake's gathers
 * carry the Gather Data Sampling mitigation and were not measured); bench/RESULTS.md, sessions 7
 * and 8. mode 0 or 1 sets it (for tests and `strata bench --grid-lookup`), anything else leaves
 * it; returns the mode in use. Safe to call from several threads. */
int st_dot_grid_lookup(int mode);

/* How the AVX-512 integer kernels ("avx512vnni", "avx512vbmi") of the K and grid formats (Q2_K ..
 * Q6_K, IQ4_XS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) walk the rows of one or two tokens: 1 two rows in
 * step (each super-block of row r, then the same of row r + 1); 0 one row at a time. Both give the
 * same bits. Default: 1 on Intel CPUs (measured on the GPU host's Sapphire-Rapids-class Xeon only:
 * the same GB/s at 16 threads, up to 1.17 times at one thread), 0 elsewhere (Zen 4, streaming from
 * memory: one row at a time reads the K formats 1.3-1.8 times and the grid formats 1.0-1.3 times
 * faster at one and two threads; its hardware prefetchers keep up with one stream per thread but
 * not with two interleaved); bench/RESULTS.md, session 9. mode 0 or 1 sets it (for
 * tests and `strata bench --row-pairs`), anything else leaves it; returns the mode in use. Safe to
 * call from several threads. */
int st_dot_row_pairs(int mode);

/* o[i] += a * v[i] for i < n, as a product and then a sum (never fused), so that every SIMD
 * level gives the bits of the plain C loop `o[i] = o[i] + a * v[i]`: attention's P V. */
void st_axpy(float *o, float a, const float *v, int64_t n);

/* st_axpy with v [n] IEEE halves (a half KV cache's V row), each widened exactly to float32:
 * the bits of `o[i] = o[i] + a * (float)v[i]` at every SIMD level. */
void st_axpy_f16(float *o, float a, const uint16_t *v, int64_t n);

/* st_axpy with v the n values (a multiple of 32) of a q8_0 KV cache's row (st_kv_row_bytes): int8
 * quants q and fp16 scales d, value i = d[i / 32] q[i]; the bits of `o[i] = o[i] + a * (d * q[i])` at
 * every SIMD level, d widened to float32 (d * q is exact). */
void st_axpy_kv_q8(float *o, float a, const int8_t *q, const uint16_t *d, int64_t n);

/* Attention scores on a q8_0 KV cache: out[r ldo + j] = the dot product of query row r (x + r ldx,
 * hd floats) with key j (the row k + j rb: hd int8 quants, then hd / 32 fp16 scales; value i =
 * d[i / 32] q[i]), for r < R, j < n_keys: st_matmul's float kernels reading the rows in place, so
 * the bits of st_matmul on the same values as ggml's Q8_0 blocks (the same at every SIMD level,
 * whatever R or the keys' range). hd a multiple of 32. */
void st_kv_q8_scores(const uint8_t *k, uint64_t rb, int64_t n_keys, const float *x, int64_t ldx, int64_t R, int hd,
                     float *out, int64_t ldo);

/* Whether MLA's query matrices (q_a, q_b, or wq; decode and prompt lanes) take one-term int8
 * activations: int8 (STRATA_INT8_DOT) and Q8_0 weights. The other dense products follow
 * st_dense_terms. */
int st_dense_q8(uint32_t type, int64_t n, int int8);

/* The CPU's dense products, by what they feed (st_dense_terms). */
enum { ST_DENSE_QO, /* attention Q and output projection */
       ST_DENSE_KV, /* K and V: their rounding stays in the KV cache for every later token */
       ST_DENSE_HEAD /* the output head */ };

/* How the CPU's dense product of `type` weights with rows of n (GQA attention and the output head;
 * MLA's matrices keep st_dense_q8) takes its activations: 0 float32 (st_matmul), 1 int8 rows
 * (st_quantize_act, st_matmul_q8), 2 two-term int8 rows (st_quantize_act_residual,
 * st_matmul_q8_2: float32's precision in practice). With int8 (STRATA_INT8_DOT) and an integer
 * kernel for the type: Q8_0's Q and O one term, K and V two, the head one term (float32 before
 * 2026-12-06: its float kernel reads at half the integer one's rate on 16 cores of the GPU host,
 * 82.8 against 170.7 GB/s, and the head is a tenth of a qwen3-30b-a3b token's bytes; the tiny Q8_0
 * fixture's short prompt moved from mean |Δ|/σ 0.0076 to 0.0084); every other format two terms for Q, K, V
 * and O, whose rounding would flow through every later layer (one q8_K term for Q and O moved the
 * small Q4_K_M fixture's short prompt from mean |Δ|/σ 0.010 to 0.142), and one term for the head,
 * as llama.cpp's CPU backend takes it (its rounding ends in the logits: 0.0101 -> 0.0127 there,
 * 0.0100 with two terms). Their float kernels ran at 20-27 % of the host's read bandwidth and the
 * integer ones at 60-73 % (`strata bench --kernels`, development machine). The one rule of the
 * decode lanes, the prompt lanes and the per-task codelets, so that a token's bits do not depend
 * on the path or the chunk. */
int st_dense_terms(uint32_t type, int64_t n, int int8, int kind);

/* A dense product on activations prepared for `terms` (st_dense_terms): 0 st_matmul on x (ldx
 * floats apart), 1 st_matmul_q8 on xq, 2 st_matmul_q8_2 on xq and xr (quantised rows of T tokens,
 * st_q8_row_bytes(type, n) apart). Other arguments as st_matmul's. */
void st_dense_rows(int terms, uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1, const float *x,
                   int64_t ldx, const void *xq, const void *xr, int64_t T, int64_t n, float *out, int64_t ldo);

/* The activation layout one quantised input row serves several dense products with (n weights a
 * row): the type of the first of types[0 .. nw) that takes int8 activations by st_dense_terms
 * (kinds[j] its kind), ST_TYPE_COUNT when none does; *two: whether a product of that layout takes
 * two terms (then the row's second term is needed too). */
uint32_t st_dense_act(int nw, const uint32_t *types, const int *kinds, int64_t n, int int8, int *two);

/* Terms of a product of `type` weights (kind) on an input quantised in `act`'s layout
 * (st_dense_act): st_dense_terms, or 0 (float32) when that layout does not serve it. */
int st_dense_terms_on(uint32_t act, uint32_t type, int64_t n, int int8, int kind);

/* Whether quantised activation rows made for `a` weights (st_quantize_act) serve `b` weights too,
 * rows of n: the same layout and length. */
int st_q8_act_same(uint32_t a, uint32_t b, int64_t n);

/* The longest st_q8_row_bytes of any type for rows of n (buffers that hold whichever one). */
uint64_t st_q8_row_bytes_max(int64_t n);

/* A dense product of T token rows as st_dense_terms says (`terms`): st_matmul (0), or the rows
 * quantised once (st_quantize_act, and with 2 terms st_quantize_act_residual after them: *xq
 * then holds T first-term rows and T second-term rows; *xq caches them between calls on the same
 * x and weights of one activation layout: pass the same *xq, NULL at first, and free(*xq) after
 * the last call) and st_matmul_q8 or st_matmul_q8_2, as ggml's CPU backend takes int8 activations.
 * A prompt chunk is compute-bound, where the integer kernels do about three times the
 * multiply-adds of the float ones per cycle. Arguments as st_matmul's; an allocation failure
 * falls back to st_matmul. */
void st_dense_matmul(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1, const float *x,
                     int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo, int terms, void **xq);

/* RMSNorm of one row: y = x / sqrt(mean(x^2) + eps) * w (w may be NULL: no scale). y may alias x.
 * Source: Zhang & Sennrich 2019; Qwen3 uses it for every norm. */
void st_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);

#endif
