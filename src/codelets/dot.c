/* CPU dot-product kernels (see dot.h): a scalar path, AVX2+FMA+F16C and AVX-512, selected once
 * at run time from the CPU's features. One weight row is loaded once and multiplied with a tile
 * of up to ST_TILE activation rows; each activation row keeps its own accumulators, updated in
 * the same order whatever the tile size, so results do not depend on the batch size. */
#include "codelets/dot.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
 * Q4_0 and IQ4_NL per vector of 8 or 16 weights (never crossing a block half); Q2_K..Q6_K and
 * IQ4_XS a super-block at a time in the row_tile_k_* functions below. IQ4_NL/IQ4_XS map their
 * 4-bit indices to the non-linear levels with one byte shuffle (pshufb) of st_kvalues_iq4nl. */

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

/* Q4_0 in registers: the 8 or 16 weights from i share one block half (low or high nibbles of
 * the block's 16 bytes), w = d * q - 8d. */
__attribute__((target("f16c"))) static inline const uint8_t *q4_0_at(const void *row, int64_t i, int *shift, float *dl,
                                                                     float *ml) {
  const st_block_q4_0 *b = (const st_block_q4_0 *)row + i / 32;
  const int j = (int)(i % 32);
  *shift = j < 16 ? 0 : 4;
  *dl = _cvtsh_ss(b->d);
  *ml = 8.0f * *dl;
  return b->qs + (j % 16);
}

/* IQ4_NL (Q4_0's block layout, the levels of st_kvalues_iq4nl): the 8 or 16 index bytes from i
 * and the block scale d. */
static inline const uint8_t *iq4_nl_at(const void *row, int64_t i, int *shift, uint16_t *dh) {
  const st_block_iq4_nl *b = (const st_block_iq4_nl *)row + i / 32;
  const int j = (int)(i % 32);
  *shift = j < 16 ? 0 : 4;
  *dh = b->d;
  return b->qs + (j % 16);
}

/* The signed 6-bit scale of 32-weight sub-block ib of an IQ4_XS block (quant.c's iq4_xs_scale). */
static inline int iq4_xs_sub_scale(const st_block_iq4_xs *b, int ib) {
  return (((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b->scales_h >> (2 * ib)) & 3) << 4)) - 32;
}

/* ---- AVX2 -------------------------------------------------------------------------------- */

#define AVX2 __attribute__((target("avx2,fma,f16c")))

static inline AVX2 __m256i quants8_avx2(const void *row, int64_t i, float *dl, float *ml) {
  int shift;
  const uint8_t *q = q4_0_at(row, i, &shift, dl, ml);
  return _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q)), shift),
                          _mm256_set1_epi32(0xF));
}

static inline AVX2 __m256 load8_avx2(uint32_t type, const void *row, int64_t i) {
  switch (type) {
  case ST_TYPE_F32:
    return _mm256_loadu_ps((const float *)row + i);
  case ST_TYPE_F16:
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
  case ST_TYPE_BF16:
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))), 16));
  case ST_TYPE_Q8_0: {
    const st_block_q8_0 *b = (const st_block_q8_0 *)row + i / ST_QK8_0;
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
    const __m128i q = _mm_loadl_epi64((const __m128i *)(b->qs + i % ST_QK8_0));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
  }
  case ST_TYPE_IQ4_NL: {
    int shift;
    uint16_t dh;
    const uint8_t *q = iq4_nl_at(row, i, &shift, &dh);
    const __m128i idx = _mm_and_si128(_mm_srli_epi16(_mm_loadl_epi64((const __m128i *)q), shift), _mm_set1_epi8(0xF));
    const __m128i v = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)st_kvalues_iq4nl), idx);
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dh)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
  }
  default: {
    float dl, ml;
    const __m256i q = quants8_avx2(row, i, &dl, &ml); /* Q4_0: the only other type that comes here */
    return _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(dl), _mm256_cvtepi32_ps(q)), _mm256_set1_ps(ml));
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

static inline AVX512 __m512i quants16_avx512(const void *row, int64_t i, float *dl, float *ml) {
  int shift;
  const uint8_t *q = q4_0_at(row, i, &shift, dl, ml);
  return _mm512_and_si512(_mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q)), shift),
                          _mm512_set1_epi32(0xF));
}

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
  case ST_TYPE_Q8_0: {
    const st_block_q8_0 *b = (const st_block_q8_0 *)row + i / ST_QK8_0;
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
    const __m128i q = _mm_loadu_si128((const __m128i *)(b->qs + i % ST_QK8_0));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
  }
  case ST_TYPE_IQ4_NL: {
    int shift;
    uint16_t dh;
    const uint8_t *q = iq4_nl_at(row, i, &shift, &dh);
    const __m128i idx = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)q), shift), _mm_set1_epi8(0xF));
    const __m128i v = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)st_kvalues_iq4nl), idx);
    return _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(dh)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)));
  }
  default: {
    float dl, ml;
    const __m512i q = quants16_avx512(row, i, &dl, &ml); /* Q4_0 */
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(dl), _mm512_cvtepi32_ps(q)), _mm512_set1_ps(ml));
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

/* ---- dispatch ---------------------------------------------------------------------------- */

typedef void (*row_tile_fn)(uint32_t, const void *, const float *, int64_t, int, int64_t, float *,
                            int64_t);

static int detected_level(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return 2;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return 1;
  return 0;
}

/* -1 until first use; a process-wide constant afterwards (the CPU does not change). */
static int isa_level = -1;

static int level(void) {
  if (isa_level < 0) isa_level = detected_level();
  return isa_level;
}

const char *st_dot_isa(void) {
  static const char *names[] = {"scalar", "avx2", "avx512"};
  return names[level()];
}

int st_dot_force_isa(int l) {
  if (l >= 0 && l <= detected_level()) isa_level = l;
  return level();
}

void st_matmul(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1,
               const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo) {
  static const row_tile_fn fns[] = {row_tile_scalar, row_tile_avx2, row_tile_avx512};
  const row_tile_fn fn = fns[level()];
  row_tile_fn tile = fn;
  const int k_rows = type == ST_TYPE_Q2_K || type == ST_TYPE_Q3_K || type == ST_TYPE_Q4_K || type == ST_TYPE_Q5_K ||
                     type == ST_TYPE_Q6_K || type == ST_TYPE_IQ4_XS;
  if (level() == 2 && k_rows) tile = row_tile_k_avx512;
  if (level() == 1 && k_rows) tile = row_tile_k_avx2;
  const int in_registers = type == ST_TYPE_F32 || type == ST_TYPE_F16 || type == ST_TYPE_BF16 || type == ST_TYPE_Q8_0 ||
                           (level() > 0 && (type == ST_TYPE_Q4_0 || type == ST_TYPE_IQ4_NL || k_rows));
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

void st_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * (w ? w[i] : 1.0f);
}
