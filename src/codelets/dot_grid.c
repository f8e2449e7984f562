/* The CPU kernels of the grid i-quants (IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: per 8 or 4 weights an index
 * into a grid of magnitudes, iq_grids.h, and per weight a sign bit; their blocks in quant.h): for
 * float activations (st_matmul) the AVX2 and AVX-512 row tiles, and for int8 activations
 * (st_matmul_q8, st_act_q8_K with the plane-order copy) the scalar, AVX2, AVX-512 VNNI and VBMI
 * kernels, which look the grids up one byte plane at a time and keep their sums in the lanes
 * the K formats use (dot_impl.h). dot.c chooses among them. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codelets/dot_impl.h"
#include "codelets/iq_grids.h"
#include "codelets/quant.h"
#include "common.h"

/* ---- float activations (st_matmul) --------------------------------------------------------
 * IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S 64 (AVX-512) or 32 (AVX2) weights at a time: the grid entries
 * fetched by index with scalar loads (faster than vpgather on Zen 4, and gathers are slow on cores
 * with the Downfall microcode), the signs applied to the magnitudes as bytes (a masked byte
 * negation, or pshufb + psignb), then sub-block scale * signed magnitude, which equals the
 * dequantiser's scale * magnitude * sign exactly. Each weight then meets every token of the tile
 * as in the K-quant kernels (dot_k.c). */

/* The sub-block scales of the grid formats, as quant.c computes them. */
static inline float iq2_sub_scale(float d, int s) { return d * (0.5f + (float)s) * 0.25f; }
static inline float iq3xxs_sub_scale(float d, uint32_t aux) { return d * (0.5f + (float)(aux >> 28)) * 0.5f; }
static inline float iq3s_sub_scale(float d, int s) { return d * (float)(1 + 2 * s); }

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

AVX512 void row_tile_iq_avx512(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                               float *out, int64_t ldo) {
  ST_GRID_DISPATCH(ST_TILE_CASES, row_tile_iq_avx512_impl)
}

/* AVX2: the same blocks, eight weights per vector. */
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

AVX2 void row_tile_iq_avx2(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                           float *out, int64_t ldo) {
  ST_GRID_DISPATCH(ST_TILE_CASES, row_tile_iq_avx2_impl)
}

/* ---- int8 activations (st_matmul_q8) ------------------------------------------------------ */

/* The factor of a grid format's float scale d: 1/8 (IQ2), 1/4 (IQ3_XXS) or 1 (IQ3_S) (k_is_grid). */
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

/* The struct kscales of a grid block (k_scales of dot_k.c for the grid formats): the odd integer
 * scales, no mins, d times grid_d_mul. */
static inline void grid_scales(uint32_t type, const uint8_t *bb, struct kscales *k) {
  uint16_t dh, mh = 0;
  memcpy(&dh, bb, 2);
  for (int j = 0; j < 8; j++) k->sc[2 * j] = grid_sub_scale(type, bb, j, 0), k->sc[2 * j + 1] = grid_sub_scale(type, bb, j, 1);
  memset(k->mv, 0, sizeof k->mv);
  k->d = st_fp16_to_f32(dh);
  k->d *= grid_d_mul(type);
  k->dmin = st_fp16_to_f32(mh);
}

/* Bytes per super-block of the grid family. */
static inline uint64_t grid_bytes(uint32_t type) {
  switch (type) {
  case ST_TYPE_IQ2_XS: return sizeof(st_block_iq2_xs);
  case ST_TYPE_IQ2_S: return sizeof(st_block_iq2_s);
  case ST_TYPE_IQ3_XXS: return sizeof(st_block_iq3_xxs);
  default: return sizeof(st_block_iq3_s);
  }
}

/* scalar: the signed magnitudes of a block */
static void grid_quants_scalar(uint32_t type, const uint8_t *bb, int8_t *q) {
  for (int s = 0; s < 8; s++) {
    uint8_t m[32];
    uint32_t sg;
    grid_group(type, bb, s, m, &sg);
    for (int j = 0; j < 32; j++) q[32 * s + j] = (int8_t)((sg >> j) & 1 ? -m[j] : m[j]);
  }
}

ST_Q8_ROW_K_SCALAR(q8_row_grid_scalar, grid_bytes, grid_scales, grid_quants_scalar)
ST_Q8_EACH_ROW(q8_rows_grid_scalar, q8_row_grid_scalar, )

void q8_tile_grid_scalar(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                         int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  q8_rows_grid_scalar(type, w, row_bytes, nr, xq, ldq, nt, n, out, ldo);
}

/* AVX2 */
/* The struct kvec of a grid block (k_vec_avx2 of dot_k.c for the grid formats). */
static inline __attribute__((always_inline)) AVX2 struct kvec grid_vec_avx2(uint32_t type, const uint8_t *bb) {
  struct kvec k;
  if (type == ST_TYPE_IQ2_XS || type == ST_TYPE_IQ2_S) {
    /* scales[s]: low nibble weights 32s .. + 15, high nibble 32s + 16 .. + 31 */
    const uint8_t *sc = bb + (type == ST_TYPE_IQ2_XS ? offsetof(st_block_iq2_xs, scales) : offsetof(st_block_iq2_s, scales));
    const __m128i v = _mm_loadl_epi64((const __m128i *)sc), m4 = _mm_set1_epi8(0xF);
    const __m128i s = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    k.sc16 = _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(s), 1), _mm256_set1_epi16(1));
    k.mv16 = _mm256_setzero_si256();
    uint16_t dh;
    memcpy(&dh, bb, 2);
    k.d = _cvtsh_ss(dh) * grid_d_mul(type), k.dmin = 0.0f;
  } else { /* IQ3_XXS, IQ3_S: one scale per 32 weights, s in int32 lane s */
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
  }
  return k;
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
  const uint64_t bs = grid_bytes(type);
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
    const struct kvec k = grid_vec_avx2(type, bb);
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

ST_Q8_EACH_ROW(q8_rows_grid_avx2, q8_tile_grid_avx2_impl, AVX2)

AVX2 void q8_tile_grid_avx2(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                            int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_GRID_DISPATCH(ST_Q8_TILE_CASES, q8_rows_grid_avx2)
}

/* AVX-512 VNNI (dot_impl.h) */

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
  const struct kvec k = grid_vec_avx2(type, bb);
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
  const struct kvec k = grid_vec_avx2(type, bb);
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

/* The grid formats' `block` for ST_Q8_ROWS_K, for an ISA attribute `attr` and the grid preparations
 * it allows (the VNNI or VBMI iq3_planes / iq2_planes): super-block b (at bb) of one row into its nt
 * tokens' accumulators (n: the row length). */
#define ST_GRID_BLOCK(name, attr, planes3, planes2)                                                          \
  static inline __attribute__((always_inline))                                                               \
  attr void name(uint32_t type, const uint8_t *bb, int64_t b, const uint8_t *xq, int64_t ldq, int nt,        \
                 int64_t n, const __m512i *xoff, struct kacc *acc) {                                         \
    struct gridp p;                                                                                          \
    if (type == ST_TYPE_IQ3_XXS || type == ST_TYPE_IQ3_S)                                                    \
      planes3(type, bb, &p);                                                                                 \
    else                                                                                                     \
      planes2(type, bb, &p);                                                                                 \
    grid_tokens_vnni(type, &p, b, xq, ldq, nt, n, acc);                                                      \
  }

ST_GRID_BLOCK(grid_block_vnni, VNNI, iq3_planes_vnni, iq2_planes_vnni)
ST_Q8_ROWS_K(q8_rows_grid_vnni, VNNI, grid_block_vnni, grid_bytes)

VNNI void q8_tile_grid_vnni(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                            int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_GRID_DISPATCH(ST_Q8_TILE_CASES, q8_rows_grid_vnni)
}

/* AVX-512 VBMI on top: the four grids looked up with byte permutes (vpermi2b) over their byte
 * planes, 64 lookups at a time (on the Xeons, st_dot_grid_lookup: the IQ2 formats by gathers,
 * iq2_words_gather_vbmi, and the IQ3 formats by one-source vpermb pairs, grid_plane_vbmi), and
 * the IQ2_XS/IQ3_XXS sign bytes from one GF(2) affine map (GFNI, which every CPU with VBMI and
 * VNNI has). The same planes, signs and scales as the VNNI level, so the same results. (The VBMI
 * attribute: dot_impl.h.) */

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

ST_GRID_BLOCK(grid_block_vbmi, VBMI, iq3_planes_vbmi, iq2_planes_vbmi)
ST_Q8_ROWS_K(q8_rows_grid_vbmi, VBMI, grid_block_vbmi, grid_bytes)

VBMI void q8_tile_grid_vbmi(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                            int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_GRID_DISPATCH(ST_Q8_TILE_CASES, q8_rows_grid_vbmi)
}

ST_GRID_BLOCK(grid_block_vbmi_gather, VBMI, iq3_planes_pairs_vbmi, iq2_planes_gather_vbmi)
ST_Q8_ROWS_K(q8_rows_grid_vbmi_gather, VBMI, grid_block_vbmi_gather, grid_bytes)

/* The grid formats with st_dot_grid_lookup 1 ("gather": the IQ2 grids gathered, the IQ3 grids by
 * vpermb pairs); st_matmul_q8 sends no other format here */
VBMI void q8_tile_grid_vbmi_gather(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr,
                                   const uint8_t *xq, int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_ASSERT(k_is_grid(type));
  ST_GRID_DISPATCH(ST_Q8_TILE_CASES, q8_rows_grid_vbmi_gather)
}
