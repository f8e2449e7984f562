/* st_matmul_q8's kernels for Q8_0 weights (issue #22): int8 activations in blocks of 32
 * (st_act_q8_0), the weights' quants multiplied in integer arithmetic.
 *
 * Arithmetic, the same at every level: for block b of a row, I_b is the exact int32 sum of its 32
 * quants times the token's 32 quants, s_b the float product of the block's fp16 scale (widened
 * exactly) and the activation block's d; A_e after A_e = fmaf((float)I_b, s_b, A_e) for the even
 * b = 0, 2, ... in order from A_e = 0, A_o the same over the odd blocks, and the result A_e + A_o
 * (|I_b| < 2^24, so (float)I_b is exact; two chains, so that one row's fused multiply-adds are not
 * one chain of n / 32 latencies). A (row, token) result thus
 * depends on neither the call's rows nor its tokens, and the scalar, AVX2 and AVX-512 kernels give
 * the same bits (tests/test_quant).
 *
 * The AVX-512 VNNI kernel works on 16 rows at a time, one row per 32-bit lane: a block's 16 rows
 * are transposed (dword k of each row's quants into vector k, plus 128 to make them unsigned bytes
 * for vpdpbusd, and the 16 scales into one vector), into registers for a call of up to 8 tokens or
 * once into a per-thread buffer for more; then each token's block takes 8 vpdpbusd with its
 * activation quants broadcast from memory, the accumulator started at -128 times the sum of those
 * quants (the offset's product taken back out, exact), and one conversion, one multiply and one
 * fused multiply-add for all 16 rows, in tiles of up to 8 tokens. A row-major kernel (64 quants of
 * one row a vector) spends the same float work on every 64 weights of every row, and must sum 8
 * lanes per block. The interleaved rows are what ik_llama.cpp repacks its _R8 types to at load;
 * here they are built from the file's own rows as they are read, so nothing is repacked. */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codelets/dot_impl.h"
#include "codelets/quant.h"
#include "common.h"

/* ---- scalar: the definition ----------------------------------------------------------------- */

void q8_tile_q80_scalar(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                        int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  (void)type;
  for (int64_t r = 0; r < nr; r++)
    for (int t = 0; t < nt; t++) {
      const st_block_q8_0 *wb =
          (const st_block_q8_0 *)(const void *)((const uint8_t *)w + (uint64_t)r * row_bytes);
      const st_act_q8_0 *x = (const st_act_q8_0 *)(const void *)(xq + t * ldq);
      float a[2] = {0.0f, 0.0f}; /* even and odd blocks */
      for (int64_t b = 0; b < n / 32; b++) {
        int32_t is = 0;
        for (int i = 0; i < 32; i++)
          is += wb[b].qs[i] * x[b].qs[i];
        a[b & 1] = fmaf((float)is, st_fp16_to_f32(wb[b].d) * x[b].d, a[b & 1]);
      }
      out[t * ldo + r] = a[0] + a[1];
    }
}

/* ---- AVX2: a row at a time, I_b by vpmaddubsw on |w| and the activations signed by w ---------- */

static inline AVX2 int32_t hsum_epi32_avx2(__m256i p) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}

AVX2 void q8_tile_q80_avx2(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                           int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  (void)type;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t r = 0; r < nr; r++) {
    const st_block_q8_0 *wb =
        (const st_block_q8_0 *)(const void *)((const uint8_t *)w + (uint64_t)r * row_bytes);
    float a[2][ST_TILE] = {{0}}; /* even and odd blocks */
    for (int64_t b = 0; b < n / 32; b++) {
      const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)wb[b].qs), av = _mm256_abs_epi8(v);
      const float dw = st_fp16_to_f32(wb[b].d);
      for (int t = 0; t < nt; t++) {
        const st_act_q8_0 *x = (const st_act_q8_0 *)(const void *)(xq + t * ldq) + b;
        const __m256i xv = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(const void *)x->qs), v);
        const int32_t is = hsum_epi32_avx2(_mm256_madd_epi16(_mm256_maddubs_epi16(av, xv), ones));
        a[b & 1][t] = fmaf((float)is, dw * x->d, a[b & 1][t]);
      }
    }
    for (int t = 0; t < nt; t++)
      out[t * ldo + r] = a[0][t] + a[1][t];
  }
}

/* ---- AVX-512 VNNI: 16 rows a vector ---------------------------------------------------------- */

enum { Q80_ROWS = 16, Q80_TOKENS = 8 };

/* Software prefetch: the sixteen rows of a group are read in step, sixteen streams 34 bytes a step,
 * which the hardware prefetchers did not follow (one token ran at a quarter of the host read). So
 * while a group is read, the next group's rows (back to back in memory) are prefetched in address
 * order, the same share of them per block; Q80_HINT is the cache level asked for. */
#ifndef Q80_HINT
#define Q80_HINT _MM_HINT_T0
#endif

/* Block b's share (step bytes) of the next group's pf (NULL: none). */
static inline __attribute__((always_inline)) void q80_prefetch(const uint8_t *pf, uint64_t step, int64_t b) {
  if (!pf) return;
  for (uint64_t j = 0; j < step; j += 64)
    _mm_prefetch((const char *)pf + (uint64_t)b * step + j, Q80_HINT);
}

/* One block of a 16-row group, transposed: lane r of w[k] holds quants 4k..4k+3 of row r plus 128
 * (as unsigned bytes), lane r of d the row's scale. */
struct q80_block {
  __m512i w[8];
  __m512 d;
};

/* Block `at` (its byte offset in a row) of the 16 rows row[0..15] into o. Rows r and r + 4 (r in
 * 0..3 and 8..11) share a vector's halves, so that two rounds of unpacks and one of 128-bit lane
 * shuffles leave the rows in lane order. The scales are inserted one by one (vpgatherdd took a
 * third of the time on Zen 4, stores and a reload more than these inserts). */
static inline __attribute__((always_inline)) VNNI void q80_transpose(const uint8_t *const *row, uint64_t at,
                                                                     struct q80_block *o) {
  __m512i z[8], t[8], u[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    const int a = i < 4 ? i : i + 4;
    z[i] = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(row[a] + at + 2))),
        _mm256_loadu_si256((const __m256i *)(const void *)(row[a + 4] + at + 2)), 1);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 8; h += 4) {
    t[h] = _mm512_unpacklo_epi32(z[h], z[h + 1]);
    t[h + 1] = _mm512_unpackhi_epi32(z[h], z[h + 1]);
    t[h + 2] = _mm512_unpacklo_epi32(z[h + 2], z[h + 3]);
    t[h + 3] = _mm512_unpackhi_epi32(z[h + 2], z[h + 3]);
    u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);     /* dwords 0 and 4 of 4 rows */
    u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]); /* 1 and 5 */
    u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
    u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
  }
  const __m512i flip = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 4
  for (int e = 0; e < 4; e++) {
    o->w[e] = _mm512_xor_si512(_mm512_shuffle_i32x4(u[e], u[4 + e], 0x88), flip);     /* lanes 0, 2 | 0, 2 */
    o->w[e + 4] = _mm512_xor_si512(_mm512_shuffle_i32x4(u[e], u[4 + e], 0xDD), flip); /* lanes 1, 3 | 1, 3 */
  }
  __m128i h0 = _mm_setzero_si128(), h1 = _mm_setzero_si128();
#pragma GCC unroll 8
  for (int r = 0; r < 8; r++) {
    uint16_t a, b;
    memcpy(&a, row[r] + at, 2);
    memcpy(&b, row[r + 8] + at, 2);
    h0 = _mm_insert_epi16(h0, a, r);
    h1 = _mm_insert_epi16(h1, b, r);
  }
  o->d = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1));
}

static inline __attribute__((always_inline)) VNNI __m512i bcast32(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

/* Block b of a group for NT tokens (xq, ldq apart) into acc (lane r of acc[t]: row r's chain):
 * transposed in blk, or (blk NULL) transposed here from the rows row[0..15] as they are read, with
 * the next group's share prefetched; corr[t nb + b] is -128 times the sum of token t's quants in
 * block b. */
static inline __attribute__((always_inline)) VNNI void
q80_block_tokens(const struct q80_block *blk, const uint8_t *const *row, const uint8_t *pf, uint64_t step,
                 int64_t nb, int64_t b, const uint8_t *xq, int64_t ldq, const int32_t *corr, int NT,
                 __m512 *acc) {
  struct q80_block here;
  const struct q80_block *B = blk ? blk + b : &here;
  if (!blk) {
    q80_prefetch(pf, step, b);
    q80_transpose(row, (uint64_t)b * sizeof(st_block_q8_0), &here);
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; t++) {
    const st_act_q8_0 *x = (const st_act_q8_0 *)(const void *)(xq + t * ldq) + b;
    __m512i p = _mm512_set1_epi32(corr[t * nb + b]), q = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) { /* two chains of four */
      p = _mm512_dpbusd_epi32(p, B->w[k], bcast32(x->qs + 4 * k));
      q = _mm512_dpbusd_epi32(q, B->w[k + 4], bcast32(x->qs + 16 + 4 * k));
    }
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(p, q)),
                             _mm512_mul_ps(B->d, _mm512_set1_ps(x->d)), acc[t]);
  }
}

/* NT tokens times a group's nb blocks, the even blocks' chains and the odd ones' added at the end;
 * lane r of out[t ldo ..] is row r's result (mask: the rows present). */
static inline __attribute__((always_inline)) VNNI void
q80_tokens(const struct q80_block *blk, const uint8_t *const *row, const uint8_t *pf, uint64_t step,
           int64_t nb, const uint8_t *xq, int64_t ldq, const int32_t *corr, int NT, float *out, int64_t ldo,
           __mmask16 mask) {
  __m512 even[Q80_TOKENS], odd[Q80_TOKENS];
  for (int t = 0; t < NT; t++)
    even[t] = odd[t] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    q80_block_tokens(blk, row, pf, step, nb, b, xq, ldq, corr, NT, even);
    q80_block_tokens(blk, row, pf, step, nb, b + 1, xq, ldq, corr, NT, odd);
  }
  if (b < nb) q80_block_tokens(blk, row, pf, step, nb, b, xq, ldq, corr, NT, even);
  for (int t = 0; t < NT; t++)
    _mm512_mask_storeu_ps(out + t * ldo, mask, _mm512_add_ps(even[t], odd[t]));
}

/* -128 times the sum of each activation block's 32 quants: eight blocks at a time by vpdpbusd with
 * ones (four quants a lane), one reduction for the eight; the rest by vpsadbw on the quants plus
 * 128. */
static VNNI void q80_corrections(const uint8_t *xq, int64_t ldq, int64_t T, int64_t nb, int32_t *corr) {
  const __m256i flip = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
  const __m512i ones = _mm512_set1_epi8(1),
                order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int64_t t = 0; t < T; t++) {
    const st_act_q8_0 *x = (const st_act_q8_0 *)(const void *)(xq + t * ldq);
    int32_t *c = corr + t * nb;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
      __m512i s[4];
      for (int k = 0; k < 4; k++)
        s[k] = _mm512_dpbusd_epi32(
            _mm512_setzero_si512(), ones,
            _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)x[b + 2 * k].qs)),
                _mm256_loadu_si256((const __m256i *)(const void *)x[b + 2 * k + 1].qs), 1));
      /* lanes of 128-bit lane L: four-quant sums of block b + 2k + L / 2 */
      const __m512i t0 =
          _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s[1]), _mm512_unpackhi_epi32(s[0], s[1]));
      const __m512i t1 =
          _mm512_add_epi32(_mm512_unpacklo_epi32(s[2], s[3]), _mm512_unpackhi_epi32(s[2], s[3]));
      const __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
      /* 128-bit lane 0: blocks b, b + 2, b + 4, b + 6; lane 2: b + 1, b + 3, b + 5, b + 7 */
      const __m512i v = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
      const __m256i sums = _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, v));
      _mm256_storeu_si256((__m256i *)(void *)(c + b), _mm256_sub_epi32(zero, _mm256_slli_epi32(sums, 7)));
    }
    for (; b < nb; b++) {
      const __m256i s = _mm256_sad_epu8(
          _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)x[b].qs), flip), zero);
      const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      const int32_t sum = (int32_t)(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)) - 32 * 128;
      c[b] = -128 * sum;
    }
  }
}

/* The integer sums of four blocks (a: vpdpbusd lanes 0..7 block b, 8..15 block b + 1; c: blocks
 * b + 2, b + 3) summed: lanes 0 and 8 hold I_b and I_b+1, lanes 2 and 10 I_b+2 and I_b+3. */
static inline __attribute__((always_inline)) VNNI __m512i q80_sum_pairs(__m512i a, __m512i c) {
  const __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(a, c), _mm512_unpackhi_epi64(a, c));
  const __m512i s2 = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_CDAB));
  return _mm512_add_epi32(s2, _mm512_shuffle_i32x4(s2, s2, _MM_SHUFFLE(2, 3, 0, 1)));
}

/* The integer sums of two blocks (a: vpdpbusd lanes 0..7 block b, 8..15 block b + 1) summed into
 * lane 0 (block b) and lane 8 (block b + 1). */
static inline __attribute__((always_inline)) VNNI __m512i q80_sum_two(__m512i a) {
  const __m512i s = _mm512_add_epi32(a, _mm512_shuffle_epi32(a, _MM_PERM_CDAB));
  const __m512i s2 = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_BADC));
  return _mm512_add_epi32(s2, _mm512_shuffle_i32x4(s2, s2, _MM_SHUFFLE(2, 3, 0, 1)));
}

/* The two blocks b, b + 1 of a row (quants plus 128) in one vector. */
static inline __attribute__((always_inline)) VNNI __m512i q80_two_blocks(const uint8_t *row, int64_t b) {
  const uint8_t *p = row + (uint64_t)b * sizeof(st_block_q8_0) + 2;
  return _mm512_xor_si512(
      _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)p)),
                         _mm256_loadu_si256((const __m256i *)(const void *)(p + sizeof(st_block_q8_0))), 1),
      _mm512_set1_epi8((char)0x80));
}

/* One token (a decode step), one row at a time in address order: the sixteen streams of the
 * transposed kernel only flow with a group of rows read ahead, which the decode lanes' slices of
 * 32 rows do not leave room for (they ran at 60 % of a one-row kernel's rate), and two rows read in
 * step streamed at half the rate of one here. Same bits: per block the exact I_b (vpdpbusd over
 * two blocks, each block's 8 lanes summed), then the two chains of fmaf. NX = 2 takes the two terms
 * of st_matmul_q8_2 from one read of the weights: out = (A_e + A_o of tk[0]) + (that of tk[1]). */
/* A token prepared for q80_one_token (q80_token_pairs): its quants, corrections and scales two blocks
 * a vector, and its rows and corrections as they are. */
struct q80_tok {
  const __m512i *xv, *init;
  const __m128 *dx;
  const st_act_q8_0 *x;
  const int32_t *corr;
};

static inline __attribute__((always_inline)) VNNI void q80_one_token(const uint8_t *W, uint64_t row_bytes,
                                                                     int64_t nr, const struct q80_tok *tk,
                                                                     int NX, int64_t nb, float *out) {
  const __m512i pick = _mm512_setr_epi32(0, 8, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i pick4 = _mm512_setr_epi32(0, 8, 2, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int64_t r = 0; r < nr; r++) {
    const uint8_t *w = W + (uint64_t)r * row_bytes;
    __m128 acc[2] = {_mm_setzero_ps(),
                     _mm_setzero_ps()}; /* per term: lane 0 the even blocks' chain, lane 1 the odd */
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) { /* four blocks: both chains take two steps */
      _mm_prefetch((const char *)w + (uint64_t)b * sizeof(st_block_q8_0) + ST_PREFETCH_AHEAD,
                   ST_PREFETCH_HINT);
      _mm_prefetch((const char *)w + (uint64_t)b * sizeof(st_block_q8_0) + ST_PREFETCH_AHEAD + 64,
                   ST_PREFETCH_HINT);
      const __m512i wa = q80_two_blocks(w, b), wc = q80_two_blocks(w, b + 2);
      uint16_t h[4];
      for (int k = 0; k < 4; k++)
        memcpy(&h[k], w + (uint64_t)(b + k) * sizeof(st_block_q8_0), 2);
      const __m128 d =
          _mm_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], 0, 0, 0, 0));
      for (int k = 0; k < NX; k++) {
        const struct q80_tok *t = tk + k;
        const __m512i a = _mm512_dpbusd_epi32(t->init[b / 2], wa, t->xv[b / 2]);
        const __m512i c = _mm512_dpbusd_epi32(t->init[b / 2 + 1], wc, t->xv[b / 2 + 1]);
        const __m128 f =
            _mm_cvtepi32_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi32(pick4, q80_sum_pairs(a, c))));
        const __m128 sc = _mm_mul_ps(d, _mm_movelh_ps(t->dx[b / 2], t->dx[b / 2 + 1]));
        acc[k] = _mm_fmadd_ps(f, sc, acc[k]);
        acc[k] = _mm_fmadd_ps(_mm_movehl_ps(f, f), _mm_movehl_ps(sc, sc), acc[k]);
      }
    }
    if (b + 2 <= nb) {
      const __m512i wa = q80_two_blocks(w, b);
      uint16_t h0, h1;
      memcpy(&h0, w + (uint64_t)b * sizeof(st_block_q8_0), 2);
      memcpy(&h1, w + (uint64_t)(b + 1) * sizeof(st_block_q8_0), 2);
      const __m128 d = _mm_cvtph_ps(_mm_setr_epi16((short)h0, (short)h1, 0, 0, 0, 0, 0, 0));
      for (int k = 0; k < NX; k++) {
        const struct q80_tok *t = tk + k;
        const __m512i i = q80_sum_two(_mm512_dpbusd_epi32(t->init[b / 2], wa, t->xv[b / 2]));
        const __m128 f = _mm_cvtepi32_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi32(pick, i)));
        acc[k] = _mm_fmadd_ps(f, _mm_mul_ps(d, t->dx[b / 2]), acc[k]);
      }
      b += 2;
    }
    if (b < nb) { /* an odd block count's last block: the even chain */
      const __m256i wv = _mm256_xor_si256(
          _mm256_loadu_si256((const __m256i *)(const void *)(w + (uint64_t)b * sizeof(st_block_q8_0) + 2)),
          _mm256_set1_epi8((char)0x80));
      uint16_t h;
      memcpy(&h, w + (uint64_t)b * sizeof(st_block_q8_0), 2);
      const __m128 d = _mm_cvtph_ps(_mm_cvtsi32_si128(h));
      for (int k = 0; k < NX; k++) {
        const struct q80_tok *t = tk + k;
        const __m256i p = _mm256_dpbusd_epi32(_mm256_zextsi128_si256(_mm_cvtsi32_si128(t->corr[b])), wv,
                                              _mm256_loadu_si256((const __m256i *)(const void *)t->x[b].qs));
        __m128i i = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
        i = _mm_add_epi32(i, _mm_shuffle_epi32(i, _MM_PERM_CDAB));
        i = _mm_add_epi32(i, _mm_shuffle_epi32(i, _MM_PERM_BADC));
        acc[k] = _mm_mask3_fmadd_ss(_mm_cvtepi32_ps(i), _mm_mul_ss(d, _mm_set_ss(t->x[b].d)), acc[k], 1);
      }
    }
    float o = _mm_cvtss_f32(_mm_add_ss(acc[0], _mm_movehdup_ps(acc[0])));
    if (NX == 2) o = o + _mm_cvtss_f32(_mm_add_ss(acc[1], _mm_movehdup_ps(acc[1])));
    out[r] = o;
  }
}

/* A token's blocks two at a time for q80_one_token: the quants of blocks b, b + 1 in one vector,
 * their corrections in lanes 0 and 8, their scales d in lanes 0 and 1 (then 0, as the weights'). */
static VNNI void q80_token_pairs(const st_act_q8_0 *x, const int32_t *corr, int64_t nb, __m512i *xv,
                                 __m512i *init, __m128 *dx) {
  for (int64_t b = 0; b + 2 <= nb; b += 2) {
    xv[b / 2] =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)x[b].qs)),
                           _mm256_loadu_si256((const __m256i *)(const void *)x[b + 1].qs), 1);
    init[b / 2] = _mm512_inserti32x4(_mm512_zextsi128_si512(_mm_cvtsi32_si128(corr[b])),
                                     _mm_cvtsi32_si128(corr[b + 1]), 2);
    dx[b / 2] = _mm_setr_ps(x[b].d, x[b + 1].d, 0.0f, 0.0f);
  }
}

#define Q80_CASES(blk)                                                                                       \
  switch (nt) {                                                                                              \
  case 1: q80_tokens(blk, row, pf, step, nb, x, ldq, c, 1, o, ldo, mask); break;                             \
  case 2: q80_tokens(blk, row, pf, step, nb, x, ldq, c, 2, o, ldo, mask); break;                             \
  case 3: q80_tokens(blk, row, pf, step, nb, x, ldq, c, 3, o, ldo, mask); break;                             \
  case 4: q80_tokens(blk, row, pf, step, nb, x, ldq, c, 4, o, ldo, mask); break;                             \
  case 5: q80_tokens(blk, row, pf, step, nb, x, ldq, c, 5, o, ldo, mask); break;                             \
  case 6: q80_tokens(blk, row, pf, step, nb, x, ldq, c, 6, o, ldo, mask); break;                             \
  case 7: q80_tokens(blk, row, pf, step, nb, x, ldq, c, 7, o, ldo, mask); break;                             \
  default: q80_tokens(blk, row, pf, step, nb, x, ldq, c, 8, o, ldo, mask); break;                            \
  }

VNNI void q8_matmul_q80_vnni(const void *W, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                             const uint8_t *xr, int64_t ldq, int64_t T, int64_t n, float *out, int64_t ldo) {
  const int64_t nb = n / 32;
  ST_ASSERT(!xr || T == 1);
  if (T == 1) {
    const int64_t np = nb / 2;
    const size_t one =
        ((size_t)np * (2 * sizeof(__m512i) + sizeof(__m128)) + (size_t)nb * sizeof(int32_t) + 63) / 64 * 64;
    uint8_t *pb = st_dot_scratch(1, 2 * one + 64);
    ST_ASSERT(pb != NULL);
    pb += (64 - (uintptr_t)pb % 64) % 64;
    struct q80_tok tk[2];
    const uint8_t *terms[2] = {xq, xr};
    for (int k = 0; k < (xr ? 2 : 1); k++) {
      __m512i *xv = (__m512i *)(void *)(pb + k * one), *init = xv + np;
      __m128 *dx = (__m128 *)(void *)(init + np);
      int32_t *c1 = (int32_t *)(void *)(dx + np);
      const st_act_q8_0 *x = (const st_act_q8_0 *)(const void *)terms[k];
      q80_corrections(terms[k], ldq, 1, nb, c1);
      q80_token_pairs(x, c1, nb, xv, init, dx);
      tk[k] = (struct q80_tok){xv, init, dx, x, c1};
    }
    if (xr)
      q80_one_token(W, row_bytes, nr, tk, 2, nb, out);
    else
      q80_one_token(W, row_bytes, nr, tk, 1, nb, out);
    return;
  }
  const size_t blk_bytes = T > Q80_TOKENS ? (size_t)nb * sizeof(struct q80_block) : 0;
  uint8_t *buf = st_dot_scratch(1, blk_bytes + (size_t)(T * nb) * sizeof(int32_t) + 64);
  ST_ASSERT(buf != NULL);
  struct q80_block *blk = (struct q80_block *)(void *)(buf + (64 - (uintptr_t)buf % 64) % 64);
  int32_t *corr = (int32_t *)(void *)((uint8_t *)blk + blk_bytes);
  q80_corrections(xq, ldq, T, nb, corr);
  for (int64_t g = 0; g < nr; g += Q80_ROWS) {
    const int rows = nr - g < Q80_ROWS ? (int)(nr - g) : Q80_ROWS;
    const uint8_t *base = (const uint8_t *)W + (uint64_t)g * row_bytes, *row[Q80_ROWS];
    for (int r = 0; r < Q80_ROWS; r++) /* absent rows repeat the last one; their lanes are not stored */
      row[r] = base + (uint64_t)(r < rows ? r : rows - 1) * row_bytes;
    const __mmask16 mask = (__mmask16)((1u << rows) - 1);
    const int next = nr - g - rows < Q80_ROWS ? (int)(nr - g - rows) : Q80_ROWS;
    const uint8_t *pf = next > 0 ? base + (uint64_t)rows * row_bytes : NULL;
    const uint64_t step = ((uint64_t)next * row_bytes + (uint64_t)nb - 1) / (uint64_t)nb;
    if (T > Q80_TOKENS) /* transposed once for every tile */
      for (int64_t b = 0; b < nb; b++) {
        q80_prefetch(pf, step, b);
        q80_transpose(row, (uint64_t)b * sizeof(st_block_q8_0), &blk[b]);
      }
    const int64_t tile =
        (T + (T + Q80_TOKENS - 1) / Q80_TOKENS - 1) / ((T + Q80_TOKENS - 1) / Q80_TOKENS); /* even tiles */
    for (int64_t t0 = 0; t0 < T; t0 += tile) {
      const int nt = T - t0 < tile ? (int)(T - t0) : (int)tile;
      const uint8_t *x = xq + t0 * ldq;
      const int32_t *c = corr + t0 * nb;
      float *o = out + t0 * ldo + g;
      if (T > Q80_TOKENS) {
        Q80_CASES(blk)
      } else {
        Q80_CASES(NULL)
      }
    }
  }
}
