/* CPU dot-product kernels (see dot.h): the run-time ISA selection (a scalar path, AVX2+FMA+F16C,
 * AVX-512, and for the integer kernels AVX-512 VNNI and VBMI, chosen once from the CPU's
 * features), the row tiles of the float formats (F32, F16, BF16, and Q8_0 loaded as they are), the
 * activation quantisation of the integer kernels, and st_matmul / st_matmul_q8, which send the
 * block formats to their family's kernels: dot_b32.c (the 32-weight blocks), dot_k.c (the K
 * super-blocks and IQ4_XS), dot_grid.c (the grid i-quants), with dot_impl.h between them. One
 * weight row is loaded once and multiplied with a tile of up to ST_TILE activation rows; each
 * activation row keeps its own accumulators, updated in the same order whatever the tile size, so
 * results do not depend on the batch size. */
#include "codelets/dot.h"

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/dot_impl.h"
#include "codelets/quant.h"
#include "common.h"

/* ---- scalar ------------------------------------------------------------------------------ */

/* The float kernels' weight type for a q8_0 KV cache's rows (st_kv_q8_scores; not a GGUF type): n int8
 * quants, then n / 32 fp16 scales, value i = d[i / 32] q[i], as a Q8_0 block's. */
#define KV_Q8_ROWS 0x4b563830u

static inline float load_w_scalar(uint32_t type, const void *row, int64_t i, int64_t n) {
  switch (type) {
  case KV_Q8_ROWS:
    return st_fp16_to_f32(((const uint16_t *)((const uint8_t *)row + n))[i / ST_QK8_0]) * (float)((const int8_t *)row)[i];
  case ST_TYPE_F32:
    return ((const float *)row)[i];
  case ST_TYPE_F16:
    return st_fp16_to_f32(((const uint16_t *)row)[i]);
  case ST_TYPE_BF16:
    return st_bf16_to_f32(((const uint16_t *)row)[i]);
  default: {
    const st_block_q8_0 *b = (const st_block_q8_0 *)row + i / ST_QK8_0;
    return st_fp16_to_f32(b->d) * (float)b->qs[i % ST_QK8_0];
  }
  }
}

static void row_tile_scalar(uint32_t type, const void *w, const float *x, int64_t ldx, int nt,
                            int64_t n, float *out, int64_t ldo) {
  for (int t = 0; t < nt; t++) {
    float acc[8] = {0};
    for (int64_t i = 0; i < n; i++) acc[i & 7] += load_w_scalar(type, w, i, n) * x[t * ldx + i];
    out[t * ldo] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
}

/* ---- AVX2 -------------------------------------------------------------------------------- */

static inline AVX2 __m256 load8_avx2(uint32_t type, const void *row, int64_t i, int64_t n) {
  switch (type) {
  case KV_Q8_ROWS: {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(((const uint16_t *)((const uint8_t *)row + n))[i / ST_QK8_0]));
    const __m128i q = _mm_loadl_epi64((const __m128i *)((const int8_t *)row + i));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
  }
  case ST_TYPE_F32:
    return _mm256_loadu_ps((const float *)row + i);
  case ST_TYPE_F16:
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
  case ST_TYPE_BF16:
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))), 16));
  default: { /* Q8_0: the only other type that comes here */
    const st_block_q8_0 *b = (const st_block_q8_0 *)row + i / ST_QK8_0;
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
    const __m128i q = _mm_loadl_epi64((const __m128i *)(b->qs + i % ST_QK8_0));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
  }
  }
}

static inline __attribute__((always_inline)) AVX2 void row_tile_avx2_impl(uint32_t type, const void *w, const float *x, int64_t ldx, int nt,
                               int64_t n, float *out, int64_t ldo) {
  __m256 a0[ST_TILE], a1[ST_TILE];
  for (int t = 0; t < nt; t++) a0[t] = a1[t] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = load8_avx2(type, w, i, n), w1 = load8_avx2(type, w, i + 8, n);
    for (int t = 0; t < nt; t++) {
      a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + i), a0[t]);
      a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * ldx + i + 8), a1[t]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 w0 = load8_avx2(type, w, i, n);
    for (int t = 0; t < nt; t++) a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + i), a0[t]);
  }
  for (int t = 0; t < nt; t++) {
    float s = hsum8_avx2(_mm256_add_ps(a0[t], a1[t]));
    for (int64_t j = i; j < n; j++) s += load_w_scalar(type, w, j, n) * x[t * ldx + j];
    out[t * ldo] = s;
  }
}

static AVX2 void row_tile_avx2(uint32_t type, const void *w, const float *x, int64_t ldx, int nt,
                               int64_t n, float *out, int64_t ldo) {
  /* a constant token count keeps the accumulators in registers */
  switch (nt) {
  case 1: row_tile_avx2_impl(type, w, x, ldx, 1, n, out, ldo); break;
  case 2: row_tile_avx2_impl(type, w, x, ldx, 2, n, out, ldo); break;
  case 3: row_tile_avx2_impl(type, w, x, ldx, 3, n, out, ldo); break;
  default: row_tile_avx2_impl(type, w, x, ldx, 4, n, out, ldo); break;
  }
}

/* ---- AVX-512 ----------------------------------------------------------------------------- */

static inline AVX512 __m512 load16_avx512(uint32_t type, const void *row, int64_t i, int64_t n) {
  switch (type) {
  case KV_Q8_ROWS: {
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(((const uint16_t *)((const uint8_t *)row + n))[i / ST_QK8_0]));
    const __m128i q = _mm_loadu_si128((const __m128i *)((const int8_t *)row + i));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
  }
  case ST_TYPE_F32:
    return _mm512_loadu_ps((const float *)row + i);
  case ST_TYPE_F16:
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i)));
  case ST_TYPE_BF16:
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i))),
        16));
  default: { /* Q8_0 */
    const st_block_q8_0 *b = (const st_block_q8_0 *)row + i / ST_QK8_0;
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
    const __m128i q = _mm_loadu_si128((const __m128i *)(b->qs + i % ST_QK8_0));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
  }
  }
}

static inline __attribute__((always_inline)) AVX512 void row_tile_avx512_impl(uint32_t type, const void *w, const float *x, int64_t ldx,
                                   int nt, int64_t n, float *out, int64_t ldo) {
  __m512 a0[ST_TILE], a1[ST_TILE];
  for (int t = 0; t < nt; t++) a0[t] = a1[t] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 w0 = load16_avx512(type, w, i, n), w1 = load16_avx512(type, w, i + 16, n);
    for (int t = 0; t < nt; t++) {
      a0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * ldx + i), a0[t]);
      a1[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * ldx + i + 16), a1[t]);
    }
  }
  for (; i + 16 <= n; i += 16) {
    const __m512 w0 = load16_avx512(type, w, i, n);
    for (int t = 0; t < nt; t++) a0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * ldx + i), a0[t]);
  }
  for (int t = 0; t < nt; t++) {
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t]));
    for (int64_t j = i; j < n; j++) s += load_w_scalar(type, w, j, n) * x[t * ldx + j];
    out[t * ldo] = s;
  }
}

static AVX512 void row_tile_avx512(uint32_t type, const void *w, const float *x, int64_t ldx,
                                   int nt, int64_t n, float *out, int64_t ldo) {
  /* a constant token count keeps the accumulators in registers */
  switch (nt) {
  case 1: row_tile_avx512_impl(type, w, x, ldx, 1, n, out, ldo); break;
  case 2: row_tile_avx512_impl(type, w, x, ldx, 2, n, out, ldo); break;
  case 3: row_tile_avx512_impl(type, w, x, ldx, 3, n, out, ldo); break;
  default: row_tile_avx512_impl(type, w, x, ldx, 4, n, out, ldo); break;
  }
}

/* ---- dispatch ---------------------------------------------------------------------------- */

typedef void (*row_tile_fn)(uint32_t, const void *, const float *, int64_t, int, int64_t, float *,
                            int64_t);

/* 3: level 2 and the integer kernels may use AVX-512 VNNI, VBMI and GFNI (the float kernels run as
 * at 2). */
static int detected_level(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
                   __builtin_cpu_supports("gfni")
               ? 3
               : 2;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return 1;
  return 0;
}

/* -1 until first use; a process-wide constant afterwards (the CPU does not change). Read and
 * written atomically: the CPU pool's workers reach the kernels at once. */
static int isa_level = -1;

static int full_level(void) {
  int l = __atomic_load_n(&isa_level, __ATOMIC_RELAXED);
  if (l < 0) { /* the same value whichever thread comes first */
    l = detected_level();
    __atomic_store_n(&isa_level, l, __ATOMIC_RELAXED);
  }
  return l;
}

/* The float kernels' level: 0..2. */
static int level(void) {
  return full_level() > 2 ? 2 : full_level();
}

const char *st_dot_isa(void) {
  static const char *names[] = {"scalar", "avx2", "avx512"};
  return names[level()];
}

int st_dot_force_isa(int l) {
  if (l >= 0 && l <= detected_level()) __atomic_store_n(&isa_level, l, __ATOMIC_RELAXED);
  return full_level();
}

/* ---- the low-bit formats through Q4_0 (issue #25) ----------------------------------------------
 * Every Q2_0, Q1_0, TQ2_0 and TQ1_0 weight is a small integer v in -1..2 times its block's fp16 d,
 * so a row of them is exactly a row of Q4_0 blocks (q = v + 8, the same d in each 32-weight block).
 * st_matmul and st_matmul_q8 transcode 64 rows at a time into that layout and run the Q4_0
 * kernels (SIMD at every level, the same bits at every level), instead of decoding each weight
 * to float32. */
static int via_q4_0(uint32_t type) {
  return type == ST_TYPE_Q2_0 || type == ST_TYPE_Q1_0 || type == ST_TYPE_TQ2_0 || type == ST_TYPE_TQ1_0;
}

/* One TQ2_0 or TQ1_0 block as Q4_0 quants q = v + 8 (q[256]); returns the block's fp16 d. */
static uint16_t lowbit_block(uint32_t type, const uint8_t *b, uint8_t *q) {
  uint16_t d;
  switch (type) {
  case ST_TYPE_TQ2_0:
    memcpy(&d, b + 64, 2);
    for (int g = 0; g < 2; g++)
      for (int l = 0; l < 4; l++)
        for (int m = 0; m < 32; m++) q[128 * g + 32 * l + m] = (uint8_t)(((b[32 * g + m] >> (2 * l)) & 3) + 7);
    break;
  default: { /* TQ1_0 (quant.h st_block_tq1_0): trit n of a byte is ((uint8_t)(byte * 3^n) * 3) >> 8 */
    memcpy(&d, b + 52, 2);
    uint8_t p[48 + 4];
    memcpy(p, b, 52);
    for (int n = 0; n < 5; n++) {
      for (int m = 0; m < 32; m++) q[32 * n + m] = (uint8_t)(((p[m] * 3u) >> 8) + 7);
      for (int m = 0; m < 16; m++) q[160 + 16 * n + m] = (uint8_t)(((p[32 + m] * 3u) >> 8) + 7);
      if (n < 4)
        for (int j = 0; j < 4; j++) q[240 + 4 * n + j] = (uint8_t)(((p[48 + j] * 3u) >> 8) + 7);
      for (int m = 0; m < 52; m++) p[m] = (uint8_t)(p[m] * 3u); /* the next trit to the top */
    }
  }
  }
  return d;
}

/* Q2_0 and Q1_0 bytes to Q4_0 quants, one byte of the output per weight (value + 8 < 16, so two
 * such words or-ed with one shifted by 4 give the Q4_0 bytes of two half-blocks at once). */
static uint64_t lut_q2[256], lut_q1[256]; /* lut_q2: 4 quants, in the low 4 bytes */
static pthread_once_t lut_once = PTHREAD_ONCE_INIT;
static void lut_init(void) {
  for (int v = 0; v < 256; v++) {
    uint64_t w2 = 0, w1 = 0;
    for (int j = 0; j < 4; j++) w2 |= (uint64_t)(((v >> (2 * j)) & 3) + 7) << (8 * j);
    for (int j = 0; j < 8; j++) w1 |= (uint64_t)(7 + 2 * ((v >> j) & 1)) << (8 * j);
    lut_q2[v] = w2, lut_q1[v] = w1;
  }
}

/* A Q2_0 (wpb 4 weights a byte) or Q1_0 (8) block of bs weights as Q4_0 blocks at o, by the byte
 * tables: a 32-weight block's low half in its first 16 / wpb quant bytes, the high half in the
 * next, each byte one word of wpb Q4_0 quants. Returns the next block. */
static inline __attribute__((always_inline)) st_block_q4_0 *lut_blocks(const uint8_t *blk, int bs, const int wpb,
                                                                       const uint64_t *lut, st_block_q4_0 *o) {
  for (int k = 0; k < bs / 32; k++, o++) {
    const uint8_t *qb = blk + 2 + k * (32 / wpb);
    memcpy(&o->d, blk, 2);
    for (int m = 0; m < 16 / wpb; m++) {
      const uint64_t w = lut[qb[m]] | lut[qb[16 / wpb + m]] << 4;
      memcpy(o->qs + wpb * m, &w, (size_t)wpb);
    }
  }
  return o;
}

/* Rows [r0, r1) of W (of a via_q4_0 type, n weights a row) as Q4_0 rows into out. */
static void lowbit_to_q4_0(uint32_t type, const uint8_t *W, uint64_t row_bytes, int64_t r0, int64_t r1, int64_t n,
                           st_block_q4_0 *out) {
  const struct st_type_info *ti = st_type_info(type);
  const int bs = (int)ti->blck_size;
  pthread_once(&lut_once, lut_init);
  uint8_t q[256];
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = W + (uint64_t)r * row_bytes;
    st_block_q4_0 *o = out + (r - r0) * (n / 32);
    for (int64_t b = 0; b < n / bs; b++) {
      const uint8_t *blk = row + (uint64_t)b * ti->type_size;
      if (type == ST_TYPE_Q2_0 || type == ST_TYPE_Q1_0) {
        o = type == ST_TYPE_Q2_0 ? lut_blocks(blk, bs, 4, lut_q2, o) : lut_blocks(blk, bs, 8, lut_q1, o);
        continue;
      }
      const uint16_t d = lowbit_block(type, blk, q);
      for (int k = 0; k < bs / 32; k++, o++) {
        o->d = d;
        for (int j = 0; j < 16; j++) o->qs[j] = (uint8_t)(q[32 * k + j] | q[32 * k + j + 16] << 4);
      }
    }
  }
}

void *st_dot_scratch(int slot, size_t bytes) {
  static _Thread_local void *buf[3];
  static _Thread_local size_t cap[3];
  ST_ASSERT(slot >= 0 && slot < 3);
  if (bytes > cap[slot]) {
    free(buf[slot]);
    buf[slot] = malloc(bytes);
    cap[slot] = buf[slot] ? bytes : 0;
  }
  return buf[slot];
}

/* Block formats decoded in registers: Q2_K..Q6_K and IQ4_XS a super-block at a time in the
 * row_tile_k_* functions (dot_k.c); Q4_0..Q5_1 and IQ4_NL a 32-weight block at a time and the grid
 * i-quants in row_tile_b_* (dot_b32.c) and row_tile_iq_* (dot_grid.c). IQ4_NL/IQ4_XS map their
 * 4-bit indices to the non-linear levels with one byte shuffle (pshufb) of st_kvalues_iq4nl. */
void st_matmul(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1,
               const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo) {
  if (via_q4_0(type)) {
    const uint64_t rb4 = (uint64_t)(n / 32) * sizeof(st_block_q4_0);
    st_block_q4_0 *q4 = st_dot_scratch(0, 64 * rb4);
    ST_ASSERT(q4 != NULL);
    for (int64_t rb = r0; rb < r1; rb += 64) {
      const int64_t re = rb + 64 < r1 ? rb + 64 : r1;
      lowbit_to_q4_0(type, W, row_bytes, rb, re, n, q4);
      st_matmul(ST_TYPE_Q4_0, q4, rb4, 0, re - rb, x, ldx, T, n, out + (rb - r0), ldo);
    }
    return;
  }
  static const row_tile_fn fns[] = {row_tile_scalar, row_tile_avx2, row_tile_avx512};
  const row_tile_fn fn = fns[level()];
  row_tile_fn tile = fn;
  const int k_rows = type == ST_TYPE_Q2_K || type == ST_TYPE_Q3_K || type == ST_TYPE_Q4_K || type == ST_TYPE_Q5_K ||
                     type == ST_TYPE_Q6_K || type == ST_TYPE_IQ4_XS;
  const int b_rows = type == ST_TYPE_Q4_0 || type == ST_TYPE_Q4_1 || type == ST_TYPE_Q5_0 || type == ST_TYPE_Q5_1 ||
                     type == ST_TYPE_IQ4_NL || type == ST_TYPE_MXFP4;
  const int iq_rows = type == ST_TYPE_IQ2_XS || type == ST_TYPE_IQ2_S || type == ST_TYPE_IQ3_XXS || type == ST_TYPE_IQ3_S;
  if (level() == 2) tile = k_rows ? row_tile_k_avx512 : b_rows ? row_tile_b_avx512 : iq_rows ? row_tile_iq_avx512 : fn;
  if (level() == 1) tile = k_rows ? row_tile_k_avx2 : b_rows ? row_tile_b_avx2 : iq_rows ? row_tile_iq_avx2 : fn;
  const int in_registers = type == ST_TYPE_F32 || type == ST_TYPE_F16 || type == ST_TYPE_BF16 || type == ST_TYPE_Q8_0 ||
                           (level() > 0 && (k_rows || b_rows || iq_rows));
  if (!in_registers) {
    /* Other block formats: each weight row is dequantised to float32 once per call, then the
     * float32 kernel runs over all tokens (the same products as a float32 forward of the
     * dequantised weights). */
    float *row = malloc(sizeof(float) * (size_t)n);
    ST_ASSERT(row != NULL);
    for (int64_t r = r0; r < r1; r++) {
      st_dequantize_row(type, (const uint8_t *)W + (uint64_t)r * row_bytes, row, n);
      for (int64_t t0 = 0; t0 < T; t0 += ST_TILE) {
        const int nt = (int)(T - t0 < ST_TILE ? T - t0 : ST_TILE);
        fn(ST_TYPE_F32, row, x + t0 * ldx, ldx, nt, n, out + t0 * ldo + (r - r0), ldo);
      }
    }
    free(row);
    return;
  }
  /* Blocks of 64 weight rows stay in L2 while every token tile passes over them. */
  for (int64_t rb = r0; rb < r1; rb += 64) {
    const int64_t re = rb + 64 < r1 ? rb + 64 : r1;
    for (int64_t t0 = 0; t0 < T; t0 += ST_TILE) {
      const int nt = (int)(T - t0 < ST_TILE ? T - t0 : ST_TILE);
      for (int64_t r = rb; r < re; r++)
        tile(type, (const uint8_t *)W + (uint64_t)r * row_bytes, x + t0 * ldx, ldx, nt, n,
           out + t0 * ldo + (r - r0), ldo);
    }
  }
}

/* ---- integer dot products on quantised activations (st_matmul_q8) -------------------------
 * Two families. Blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (its E8M0 scale as a float); st_act_q8_0): each block's
 * 32 weight quants times the activation quants give four int32 lanes (lane j: weights 4j..4j+3
 * and 16 + 4j..16 + 4j + 3, exact; a nibble byte's two weights share a lane), and lane j of block
 * b updates float accumulator A[4 (b mod 4) + j] = fmaf(dw_b * dx_b, lane, A), for Q4_1/Q5_1 then
 * A = fmaf(mw_b * dx_b, sum of the lane's eight activation quants, A); the 16 accumulators are
 * summed by one fixed tree. Four blocks fill one 512-bit vector of lanes, so VNNI needs no
 * horizontal sums per block. Super-blocks of 256 (Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K, IQ4_XS; st_act_q8_K): per 16 weights an integer scale sc16[k] (and for Q2_K/Q4_K/Q5_K a
 * min m16[k]); the exact integer sums are kept in lanes (16 of Σ sc16 · q · x, lane L over
 * weights 64c + 4L .. + 3 (grid formats: 16L .. 16L + 15), and 8 of m16 · bsums; Q3_K's -4 and Q6_K's -32
 * offsets fold into the first 8 lanes as -4 or -32 sc16 · bsums), each lane accumulated in float across
 * super-blocks (fmaf(dx * d, S_L, a_L), fmaf(-(dx * dmin), M_j, am_j)) and the lanes added once per row by a
 * fixed tree (k_accumulate, k_reduce). The grid i-quants (IQ2_XS,
 * IQ2_S, IQ3_XXS, IQ3_S) join this family: grid magnitudes (unsigned bytes) times the activation
 * quants with the weights' signs applied to them (psignb, or a masked negation), sc16 the odd
 * integers 2 s + 1 and d the block scale times 1/8 (IQ2), 1/4 (IQ3_XXS) or 1 (IQ3_S). Their
 * activation rows also carry the quants in plane order (grid_planes_at), for the AVX2 and AVX-512
 * kernels, which look the grids up one byte plane at a time (struct gridp). The scalar,
 * AVX2, VNNI and VNNI + VBMI code of dot_b32.c, dot_k.c and dot_grid.c compute exactly these
 * integers and these float operations. */

static int q8_family(uint32_t type) {
  switch (type) {
  case ST_TYPE_Q8_0: case ST_TYPE_Q4_0: case ST_TYPE_Q4_1: case ST_TYPE_Q5_0: case ST_TYPE_Q5_1: case ST_TYPE_IQ4_NL:
  case ST_TYPE_Q2_0: case ST_TYPE_Q1_0: case ST_TYPE_TQ2_0: case ST_TYPE_TQ1_0: /* through Q4_0 */
  case ST_TYPE_MXFP4: /* with IQ4_NL's kernels (dot_b32.c), its own levels and E8M0 scale */
  case ST_TYPE_IQ2_XXS: case ST_TYPE_IQ1_S: case ST_TYPE_IQ1_M: /* dot_lowiq.c */
    return 1;
  case ST_TYPE_Q2_K: case ST_TYPE_Q3_K: case ST_TYPE_Q4_K: case ST_TYPE_Q5_K: case ST_TYPE_Q6_K: case ST_TYPE_IQ4_XS:
  case ST_TYPE_IQ2_XS: case ST_TYPE_IQ2_S: case ST_TYPE_IQ3_XXS: case ST_TYPE_IQ3_S:
    return 2;
  default: return 0;
  }
}

uint64_t st_q8_row_bytes(uint32_t type, int64_t n) {
  const int f = q8_family(type);
  if (f == 1 && lowiq_type(type)) return n > 0 && n % 256 == 0 ? lowiq_d_at(n) + (uint64_t)(n / 32) * sizeof(float) : 0;
  if (f == 1 && n > 0 && n % 32 == 0) return (uint64_t)(n / 32) * sizeof(st_act_q8_0);
  if (f == 2 && n > 0 && n % 256 == 0)
    return (uint64_t)(n / 256) * (sizeof(st_act_q8_K) + (k_is_grid(type) ? 256 : 0));
  return 0;
}

/* d = max|x| / 127 and the quants round(x / d) (to nearest, ties to even, by the float magic-number
 * add of ggml's nearest_int: no libm call), within ±127 (never -128: the SIMD kernels' sign
 * trick negates activation quants). */
static float quantize_block(const float *x, int n, int8_t *q) {
  float amax = 0.0f;
  for (int i = 0; i < n; i++) {
    const float a = fabsf(x[i]);
    amax = a > amax ? a : amax;
  }
  const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int i = 0; i < n; i++) {
    const float v = x[i] * id + 12582912.0f; /* 1.5 * 2^23: the integer lands in the low mantissa bits */
    int32_t bits;
    memcpy(&bits, &v, 4);
    const int32_t r = (bits & 0x007fffff) - 0x00400000;
    q[i] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
  }
  return d;
}

static inline AVX2 int32_t hsum_epi32_avx2(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

/* quantize_block with AVX2, n a multiple of 32: the same operations (max of |x|, one multiply,
 * the magic-number add, the clamp) lane by lane, so the same bits. */
static AVX2 float quantize_block_avx2(const float *x, int n, int8_t *q) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const float amax = _mm_cvtss_f32(h);
  const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
  const __m256 vid = _mm256_set1_ps(id), magic = _mm256_set1_ps(12582912.0f);
  const __m256i mant = _mm256_set1_epi32(0x007fffff), off = _mm256_set1_epi32(0x00400000);
  const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
  for (int i = 0; i < n; i += 32) {
    __m256i r[4];
    for (int k = 0; k < 4; k++) {
      const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), vid), magic);
      r[k] = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), mant), off);
      r[k] = _mm256_max_epi32(_mm256_min_epi32(r[k], hi), lo);
    }
    /* pack 32 int32 to 32 int8 (values within ±127: no saturation), then undo the lane interleave */
    const __m256i p16a = _mm256_packs_epi32(r[0], r[1]), p16b = _mm256_packs_epi32(r[2], r[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    _mm256_storeu_si256((__m256i *)(q + i), _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  return d;
}

static void bsums_scalar(const int8_t *q, int16_t *out) {
  for (int k = 0; k < 16; k++) {
    int s = 0;
    for (int j = 0; j < 16; j++) s += q[16 * k + j];
    out[k] = (int16_t)s;
  }
}

static AVX2 void bsums_avx2(const int8_t *q, int16_t *out) {
  for (int k = 0; k < 16; k++)
    out[k] = (int16_t)hsum_epi32_avx2(
        _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * k))), _mm256_set1_epi16(1)));
}

void st_quantize_act(uint32_t type, const float *x, int64_t ldx, int64_t T, int64_t n, void *xq) {
  float (*quant)(const float *, int, int8_t *) = level() >= 1 ? quantize_block_avx2 : quantize_block;
  void (*bsums)(const int8_t *, int16_t *) = level() >= 1 ? bsums_avx2 : bsums_scalar;
  const uint64_t rb = st_q8_row_bytes(type, n);
  ST_ASSERT(rb > 0);
  for (int64_t t = 0; t < T; t++) {
    const float *xt = x + t * ldx;
    uint8_t *row = (uint8_t *)xq + (uint64_t)t * rb;
    if (q8_family(type) == 1) {
      st_act_q8_0 *b = (st_act_q8_0 *)(void *)row;
      for (int64_t i = 0; i < n / 32; i++) b[i].d = quant(xt + 32 * i, 32, b[i].qs);
      if (lowiq_type(type)) /* the quants and the scales again, contiguous */
        for (int64_t i = 0; i < n / 32; i++) {
          memcpy(row + lowiq_qs_at(n) + 32 * i, b[i].qs, 32);
          memcpy(row + lowiq_d_at(n) + sizeof(float) * i, &b[i].d, sizeof(float));
        }
    } else {
      st_act_q8_K *b = (st_act_q8_K *)(void *)row;
      for (int64_t i = 0; i < n / 256; i++) {
        b[i].d = quant(xt + 256 * i, 256, b[i].qs);
        bsums(b[i].qs, b[i].bsums);
        if (k_is_grid(type)) {
          int8_t *pl = (int8_t *)(void *)(row + grid_planes_at(n, i));
          for (int k = 0; k < 256; k++)
            pl[k % 4 * 64 + k / 4] = b[i].qs[k];
        }
      }
    }
  }
}

void st_dequantize_act(uint32_t type, const void *xq, float *out, int64_t n) {
  if (q8_family(type) == 1) {
    const st_act_q8_0 *b = xq;
    for (int64_t i = 0; i < n; i++) out[i] = b[i / 32].d * (float)b[i / 32].qs[i % 32];
  } else {
    const st_act_q8_K *b = xq;
    for (int64_t i = 0; i < n; i++) out[i] = b[i / 256].d * (float)b[i / 256].qs[i % 256];
  }
}

static int q8_level(void);

void st_quantize_act_residual(uint32_t type, const float *x, int64_t ldx, int64_t T, int64_t n, const void *xq,
                              void *xr) {
  const uint64_t rb = st_q8_row_bytes(type, n);
  ST_ASSERT(rb > 0);
  float *r = st_dot_scratch(2, sizeof(float) * (size_t)n);
  ST_ASSERT(r != NULL);
  for (int64_t t = 0; t < T; t++) {
    const void *row = (const uint8_t *)xq + (uint64_t)t * rb; /* its blocks first, whatever follows */
    const float *xt = x + t * ldx;
    /* block by block, the same element-wise arithmetic without a division per element (2.2 ->
     * 1.8 us with the quantisation for a hidden size of 2048 on the development machine) */
    if (q8_family(type) == 1) {
      const st_act_q8_0 *b = row;
      for (int64_t i0 = 0; i0 < n; i0 += 32)
        for (int64_t i = i0; i < n && i < i0 + 32; i++) r[i] = xt[i] - b[i0 / 32].d * (float)b[i0 / 32].qs[i - i0];
    } else {
      const st_act_q8_K *b = row;
      for (int64_t i0 = 0; i0 < n; i0 += 256)
        for (int64_t i = i0; i < n && i < i0 + 256; i++) r[i] = xt[i] - b[i0 / 256].d * (float)b[i0 / 256].qs[i - i0];
    }
    st_quantize_act(type, r, n, 1, n, (uint8_t *)xr + (uint64_t)t * rb);
  }
}

void st_dense_rows(int terms, uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1, const float *x,
                   int64_t ldx, const void *xq, const void *xr, int64_t T, int64_t n, float *out, int64_t ldo) {
  if (terms == 2) st_matmul_q8_2(type, W, row_bytes, r0, r1, xq, xr, T, n, out, ldo);
  else if (terms == 1) st_matmul_q8(type, W, row_bytes, r0, r1, xq, T, n, out, ldo);
  else st_matmul(type, W, row_bytes, r0, r1, x, ldx, T, n, out, ldo);
}

int st_dense_terms(uint32_t type, int64_t n, int int8, int kind) {
  if (!int8 || !st_q8_row_bytes(type, n)) return 0;
  if (type != ST_TYPE_Q8_0) return kind == ST_DENSE_HEAD ? 1 : 2;
  return kind == ST_DENSE_KV ? 2 : 1; /* Q, O and the head one term */
}

int st_q8_act_same(uint32_t a, uint32_t b, int64_t n) {
  return q8_family(a) && q8_family(a) == q8_family(b) && st_q8_row_bytes(a, n) == st_q8_row_bytes(b, n);
}

uint32_t st_dense_act(int nw, const uint32_t *types, const int *kinds, int64_t n, int int8, int *two) {
  uint32_t act = ST_TYPE_COUNT;
  *two = 0;
  for (int j = 0; j < nw; j++) {
    const int t = st_dense_terms(types[j], n, int8, kinds[j]);
    if (t && act == ST_TYPE_COUNT) act = types[j];
    if (t == 2 && st_q8_act_same(act, types[j], n)) *two = 1;
  }
  return act;
}

int st_dense_terms_on(uint32_t act, uint32_t type, int64_t n, int int8, int kind) {
  const int t = st_dense_terms(type, n, int8, kind);
  return t && st_q8_act_same(act, type, n) ? t : 0;
}

uint64_t st_q8_row_bytes_max(int64_t n) {
  uint64_t most = 0;
  for (uint32_t t = 0; t < ST_TYPE_COUNT; t++) {
    const uint64_t b = st_q8_row_bytes(t, n);
    most = b > most ? b : most;
  }
  return most;
}

void st_matmul_q8_2(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1, const void *xq,
                    const void *xr, int64_t T, int64_t n, float *out, int64_t ldo) {
  const int64_t R = r1 - r0;
  if (type == ST_TYPE_Q8_0 && T == 1 && q8_level() >= 2) { /* both terms from one read of the rows */
    q8_matmul_q80_vnni((const uint8_t *)W + (uint64_t)r0 * row_bytes, row_bytes, R, xq, xr,
                       (int64_t)st_q8_row_bytes(type, n), 1, n, out, ldo);
    return;
  }
  float *lo = st_dot_scratch(2, sizeof(float) * (size_t)(R * T));
  ST_ASSERT(lo != NULL);
  st_matmul_q8(type, W, row_bytes, r0, r1, xq, T, n, out, ldo);
  st_matmul_q8(type, W, row_bytes, r0, r1, xr, T, n, lo, R);
  for (int64_t t = 0; t < T; t++)
    for (int64_t r = 0; r < R; r++) out[t * ldo + r] = out[t * ldo + r] + lo[t * R + r];
}

/* 0 scalar, 1 avx2, 2 avx512vnni, 3 avx512vnni with VBMI and GFNI: the integer kernels at the current
 * level. */
static int q8_level(void) {
  if (full_level() == 3) return 3;
  if (full_level() == 2 && __builtin_cpu_supports("avx512vnni")) return 2;
  return full_level() >= 1 ? 1 : 0;
}

/* -1 until first use: 1 when the level-3 kernels take the "gather" lookups (the IQ2 grids gathered,
 * the IQ3 grids by vpermb pairs), 0 when they take vpermi2b for all four. Read and written
 * atomically: the CPU pool's workers reach st_matmul_q8 at once. */
static int grid_gather = -1;

/* The "gather" lookups by default on Intel CPUs with AMX (CPUID leaf 7 EDX bit 24: Sapphire
 * Rapids and later Xeons, the kind measured: their vpermi2b takes three uops, two on port 5, and
 * their gathers carry no Gather Data Sampling mitigation, as Ice Lake's do, which were not
 * measured); on Zen 4 both are slower than vpermi2b. */
static int gathers_fast(void) {
  unsigned a, b, c, d;
  __builtin_cpu_init();
  return __builtin_cpu_is("intel") && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1);
}

int st_dot_grid_lookup(int mode) {
  if (mode == 0 || mode == 1) __atomic_store_n(&grid_gather, mode, __ATOMIC_RELAXED);
  int m = __atomic_load_n(&grid_gather, __ATOMIC_RELAXED);
  if (m < 0) { /* the default, unless a setter came first (then m is the set mode) */
    const int d = gathers_fast();
    m = -1;
    if (__atomic_compare_exchange_n(&grid_gather, &m, d, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) m = d;
  }
  return m;
}

/* -1 until first use, then st_dot_row_pairs's mode; read and written atomically as grid_gather. */
static int row_pairs = -1;

int st_dot_row_pairs(int mode) {
  if (mode == 0 || mode == 1) __atomic_store_n(&row_pairs, mode, __ATOMIC_RELAXED);
  int m = __atomic_load_n(&row_pairs, __ATOMIC_RELAXED);
  if (m < 0) { /* the default, unless a setter came first (then m is the set mode) */
    __builtin_cpu_init();
    const int d = __builtin_cpu_is("intel") != 0;
    m = -1;
    if (__atomic_compare_exchange_n(&row_pairs, &m, d, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) m = d;
  }
  return m;
}

const char *st_dot_q8_isa(void) {
  static const char *names[] = {"scalar", "avx2", "avx512vnni", "avx512vbmi"};
  return names[q8_level()];
}

void st_matmul_q8(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1, const void *xq,
                  int64_t T, int64_t n, float *out, int64_t ldo) {
  /* per family (the 32-blocks, the K super-blocks, the grid formats), per level */
  static const q8_tile_fn fns[3][4] = {{q8_tile_b32_scalar, q8_tile_b32_avx2, q8_tile_b32_vnni, q8_tile_b32_vbmi},
                                       {q8_tile_k_scalar, q8_tile_k_avx2, q8_tile_k_vnni, q8_tile_k_vbmi},
                                       {q8_tile_grid_scalar, q8_tile_grid_avx2, q8_tile_grid_vnni, q8_tile_grid_vbmi}};
  const uint64_t ldq = st_q8_row_bytes(type, n);
  ST_ASSERT(ldq > 0);
  if (via_q4_0(type)) { /* the same activation rows (blocks of 32) as Q4_0's */
    const uint64_t rb4 = (uint64_t)(n / 32) * sizeof(st_block_q4_0);
    st_block_q4_0 *q4 = st_dot_scratch(0, 64 * rb4);
    ST_ASSERT(q4 != NULL);
    for (int64_t rb = r0; rb < r1; rb += 64) {
      const int64_t re = rb + 64 < r1 ? rb + 64 : r1;
      lowbit_to_q4_0(type, W, row_bytes, rb, re, n, q4);
      st_matmul_q8(ST_TYPE_Q4_0, q4, rb4, 0, re - rb, xq, T, n, out + (rb - r0), ldo);
    }
    return;
  }
  if (type == ST_TYPE_Q8_0 && q8_level() >= 2) { /* 16 rows a vector, every token in one call */
    q8_matmul_q80_vnni((const uint8_t *)W + (uint64_t)r0 * row_bytes, row_bytes, r1 - r0, xq, NULL, (int64_t)ldq, T, n,
                       out, ldo);
    return;
  }
  const int family = q8_family(type) == 1 ? 0 : k_is_grid(type) ? 2 : 1;
  static const q8_tile_fn lowiq[4] = {q8_tile_lowiq_scalar, q8_tile_lowiq_avx2, q8_tile_lowiq_avx2, q8_tile_lowiq_vbmi};
  static const q8_tile_fn q80[2] = {q8_tile_q80_scalar, q8_tile_q80_avx2};
  const q8_tile_fn tile = type == ST_TYPE_Q8_0 ? q80[q8_level()]
                          : lowiq_type(type) ? lowiq[q8_level()]
                          : k_is_grid(type) && q8_level() == 3 && st_dot_grid_lookup(-1) ? q8_tile_grid_vbmi_gather
                                                                                         : fns[family][q8_level()];
  /* as st_matmul: blocks of 64 weight rows stay in L2 while every token tile passes over them */
  for (int64_t rb = r0; rb < r1; rb += 64) {
    const int64_t re = rb + 64 < r1 ? rb + 64 : r1;
    for (int64_t t0 = 0; t0 < T; t0 += ST_TILE) {
      const int nt = (int)(T - t0 < ST_TILE ? T - t0 : ST_TILE);
      tile(type, (const uint8_t *)W + (uint64_t)rb * row_bytes, row_bytes, re - rb,
           (const uint8_t *)xq + (uint64_t)t0 * ldq, (int64_t)ldq, nt, n, out + t0 * ldo + (rb - r0), ldo);
    }
  }
}

/* st_axpy's levels: o[i] = o[i] + a * v[i], a product then a sum per element (no fused
 * multiply-add: the build has -ffp-contract=off and these use separate instructions), so every
 * level gives the scalar loop's bits. */
static void axpy_scalar(float *o, float a, const float *v, int64_t n) {
  for (int64_t i = 0; i < n; i++) o[i] = o[i] + a * v[i];
}

static AVX2 void axpy_avx2(float *o, float a, const float *v, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(o + i), _mm256_mul_ps(av, _mm256_loadu_ps(v + i))));
  for (; i < n; i++) o[i] = o[i] + a * v[i];
}

static AVX512 void axpy_avx512(float *o, float a, const float *v, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(o + i, _mm512_add_ps(_mm512_loadu_ps(o + i), _mm512_mul_ps(av, _mm512_loadu_ps(v + i))));
  for (; i < n; i++) o[i] = o[i] + a * v[i];
}

void st_axpy(float *o, float a, const float *v, int64_t n) {
  static void (*const fns[])(float *, float, const float *, int64_t) = {axpy_scalar, axpy_avx2, axpy_avx512};
  fns[level()](o, a, v, n);
}

/* The same with v a row of IEEE halves (a half KV cache's V row), widened exactly to float32
 * first (F16C's conversion is exact), so every level again gives the scalar loop's bits. */
static void axpy_f16_scalar(float *o, float a, const uint16_t *v, int64_t n) {
  for (int64_t i = 0; i < n; i++) o[i] = o[i] + a * st_fp16_to_f32(v[i]);
}

static AVX2 void axpy_f16_avx2(float *o, float a, const uint16_t *v, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(o + i),
                                          _mm256_mul_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))))));
  for (; i < n; i++) o[i] = o[i] + a * st_fp16_to_f32(v[i]);
}

static AVX512 void axpy_f16_avx512(float *o, float a, const uint16_t *v, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(o + i, _mm512_add_ps(_mm512_loadu_ps(o + i),
                                          _mm512_mul_ps(av, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + i))))));
  for (; i < n; i++) o[i] = o[i] + a * st_fp16_to_f32(v[i]);
}

void st_axpy_f16(float *o, float a, const uint16_t *v, int64_t n) {
  static void (*const fns[])(float *, float, const uint16_t *, int64_t) = {axpy_f16_scalar, axpy_f16_avx2, axpy_f16_avx512};
  fns[level()](o, a, v, n);
}

/* The same with v a q8_0 KV cache's values (st_kv_row_bytes): int8 quants q and, for every 32 of
 * them, an fp16 scale d (d at dv[i / 32]); each value decoded exactly (the scale times an int8
 * needs 18 bits) as d * q, then o + a * (d * q) as above. */
static void axpy_kv_q8_scalar(float *o, float a, const int8_t *q, const uint16_t *dv, int64_t n) {
  for (int64_t b = 0; b < n / 32; b++) {
    const float d = st_fp16_to_f32(dv[b]);
    for (int j = 0; j < 32; j++) o[32 * b + j] = o[32 * b + j] + a * (d * (float)q[32 * b + j]);
  }
}

static AVX2 void axpy_kv_q8_avx2(float *o, float a, const int8_t *q, const uint16_t *dv, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  for (int64_t b = 0; b < n / 32; b++) {
    const __m256 d = _mm256_set1_ps(st_fp16_to_f32(dv[b]));
    for (int j = 32 * (int)b; j < 32 * (int)b + 32; j += 8) {
      const __m256 w = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + j)))));
      _mm256_storeu_ps(o + j, _mm256_add_ps(_mm256_loadu_ps(o + j), _mm256_mul_ps(av, w)));
    }
  }
}

static AVX512 void axpy_kv_q8_avx512(float *o, float a, const int8_t *q, const uint16_t *dv, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t b = 0; b < n / 32; b++) {
    const __m512 d = _mm512_set1_ps(st_fp16_to_f32(dv[b]));
    for (int j = 32 * (int)b; j < 32 * (int)b + 32; j += 16) {
      const __m512 w = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + j)))));
      _mm512_storeu_ps(o + j, _mm512_add_ps(_mm512_loadu_ps(o + j), _mm512_mul_ps(av, w)));
    }
  }
}

void st_axpy_kv_q8(float *o, float a, const int8_t *q, const uint16_t *d, int64_t n) {
  static void (*const fns[])(float *, float, const int8_t *, const uint16_t *, int64_t) = {axpy_kv_q8_scalar, axpy_kv_q8_avx2,
                                                                                          axpy_kv_q8_avx512};
  fns[level()](o, a, q, d, n);
}

void st_kv_q8_scores(const uint8_t *k, uint64_t rb, int64_t n_keys, const float *x, int64_t ldx, int64_t R, int hd,
                     float *out, int64_t ldo) {
  /* st_matmul's float kernels and loop with the rows read in place (KV_Q8_ROWS: each 8 or 16 values
   * as a Q8_0 block's, d times the quants converted to float) */
  static const row_tile_fn fns[] = {row_tile_scalar, row_tile_avx2, row_tile_avx512};
  const row_tile_fn tile = fns[level()];
  for (int64_t j0 = 0; j0 < n_keys; j0 += 64) { /* 64 keys stay in L2 while each query tile passes */
    const int64_t j1 = j0 + 64 < n_keys ? j0 + 64 : n_keys;
    for (int64_t t0 = 0; t0 < R; t0 += ST_TILE) {
      const int nt = (int)(R - t0 < ST_TILE ? R - t0 : ST_TILE);
      for (int64_t j = j0; j < j1; j++) tile(KV_Q8_ROWS, k + (uint64_t)j * rb, x + t0 * ldx, ldx, nt, hd, out + t0 * ldo + j, ldo);
    }
  }
}

int st_dense_q8(uint32_t type, int64_t n, int int8) { return int8 && type == ST_TYPE_Q8_0 && st_q8_row_bytes(type, n) > 0; }

void st_dense_matmul(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1, const float *x,
                     int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo, int terms, void **xq) {
  const uint64_t rb = terms ? st_q8_row_bytes(type, n) : 0;
  if (rb && !*xq && (*xq = malloc((size_t)rb * (size_t)T * (terms == 2 ? 2 : 1)))) {
    st_quantize_act(type, x, ldx, T, n, *xq);
    if (terms == 2) st_quantize_act_residual(type, x, ldx, T, n, *xq, (uint8_t *)*xq + rb * (uint64_t)T);
  }
  if (rb && *xq && terms == 2)
    st_matmul_q8_2(type, W, row_bytes, r0, r1, *xq, (const uint8_t *)*xq + rb * (uint64_t)T, T, n, out, ldo);
  else if (rb && *xq)
    st_matmul_q8(type, W, row_bytes, r0, r1, *xq, T, n, out, ldo);
  else
    st_matmul(type, W, row_bytes, r0, r1, x, ldx, T, n, out, ldo);
}

void st_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
  /* the squares in float64 on 16 chains (element i on chain i % 16; the compiler may vectorise
   * them without changing a bit), the chains added pairwise: one chain of n dependent adds took
   * about 4 us for a hidden size of 2048, a serial step of every layer of a decode token */
  double part[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) part[j] += (double)x[i + j] * x[i + j];
  for (; i < n; i++) part[i % 16] += (double)x[i] * x[i];
  for (int h = 8; h >= 1; h /= 2)
    for (int j = 0; j < h; j++) part[j] += part[j + h];
  const double ss = part[0];
  const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * (w ? w[i] : 1.0f);
}
