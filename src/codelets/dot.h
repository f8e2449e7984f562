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

/* Forces a SIMD path (for tests): 0 scalar, 1 avx2, 2 avx512; ignored when unsupported.
 * Returns the path in use afterwards. */
int st_dot_force_isa(int level);

/* out[t * ldo + (r - r0)] = dot(W[r], x[t * ldx .. + n]) for r in [r0, r1), t in [0, T).
 * W: rows of `n` elements of `type` (any type st_type_info marks computed), `row_bytes` apart.
 * n must be a multiple of the type's block size. */
void st_matmul(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1,
               const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo);

/* RMSNorm of one row: y = x / sqrt(mean(x^2) + eps) * w (w may be NULL: no scale). y may alias x.
 * Source: Zhang & Sennrich 2019; Qwen3 uses it for every norm. */
void st_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);

#endif
