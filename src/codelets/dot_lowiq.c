/* st_matmul_q8's kernels for IQ2_XXS, IQ1_S and IQ1_M (issue #25): int8 activations in blocks of 32
 * (st_act_q8_0, with the row's quants and scales again contiguous after the blocks: lowiq_qs_at,
 * lowiq_d_at), each weight row decoded once per tile of up to ST_TILE tokens to exact int8 weights
 * (IQ2_XXS: grid magnitude times sign, -43..43; IQ1_S and IQ1_M: 8 (value + shift), the shift of
 * +-1/8 folded in as +-1, -9..9). Arithmetic, the same at every level: for 32-weight block k and
 * j = 0..7, P_kj is the exact int32 sum of weights 32 k + 4 j .. + 3 times the token's quants, and
 * float lane L = 8 (k mod 8) + j of 64 takes A_L = fmaf(f, (float)P_kj, A_L) block by block, f the
 * product of the block's scale (IQ1_M: the scale of its half j / 4) and the activation block's d;
 * at the end u_i = (A_i + A_16+i) + (A_32+i + A_48+i) (i < 16), v_j = u_j + u_8+j and the sum
 * ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) (hsum8_avx2); eight blocks' lanes, so that
 * the AVX-512 kernel's four accumulators a super-block are independent chains. So the scalar,
 * AVX2 and AVX-512 kernels give the same bits, and a (row, token) result does not depend on the
 * call's rows or tokens. The kernels differ in how they decode:
 * scalar and AVX2 a block at a time from tables (sign masks, the IQ1 grid as 8 (value + shift)
 * bytes, indexed by the shift's sign bit above the 11-bit grid index); the AVX-512 VBMI kernel
 * (levels 2 without VBMI take AVX2's) a super-block at a time, 64 weights a vector: IQ2_XXS's
 * grid in registers (vpermi2b over two byte planes of 2-bit level codes, then vpmultishiftqb and
 * vpermb to the levels) and its sign bytes by one two-table byte permute of the seven-bit fields;
 * the IQ1 entries (8 (value + shift) bytes, the same table) by scalar loads, their indices built
 * in vectors and stored for eight super-blocks before the first of their loads; then per token
 * vpdpbusd of |w| with the activations negated where w < 0 (P_kj for two blocks in one vector). */
#include <immintrin.h>
#include <pthread.h>
#include <string.h>

#include "codelets/dot_impl.h"
#include "codelets/quant.h"
#include "common.h"

/* Sign masks of the 128 seven-bit sign fields (bit 7 the parity, st_iq_signs): byte j 0xFF where
 * weight j is negative; the sign bytes themselves, for the VBMI kernel's permute; IQ1's grid
 * entries as 8 (value + shift) bytes, entry s << 11 | e for grid index e and shift -1 (s = 1) or
 * +1 (s = 0); IQ2_XXS's grid as byte planes for the VBMI kernel (iq2xxs_decode_vbmi). */
static uint64_t sign_mask[128];
static uint8_t sign_bytes[128] __attribute__((aligned(64)));
static uint64_t iq1_w[2 * 2048];
static uint8_t iq2xxs_planes[512] __attribute__((aligned(64)));
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void) {
  for (int f = 0; f < 128; f++) {
    const unsigned s = st_iq_signs((uint32_t)f);
    uint64_t m = 0;
    for (int j = 0; j < 8; j++)
      if (s >> j & 1) m |= (uint64_t)0xFF << (8 * j);
    sign_mask[f] = m;
    sign_bytes[f] = (uint8_t)s;
  }
  for (int e = 0; e < 256; e++)
    for (int j = 0; j < 8; j++) {
      const unsigned v = (unsigned)(st_iq2xxs_grid[e] >> (8 * j)) & 0xFF;
      ST_ASSERT(v == 8 || v == 25 || v == 43);
      iq2xxs_planes[256 * (j / 4) + e] |= (uint8_t)((v == 8 ? 0 : v == 25 ? 1 : 2) << (2 * (j % 4)));
    }
  for (int neg = 0; neg < 2; neg++)
    for (int e = 0; e < 2048; e++) {
      uint64_t w = 0;
      for (int j = 0; j < 8; j++) {
        const int v = 8 * (int8_t)(st_iq1s_grid[e] >> (8 * j)) + (neg ? -1 : 1);
        w |= (uint64_t)(uint8_t)(int8_t)v << (8 * j);
      }
      iq1_w[neg << 11 | e] = w;
    }
}

/* Bytes per super-block (256 weights). */
static inline uint64_t lowiq_bytes(uint32_t type) {
  return type == ST_TYPE_IQ2_XXS ? sizeof(st_block_iq2_xxs)
         : type == ST_TYPE_IQ1_S ? sizeof(st_block_iq1_s)
                                 : sizeof(st_block_iq1_m);
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
    for (int l = 0; l < 4; l++) g[l] = iq1_w[(qh >> 15 & 1) << 11 | b->qs[4 * ib + l] | ((qh >> (3 * l)) & 7) << 8];
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
      g[l] = iq1_w[(h & 15) << 8 | b->qs[4 * ib + l]];
    }
  }
}

/* A token's contiguous quants and block scales in its activation row. */
static inline const int8_t *act_qs(const uint8_t *xq, int64_t ldq, int t, int64_t n) {
  return (const int8_t *)(const void *)(xq + t * ldq + lowiq_qs_at(n));
}
static inline const float *act_d(const uint8_t *xq, int64_t ldq, int t, int64_t n) {
  return (const float *)(const void *)(xq + t * ldq + lowiq_d_at(n));
}

/* scalar */
static inline __attribute__((always_inline)) void lowiq_row_scalar(uint32_t type, const uint8_t *row,
                                                                   const uint8_t *xq, int64_t ldq, const int nt,
                                                                   int64_t n, float *out, int64_t ldo) {
  float acc[ST_TILE][64];
  memset(acc, 0, sizeof acc);
  uint64_t g[4];
  float sc[2];
  for (int64_t k = 0; k < n / 32; k++) {
    decode_block(type, row, k, g, sc);
    int8_t w[32];
    memcpy(w, g, 32);
    for (int t = 0; t < nt; t++) {
      const int8_t *x = act_qs(xq, ldq, t, n) + 32 * k;
      const float dx = act_d(xq, ldq, t, n)[k], f0 = sc[0] * dx, f1 = sc[1] * dx;
      float *A = acc[t] + 8 * (k % 8);
      for (int j = 0; j < 8; j++) {
        int32_t p = 0;
        for (int i = 4 * j; i < 4 * j + 4; i++) p += w[i] * x[i];
        A[j] = fmaf(j < 4 ? f0 : f1, (float)p, A[j]);
      }
    }
  }
  for (int t = 0; t < nt; t++) {
    const float *A = acc[t];
    float u[16], v[8];
    for (int i = 0; i < 16; i++) u[i] = (A[i] + A[16 + i]) + (A[32 + i] + A[48 + i]);
    for (int j = 0; j < 8; j++) v[j] = u[j] + u[8 + j];
    out[t * ldo] = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
  }
}

/* AVX2: a block a time, P_kj in int32 lane j (vpmaddubsw + vpmaddwd), eight accumulators (k mod 8). */
static inline __attribute__((always_inline)) AVX2 void lowiq_row_avx2(uint32_t type, const uint8_t *row,
                                                                      const uint8_t *xq, int64_t ldq, const int nt,
                                                                      int64_t n, float *out, int64_t ldo) {
  __m256 acc[ST_TILE][8];
  for (int t = 0; t < nt; t++)
    for (int e = 0; e < 8; e++) acc[t][e] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const uint64_t bs = lowiq_bytes(type);
  uint64_t g[4];
  float sc[2];
  for (int64_t k0 = 0; k0 < n / 32; k0 += 8) {
    prefetch_ahead(row + k0 / 8 * bs, bs);
#pragma GCC unroll 8
    for (int e = 0; e < 8; e++) {
      const int64_t k = k0 + e;
      decode_block(type, row, k, g, sc);
      /* built from the words in registers: a 32-byte load of four 8-byte stores would stall */
      const __m256i wv = _mm256_set_epi64x((long long)g[3], (long long)g[2], (long long)g[1], (long long)g[0]);
      const __m256i aw = _mm256_sign_epi8(wv, wv);
      for (int t = 0; t < nt; t++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(act_qs(xq, ldq, t, n) + 32 * k));
        const float dx = act_d(xq, ldq, t, n)[k];
        /* |w| times x with w's sign: products of at most 43 * 127, pairs well inside int16 */
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), ones);
        const __m256 f = _mm256_set_m128(_mm_set1_ps(sc[1] * dx), _mm_set1_ps(sc[0] * dx));
        acc[t][e] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), f, acc[t][e]);
      }
    }
  }
  for (int t = 0; t < nt; t++) {
    const __m256 *a = acc[t];
    out[t * ldo] = hsum8_avx2(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[4], a[6])),
                                            _mm256_add_ps(_mm256_add_ps(a[1], a[3]), _mm256_add_ps(a[5], a[7]))));
  }
}

/* AVX-512 VBMI: super-block b of a row as four vectors of |w| (64 weights, blocks 2c and 2c + 1
 * in vector c), the masks of the negative weights, and the 16 float scales (lane 2 k + h: block
 * k's half h). */
struct lowiq_sb {
  __m512i m[4];
  __mmask64 neg[4];
  __m512 s16;
};

/* IQ2_XXS's grid looked up in registers (as dot_grid.c's IQ2 planes): byte plane h (h = 0, 1) of
 * entry e holds the 2-bit codes (8, 25, 43 -> 0, 1, 2) of its magnitudes 4 h .. 4 h + 3, so the
 * two planes are eight registers; at[2 (4 o + c) + h] is the block byte of the index of entry
 * 8 c + o (block 2 c + o / 4, group o % 4), so that qword o of the looked-up words holds the
 * entries of qword o of all four vectors c, one per 16 bits. */
static const uint8_t iq2xxs_at[64] __attribute__((aligned(64))) = {
    0,  0,  16, 16, 32, 32, 48, 48, 1,  1,  17, 17, 33, 33, 49, 49, 2,  2,  18, 18, 34, 34,
    50, 50, 3,  3,  19, 19, 35, 35, 51, 51, 8,  8,  24, 24, 40, 40, 56, 56, 9,  9,  25, 25,
    41, 41, 57, 57, 10, 10, 26, 26, 42, 42, 58, 58, 11, 11, 27, 27, 43, 43, 59, 59};

static inline __attribute__((always_inline)) VBMI void iq2xxs_decode_vbmi(const uint8_t *bb, struct lowiq_sb *s) {
  const uint8_t *q = bb + 2; /* qword k: block k's four index bytes, then its sign and scale word */
  uint16_t dh;
  memcpy(&dh, bb, 2);
  const __m512i qv = _mm512_loadu_si512((const void *)q);
  const __m512i idx = _mm512_permutexvar_epi8(_mm512_load_si512((const void *)iq2xxs_at), qv);
  const __m512i *t = (const __m512i *)(const void *)iq2xxs_planes;
  const __mmask64 h7 = _mm512_movepi8_mask(idx);
  const __m512i lo = _mm512_mask_blend_epi8(h7, _mm512_permutex2var_epi8(t[0], idx, t[1]),
                                            _mm512_permutex2var_epi8(t[2], idx, t[3])),
                hi = _mm512_mask_blend_epi8(h7, _mm512_permutex2var_epi8(t[4], idx, t[5]),
                                            _mm512_permutex2var_epi8(t[6], idx, t[7]));
  const __m512i words = _mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAAull, lo, hi);
  /* byte j of vector c: code j of the word at bit 16 c, to its level by vpermb of a table that
   * repeats 8, 25, 43 every four bytes (only a byte's low two bits count) */
  const __m512i lut = _mm512_set1_epi32(0x002B1908);
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++)
    s->m[c] = _mm512_permutexvar_epi8(
        _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x0E0C0A0806040200ll + 0x1010101010101010ll * c), words), lut);
  /* byte l of qword k: field l (bits 32 + 7 l ..), moved to byte 4 k + l (k < 8, l < 4), then its
   * sign byte (the permute reads 7 index bits) */
  const __m512i compact = _mm512_setr_epi32(0x03020100, 0x0B0A0908, 0x13121110, 0x1B1A1918, 0x23222120, 0x2B2A2928,
                                            0x33323130, 0x3B3A3938, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i f = _mm512_permutexvar_epi8(compact, _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x352E2720), qv));
  const __m512i sg = _mm512_permutex2var_epi8(_mm512_load_si512((const void *)sign_bytes), f,
                                              _mm512_load_si512((const void *)(sign_bytes + 64)));
  uint64_t sw[4];
  _mm256_storeu_si256((__m256i *)(void *)sw, _mm512_castsi512_si256(sg));
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++) s->neg[c] = (__mmask64)sw[c];
  const __m512i sci = _mm512_shuffle_epi32(_mm512_srli_epi64(qv, 60), _MM_PERM_CCAA); /* lane 2 k + h: block k's */
  s->s16 = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(dh)),
                                       _mm512_add_ps(_mm512_set1_ps(0.5f), _mm512_cvtepi32_ps(sci))),
                         _mm512_set1_ps(0.25f));
}

/* Word tables of the IQ1 indices: the index word of group i takes qh word i / 4 (IQ1_S) or qh
 * byte i / 2 (IQ1_M). */
static const uint16_t by4[32] __attribute__((aligned(64))) = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                                              4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7};
static const uint16_t by2[32] __attribute__((aligned(64))) = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7,
                                                              8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15};

/* An IQ1 super-block's first half, done a chunk of super-blocks ahead of the second: ix[i] group
 * i's entry of iq1_w (the 11-bit grid index, the shift's sign bit above it) and the 16 float
 * scales. */
struct iq1_ix {
  uint16_t ix[32];
  __m512 s16;
};

static inline __attribute__((always_inline)) VBMI void iq1_index_vbmi(uint32_t type, const uint8_t *bb,
                                                                      struct iq1_ix *p) {
  const uint8_t *qs;
  __m512i hi;  /* word i: group i's three high index bits, then its shift's sign bit (and bits above) */
  __m512i sci; /* int32 lane 2 k + h: the integer scale of block k's half h */
  float d;
  if (type == ST_TYPE_IQ1_S) {
    const st_block_iq1_s *b = (const st_block_iq1_s *)(const void *)bb;
    qs = b->qs;
    d = _cvtsh_ss(b->d);
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)b->qh);
    const __m512i q4 = _mm512_permutexvar_epi16(_mm512_load_si512((const void *)by4), _mm512_castsi128_si512(h));
    /* bits 0..2: qh[i / 4] >> 3 (i % 4); bit 3 (and up): qh[i / 4] >> 12, bit 15 on bit 3 */
    hi = _mm512_ternarylogic_epi32(_mm512_set1_epi16(7), _mm512_srlv_epi16(q4, _mm512_set1_epi64(0x0009000600030000ll)),
                                   _mm512_srli_epi16(q4, 12), 0xCA); /* a ? b : c, bitwise */
    /* block k's scale s: bits 12..14 of qh[k] */
    const __m256i s8 = _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu16_epi32(h), 12), _mm256_set1_epi32(7));
    sci = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                   _mm512_castsi256_si512(s8));
  } else {
    const st_block_iq1_m *b = (const st_block_iq1_m *)(const void *)bb;
    qs = b->qs;
    uint16_t s4[4];
    memcpy(s4, b->scales, 8);
    d = _cvtsh_ss((uint16_t)((s4[0] >> 12) | ((s4[1] >> 8) & 0x00F0) | ((s4[2] >> 4) & 0x0F00) | (s4[3] & 0xF000)));
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)b->qh);
    hi = _mm512_srlv_epi16(
        _mm512_permutexvar_epi16(_mm512_load_si512((const void *)by2), _mm512_castsi256_si512(_mm256_cvtepu8_epi16(h))),
        _mm512_set1_epi32(0x00040000)); /* qh[i / 2] >> 4 (i % 2): the high bits, then the shift's sign */
    /* lane L = 2 k + h: (word k / 2 of scales >> 6 (k % 2) + 3 h) & 7, i.e. word L / 4 >> 3 (L % 4) */
    const __m512i w4 = _mm512_castsi128_si512(_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(const void *)b->scales)));
    sci = _mm512_and_si512(
        _mm512_srlv_epi32(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), w4),
                          _mm512_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9)),
        _mm512_set1_epi32(7));
  }
  _mm512_storeu_si512((void *)p->ix,
                      _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)qs)),
                                      _mm512_slli_epi16(_mm512_and_si512(hi, _mm512_set1_epi16(15)), 8)));
  p->s16 = _mm512_mul_ps(
      _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(sci, 1), _mm512_set1_epi32(1)))),
      _mm512_set1_ps(0.125f));
}

/* The second half: the 32 entries of iq1_w by scalar loads (faster than vpgatherqq, or than
 * vpgatherdd of 32-bit entries, on Zen 4), eight to a vector in weight order, as |w| and the
 * masks of w < 0. */
static inline __attribute__((always_inline)) VBMI void iq1_grid_vbmi(const struct iq1_ix *p, struct lowiq_sb *s) {
  s->s16 = p->s16;
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++) {
    const uint16_t *ix = p->ix + 8 * c;
    const __m512i w = _mm512_set_epi64((long long)iq1_w[ix[7]], (long long)iq1_w[ix[6]], (long long)iq1_w[ix[5]],
                                       (long long)iq1_w[ix[4]], (long long)iq1_w[ix[3]], (long long)iq1_w[ix[2]],
                                       (long long)iq1_w[ix[1]], (long long)iq1_w[ix[0]]);
    s->m[c] = _mm512_abs_epi8(w);
    s->neg[c] = _mm512_movepi8_mask(w);
  }
}

/* IQ1 indices this many super-blocks ahead */
#define IQ1_AHEAD 8

static inline __attribute__((always_inline)) VBMI void lowiq_row_vbmi(uint32_t type, const uint8_t *row,
                                                                      const uint8_t *xq, int64_t ldq, const int nt,
                                                                      int64_t n, float *out, int64_t ldo) {
  __m512 acc[ST_TILE][4]; /* vector c: lanes 16 c .. 16 c + 15 */
  for (int t = 0; t < nt; t++)
    for (int c = 0; c < 4; c++) acc[t][c] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  /* d of block k to lanes 2 k, 2 k + 1; f of lane 2 k + h to the lanes of vector c's P_kj */
  const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const uint64_t bs = lowiq_bytes(type);
  struct iq1_ix ix[IQ1_AHEAD];
  for (int64_t b = 0; b < n / 256; b++) {
    const uint8_t *bb = row + b * bs;
    struct lowiq_sb s;
    if (type == ST_TYPE_IQ2_XXS) {
      prefetch_ahead(bb, bs);
      iq2xxs_decode_vbmi(bb, &s);
    } else {
      /* the indices in memory well before their loads: the OoO window does not reach across the
       * long chain of one super-block's index vector, store, loads and inserts */
      if (b % IQ1_AHEAD == 0) {
        for (int64_t e = b; e < b + IQ1_AHEAD && e < n / 256; e++) iq1_index_vbmi(type, row + e * bs, &ix[e - b]);
        __asm__("" : "+m"(ix)); /* read back by scalar loads, not word extracts (two uops each) */
      }
      prefetch_ahead(bb, bs);
      iq1_grid_vbmi(&ix[b % IQ1_AHEAD], &s);
    }
    for (int t = 0; t < nt; t++) {
      const int8_t *x = act_qs(xq, ldq, t, n) + 256 * b;
      const __m512 f = _mm512_mul_ps(
          s.s16, _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(act_d(xq, ldq, t, n) + 8 * b))));
#pragma GCC unroll 4
      for (int c = 0; c < 4; c++) {
        const __m512i xv = _mm512_loadu_si512((const void *)(x + 64 * c));
        const __m512i p = _mm512_dpbusd_epi32(zero, s.m[c], _mm512_mask_sub_epi8(xv, s.neg[c], zero, xv));
        acc[t][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                                    _mm512_permutexvar_ps(_mm512_add_epi32(spread, _mm512_set1_epi32(4 * c)), f), acc[t][c]);
      }
    }
  }
  for (int t = 0; t < nt; t++) {
    const __m512 u = _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]), _mm512_add_ps(acc[t][2], acc[t][3]));
    out[t * ldo] = hsum8_avx2(
        _mm256_add_ps(_mm512_castps512_ps256(u), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1))));
  }
}

/* The rows of a group, one at a time, and the per-type, per-tile-width instances
 * (ST_Q8_TILE_CASES: nt constant in each). */
#define LOWIQ_ROWS(name, attr, row_fn)                                                                      \
  static inline __attribute__((always_inline)) attr void name(uint32_t type, const void *w, uint64_t row_bytes, \
                                                             int64_t nr, const uint8_t *xq, int64_t ldq,     \
                                                             const int nt, int64_t n, float *out, int64_t ldo) { \
    for (int64_t r = 0; r < nr; r++)                                                                        \
      row_fn(type, (const uint8_t *)w + (uint64_t)r * row_bytes, xq, ldq, nt, n, out + r, ldo);             \
  }
LOWIQ_ROWS(lowiq_rows_scalar, , lowiq_row_scalar)
LOWIQ_ROWS(lowiq_rows_avx2, AVX2, lowiq_row_avx2)
LOWIQ_ROWS(lowiq_rows_vbmi, VBMI, lowiq_row_vbmi)

#define LOWIQ_TILE(name, attr, body)                                                                         \
  static attr void name(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,     \
                        int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {                          \
    switch (type) {                                                                                         \
    case ST_TYPE_IQ2_XXS: ST_Q8_TILE_CASES(body, ST_TYPE_IQ2_XXS) break;                                     \
    case ST_TYPE_IQ1_S: ST_Q8_TILE_CASES(body, ST_TYPE_IQ1_S) break;                                         \
    default: ST_Q8_TILE_CASES(body, ST_TYPE_IQ1_M) break;                                                    \
    }                                                                                                       \
  }
LOWIQ_TILE(lowiq_tile_scalar, , lowiq_rows_scalar)
LOWIQ_TILE(lowiq_tile_avx2, AVX2, lowiq_rows_avx2)
LOWIQ_TILE(lowiq_tile_vbmi, VBMI, lowiq_rows_vbmi)

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

void q8_tile_lowiq_vbmi(uint32_t type, const void *W, uint64_t row_bytes, int64_t nr, const uint8_t *xq, int64_t ldq,
                        int nt, int64_t n, float *out, int64_t ldo) {
  pthread_once(&tables_once, tables_init);
  lowiq_tile_vbmi(type, W, row_bytes, nr, xq, ldq, nt, n, out, ldo);
}
