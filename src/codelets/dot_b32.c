/* The CPU kernels of the 32-weight block family (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4; their
 * blocks in quant.h): for float activations (st_matmul) the AVX2 and AVX-512 row tiles that decode
 * a block's quants in registers, and for int8 activations (st_matmul_q8, st_act_q8_0) the scalar,
 * AVX2 and AVX-512 VNNI kernels (the last also built for the VBMI level). Q8_0 takes dot.c's row
 * tiles of the float formats and dot_q8_0.c's integer kernels. dot.c chooses among them; the helpers they share with the other
 * families are in dot_impl.h. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codelets/dot_impl.h"
#include "codelets/quant.h"
#include "common.h"

/* ---- float activations (st_matmul) --------------------------------------------------------
 * Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL a block of 32 at a time: the quants unpacked to signed
 * bytes (the fifth bit of Q5_* from qh through a bit mask), each weight formed as quant.c's
 * dequant forms it ((q - offset) * d [+ m], or d * level). */

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
  case ST_TYPE_MXFP4: l.d = st_e8m0_to_f32_half(bb[0]), l.qs = bb + 1; break;
  default: l.qs = bb + 2; break; /* IQ4_NL */
  }
  return l;
}

/* The 16 levels a 4-bit index selects: IQ4_NL's non-linear ones or MXFP4's doubled E2M1 values. */
static inline const int8_t *levels_of(uint32_t type) { return type == ST_TYPE_MXFP4 ? st_kvalues_mxfp4 : st_kvalues_iq4nl; }
static inline int has_levels(uint32_t type) { return type == ST_TYPE_IQ4_NL || type == ST_TYPE_MXFP4; }

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
  const __m128i m4 = _mm_set1_epi8(0x0F), kv = _mm_loadu_si128((const __m128i *)(const void *)levels_of(type));
  for (int64_t blk = 0; blk < n / 32; blk++) {
    const struct legacy_block l = legacy_at(type, (const uint8_t *)w + (uint64_t)blk * bs);
    const __m128i q = _mm_loadu_si128((const __m128i *)l.qs);
    __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    if (has_levels(type)) {
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

AVX512 void row_tile_b_avx512(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                              float *out, int64_t ldo) {
  ST_B32_DISPATCH(ST_TILE_CASES, row_tile_b_avx512_impl)
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
  const __m128i m4 = _mm_set1_epi8(0x0F), kv = _mm_loadu_si128((const __m128i *)(const void *)levels_of(type));
  for (int64_t blk = 0; blk < n / 32; blk++) {
    const struct legacy_block l = legacy_at(type, (const uint8_t *)w + (uint64_t)blk * bs);
    const __m128i q = _mm_loadu_si128((const __m128i *)l.qs);
    __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    if (has_levels(type)) {
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

AVX2 void row_tile_b_avx2(uint32_t type, const void *w, const float *x, int64_t ldx, int nt, int64_t n,
                          float *out, int64_t ldo) {
  ST_B32_DISPATCH(ST_TILE_CASES, row_tile_b_avx2_impl)
}

/* ---- int8 activations (st_matmul_q8) ------------------------------------------------------ */

/* Bytes per weight block of the 32-block family; the fp16 scale is at offset 0 in all of them. */
static inline uint64_t b32_bytes(uint32_t type) {
  switch (type) {
  case ST_TYPE_Q4_0: return sizeof(st_block_q4_0);
  case ST_TYPE_Q4_1: return sizeof(st_block_q4_1);
  case ST_TYPE_Q5_0: return sizeof(st_block_q5_0);
  case ST_TYPE_Q5_1: return sizeof(st_block_q5_1);
  case ST_TYPE_MXFP4: return sizeof(st_block_mxfp4);
  default: return sizeof(st_block_iq4_nl);
  }
}

/* A block's scale: fp16 at offset 0, or MXFP4's E8M0 byte (ggml's GGML_E8M0_TO_FP32_HALF). */
static inline __attribute__((always_inline)) float b32_scale(uint32_t type, const uint8_t *bb) {
  if (type == ST_TYPE_MXFP4) return st_e8m0_to_f32_half(bb[0]);
  uint16_t dh;
  memcpy(&dh, bb, 2);
  return st_fp16_to_f32(dh);
}

/* Q4_1 and Q5_1 (w = d q + m, q unsigned): the fp16 min at offset 2; lane j of a block also
 * carries m dx times the sum of its eight activation quants. */
static inline int b32_has_min(uint32_t type) { return type == ST_TYPE_Q4_1 || type == ST_TYPE_Q5_1; }

/* Offset of the nibbles and (Q5_0/Q5_1) of the 32 fifth bits in a block. */
static inline int b32_qs_at(uint32_t type) {
  return type == ST_TYPE_Q4_1 ? 4 : type == ST_TYPE_Q5_0 ? 6 : type == ST_TYPE_Q5_1 ? 8 : type == ST_TYPE_MXFP4 ? 1 : 2;
}
static inline int b32_qh_at(uint32_t type) { return type == ST_TYPE_Q5_0 ? 2 : 4; }

/* The 16 accumulators' fixed reduction tree (hsum8_avx2's order on A[j] + A[8 + j]). */
static inline float q8_reduce16(const float *a) {
  float s[8];
  for (int j = 0; j < 8; j++) s[j] = a[j] + a[8 + j];
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* scalar: the integer quants of a block, then the loops that define the sums */
static void b32_quants_scalar(uint32_t type, const uint8_t *bb, int8_t *q) {
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
    default: q[l] = levels_of(type)[lo], q[l + 16] = levels_of(type)[hi];
    }
  }
}

static void q8_row_b32_scalar(uint32_t type, const void *w, const uint8_t *xq, int64_t ldq, int nt, int64_t n,
                              float *out, int64_t ldo) {
  int8_t q[256];
  const uint64_t bs = b32_bytes(type);
  for (int t = 0; t < nt; t++) {
    const st_act_q8_0 *x = (const st_act_q8_0 *)(const void *)(xq + t * ldq);
    float a[16] = {0};
    for (int64_t b = 0; b < n / 32; b++) {
      const uint8_t *bb = (const uint8_t *)w + (uint64_t)b * bs;
      b32_quants_scalar(type, bb, q);
      const float s = b32_scale(type, bb) * x[b].d;
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
}

ST_Q8_EACH_ROW(q8_rows_b32_scalar, q8_row_b32_scalar, )

void q8_tile_b32_scalar(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                        int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  q8_rows_b32_scalar(type, w, row_bytes, nr, xq, ldq, nt, n, out, ldo);
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

/* The 32 integer quants of a block in weight order: signed (Q4_0, Q5_0, IQ4_NL, MXFP4) or unsigned
 * (Q4_1, Q5_1). */
static inline AVX2 __m256i b32_quants_avx2(uint32_t type, const uint8_t *bb) {
  const __m128i q = _mm_loadu_si128((const __m128i *)(bb + b32_qs_at(type))), m4 = _mm_set1_epi8(0xF);
  __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
  if (has_levels(type)) {
    const __m128i kv = _mm_loadu_si128((const __m128i *)(const void *)levels_of(type));
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
    uint16_t mh = 0;
    if (with_min) memcpy(&mh, bb + 2, 2);
    const float dw = b32_scale(type, bb), mw = _cvtsh_ss(mh);
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

ST_Q8_EACH_ROW(q8_rows_b32_avx2, q8_tile_b32_avx2_impl, AVX2)

AVX2 void q8_tile_b32_avx2(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                           int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_B32_DISPATCH(ST_Q8_TILE_CASES, q8_rows_b32_avx2)
}

/* AVX-512 VNNI (dot_impl.h) */

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

/* The E8M0 scales of a whole quad of MXFP4 blocks (bytes 0, 17, 34 and 51: one in each 128-bit lane
 * of the quad's first 64 bytes) as four floats, st_e8m0_to_f32_half's bits: (e - 1) << 23, or
 * 0x00200000 << e below e = 2. */
static inline __attribute__((always_inline)) VNNI __m128 mxfp4_quad_scales(const uint8_t *bb) {
  const __m512i v = _mm512_loadu_si512((const void *)bb);
  const __m512i at = _mm512_setr_epi32(0xFFFFFF00, -1, -1, -1, 0xFFFFFF01, -1, -1, -1, 0xFFFFFF02, -1, -1, -1,
                                       0xFFFFFF03, -1, -1, -1);
  const __m128i e = _mm512_castsi512_si128(
      _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), _mm512_shuffle_epi8(v, at)));
  const __m128i big = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
  const __m128i small = _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e);
  return _mm_castsi128_ps(_mm_mask_blend_epi32(_mm_cmplt_epu32_mask(e, _mm_set1_epi32(2)), big, small));
}

static inline __attribute__((always_inline)) VNNI struct b32_quad b32_quad_vnni(uint32_t type,
                                                                                const uint8_t *bb, int cnt) {
  const uint64_t bs = b32_bytes(type);
  struct b32_quad q;
  q.d = type == ST_TYPE_MXFP4
            ? (cnt == 4 ? mxfp4_quad_scales(bb)
                        : _mm_setr_ps(st_e8m0_to_f32_half(bb[0]), cnt > 1 ? st_e8m0_to_f32_half(bb[bs]) : 0.0f,
                                      cnt > 2 ? st_e8m0_to_f32_half(bb[2 * bs]) : 0.0f, 0.0f))
            : quad_half4(bb, bs, cnt, 0);
  q.m = b32_has_min(type) ? quad_half4(bb, bs, cnt, 2) : _mm_setzero_ps();
  const __m512i qs = lanes4(bb + b32_qs_at(type), bs, cnt), m4 = _mm512_set1_epi8(0xF);
  q.lo = _mm512_and_si512(qs, m4);
  q.hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
  if (has_levels(type)) {
    const __m512i kv = levels_u8_vnni(levels_of(type));
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

VNNI void q8_tile_b32_vnni(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                           int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_B32_DISPATCH(ST_Q8_TILE_CASES, q8_rows_b32_vnni)
}

/* The same kernels at the VBMI level (st_matmul_q8's level 3) */
VBMI void q8_tile_b32_vbmi(uint32_t type, const void *w, uint64_t row_bytes, int64_t nr, const uint8_t *xq,
                           int64_t ldq, int nt, int64_t n, float *out, int64_t ldo) {
  ST_B32_DISPATCH(ST_Q8_TILE_CASES, q8_rows_b32_vnni)
}
