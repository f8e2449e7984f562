/* CPU dot-product kernels (see dot.h): a scalar path, AVX2+FMA+F16C and AVX-512, selected once
 * at run time from the CPU's features. One weight row is loaded once and multiplied with a tile
 * of up to ST_TILE activation rows; each activation row keeps its own accumulators, updated in
 * the same order whatever the tile size, so results do not depend on the batch size. */
#include "codelets/dot.h"

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/iq_grids.h"
#include "codelets/quant.h"
#include "common.h"

#define ST_TILE 4

/* ---- scalar ------------------------------------------------------------------------------ */

static inline float load_w_scalar(uint32_t type, const void *row, int64_t i) {
  switch (type) {
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
    for (int64_t i = 0; i < n; i++) acc[i & 7] += load_w_scalar(type, w, i) * x[t * ldx + i];
    out[t * ldo] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
}


/* ---- block formats decoded in registers --------------------------------------------------
 * Q2_K..Q6_K and IQ4_XS a super-block at a time in the row_tile_k_* functions below; Q4_0..Q5_1
 * and IQ4_NL a 32-weight block at a time and the grid i-quants in row_tile_b_* and row_tile_iq_*.
 * IQ4_NL/IQ4_XS map their 4-bit indices to the non-linear levels with one byte shuffle (pshufb)
 * of st_kvalues_iq4nl. */

/* The sub-block (of 32) scale d*sc and offset dmin*m for weight r of a Q4_K/Q5_K block. */
__attribute__((target("f16c"))) static inline void k45_scale(const uint8_t *scales, uint16_t dh, uint16_t mh, int is, float *dl, float *ml) {
  int sc, m;
  if (is < 4) {
    sc = scales[is] & 63;
    m = scales[is + 4] & 63;
  } else {
    sc = (scales[is + 4] & 0xF) | ((scales[is - 4] >> 6) << 4);
    m = (scales[is + 4] >> 4) | ((scales[is] >> 6) << 4);
  }
  *dl = _cvtsh_ss(dh) * (float)sc;
  *ml = _cvtsh_ss(mh) * (float)m;
}

/* The signed 6-bit scale of 32-weight sub-block ib of an IQ4_XS block (quant.c's iq4_xs_scale). */
static inline int iq4_xs_sub_scale(const st_block_iq4_xs *b, int ib) {
  return (((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b->scales_h >> (2 * ib)) & 3) << 4)) - 32;
}

/* The 8 sub-block scales of an IQ4_XS block plus 32 (0..63), byte ib of the result for
 * sub-block ib: the nibbles and the 2-bit fields spread to bytes without a loop. */
static inline uint64_t iq4_xs_scales8(const st_block_iq4_xs *b) {
  uint32_t l32;
  memcpy(&l32, b->scales_l, 4);
  uint64_t lo = l32, hi = b->scales_h;
  lo = (lo | lo << 16) & 0x0000FFFF0000FFFFull;
  lo = (lo | lo << 8) & 0x00FF00FF00FF00FFull;
  lo = (lo | lo << 4) & 0x0F0F0F0F0F0F0F0Full;
  hi = (hi | hi << 24) & 0x000000FF000000FFull;
  hi = (hi | hi << 12) & 0x000F000F000F000Full;
  hi = (hi | hi << 6) & 0x0303030303030303ull;
  return lo | hi << 4;
}

/* ---- AVX2 -------------------------------------------------------------------------------- */

#define AVX2 __attribute__((target("avx2,fma,f16c")))

static inline AVX2 __m256 load8_avx2(uint32_t type, const void *row, int64_t i) {
  switch (type) {
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

static inline AVX2 float hsum8_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) AVX2 void row_tile_avx2_impl(uint32_t type, const void *w, const float *x, int64_t ldx, int nt,
                               int64_t n, float *out, int64_t ldo) {
  __m256 a0[ST_TILE], a1[ST_TILE];
  for (int t = 0; t < nt; t++) a0[t] = a1[t] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = load8_avx2(type, w, i), w1 = load8_avx2(type, w, i + 8);
    for (int t = 0; t < nt; t++) {
      a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + i), a0[t]);
      a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * ldx + i + 8), a1[t]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 w0 = load8_avx2(type, w, i);
    for (int t = 0; t < nt; t++) a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + i), a0[t]);
  }
  for (int t = 0; t < nt; t++) {
    float s = hsum8_avx2(_mm256_add_ps(a0[t], a1[t]));
    for (int64_t j = i; j < n; j++) s += load_w_scalar(type, w, j) * x[t * ldx + j];
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

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

static inline AVX512 __m512 load16_avx512(uint32_t type, const void *row, int64_t i) {
  switch (type) {
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
    const __m512 w0 = load16_avx512(type, w, i), w1 = load16_avx512(type, w, i + 16);
    for (int t = 0; t < nt; t++) {
      a0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * ldx + i), a0[t]);
      a1[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * ldx + i + 16), a1[t]);
    }
  }
  for (; i + 16 <= n; i += 16) {
    const __m512 w0 = load16_avx512(type, w, i);
    for (int t = 0; t < nt; t++) a0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * ldx + i), a0[t]);
  }
  for (int t = 0; t < nt; t++) {
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t]));
    for (int64_t j = i; j < n; j++) s += load_w_scalar(type, w, j) * x[t * ldx + j];
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



/* The 16 signed 6-bit scales of a Q3_K block, unpacked as dequant_q3_K does. */
static inline void q3k_scales(const uint8_t *packed, int8_t *out) {
  uint32_t aux[4];
  memcpy(aux, packed, 12);
  const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f, tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
  aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
  aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4);
  aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
  memcpy(out, aux, 16);
}

/* Q2_K/Q3_K: for each 128-weight half, four 2-bit planes of 32 bytes, 16 weights per scale.
 * Calls EMIT(bytes16, dl, ml, at) for every 16 weights (bytes are the unsigned quants). */
#define ST_K23_ROW(type, w, blk, base, EMIT)                                                              \
  do {                                                                                                    \
    if ((type) == ST_TYPE_Q2_K) {                                                                         \
      const st_block_q2_K *b_ = (const st_block_q2_K *)(w) + (blk);                                       \
      const float d_ = _cvtsh_ss(b_->d), dm_ = _cvtsh_ss(b_->dmin);                                       \
      for (int n_ = 0; n_ < 2; n_++) {                                                                    \
        const __m256i q_ = _mm256_loadu_si256((const __m256i *)(b_->qs + 32 * n_));                       \
        for (int s_ = 0; s_ < 4; s_++) {                                                                  \
          const __m256i v_ = _mm256_and_si256(_mm256_srli_epi16(q_, 2 * s_), _mm256_set1_epi8(3));         \
          for (int h_ = 0; h_ < 2; h_++) {                                                                \
            const uint8_t sc_ = b_->scales[8 * n_ + 2 * s_ + h_];                                         \
            EMIT(h_ ? _mm256_extracti128_si256(v_, 1) : _mm256_castsi256_si128(v_), d_ * (float)(sc_ & 0xF), \
                 dm_ * (float)(sc_ >> 4), (base) + 128 * n_ + 32 * s_ + 16 * h_);                          \
          }                                                                                               \
        }                                                                                                 \
      }                                                                                                   \
    } else {                                                                                              \
      const st_block_q3_K *b_ = (const st_block_q3_K *)(w) + (blk);                                       \
      int8_t sc_[16];                                                                                     \
      q3k_scales(b_->scales, sc_);                                                                        \
      const float d_ = _cvtsh_ss(b_->d);                                                                  \
      const __m256i hm_ = _mm256_loadu_si256((const __m256i *)b_->hmask);                                 \
      for (int n_ = 0; n_ < 2; n_++) {                                                                    \
        const __m256i q_ = _mm256_loadu_si256((const __m256i *)(b_->qs + 32 * n_));                       \
        for (int s_ = 0; s_ < 4; s_++) {                                                                  \
          const __m256i lo_ = _mm256_and_si256(_mm256_srli_epi16(q_, 2 * s_), _mm256_set1_epi8(3));        \
          const __m256i hb_ = _mm256_and_si256(_mm256_srli_epi16(hm_, 4 * n_ + s_), _mm256_set1_epi8(1));  \
          const __m256i v_ = _mm256_or_si256(lo_, _mm256_slli_epi16(hb_, 2)); /* q + 4 when the bit is set */ \
          for (int h_ = 0; h_ < 2; h_++) {                                                                \
            const float dl_ = d_ * (float)(sc_[8 * n_ + 2 * s_ + h_] - 32);                               \
            EMIT(h_ ? _mm256_extracti128_si256(v_, 1) : _mm256_castsi256_si128(v_), dl_, 4.0f * dl_,        \
                 (base) + 128 * n_ + 32 * s_ + 16 * h_);                                                  \
          }                                                                                               \
        }                                                                                                 \
      }                                                                                                   \
    }                                                                                                     \
  } while (0)

/* Q2_K..Q6_K and IQ4_XS rows a super-block at a time: scales decoded once per 32 weights, nibbles
 * unpacked 32 at a time, each weight formed as the CPU dequantisation forms it (dl * q - ml). */
static inline __attribute__((always_inline)) AVX512 void fma_tokens512(__m512 w, const float *x, int64_t ldx, int nt, int64_t at, __m512 *acc) {
  for (int t = 0; t < nt; t++) acc[t] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + t * ldx + at), acc[t]);
}

static inline AVX512 __m512 u8x16_ps512(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }

static inline __attribute__((always_inline)) AVX512 void row_tile_k_avx512_impl(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                                     float *out, int64_t ldo) {
  __m512 acc[ST_TILE];
  for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
  for (int64_t blk = 0; blk < n / 256; blk++) {
    const int64_t base = blk * 256;
    if (type == ST_TYPE_Q4_K || type == ST_TYPE_Q5_K) {
      /* Q4_K and Q5_K share the scale layout; Q5_K adds a fifth bit per weight from qh */
      const int k5 = type == ST_TYPE_Q5_K;
      const uint8_t *bb = (const uint8_t *)w + blk * (k5 ? sizeof(st_block_q5_K) : sizeof(st_block_q4_K));
      uint16_t dh, mh;
      memcpy(&dh, bb, 2);
      memcpy(&mh, bb + 2, 2);
      const uint8_t *scales = bb + 4, *qs = bb + (k5 ? 48 : 16);
      const __m256i qh = k5 ? _mm256_loadu_si256((const __m256i *)(bb + 16)) : _mm256_setzero_si256();
      const __m256i one = _mm256_set1_epi8(1);
      for (int j64 = 0; j64 < 4; j64++) {
        float d1, m1, d2, m2f;
        k45_scale(scales, dh, mh, 2 * j64, &d1, &m1);
        k45_scale(scales, dh, mh, 2 * j64 + 1, &d2, &m2f);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j64));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (k5) {
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j64), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j64 + 1), one), 4));
        }
        const __m512 vd1 = _mm512_set1_ps(d1), vm1 = _mm512_set1_ps(m1), vd2 = _mm512_set1_ps(d2), vm2 = _mm512_set1_ps(m2f);
        const int64_t at = base + 64 * j64;
        fma_tokens512(_mm512_sub_ps(_mm512_mul_ps(vd1, u8x16_ps512(_mm256_castsi256_si128(lo))), vm1), x, ldx, nt, at, acc);
        fma_tokens512(_mm512_sub_ps(_mm512_mul_ps(vd1, u8x16_ps512(_mm256_extracti128_si256(lo, 1))), vm1), x, ldx, nt, at + 16, acc);
        fma_tokens512(_mm512_sub_ps(_mm512_mul_ps(vd2, u8x16_ps512(_mm256_castsi256_si128(hi))), vm2), x, ldx, nt, at + 32, acc);
        fma_tokens512(_mm512_sub_ps(_mm512_mul_ps(vd2, u8x16_ps512(_mm256_extracti128_si256(hi, 1))), vm2), x, ldx, nt, at + 48, acc);
      }
    } else if (type == ST_TYPE_IQ4_XS) {
      const st_block_iq4_xs *b = (const st_block_iq4_xs *)w + blk;
      const float d = _cvtsh_ss(b->d);
      const __m128i kv = _mm_loadu_si128((const __m128i *)st_kvalues_iq4nl), m4x = _mm_set1_epi8(0xF);
      for (int ib = 0; ib < 8; ib++) {
        const __m512 vd = _mm512_set1_ps(d * (float)iq4_xs_sub_scale(b, ib));
        const __m128i q = _mm_loadu_si128((const __m128i *)(b->qs + 16 * ib));
        const __m128i lo = _mm_shuffle_epi8(kv, _mm_and_si128(q, m4x)), hi = _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(q, 4), m4x));
        fma_tokens512(_mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo))), x, ldx, nt, base + 32 * ib, acc);
        fma_tokens512(_mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi))), x, ldx, nt, base + 32 * ib + 16, acc);
      }
    } else if (type == ST_TYPE_Q2_K || type == ST_TYPE_Q3_K) {
#define EMIT512(bytes, dl, ml, at)                                                                      \
  fma_tokens512(_mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(dl), u8x16_ps512(bytes)), _mm512_set1_ps(ml)), x, ldx, nt, \
                (at), acc)
      ST_K23_ROW(type, w, blk, base, EMIT512);
#undef EMIT512
    } else { /* Q6_K */
      const st_block_q6_K *b = (const st_block_q6_K *)w + blk;
      const float d = _cvtsh_ss(b->d);
      const __m512i k32 = _mm512_set1_epi32(32);
      for (int h = 0; h < 2; h++) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        for (int qq = 0; qq < 4; qq++) {
          const __m256i l = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + (qq & 1) * 32));
          const __m256i lo = qq < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * qq), m2);
          const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)); /* 0..63 per byte */
          const int64_t at = base + 128 * h + 32 * qq;
          for (int half = 0; half < 2; half++) {
            const __m128i qb = half ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q);
            const __m512 qf = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(qb), k32));
            const float dl = d * (float)b->scales[8 * h + 2 * qq + half];
            fma_tokens512(_mm512_mul_ps(_mm512_set1_ps(dl), qf), x, ldx, nt, at + 16 * half, acc);
          }
        }
      }
    }
  }
  for (int t = 0; t < nt; t++) out[t * ldo] = _mm512_reduce_add_ps(acc[t]);
}

static AVX512 void row_tile_k_avx512(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                                     float *out, int64_t ldo) {
  /* a constant token count keeps the accumulators in registers */
  switch (nt) {
  case 1: row_tile_k_avx512_impl(type, w, x, ldx, 1, n, out, ldo); break;
  case 2: row_tile_k_avx512_impl(type, w, x, ldx, 2, n, out, ldo); break;
  case 3: row_tile_k_avx512_impl(type, w, x, ldx, 3, n, out, ldo); break;
  default: row_tile_k_avx512_impl(type, w, x, ldx, 4, n, out, ldo); break;
  }
}


/* The AVX2 counterpart of row_tile_k_avx512: eight weights per vector. */
static inline __attribute__((always_inline)) AVX2 void fma_tokens256(__m256 w, const float *x, int64_t ldx, int nt, int64_t at,
                                                                     __m256 *acc) {
  for (int t = 0; t < nt; t++) acc[t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + t * ldx + at), acc[t]);
}

/* 32 quants (bytes) times a scale, minus an offset, fed to the tokens 8 at a time. */
static inline __attribute__((always_inline)) AVX2 void fma32_avx2(__m256i q, __m256i sub, float dl, float ml, const float *x,
                                                                  int64_t ldx, int nt, int64_t at, __m256 *acc) {
  const __m256 vd = _mm256_set1_ps(dl), vm = _mm256_set1_ps(ml);
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; k++) {
    const __m256 qf = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[k]), sub));
    fma_tokens256(_mm256_sub_ps(_mm256_mul_ps(vd, qf), vm), x, ldx, nt, at + 8 * k, acc);
  }
}

static inline __attribute__((always_inline)) AVX2 void row_tile_k_avx2_impl(uint32_t type, const void *w, const float *x,
                                                                            int64_t ldx, int nt, int64_t n, float *out,
                                                                            int64_t ldo) {
  __m256 acc[ST_TILE];
  for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03), zero = _mm256_setzero_si256();
  for (int64_t blk = 0; blk < n / 256; blk++) {
    const int64_t base = blk * 256;
    if (type == ST_TYPE_Q4_K || type == ST_TYPE_Q5_K) {
      const int k5 = type == ST_TYPE_Q5_K;
      const uint8_t *bb = (const uint8_t *)w + blk * (k5 ? sizeof(st_block_q5_K) : sizeof(st_block_q4_K));
      uint16_t dh, mh;
      memcpy(&dh, bb, 2);
      memcpy(&mh, bb + 2, 2);
      const uint8_t *scales = bb + 4, *qs = bb + (k5 ? 48 : 16);
      const __m256i qh = k5 ? _mm256_loadu_si256((const __m256i *)(bb + 16)) : _mm256_setzero_si256();
      const __m256i one = _mm256_set1_epi8(1);
      for (int j64 = 0; j64 < 4; j64++) {
        float d1, m1, d2, m2f;
        k45_scale(scales, dh, mh, 2 * j64, &d1, &m1);
        k45_scale(scales, dh, mh, 2 * j64 + 1, &d2, &m2f);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j64));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (k5) {
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j64), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j64 + 1), one), 4));
        }
        fma32_avx2(lo, zero, d1, m1, x, ldx, nt, base + 64 * j64, acc);
        fma32_avx2(hi, zero, d2, m2f, x, ldx, nt, base + 64 * j64 + 32, acc);
      }
    } else if (type == ST_TYPE_IQ4_XS) {
      const st_block_iq4_xs *b = (const st_block_iq4_xs *)w + blk;
      const float d = _cvtsh_ss(b->d);
      const __m128i kv = _mm_loadu_si128((const __m128i *)st_kvalues_iq4nl), m4x = _mm_set1_epi8(0xF);
      for (int ib = 0; ib < 8; ib++) {
        const __m256 vd = _mm256_set1_ps(d * (float)iq4_xs_sub_scale(b, ib));
        const __m128i q = _mm_loadu_si128((const __m128i *)(b->qs + 16 * ib));
        const __m128i lo = _mm_shuffle_epi8(kv, _mm_and_si128(q, m4x)), hi = _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(q, 4), m4x));
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int k = 0; k < 4; k++)
          fma_tokens256(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k]))), x, ldx, nt, base + 32 * ib + 8 * k, acc);
      }
    } else if (type == ST_TYPE_Q2_K || type == ST_TYPE_Q3_K) {
#define EMIT256(bytes, dl, ml, at)                                                                          \
  do {                                                                                                      \
    const __m256 vd_ = _mm256_set1_ps(dl), vm_ = _mm256_set1_ps(ml);                                       \
    const __m128i b16_ = (bytes);                                                                           \
    fma_tokens256(_mm256_sub_ps(_mm256_mul_ps(vd_, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b16_))), vm_), x, ldx, nt, \
                  (at), acc);                                                                               \
    fma_tokens256(_mm256_sub_ps(_mm256_mul_ps(vd_, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b16_, 8)))), \
                                vm_),                                                                       \
                  x, ldx, nt, (at) + 8, acc);                                                               \
  } while (0)
      ST_K23_ROW(type, w, blk, base, EMIT256);
#undef EMIT256
    } else { /* Q6_K: two scales per 32 weights, so 16 at a time */
      const st_block_q6_K *b = (const st_block_q6_K *)w + blk;
      const float d = _cvtsh_ss(b->d);
      const __m256i k32 = _mm256_set1_epi32(32);
      for (int h = 0; h < 2; h++) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        for (int qq = 0; qq < 4; qq++) {
          const __m256i l = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + (qq & 1) * 32));
          const __m256i lo = qq < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
          const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * qq), m2), 4));
          const int64_t at = base + 128 * h + 32 * qq;
          const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
          for (int half = 0; half < 2; half++) {
            const __m256 vd = _mm256_set1_ps(d * (float)b->scales[8 * h + 2 * qq + half]);
            for (int k = 0; k < 2; k++) {
              const __m128i part = k ? _mm_srli_si128(halves[half], 8) : halves[half];
              const __m256 qf = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(part), k32));
              fma_tokens256(_mm256_mul_ps(vd, qf), x, ldx, nt, at + 16 * half + 8 * k, acc);
            }
          }
        }
      }
    }
  }
  for (int t = 0; t < nt; t++) out[t * ldo] = hsum8_avx2(acc[t]);
}

static AVX2 void row_tile_k_avx2(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n, float *out,
                                 int64_t ldo) {
  switch (nt) {
  case 1: row_tile_k_avx2_impl(type, w, x, ldx, 1, n, out, ldo); break;
  case 2: row_tile_k_avx2_impl(type, w, x, ldx, 2, n, out, ldo); break;
  case 3: row_tile_k_avx2_impl(type, w, x, ldx, 3, n, out, ldo); break;
  default: row_tile_k_avx2_impl(type, w, x, ldx, 4, n, out, ldo); break;
  }
}

/* ---- legacy 32-weight blocks and grid i-quants --------------------------------------------
 * Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL a block of 32 at a time: the quants unpacked to signed
 * bytes (the fifth bit of Q5_* from qh through a bit mask), each weight formed as quant.c's
 * dequant forms it ((q - offset) * d [+ m], or d * level). IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S
 * 64 (AVX-512) or 32 (AVX2) weights at a time: the grid entries fetched by index with scalar
 * loads (faster than vpgather on Zen 4, and gathers are slow on cores with the Downfall
 * microcode), the signs applied to the magnitudes as bytes (a masked byte negation, or
 * pshufb + psignb), then
 * sub-block scale * signed magnitude, which equals the dequantiser's scale * magnitude * sign
 * exactly. Each weight then meets every token of the tile as in the K-quant kernels. */

/* The sub-block scales of the grid formats, as quant.c computes them. */
static inline float iq2_sub_scale(float d, int s) { return d * (0.5f + (float)s) * 0.25f; }
static inline float iq3xxs_sub_scale(float d, uint32_t aux) { return d * (0.5f + (float)(aux >> 28)) * 0.5f; }
static inline float iq3s_sub_scale(float d, int s) { return d * (float)(1 + 2 * s); }

/* The fields of a legacy block: fp16 scale and min, quants, fifth bits, offset of the quants. */
struct legacy_block {
  float d, m;
  const uint8_t *qs;
  uint32_t qh;
  int off;
};

__attribute__((target("f16c"))) static inline __attribute__((always_inline)) struct legacy_block
legacy_at(uint32_t type, const uint8_t *bb) {
  struct legacy_block l = {0.0f, 0.0f, NULL, 0, 0};
  uint16_t h;
  memcpy(&h, bb, 2);
  l.d = _cvtsh_ss(h);
  switch (type) {
  case ST_TYPE_Q4_0: l.qs = bb + 2, l.off = 8; break;
  case ST_TYPE_Q4_1: memcpy(&h, bb + 2, 2), l.m = _cvtsh_ss(h), l.qs = bb + 4; break;
  case ST_TYPE_Q5_0: memcpy(&l.qh, bb + 2, 4), l.qs = bb + 6, l.off = 16; break;
  case ST_TYPE_Q5_1: memcpy(&h, bb + 2, 2), l.m = _cvtsh_ss(h), memcpy(&l.qh, bb + 4, 4), l.qs = bb + 8; break;
  default: l.qs = bb + 2; break; /* IQ4_NL */
  }
  return l;
}

static inline int legacy_has_min(uint32_t type) { return type == ST_TYPE_Q4_1 || type == ST_TYPE_Q5_1; }
static inline int legacy_has_qh(uint32_t type) { return type == ST_TYPE_Q5_0 || type == ST_TYPE_Q5_1; }

static inline __attribute__((always_inline)) AVX512 __m512 legacy16_ps512(uint32_t type, __m128i q, float d, float m) {
  const __m512 w = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(d));
  return legacy_has_min(type) ? _mm512_add_ps(w, _mm512_set1_ps(m)) : w;
}

static inline __attribute__((always_inline)) AVX512 void row_tile_b_avx512_impl(uint32_t type, const void *w,
                                                                               const float *x, int64_t ldx, int nt,
                                                                               int64_t n, float *out, int64_t ldo) {
  __m512 acc[2 * ST_TILE]; /* two sets: the low and high half of each block */
  for (int t = 0; t < 2 * ST_TILE; t++) acc[t] = _mm512_setzero_ps();
  const uint64_t bs = st_type_info(type)->type_size;
  const __m128i m4 = _mm_set1_epi8(0x0F), kv = _mm_loadu_si128((const __m128i *)st_kvalues_iq4nl);
  for (int64_t blk = 0; blk < n / 32; blk++) {
    const struct legacy_block l = legacy_at(type, (const uint8_t *)w + (uint64_t)blk * bs);
    const __m128i q = _mm_loadu_si128((const __m128i *)l.qs);
    __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    if (type == ST_TYPE_IQ4_NL) {
      lo = _mm_shuffle_epi8(kv, lo);
      hi = _mm_shuffle_epi8(kv, hi);
    } else {
      if (legacy_has_qh(type)) {
        lo = _mm_mask_add_epi8(lo, (__mmask16)(l.qh & 0xFFFF), lo, _mm_set1_epi8(16));
        hi = _mm_mask_add_epi8(hi, (__mmask16)(l.qh >> 16), hi, _mm_set1_epi8(16));
      }
      lo = _mm_sub_epi8(lo, _mm_set1_epi8((char)l.off));
      hi = _mm_sub_epi8(hi, _mm_set1_epi8((char)l.off));
    }
    fma_tokens512(legacy16_ps512(type, lo, l.d, l.m), x, ldx, nt, 32 * blk, acc);
    fma_tokens512(legacy16_ps512(type, hi, l.d, l.m), x, ldx, nt, 32 * blk + 16, acc + ST_TILE);
  }
  for (int t = 0; t < nt; t++) out[t * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t], acc[ST_TILE + t]));
}

/* The sign byte of each of eight 7-bit fields (st_iq_signs, lane-wise), as one 64-bit mask. */
static inline AVX512 uint64_t iq_signs8_epi16(__m128i f) {
  __m128i p = _mm_xor_si128(f, _mm_srli_epi16(f, 4));
  p = _mm_xor_si128(p, _mm_srli_epi16(p, 2));
  p = _mm_xor_si128(p, _mm_srli_epi16(p, 1));
  const __m128i s = _mm_or_si128(f, _mm_slli_epi16(_mm_and_si128(p, _mm_set1_epi16(1)), 7));
  return (uint64_t)_mm_cvtsi128_si64(_mm_cvtepi16_epi8(s));
}

/* 64 signed magnitudes (bytes) times four scales, one per 16 weights, fed to the tokens. */
static inline __attribute__((always_inline)) AVX512 __m512 iq16_ps512(__m128i q, float dl) {
  return _mm512_mul_ps(_mm512_set1_ps(dl), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
}

/* The 64 magnitudes of sub-blocks 2c, 2c + 1 of an IQ2_XS or IQ2_S block (eight 8-byte grid
 * entries, weight order), for the float AVX-512 kernels. */
static inline __attribute__((always_inline)) AVX512 __m512i iq2xs_mags64(const uint16_t *q) {
  return _mm512_setr_epi64((long long)st_iq2xs_grid[q[0] & 511], (long long)st_iq2xs_grid[q[1] & 511],
                           (long long)st_iq2xs_grid[q[2] & 511], (long long)st_iq2xs_grid[q[3] & 511],
                           (long long)st_iq2xs_grid[q[4] & 511], (long long)st_iq2xs_grid[q[5] & 511],
                           (long long)st_iq2xs_grid[q[6] & 511], (long long)st_iq2xs_grid[q[7] & 511]);
}
static inline __attribute__((always_inline)) AVX512 __m512i iq2s_mags64(const uint8_t *q, int h0, int h1) {
  return _mm512_setr_epi64((long long)st_iq2s_grid[q[0] | (h0 & 3) << 8], (long long)st_iq2s_grid[q[1] | (h0 & 12) << 6],
                           (long long)st_iq2s_grid[q[2] | (h0 & 48) << 4], (long long)st_iq2s_grid[q[3] | (h0 & 192) << 2],
                           (long long)st_iq2s_grid[q[4] | (h1 & 3) << 8], (long long)st_iq2s_grid[q[5] | (h1 & 12) << 6],
                           (long long)st_iq2s_grid[q[6] | (h1 & 48) << 4], (long long)st_iq2s_grid[q[7] | (h1 & 192) << 2]);
}

static inline __attribute__((always_inline)) AVX512 void iq64_avx512(__m512i g, const float *dl, const float *x,
                                                                     int64_t ldx, int nt, int64_t at, __m512 *acc) {
  fma_tokens512(iq16_ps512(_mm512_extracti32x4_epi32(g, 0), dl[0]), x, ldx, nt, at, acc);
  fma_tokens512(iq16_ps512(_mm512_extracti32x4_epi32(g, 1), dl[1]), x, ldx, nt, at + 16, acc + ST_TILE);
  fma_tokens512(iq16_ps512(_mm512_extracti32x4_epi32(g, 2), dl[2]), x, ldx, nt, at + 32, acc);
  fma_tokens512(iq16_ps512(_mm512_extracti32x4_epi32(g, 3), dl[3]), x, ldx, nt, at + 48, acc + ST_TILE);
}

static inline __attribute__((always_inline)) AVX512 void row_tile_iq_avx512_impl(uint32_t type, const void *w,
                                                                                const float *x, int64_t ldx, int nt,
                                                                                int64_t n, float *out, int64_t ldo) {
  __m512 acc[2 * ST_TILE]; /* two sets, alternating every 16 weights */
  for (int t = 0; t < 2 * ST_TILE; t++) acc[t] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t blk = 0; blk < n / 256; blk++) {
    const int64_t base = blk * 256;
    for (int c = 0; c < 4; c++) { /* 64 weights: two 32-weight sub-blocks */
      __m512i g;
      uint64_t sg;
      float dl[4];
      if (type == ST_TYPE_IQ2_XS) {
        const st_block_iq2_xs *b = (const st_block_iq2_xs *)w + blk;
        const float d = _cvtsh_ss(b->d);
        const __m128i raw = _mm_loadu_si128((const __m128i *)(b->qs + 8 * c));
        const uint16_t *q = b->qs + 8 * c;
        g = iq2xs_mags64(q);
        sg = iq_signs8_epi16(_mm_srli_epi16(raw, 9));
        for (int k = 0; k < 4; k++) dl[k] = iq2_sub_scale(d, (b->scales[2 * c + k / 2] >> (4 * (k % 2))) & 0xF);
      } else if (type == ST_TYPE_IQ2_S) {
        const st_block_iq2_s *b = (const st_block_iq2_s *)w + blk;
        const float d = _cvtsh_ss(b->d);
        const uint8_t *q = b->qs + 8 * c;
        const int h0 = b->qh[2 * c], h1 = b->qh[2 * c + 1];
        g = iq2s_mags64(q, h0, h1);
        memcpy(&sg, b->qs + 32 + 8 * c, 8);
        for (int k = 0; k < 4; k++) dl[k] = iq2_sub_scale(d, (b->scales[2 * c + k / 2] >> (4 * (k % 2))) & 0xF);
      } else if (type == ST_TYPE_IQ3_XXS) {
        const st_block_iq3_xxs *b = (const st_block_iq3_xxs *)w + blk;
        const float d = _cvtsh_ss(b->d);
        uint32_t aux[2];
        memcpy(aux, b->qs + 64 + 8 * c, 8);
        const uint8_t *q = b->qs + 16 * c;
        g = _mm512_setr_epi32((int)st_iq3xxs_grid[q[0]], (int)st_iq3xxs_grid[q[1]], (int)st_iq3xxs_grid[q[2]], (int)st_iq3xxs_grid[q[3]],
                              (int)st_iq3xxs_grid[q[4]], (int)st_iq3xxs_grid[q[5]], (int)st_iq3xxs_grid[q[6]], (int)st_iq3xxs_grid[q[7]],
                              (int)st_iq3xxs_grid[q[8]], (int)st_iq3xxs_grid[q[9]], (int)st_iq3xxs_grid[q[10]], (int)st_iq3xxs_grid[q[11]],
                              (int)st_iq3xxs_grid[q[12]], (int)st_iq3xxs_grid[q[13]], (int)st_iq3xxs_grid[q[14]], (int)st_iq3xxs_grid[q[15]]);
        const __m256i f = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_setr_epi32((int)aux[0], (int)aux[0], (int)aux[0], (int)aux[0], (int)aux[1],
                                                (int)aux[1], (int)aux[1], (int)aux[1]),
                              _mm256_setr_epi32(0, 7, 14, 21, 0, 7, 14, 21)),
            _mm256_set1_epi32(127));
        sg = iq_signs8_epi16(_mm256_cvtepi32_epi16(f));
        dl[0] = dl[1] = iq3xxs_sub_scale(d, aux[0]);
        dl[2] = dl[3] = iq3xxs_sub_scale(d, aux[1]);
      } else { /* IQ3_S */
        const st_block_iq3_s *b = (const st_block_iq3_s *)w + blk;
        const float d = _cvtsh_ss(b->d);
        const uint8_t *q = b->qs + 16 * c;
        const uint32_t h = (uint32_t)(b->qh[2 * c] | b->qh[2 * c + 1] << 8);
#define G3S(j) (int)st_iq3s_grid[q[j] | ((h >> (j)) & 1) << 8]
        g = _mm512_setr_epi32(G3S(0), G3S(1), G3S(2), G3S(3), G3S(4), G3S(5), G3S(6), G3S(7), G3S(8), G3S(9), G3S(10),
                              G3S(11), G3S(12), G3S(13), G3S(14), G3S(15));
#undef G3S
        memcpy(&sg, b->signs + 8 * c, 8);
        dl[0] = dl[1] = iq3s_sub_scale(d, b->scales[c] & 0xF);
        dl[2] = dl[3] = iq3s_sub_scale(d, b->scales[c] >> 4);
      }
      g = _mm512_mask_sub_epi8(g, (__mmask64)sg, zero, g);
      iq64_avx512(g, dl, x, ldx, nt, base + 64 * c, acc);
    }
  }
  for (int t = 0; t < nt; t++) out[t * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t], acc[ST_TILE + t]));
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
  default: cases(impl, ST_TYPE_IQ4_NL); break;                                                               \
  }
#define ST_GRID_DISPATCH(cases, impl)                                                                        \
  switch (type) {                                                                                            \
  case ST_TYPE_IQ2_XS: cases(impl, ST_TYPE_IQ2_XS); break;                                                   \
  case ST_TYPE_IQ2_S: cases(impl, ST_TYPE_IQ2_S); break;                                                     \
  case ST_TYPE_IQ3_XXS: cases(impl, ST_TYPE_IQ3_XXS); break;                                                 \
  default: cases(impl, ST_TYPE_IQ3_S); break;                                                                \
  }

static AVX512 void row_tile_b_avx512(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                                     float *out, int64_t ldo) {
  ST_B32_DISPATCH(ST_TILE_CASES, row_tile_b_avx512_impl)
}

static AVX512 void row_tile_iq_avx512(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                                      float *out, int64_t ldo) {
  ST_GRID_DISPATCH(ST_TILE_CASES, row_tile_iq_avx512_impl)
}

/* AVX2: the same blocks, eight weights per vector. */
static inline __attribute__((always_inline)) AVX2 void signed8x4_avx2(uint32_t type, __m128i q, float d, float m,
                                                                      const float *x, int64_t ldx, int nt,
                                                                      int64_t at, __m256 *acc) {
  const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
  for (int k = 0; k < 2; k++) {
    const __m128i part = k ? _mm_srli_si128(q, 8) : q;
    __m256 wv = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part)), vd);
    if (legacy_has_min(type)) wv = _mm256_add_ps(wv, vm);
    fma_tokens256(wv, x, ldx, nt, at + 8 * k, acc + ST_TILE * k);
  }
}

/* 0xFF in byte j where bit j of the 16-bit `bits` is set. */
static inline AVX2 __m128i bitmask16_avx2(uint32_t bits) {
  const __m128i sel = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)bits), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
  const __m128i bit = _mm_set1_epi64x((long long)0x8040201008040201ull);
  return _mm_cmpeq_epi8(_mm_and_si128(sel, bit), bit);
}

static inline __attribute__((always_inline)) AVX2 void row_tile_b_avx2_impl(uint32_t type, const void *w,
                                                                           const float *x, int64_t ldx, int nt,
                                                                           int64_t n, float *out, int64_t ldo) {
  __m256 acc[2 * ST_TILE]; /* two sets, alternating every 8 weights */
  for (int t = 0; t < 2 * ST_TILE; t++) acc[t] = _mm256_setzero_ps();
  const uint64_t bs = st_type_info(type)->type_size;
  const __m128i m4 = _mm_set1_epi8(0x0F), kv = _mm_loadu_si128((const __m128i *)st_kvalues_iq4nl);
  for (int64_t blk = 0; blk < n / 32; blk++) {
    const struct legacy_block l = legacy_at(type, (const uint8_t *)w + (uint64_t)blk * bs);
    const __m128i q = _mm_loadu_si128((const __m128i *)l.qs);
    __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    if (type == ST_TYPE_IQ4_NL) {
      lo = _mm_shuffle_epi8(kv, lo);
      hi = _mm_shuffle_epi8(kv, hi);
    } else {
      if (legacy_has_qh(type)) {
        lo = _mm_or_si128(lo, _mm_and_si128(bitmask16_avx2(l.qh & 0xFFFF), _mm_set1_epi8(16)));
        hi = _mm_or_si128(hi, _mm_and_si128(bitmask16_avx2(l.qh >> 16), _mm_set1_epi8(16)));
      }
      lo = _mm_sub_epi8(lo, _mm_set1_epi8((char)l.off));
      hi = _mm_sub_epi8(hi, _mm_set1_epi8((char)l.off));
    }
    signed8x4_avx2(type, lo, l.d, l.m, x, ldx, nt, 32 * blk, acc);
    signed8x4_avx2(type, hi, l.d, l.m, x, ldx, nt, 32 * blk + 16, acc);
  }
  for (int t = 0; t < nt; t++) out[t * ldo] = hsum8_avx2(_mm256_add_ps(acc[t], acc[ST_TILE + t]));
}

static inline __attribute__((always_inline)) AVX2 void row_tile_iq_avx2_impl(uint32_t type, const void *w,
                                                                            const float *x, int64_t ldx, int nt,
                                                                            int64_t n, float *out, int64_t ldo) {
  __m256 acc[2 * ST_TILE]; /* two sets, alternating every 8 weights */
  for (int t = 0; t < 2 * ST_TILE; t++) acc[t] = _mm256_setzero_ps();
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull), one = _mm256_set1_epi8(1);
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                          3, 3, 3, 3, 3, 3, 3);
  for (int64_t blk = 0; blk < n / 256; blk++) {
    const int64_t base = blk * 256;
    for (int s = 0; s < 8; s++) { /* 32 weights: one sub-block */
      __m256i g;
      uint32_t sg;
      float dl[2];
      if (type == ST_TYPE_IQ2_XS) {
        const st_block_iq2_xs *b = (const st_block_iq2_xs *)w + blk;
        const float d = _cvtsh_ss(b->d);
        const uint16_t *q = b->qs + 4 * s;
        g = _mm256_setr_epi64x((long long)st_iq2xs_grid[q[0] & 511], (long long)st_iq2xs_grid[q[1] & 511],
                               (long long)st_iq2xs_grid[q[2] & 511], (long long)st_iq2xs_grid[q[3] & 511]);
        sg = st_iq_signs(q[0] >> 9) | (uint32_t)st_iq_signs(q[1] >> 9) << 8 | (uint32_t)st_iq_signs(q[2] >> 9) << 16 |
             (uint32_t)st_iq_signs(q[3] >> 9) << 24;
        dl[0] = iq2_sub_scale(d, b->scales[s] & 0xF), dl[1] = iq2_sub_scale(d, b->scales[s] >> 4);
      } else if (type == ST_TYPE_IQ2_S) {
        const st_block_iq2_s *b = (const st_block_iq2_s *)w + blk;
        const float d = _cvtsh_ss(b->d);
        const uint8_t *q = b->qs + 4 * s;
        const int h = b->qh[s];
        g = _mm256_setr_epi64x((long long)st_iq2s_grid[q[0] | (h & 3) << 8], (long long)st_iq2s_grid[q[1] | (h & 12) << 6],
                               (long long)st_iq2s_grid[q[2] | (h & 48) << 4], (long long)st_iq2s_grid[q[3] | (h & 192) << 2]);
        memcpy(&sg, b->qs + 32 + 4 * s, 4);
        dl[0] = iq2_sub_scale(d, b->scales[s] & 0xF), dl[1] = iq2_sub_scale(d, b->scales[s] >> 4);
      } else if (type == ST_TYPE_IQ3_XXS) {
        const st_block_iq3_xxs *b = (const st_block_iq3_xxs *)w + blk;
        const uint8_t *q = b->qs + 8 * s;
        uint32_t aux;
        memcpy(&aux, b->qs + 64 + 4 * s, 4);
        g = _mm256_setr_epi32((int)st_iq3xxs_grid[q[0]], (int)st_iq3xxs_grid[q[1]], (int)st_iq3xxs_grid[q[2]],
                              (int)st_iq3xxs_grid[q[3]], (int)st_iq3xxs_grid[q[4]], (int)st_iq3xxs_grid[q[5]],
                              (int)st_iq3xxs_grid[q[6]], (int)st_iq3xxs_grid[q[7]]);
        sg = st_iq_signs(aux & 127) | (uint32_t)st_iq_signs((aux >> 7) & 127) << 8 |
             (uint32_t)st_iq_signs((aux >> 14) & 127) << 16 | (uint32_t)st_iq_signs((aux >> 21) & 127) << 24;
        dl[0] = dl[1] = iq3xxs_sub_scale(_cvtsh_ss(b->d), aux);
      } else { /* IQ3_S */
        const st_block_iq3_s *b = (const st_block_iq3_s *)w + blk;
        const uint8_t *q = b->qs + 8 * s;
        const uint32_t h = b->qh[s];
        g = _mm256_setr_epi32((int)st_iq3s_grid[q[0] | (h & 1) << 8], (int)st_iq3s_grid[q[1] | (h & 2) << 7],
                              (int)st_iq3s_grid[q[2] | (h & 4) << 6], (int)st_iq3s_grid[q[3] | (h & 8) << 5],
                              (int)st_iq3s_grid[q[4] | (h & 16) << 4], (int)st_iq3s_grid[q[5] | (h & 32) << 3],
                              (int)st_iq3s_grid[q[6] | (h & 64) << 2], (int)st_iq3s_grid[q[7] | (h & 128) << 1]);
        memcpy(&sg, b->signs + 4 * s, 4);
        dl[0] = dl[1] = iq3s_sub_scale(_cvtsh_ss(b->d), (b->scales[s / 2] >> (4 * (s % 2))) & 0xF);
      }
      /* byte j of sg's 32 bits set: -1 in byte j, else +1; psignb applies it */
      const __m256i sel = _mm256_shuffle_epi8(_mm256_set1_epi32((int)sg), spread);
      const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(sel, bit), bit);
      g = _mm256_sign_epi8(g, _mm256_or_si256(neg, one));
      const __m128i lo = _mm256_castsi256_si128(g), hi = _mm256_extracti128_si256(g, 1);
      const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
      for (int k = 0; k < 4; k++)
        fma_tokens256(_mm256_mul_ps(_mm256_set1_ps(dl[k / 2]), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k]))), x,
                      ldx, nt, base + 32 * s + 8 * k, acc + ST_TILE * (k % 2));
    }
  }
  for (int t = 0; t < nt; t++) out[t * ldo] = hsum8_avx2(_mm256_add_ps(acc[t], acc[ST_TILE + t]));
}

static AVX2 void row_tile_b_avx2(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                                 float *out, int64_t ldo) {
  ST_B32_DISPATCH(ST_TILE_CASES, row_tile_b_avx2_impl)
}

static AVX2 void row_tile_iq_avx2(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                                  float *out, int64_t ldo) {
  ST_GRID_DISPATCH(ST_TILE_CASES, row_tile_iq_avx2_impl)
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

void st_matmul(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1,
               const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo) {
  static const row_tile_fn fns[] = {row_tile_scalar, row_tile_avx2, row_tile_avx512};
  const row_tile_fn fn = fns[level()];
  row_tile_fn tile = fn;
  const int k_rows = type == ST_TYPE_Q2_K || type == ST_TYPE_Q3_K || type == ST_TYPE_Q4_K || type == ST_TYPE_Q5_K ||
                     type == ST_TYPE_Q6_K || type == ST_TYPE_IQ4_XS;
  const int b_rows = type == ST_TYPE_Q4_0 || type == ST_TYPE_Q4_1 || type == ST_TYPE_Q5_0 || type == ST_TYPE_Q5_1 ||
                     type == ST_TYPE_IQ4_NL;
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
 * Two families. Blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL; st_act_q8_0): each block's
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
 * AVX2, VNNI and VNNI + VBMI code below compute exactly these integers and these float operations. */

static int q8_family(uint32_t type) {
  switch (type) {
  case ST_TYPE_Q8_0: case ST_TYPE_Q4_0: case ST_TYPE_Q4_1: case ST_TYPE_Q5_0: case ST_TYPE_Q5_1: case ST_TYPE_IQ4_NL:
    return 1;
  case ST_TYPE_Q2_K: case ST_TYPE_Q3_K: case ST_TYPE_Q4_K: case ST_TYPE_Q5_K: case ST_TYPE_Q6_K: case ST_TYPE_IQ4_XS:
  case ST_TYPE_IQ2_XS: case ST_TYPE_IQ2_S: case ST_TYPE_IQ3_XXS: case ST_TYPE_IQ3_S:
    return 2;
  default: return 0;
  }
}

/* The grid formats (IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): per 8 or 4 weights a grid entry of unsigned
 * magnitudes and per weight a sign bit; the sub-block scale is an odd integer 2 s + 1 times d / 8
 * (IQ2), d / 4 (IQ3_XXS) or d (IQ3_S), the power of two folded into the float scale. Their
 * activation rows also carry the quants in plane order (grid_planes_at). */
static inline int k_is_grid(uint32_t type) {
  return type == ST_TYPE_IQ2_XS || type == ST_TYPE_IQ2_S || type == ST_TYPE_IQ3_XXS || type == ST_TYPE_IQ3_S;
}

uint64_t st_q8_row_bytes(uint32_t type, int64_t n) {
  const int f = q8_family(type);
  if (f == 1 && n > 0 && n % 32 == 0) return (uint64_t)(n / 32) * sizeof(st_act_q8_0);
  if (f == 2 && n > 0 && n % 256 == 0)
    return (uint64_t)(n / 256) * (sizeof(st_act_q8_K) + (k_is_grid(type) ? 256 : 0));
  return 0;
}

/* Where the plane-order copy of super-block b's quants starts in a grid format's activation row of
 * n values (after the n / 256 st_act_q8_K): byte 64 q + k is quant 4 k + q (q < 4), so that
 * plane q holds the activations of byte q of the 64 IQ3 grid entries, or of bytes q and q + 4 of
 * the 32 IQ2 entries in turn (k = 2 i + h: byte q + 4 h of entry i), which is how the AVX2 and
 * AVX-512 kernels look the grids up (struct gridp). */
static inline uint64_t grid_planes_at(int64_t n, int64_t b) {
  return (uint64_t)(n / 256) * sizeof(st_act_q8_K) + 256 * (uint64_t)b;
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

/* Bytes per weight block of the 32-block family; the fp16 scale is at offset 0 in all of them. */
static inline uint64_t b32_bytes(uint32_t type) {
  switch (type) {
  case ST_TYPE_Q8_0: return sizeof(st_block_q8_0);
  case ST_TYPE_Q4_0: return sizeof(st_block_q4_0);
  case ST_TYPE_Q4_1: return sizeof(st_block_q4_1);
  case ST_TYPE_Q5_0: return sizeof(st_block_q5_0);
  case ST_TYPE_Q5_1: return sizeof(st_block_q5_1);
  default: return sizeof(st_block_iq4_nl);
  }
}

/* Q4_1 and Q5_1 (w = d q + m, q unsigned): the fp16 min at offset 2; lane j of a block also
 * carries m dx times the sum of its eight activation quants. */
static inline int b32_has_min(uint32_t type) { return type == ST_TYPE_Q4_1 || type == ST_TYPE_Q5_1; }

/* Offset of the nibbles and (Q5_0/Q5_1) of the 32 fifth bits in a block. */
static inline int b32_qs_at(uint32_t type) {
  return type == ST_TYPE_Q4_1 ? 4 : type == ST_TYPE_Q5_0 ? 6 : type == ST_TYPE_Q5_1 ? 8 : 2;
}
static inline int b32_qh_at(uint32_t type) { return type == ST_TYPE_Q5_0 ? 2 : 4; }

/* The 16 accumulators' fixed reduction tree (hsum8_avx2's order on A[j] + A[8 + j]). */
static inline float q8_reduce16(const float *a) {
  float s[8];
  for (int j = 0; j < 8; j++) s[j] = a[j] + a[8 + j];
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* The 6-bit scales and mins of a Q4_K/Q5_K block as 16 bytes (scales 0..7, then mins 0..7),
 * unpacked as ggml's vec_dot_q4_K does (utmp masks). */
static inline void k45_unpack(const uint8_t *packed, uint8_t *sm) {
  uint32_t u[4];
  memcpy(u, packed, 12);
  u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
  const uint32_t mins_lo = u[1] & 0x3f3f3f3f;
  u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
  u[2] = mins_lo;
  u[0] &= 0x3f3f3f3f;
  memcpy(sm, u, 16);
}

/* The per-16 integer scales and mins of a K super-block and its float scales (scalar path). */
struct kscales {
  float d, dmin;  /* dmin 0 when the format has no min */
  int16_t sc[16]; /* scale of weights 16k .. 16k + 15 */
  int16_t mv[16]; /* Q4_K/Q5_K: min per 16; Q6_K: 32 * sc (the offset); IQ4_XS: 0 */
};

static inline float grid_d_mul(uint32_t type) {
  return type == ST_TYPE_IQ3_S ? 1.0f : type == ST_TYPE_IQ3_XXS ? 0.25f : 0.125f;
}

/* The odd integer scale 2 s + 1 of 32-weight sub-block s of a grid block, for its first (h = 0)
 * and second (h = 1) 16 weights. */
static inline int16_t grid_sub_scale(uint32_t type, const uint8_t *bb, int s, int h) {
  if (type == ST_TYPE_IQ2_XS || type == ST_TYPE_IQ2_S) {
    const uint8_t *sc = type == ST_TYPE_IQ2_XS ? ((const st_block_iq2_xs *)(const void *)bb)->scales
                                               : ((const st_block_iq2_s *)(const void *)bb)->scales;
    return (int16_t)(2 * ((sc[s] >> (4 * h)) & 0xF) + 1);
  }
  if (type == ST_TYPE_IQ3_XXS) {
    uint32_t aux;
    memcpy(&aux, bb + offsetof(st_block_iq3_xxs, qs) + 64 + 4 * s, 4);
    return (int16_t)(2 * (aux >> 28) + 1);
  }
  const st_block_iq3_s *b = (const st_block_iq3_s *)(const void *)bb;
  return (int16_t)(2 * ((b->scales[s / 2] >> (4 * (s % 2))) & 0xF) + 1);
}

/* Sub-block s of a grid block: the 32 magnitudes (bytes, weight order) and the 32 sign bits. */
static inline void grid_group(uint32_t type, const uint8_t *bb, int s, uint8_t *m, uint32_t *sg) {
  if (type == ST_TYPE_IQ2_XS) {
    const st_block_iq2_xs *b = (const st_block_iq2_xs *)(const void *)bb;
    uint16_t q[4];
    memcpy(q, b->qs + 4 * s, 8);
    *sg = 0;
    for (int k = 0; k < 4; k++) {
      const uint64_t g = st_iq2xs_grid[q[k] & 511];
      memcpy(m + 8 * k, &g, 8);
      *sg |= (uint32_t)st_iq_signs((uint32_t)q[k] >> 9) << (8 * k);
    }
  } else if (type == ST_TYPE_IQ2_S) {
    const st_block_iq2_s *b = (const st_block_iq2_s *)(const void *)bb;
    const int h = b->qh[s];
    for (int k = 0; k < 4; k++) {
      const uint64_t g = st_iq2s_grid[b->qs[4 * s + k] | ((h >> (2 * k)) & 3) << 8];
      memcpy(m + 8 * k, &g, 8);
    }
    memcpy(sg, b->qs + 32 + 4 * s, 4);
  } else if (type == ST_TYPE_IQ3_XXS) {
    const st_block_iq3_xxs *b = (const st_block_iq3_xxs *)(const void *)bb;
    uint32_t aux;
    memcpy(&aux, b->qs + 64 + 4 * s, 4);
    for (int k = 0; k < 8; k++) memcpy(m + 4 * k, &st_iq3xxs_grid[b->qs[8 * s + k]], 4);
    *sg = 0;
    for (int k = 0; k < 4; k++) *sg |= (uint32_t)st_iq_signs((aux >> (7 * k)) & 127) << (8 * k);
  } else { /* IQ3_S */
    const st_block_iq3_s *b = (const st_block_iq3_s *)(const void *)bb;
    const int h = b->qh[s];
    for (int k = 0; k < 8; k++) memcpy(m + 4 * k, &st_iq3s_grid[b->qs[8 * s + k] | ((h >> k) & 1) << 8], 4);
    memcpy(sg, b->signs + 4 * s, 4);
  }
}

static inline void k_scales(uint32_t type, const uint8_t *bb, struct kscales *k) {
  uint16_t dh, mh = 0;
  memcpy(&dh, type == ST_TYPE_Q6_K ? bb + offsetof(st_block_q6_K, d) : bb, 2); /* Q2_K, Q3_K: below */
  if (type == ST_TYPE_Q4_K || type == ST_TYPE_Q5_K) {
    memcpy(&mh, bb + 2, 2);
    uint8_t sm[16];
    k45_unpack(bb + 4, sm);
    for (int j = 0; j < 8; j++) {
      k->sc[2 * j] = k->sc[2 * j + 1] = sm[j];
      k->mv[2 * j] = k->mv[2 * j + 1] = sm[8 + j];
    }
  } else if (type == ST_TYPE_Q6_K) {
    const st_block_q6_K *b = (const st_block_q6_K *)(const void *)bb;
    for (int j = 0; j < 16; j++) k->sc[j] = b->scales[j], k->mv[j] = (int16_t)(32 * b->scales[j]);
  } else if (type == ST_TYPE_Q2_K) {
    const st_block_q2_K *b = (const st_block_q2_K *)(const void *)bb;
    for (int j = 0; j < 16; j++) k->sc[j] = b->scales[j] & 0xF, k->mv[j] = b->scales[j] >> 4;
    dh = b->d, mh = b->dmin;
  } else if (type == ST_TYPE_Q3_K) {
    const st_block_q3_K *b = (const st_block_q3_K *)(const void *)bb;
    int8_t sc[16];
    q3k_scales(b->scales, sc);
    for (int j = 0; j < 16; j++) k->sc[j] = (int16_t)(sc[j] - 32), k->mv[j] = (int16_t)(4 * (sc[j] - 32));
    dh = b->d;
  } else if (k_is_grid(type)) {
    for (int j = 0; j < 8; j++) k->sc[2 * j] = grid_sub_scale(type, bb, j, 0), k->sc[2 * j + 1] = grid_sub_scale(type, bb, j, 1);
    memset(k->mv, 0, sizeof k->mv);
  } else { /* IQ4_XS */
    const st_block_iq4_xs *b = (const st_block_iq4_xs *)(const void *)bb;
    for (int j = 0; j < 8; j++) k->sc[2 * j] = k->sc[2 * j + 1] = (int16_t)iq4_xs_sub_scale(b, j);
    memset(k->mv, 0, sizeof k->mv);
  }
  k->d = st_fp16_to_f32(dh);
  if (k_is_grid(type)) k->d *= grid_d_mul(type);
  k->dmin = st_fp16_to_f32(mh);
}

static inline uint64_t k_bytes(uint32_t type) {
  switch (type) {
  case ST_TYPE_Q2_K: return sizeof(st_block_q2_K);
  case ST_TYPE_Q3_K: return sizeof(st_block_q3_K);
  case ST_TYPE_Q4_K: return sizeof(st_block_q4_K);
  case ST_TYPE_Q5_K: return sizeof(st_block_q5_K);
  case ST_TYPE_Q6_K: return sizeof(st_block_q6_K);
  case ST_TYPE_IQ2_XS: return sizeof(st_block_iq2_xs);
  case ST_TYPE_IQ2_S: return sizeof(st_block_iq2_s);
  case ST_TYPE_IQ3_XXS: return sizeof(st_block_iq3_xxs);
  case ST_TYPE_IQ3_S: return sizeof(st_block_iq3_s);
  default: return sizeof(st_block_iq4_xs);
  }
}

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

/* scalar: the integer quants of a block, then the loops that define the sums */
static void b32_quants_scalar(uint32_t type, const uint8_t *bb, int8_t *q) {
  if (type == ST_TYPE_Q8_0) {
    memcpy(q, bb + 2, 32);
    return;
  }
  const uint8_t *qs = bb + b32_qs_at(type);
  uint32_t qh = 0;
  if (type == ST_TYPE_Q5_0 || type == ST_TYPE_Q5_1) memcpy(&qh, bb + b32_qh_at(type), 4);
  for (int l = 0; l < 16; l++) {
    const int lo = qs[l] & 0xF, hi = qs[l] >> 4;
    const int lo5 = lo | ((qh >> l) & 1) << 4, hi5 = hi | ((qh >> (l + 16)) & 1) << 4;
    switch (type) {
    case ST_TYPE_Q4_0: q[l] = (int8_t)(lo - 8), q[l + 16] = (int8_t)(hi - 8); break;
    case ST_TYPE_Q4_1: q[l] = (int8_t)lo, q[l + 16] = (int8_t)hi; break;
    case ST_TYPE_Q5_0: q[l] = (int8_t)(lo5 - 16), q[l + 16] = (int8_t)(hi5 - 16); break;
    case ST_TYPE_Q5_1: q[l] = (int8_t)lo5, q[l + 16] = (int8_t)hi5; break;
    default: q[l] = st_kvalues_iq4nl[lo], q[l + 16] = st_kvalues_iq4nl[hi];
    }
  }
}

static void k_quants_scalar(uint32_t type, const uint8_t *bb, int8_t *q) {
  if (k_is_grid(type)) { /* signed magnitudes */
    for (int s = 0; s < 8; s++) {
      uint8_t m[32];
      uint32_t sg;
      grid_group(type, bb, s, m, &sg);
      for (int j = 0; j < 32; j++) q[32 * s + j] = (int8_t)((sg >> j) & 1 ? -m[j] : m[j]);
    }
  } else if (type == ST_TYPE_Q2_K || type == ST_TYPE_Q3_K) {
    /* weight 128n + 32s + l: bits 2s of qs[32n + l]; Q3_K: + 4 when bit 4n + s of hmask[l] is set */
    const uint8_t *qs = type == ST_TYPE_Q2_K ? ((const st_block_q2_K *)(const void *)bb)->qs
                                             : ((const st_block_q3_K *)(const void *)bb)->qs;
    const uint8_t *hm = ((const st_block_q3_K *)(const void *)bb)->hmask;
    for (int nn = 0; nn < 2; nn++)
      for (int sh = 0; sh < 4; sh++)
        for (int l = 0; l < 32; l++) {
          int v = (qs[32 * nn + l] >> (2 * sh)) & 3;
          if (type == ST_TYPE_Q3_K) v |= ((hm[l] >> (4 * nn + sh)) & 1) << 2;
          q[128 * nn + 32 * sh + l] = (int8_t)v;
        }
  } else if (type == ST_TYPE_Q4_K || type == ST_TYPE_Q5_K) {
    const int k5 = type == ST_TYPE_Q5_K;
    const uint8_t *qs = bb + (k5 ? 48 : 16), *qh = bb + 16;
    for (int j = 0; j < 4; j++)
      for (int l = 0; l < 32; l++) {
        q[64 * j + l] = (int8_t)((qs[32 * j + l] & 0xF) | (k5 ? ((qh[l] >> (2 * j)) & 1) << 4 : 0));
        q[64 * j + 32 + l] = (int8_t)((qs[32 * j + l] >> 4) | (k5 ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0));
      }
  } else if (type == ST_TYPE_Q6_K) {
    const st_block_q6_K *b = (const st_block_q6_K *)(const void *)bb;
    for (int h = 0; h < 2; h++)
      for (int l = 0; l < 32; l++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        q[128 * h + l] = (int8_t)((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4);
        q[128 * h + l + 32] = (int8_t)((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4);
        q[128 * h + l + 64] = (int8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
        q[128 * h + l + 96] = (int8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
      }
  } else { /* IQ4_XS */
    const st_block_iq4_xs *b = (const st_block_iq4_xs *)(const void *)bb;
    for (int ib = 0; ib < 8; ib++)
      for (int l = 0; l < 16; l++) {
        q[32 * ib + l] = st_kvalues_iq4nl[b->qs[16 * ib + l] & 0xF];
        q[32 * ib + 16 + l] = st_kvalues_iq4nl[b->qs[16 * ib + l] >> 4];
      }
  }
}

static void q8_row_scalar(uint32_t type, const void *w, const uint8_t *xq, int64_t ldq, int nt, int64_t n,
                          float *out, int64_t ldo) {
  int8_t q[256];
  if (q8_family(type) == 1) {
    const uint64_t bs = b32_bytes(type);
    for (int t = 0; t < nt; t++) {
      const st_act_q8_0 *x = (const st_act_q8_0 *)(const void *)(xq + t * ldq);
      float a[16] = {0};
      for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *bb = (const uint8_t *)w + (uint64_t)b * bs;
        uint16_t dh;
        memcpy(&dh, bb, 2);
        b32_quants_scalar(type, bb, q);
        const float s = st_fp16_to_f32(dh) * x[b].d;
        uint16_t mh = 0;
        if (b32_has_min(type)) memcpy(&mh, bb + 2, 2);
        const float sm = st_fp16_to_f32(mh) * x[b].d;
        for (int j = 0; j < 4; j++) {
          int32_t p = 0, sx = 0;
          for (int i = 4 * j; i < 4 * j + 4; i++)
            p += q[i] * x[b].qs[i] + q[i + 16] * x[b].qs[i + 16], sx += x[b].qs[i] + x[b].qs[i + 16];
          float *aj = &a[4 * (b & 3) + j];
          *aj = fmaf(s, (float)p, *aj);
          if (b32_has_min(type)) *aj = fmaf(sm, (float)sx, *aj);
        }
      }
      out[t * ldo] = q8_reduce16(a);
    }
    return;
  }
  const uint64_t bs = k_bytes(type);
  for (int t = 0; t < nt; t++) {
    const st_act_q8_K *x = (const st_act_q8_K *)(const void *)(xq + t * ldq);
    float a[16] = {0}, am[8] = {0};
    for (int64_t b = 0; b < n / 256; b++) {
      const uint8_t *bb = (const uint8_t *)w + (uint64_t)b * bs;
      struct kscales k;
      k_scales(type, bb, &k);
      k_quants_scalar(type, bb, q);
      int32_t S[16] = {0}, M[8];
      if (k_is_grid(type))
        for (int i = 0; i < 256; i++)
          S[i / 16] += k.sc[i / 16] * q[i] * x[b].qs[i];
      else
        for (int i = 0; i < 256; i++)
          S[i % 64 / 4] += k.sc[i / 16] * q[i] * x[b].qs[i];
      for (int j = 0; j < 8; j++) {
        M[j] = k.mv[2 * j] * x[b].bsums[2 * j] + k.mv[2 * j + 1] * x[b].bsums[2 * j + 1];
        if (k_has_offset(type)) S[j] -= M[j];
      }
      k_accumulate(type, k.d, k.dmin, x[b].d, S, M, a, am);
    }
    out[t * ldo] = k_reduce(type, a, am);
  }
}

/* Software prefetch in the integer kernels (AVX2 and VNNI; results do not change): each CPU-pool
 * thread streams its weight rows once, and on the GPU host's Xeon the hardware prefetchers alone
 * did not keep enough misses in flight (bench/RESULTS.md, 2026-11-30: 2 KiB ahead, 1.2-1.7x at
 * 16 threads). Rows lie back to back, so running ahead crosses into the next row; a prefetch past
 * the end of the weights never faults. */
#ifndef ST_PREFETCH_AHEAD /* bytes (two-row reads: at least this far, in whole pairs); 0 turns it off */
#define ST_PREFETCH_AHEAD 2048
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

/* AVX2 */
/* The 32 fifth bits of a Q5_0/Q5_1 block as bytes 0x10 or 0 (ggml's bytes_from_bits_32). */
static inline AVX2 __m256i b32_bit5_avx2(const uint8_t *qh) {
  uint32_t h;
  memcpy(&h, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                                       0x0101010101010101, 0));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* The 32 integer quants of a block in weight order: signed (Q8_0, Q4_0, Q5_0, IQ4_NL) or unsigned
 * (Q4_1, Q5_1). */
static inline AVX2 __m256i b32_quants_avx2(uint32_t type, const uint8_t *bb) {
  if (type == ST_TYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)(bb + 2));
  const __m128i q = _mm_loadu_si128((const __m128i *)(bb + b32_qs_at(type))), m4 = _mm_set1_epi8(0xF);
  __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
  if (type == ST_TYPE_IQ4_NL) {
    const __m128i kv = _mm_loadu_si128((const __m128i *)st_kvalues_iq4nl);
    return _mm256_set_m128i(_mm_shuffle_epi8(kv, hi), _mm_shuffle_epi8(kv, lo));
  }
  __m256i v = _mm256_set_m128i(hi, lo);
  if (type == ST_TYPE_Q5_0 || type == ST_TYPE_Q5_1) v = _mm256_or_si256(v, b32_bit5_avx2(bb + b32_qh_at(type)));
  if (type == ST_TYPE_Q4_0) v = _mm256_sub_epi8(v, _mm256_set1_epi8(8));
  if (type == ST_TYPE_Q5_0) v = _mm256_sub_epi8(v, _mm256_set1_epi8(16));
  return v;
}

/* 32 products of a block folded to its four canonical lanes (lane j: weights 4j..4j+3 and
 * 16 + 4j..16 + 4j + 3). */
static inline AVX2 __m128 fold4_avx2(__m256i p) {
  return _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
}

static inline __attribute__((always_inline)) AVX2 void q8_tile_b32_avx2_impl(uint32_t type, const void *w,
                                                                             const uint8_t *xq, int64_t ldq, int nt,
                                                                             int64_t n, float *out, int64_t ldo) {
  __m128 acc[4 * ST_TILE]; /* A[4k..4k+3] of token t in acc[4t + k] */
  for (int t = 0; t < 4 * ST_TILE; t++)
    acc[t] = _mm_setzero_ps();
  const uint64_t bs = b32_bytes(type);
  const __m256i ones = _mm256_set1_epi16(1), ones8 = _mm256_set1_epi8(1);
  const int with_min = b32_has_min(type);
  for (int64_t b = 0; b < n / 32; b++) {
    const uint8_t *bb = (const uint8_t *)w + (uint64_t)b * bs;
    prefetch_ahead(bb, bs);
    uint16_t dh, mh = 0;
    memcpy(&dh, bb, 2);
    if (with_min) memcpy(&mh, bb + 2, 2);
    const float dw = _cvtsh_ss(dh), mw = _cvtsh_ss(mh);
    const __m256i v = b32_quants_avx2(type, bb), av = with_min ? v : _mm256_abs_epi8(v);
    for (int t = 0; t < nt; t++) {
      const st_act_q8_0 *x = (const st_act_q8_0 *)(const void *)(xq + t * ldq) + b;
      const __m256i xv = _mm256_loadu_si256((const __m256i *)x->qs);
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(av, with_min ? xv : _mm256_sign_epi8(xv, v)), ones);
      __m128 *a = acc + 4 * t + (b & 3);
      *a = _mm_fmadd_ps(_mm_set1_ps(dw * x->d), fold4_avx2(p), *a);
      if (with_min) {
        const __m256i sx = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, xv), ones);
        *a = _mm_fmadd_ps(_mm_set1_ps(mw * x->d), fold4_avx2(sx), *a);
      }
    }
  }
  for (int t = 0; t < nt; t++)
    out[t * ldo] = hsum8_avx2(_mm256_add_ps(_mm256_set_m128(acc[4 * t + 1], acc[4 * t]),
                                            _mm256_set_m128(acc[4 * t + 3], acc[4 * t + 2])));
}

/* A K super-block's scales in registers: the int16 scale of each 16 weights (sc16), the min (or
 * Q6_K offset) term per 16 as kscales.mv (mv16), and the float scales. */
struct kvec {
  __m256i sc16, mv16;
  float d, dmin;
};

/* k45_unpack with byte shuffles: the 12 packed bytes (read as 16: the block goes on) to the 8
 * scales and 8 mins. */
static inline __attribute__((always_inline)) AVX2 __m128i k45_unpack_sse(const uint8_t *packed) {
  const __m128i s = _mm_loadu_si128((const __m128i *)packed);
  /* low bits: scales 0..3 s[0..3] & 63, 4..7 s[8..11] & 15; mins 0..3 s[4..7] & 63, 4..7 s[8..11] >> 4 */
  const __m128i lo = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i lo4 = _mm_blend_epi32(lo, _mm_srli_epi16(lo, 4), 0x8);
  const __m128i low = _mm_and_si128(lo4, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
  /* high bits of scales and mins 4..7: the top two bits of s[0..3] and s[4..7], moved to bits 4, 5 */
  const __m128i hi = _mm_shuffle_epi8(s, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  return _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16(hi, 2), _mm_set1_epi8(0x30)));
}

/* The 8 signed sub-block scales of an IQ4_XS block, bytes 0..7. */
static inline __attribute__((always_inline)) AVX2 __m128i iq4_xs_scales_sse(const st_block_iq4_xs *b) {
  return _mm_sub_epi8(_mm_cvtsi64_si128((long long)iq4_xs_scales8(b)), _mm_set1_epi8(32));
}

/* q3k_scales with byte shuffles (before the - 32): the 12 packed bytes read as the last 16 bytes
 * up to them (the end of qs first), so the load stays inside the block. */
static inline __attribute__((always_inline)) AVX2 __m128i q3k_scales_sse(const uint8_t *packed) {
  const __m128i s = _mm_loadu_si128((const __m128i *)(packed - 4));
  /* low 4 bits: scales 0..7 the low nibbles of bytes 0..7, scales 8..15 their high nibbles */
  const __m128i lo = _mm_shuffle_epi8(s, _mm_setr_epi8(4, 5, 6, 7, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i low = _mm_and_si128(_mm_blend_epi32(lo, _mm_srli_epi16(lo, 4), 0xC), _mm_set1_epi8(0xF));
  /* high 2 bits: scales 4m .. 4m + 3 take bits 2m, 2m + 1 of bytes 8..11 */
  const __m128i hi =
      _mm_shuffle_epi8(s, _mm_setr_epi8(12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15));
  const __m128i high = _mm_and_si128(_mm_srlv_epi32(hi, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
  return _mm_or_si128(low, _mm_slli_epi16(high, 4));
}

static inline __attribute__((always_inline)) AVX2 struct kvec k_vec_avx2(uint32_t type, const uint8_t *bb) {
  struct kvec k;
  if (type == ST_TYPE_Q4_K || type == ST_TYPE_Q5_K) {
    uint16_t dh, mh;
    memcpy(&dh, bb, 2);
    memcpy(&mh, bb + 2, 2);
    const __m128i v = k45_unpack_sse(bb + 4);
    k.sc16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v, v));
    k.mv16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(v, v));
    k.d = _cvtsh_ss(dh), k.dmin = _cvtsh_ss(mh);
  } else if (type == ST_TYPE_Q2_K) {
    const st_block_q2_K *b = (const st_block_q2_K *)(const void *)bb;
    const __m128i v = _mm_loadu_si128((const __m128i *)b->scales), m4 = _mm_set1_epi8(0xF);
    k.sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(v, m4));
    k.mv16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m4));
    k.d = _cvtsh_ss(b->d), k.dmin = _cvtsh_ss(b->dmin);
  } else if (type == ST_TYPE_Q3_K) {
    const st_block_q3_K *b = (const st_block_q3_K *)(const void *)bb;
    k.sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(q3k_scales_sse(b->scales)), _mm256_set1_epi16(32));
    k.mv16 = _mm256_slli_epi16(k.sc16, 2);
    k.d = _cvtsh_ss(b->d), k.dmin = 0.0f;
  } else if (type == ST_TYPE_Q6_K) {
    const st_block_q6_K *b = (const st_block_q6_K *)(const void *)bb;
    k.sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    k.mv16 = _mm256_slli_epi16(k.sc16, 5);
    k.d = _cvtsh_ss(b->d), k.dmin = 0.0f;
  } else if (type == ST_TYPE_IQ2_XS || type == ST_TYPE_IQ2_S) {
    /* scales[s]: low nibble weights 32s .. + 15, high nibble 32s + 16 .. + 31 */
    const uint8_t *sc = bb + (type == ST_TYPE_IQ2_XS ? offsetof(st_block_iq2_xs, scales) : offsetof(st_block_iq2_s, scales));
    const __m128i v = _mm_loadl_epi64((const __m128i *)sc), m4 = _mm_set1_epi8(0xF);
    const __m128i s = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    k.sc16 = _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(s), 1), _mm256_set1_epi16(1));
    k.mv16 = _mm256_setzero_si256();
    uint16_t dh;
    memcpy(&dh, bb, 2);
    k.d = _cvtsh_ss(dh) * grid_d_mul(type), k.dmin = 0.0f;
  } else if (k_is_grid(type)) { /* IQ3_XXS, IQ3_S: one scale per 32 weights, s in int32 lane s */
    __m256i s;
    if (type == ST_TYPE_IQ3_XXS) {
      s = _mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(bb + offsetof(st_block_iq3_xxs, qs) + 64)),
                            28);
    } else {
      uint32_t l32;
      memcpy(&l32, ((const st_block_iq3_s *)(const void *)bb)->scales, 4);
      s = _mm256_and_si256(
          _mm256_srlv_epi32(_mm256_set1_epi32((int)l32), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
          _mm256_set1_epi32(0xF));
    }
    s = _mm256_add_epi32(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(1));
    k.sc16 = _mm256_or_si256(s, _mm256_slli_epi32(s, 16)); /* both int16 halves */
    k.mv16 = _mm256_setzero_si256();
    uint16_t dh;
    memcpy(&dh, bb, 2);
    k.d = _cvtsh_ss(dh) * grid_d_mul(type), k.dmin = 0.0f;
  } else { /* IQ4_XS */
    const st_block_iq4_xs *b = (const st_block_iq4_xs *)(const void *)bb;
    const __m128i v = iq4_xs_scales_sse(b);
    k.sc16 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, v));
    k.mv16 = _mm256_setzero_si256();
    k.d = _cvtsh_ss(b->d), k.dmin = 0.0f;
  }
  return k;
}

/* Group g (weights 32g .. 32g + 31) of a K super-block as 32 bytes in weight order: unsigned
 * quants (Q4_K, Q5_K, Q6_K) or signed levels (IQ4_XS). */
static inline __attribute__((always_inline)) AVX2 __m256i k_group_avx2(uint32_t type, const uint8_t *bb, int g) {
  const __m256i m4 = _mm256_set1_epi8(0xF);
  if (type == ST_TYPE_Q2_K || type == ST_TYPE_Q3_K) {
    const int k3 = type == ST_TYPE_Q3_K;
    const uint8_t *qs = k3 ? ((const st_block_q3_K *)(const void *)bb)->qs : ((const st_block_q2_K *)(const void *)bb)->qs;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * (g / 4)));
    __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (g % 4)), _mm256_set1_epi8(3));
    if (k3) {
      const __m256i hm = _mm256_loadu_si256((const __m256i *)((const st_block_q3_K *)(const void *)bb)->hmask);
      v = _mm256_or_si256(v, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, g), _mm256_set1_epi8(1)), 2));
    }
    return v;
  }
  if (type == ST_TYPE_Q4_K || type == ST_TYPE_Q5_K) {
    const int k5 = type == ST_TYPE_Q5_K;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(bb + (k5 ? 48 : 16) + 32 * (g / 2)));
    __m256i v = _mm256_and_si256(g & 1 ? _mm256_srli_epi16(q, 4) : q, m4);
    if (k5) {
      const __m256i qh = _mm256_loadu_si256((const __m256i *)(bb + 16));
      v = _mm256_or_si256(v, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, g), _mm256_set1_epi8(1)), 4));
    }
    return v;
  }
  if (type == ST_TYPE_Q6_K) {
    const st_block_q6_K *b = (const st_block_q6_K *)(const void *)bb;
    const int h = g / 4, qq = g % 4;
    const __m256i l = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + (qq & 1) * 32));
    const __m256i lo = qq < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * qq), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
  }
  const st_block_iq4_xs *b = (const st_block_iq4_xs *)(const void *)bb;
  const __m128i q = _mm_loadu_si128((const __m128i *)(b->qs + 16 * g)), kv = _mm_loadu_si128((const __m128i *)st_kvalues_iq4nl);
  const __m128i m4x = _mm_set1_epi8(0xF);
  return _mm256_set_m128i(_mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(q, 4), m4x)), _mm_shuffle_epi8(kv, _mm_and_si128(q, m4x)));
}

/* The grid formats on AVX2, in the plane order of the AVX-512 kernels (struct gridp): per half h
 * of a super-block, four plane vectors of 32 positions (IQ3: entries 32 h ..; IQ2: entries 16 h ..,
 * two positions each) built from scalar grid loads, in an order that one in-lane byte transpose
 * and two levels of unpacks turn into plane order; the plane-order activations multiply them
 * directly, and int32 lane d of half h is k_accumulate's lane 8 h + d (no horizontal adds). */
static inline __attribute__((always_inline)) AVX2 void grid_half_avx2(uint32_t type, const uint8_t *bb, int h,
                                                                      __m256i *pl) {
  __m256i g[4];
  if (type == ST_TYPE_IQ3_XXS || type == ST_TYPE_IQ3_S) {
    /* g[s]: entries 32 h + 4 s .. + 3 (lane 0) and 32 h + 16 + 4 s .. + 3 (lane 1), one per int32 */
    const uint32_t *grid = type == ST_TYPE_IQ3_S ? st_iq3s_grid : st_iq3xxs_grid;
    const uint8_t *qs = type == ST_TYPE_IQ3_S ? ((const st_block_iq3_s *)(const void *)bb)->qs
                                              : ((const st_block_iq3_xxs *)(const void *)bb)->qs;
    uint64_t qh = 0; /* IQ3_S: bit k is index k's bit 8 */
    if (type == ST_TYPE_IQ3_S) memcpy(&qh, ((const st_block_iq3_s *)(const void *)bb)->qh, 8);
#define ST_E3(k) (int)grid[qs[k] | ((qh >> (k)) & 1) << 8]
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
      const int e = 32 * h + 4 * s;
      g[s] = _mm256_setr_epi32(ST_E3(e), ST_E3(e + 1), ST_E3(e + 2), ST_E3(e + 3), ST_E3(e + 16),
                               ST_E3(e + 17), ST_E3(e + 18), ST_E3(e + 19));
    }
#undef ST_E3
    /* in each lane, byte q of its four entries to int32 q; then int32 q of g[0..3] side by side */
    const __m256i t = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1,
                                       5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++)
      g[s] = _mm256_shuffle_epi8(g[s], t);
    const __m256i a = _mm256_unpacklo_epi32(g[0], g[1]), b = _mm256_unpackhi_epi32(g[0], g[1]),
                  c = _mm256_unpacklo_epi32(g[2], g[3]), d = _mm256_unpackhi_epi32(g[2], g[3]);
    pl[0] = _mm256_unpacklo_epi64(a, c), pl[1] = _mm256_unpackhi_epi64(a, c);
    pl[2] = _mm256_unpacklo_epi64(b, d), pl[3] = _mm256_unpackhi_epi64(b, d);
    return;
  }
  /* IQ2: g[s] holds entries 16 h + s, + 4 + s (lane 0) and + 8 + s, + 12 + s (lane 1), one per
   * int64; position 2 i + e of plane q is byte q + 4 e of entry 16 h + i */
  uint64_t e[16];
  if (type == ST_TYPE_IQ2_XS) {
    const uint16_t *qs = ((const st_block_iq2_xs *)(const void *)bb)->qs + 16 * h;
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
      e[i] = st_iq2xs_grid[qs[i] & 511];
  } else {
    const st_block_iq2_s *b2 = (const st_block_iq2_s *)(const void *)bb;
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
      const int k = 16 * h + i;
      e[i] = st_iq2s_grid[b2->qs[k] | (b2->qh[k / 4] >> (2 * (k % 4)) & 3) << 8];
    }
  }
  /* in each int64, bytes q and q + 4 side by side (int16 q); then int16 q of the four side by side */
  const __m256i t = _mm256_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15, 0, 4, 1, 5, 2, 6,
                                     3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
#pragma GCC unroll 4
  for (int s = 0; s < 4; s++)
    g[s] = _mm256_shuffle_epi8(
        _mm256_setr_epi64x((long long)e[s], (long long)e[4 + s], (long long)e[8 + s], (long long)e[12 + s]),
        t);
  const __m256i u0 = _mm256_unpacklo_epi16(g[0], g[1]), u1 = _mm256_unpackhi_epi16(g[0], g[1]),
                u2 = _mm256_unpacklo_epi16(g[2], g[3]), u3 = _mm256_unpackhi_epi16(g[2], g[3]);
  const __m256i v0 = _mm256_unpacklo_epi32(u0, u2), v1 = _mm256_unpackhi_epi32(u0, u2),
                v2 = _mm256_unpacklo_epi32(u1, u3), v3 = _mm256_unpackhi_epi32(u1, u3);
  pl[0] = _mm256_unpacklo_epi64(v0, v2), pl[1] = _mm256_unpackhi_epi64(v0, v2);
  pl[2] = _mm256_unpacklo_epi64(v1, v3), pl[3] = _mm256_unpackhi_epi64(v1, v3);
}

/* A grid block's 32 sign bytes (byte j: weights 8 j .. 8 j + 7). */
static inline __attribute__((always_inline)) AVX2 __m256i grid_signs_avx2(uint32_t type, const uint8_t *bb) {
  if (type == ST_TYPE_IQ3_S)
    return _mm256_loadu_si256((const __m256i *)((const st_block_iq3_s *)(const void *)bb)->signs);
  if (type == ST_TYPE_IQ2_S)
    return _mm256_loadu_si256((const __m256i *)(((const st_block_iq2_s *)(const void *)bb)->qs + 32));
  /* the 7-bit fields, byte j the field of weights 8 j .. 8 j + 7 */
  __m256i f;
  if (type == ST_TYPE_IQ2_XS) { /* bits 9..15 of word j */
    const uint16_t *qs = ((const st_block_iq2_xs *)(const void *)bb)->qs;
    const __m256i a = _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)qs), 9),
                  b = _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(qs + 16)), 9);
    f = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
  } else { /* IQ3_XXS: field k of sub-block g at bits 7 k of its word, to byte k of int32 g */
    const __m256i aux = _mm256_loadu_si256((const __m256i *)(bb + offsetof(st_block_iq3_xxs, qs) + 64)),
                  m7 = _mm256_set1_epi32(127);
    f = _mm256_and_si256(aux, m7);
#pragma GCC unroll 3
    for (int k = 1; k < 4; k++)
      f = _mm256_or_si256(f, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(aux, 7 * k), m7), 8 * k));
  }
  /* each byte's parity, in its bit 0, by shifts that stay inside the byte where it matters */
  __m256i p = _mm256_xor_si256(f, _mm256_srli_epi16(f, 4));
  p = _mm256_xor_si256(p, _mm256_srli_epi16(p, 2));
  p = _mm256_xor_si256(p, _mm256_srli_epi16(p, 1));
  return _mm256_or_si256(f, _mm256_slli_epi16(_mm256_and_si256(p, _mm256_set1_epi8(1)), 7));
}

static inline __attribute__((always_inline)) AVX2 void q8_tile_grid_avx2_impl(uint32_t type, const void *w,
                                                                              const uint8_t *xq, int64_t ldq,
                                                                              int nt, int64_t n, float *out,
                                                                              int64_t ldo) {
  __m256 acc[ST_TILE][2]; /* k_accumulate's lanes 0..7, 8..15 */
  for (int t = 0; t < nt; t++)
    acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  const uint64_t bs = k_bytes(type);
  const int iq3 = type == ST_TYPE_IQ3_XXS || type == ST_TYPE_IQ3_S;
  const __m256i one = _mm256_set1_epi8(1);
  /* int16 lane i of a half: IQ3 sub-block 4 h + i / 4 (k.sc16 lane 8 h + 2 (i / 4)), IQ2 group
   * 8 h + i / 2 (k.sc16 lane 8 h + i / 2), as bytes of the broadcast 128-bit half */
  const __m256i spread = iq3 ? _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 4, 5, 4, 5, 4, 5, 4, 5, 8, 9, 8, 9, 8,
                                                9, 8, 9, 12, 13, 12, 13, 12, 13, 12, 13)
                             : _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7, 8, 9, 8, 9,
                                                10, 11, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15);
  /* position p of a half: sign byte 16 h + p / 2, bit 4 (p % 2) + q */
  const __m256i dup = _mm256_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11,
                                       11, 12, 12, 13, 13, 14, 14, 15, 15);
  for (int64_t b = 0; b < n / 256; b++) {
    const uint8_t *bb = (const uint8_t *)w + (uint64_t)b * bs;
    prefetch_ahead(bb, bs);
    const struct kvec k = k_vec_avx2(type, bb);
    const __m256i sg = grid_signs_avx2(type, bb);
    __m256i is[ST_TILE][2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
      __m256i pl[4], sn[4];
      grid_half_avx2(type, bb, h, pl);
      const __m128i sh = h ? _mm256_extracti128_si256(sg, 1) : _mm256_castsi256_si128(sg);
      const __m256i sd = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(sh), dup);
#pragma GCC unroll 4
      for (int q = 0; q < 4; q++) { /* -1 where the sign bit is set, else +1, for psignb */
        const __m256i bit = _mm256_set1_epi16((short)((0x10 << q) << 8 | 1 << q));
        sn[q] = _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(sd, bit), bit), one);
      }
      const __m128i half = h ? _mm256_extracti128_si256(k.sc16, 1) : _mm256_castsi256_si128(k.sc16);
      const __m256i sc = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(half), spread);
      for (int t = 0; t < nt; t++) {
        const int8_t *xp = (const int8_t *)(const void *)(xq + t * ldq + grid_planes_at(n, b)) + 32 * h;
        __m256i m[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
          m[q] = _mm256_maddubs_epi16(
              pl[q], _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xp + 64 * q)), sn[q]));
        const __m256i m01 = _mm256_add_epi16(m[0], m[1]), m23 = _mm256_add_epi16(m[2], m[3]);
        is[t][h] = type == ST_TYPE_IQ3_S
                       ? _mm256_madd_epi16(_mm256_add_epi16(m01, m23), sc)
                       : _mm256_add_epi32(_mm256_madd_epi16(m01, sc), _mm256_madd_epi16(m23, sc));
      }
    }
    for (int t = 0; t < nt; t++) { /* k_accumulate */
      const st_act_q8_K *x = (const st_act_q8_K *)(const void *)(xq + t * ldq) + b;
      const __m256 s = _mm256_set1_ps(x->d * k.d);
      acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t][0]), s, acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t][1]), s, acc[t][1]);
    }
  }
  for (int t = 0; t < nt; t++) /* k_reduce */
    out[t * ldo] = hsum8_avx2(_mm256_add_ps(acc[t][0], acc[t][1]));
}

static inline __attribute__((always_inline)) AVX2 void q8_tile_k_avx2_impl(uint32_t type, const void *w, const uint8_t *xq,
                                                                          int64_t ldq, int nt, int64_t n, float *out,
                                                                          int64_t ldo) {
  if (k_is_grid(type)) {
    q8_tile_grid_avx2_impl(type, w, xq, ldq, nt, n, out, ldo);
    return;
  }
  __m256 acc[ST_TILE][2], accm[ST_TILE]; /* k_accumulate's lanes 0..7, 8..15, and M's */
  for (int t = 0; t < nt; t++)
    acc[t][0] = acc[t][1] = accm[t] = _mm256_setzero_ps();
  const uint64_t bs = k_bytes(type);
  /* byte shuffles that spread the scales of group g (int16 entries 2g, 2g + 1 of sc16, in the
   * 128-bit half g / 4) over the 16-weight halves of the group */
  __m256i spread[4];
  for (int i = 0; i < 4; i++)
    spread[i] = _mm256_set_m128i(_mm_set1_epi16((short)((4 * i + 3) << 8 | (4 * i + 2))),
                                 _mm_set1_epi16((short)((4 * i + 1) << 8 | (4 * i))));
  for (int64_t b = 0; b < n / 256; b++) {
    const uint8_t *bb = (const uint8_t *)w + (uint64_t)b * bs;
    prefetch_ahead(bb, bs);
    const struct kvec k = k_vec_avx2(type, bb);
    __m256i is[ST_TILE][2]; /* the even and the odd 32-weight groups: k_accumulate's lanes */
    for (int t = 0; t < nt; t++)
      is[t][0] = is[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 8 /* GCC -O2 kept these loops rolled: shifts by a variable, spills; 1.2-1.6x */
    for (int g = 0; g < 8; g++) {
      const __m256i v = k_group_avx2(type, bb, g), av = type == ST_TYPE_IQ4_XS ? _mm256_abs_epi8(v) : v;
      const __m128i half = g < 4 ? _mm256_castsi256_si128(k.sc16) : _mm256_extracti128_si256(k.sc16, 1);
      const __m256i sc = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(half), spread[g % 4]);
      for (int t = 0; t < nt; t++) {
        const st_act_q8_K *x = (const st_act_q8_K *)(const void *)(xq + t * ldq) + b;
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * g));
        if (type == ST_TYPE_IQ4_XS) xv = _mm256_sign_epi8(xv, v);
        is[t][g & 1] = _mm256_add_epi32(is[t][g & 1], _mm256_madd_epi16(_mm256_maddubs_epi16(av, xv), sc));
      }
    }
    for (int t = 0; t < nt; t++) { /* k_accumulate */
      const st_act_q8_K *x = (const st_act_q8_K *)(const void *)(xq + t * ldq) + b;
      const __m256 s = _mm256_set1_ps(x->d * k.d);
      if (k_has_offset(type) || k_has_min(type)) {
        const __m256i M = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x->bsums), k.mv16);
        if (k_has_offset(type)) is[t][0] = _mm256_sub_epi32(is[t][0], M);
        if (k_has_min(type))
          accm[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), _mm256_set1_ps(k.dmin * x->d), accm[t]);
      }
      acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t][0]), s, acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t][1]), s, acc[t][1]);
    }
  }
  for (int t = 0; t < nt; t++) { /* k_reduce */
    __m256 v = _mm256_add_ps(acc[t][0], acc[t][1]);
    if (k_has_min(type)) v = _mm256_add_ps(v, accm[t]);
    out[t * ldo] = hsum8_avx2(v);
  }
}

/* The integer kernels take a group of up to 64 weight rows (row_bytes apart; row r's outputs at
 * out + r), so that a kernel can prepare the activations once for all of them. */
typedef void (*q8_tile_fn)(uint32_t, const void *, uint64_t, int64_t, const uint8_t *, int64_t, int, int64_t,
                           float *, int64_t);

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

/* The integer kernels' switch: the 32-blocks on `b32`, the 256-super-blocks on `k`. */
#define ST_Q8_DISPATCH(b32, k)                                                                               \
  switch (type) {                                                                                            \
  case ST_TYPE_Q8_0: ST_Q8_TILE_CASES(b32, ST_TYPE_Q8_0); break;                                             \
  case ST_TYPE_Q4_0: ST_Q8_TILE_CASES(b32, ST_TYPE_Q4_0); break;                                             \
  case ST_TYPE_IQ4_NL: ST_Q8_TILE_CASES(b32, ST_TYPE_IQ4_NL); break;                                         \
  case ST_TYPE_Q4_1: ST_Q8_TILE_CASES(b32, ST_TYPE_Q4_1); break;                                             \
  case ST_TYPE_Q5_0: ST_Q8_TILE_CASES(b32, ST_TYPE_Q5_0); break;                                             \
  case ST_TYPE_Q5_1: ST_Q8_TILE_CASES(b32, ST_TYPE_Q5_1); break;                                             \
  case ST_TYPE_Q2_K: ST_Q8_TILE_CASES(k, ST_TYPE_Q2_K); break;                                               \
  case ST_TYPE_Q3_K: ST_Q8_TILE_CASES(k, ST_TYPE_Q3_K); break;                                               \
  case ST_TYPE_Q4_K: ST_Q8_TILE_CASES(k, ST_TYPE_Q4_K); break;                                               \
  case ST_TYPE_Q5_K: ST_Q8_TILE_CASES(k, ST_TYPE_Q5_K); break;                                               \
  case ST_TYPE_Q6_K: ST_Q8_TILE_CASES(k, ST_TYPE_Q6_K); break;                                               \
  case ST_TYPE_IQ2_XS: ST_Q8_TILE_CASES(k, ST_TYPE_IQ2_XS); break;                                           \
  case ST_TYPE_IQ2_S: ST_Q8_TILE_CASES(k, ST_TYPE_IQ2_S); break;                                             \
  case ST_TYPE_IQ3_XXS: ST_Q8_TILE_CASES(k, ST_TYPE_IQ3_XXS); break;                                         \
  case ST_TYPE_IQ3_S: ST_Q8_TILE_CASES(k, ST_TYPE_IQ3_S); break;                                             \
  default: ST_Q8_TILE_CASES(k, ST_TYPE_IQ4_XS); break;                                                       \
  }

ST_Q8_EACH_ROW(q8_tile_scalar, q8_row_scalar, )
ST_Q8_EACH_ROW(q8_rows_b32_avx2, q8_tile_b32_avx2_impl, AVX2)
ST_Q8_EACH_ROW(q8_rows_k_avx2, q8_tile_k_avx2_impl, AVX2)

static AVX2 void q8_tile_avx2(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                              int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_Q8_DISPATCH(q8_rows_b32_avx2, q8_rows_k_avx2)
}

/* AVX-512 VNNI: 64 weights per vector; vpdpbusd (u8 × s8, four products per int32 lane) for the
 * 32-blocks, four blocks at a time, signed weights made unsigned by an offset whose product with
 * the activations is taken back out (exact); vpmaddubsw then vpdpwssd (× the int16 scales) for
 * the K formats (IQ4_XS: vpdpbusd on its levels + 128, then × the int32 scales; Q2_K: vpdpbusd
 * on its quants times their scales, q2k_block_vnni), their other
 * signed weights by the sign trick: |w| as the unsigned operand, x negated where w < 0. */
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* The IQ4_NL levels plus 128 (unsigned bytes, flipping the sign bit) in every 128-bit lane, for
 * vpshufb by a nibble then vpdpbusd; the offset comes back out of the activation sums. */
static inline VNNI __m512i iq4nl_levels_u8_vnni(void) {
  return _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)st_kvalues_iq4nl)),
                          _mm512_set1_epi8((char)0x80));
}

/* The 16 bytes at p + k stride (k < cnt consecutive records of `stride` bytes) in 128-bit lane k;
 * the lanes of absent records are zero and nothing past them is read. */
static inline __attribute__((always_inline)) VNNI __m512i lanes4(const uint8_t *p, uint64_t stride, int cnt) {
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
  if (cnt > 1) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + stride)), 1);
  if (cnt > 2) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 2 * stride)), 2);
  if (cnt > 3) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 3 * stride)), 3);
  return cnt < 4 ? _mm512_maskz_mov_epi32((__mmask16)((1u << (4 * cnt)) - 1), v) : v;
}

/* Up to four 32-blocks for vpdpbusd: their quants as unsigned bytes, weights 0..15 of block k in
 * lane k of lo and 16..31 in lane k of hi (the signed formats' quants plus `off`, taken back out
 * as off times the activation sums), and their fp16 scales d and mins m as floats. */
struct b32_quad {
  __m512i lo, hi;
  __m128 d, m;
};

static inline int b32_offset(uint32_t type) {
  return type == ST_TYPE_Q4_0 ? 8 : type == ST_TYPE_Q5_0 ? 16 : b32_has_min(type) ? 0 : 128;
}

/* Field `at` (2 or 4 bytes) of block k < cnt of a quad, 0 for an absent block. */
static inline uint32_t quad_field(const uint8_t *bb, uint64_t bs, int k, int cnt, int at, int bytes) {
  uint32_t v = 0;
  if (k < cnt) memcpy(&v, bb + k * bs + at, (size_t)bytes);
  return v;
}

/* The fifth bits of weights 0..15 (h = 0) or 16..31 (h = 1) of each block as one mask bit per
 * byte of lo or hi. */
static inline uint64_t b32_bit5_mask(uint32_t q0, uint32_t q1, uint32_t q2, uint32_t q3, int h) {
  return (uint64_t)((q0 >> 16 * h) & 0xFFFF) | (uint64_t)((q1 >> 16 * h) & 0xFFFF) << 16 |
         (uint64_t)((q2 >> 16 * h) & 0xFFFF) << 32 | (uint64_t)((q3 >> 16 * h) & 0xFFFF) << 48;
}

/* The fp16 field `at` of a quad's blocks as four floats. */
static inline __attribute__((always_inline)) VNNI __m128 quad_half4(const uint8_t *bb, uint64_t bs, int cnt,
                                                                    int at) {
  return _mm_cvtph_ps(_mm_setr_epi16(
      (short)quad_field(bb, bs, 0, cnt, at, 2), (short)quad_field(bb, bs, 1, cnt, at, 2),
      (short)quad_field(bb, bs, 2, cnt, at, 2), (short)quad_field(bb, bs, 3, cnt, at, 2), 0, 0, 0, 0));
}

static inline __attribute__((always_inline)) VNNI struct b32_quad b32_quad_vnni(uint32_t type,
                                                                                const uint8_t *bb, int cnt) {
  const uint64_t bs = b32_bytes(type);
  struct b32_quad q;
  q.d = quad_half4(bb, bs, cnt, 0);
  q.m = b32_has_min(type) ? quad_half4(bb, bs, cnt, 2) : _mm_setzero_ps();
  if (type == ST_TYPE_Q8_0) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    q.lo = _mm512_xor_si512(lanes4(bb + 2, bs, cnt), flip);
    q.hi = _mm512_xor_si512(lanes4(bb + 18, bs, cnt), flip);
    return q;
  }
  const __m512i qs = lanes4(bb + b32_qs_at(type), bs, cnt), m4 = _mm512_set1_epi8(0xF);
  q.lo = _mm512_and_si512(qs, m4);
  q.hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
  if (type == ST_TYPE_IQ4_NL) {
    const __m512i kv = iq4nl_levels_u8_vnni();
    q.lo = _mm512_shuffle_epi8(kv, q.lo);
    q.hi = _mm512_shuffle_epi8(kv, q.hi);
  }
  if (type == ST_TYPE_Q5_0 || type == ST_TYPE_Q5_1) {
    const int at = b32_qh_at(type);
    const uint32_t h0 = quad_field(bb, bs, 0, cnt, at, 4), h1 = quad_field(bb, bs, 1, cnt, at, 4);
    const uint32_t h2 = quad_field(bb, bs, 2, cnt, at, 4), h3 = quad_field(bb, bs, 3, cnt, at, 4);
    const __m512i bit5 = _mm512_set1_epi8(0x10);
    q.lo = _mm512_mask_add_epi8(q.lo, _cvtu64_mask64(b32_bit5_mask(h0, h1, h2, h3, 0)), q.lo, bit5);
    q.hi = _mm512_mask_add_epi8(q.hi, _cvtu64_mask64(b32_bit5_mask(h0, h1, h2, h3, 1)), q.hi, bit5);
  }
  return q;
}

/* The four scales of a quad to the four lanes of each block. */
static inline VNNI __m512 spread4(__m128 s) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                               _mm512_castps128_ps512(s));
}

/* The activations of up to B32_CHUNK quads of blocks of one token, laid out for
 * b32_quad_step_vnni: the quants as the weights' lo and hi, per lane the correction for the
 * weights' offset (-offset times the sum of its eight activation quants, int32) or, for Q4_1 and
 * Q5_1, that sum as a float, and each block's scale in its four lanes. Absent blocks are zero.
 * A chunk covers 4,096 weights (8 KiB per token), so that rows up to that length (the expert
 * matrices of Qwen3-30B-A3B and -235B-A22B) are read in one pass from start to end, as the
 * prefetchers expect (half-row chunks halved the streaming rate; bench/RESULTS.md). */
enum { B32_CHUNK = 32 };
struct b32_act {
  __m512i lo[B32_CHUNK], hi[B32_CHUNK], sx[B32_CHUNK];
  __m512 dx[B32_CHUNK];
};

static inline __attribute__((always_inline)) VNNI void b32_repack_vnni(uint32_t type, const st_act_q8_0 *x,
                                                                       int64_t nblk, struct b32_act *xa) {
  const int off = b32_offset(type);
  const __m512i zero = _mm512_setzero_si512(), sum_by = _mm512_set1_epi8((char)(off ? off : 1));
  for (int q = 0; 4 * q < nblk; q++, x += 4) {
    const int cnt = nblk - 4 * q < 4 ? (int)(nblk - 4 * q) : 4;
    const __m512i lo = lanes4((const uint8_t *)x->qs, sizeof *x, cnt),
                  hi = lanes4((const uint8_t *)x->qs + 16, sizeof *x, cnt);
    const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, sum_by, lo), sum_by, hi);
    xa->lo[q] = lo, xa->hi[q] = hi;
    xa->sx[q] = off ? _mm512_sub_epi32(zero, s) : _mm512_castps_si512(_mm512_cvtepi32_ps(s));
    xa->dx[q] = spread4(
        _mm_setr_ps(x[0].d, cnt > 1 ? x[1].d : 0.0f, cnt > 2 ? x[2].d : 0.0f, cnt > 3 ? x[3].d : 0.0f));
  }
}

/* Quad q of a chunk (cnt blocks at bb) into the nt tokens' accumulators. */
static inline __attribute__((always_inline)) VNNI void b32_quad_step_vnni(uint32_t type, const uint8_t *bb,
                                                                          int cnt, const struct b32_act *xa,
                                                                          int q, int nt, __m512 *acc) {
  const struct b32_quad w = b32_quad_vnni(type, bb, cnt);
  const int with_min = b32_has_min(type);
  const __m512 d = spread4(w.d), m = with_min ? spread4(w.m) : d;
  const __mmask16 lanes = (__mmask16)((1u << (4 * cnt)) - 1);
  for (int t = 0; t < nt; t++) {
    const __m512i p0 = with_min ? _mm512_setzero_si512() : xa[t].sx[q];
    const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(p0, w.lo, xa[t].lo[q]), w.hi, xa[t].hi[q]);
    acc[t] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(d, xa[t].dx[q]), _mm512_cvtepi32_ps(p), acc[t], lanes);
    if (with_min)
      acc[t] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(m, xa[t].dx[q]), _mm512_castsi512_ps(xa[t].sx[q]), acc[t],
                                     lanes);
  }
}

/* A group of nr ≤ 64 rows: the activations are repacked once per chunk of 4 B32_CHUNK blocks for
 * all the rows, and each row's accumulators carried from chunk to chunk. */
static inline __attribute__((always_inline)) VNNI void
q8_rows_b32_vnni(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq,
                 int nt, int64_t n, float *out, int64_t ldo) {
  ST_ASSERT(nr <= 64);
  __m512 acc[64][ST_TILE]; /* lane i: A[i] of a row and token */
  struct b32_act xa[ST_TILE];
  for (int64_t r = 0; r < nr; r++)
    for (int t = 0; t < nt; t++)
      acc[r][t] = _mm512_setzero_ps();
  const uint64_t bs = b32_bytes(type);
  const int64_t nb = n / 32;
  for (int64_t b0 = 0; b0 < nb; b0 += 4 * B32_CHUNK) {
    const int64_t nblk = nb - b0 < 4 * B32_CHUNK ? nb - b0 : 4 * B32_CHUNK;
    const int full = (int)(nblk / 4), tail = (int)(nblk % 4);
    for (int t = 0; t < nt; t++)
      b32_repack_vnni(type, (const st_act_q8_0 *)(const void *)(xq + t * ldq) + b0, nblk, &xa[t]);
    for (int64_t r = 0; r < nr; r++) {
      const uint8_t *bb = (const uint8_t *)w + r * row_bytes + (uint64_t)b0 * bs;
      __m512 a[ST_TILE];
      for (int t = 0; t < nt; t++)
        a[t] = acc[r][t];
      for (int q = 0; q < full; q++, bb += 4 * bs) {
        prefetch_ahead(bb, 4 * bs);
        b32_quad_step_vnni(type, bb, 4, xa, q, nt, a);
      }
      if (tail) b32_quad_step_vnni(type, bb, tail, xa, full, nt, a);
      for (int t = 0; t < nt; t++)
        acc[r][t] = a[t];
    }
  }
  for (int64_t r = 0; r < nr; r++)
    for (int t = 0; t < nt; t++)
      out[t * ldo + r] =
          hsum8_avx2(_mm256_add_ps(_mm512_castps512_ps256(acc[r][t]),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][t]), 1))));
}

/* Groups 2c and 2c + 1 of a K super-block as 64 bytes in weight order (the VNNI counterpart of
 * k_group_avx2, with one 512-bit decode per pair: each 256-bit half takes its own shift). qhs:
 * Q5_K's qh shifted by 0 (low half) and 1 (high half); Q6_K's qh of half c / 2 shifted by 0 and 2. */
static inline __attribute__((always_inline)) VNNI __m512i k_pair_vnni(uint32_t type, const uint8_t *bb, int c,
                                                                      __m512i qhs) {
  const __m512i m4 = _mm512_set1_epi8(0xF);
  if (type == ST_TYPE_Q3_K) { /* Q2_K has its own block decode, q2k_block_vnni */
    /* groups 2c, 2c + 1: bits 2 (2c % 4) and + 2 of qs[32 (c / 2) ..], and bit 2c of hmask
     * (qhs = hmask shifted by 0 (low half) and 1 (high half)) moved to bit 2 */
    const uint8_t *qs = ((const st_block_q3_K *)(const void *)bb)->qs;
    const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * (c & 1))),
                                             _mm256_set1_epi16((short)(4 * (c & 1) + 2)), 1);
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 2))));
    const __m512i v = _mm512_and_si512(_mm512_srlv_epi16(q, shift), _mm512_set1_epi8(3));
    return _mm512_or_si512(
        v, _mm512_and_si512(c == 0 ? _mm512_slli_epi16(qhs, 2) : _mm512_srli_epi16(qhs, 2 * c - 2),
                            _mm512_set1_epi8(0x04)));
  }
  if (type == ST_TYPE_Q4_K || type == ST_TYPE_Q5_K) {
    const int k5 = type == ST_TYPE_Q5_K;
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bb + (k5 ? 48 : 16) + 32 * c)));
    __m512i v = _mm512_and_si512(_mm512_srlv_epi16(q, shift), m4);
    if (k5) /* bit 2c (low half) or 2c + 1 (high half, pre-shifted by 1) of qh, moved to bit 4 */
      v = _mm512_or_si512(v, _mm512_and_si512(c <= 2 ? _mm512_slli_epi16(qhs, 4 - 2 * c) : _mm512_srli_epi16(qhs, 2),
                                              _mm512_set1_epi8(0x10)));
    return v;
  }
  /* Q6_K */
  const st_block_q6_K *b = (const st_block_q6_K *)(const void *)bb;
  const __m512i l = _mm512_loadu_si512((const void *)(b->ql + 64 * (c / 2)));
  const __m512i lo = _mm512_and_si512(c & 1 ? _mm512_srli_epi16(l, 4) : l, m4);
  const __m512i hi = _mm512_and_si512(c & 1 ? qhs : _mm512_slli_epi16(qhs, 4), _mm512_set1_epi8(0x30));
  return _mm512_or_si512(lo, hi);
}

/* The IQ3 grids as nibble words and the IQ2 grids as code words (iq_grids.h): the whole IQ3_XXS
 * grid is 8 registers, IQ3_S's and IQ2_XS's 16, IQ2_S's 32. */
static const uint16_t iq3xxs_nibbles[256] __attribute__((aligned(64))) = ST_IQ3XXS_GRID_NIBBLES;
static const uint16_t iq3s_nibbles[512] __attribute__((aligned(64))) = ST_IQ3S_GRID_NIBBLES;
static const uint16_t iq2xs_codes[512] __attribute__((aligned(64))) = ST_IQ2XS_GRID_CODES;
static const uint16_t iq2s_codes[1024] __attribute__((aligned(64))) = ST_IQ2S_GRID_CODES;

/* The words (IQ3 nibble words, IQ2 code words) of 32 grid entries at the word indices idx
 * (< 32 ntab; ntab 8, 16 or 32 registers), looked up in registers: one vpermi2w reads 64 entries
 * (two table registers, the index's low 6 bits), and the ntab / 2 results are merged by index
 * bits 6, 7 (8, 9) in a tree of blends. Replaces 32 scalar table loads and their vector inserts;
 * the permutes are independent, so the lookup's latency is one permute and a few blends (a chain
 * of masked permutes was slower on Zen 4). */
static inline __attribute__((always_inline)) VNNI __m512i grid_words_vnni(const uint16_t *tab, int ntab,
                                                                          __m512i idx) {
  __m512i r[16];
#pragma GCC unroll 16
  for (int p = 0; p < ntab / 2; p++)
    r[p] = _mm512_permutex2var_epi16(_mm512_load_si512((const void *)(tab + 64 * p)), idx,
                                     _mm512_load_si512((const void *)(tab + 64 * p + 32)));
#pragma GCC unroll 4
  for (int n = ntab / 2, bit = 64; n > 1; n /= 2, bit *= 2) {
    const __mmask32 k = _mm512_test_epi16_mask(idx, _mm512_set1_epi16((short)bit));
#pragma GCC unroll 8
    for (int p = 0; p < n / 2; p++)
      r[p] = _mm512_mask_blend_epi16(k, r[2 * p], r[2 * p + 1]);
  }
  return r[0]; // cppcheck-suppress uninitvar ; r[0] is set: ntab is 8, 16 or 32
}

/* IQ2_XS/IQ3_XXS: the 32 sign bytes of a block (st_iq_signs of its 7-bit fields, byte k for
 * weights 8k .. 8k + 7), each doubled in its int16 lane as grid_neg_vnni takes them. */
static inline __attribute__((always_inline)) VNNI __m512i iq_signs_doubled_vnni(uint32_t type,
                                                                                const uint8_t *bb) {
  __m512i f; /* the fields, one per int16 lane */
  if (type == ST_TYPE_IQ2_XS) {
    f = _mm512_srli_epi16(_mm512_loadu_si512((const void *)((const st_block_iq2_xs *)(const void *)bb)->qs),
                          9);
  } else { /* IQ3_XXS: field k of sub-block s at bits 7k of its uint32 */
    const __m512i aux = _mm512_castsi256_si512(
        _mm256_loadu_si256((const __m256i *)(bb + offsetof(st_block_iq3_xxs, qs) + 64)));
    const __m512i shift = _mm512_setr_epi32(0, 7, 14, 21, 0, 7, 14, 21, 0, 7, 14, 21, 0, 7, 14, 21),
                  m7 = _mm512_set1_epi32(127);
    const __m512i lo = _mm512_srlv_epi32(
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), aux),
        shift);
    const __m512i hi = _mm512_srlv_epi32(
        _mm512_permutexvar_epi32(_mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7), aux),
        shift);
    f = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(_mm512_and_si512(lo, m7))),
                           _mm512_cvtepi32_epi16(_mm512_and_si512(hi, m7)), 1);
  }
  __m512i p = _mm512_xor_si512(f, _mm512_srli_epi16(f, 4));
  p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 2));
  p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 1));
  const __m512i sg = _mm512_or_si512(f, _mm512_slli_epi16(_mm512_and_si512(p, _mm512_set1_epi16(1)), 7));
  return _mm512_or_si512(sg, _mm512_slli_epi16(sg, 8));
}

/* 32 sign bytes (byte j: weights 8 j .. 8 j + 7) doubled in int16 lanes, as grid_neg_vnni takes them. */
static inline __attribute__((always_inline)) VNNI __m512i signs_doubled_vnni(const uint8_t *sg) {
  const __m512i u = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)sg));
  return _mm512_or_si512(u, _mm512_slli_epi16(u, 8));
}

/* IQ4_XS for vpdpbusd: the levels plus 128 (unsigned, 1..241) in weight order, 64 per vector,
 * and per vector the int32 scales of its two sub-blocks (lanes 0..7, 8..15). Σ (l + 128) x over
 * four weights needs no saturating int16 step; the offset's products are taken back out lane by
 * lane (iq4_xs_offsets_vnni), exactly. */
struct iq4v {
  __m512i w[4], sc[4];
};

static inline __attribute__((always_inline)) VNNI struct iq4v iq4_xs_block_vnni(const st_block_iq4_xs *b,
                                                                                __m512i kvu, __m128i s8) {
  struct iq4v v;
  const __m512i m4 = _mm512_set1_epi8(0xF);
  /* 128-bit lane g of the low (high) nibbles holds weights 32g .. + 15 (32g + 16 .. + 31) */
  const __m512i lh = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0),
                hh = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  for (int i = 0; i < 2; i++) {
    const __m512i q = _mm512_loadu_si512((const void *)(b->qs + 64 * i));
    const __m512i lo = _mm512_shuffle_epi8(kvu, _mm512_and_si512(q, m4));
    const __m512i hi = _mm512_shuffle_epi8(kvu, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
    v.w[2 * i] = _mm512_permutex2var_epi64(lo, lh, hi);
    v.w[2 * i + 1] = _mm512_permutex2var_epi64(lo, hh, hi);
  }
  const __m512i s32 = _mm512_cvtepi8_epi32(s8);
  for (int c = 0; c < 4; c++)
    v.sc[c] = _mm512_permutexvar_epi32(_mm512_set_epi32(2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1,
                                                        2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c, 2 * c, 2 * c,
                                                        2 * c, 2 * c, 2 * c, 2 * c, 2 * c),
                                       s32);
  return v;
}

/* Q2_K for vpdpbusd: the 256 quants times their scales (0..45, unsigned), 64 per vector in weight
 * order. One table holds q · sc for all 16 scales (lane j, bytes 4c + q: group 4c + j, the
 * 16-weight group in lane j of vector c), looked up by q + 4c: the scale multiply costs no
 * int16 step and no scale spread per vector. */
static inline __attribute__((always_inline)) VNNI void q2k_block_vnni(const st_block_q2_K *b, __m512i *w) {
  const __m128i g =
      _mm_and_si128(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)b->scales),
                                     _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)),
                    _mm_set1_epi8(0xF));
  const __m512i tab = _mm512_mullo_epi32(_mm512_cvtepu8_epi32(g), _mm512_set1_epi32(0x03020100));
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++) { /* groups 2c, 2c + 1: bits 2 (2c % 4) and + 2 of qs[32 (c / 2) ..] */
    const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * (c & 1))),
                                             _mm256_set1_epi16((short)(4 * (c & 1) + 2)), 1);
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * (c / 2))));
    const __m512i idx = _mm512_ternarylogic_epi32(_mm512_srlv_epi16(q, shift), _mm512_set1_epi8(3),
                                                  _mm512_set1_epi8((char)(4 * c)), 0xEA);
    w[c] = _mm512_shuffle_epi8(tab, idx);
  }
}

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

/* Super-block b (at bb) of one row into the nt tokens' accumulators: the K formats and IQ4_XS (the
 * grid formats take grid_tokens_vnni). */
static inline __attribute__((always_inline)) VNNI void k_block_vnni(uint32_t type, const uint8_t *bb,
                                                                    int64_t b, const uint8_t *xq, int64_t ldq,
                                                                    int nt, const __m512i *xoff,
                                                                    struct kacc *acc) {
  const __m512i zero = _mm512_setzero_si512();
  /* int16 lane i of the products of groups 2c, 2c + 1 covers weights 64c + 2i, + 1: scale entry
   * 4c + i / 8 of sc16 */
  const __m512i entry = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0,
                                         0, 0, 0, 0, 0, 0);
  const __m512i kvu = iq4nl_levels_u8_vnni();
  if (type == ST_TYPE_IQ4_XS) {
    const st_block_iq4_xs *b4 = (const st_block_iq4_xs *)(const void *)bb;
    const __m128i s8 = iq4_xs_scales_sse(b4);
    const struct iq4v v = iq4_xs_block_vnni(b4, kvu, s8);
    const float d = _cvtsh_ss(b4->d);
    for (int t = 0; t < nt; t++) {
      const st_act_q8_K *x = (const st_act_q8_K *)(const void *)(xq + t * ldq) + b;
      __m512i is = zero;
#pragma GCC unroll 4
      for (int c = 0; c < 4; c++) { /* each lane's true Σ l x: the offset's products start below zero */
        const __m512i xv = _mm512_loadu_si512((const void *)(x->qs + 64 * c));
        const __m512i off = xoff ? xoff[4 * t + c] : iq4_xs_offset_vnni(xv);
        is = _mm512_add_epi32(is, _mm512_mullo_epi32(_mm512_dpbusd_epi32(off, v.w[c], xv), v.sc[c]));
      }
      k_lanes_vnni(type, d, 0.0f, x->d, is, _mm256_setzero_si256(), &acc[t]);
    }
    return;
  }
  if (type == ST_TYPE_Q2_K) {
    const st_block_q2_K *b2 = (const st_block_q2_K *)(const void *)bb;
    __m512i w2[4];
    q2k_block_vnni(b2, w2);
    const __m128i sr = _mm_loadu_si128((const __m128i *)b2->scales);
    const __m256i mv16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sr, 4), _mm_set1_epi8(0xF)));
    uint32_t dh;
    memcpy(&dh, &b2->d, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dh)); /* d, dmin */
    const float d2 = _mm_cvtss_f32(dm), dmin2 = _mm_cvtss_f32(_mm_movehdup_ps(dm));
    for (int t = 0; t < nt; t++) {
      const st_act_q8_K *x = (const st_act_q8_K *)(const void *)(xq + t * ldq) + b;
      __m512i is = zero;
#pragma GCC unroll 4
      for (int c = 0; c < 4; c++)
        is = _mm512_dpbusd_epi32(is, w2[c], _mm512_loadu_si512((const void *)(x->qs + 64 * c)));
      const __m256i bm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x->bsums), mv16);
      k_lanes_vnni(type, d2, dmin2, x->d, is, bm, &acc[t]);
    }
    return;
  }
  const struct kvec k = k_vec_avx2(type, bb);
  const __m512i sc16 = _mm512_castsi256_si512(k.sc16);
  __m512i qhs = zero;
  if (type == ST_TYPE_Q5_K || type == ST_TYPE_Q3_K) {
    const uint8_t *qh = type == ST_TYPE_Q5_K ? bb + 16 : ((const st_block_q3_K *)(const void *)bb)->hmask;
    qhs = _mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh)),
                            _mm512_inserti64x4(zero, _mm256_set1_epi16(1), 1));
  }
  __m512i is[ST_TILE];
  for (int t = 0; t < nt; t++)
    is[t] = zero;
#pragma GCC unroll 4            /* as in the AVX2 kernel */
  for (int c = 0; c < 4; c++) { /* groups 2c and 2c + 1 */
    if (type == ST_TYPE_Q6_K && c % 2 == 0) {
      const __m512i qh = _mm512_broadcast_i64x4(
          _mm256_loadu_si256((const __m256i *)(((const st_block_q6_K *)(const void *)bb)->qh + 16 * c)));
      qhs = _mm512_srlv_epi16(qh, _mm512_inserti64x4(zero, _mm256_set1_epi16(2), 1));
    }
    const __m512i av = k_pair_vnni(type, bb, c, qhs);
    const __m512i sc =
        _mm512_permutexvar_epi16(_mm512_add_epi16(entry, _mm512_set1_epi16((short)(4 * c))), sc16);
    for (int t = 0; t < nt; t++) {
      const st_act_q8_K *x = (const st_act_q8_K *)(const void *)(xq + t * ldq) + b;
      const __m512i xv = _mm512_loadu_si512((const void *)(x->qs + 64 * c));
      is[t] = _mm512_dpwssd_epi32(is[t], _mm512_maddubs_epi16(av, xv), sc);
    }
  }
  for (int t = 0; t < nt; t++) {
    const st_act_q8_K *x = (const st_act_q8_K *)(const void *)(xq + t * ldq) + b;
    const __m256i bm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x->bsums), k.mv16);
    k_lanes_vnni(type, k.d, k.dmin, x->d, is[t], bm, &acc[t]);
  }
}

/* The rows of a group, for an ISA attribute `attr` and the grid preparations it allows (the VNNI
 * or VBMI iq3_planes / iq2_planes); name##_block takes super-block b (at bb) of one row into its
 * nt tokens' accumulators (n: the row length). */
#define ST_Q8_ROWS_K(name, attr, planes3, planes2)                                                           \
  static inline __attribute__((always_inline))                                                               \
  attr void name##_block(uint32_t type, const uint8_t *bb, int64_t b, const uint8_t *xq, int64_t ldq,        \
                         int nt, int64_t n, const __m512i *xoff, struct kacc *acc) {                         \
    if (!k_is_grid(type)) {                                                                                  \
      k_block_vnni(type, bb, b, xq, ldq, nt, xoff, acc);                                                     \
      return;                                                                                                \
    }                                                                                                        \
    struct gridp p;                                                                                          \
    if (type == ST_TYPE_IQ3_XXS || type == ST_TYPE_IQ3_S)                                                    \
      planes3(type, bb, &p);                                                                                 \
    else                                                                                                     \
      planes2(type, bb, &p);                                                                                 \
    grid_tokens_vnni(type, &p, b, xq, ldq, nt, n, acc);                                                      \
  }                                                                                                          \
  static inline __attribute__((always_inline)) attr void name(                                               \
      uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq, int nt,  \
      int64_t n, float *out, int64_t ldo) {                                                                  \
    const uint64_t bs = k_bytes(type), ahead = pair_ahead(row_bytes);                                        \
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
        name##_block(type, w0 + b * bs, b, xq, ldq, nt, n, xoff, acc[0]);                                    \
        name##_block(type, w1 + b * bs, b, xq, ldq, nt, n, xoff, acc[1]);                                    \
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
        name##_block(type, w0 + b * bs, b, xq, ldq, nt, n, cached ? xo + b * ST_TILE * 4 : NULL, acc);       \
      }                                                                                                      \
      for (int t = 0; t < nt; t++)                                                                           \
        out[t * ldo + r] = k_lanes_total(type, acc[t]);                                                      \
    }                                                                                                        \
  }

/* A grid block in plane order (the order of the activation rows' plane copy, grid_planes_at):
 * m[q] holds, at position k, byte q of IQ3 entry k (the magnitude of weight 4 k + q), or for the
 * IQ2 formats byte q + 4 (k % 2) of entry k / 2 (the same weight 4 k + q): the grid looked up one
 * byte plane at a time, with nothing interleaved back into weight order. neg[q]: the sign bits of
 * the same weights; sc: the odd integer scale 2 s + 1 of position pair i (positions 2 i, 2 i + 1,
 * which share it: one IQ3 sub-block of 32 weights or one IQ2 group of 16) in int16 lane i (so both
 * halves of int32 lane L hold lane L's scale); d: the float scale. Summed over the four planes,
 * int32 lane L (positions 4 L .. 4 L + 3, as vpdpbusd sums them) holds weights 16 L .. 16 L + 15:
 * k_accumulate's lanes for the grid formats. */
struct gridp {
  __m512i m[4], sc;
  __mmask64 neg[4];
  float d;
};

/* neg[q] from the 32 sign bytes (byte j: weights 8 j .. 8 j + 7) doubled in int16 lanes (lane j
 * holds byte j twice): weight 4 k + q's sign is bit 4 (k % 2) + q of sign byte k / 2. */
static inline __attribute__((always_inline)) VNNI void grid_neg_vnni(__m512i doubled, __mmask64 *neg) {
#pragma GCC unroll 4
  for (int q = 0; q < 4; q++)
    neg[q] = _mm512_test_epi8_mask(doubled, _mm512_set1_epi16((short)((0x10 << q) << 8 | 1 << q)));
}

/* The plane-order IQ3 block without VBMI: the grid's nibble words looked up 32 indices at a time
 * (grid_words_vnni), the indices taken in the order that lets one vpackuswb per byte of the
 * words put position k on index k. */
static inline __attribute__((always_inline)) VNNI void iq3_planes_vnni(uint32_t type, const uint8_t *bb,
                                                                       struct gridp *p) {
  const int xxs = type == ST_TYPE_IQ3_XXS;
  const struct kvec k = k_vec_avx2(type, bb);
  p->d = k.d;
  /* sub-block s's scale in int16 lanes 4 s .. 4 s + 3 (k.sc16 holds it in int32 lane s, both halves) */
  p->sc = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                   _mm512_castsi256_si512(k.sc16));
  const uint8_t *qs =
      xxs ? ((const st_block_iq3_xxs *)(const void *)bb)->qs : ((const st_block_iq3_s *)(const void *)bb)->qs;
  /* a: indices 16 l .. 16 l + 7, b: 16 l + 8 .. 16 l + 15 (l = 0..3), one per int16 lane */
  const __m512i q = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                             _mm512_loadu_si512((const void *)qs));
  __m512i ia = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(q)),
          ib = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(q, 1));
  __m512i sd; /* the sign bytes, doubled */
  if (xxs) {
    sd = iq_signs_doubled_vnni(type, bb);
  } else {
    const st_block_iq3_s *b = (const st_block_iq3_s *)(const void *)bb;
    uint64_t qh; /* bit k: the top bit of index k; bytes 0, 2, 4, 6 for a, 1, 3, 5, 7 for b */
    memcpy(&qh, b->qh, 8);
    const uint64_t e = qh & 0x00FF00FF00FF00FFull, o = qh >> 8 & 0x00FF00FF00FF00FFull;
    const __mmask32 ha = (__mmask32)((e & 0xFF) | (e >> 8 & 0xFF00) | (e >> 16 & 0xFF0000) |
                                     (e >> 24 & 0xFF000000)),
                    hb = (__mmask32)((o & 0xFF) | (o >> 8 & 0xFF00) | (o >> 16 & 0xFF0000) |
                                     (o >> 24 & 0xFF000000));
    ia = _mm512_mask_add_epi16(ia, ha, ia, _mm512_set1_epi16(256));
    ib = _mm512_mask_add_epi16(ib, hb, ib, _mm512_set1_epi16(256));
    sd = signs_doubled_vnni(b->signs);
  }
  const __m512i wa = grid_words_vnni(xxs ? iq3xxs_nibbles : iq3s_nibbles, xxs ? 8 : 16, ia),
                wb = grid_words_vnni(xxs ? iq3xxs_nibbles : iq3s_nibbles, xxs ? 8 : 16, ib);
  const __m512i m8 = _mm512_set1_epi16(0xFF), m4 = _mm512_set1_epi8(0xF);
  const __m512i lo = _mm512_packus_epi16(_mm512_and_si512(wa, m8), _mm512_and_si512(wb, m8)),
                hi = _mm512_packus_epi16(_mm512_srli_epi16(wa, 8), _mm512_srli_epi16(wb, 8));
  const __m512i lut =
      _mm512_broadcast_i32x4(xxs ? _mm_setr_epi8(4, 12, 20, 28, 36, 44, 52, 62, 0, 0, 0, 0, 0, 0, 0, 0)
                                 : _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0));
  p->m[0] = _mm512_shuffle_epi8(lut, _mm512_and_si512(lo, m4));
  p->m[1] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(lo, 4), m4));
  p->m[2] = _mm512_shuffle_epi8(lut, _mm512_and_si512(hi, m4));
  p->m[3] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(hi, 4), m4));
  grid_neg_vnni(sd, p->neg);
}

/* The four planes of an IQ2 block from its 32 entries' code words (int16 lane i: entry i's codes,
 * 0..3 in the low byte, 4..7 in the high byte): plane q's byte 2 i + h is code q of byte h, the
 * codes turned into the levels 8, 25, 43 by one byte shuffle. */
static inline __attribute__((always_inline)) VNNI void iq2_levels_vnni(__m512i words, __m512i *m) {
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(8, 25, 43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)),
                m2 = _mm512_set1_epi8(3);
  m[0] = _mm512_shuffle_epi8(lut, _mm512_and_si512(words, m2));
#pragma GCC unroll 3
  for (int q = 1; q < 4; q++)
    m[q] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(words, 2 * q), m2));
}

/* The plane-order IQ2_XS or IQ2_S block without VBMI: the code words of the 32 entries looked up
 * in registers (grid_words_vnni). */
static inline __attribute__((always_inline)) VNNI void iq2_planes_vnni(uint32_t type, const uint8_t *bb,
                                                                       struct gridp *p) {
  const struct kvec k = k_vec_avx2(type, bb);
  p->d = k.d;
  /* group j's scale (k.sc16 lane j) in int16 lanes 2 j, 2 j + 1 */
  p->sc = _mm512_permutexvar_epi16(
      _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15,
                                         14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                        1),
      _mm512_castsi256_si512(k.sc16));
  __m512i words, sd; /* sd: the sign bytes, doubled */
  if (type == ST_TYPE_IQ2_XS) {
    const st_block_iq2_xs *b = (const st_block_iq2_xs *)(const void *)bb;
    const __m512i q = _mm512_loadu_si512((const void *)b->qs); /* 9-bit index, 7-bit sign field */
    words = grid_words_vnni(iq2xs_codes, 16, _mm512_and_si512(q, _mm512_set1_epi16(511)));
    sd = iq_signs_doubled_vnni(type, bb);
  } else {
    const st_block_iq2_s *b = (const st_block_iq2_s *)(const void *)bb;
    uint64_t qh; /* entry i's index bits 8, 9: bits 2 (i % 4) of qh byte i / 4 */
    memcpy(&qh, b->qh, 8);
    const __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)qh),
                                           _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4,
                                                            4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7));
    const __m512i h =
        _mm512_and_si512(_mm512_srlv_epi16(_mm512_cvtepu8_epi16(hb),
                                           _mm512_set_epi16(6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6,
                                                            4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0)),
                         _mm512_set1_epi16(3));
    const __m512i idx = _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)b->qs)),
                                        _mm512_slli_epi16(h, 8));
    words = grid_words_vnni(iq2s_codes, 32, idx);
    sd = signs_doubled_vnni(b->qs + 32);
  }
  iq2_levels_vnni(words, p->m);
  grid_neg_vnni(sd, p->neg);
}

/* Super-block b of a grid row, prepared in p, into the nt tokens' accumulators: per token the four
 * planes' products with the plane-order activations summed by vpdpbusd into int32 lanes (lane L:
 * weights 16 L .. 16 L + 15, which share one scale), then one vpmulld by the scales: k_accumulate's
 * lanes. Two instructions fewer per token than vpmaddubsw, int16 sums and vpdpwssd (bench/RESULTS.md,
 * session 7), with the same integers. */
static inline __attribute__((always_inline)) VNNI void grid_tokens_vnni(uint32_t type, const struct gridp *pp,
                                                                        int64_t b, const uint8_t *xq,
                                                                        int64_t ldq, int nt, int64_t n,
                                                                        struct kacc *acc) {
  const __m512i zero = _mm512_setzero_si512();
  const struct gridp p = *pp;
  const __m512i sc32 = _mm512_and_si512(p.sc, _mm512_set1_epi32(0xFFFF)); /* both int16 halves hold it */
  for (int t = 0; t < nt; t++) {
    const uint8_t *row = xq + t * ldq;
    const int8_t *xp = (const int8_t *)(const void *)(row + grid_planes_at(n, b));
    __m512i s = zero;
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
      const __m512i xv = _mm512_loadu_si512((const void *)(xp + 64 * q));
      s = _mm512_dpbusd_epi32(s, p.m[q], _mm512_mask_sub_epi8(xv, p.neg[q], zero, xv));
    }
    const __m512i is = _mm512_mullo_epi32(s, sc32);
    const st_act_q8_K *x = (const st_act_q8_K *)(const void *)row + b;
    k_lanes_vnni(type, p.d, 0.0f, x->d, is, _mm256_setzero_si256(), &acc[t]);
  }
}

ST_Q8_ROWS_K(q8_rows_k_vnni, VNNI, iq3_planes_vnni, iq2_planes_vnni)

static VNNI void q8_tile_vnni(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                              int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_Q8_DISPATCH(q8_rows_b32_vnni, q8_rows_k_vnni)
}

/* AVX-512 VBMI on top: the four grids looked up with byte permutes (vpermi2b) over their byte
 * planes, 64 lookups at a time (on the Xeons, st_dot_grid_lookup: the IQ2 formats by gathers,
 * iq2_words_gather_vbmi, and the IQ3 formats by one-source vpermb pairs, grid_plane_vbmi), and
 * the IQ2_XS/IQ3_XXS sign bytes from one GF(2) affine map (GFNI, which every CPU with VBMI and
 * VNNI has). The same planes, signs and scales as the VNNI level, so the same results. */
#define VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni,avx2,fma,f16c")))

static const uint8_t iq3xxs_planes[512] __attribute__((aligned(64))) = ST_IQ3XXS_GRID_PLANES;
static const uint8_t iq3s_planes[1024] __attribute__((aligned(64))) = ST_IQ3S_GRID_PLANES;
static const uint8_t iq2xs_planes[1024] __attribute__((aligned(64))) = ST_IQ2XS_GRID_PLANES;
static const uint8_t iq2s_planes[2048] __attribute__((aligned(64))) = ST_IQ2S_GRID_PLANES;

/* The odd integer scales 2 s + 1 in int16 lanes from the 4-bit s at bits 1..4 of each lane (the
 * bits around them ignored). */
static inline __attribute__((always_inline)) VBMI __m512i grid_odd_scales_vbmi(__m512i s_at_bit1) {
  return _mm512_ternarylogic_epi32(s_at_bit1, _mm512_set1_epi16(0x1E), _mm512_set1_epi16(1), 0xEA);
}

/* Byte k of the result takes byte k / 2: for vpermb, which doubles 32 bytes into 64. */
static inline __attribute__((always_inline)) VBMI __m512i grid_dup_vbmi(void) {
  return _mm512_srli_epi16(_mm512_set_epi8(63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47,
                                           46, 45, 44, 43, 42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30,
                                           29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                                           12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           1);
}

/* One plane of a grid (ntab = 256, 512 or 1024 entries, 128 per register pair) at the indices
 * idx: bits 0..6 through vpermi2b, or with pairs = 1 through a vpermb of the pair's first register
 * then a vpermb of the second merged under bit 6 (on the Xeons vpermi2b is three uops, two of them
 * on port 5, and vpermb one; on Zen 4 the pairs are slower); bits 7, 8, 9 as the masks h7, h8, h9
 * (a tree of blends). */
static inline __attribute__((always_inline)) VBMI __m512i grid_plane_vbmi(const uint8_t *tab, int ntab,
                                                                          __m512i idx, __mmask64 h7,
                                                                          __mmask64 h8, __mmask64 h9,
                                                                          int pairs) {
  const __m512i *t = (const __m512i *)(const void *)tab;
  const __mmask64 h6 = pairs ? _mm512_movepi8_mask(_mm512_add_epi8(idx, idx)) : 0; /* index bit 6 */
  __m512i r[8];
#pragma GCC unroll 8
  for (int p = 0; p < ntab / 128; p++)
    r[p] = pairs ? _mm512_mask_permutexvar_epi8(_mm512_permutexvar_epi8(idx, t[2 * p]), h6, idx, t[2 * p + 1])
                 : _mm512_permutex2var_epi8(t[2 * p], idx, t[2 * p + 1]);
#pragma GCC unroll 4
  for (int p = 0; p < ntab / 256; p++)
    r[p] = _mm512_mask_blend_epi8(h7, r[2 * p], r[2 * p + 1]);
#pragma GCC unroll 2
  for (int p = 0; p < ntab / 512; p++)
    r[p] = _mm512_mask_blend_epi8(h8, r[2 * p], r[2 * p + 1]);
  if (ntab == 1024) r[0] = _mm512_mask_blend_epi8(h9, r[0], r[1]);
  return r[0];
}

/* The sign bytes of 64 seven-bit fields (bits 0..6 of each byte of f; bit 7 does not matter):
 * st_iq_signs, the field with its parity bit on top, as one GF(2) affine map (gf2p8affineqb: output
 * bits 0..6 copy the input's, bit 7 is the parity of input bits 0..6), on port 0 of the Xeons where
 * a 128-entry table lookup by vpermi2b takes two cycles of port 5. */
static inline __attribute__((always_inline)) VBMI __m512i st_iq_signs_vbmi(__m512i f) {
  /* row of output bit i: byte 7 - i of the matrix */
  return _mm512_gf2p8affine_epi64_epi8(f, _mm512_set1_epi64(0x010204081020407Fll), 0);
}

/* IQ3_XXS's 32 sign bytes (as iq_signs_doubled_vnni, not doubled): its 7-bit fields pulled out of the packed
 * words by vpmultishiftqb. */
static inline __attribute__((always_inline)) VBMI __m256i iq3xxs_signs32_vbmi(const uint8_t *bb) {
  /* field k of sub-block s at bits 7k of its uint32; two sub-blocks per qword */
  const __m256i aux = _mm256_loadu_si256((const __m256i *)(bb + offsetof(st_block_iq3_xxs, qs) + 64));
  const __m256i f = _mm256_multishift_epi64_epi8(_mm256_set1_epi64x(0x352E2720150E0700ll), aux);
  return _mm512_castsi512_si256(st_iq_signs_vbmi(_mm512_castsi256_si512(f)));
}

/* The float value of the half at p (a block's d, with at least 8 bytes of block from p): a vmovq
 * load and vcvtph2ps, without the vpinsrw (port 5 on the Xeons) that _cvtsh_ss of a uint16_t takes */
static inline __attribute__((always_inline)) VBMI float half_at_vbmi(const void *p) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p)));
}

/* 8 bytes at p in every qword: vpbroadcastq from memory, a load alone (from a general register it
 * would take port 5 too) */
static inline __attribute__((always_inline)) VBMI __m512i bcast64_vbmi(const void *p) {
  return _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)p));
}

/* The IQ2 formats' odd scales (struct gridp's sc) from their 16 scale nibbles at sc (group j:
 * nibble j of the little-endian uint64): int16 lanes 4 m .. 4 m + 3 take groups 2 m, 2 m,
 * 2 m + 1, 2 m + 1, the nibbles at bits 8 m, 8 m + 4. */
static inline __attribute__((always_inline)) VBMI __m512i iq2_scales_vbmi(const uint8_t *sc) {
  const __m512i v = _mm512_multishift_epi64_epi8(
      _mm512_setr_epi64(0x0404040400000000ll, 0x0C0C0C0C08080808ll, 0x1414141410101010ll,
                        0x1C1C1C1C18181818ll, 0x2424242420202020ll, 0x2C2C2C2C28282828ll,
                        0x3434343430303030ll, 0x3C3C3C3C38383838ll),
      bcast64_vbmi(sc));
  return grid_odd_scales_vbmi(_mm512_slli_epi16(v, 1));
}

/* IQ2_S's 32 sign bytes doubled bytewise (byte k: entry k / 2's), as grid_neg_vnni takes them. */
static inline __attribute__((always_inline)) VBMI __m512i iq2s_signs_dup_vbmi(const st_block_iq2_s *b) {
  return _mm512_permutexvar_epi8(grid_dup_vbmi(),
                                 _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b->qs + 32))));
}

/* The IQ2 grids' code words (iq_grids.h) in 32-bit lanes, for iq2_words_gather_vbmi: 2 and 4 KiB */
static const uint32_t iq2xs_codes32[512] __attribute__((aligned(64))) = ST_IQ2XS_GRID_CODES;
static const uint32_t iq2s_codes32[1024] __attribute__((aligned(64))) = ST_IQ2S_GRID_CODES;

/* The code words (as iq2_planes_vnni's) of 32 IQ2 entries by two vpgatherdd from a table of
 * 32-bit code words, then one vpackusdw: its 128-bit lane l takes dwords 4 l .. 4 l + 3 of each
 * gather, so dword 4 l + m of the indices i0 is entry 8 l + m's and of i1 entry 8 l + 4 + m's. On
 * the Xeon of the GPU host a vpermi2b costs two cycles of port 5; the gathers use the load ports. */
static inline __attribute__((always_inline)) VBMI __m512i iq2_words_gather_vbmi(const uint32_t *codes,
                                                                                __m512i i0, __m512i i1) {
  return _mm512_packus_epi32(_mm512_i32gather_epi32(i0, (const void *)codes, 4),
                             _mm512_i32gather_epi32(i1, (const void *)codes, 4));
}

/* The plane-order IQ2_XS or IQ2_S block with VBMI: the 32 entries' code words (iq2_planes_vnni's),
 * either gathered (iq2_words_gather_vbmi: gather = 1, st_dot_grid_lookup) or looked up by
 * vpermi2b in the grid's two code planes (ST_IQ2*_GRID_PLANES: codes 0..3 of each entry, then
 * codes 4..7), each entry's index in two adjacent bytes, the even one looked up in the low plane
 * and the odd one in the high plane (IQ2_XS: grid_plane_vbmi over the two planes as one table;
 * IQ2_S: one tree per plane, then a blend); the scales by vpmultishiftqb. */
static inline __attribute__((always_inline)) VBMI void iq2_planes_vbmi_impl(uint32_t type, const uint8_t *bb,
                                                                            struct gridp *p, int gather) {
  p->d = half_at_vbmi(bb) * grid_d_mul(type);
  const __m512i dup = grid_dup_vbmi(), one = _mm512_set1_epi8(1);
  const __mmask64 odd = 0xAAAAAAAAAAAAAAAAull;
  __m512i words, sdup; /* sdup: the sign bytes doubled (byte k: entry k / 2's) */
  const uint8_t *scales; /* group j's scale: nibble j */
  if (type == ST_TYPE_IQ2_XS) {
    const st_block_iq2_xs *b = (const st_block_iq2_xs *)(const void *)bb;
    scales = b->scales;
    const __m512i q = _mm512_loadu_si512((const void *)b->qs); /* 9-bit index, 7-bit sign field */
    /* bytes 2 i, 2 i + 1: word i's low byte (index bits 0..7); h8: bit 0 of its high byte */
    const __m512i lo = _mm512_add_epi8(dup, dup), hb = _mm512_permutexvar_epi8(_mm512_add_epi8(lo, one), q);
    if (gather) {
      /* dword 4 l + m of i[h]: word 8 l + 4 h + m of q (iq2_words_gather_vbmi), its low 9 bits */
      const __m512i at = _mm512_set_epi16(0, 27, 0, 26, 0, 25, 0, 24, 0, 19, 0, 18, 0, 17, 0, 16, 0, 11, 0,
                                          10, 0, 9, 0, 8, 0, 3, 0, 2, 0, 1, 0, 0),
                    four = _mm512_set1_epi32(4), m9 = _mm512_set1_epi32(511);
      words = iq2_words_gather_vbmi(
          iq2xs_codes32, _mm512_and_si512(_mm512_permutexvar_epi16(at, q), m9),
          _mm512_and_si512(_mm512_permutexvar_epi16(_mm512_add_epi32(at, four), q), m9));
    } else {
      const __m512i idx = _mm512_permutexvar_epi8(lo, q);
      words = grid_plane_vbmi(iq2xs_planes, 1024, idx, _mm512_movepi8_mask(idx),
                              _mm512_test_epi8_mask(hb, one), odd, 0);
    }
    /* the sign bytes, already doubled: the 7-bit field is the high byte's bits 1..7 */
    sdup = st_iq_signs_vbmi(_mm512_srli_epi16(hb, 1));
  } else {
    const st_block_iq2_s *b = (const st_block_iq2_s *)(const void *)bb;
    scales = b->scales;
    if (gather) {
      /* dword 4 l + m of i[h]: entry e = 8 l + 4 h + m (iq2_words_gather_vbmi), its low byte from
       * qs (byte e, moved to byte 0), bits 8, 9 from qh (bits 2 e, 2 e + 1 of the qword, brought
       * to byte 1 by vpmultishiftqb) */
#define ST_E(l, m) (8 * (l) + (m))
#define ST_DW(l, m) ((long long)(ST_E(l, m) | (2 * ST_E(l, m)) << 8))
#define ST_QW(l, m) (ST_DW(l, m) | ST_DW(l, (m) + 1) << 32)
      const __m512i at = _mm512_setr_epi64(ST_QW(0, 0), ST_QW(0, 2), ST_QW(1, 0), ST_QW(1, 2), ST_QW(2, 0),
                                           ST_QW(2, 2), ST_QW(3, 0), ST_QW(3, 2));
#undef ST_QW
#undef ST_DW
#undef ST_E
      const __m512i qsz = _mm512_loadu_si512((const void *)b->qs), qhb = bcast64_vbmi(b->qh),
                    m = _mm512_set1_epi32(0x300);
      __m512i i[2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++) {
        /* byte 0 of each dword: entry e's byte of qs; byte 1: qh >> 2 e (vpmultishiftqb's count) */
        const __m512i ah = _mm512_add_epi8(at, _mm512_set1_epi32(h ? 4 | 8 << 8 : 0));
        i[h] = _mm512_ternarylogic_epi32(_mm512_maskz_permutexvar_epi8(0x1111111111111111ull, ah, qsz),
                                         _mm512_multishift_epi64_epi8(ah, qhb), m, 0xF8); /* a | (b & c) */
      }
      words = iq2_words_gather_vbmi(iq2s_codes32, i[0], i[1]);
    } else {
      uint64_t qh; /* entry i's index bits 8, 9 at bits 2 i, 2 i + 1: the masks of bytes 2 i and 2 i + 1 */
      memcpy(&qh, b->qh, 8);
      const uint64_t e8 = qh & 0x5555555555555555ull, e9 = qh & 0xAAAAAAAAAAAAAAAAull;
      const __mmask64 h8 = e8 | e8 << 1, h9 = e9 | e9 >> 1;
      const __m512i idx =
          _mm512_permutexvar_epi8(dup, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b->qs)));
      const __mmask64 h7 = _mm512_movepi8_mask(idx);
      words = _mm512_mask_blend_epi8(odd, grid_plane_vbmi(iq2s_planes, 1024, idx, h7, h8, h9, 0),
                                     grid_plane_vbmi(iq2s_planes + 1024, 1024, idx, h7, h8, h9, 0));
    }
    sdup = iq2s_signs_dup_vbmi(b);
  }
  p->sc = iq2_scales_vbmi(scales);
  /* the levels by vpermb of a table that repeats 8, 25, 43 every four bytes, so that only a
   * byte's low two bits count and the codes above need no masking */
  const __m512i lut = _mm512_set1_epi32(0x002B1908);
  p->m[0] = _mm512_permutexvar_epi8(words, lut);
#pragma GCC unroll 3
  for (int q = 1; q < 4; q++)
    p->m[q] = _mm512_permutexvar_epi8(_mm512_srli_epi16(words, 2 * q), lut);
  grid_neg_vnni(sdup, p->neg);
}

static inline __attribute__((always_inline)) VBMI void iq2_planes_vbmi(uint32_t type, const uint8_t *bb,
                                                                       struct gridp *p) {
  iq2_planes_vbmi_impl(type, bb, p, 0);
}

static inline __attribute__((always_inline)) VBMI void
iq2_planes_gather_vbmi(uint32_t type, const uint8_t *bb, struct gridp *p) {
  iq2_planes_vbmi_impl(type, bb, p, 1);
}

/* The plane-order IQ3 block with VBMI: the 64 indices as they lie in the block, looked up by
 * byte permutes over the grid's byte planes (grid_plane_vbmi, vpermi2b or with pairs = 1 vpermb
 * pairs); the scales pulled out by vpmultishiftqb or a byte permute. */
static inline __attribute__((always_inline)) VBMI void iq3_planes_vbmi_impl(uint32_t type, const uint8_t *bb,
                                                                            struct gridp *p, int pairs) {
  const int xxs = type == ST_TYPE_IQ3_XXS;
  const uint8_t *qs =
      xxs ? ((const st_block_iq3_xxs *)(const void *)bb)->qs : ((const st_block_iq3_s *)(const void *)bb)->qs;
  const __m512i idx = _mm512_loadu_si512((const void *)qs);
  const __mmask64 hi7 = _mm512_movepi8_mask(idx);
  __mmask64 hi8 = 0;
  p->d = half_at_vbmi(bb) * grid_d_mul(type);
  __m256i sg; /* sign byte j: weights 8 j .. 8 j + 7 */
  if (xxs) {
    /* scale s: the top nibble of byte 4 s + 3 of the sub-block words after the indices */
    const __m512i w = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(qs + 64)));
    const __m512i at = _mm512_set_epi16(31, 31, 31, 31, 27, 27, 27, 27, 23, 23, 23, 23, 19, 19, 19, 19, 15,
                                        15, 15, 15, 11, 11, 11, 11, 7, 7, 7, 7, 3, 3, 3, 3);
    const __m512i top =
        _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, at, w); /* lane i: byte 4 (i / 4) + 3 */
    p->sc = grid_odd_scales_vbmi(_mm512_srli_epi16(top, 3));
    sg = iq3xxs_signs32_vbmi(bb);
  } else {
    const st_block_iq3_s *b = (const st_block_iq3_s *)(const void *)bb;
    uint64_t qh; /* bit k: the top bit of index k */
    memcpy(&qh, b->qh, 8);
    hi8 = _cvtu64_mask64(qh);
    /* scale s: nibble s of b->scales, bits 4 s .. 4 s + 3 */
    const __m512i v = _mm512_multishift_epi64_epi8(
        _mm512_setr_epi64(0, 0x0404040404040404ll, 0x0808080808080808ll, 0x0C0C0C0C0C0C0C0Cll,
                          0x1010101010101010ll, 0x1414141414141414ll, 0x1818181818181818ll,
                          0x1C1C1C1C1C1C1C1Cll),
        _mm512_broadcastd_epi32(_mm_loadu_si32(b->scales))); /* the block's last 4 bytes */
    p->sc = grid_odd_scales_vbmi(_mm512_slli_epi16(v, 1));
    sg = _mm256_loadu_si256((const __m256i *)b->signs);
  }
  const uint8_t *tab = xxs ? iq3xxs_planes : iq3s_planes;
  const int ntab = xxs ? 256 : 512;
  const __m512i lo = grid_plane_vbmi(tab, ntab, idx, hi7, hi8, 0, pairs),
                hi = grid_plane_vbmi(tab + ntab, ntab, idx, hi7, hi8, 0, pairs);
  /* the levels by vpermb of a table that repeats the eight every eight bytes, so that the bits
   * above a nibble's three need no masking */
  const __m512i lut = _mm512_set1_epi64(xxs ? 0x3E342C241C140C04ll : 0x0F0D0B0907050301ll);
  p->m[0] = _mm512_permutexvar_epi8(lo, lut);
  p->m[1] = _mm512_permutexvar_epi8(_mm512_srli_epi16(lo, 4), lut);
  p->m[2] = _mm512_permutexvar_epi8(hi, lut);
  p->m[3] = _mm512_permutexvar_epi8(_mm512_srli_epi16(hi, 4), lut);
  grid_neg_vnni(_mm512_permutexvar_epi8(grid_dup_vbmi(), _mm512_castsi256_si512(sg)), p->neg);
}

static inline __attribute__((always_inline)) VBMI void iq3_planes_vbmi(uint32_t type, const uint8_t *bb,
                                                                       struct gridp *p) {
  iq3_planes_vbmi_impl(type, bb, p, 0);
}

/* The IQ3 block for the Xeons (st_dot_grid_lookup): its grid by vpermb pairs */
static inline __attribute__((always_inline)) VBMI void iq3_planes_pairs_vbmi(uint32_t type, const uint8_t *bb,
                                                                             struct gridp *p) {
  iq3_planes_vbmi_impl(type, bb, p, 1);
}

ST_Q8_ROWS_K(q8_rows_k_vbmi, VBMI, iq3_planes_vbmi, iq2_planes_vbmi)

static VBMI void q8_tile_vbmi(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                              int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_Q8_DISPATCH(q8_rows_b32_vnni, q8_rows_k_vbmi)
}

ST_Q8_ROWS_K(q8_rows_k_vbmi_gather, VBMI, iq3_planes_pairs_vbmi, iq2_planes_gather_vbmi)

/* The grid formats with st_dot_grid_lookup 1 ("gather": the IQ2 grids gathered, the IQ3 grids by
 * vpermb pairs); st_matmul_q8 sends no other format here */
static VBMI void q8_tile_vbmi_gather(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr,
                                     const uint8_t *xq, int64_t ldq, int nt, int64_t n, float *out,
                                     int64_t ldo) {
  ST_ASSERT(k_is_grid(type));
  ST_GRID_DISPATCH(ST_Q8_TILE_CASES, q8_rows_k_vbmi_gather)
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
  static const q8_tile_fn fns[] = {q8_tile_scalar, q8_tile_avx2, q8_tile_vnni, q8_tile_vbmi};
  const uint64_t ldq = st_q8_row_bytes(type, n);
  ST_ASSERT(ldq > 0);
  const q8_tile_fn tile =
      k_is_grid(type) && q8_level() == 3 && st_dot_grid_lookup(-1) ? q8_tile_vbmi_gather : fns[q8_level()];
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

void st_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * (w ? w[i] : 1.0f);
}
