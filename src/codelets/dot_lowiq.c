/* st_matmul_q8's kernels for IQ2_XXS, IQ1_S and IQ1_M (issue #25): q8_0 activations (blocks of 32),
 * each 32-weight block of a row decoded once to 32 exact int8 weights (IQ2_XXS: grid magnitude
 * times sign, -43..43; IQ1_S and IQ1_M: 8 (value + shift), the shift of +-1/8 folded in as +-1,
 * -9..9), an exact int32 dot product with each token's quants, and a float multiply and add per
 * block, token and lane (eight lanes, below), the lanes added once per row and token by a fixed
 * tree. The float operations are the same at every level and the integer sums are exact, so the
 * scalar and AVX2 kernels (AVX2 also at the AVX-512 levels) give the same bits; a (row, token)
 * result does not depend on the call's rows or tokens. */
#include <immintrin.h>
#include <pthread.h>
#include <string.h>

#include "codelets/dot_impl.h"
#include "codelets/quant.h"
#include "common.h"

/* Sign masks of the 128 seven-bit sign fields (bit 7 the parity, st_iq_signs): byte j 0xFF where
 * weight j is negative; and IQ1's grid entries as 8 (value + shift) bytes for either shift. */
static uint64_t sign_mask[128];
static uint64_t iq1_w[2][2048];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void) {
  for (int f = 0; f < 128; f++) {
    const unsigned s = st_iq_signs((uint32_t)f);
    uint64_t m = 0;
    for (int j = 0; j < 8; j++)
      if (s >> j & 1) m |= (uint64_t)0xFF << (8 * j);
    sign_mask[f] = m;
  }
  for (int neg = 0; neg < 2; neg++)
    for (int e = 0; e < 2048; e++) {
      uint64_t w = 0;
      for (int j = 0; j < 8; j++) {
        const int v = 8 * (int8_t)(st_iq1s_grid[e] >> (8 * j)) + (neg ? -1 : 1);
        w |= (uint64_t)(uint8_t)(int8_t)v << (8 * j);
      }
      iq1_w[neg][e] = w;
    }
}

/* Block k (32 weights) of a row: its int8 weights, 8 to a word, into g[4] and one or two float
 * scales (two for IQ1_M: the halves'; sc[1] = sc[0] otherwise). */
static inline __attribute__((always_inline)) void decode_block(uint32_t type, const uint8_t *row, int64_t k, uint64_t *g,
                                                              float *sc) {
  const int ib = (int)(k % 8);
  if (type == ST_TYPE_IQ2_XXS) {
    const uint8_t *b = row + (k / 8) * sizeof(st_block_iq2_xxs), *q = b + 2 + 8 * ib;
    uint16_t dh;
    memcpy(&dh, b, 2);
    const uint32_t aux = (uint32_t)q[4] | (uint32_t)q[5] << 8 | (uint32_t)q[6] << 16 | (uint32_t)q[7] << 24;
    sc[0] = sc[1] = st_fp16_to_f32(dh) * (0.5f + (float)(aux >> 28)) * 0.25f;
#pragma GCC unroll 4
    for (int l = 0; l < 4; l++) { /* magnitudes <= 43: the bytewise negation never carries */
      const uint64_t m = sign_mask[(aux >> (7 * l)) & 127];
      g[l] = (st_iq2xxs_grid[q[l]] ^ m) + (m & 0x0101010101010101ull);
    }
  } else if (type == ST_TYPE_IQ1_S) {
    const st_block_iq1_s *b = (const st_block_iq1_s *)(const void *)(row + (k / 8) * sizeof(st_block_iq1_s));
    const unsigned qh = b->qh[ib];
    sc[0] = sc[1] = st_fp16_to_f32(b->d) * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
#pragma GCC unroll 4
    for (int l = 0; l < 4; l++) g[l] = iq1_w[qh >> 15 & 1][b->qs[4 * ib + l] | ((qh >> (3 * l)) & 7) << 8];
  } else { /* IQ1_M */
    const st_block_iq1_m *b = (const st_block_iq1_m *)(const void *)(row + (k / 8) * sizeof(st_block_iq1_m));
    uint16_t s4[4];
    memcpy(s4, b->scales, 8);
    const float d = st_fp16_to_f32((uint16_t)((s4[0] >> 12) | ((s4[1] >> 8) & 0x00F0) | ((s4[2] >> 4) & 0x0F00) | (s4[3] & 0xF000)));
    const unsigned s = s4[ib / 2];
    sc[0] = d * (float)(2 * ((s >> (6 * (ib % 2))) & 7) + 1) * 0.125f;
    sc[1] = d * (float)(2 * ((s >> (6 * (ib % 2) + 3)) & 7) + 1) * 0.125f;
#pragma GCC unroll 4
    for (int l = 0; l < 4; l++) {
      const unsigned h = b->qh[2 * ib + l / 2] >> (4 * (l % 2));
      g[l] = iq1_w[h >> 3 & 1][b->qs[4 * ib + l] | (h & 7) << 8];
    }
  }
}

/* The arithmetic every level shares, for one (row, token): eight float lanes A[j], lane j taking
 * block by block f * (float)P_j, where P_j is the exact integer sum of weights 4j .. 4j + 3 times
 * the token's quants and f = scale * dx (the first half's scale for lanes 0..3, the second's for
 * 4..7); at the end ((A0 + A1) + (A2 + A3)) + ((A4 + A5) + (A6 + A7)). The AVX2 kernel keeps the
 * lanes in one register (vpmaddubsw + vpmaddwd give P_j in lane j). */
#define LOWIQ_CHUNK 16 /* blocks of a chunk: the tokens' activations stay in L1 while every row passes */

static inline __attribute__((always_inline)) void lowiq_body_scalar(uint32_t type, const void *W, uint64_t row_bytes,
                                                                    int64_t nr, const uint8_t *xq, int64_t ldq,
                                                                    const int nt, int64_t n, float *out, int64_t ldo) {
  float acc[64][ST_TILE][8];
  ST_ASSERT(nr <= 64);
  memset(acc, 0, sizeof acc);
  uint64_t g[4];
  float sc[2];
  for (int64_t k0 = 0; k0 < n / 32; k0 += LOWIQ_CHUNK) {
    const int64_t k1 = k0 + LOWIQ_CHUNK < n / 32 ? k0 + LOWIQ_CHUNK : n / 32;
    for (int64_t r = 0; r < nr; r++) {
      const uint8_t *row = (const uint8_t *)W + (uint64_t)r * row_bytes;
      for (int64_t k = k0; k < k1; k++) {
        decode_block(type, row, k, g, sc);
        int8_t w[32];
        memcpy(w, g, 32);
        for (int t = 0; t < nt; t++) {
          const st_act_q8_0 *x = (const st_act_q8_0 *)(const void *)(xq + t * ldq) + k;
          const float f0 = sc[0] * x->d, f1 = sc[1] * x->d;
          for (int j = 0; j < 8; j++) {
            int32_t p = 0;
            for (int i = 4 * j; i < 4 * j + 4; i++) p += w[i] * x->qs[i];
            acc[r][t][j] = acc[r][t][j] + (j < 4 ? f0 : f1) * (float)p;
          }
        }
      }
    }
  }
  for (int64_t r = 0; r < nr; r++)
    for (int t = 0; t < nt; t++) {
      const float *A = acc[r][t];
      out[t * ldo + r] = ((A[0] + A[1]) + (A[2] + A[3])) + ((A[4] + A[5]) + (A[6] + A[7]));
    }
}

static inline __attribute__((always_inline)) AVX2 void lowiq_body_avx2(uint32_t type, const void *W, uint64_t row_bytes,
                                                                       int64_t nr, const uint8_t *xq, int64_t ldq,
                                                                       const int nt, int64_t n, float *out, int64_t ldo) {
  __m256 acc[64][ST_TILE];
  ST_ASSERT(nr <= 64);
  for (int64_t r = 0; r < nr; r++)
    for (int t = 0; t < nt; t++) acc[r][t] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  uint64_t g[4];
  float sc[2];
  for (int64_t k0 = 0; k0 < n / 32; k0 += LOWIQ_CHUNK) {
    const int64_t k1 = k0 + LOWIQ_CHUNK < n / 32 ? k0 + LOWIQ_CHUNK : n / 32;
    for (int64_t r = 0; r < nr; r++) {
      const uint8_t *row = (const uint8_t *)W + (uint64_t)r * row_bytes;
      __m256 a[ST_TILE];
      for (int t = 0; t < nt; t++) a[t] = acc[r][t];
      for (int64_t k = k0; k < k1; k++) {
        decode_block(type, row, k, g, sc);
        /* built from the words in registers: a 32-byte load of four 8-byte stores would stall */
        const __m256i wv = _mm256_set_epi64x((long long)g[3], (long long)g[2], (long long)g[1], (long long)g[0]);
        const __m256i aw = _mm256_sign_epi8(wv, wv);
        for (int t = 0; t < nt; t++) {
          const st_act_q8_0 *x = (const st_act_q8_0 *)(const void *)(xq + t * ldq) + k;
          const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)x->qs);
          /* |w| times x with w's sign: products of at most 43 * 127, pairs well inside int16 */
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), ones);
          const __m256 f = _mm256_set_m128(_mm_set1_ps(sc[1] * x->d), _mm_set1_ps(sc[0] * x->d));
          a[t] = _mm256_add_ps(a[t], _mm256_mul_ps(f, _mm256_cvtepi32_ps(p)));
        }
      }
      for (int t = 0; t < nt; t++) acc[r][t] = a[t];
    }
  }
  for (int64_t r = 0; r < nr; r++)
    for (int t = 0; t < nt; t++) {
      const __m128 h = _mm_hadd_ps(_mm256_castps256_ps128(acc[r][t]), _mm256_extractf128_ps(acc[r][t], 1));
      const __m128 q = _mm_hadd_ps(h, h); /* (A0 + A1) + (A2 + A3), (A4 + A5) + (A6 + A7) */
      out[t * ldo + r] = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
    }
}

/* The per-type, per-tile-width instances of a body (ST_Q8_TILE_CASES: nt constant in each). */
#define LOWIQ_TILE(name, attr, body)                                                                         \
  static attr void name(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,     \
                        int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {                          \
    switch (type) {                                                                                         \
    case ST_TYPE_IQ2_XXS: ST_Q8_TILE_CASES(body, ST_TYPE_IQ2_XXS) break;                                     \
    case ST_TYPE_IQ1_S: ST_Q8_TILE_CASES(body, ST_TYPE_IQ1_S) break;                                         \
    default: ST_Q8_TILE_CASES(body, ST_TYPE_IQ1_M) break;                                                    \
    }                                                                                                       \
  }
LOWIQ_TILE(lowiq_tile_scalar, , lowiq_body_scalar)
LOWIQ_TILE(lowiq_tile_avx2, AVX2, lowiq_body_avx2)

void q8_tile_lowiq_scalar(uint32_t type, const void *W, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq,
                          int nt, int64_t n, float *out, int64_t ldo) {
  pthread_once(&tables_once, tables_init);
  lowiq_tile_scalar(type, W, row_bytes, nr, xq, ldq, nt, n, out, ldo);
}

void q8_tile_lowiq_avx2(uint32_t type, const void *W, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq,
                        int nt, int64_t n, float *out, int64_t ldo) {
  pthread_once(&tables_once, tables_init);
  lowiq_tile_avx2(type, W, row_bytes, nr, xq, ldq, nt, n, out, ldo);
}
