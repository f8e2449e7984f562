/* st_matmul_q8's kernels for IQ2_XXS, IQ1_S and IQ1_M (issue #25): q8_0 activations (blocks of 32),
 * each 32-weight block of a row decoded once to 32 exact int8 weights (IQ2_XXS: grid magnitude
 * times sign, -43..43; IQ1_S and IQ1_M: 8 (value + shift), the shift of +-1/8 folded in as +-1,
 * -9..9), an exact int32 dot product with each token's quants, and one float multiply-add per
 * block and token: acc += (scale * dx) * isum, blocks in row order (IQ1_M: its two 16-weight halves
 * in order, each with its own scale). The float part is the same C at every level and the integer
 * sums are exact, so the scalar and AVX2 kernels (AVX2 also at the AVX-512 levels) give the same
 * bits; a (row, token) result does not depend on the call's rows or tokens. */
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

/* The integer dot products of the two 16-weight halves of w and x. */
static inline void dot_scalar(const uint64_t *g, const int8_t *x, int32_t *s0, int32_t *s1) {
  int8_t w[32];
  memcpy(w, g, 32);
  int32_t a = 0, b = 0;
  for (int i = 0; i < 16; i++) a += w[i] * x[i];
  for (int i = 16; i < 32; i++) b += w[i] * x[i];
  *s0 = a, *s1 = b;
}

static inline AVX2 void dot_avx2(const uint64_t *g, const int8_t *x, int32_t *s0, int32_t *s1) {
  /* built from the words in registers: a 32-byte load of four 8-byte stores would stall */
  const __m256i wv = _mm256_set_epi64x((long long)g[3], (long long)g[2], (long long)g[1], (long long)g[0]);
  const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)x);
  /* |w| times x with w's sign: products of at most 43 * 127, pairs well inside int16 */
  const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
  const __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
  const __m128i lo = _mm256_castsi256_si128(p32), hi = _mm256_extracti128_si256(p32, 1);
  __m128i a = _mm_add_epi32(lo, _mm_shuffle_epi32(lo, 0x4E)), b = _mm_add_epi32(hi, _mm_shuffle_epi32(hi, 0x4E));
  a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0xB1)), b = _mm_add_epi32(b, _mm_shuffle_epi32(b, 0xB1));
  *s0 = _mm_cvtsi128_si32(a), *s1 = _mm_cvtsi128_si32(b);
}

/* nr rows (row_bytes apart) times nt tokens of q8_0 quants (ldq bytes apart); `body` is
 * specialised on the type and on nt (1..ST_TILE) so that the accumulators stay in registers. */
#define LOWIQ_BODY(name, attr, dot)                                                                          \
  static inline __attribute__((always_inline)) attr void name(uint32_t type, const void *W, uint64_t row_bytes, \
                                                             int64_t nr, const uint8_t *xq, int64_t ldq,       \
                                                             const int nt, int64_t n, float *out, int64_t ldo) { \
    uint64_t w[4];                                                                                          \
    float sc[2], acc[64][ST_TILE];                                                                          \
    ST_ASSERT(nr <= 64);                                                                                    \
    for (int64_t r = 0; r < nr; r++)                                                                        \
      for (int t = 0; t < nt; t++) acc[r][t] = 0.0f;                                                        \
    /* chunks of 16 blocks: the tokens' 16 activation blocks stay in L1 while every row passes */         \
    for (int64_t k0 = 0; k0 < n / 32; k0 += 16) {                                                           \
      const int64_t k1 = k0 + 16 < n / 32 ? k0 + 16 : n / 32;                                               \
      for (int64_t r = 0; r < nr; r++) {                                                                    \
        const uint8_t *row = (const uint8_t *)W + (uint64_t)r * row_bytes;                                  \
        float a[ST_TILE];                                                                                   \
        for (int t = 0; t < nt; t++) a[t] = acc[r][t];                                                      \
        for (int64_t k = k0; k < k1; k++) {                                                                 \
          decode_block(type, row, k, w, sc);                                                                \
          for (int t = 0; t < nt; t++) {                                                                    \
            const st_act_q8_0 *x = (const st_act_q8_0 *)(const void *)(xq + t * ldq) + k;                    \
            int32_t s0, s1;                                                                                 \
            dot(w, x->qs, &s0, &s1);                                                                        \
            if (type == ST_TYPE_IQ1_M) {                                                                    \
              a[t] = a[t] + sc[0] * x->d * (float)s0;                                                       \
              a[t] = a[t] + sc[1] * x->d * (float)s1;                                                       \
            } else {                                                                                        \
              a[t] = a[t] + sc[0] * x->d * (float)(s0 + s1);                                                \
            }                                                                                               \
          }                                                                                                 \
        }                                                                                                   \
        for (int t = 0; t < nt; t++) acc[r][t] = a[t];                                                      \
      }                                                                                                     \
    }                                                                                                       \
    for (int64_t r = 0; r < nr; r++)                                                                        \
      for (int t = 0; t < nt; t++) out[t * ldo + r] = acc[r][t];                                            \
  }
LOWIQ_BODY(lowiq_body_scalar, , dot_scalar)
LOWIQ_BODY(lowiq_body_avx2, AVX2, dot_avx2)

/* The per-type, per-tile-width instances of a body. */
#define LOWIQ_NT(body, ty)                                                                                   \
  switch (nt) {                                                                                             \
  case 1: body(ty, W, row_bytes, nr, xq, ldq, 1, n, out, ldo); break;                                       \
  case 2: body(ty, W, row_bytes, nr, xq, ldq, 2, n, out, ldo); break;                                       \
  case 3: body(ty, W, row_bytes, nr, xq, ldq, 3, n, out, ldo); break;                                       \
  default: body(ty, W, row_bytes, nr, xq, ldq, 4, n, out, ldo); break;                                      \
  }
#define LOWIQ_TILE(name, attr, body)                                                                         \
  static attr void name(uint32_t type, const void *W, uint64_t row_bytes, int64_t nr, const uint8_t *xq,     \
                        int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {                          \
    switch (type) {                                                                                         \
    case ST_TYPE_IQ2_XXS: LOWIQ_NT(body, ST_TYPE_IQ2_XXS) break;                                             \
    case ST_TYPE_IQ1_S: LOWIQ_NT(body, ST_TYPE_IQ1_S) break;                                                 \
    default: LOWIQ_NT(body, ST_TYPE_IQ1_M) break;                                                            \
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
