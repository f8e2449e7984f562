/* The internal header of the CPU dot-product kernels, included by dot.c (the dispatch, the ISA
 * detection, the float formats' row tiles, the activation quantisation) and by the format
 * families' kernels, dot_b32.c (the 32-weight blocks), dot_k.c (the K super-blocks and IQ4_XS) and
 * dot_grid.c (the grid i-quants), only: the ISA target attributes, the token tile, the inline
 * helpers more than one family uses (horizontal sums, per-token FMAs, software prefetch, the
 * float lanes and row loops the K and grid formats share for int8 activations), the per-type
 * dispatch macros, and the families' kernels that st_matmul and st_matmul_q8 choose from. */
#ifndef ST_DOT_IMPL_H
#define ST_DOT_IMPL_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codelets/dot.h"
#include "codelets/quant.h"

#define ST_TILE 4

/* ---- ISA target attributes ---------------------------------------------------------------- */

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* AVX-512 VNNI: 64 weights per vector; vpdpbusd (u8 × s8, four products per int32 lane) for the
 * 32-blocks, four blocks at a time, signed weights made unsigned by an offset whose product with
 * the activations is taken back out (exact); vpmaddubsw then vpdpwssd (× the int16 scales) for
 * the K formats (IQ4_XS: vpdpbusd on its levels + 128, then × the int32 scales; Q2_K: vpdpbusd
 * on its quants times their scales, q2k_block_vnni), their other
 * signed weights by the sign trick: |w| as the unsigned operand, x negated where w < 0. */
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* AVX-512 VBMI, GFNI on top (level 3): the grid formats' own kernels (dot_grid.c), and the other
 * families' VNNI kernels compiled for it. */
#define VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni,avx2,fma,f16c")))

/* ---- float activations (st_matmul): helpers of every family -------------------------------- */

static inline AVX2 float hsum8_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* acc[t] += w times token t's activations at `at`, for the nt tokens of a tile (16 or 8 weights). */
static inline __attribute__((always_inline)) AVX512 void fma_tokens512(__m512 w, const float *x, int64_t ldx, int nt, int64_t at, __m512 *acc) {
  for (int t = 0; t < nt; t++) acc[t] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + t * ldx + at), acc[t]);
}

static inline __attribute__((always_inline)) AVX2 void fma_tokens256(__m256 w, const float *x, int64_t ldx, int nt, int64_t at,
                                                                     __m256 *acc) {
  for (int t = 0; t < nt; t++) acc[t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + t * ldx + at), acc[t]);
}

/* A constant token count (and type) keeps the accumulators in registers and the branches out
 * of the loops. */
#define ST_TILE_CASES(impl, ty)                                                                              \
  switch (nt) {                                                                                              \
  case 1: impl(ty, w, x, ldx, 1, n, out, ldo); break;                                                        \
  case 2: impl(ty, w, x, ldx, 2, n, out, ldo); break;                                                        \
  case 3: impl(ty, w, x, ldx, 3, n, out, ldo); break;                                                        \
  default: impl(ty, w, x, ldx, 4, n, out, ldo); break;                                                       \
  }

/* One switch over a family's types per kernel, whatever the ISA: `cases` is ST_TILE_CASES or
 * ST_Q8_TILE_CASES, `impl` the family's always-inline body (the last type is the default). */
#define ST_B32_DISPATCH(cases, impl)                                                                         \
  switch (type) {                                                                                            \
  case ST_TYPE_Q4_0: cases(impl, ST_TYPE_Q4_0); break;                                                       \
  case ST_TYPE_Q4_1: cases(impl, ST_TYPE_Q4_1); break;                                                       \
  case ST_TYPE_Q5_0: cases(impl, ST_TYPE_Q5_0); break;                                                       \
  case ST_TYPE_Q5_1: cases(impl, ST_TYPE_Q5_1); break;                                                       \
  case ST_TYPE_MXFP4: cases(impl, ST_TYPE_MXFP4); break;                                                     \
  default: cases(impl, ST_TYPE_IQ4_NL); break;                                                               \
  }
#define ST_GRID_DISPATCH(cases, impl)                                                                        \
  switch (type) {                                                                                            \
  case ST_TYPE_IQ2_XS: cases(impl, ST_TYPE_IQ2_XS); break;                                                   \
  case ST_TYPE_IQ2_S: cases(impl, ST_TYPE_IQ2_S); break;                                                     \
  case ST_TYPE_IQ3_XXS: cases(impl, ST_TYPE_IQ3_XXS); break;                                                 \
  default: cases(impl, ST_TYPE_IQ3_S); break;                                                                \
  }

/* ---- int8 activations (st_matmul_q8): helpers of more than one family ----------------------- */

/* The grid formats (IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): per 8 or 4 weights a grid entry of unsigned
 * magnitudes and per weight a sign bit; the sub-block scale is an odd integer 2 s + 1 times d / 8
 * (IQ2), d / 4 (IQ3_XXS) or d (IQ3_S), the power of two folded into the float scale. Their
 * activation rows also carry the quants in plane order (grid_planes_at). */
static inline int k_is_grid(uint32_t type) {
  return type == ST_TYPE_IQ2_XS || type == ST_TYPE_IQ2_S || type == ST_TYPE_IQ3_XXS || type == ST_TYPE_IQ3_S;
}

/* Where the plane-order copy of super-block b's quants starts in a grid format's activation row of
 * n values (after the n / 256 st_act_q8_K): byte 64 q + k is quant 4 k + q (q < 4), so that
 * plane q holds the activations of byte q of the 64 IQ3 grid entries, or of bytes q and q + 4 of
 * the 32 IQ2 entries in turn (k = 2 i + h: byte q + 4 h of entry i), which is how the AVX2 and
 * AVX-512 kernels look the grids up (struct gridp). */
static inline uint64_t grid_planes_at(int64_t n, int64_t b) {
  return (uint64_t)(n / 256) * sizeof(st_act_q8_K) + 256 * (uint64_t)b;
}

/* IQ2_XXS, IQ1_S and IQ1_M (dot_lowiq.c): blocks of 32 (st_act_q8_0) whose activation rows also
 * carry the n quants contiguous (at lowiq_qs_at) and then the n / 32 block scales as floats (at
 * lowiq_d_at), so that the AVX-512 kernel loads 64 quants and 8 scales at a time. */
static inline int lowiq_type(uint32_t type) {
  return type == ST_TYPE_IQ2_XXS || type == ST_TYPE_IQ1_S || type == ST_TYPE_IQ1_M;
}
static inline uint64_t lowiq_qs_at(int64_t n) { return (uint64_t)(n / 32) * sizeof(st_act_q8_0); }
static inline uint64_t lowiq_d_at(int64_t n) { return lowiq_qs_at(n) + (uint64_t)n; }

/* The per-16 integer scales and mins of a K super-block and its float scales (scalar path). */
struct kscales {
  float d, dmin;  /* dmin 0 when the format has no min */
  int16_t sc[16]; /* scale of weights 16k .. 16k + 15 */
  int16_t mv[16]; /* Q4_K/Q5_K: min per 16; Q6_K: 32 * sc (the offset); IQ4_XS: 0 */
};

/* Offset formats (Q3_K: q - 4, Q6_K: q - 32): the offset term kscales.mv · bsums is taken from S. */
static inline int k_has_offset(uint32_t type) { return type == ST_TYPE_Q3_K || type == ST_TYPE_Q6_K; }
static inline int k_has_min(uint32_t type) { return type == ST_TYPE_Q2_K || type == ST_TYPE_Q4_K || type == ST_TYPE_Q5_K; }

/* The K formats' float step, in lanes: a super-block's integer sums are kept as 16 lanes S (lane L:
 * the scaled products of weights 64c + 4L .. + 3, c = 0..3, which is what one 512-bit vpdpbusd or
 * vpdpwssd accumulator holds; 8-lane AVX2 code keeps the even and the odd 32-weight groups apart;
 * for the grid formats weights 16L .. 16L + 15, what their plane-order kernels hold at every ISA)
 * and 8 lanes M of the bsums term (lane j: 16-groups 2j, 2j + 1; Q3_K/Q6_K subtract it from S's
 * lanes 0..7, the formats with mins take it with -dmin). Each lane accumulates in float across
 * super-blocks, and k_reduce adds the lanes once per row: every ISA runs these same float
 * operations, so all give the same bits, with no horizontal sum per super-block. */
static inline void k_accumulate(uint32_t type, float d, float dmin, float dx, const int32_t *S,
                                const int32_t *M, float *a, float *am) {
  for (int L = 0; L < 16; L++)
    a[L] = fmaf(dx * d, (float)S[L], a[L]);
  if (k_has_min(type))
    for (int j = 0; j < 8; j++)
      am[j] = fmaf(-(dmin * dx), (float)M[j], am[j]);
}

/* A row's result from k_accumulate's lanes: lanes L and L + 8 (and M's lane L), then the tree of
 * hsum8_avx2. */
static inline float k_reduce(uint32_t type, const float *a, const float *am) {
  float s[8];
  for (int j = 0; j < 8; j++) {
    s[j] = a[j] + a[8 + j];
    if (k_has_min(type)) s[j] += am[j];
  }
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* The scalar row of the super-block formats, the K family's (dot_k.c) and the grid family's
 * (dot_grid.c), as a one-row kernel `name`: `bytes` gives a block's size, `scales` its struct
 * kscales, `quants` its 256 integer quants (k_bytes, k_scales, k_quants_scalar or grid_bytes,
 * grid_scales, grid_quants_scalar); then the loops that define the sums. */
#define ST_Q8_ROW_K_SCALAR(name, bytes, scales, quants)                                                      \
  static void name(uint32_t type, const void *w, const uint8_t *xq, int64_t ldq, int nt, int64_t n,          \
                   float *out, int64_t ldo) {                                                                \
    int8_t q[256];                                                                                           \
    const uint64_t bs = bytes(type);                                                                         \
    for (int t = 0; t < nt; t++) {                                                                           \
      const st_act_q8_K *x = (const st_act_q8_K *)(const void *)(xq + t * ldq);                              \
      float a[16] = {0}, am[8] = {0};                                                                        \
      for (int64_t b = 0; b < n / 256; b++) {                                                                \
        const uint8_t *bb = (const uint8_t *)w + (uint64_t)b * bs;                                           \
        struct kscales k;                                                                                    \
        scales(type, bb, &k);                                                                                \
        quants(type, bb, q);                                                                                 \
        int32_t S[16] = {0}, M[8];                                                                           \
        if (k_is_grid(type))                                                                                 \
          for (int i = 0; i < 256; i++)                                                                      \
            S[i / 16] += k.sc[i / 16] * q[i] * x[b].qs[i];                                                   \
        else                                                                                                 \
          for (int i = 0; i < 256; i++)                                                                      \
            S[i % 64 / 4] += k.sc[i / 16] * q[i] * x[b].qs[i];                                               \
        for (int j = 0; j < 8; j++) {                                                                        \
          M[j] = k.mv[2 * j] * x[b].bsums[2 * j] + k.mv[2 * j + 1] * x[b].bsums[2 * j + 1];                  \
          if (k_has_offset(type)) S[j] -= M[j];                                                              \
        }                                                                                                    \
        k_accumulate(type, k.d, k.dmin, x[b].d, S, M, a, am);                                                \
      }                                                                                                      \
      out[t * ldo] = k_reduce(type, a, am);                                                                  \
    }                                                                                                        \
  }

/* Software prefetch in the integer kernels (AVX2 and VNNI; results do not change): each CPU-pool
 * thread streams its weight rows once, and on the GPU host's Xeon the hardware prefetchers alone
 * did not keep enough misses in flight (bench/RESULTS.md, 2026-11-30: 2 KiB ahead, 1.2-1.7x at
 * 16 threads; 2026-12-06: 4 KiB ahead, CPU decode 7 % and the 24 GB class's 5 % faster than 2 KiB,
 * 8 KiB and L2 hints slower). Rows lie back to back, so running ahead crosses into the next row; a
 * prefetch past the end of the weights never faults. */
#ifndef ST_PREFETCH_AHEAD /* bytes (two-row reads: at least this far, in whole pairs); 0 turns it off */
#define ST_PREFETCH_AHEAD 4096
#endif
#ifndef ST_PREFETCH_HINT /* the cache level asked for: _MM_HINT_T0 (L1) or _MM_HINT_T1 (L2) */
#define ST_PREFETCH_HINT _MM_HINT_T0
#endif

static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *block, uint64_t bytes) {
  if (ST_PREFETCH_AHEAD <= 0) return;
  for (uint64_t j = 0; j < bytes; j += 64)
    _mm_prefetch((const char *)block + ST_PREFETCH_AHEAD + j, ST_PREFETCH_HINT);
}

/* The same for two rows read in step (row r at p0 and row r + 1 at p1, back to back): each asks for
 * its own offset in a later pair, the first pair at least ST_PREFETCH_AHEAD bytes ahead, so that
 * later pairs arrive whole. Running 2 KiB ahead of each row instead lands half the requests in
 * the other row of the pair when rows are about 2 KiB, and never asks for row r + 3 (seen as
 * K-quants reading 55 % of the memory bandwidth on 2 threads with rows of 2,304 bytes, q4_0 95 %). */
static inline uint64_t pair_ahead(uint64_t row_bytes) {
  const uint64_t pair = 2 * row_bytes;
  return (ST_PREFETCH_AHEAD + pair - 1) / pair * pair;
}

/* ahead: pair_ahead(row_bytes), computed once per group of rows */
static inline __attribute__((always_inline)) void prefetch_pair_ahead(const uint8_t *p0, const uint8_t *p1,
                                                                      uint64_t ahead, uint64_t bytes) {
  if (ST_PREFETCH_AHEAD <= 0) return;
  for (uint64_t j = 0; j < bytes; j += 64) {
    _mm_prefetch((const char *)p0 + ahead + j, ST_PREFETCH_HINT);
    _mm_prefetch((const char *)p1 + ahead + j, ST_PREFETCH_HINT);
  }
}

/* A K super-block's scales in registers: the int16 scale of each 16 weights (sc16), the min (or
 * Q6_K offset) term per 16 as kscales.mv (mv16), and the float scales. */
struct kvec {
  __m256i sc16, mv16;
  float d, dmin;
};

/* The integer kernels take a group of up to 64 weight rows (row_bytes apart; row r's outputs at
 * out + r), so that a kernel can prepare the activations once for all of them. */
typedef void (*q8_tile_fn)(uint32_t, const void *, uint64_t, int64_t, const uint8_t *, int64_t, int, int64_t,
                           float *, int64_t);

/* A per-thread scratch buffer of at least `bytes`, one per slot (0: st_matmul's and st_matmul_q8's
 * rows transcoded to Q4_0; 1: the Q8_0 kernel's transposed blocks; 2: st_quantize_act_residual's
 * row and st_matmul_q8_2's second products), kept for the thread's next call; NULL when malloc
 * fails. */
void *st_dot_scratch(int slot, size_t bytes);

/* Q8_0 on q8_0 activations (dot_q8_0.c): the scalar and AVX2 group kernels (levels 0 and 1), and
 * the AVX-512 VNNI kernel (levels 2 and 3) that takes a call's nr rows and all its T tokens at
 * once (with xr, one token's two terms of st_matmul_q8_2 in one read of the weights: out = the
 * product with xq plus the product with xr; else xr NULL); all with the same bits. */
void q8_tile_q80_scalar(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq,
                        int nt, int64_t n, float *out, int64_t ldo);
AVX2 void q8_tile_q80_avx2(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                           int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);
VNNI void q8_matmul_q80_vnni(const void *W, uint64_t row_bytes, int64_t nr, const uint8_t *xq, const uint8_t *xr,
                             int64_t ldq, int64_t T, int64_t n, float *out, int64_t ldo);

/* IQ2_XXS, IQ1_S and IQ1_M on q8_0 activations (dot_lowiq.c): the scalar kernel, the AVX2 one
 * (levels 1 and 2) and the AVX-512 VNNI + VBMI one (level 3), all with the same bits. */
void q8_tile_lowiq_scalar(uint32_t type, const void *W, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq,
                          int nt, int64_t n, float *out, int64_t ldo);
void q8_tile_lowiq_avx2(uint32_t type, const void *W, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq,
                        int nt, int64_t n, float *out, int64_t ldo);
void q8_tile_lowiq_vbmi(uint32_t type, const void *W, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq,
                        int nt, int64_t n, float *out, int64_t ldo);

#define ST_Q8_TILE_CASES(impl, ty)                                                                           \
  switch (nt) {                                                                                              \
  case 1: impl(ty, w, row_bytes, nr, xq, ldq, 1, n, out, ldo); break;                                        \
  case 2: impl(ty, w, row_bytes, nr, xq, ldq, 2, n, out, ldo); break;                                        \
  case 3: impl(ty, w, row_bytes, nr, xq, ldq, 3, n, out, ldo); break;                                        \
  default: impl(ty, w, row_bytes, nr, xq, ldq, 4, n, out, ldo); break;                                       \
  }

/* A one-row kernel `row` as a group kernel `name`. */
#define ST_Q8_EACH_ROW(name, row, attr)                                                                      \
  static inline __attribute__((always_inline)) attr void name(                                               \
      uint32_t ty, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq, int nt,    \
      int64_t n, float *out, int64_t ldo) {                                                                  \
    for (int64_t r = 0; r < nr; r++)                                                                         \
      row(ty, (const uint8_t *)w + r * row_bytes, xq, ldq, nt, n, out + r, ldo);                             \
  }

/* The integer kernels' switches of the K super-blocks (the 32-blocks take ST_B32_DISPATCH, the grid
 * formats ST_GRID_DISPATCH). */
#define ST_K_DISPATCH(cases, impl)                                                                           \
  switch (type) {                                                                                            \
  case ST_TYPE_Q2_K: cases(impl, ST_TYPE_Q2_K); break;                                                       \
  case ST_TYPE_Q3_K: cases(impl, ST_TYPE_Q3_K); break;                                                       \
  case ST_TYPE_Q4_K: cases(impl, ST_TYPE_Q4_K); break;                                                       \
  case ST_TYPE_Q5_K: cases(impl, ST_TYPE_Q5_K); break;                                                       \
  case ST_TYPE_Q6_K: cases(impl, ST_TYPE_Q6_K); break;                                                       \
  default: cases(impl, ST_TYPE_IQ4_XS); break;                                                               \
  }

/* A 16-level table (IQ4_NL's or MXFP4's doubled E2M1 values) plus 128 (unsigned bytes, flipping
 * the sign bit) in every 128-bit lane, for vpshufb by a nibble then vpdpbusd; the offset comes back
 * out of the activation sums. */
static inline VNNI __m512i levels_u8_vnni(const int8_t *levels) {
  return _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)levels)),
                          _mm512_set1_epi8((char)0x80));
}
static inline VNNI __m512i iq4nl_levels_u8_vnni(void) { return levels_u8_vnni(st_kvalues_iq4nl); }

/* A row's float accumulators for one token: 16 lanes of d · dx · S (S: the int32 lanes of the
 * integer sums, k_accumulate's lanes), and for the formats with
 * mins 8 lanes of dmin · dx · M (M: the bsums term, lane j of groups 2j, 2j + 1). Accumulating
 * lanes instead of each super-block's total leaves the horizontal sums to the end of the row. */
struct kacc {
  __m512 s;
  __m256 m;
};

static inline __attribute__((always_inline)) VNNI void
k_lanes_vnni(uint32_t type, float d, float dmin, float dx, __m512i is, __m256i bm, struct kacc *a) {
  if (k_has_offset(type)) is = _mm512_sub_epi32(is, _mm512_zextsi256_si512(bm));
  a->s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(d * dx), a->s);
  if (k_has_min(type)) a->m = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(bm), _mm256_set1_ps(dmin * dx), a->m);
}

/* The row's result from its accumulators: the 16 lanes, then the 8, in a fixed tree. */
static inline __attribute__((always_inline)) VNNI float k_lanes_total(uint32_t type, struct kacc a) {
  __m256 v = _mm256_add_ps(_mm512_castps512_ps256(a.s),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.s), 1)));
  if (k_has_min(type)) v = _mm256_add_ps(v, a.m);
  return hsum8_avx2(v);
}

/* IQ4_XS: -128 times the sums of four activations, lane by lane, of the 64 activation quants xv:
 * the start of vpdpbusd on the levels + 128, so that each lane ends with its true Σ l x
 * (k_accumulate's lanes, as the AVX2 and scalar code). */
static inline __attribute__((always_inline)) VNNI __m512i iq4_xs_offset_vnni(__m512i xv) {
  const __m512i zero = _mm512_setzero_si512();
  return _mm512_sub_epi32(zero, _mm512_slli_epi32(_mm512_dpbusd_epi32(zero, _mm512_set1_epi8(1), xv), 7));
}

/* The same for every token and vector c of super-block b (xoff[4 t + c]): computed once per group
 * of rows for rows of up to 16 super-blocks (held per pair of rows, with 3 or 4 tokens they
 * spilled registers), else once per pair of rows, or in k_block_vnni for a row alone. */
static inline __attribute__((always_inline)) VNNI void iq4_xs_offsets_vnni(const uint8_t *xq, int64_t ldq,
                                                                           int nt, int64_t b, __m512i *xoff) {
  for (int t = 0; t < nt; t++) {
    const st_act_q8_K *x = (const st_act_q8_K *)(const void *)(xq + t * ldq) + b;
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
      xoff[4 * t + c] = iq4_xs_offset_vnni(_mm512_loadu_si512((const void *)(x->qs + 64 * c)));
  }
}

/* The rows of a group of the super-block formats (K and grid), for an ISA attribute `attr`: `block`
 * takes super-block b (at bb) of one row into its nt tokens' accumulators (n: the row length;
 * k_block_vnni, or a grid block of dot_grid.c with the VNNI or VBMI iq3_planes / iq2_planes,
 * ST_GRID_BLOCK), `bytes` gives the size of a super-block (k_bytes, grid_bytes). */
#define ST_Q8_ROWS_K(name, attr, block, bytes)                                                               \
  static inline __attribute__((always_inline)) attr void name(                                               \
      uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq, int nt,  \
      int64_t n, float *out, int64_t ldo) {                                                                  \
    const uint64_t bs = bytes(type), ahead = pair_ahead(row_bytes);                                          \
    /* IQ4_XS: every token's offsets for rows of up to 16 super-blocks, once for the whole group */          \
    __m512i xo[16 * ST_TILE * 4] __attribute__((aligned(64)));                                               \
    const int cached = type == ST_TYPE_IQ4_XS && n / 256 <= 16;                                              \
    if (cached)                                                                                              \
      for (int64_t b = 0; b < n / 256; b++)                                                                  \
        iq4_xs_offsets_vnni(xq, ldq, nt, b, xo + b * ST_TILE * 4);                                           \
    int64_t r = 0;                                                                                           \
    const int pairs = nt <= 2 && st_dot_row_pairs(-1); /* with more tokens, one row at a time (registers) */ \
    for (; pairs && r + 2 <= nr; r += 2) {                                                                   \
      struct kacc acc[2][ST_TILE];                                                                           \
      for (int t = 0; t < nt; t++)                                                                           \
        acc[0][t] = acc[1][t] = (struct kacc){_mm512_setzero_ps(), _mm256_setzero_ps()};                     \
      const uint8_t *w0 = (const uint8_t *)w + r * row_bytes, *w1 = w0 + row_bytes;                          \
      for (int64_t b = 0; b < n / 256; b++) {                                                                \
        prefetch_pair_ahead(w0 + b * bs, w1 + b * bs, ahead, bs);                                            \
        __m512i xb[4 * ST_TILE]; /* longer rows: this super-block's offsets, for both rows */                \
        if (type == ST_TYPE_IQ4_XS && !cached) iq4_xs_offsets_vnni(xq, ldq, nt, b, xb);                      \
        const __m512i *xoff = cached ? xo + b * ST_TILE * 4 : xb;                                            \
        block(type, w0 + b * bs, b, xq, ldq, nt, n, xoff, acc[0]);                                           \
        block(type, w1 + b * bs, b, xq, ldq, nt, n, xoff, acc[1]);                                           \
      }                                                                                                      \
      for (int t = 0; t < nt; t++) {                                                                         \
        out[t * ldo + r] = k_lanes_total(type, acc[0][t]);                                                   \
        out[t * ldo + r + 1] = k_lanes_total(type, acc[1][t]);                                               \
      }                                                                                                      \
    }                                                                                                        \
    for (; r < nr; r++) {                                                                                    \
      struct kacc acc[ST_TILE];                                                                              \
      for (int t = 0; t < nt; t++)                                                                           \
        acc[t] = (struct kacc){_mm512_setzero_ps(), _mm256_setzero_ps()};                                    \
      const uint8_t *w0 = (const uint8_t *)w + r * row_bytes;                                                \
      for (int64_t b = 0; b < n / 256; b++) {                                                                \
        prefetch_ahead(w0 + b * bs, bs);                                                                     \
        block(type, w0 + b * bs, b, xq, ldq, nt, n, cached ? xo + b * ST_TILE * 4 : NULL, acc);              \
      }                                                                                                      \
      for (int t = 0; t < nt; t++)                                                                           \
        out[t * ldo + r] = k_lanes_total(type, acc[t]);                                                      \
    }                                                                                                        \
  }

/* ---- the families' kernels --------------------------------------------------------------------
 * st_matmul's row tiles (row_tile_fn in dot.c: one weight row times a tile of nt <= ST_TILE
 * tokens) and st_matmul_q8's group kernels (q8_tile_fn: up to 64 weight rows), per ISA level. */

/* dot_b32.c: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (float activations: Q8_0 takes dot.c's row tiles;
 * int8 activations: Q8_0 takes dot_q8_0.c's kernels) */
AVX2 void row_tile_b_avx2(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n, float *out,
                          int64_t ldo);
AVX512 void row_tile_b_avx512(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                              float *out, int64_t ldo);
void q8_tile_b32_scalar(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq,
                        int nt, int64_t n, float *out, int64_t ldo);
AVX2 void q8_tile_b32_avx2(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                           int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);
VNNI void q8_tile_b32_vnni(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                           int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);
VBMI void q8_tile_b32_vbmi(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                           int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);

/* dot_k.c: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS */
AVX2 void row_tile_k_avx2(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n, float *out,
                          int64_t ldo);
AVX512 void row_tile_k_avx512(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                              float *out, int64_t ldo);
void q8_tile_k_scalar(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq,
                      int nt, int64_t n, float *out, int64_t ldo);
AVX2 void q8_tile_k_avx2(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                         int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);
VNNI void q8_tile_k_vnni(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                         int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);
VBMI void q8_tile_k_vbmi(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                         int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);

/* dot_grid.c: IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (q8_tile_grid_vbmi_gather: level 3 with
 * st_dot_grid_lookup 1) */
AVX2 void row_tile_iq_avx2(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n, float *out,
                           int64_t ldo);
AVX512 void row_tile_iq_avx512(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                               float *out, int64_t ldo);
void q8_tile_grid_scalar(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                         int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);
AVX2 void q8_tile_grid_avx2(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                            int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);
VNNI void q8_tile_grid_vnni(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                            int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);
VBMI void q8_tile_grid_vbmi(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                            int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);
VBMI void q8_tile_grid_vbmi_gather(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr,
                                   const uint8_t *xq, int64_t ldq, int nt, int64_t n, float *out, int64_t ldo);

#endif
