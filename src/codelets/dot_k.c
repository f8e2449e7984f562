/* The CPU kernels of the K family (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS, super-blocks of 256
 * weights; their blocks in quant.h): for float activations (st_matmul) the AVX2 and AVX-512 row
 * tiles that decode a super-block in registers, and for int8 activations (st_matmul_q8,
 * st_act_q8_K) the scalar, AVX2 and AVX-512 VNNI kernels (the last also built for the VBMI level),
 * which keep their sums in the lanes of dot_impl.h's k_accumulate. dot.c chooses among them; the
 * helpers and row loops they share with the grid formats are in dot_impl.h. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codelets/dot_impl.h"
#include "codelets/quant.h"
#include "common.h"

/* ---- float activations (st_matmul) -------------------------------------------------------- */

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

AVX512 void row_tile_k_avx512(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
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

AVX2 void row_tile_k_avx2(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n, float *out,
                          int64_t ldo) {
  switch (nt) {
  case 1: row_tile_k_avx2_impl(type, w, x, ldx, 1, n, out, ldo); break;
  case 2: row_tile_k_avx2_impl(type, w, x, ldx, 2, n, out, ldo); break;
  case 3: row_tile_k_avx2_impl(type, w, x, ldx, 3, n, out, ldo); break;
  default: row_tile_k_avx2_impl(type, w, x, ldx, 4, n, out, ldo); break;
  }
}

/* ---- int8 activations (st_matmul_q8) ------------------------------------------------------ */

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

/* The struct kscales of a K super-block (scalar path). */
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
  } else { /* IQ4_XS */
    const st_block_iq4_xs *b = (const st_block_iq4_xs *)(const void *)bb;
    for (int j = 0; j < 8; j++) k->sc[2 * j] = k->sc[2 * j + 1] = (int16_t)iq4_xs_sub_scale(b, j);
    memset(k->mv, 0, sizeof k->mv);
  }
  k->d = st_fp16_to_f32(dh);
  k->dmin = st_fp16_to_f32(mh);
}

/* Bytes per super-block of the K family. */
static inline uint64_t k_bytes(uint32_t type) {
  switch (type) {
  case ST_TYPE_Q2_K: return sizeof(st_block_q2_K);
  case ST_TYPE_Q3_K: return sizeof(st_block_q3_K);
  case ST_TYPE_Q4_K: return sizeof(st_block_q4_K);
  case ST_TYPE_Q5_K: return sizeof(st_block_q5_K);
  case ST_TYPE_Q6_K: return sizeof(st_block_q6_K);
  default: return sizeof(st_block_iq4_xs);
  }
}

/* scalar */
static void k_quants_scalar(uint32_t type, const uint8_t *bb, int8_t *q) {
  if (type == ST_TYPE_Q2_K || type == ST_TYPE_Q3_K) {
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

ST_Q8_ROW_K_SCALAR(q8_row_k_scalar, k_bytes, k_scales, k_quants_scalar)
ST_Q8_EACH_ROW(q8_rows_k_scalar, q8_row_k_scalar, )

void q8_tile_k_scalar(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                      int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  q8_rows_k_scalar(type, w, row_bytes, nr, xq, ldq, nt, n, out, ldo);
}

/* AVX2 */
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

static inline __attribute__((always_inline)) AVX2 void q8_tile_k_avx2_impl(uint32_t type, const void *w, const uint8_t *xq,
                                                                          int64_t ldq, int nt, int64_t n, float *out,
                                                                          int64_t ldo) {
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

ST_Q8_EACH_ROW(q8_rows_k_avx2, q8_tile_k_avx2_impl, AVX2)

AVX2 void q8_tile_k_avx2(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                         int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_K_DISPATCH(ST_Q8_TILE_CASES, q8_rows_k_avx2)
}

/* AVX-512 VNNI (dot_impl.h) */

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

/* Super-block b (at bb) of one row into the nt tokens' accumulators: the K formats and IQ4_XS (the
 * grid formats take grid_tokens_vnni); ST_Q8_ROWS_K's `block` (n, the row length, is not needed). */
static inline __attribute__((always_inline)) VNNI void k_block_vnni(uint32_t type, const uint8_t *bb,
                                                                    int64_t b, const uint8_t *xq, int64_t ldq,
                                                                    int nt, int64_t n, const __m512i *xoff,
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

ST_Q8_ROWS_K(q8_rows_k_vnni, VNNI, k_block_vnni, k_bytes)

VNNI void q8_tile_k_vnni(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                         int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_K_DISPATCH(ST_Q8_TILE_CASES, q8_rows_k_vnni)
}

/* The same kernels at the VBMI level (st_matmul_q8's level 3) */
ST_Q8_ROWS_K(q8_rows_k_vbmi, VBMI, k_block_vnni, k_bytes)

VBMI void q8_tile_k_vbmi(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                         int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_K_DISPATCH(ST_Q8_TILE_CASES, q8_rows_k_vbmi)
}
