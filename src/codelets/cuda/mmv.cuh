// Mat-vec kernels specialised on the block format (issues #5, #20): F32, F16, BF16, Q4_K, Q6_K,
// Q8_0, Q5_K, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, MXFP4,
// Q1_0, Q2_0, TQ1_0, TQ2_0, IQ2_XXS, IQ1_S and IQ1_M
// weight rows times up to 8 float32 token rows, for matmul.cu's plain and grouped products and the
// decode step's fused kernels (decode.cu).
// A row is walked in chunks of 1024 weights. A thread block (8 warps) takes 8 (row, slot) items:
// a row's chunks are dealt to S slots (S = mmv_slots(n), a power of two of at most 8: chunk c goes
// to slot c % S), so the block holds 8 / S rows. The whole block first copies the packed bytes of
// its rows' next S chunks into shared memory with 16-byte loads, all issued before the first is
// stored (the bytes in flight hide the memory's latency); then each warp computes its item: lane l
// decodes the scales of the chunk's 32-weight sub-block l once, and in 8 steps every lane decodes 4
// consecutive weights (chunk offsets 128 k + 4 l, the sub-block's scales fetched by a shuffle) and
// multiplies them with one float4 of each token row. Quants become floats exactly through the
// mantissa of 2^23 (a byte permute and an add; an integer conversion runs at a quarter of the FMA
// rate). Each (row, token) sum is a per-lane fma chain over the slot's chunks in order, then
// st_warp_sum, then the S slot sums added in slot order: a function of the row, the token and n
// alone, so a token's result depends neither on the other tokens of the launch nor on the other
// rows, experts or kernels that share the core, and repeats bit for bit.
#pragma once

#include <type_traits>

#include "codelets/cuda/common.cuh"

#define MMV_CH 1024     /* weights of a row per chunk: 32 lanes x 32 */
#define MMV_THREADS 256 /* threads of a block: 8 warps */
#define MMV_ITEMS 8     /* (row, slot) items of a block, one per warp */
#define MMV_TT 8        /* token rows of a batched launch */

// Block geometry (quant.h): QK weights in BS bytes; ALIGN, the alignment the decoder's loads from
// a block need (4: 32-bit reads of its fields; 2: 16-bit reads); MIN: a second per-sub-block value
// (the K-quants' mins, Q6_K's second 16-weight scale).
template <uint32_t TYPE> struct mmv_format;
// The float formats as blocks of 32 weights with no scale.
template <> struct mmv_format<ST_TYPE_F32> {
  enum { QK = 32, BS = 128, ALIGN = 4, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_F16> {
  enum { QK = 32, BS = 64, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_BF16> {
  enum { QK = 32, BS = 64, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_Q8_0> {
  enum { QK = 32, BS = 34, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_Q4_0> {
  enum { QK = 32, BS = 18, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_Q4_K> {
  enum { QK = 256, BS = 144, ALIGN = 4, MIN = 1 };
};
template <> struct mmv_format<ST_TYPE_Q5_K> {
  enum { QK = 256, BS = 176, ALIGN = 4, MIN = 1 };
};
template <> struct mmv_format<ST_TYPE_Q6_K> {
  enum { QK = 256, BS = 210, ALIGN = 2, MIN = 1 };
};
template <> struct mmv_format<ST_TYPE_IQ4_XS> {
  enum { QK = 256, BS = 136, ALIGN = 4, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_Q4_1> {
  enum { QK = 32, BS = 20, ALIGN = 4, MIN = 1 };
};
template <> struct mmv_format<ST_TYPE_Q5_0> {
  enum { QK = 32, BS = 22, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_Q5_1> {
  enum { QK = 32, BS = 24, ALIGN = 4, MIN = 1 };
};
template <> struct mmv_format<ST_TYPE_IQ4_NL> {
  enum { QK = 32, BS = 18, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_Q2_K> {
  enum { QK = 256, BS = 84, ALIGN = 4, MIN = 1 };
};
template <> struct mmv_format<ST_TYPE_Q3_K> {
  enum { QK = 256, BS = 110, ALIGN = 2, MIN = 1 };
};
template <> struct mmv_format<ST_TYPE_IQ3_S> {
  enum { QK = 256, BS = 110, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_IQ3_XXS> {
  enum { QK = 256, BS = 98, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_IQ2_S> {
  enum { QK = 256, BS = 82, ALIGN = 2, MIN = 1 };
};
template <> struct mmv_format<ST_TYPE_IQ2_XS> {
  enum { QK = 256, BS = 74, ALIGN = 2, MIN = 1 };
};
// MXFP4's 17-byte blocks: ALIGN 2 asks rows of an even byte count (an even number of blocks), as the
// staging copies take; the decoder reads its quants a byte at a time (a block's bytes sit at any
// offset).
template <> struct mmv_format<ST_TYPE_MXFP4> {
  enum { QK = 32, BS = 17, ALIGN = 2, MIN = 0 };
};
// Issue #25's formats (quant.h's layouts): the low-bit ones and the last i-quants.
template <> struct mmv_format<ST_TYPE_Q1_0> {
  enum { QK = 128, BS = 18, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_Q2_0> {
  enum { QK = 64, BS = 18, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_TQ1_0> {
  enum { QK = 256, BS = 54, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_TQ2_0> {
  enum { QK = 256, BS = 66, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_IQ2_XXS> {
  enum { QK = 256, BS = 66, ALIGN = 2, MIN = 0 };
};
template <> struct mmv_format<ST_TYPE_IQ1_S> {
  enum { QK = 256, BS = 50, ALIGN = 2, MIN = 1 };
};
template <> struct mmv_format<ST_TYPE_IQ1_M> {
  enum { QK = 256, BS = 56, ALIGN = 2, MIN = 1 };
};

// Chunk slots of a row of n weights (see the top of the file): a power of two, at most MMV_ITEMS,
// no more than the row has chunks. A function of n alone.
__host__ __device__ __forceinline__ int mmv_slots(int64_t n) {
  const int64_t nch = (n + MMV_CH - 1) / MMV_CH;
  int s = 1;
  while (s < nch && s < MMV_ITEMS) s *= 2;
  return s;
}
// Rows of a block for rows of n weights.
__host__ __device__ __forceinline__ int mmv_block_rows(int64_t n) { return MMV_ITEMS / mmv_slots(n); }

// Packed bytes of one chunk, and the 16-byte segments of a block's staging buffer: MMV_ITEMS
// chunks, plus per row a misaligned start, a partial end and the rounding of S chunks.
template <uint32_t TYPE> __host__ __device__ constexpr int mmv_chunk_bytes() {
  return MMV_CH / mmv_format<TYPE>::QK * mmv_format<TYPE>::BS;
}
template <uint32_t TYPE> __host__ __device__ constexpr int mmv_stage_segs() {
  return (MMV_ITEMS * mmv_chunk_bytes<TYPE>() + 15) / 16 + 3 * MMV_ITEMS;
}

__host__ __device__ __forceinline__ float mmv_as_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

// Byte J of q as a float minus `bias`, exactly: the byte becomes the low mantissa of 2^23.
template <int J> __host__ __device__ __forceinline__ float mmv_byte(uint32_t q, float bias) {
#ifdef __CUDA_ARCH__
  const uint32_t m = __byte_perm(q, 0x4B000000u, 0x7540u | J);
#else
  const uint32_t m = 0x4B000000u | ((q >> (8 * J)) & 0xFFu);
#endif
  return mmv_as_float(m) - (8388608.0f + bias);
}

__host__ __device__ __forceinline__ uint32_t mmv_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

// x negated when bit 0 of s is set: exactly the CPU's x * -1.0f, with one integer op.
__host__ __device__ __forceinline__ float mmv_signed(float x, uint32_t s) {
  return mmv_as_float(mmv_bits(x) ^ (s & 1u) << 31);
}

// The i-quant grids: common.cuh's device copies (as st_dev_iq_weight reads them), and quant.c's
// tables when this file is compiled as host code (a decoder emulation).
#ifdef __CUDA_ARCH__
#define MMV_GRID(name) st_dev_##name
#else
#define MMV_GRID(name) st_##name
#endif

// The IQ2_XS/IQ3_XXS sign byte of a 7-bit field (quant.h st_iq_signs).
__host__ __device__ __forceinline__ uint32_t mmv_iq_signs(uint32_t f) {
#ifdef __CUDA_ARCH__
  return st_dev_iq_signs(f);
#else
  return st_iq_signs(f);
#endif
}

__host__ __device__ __forceinline__ float mmv_f16(const uint8_t *p) {
  return __half2float(__ushort_as_half(*(const uint16_t *)p));
}
__host__ __device__ __forceinline__ uint32_t mmv_u32(const uint8_t *p) {
  return *(const uint32_t *)p;
}
__host__ __device__ __forceinline__ uint32_t mmv_u32_a2(const uint8_t *p) { // 2-byte aligned
  const uint16_t *h = (const uint16_t *)p;
  return h[0] | (uint32_t)h[1] << 16;
}
// 4 bytes at p, with the loads the format's ALIGN allows.
template <uint32_t TYPE> __host__ __device__ __forceinline__ uint32_t mmv_u32_at(const uint8_t *p) {
  return mmv_format<TYPE>::ALIGN == 4 ? mmv_u32(p) : mmv_u32_a2(p);
}

// The scales of sub-block l (weights 32 l .. 32 l + 31) of a chunk whose first block is at ch:
// weight = s0 * q (Q8_0, Q4_0, IQ4_XS and IQ4_NL with q its table value), s0 * q + s1 (Q4_1,
// Q5_1; Q5_0 with s1 = 0), s0 * q - s1 (Q4_K, Q5_K), s0 * q for the first 16 weights and s1 * q for
// the last 16 (Q6_K, Q3_K); as st_dev_weight computes them. Q2_K has a scale and a min per 16
// weights: s0 and s1 are its super-block's d and dmin, mmv_weights4 applies the 4-bit factors.
// The grid formats: weight = s0 * magnitude * sign (IQ3_S, IQ3_XXS), s0 or s1 for the first or
// last 16 weights (IQ2_S, IQ2_XS).
template <uint32_t TYPE>
__host__ __device__ __forceinline__ void mmv_scales(const uint8_t *ch, int l, float &s0, float &s1) {
  constexpr int BS = mmv_format<TYPE>::BS;
  s1 = 0.0f;
  if constexpr (TYPE == ST_TYPE_F32 || TYPE == ST_TYPE_F16 || TYPE == ST_TYPE_BF16) {
    s0 = 1.0f;
  } else if constexpr (TYPE == ST_TYPE_Q8_0 || TYPE == ST_TYPE_Q4_0 || TYPE == ST_TYPE_Q5_0 || TYPE == ST_TYPE_IQ4_NL) {
    s0 = mmv_f16(ch + l * BS);
  } else if constexpr (TYPE == ST_TYPE_Q4_1 || TYPE == ST_TYPE_Q5_1) {
    s0 = mmv_f16(ch + l * BS);
    s1 = mmv_f16(ch + l * BS + 2);
  } else if constexpr (TYPE == ST_TYPE_Q4_K || TYPE == ST_TYPE_Q5_K) {
    const uint8_t *b = ch + (l >> 3) * BS, *sc = b + 4;
    const int is = l & 7;
    int s, m;
    st_dev_k45_scale_min(sc, is, &s, &m);
    s0 = mmv_f16(b) * (float)s;
    s1 = mmv_f16(b + 2) * (float)m;
  } else if constexpr (TYPE == ST_TYPE_Q6_K) {
    const uint8_t *b = ch + (l >> 3) * BS;
    const int8_t *sc = (const int8_t *)(b + 192) + 2 * (l & 7);
    const float d = mmv_f16(b + 208);
    s0 = d * (float)sc[0];
    s1 = d * (float)sc[1];
  } else if constexpr (TYPE == ST_TYPE_IQ4_XS) {
    const uint8_t *b = ch + (l >> 3) * BS;
    const int ib = l & 7, sh = b[2] | b[3] << 8;
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
    s0 = mmv_f16(b) * (float)(ls - 32);
  } else if constexpr (TYPE == ST_TYPE_Q2_K) {
    const uint8_t *b = ch + (l >> 3) * BS;
    s0 = mmv_f16(b + 80);
    s1 = mmv_f16(b + 82);
  } else if constexpr (TYPE == ST_TYPE_Q3_K) {
    // scales 2 (l & 7) and 2 (l & 7) + 1 of the 16 6-bit ones: low 4 bits in bytes 0..7 (scale
    // is: byte is % 8, nibble is / 8), high 2 bits in bytes 8..11 (byte is % 4, bits 2 (is / 4))
    const uint8_t *b = ch + (l >> 3) * BS, *sc = b + 96;
    const float d = mmv_f16(b + 108);
    int s[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int is = 2 * (l & 7) + h, g = is >> 2, bb = is & 3;
      s[h] = (((sc[(g & 1) * 4 + bb] >> (4 * (g >> 1))) & 0xF) | (((sc[8 + bb] >> (2 * g)) & 3) << 4)) - 32;
    }
    s0 = d * (float)s[0];
    s1 = d * (float)s[1];
  } else if constexpr (TYPE == ST_TYPE_IQ2_XS || TYPE == ST_TYPE_IQ2_S) {
    // two 4-bit scales s per 32 weights (low nibble: the first 16), d * (0.5 + s) / 4
    const uint8_t *b = ch + (l >> 3) * BS;
    const int sc = b[(TYPE == ST_TYPE_IQ2_XS ? 66 : 74) + (l & 7)];
    const float d = mmv_f16(b);
    s0 = d * (0.5f + (float)(sc & 0xF)) * 0.25f;
    s1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
  } else if constexpr (TYPE == ST_TYPE_IQ3_XXS) { // s in the top 4 bits of the sub-block's uint32
    const uint8_t *b = ch + (l >> 3) * BS;
    s0 = mmv_f16(b) * (0.5f + (float)(mmv_u32_a2(b + 66 + 4 * (l & 7)) >> 28)) * 0.5f;
  } else if constexpr (TYPE == ST_TYPE_IQ3_S) { // 4-bit s, two per byte: d * (1 + 2 s)
    const uint8_t *b = ch + (l >> 3) * BS;
    const int ib = l & 7;
    s0 = mmv_f16(b) * (float)(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 0xF));  } else if constexpr (TYPE == ST_TYPE_MXFP4) { // 2^(e - 128) (quant.h st_e8m0_to_f32_half)
    const uint32_t e = ch[l * BS];
    s0 = mmv_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
  } else if constexpr (TYPE == ST_TYPE_Q1_0 || TYPE == ST_TYPE_Q2_0) { // d of the block (128 or 64 weights)
    s0 = mmv_f16(ch + (l / (mmv_format<TYPE>::QK / 32)) * BS);
  } else if constexpr (TYPE == ST_TYPE_TQ1_0 || TYPE == ST_TYPE_TQ2_0) { // d after the quants
    s0 = mmv_f16(ch + (l >> 3) * BS + BS - 2);
  } else if constexpr (TYPE == ST_TYPE_IQ2_XXS) { // s in the top 4 bits of the sub-block's second word: d (0.5 + s) / 4
    const uint8_t *b = ch + (l >> 3) * BS;
    s0 = mmv_f16(b) * (0.5f + (float)(mmv_u32_a2(b + 2 + 8 * (l & 7) + 4) >> 28)) * 0.25f;
  } else if constexpr (TYPE == ST_TYPE_IQ1_S) { // d (2 s + 1) from qh's bits 12..14; s1: that times the delta (bit 15)
    const uint8_t *b = ch + (l >> 3) * BS;
    const uint32_t qh = *(const uint16_t *)(b + 34 + 2 * (l & 7));
    s0 = mmv_f16(b) * (float)(2 * ((qh >> 12) & 7) + 1);
    s1 = s0 * (qh & 0x8000 ? -0.125f : 0.125f);
  } else if constexpr (TYPE == ST_TYPE_IQ1_M) { // d from the scale words' top nibbles; 3-bit s per 16 weights
    const uint8_t *b = ch + (l >> 3) * BS;
    const uint16_t *sw = (const uint16_t *)(b + 48);
    const uint32_t dh = (sw[0] >> 12) | ((sw[1] >> 8) & 0x00F0u) | ((sw[2] >> 4) & 0x0F00u) | (sw[3] & 0xF000u);
    const float d = __half2float(__ushort_as_half((uint16_t)dh));
    const int ib = l & 7;
    const uint32_t sc = sw[ib / 2] >> (6 * (ib % 2));
    s0 = d * (float)(2 * (sc & 7) + 1);
    s1 = d * (float)(2 * ((sc >> 3) & 7) + 1);
  }
}

// The four magnitude bytes of m as floats, byte i negated where bit i of sg is set (the grid
// i-quants' weights before their scale), into qf.
__host__ __device__ __forceinline__ void mmv_signed4(uint32_t m, uint32_t sg, float qf[4]) {
  qf[0] = mmv_signed(mmv_byte<0>(m, 0.0f), sg);
  qf[1] = mmv_signed(mmv_byte<1>(m, 0.0f), sg >> 1);
  qf[2] = mmv_signed(mmv_byte<2>(m, 0.0f), sg >> 2);
  qf[3] = mmv_signed(mmv_byte<3>(m, 0.0f), sg >> 3);
}

// The four bytes of q as floats minus bias (mmv_byte), into qf.
__host__ __device__ __forceinline__ void mmv_bytes4(uint32_t q, float bias, float qf[4]) {
  qf[0] = mmv_byte<0>(q, bias);
  qf[1] = mmv_byte<1>(q, bias);
  qf[2] = mmv_byte<2>(q, bias);
  qf[3] = mmv_byte<3>(q, bias);
}

// How a format's weight follows from its quant q (mmv_quants4): q itself (the float formats),
// sc * q, or fmaf(sc, q, off) (a min or an offset; Q5_0's offset is +0, as the CPU adds its m = 0).
enum { MMV_DIRECT, MMV_SCALED, MMV_OFFSET };
template <uint32_t TYPE> __host__ __device__ constexpr int mmv_form() {
  return TYPE == ST_TYPE_F32 || TYPE == ST_TYPE_F16 || TYPE == ST_TYPE_BF16 ? MMV_DIRECT
         : TYPE == ST_TYPE_Q4_1 || TYPE == ST_TYPE_Q5_1 || TYPE == ST_TYPE_Q5_0 || TYPE == ST_TYPE_Q4_K ||
                 TYPE == ST_TYPE_Q5_K || TYPE == ST_TYPE_Q2_K || TYPE == ST_TYPE_IQ1_S || TYPE == ST_TYPE_IQ1_M
             ? MMV_OFFSET
             : MMV_SCALED;
}
// Whether the mat-vec applies the scale once to the sum of the four quants' products (mmv_dot4):
// the formats whose weight is the scale times the quant (Q5_0's offset is 0).
template <uint32_t TYPE> __host__ __device__ constexpr bool mmv_folds() {
  return mmv_form<TYPE>() == MMV_SCALED || TYPE == ST_TYPE_Q5_0;
}

// The quants of weights o .. o + 3 of the chunk at ch (o a multiple of 4), exact small integers or
// table values as floats (the float formats: the weights), and the sc, off that make them weights
// (mmv_form) as qscale, qoff, from their sub-block's scales s0, s1. kv: IQ4_XS's and IQ4_NL's value
// table as floats.
template <uint32_t TYPE>
__host__ __device__ __forceinline__ void mmv_quants4(const uint8_t *ch, int o, float s0, float s1, const float *kv,
                                                     float qf[4], float &qscale, float &qoff) {
  constexpr int BS = mmv_format<TYPE>::BS;
  if constexpr (TYPE == ST_TYPE_F32) { // the weights as they are (4-byte aligned)
    const float *f = (const float *)(ch + 4 * o);
    qf[0] = f[0];
    qf[1] = f[1];
    qf[2] = f[2];
    qf[3] = f[3];
    qscale = 1.0f;
  } else if constexpr (TYPE == ST_TYPE_F16 || TYPE == ST_TYPE_BF16) { // 2-byte aligned halves
    const uint16_t *h = (const uint16_t *)(ch + 2 * o);
#pragma unroll
    for (int i = 0; i < 4; i++)
      qf[i] = TYPE == ST_TYPE_F16 ? mmv_f16((const uint8_t *)(h + i)) : mmv_as_float((uint32_t)h[i] << 16);
    qscale = 1.0f;
  } else if constexpr (TYPE == ST_TYPE_Q8_0) {
    const uint32_t q = mmv_u32_a2(ch + (o >> 5) * BS + 2 + (o & 31)) ^ 0x80808080u; // int8 + 128
    mmv_bytes4(q, 128.0f, qf);
    qscale = s0;
  } else if constexpr (TYPE == ST_TYPE_Q4_0) {
    const int j = o & 31; // weights 0..15: low nibbles of qs[0..15]; 16..31: high nibbles
    const uint32_t q = (mmv_u32_a2(ch + (o >> 5) * BS + 2 + (j & 15)) >> ((j & 16) >> 2)) & 0x0F0F0F0Fu;
    mmv_bytes4(q, 8.0f, qf);
    qscale = s0;
  } else if constexpr (TYPE == ST_TYPE_Q4_K || TYPE == ST_TYPE_Q5_K) {
    // qs[32 (r / 64) + r % 32]: low nibble for the first 32 of each 64 weights, high for the next
    const uint8_t *b = ch + (o >> 8) * BS;
    const int r = o & 255;
    const int qsoff = TYPE == ST_TYPE_Q4_K ? 16 : 48;
    uint32_t q = (mmv_u32(b + qsoff + 32 * (r >> 6) + (r & 31)) >> ((r & 32) >> 3)) & 0x0F0F0F0Fu;
    if constexpr (TYPE == ST_TYPE_Q5_K) q |= ((mmv_u32(b + 16 + (r & 31)) >> (r >> 5)) & 0x01010101u) << 4;
    mmv_bytes4(q, 0.0f, qf);
    qscale = s0;
    qoff = -s1;
  } else if constexpr (TYPE == ST_TYPE_Q6_K) {
    // per 128 weights: ql[64] (quarters 0/1 low nibbles of ql[0..31]/ql[32..63], 2/3 high), qh[32]
    const uint8_t *b = ch + (o >> 8) * BS;
    const int r = o & 255, h = r >> 7, quarter = (r >> 5) & 3, l = r & 31;
    const uint32_t ql = mmv_u32_a2(b + 64 * h + 32 * (quarter & 1) + l),
                   qh = mmv_u32_a2(b + 128 + 32 * h + l);
    const uint32_t q =
        ((ql >> (4 * (quarter >> 1))) & 0x0F0F0F0Fu) | (((qh >> (2 * quarter)) & 0x03030303u) << 4);
    mmv_bytes4(q, 32.0f, qf);
    qscale = l < 16 ? s0 : s1;
  } else if constexpr (TYPE == ST_TYPE_IQ4_XS || TYPE == ST_TYPE_IQ4_NL) {
    // per 32 weights 16 bytes of qs, laid out as Q4_0's (IQ4_XS: 8 sub-blocks after 8 bytes of
    // scales; IQ4_NL: one block after its scale)
    const int r = TYPE == ST_TYPE_IQ4_XS ? o & 255 : o & 31, j = r & 31;
    const uint8_t *qs = TYPE == ST_TYPE_IQ4_XS ? ch + (o >> 8) * BS + 8 + 16 * (r >> 5) : ch + (o >> 5) * BS + 2;
    const uint32_t q = (mmv_u32_at<TYPE>(qs + (j & 15)) >> ((j & 16) >> 2)) & 0x0F0F0F0Fu;
    qf[0] = kv[q & 15];
    qf[1] = kv[(q >> 8) & 15];
    qf[2] = kv[(q >> 16) & 15];
    qf[3] = kv[q >> 24];
    qscale = s0;
  } else if constexpr (TYPE == ST_TYPE_MXFP4) { // 16 bytes of codes after e, laid out as Q4_0's
    const int j = o & 31;
    const uint8_t *qs = ch + (o >> 5) * BS + 1 + (j & 15);
    const int sh = (j & 16) >> 2;
    qf[0] = kv[(qs[0] >> sh) & 15];
    qf[1] = kv[(qs[1] >> sh) & 15];
    qf[2] = kv[(qs[2] >> sh) & 15];
    qf[3] = kv[(qs[3] >> sh) & 15];
    qscale = s0;
  } else if constexpr (TYPE == ST_TYPE_Q1_0) { // bit j of the block: +1 or -1
    const int j = o & 127;
    const uint32_t bits = (ch[(o >> 7) * BS + 2 + (j >> 3)] >> (j & 4)) & 0xFu;
    mmv_bytes4(((bits * 0x00204081u) & 0x01010101u) << 1, 1.0f, qf); // 2 bit - 1
    qscale = s0;
  } else if constexpr (TYPE == ST_TYPE_Q2_0) { // 2 bits a weight, 4 to a byte: q - 1
    const uint32_t q = ch[(o >> 6) * BS + 2 + ((o & 63) >> 2)];
    mmv_bytes4((q | q << 6 | q << 12 | q << 18) & 0x03030303u, 1.0f, qf);
    qscale = s0;
  } else if constexpr (TYPE == ST_TYPE_TQ2_0) { // weight 128 g + 32 l + m: bits 2 l of byte 32 g + m, q - 1
    const int r = o & 255;
    const uint32_t w = mmv_u32_a2(ch + (o >> 8) * BS + 32 * (r >> 7) + (r & 31));
    mmv_bytes4((w >> (2 * ((r >> 5) & 3))) & 0x03030303u, 1.0f, qf);
    qscale = s0;
  } else if constexpr (TYPE == ST_TYPE_TQ1_0) { // trit n of a byte (5 per byte in qs, 4 in qh): q - 1
    const int r = o & 255;
    int byte, n;
    if (r < 160) byte = r & 31, n = r >> 5;
    else if (r < 240) byte = 32 + ((r - 160) & 15), n = (r - 160) >> 4;
    else byte = 48 + ((r - 240) & 3), n = (r - 240) >> 2;
    const uint32_t p3 = n == 0 ? 1u : n == 1 ? 3u : n == 2 ? 9u : n == 3 ? 27u : 81u;
    const uint8_t *b = ch + (o >> 8) * BS + byte;
    uint32_t q = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) q |= (((b[i] * p3) & 0xFFu) * 3u >> 8) << (8 * i);
    mmv_bytes4(q, 1.0f, qf);
    qscale = s0;
  } else if constexpr (TYPE == ST_TYPE_IQ2_XXS) {
    // group l = (r / 8) % 4 of sub-block r / 32: grid entry qs byte 8 ib + l (8 magnitudes), signs
    // the 7-bit field l of the sub-block's second word; these 4 weights are its half (r / 4) % 2
    const uint8_t *b = ch + (o >> 8) * BS;
    const int r = o & 255, ib = r >> 5, l = (r >> 3) & 3, hf = (r >> 2) & 1;
    const uint64_t grid = MMV_GRID(iq2xxs_grid)[b[2 + 8 * ib + l]];
    const uint32_t m = (uint32_t)(grid >> (32 * hf));
    const uint32_t sg = mmv_iq_signs((mmv_u32_a2(b + 2 + 8 * ib + 4) >> (7 * l)) & 127) >> (4 * hf);
    mmv_signed4(m, sg, qf);
    qscale = s0;
  } else if constexpr (TYPE == ST_TYPE_IQ1_S || TYPE == ST_TYPE_IQ1_M) {
    // group l of sub-block ib: grid entry (8 values of -1, 0, +1) from an index byte and 3 high
    // bits; weight = dl (q + delta), dl per 32 (IQ1_S) or 16 (IQ1_M) weights, delta +-1/8 per
    // sub-block (IQ1_S, in s1 = dl delta) or per group (IQ1_M: bit 3 of the group's qh nibble)
    const uint8_t *b = ch + (o >> 8) * BS;
    const int r = o & 255, ib = r >> 5, l = (r >> 3) & 3, hf = (r >> 2) & 1;
    uint64_t grid;
    if constexpr (TYPE == ST_TYPE_IQ1_S) {
      const uint32_t qh = *(const uint16_t *)(b + 34 + 2 * ib);
      grid = MMV_GRID(iq1s_grid)[b[2 + 4 * ib + l] | ((qh >> (3 * l)) & 7) << 8];
      qscale = s0;
      qoff = s1;
    } else {
      const uint32_t h = b[32 + 2 * ib + l / 2] >> (4 * (l % 2));
      grid = MMV_GRID(iq1s_grid)[b[4 * ib + l] | (h & 7) << 8];
      qscale = l < 2 ? s0 : s1;
      qoff = qscale * (h & 8 ? -0.125f : 0.125f);
    }
    mmv_bytes4((uint32_t)(grid >> (32 * hf)) ^ 0x80808080u, 128.0f, qf); // int8 -1, 0, +1
  } else if constexpr (TYPE == ST_TYPE_Q4_1) { // qs after d and m, laid out as Q4_0's
    const int j = o & 31;
    const uint32_t q = (mmv_u32(ch + (o >> 5) * BS + 4 + (j & 15)) >> ((j & 16) >> 2)) & 0x0F0F0F0Fu;
    mmv_bytes4(q, 0.0f, qf);
    qscale = s0;
    qoff = s1;
  } else if constexpr (TYPE == ST_TYPE_Q5_0 || TYPE == ST_TYPE_Q5_1) {
    // the low nibbles as Q4_0's; the fifth bit of weight j is bit j of qh, the 4 bytes after the
    // scales: bits j .. j + 3 spread to bit 4 of bytes 0..3 by one multiply (no carries)
    constexpr int H = TYPE == ST_TYPE_Q5_0 ? 2 : 4;
    const uint8_t *b = ch + (o >> 5) * BS;
    const int j = o & 31;
    const uint32_t lo = (mmv_u32_at<TYPE>(b + H + 4 + (j & 15)) >> ((j & 16) >> 2)) & 0x0F0F0F0Fu;
    const uint32_t hi = ((((mmv_u32_at<TYPE>(b + H) >> j) & 0xFu) * 0x00204081u) & 0x01010101u) << 4;
    const uint32_t q = lo | hi;
    const float bias = TYPE == ST_TYPE_Q5_0 ? 16.0f : 0.0f;
    mmv_bytes4(q, bias, qf); // Q5_0: s1 = +0, as the CPU adds its m = 0
    qscale = s0;
    qoff = s1;
  } else if constexpr (TYPE == ST_TYPE_Q2_K || TYPE == ST_TYPE_Q3_K) {
    // per 128 weights 32 bytes of 2-bit quants (Q2_K's after 16 bytes of scales, Q3_K's after the
    // 32 bytes of hmask), weights 32 s + [0, 32) of them in bits 2 s of bytes 0..31; Q3_K's third
    // bit (clear: minus 4) is bit 4 (r / 128) + s of hmask[r % 32]. Scale r / 16 per 16 weights.
    const uint8_t *b = ch + (o >> 8) * BS;
    const int r = o & 255, n = r >> 7, s = (r >> 5) & 3;
    constexpr int Q = TYPE == ST_TYPE_Q2_K ? 16 : 32;
    uint32_t q = (mmv_u32_at<TYPE>(b + Q + 32 * n + (r & 31)) >> (2 * s)) & 0x03030303u;
    if constexpr (TYPE == ST_TYPE_Q2_K) {
      const uint32_t sc = b[r >> 4];
      const float dl = s0 * mmv_byte<0>(sc & 0xFu, 0.0f), ml = s1 * mmv_byte<0>(sc >> 4, 0.0f);
      mmv_bytes4(q, 0.0f, qf);
      qscale = dl;
      qoff = -ml;
    } else {
      q |= ((mmv_u32_a2(b + (r & 31)) >> (4 * n + s)) & 0x01010101u) << 2;
      const float dl = r & 16 ? s1 : s0;
      mmv_bytes4(q, 4.0f, qf);
      qscale = dl;
    }
  } else if constexpr (TYPE == ST_TYPE_IQ2_XS || TYPE == ST_TYPE_IQ2_S) {
    // group g = r / 8: a grid entry of 8 magnitudes and a sign byte (IQ2_XS: the uint16 qs[g],
    // 9-bit index | 7 sign bits << 9; IQ2_S: index byte qs[g] and 2 top bits in qh[r / 32], sign
    // byte qs[32 + g]); these 4 weights are its half (r / 4) % 2
    const uint8_t *b = ch + (o >> 8) * BS;
    const int r = o & 255, g = r >> 3, hf = (r >> 2) & 1;
    uint64_t grid;
    uint32_t signs;
    if constexpr (TYPE == ST_TYPE_IQ2_XS) {
      const uint32_t q = *(const uint16_t *)(b + 2 + 2 * g);
      grid = MMV_GRID(iq2xs_grid)[q & 511];
      signs = mmv_iq_signs(q >> 9);
    } else {
      grid = MMV_GRID(iq2s_grid)[b[2 + g] | ((b[66 + (r >> 5)] >> (2 * (g & 3))) & 3) << 8];
      signs = b[34 + g];
    }
    const uint32_t m = (uint32_t)(grid >> (32 * hf)), sg = signs >> (4 * hf);
    const float dl = r & 16 ? s1 : s0;
    mmv_signed4(m, sg, qf);
    qscale = dl;
  } else if constexpr (TYPE == ST_TYPE_IQ3_XXS || TYPE == ST_TYPE_IQ3_S) {
    // one grid entry of 4 magnitudes per 4 weights, index byte qs[r / 4] (IQ3_S: ninth bit
    // (r / 4) % 8 of qh[r / 32]); signs: IQ3_XXS's 7-bit field (r / 8) % 4 of the sub-block's
    // uint32, IQ3_S's nibble (r / 4) % 2 of signs[r / 8]
    const uint8_t *b = ch + (o >> 8) * BS;
    const int r = o & 255, k = (r >> 2) & 7;
    uint32_t m, sg;
    if constexpr (TYPE == ST_TYPE_IQ3_XXS) {
      m = MMV_GRID(iq3xxs_grid)[b[2 + (r >> 2)]];
      sg = mmv_iq_signs((mmv_u32_a2(b + 66 + 4 * (r >> 5)) >> (7 * ((r >> 3) & 3))) & 127) >> (4 * (k & 1));
    } else {
      m = MMV_GRID(iq3s_grid)[b[2 + (r >> 2)] | ((b[66 + (r >> 5)] >> k) & 1) << 8];
      sg = b[74 + (r >> 3)] >> (4 * (k & 1));
    }
    mmv_signed4(m, sg, qf);
    qscale = s0;
  }
  (void)s1;
  (void)kv;
}

// Weights o .. o + 3 of the chunk at ch, with their sub-block's scales, bit for bit as
// st_dequantize_row computes them: a scale times a quant is exact in float32 (an fp16 scale, or one
// times an integer of at most 6 bits, times at most 6 bits), so an fma with the min or offset
// rounds as the CPU's product-then-add does.
template <uint32_t TYPE>
__host__ __device__ __forceinline__ void mmv_weights4(const uint8_t *ch, int o, float s0, float s1,
                                                      const float *kv, float w[4]) {
  float q[4], sc = 1.0f, off = 0.0f;
  mmv_quants4<TYPE>(ch, o, s0, s1, kv, q, sc, off);
#pragma unroll
  for (int i = 0; i < 4; i++)
    w[i] = mmv_form<TYPE>() == MMV_DIRECT ? q[i] : mmv_form<TYPE>() == MMV_SCALED ? sc * q[i] : fmaf(sc, q[i], off);
}

// acc plus weights o .. o + 3 of the chunk at ch times v: the scale applied once to the four
// products' sum where mmv_folds (fewer instructions per weight; a rounding of its own), else each
// decoded weight's fma.
template <uint32_t TYPE>
__host__ __device__ __forceinline__ float mmv_dot4(const uint8_t *ch, int o, float s0, float s1, const float *kv,
                                                   float4 v, float acc) {
  if constexpr (mmv_folds<TYPE>()) {
    float q[4], sc = 1.0f, off = 0.0f;
    mmv_quants4<TYPE>(ch, o, s0, s1, kv, q, sc, off);
    return fmaf(sc, fmaf(q[0], v.x, fmaf(q[1], v.y, fmaf(q[2], v.z, q[3] * v.w))), acc);
  } else {
    float w[4];
    mmv_weights4<TYPE>(ch, o, s0, s1, kv, w);
    return fmaf(w[0], v.x, fmaf(w[1], v.y, fmaf(w[2], v.z, fmaf(w[3], v.w, acc))));
  }
}

#ifdef __CUDACC__
// ---- int8 activations for Q8_0 weights (STRATA_INT8_DOT on a GPU; common.cuh's layout) -------
// The 32 quants of the Q8_0 block at blk (2-byte aligned: they start 2 bytes into it, so its
// 4-byte words are shifted by 0 or 2) as 8 words, and the exact integer sum of their products
// with the activation quants xa, xb (__dp4a).
__device__ __forceinline__ void mmv_q8_words(const uint8_t *blk, uint32_t (&qw)[8]) {
  const uintptr_t p = (uintptr_t)(blk + 2);
  const uint32_t *wp = (const uint32_t *)(p & ~(uintptr_t)3);
  const uint32_t sel = p & 2 ? 0x5432u : 0x3210u;
  uint32_t w[9];
#pragma unroll
  for (int i = 0; i < 9; i++) w[i] = wp[i];
#pragma unroll
  for (int i = 0; i < 8; i++) qw[i] = __byte_perm(w[i], w[i + 1], sel);
}
__device__ __forceinline__ int mmv_q8_dot(const uint32_t (&qw)[8], int4 xa, int4 xb) {
  int s = __dp4a((int)qw[0], xa.x, 0);
  s = __dp4a((int)qw[1], xa.y, s);
  s = __dp4a((int)qw[2], xa.z, s);
  s = __dp4a((int)qw[3], xa.w, s);
  s = __dp4a((int)qw[4], xb.x, s);
  s = __dp4a((int)qw[5], xb.y, s);
  s = __dp4a((int)qw[6], xb.z, s);
  return __dp4a((int)qw[7], xb.w, s);
}

// mmv_chunk_rows for Q8_0 weights and a quantised activation row (xq, xd: the chunk's quants and
// scales, in shared memory when XS, else global and read-only): lane l takes block l of the chunk, the exact integer sum s of its 32
// weight quants times the activation quants, then acc = fmaf(d_w * d_x, s, acc), as the CPU's int8
// kernel scales each block's sums (dot.h); the lanes past nw weights add nothing. ch: staged in
// shared memory.
template <int NR, bool XS>
__device__ __forceinline__ void mmv_chunk_rows_q8(const uint8_t *const (&ch)[NR], int nw, const int8_t *xq, const float *xd,
                                                  float (&acc)[NR]) {
  const int lane = threadIdx.x & 31;
  if (32 * lane >= nw) return;
  const int4 *xv = (const int4 *)(xq + 32 * lane);
  const int4 xa = XS ? xv[0] : __ldg(xv), xb = XS ? xv[1] : __ldg(xv + 1);
  const float dx = XS ? xd[lane] : __ldg(xd + lane);
#pragma unroll
  for (int q = 0; q < NR; q++) {
    const uint8_t *blk = ch[q] + 34 * lane;
    uint32_t qw[8];
    mmv_q8_words(blk, qw);
    acc[q] = fmaf(mmv_f16(blk) * dx, (float)mmv_q8_dot(qw, xa, xb), acc[q]);
  }
}

// MXFP4's doubled E2M1 magnitudes as int8 bytes (quant.c st_kvalues_mxfp4, codes 0..7), four to a word;
// codes 8..15 are their negations.
#define MMV_MXFP4_LEV0 0x03020100u /* 0 1 2 3 */
#define MMV_MXFP4_LEV1 0x0C080604u /* 4 6 8 12 */

// PTX prmt in its default mode: byte i of the result is byte (s >> 4i) & 7 of the pair (a, b), or,
// where bit 3 of that nibble is set, that byte's sign bit replicated over all 8 bits. The table's
// magnitudes are all below 128, so a code whose bit 3 (its sign) is set reads 0 here.
__device__ __forceinline__ uint32_t mmv_prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
}

// The exact integer sum of 8 MXFP4 codes c (nibble i: code i) times the int8 quants xa (bytes: the
// quants of codes 0..3) and xb (codes 4..7), in two dp4a chains: the positive codes' magnitudes
// (one prmt per four codes, the negative ones read 0) into sp, the negative codes' into sn (the
// codes with their sign flipped), so that the sum is sp - sn.
__device__ __forceinline__ void mmv_mxfp4_dot8(uint32_t c, uint32_t xa, uint32_t xb, int &sp, int &sn) {
  const uint32_t f = c ^ 0x88888888u;
  sp = __dp4a((int)mmv_prmt(MMV_MXFP4_LEV0, MMV_MXFP4_LEV1, c), (int)xa, sp);
  sn = __dp4a((int)mmv_prmt(MMV_MXFP4_LEV0, MMV_MXFP4_LEV1, f), (int)xa, sn);
  sp = __dp4a((int)mmv_prmt(MMV_MXFP4_LEV0, MMV_MXFP4_LEV1, c >> 16), (int)xb, sp);
  sn = __dp4a((int)mmv_prmt(MMV_MXFP4_LEV0, MMV_MXFP4_LEV1, f >> 16), (int)xb, sn);
}

// mmv_chunk_rows_q8 for MXFP4 weights: lane l takes block l of the chunk (17 bytes: the E8M0 scale e,
// then 16 bytes of codes, code j's low nibble weight j and high nibble weight j + 16, at any
// alignment in shared memory: read as 4-byte words and funnel-shifted). A 16-bit half of the codes
// holds the nibbles of weights (a, a + 16, a + 1, a + 17); the activation quants are permuted into
// the same order once per lane for all NR rows, and mmv_mxfp4_dot8 gives the exact integer sum s of
// the block's 32 products; then acc = fmaf(2^(e - 128) d_x, s, acc), as the CPU's int8 MXFP4
// kernel scales each block's sum (dot_b32.c).
template <int NR, bool XS>
__device__ __forceinline__ void mmv_chunk_rows_q8_mxfp4(const uint8_t *const (&ch)[NR], int nw, const int8_t *xq,
                                                        const float *xd, float (&acc)[NR]) {
  const int lane = threadIdx.x & 31;
  if (32 * lane >= nw) return;
  const int4 *xv = (const int4 *)(xq + 32 * lane);
  const int4 xa = XS ? xv[0] : __ldg(xv), xb = XS ? xv[1] : __ldg(xv + 1);
  const float dx = XS ? xd[lane] : __ldg(xd + lane);
  const uint32_t lo[4] = {(uint32_t)xa.x, (uint32_t)xa.y, (uint32_t)xa.z, (uint32_t)xa.w};
  const uint32_t hi[4] = {(uint32_t)xb.x, (uint32_t)xb.y, (uint32_t)xb.z, (uint32_t)xb.w};
  uint32_t xp[8]; // word i's halves: the quants of weights (4i, 4i + 16, 4i + 1, 4i + 17), (4i + 2, ..)
#pragma unroll
  for (int i = 0; i < 4; i++) xp[2 * i] = __byte_perm(lo[i], hi[i], 0x5140u), xp[2 * i + 1] = __byte_perm(lo[i], hi[i], 0x7362u);
#pragma unroll
  for (int q = 0; q < NR; q++) {
    const uint8_t *blk = ch[q] + 17 * lane;
    const uintptr_t p = (uintptr_t)(blk + 1);
    const uint32_t *wp = (const uint32_t *)(p & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)(p & 3) * 8;
    uint32_t w[5];
#pragma unroll
    for (int i = 0; i < 5; i++) w[i] = wp[i]; // the staging buffer holds the bytes past a chunk's last block
    int sp = 0, sn = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) mmv_mxfp4_dot8(__funnelshift_r(w[i], w[i + 1], sh), xp[2 * i], xp[2 * i + 1], sp, sn);
    const uint32_t e = blk[0];
    acc[q] = fmaf(mmv_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23) * dx, (float)(sp - sn), acc[q]);
  }
}

// The same for one staged row and nt <= TT quantised token rows in global memory, ldq bytes apart
// (xq, xd: token 0's quants and scales of the chunk): the chain of mmv_chunk_rows_q8 per token.
template <int TT>
__device__ __forceinline__ void mmv_chunk_q8(const uint8_t *ch, int nw, const int8_t *xq, const float *xd, int64_t ldq,
                                             int nt, float (&acc)[TT]) {
  const int lane = threadIdx.x & 31;
  if (32 * lane >= nw) return;
  const uint8_t *blk = ch + 34 * lane;
  uint32_t qw[8];
  mmv_q8_words(blk, qw);
  const float dw = mmv_f16(blk);
#pragma unroll
  for (int t = 0; t < TT; t++)
    if (t < nt) {
      const int4 *xt = (const int4 *)(xq + t * ldq + 32 * lane);
      const float dx = __ldg((const float *)((const int8_t *)xd + t * ldq) + lane);
      acc[t] = fmaf(dw * dx, (float)mmv_q8_dot(qw, __ldg(xt), __ldg(xt + 1)), acc[t]);
    }
}

// Shared memory of a block that runs mmv_block.
template <uint32_t TYPE, int TT> struct mmv_smem {
  uint4 stage[mmv_stage_segs<TYPE>()];   // the rows' staged bytes, row r at r * (its stride)
  const uint8_t *rows[MMV_ITEMS];        // the block's rows (set by the caller)
  const uint8_t *src[MMV_ITEMS];         // where each row's bytes of the current round start
  float red[MMV_ITEMS * TT];             // each item's warp sums
  float res[MMV_ITEMS * TT];             // the results: row r, token t at r * TT + t
  float kv[16];                          // IQ4_XS's, IQ4_NL's and MXFP4's values as floats
};

// IQ4_XS's, IQ4_NL's and MXFP4's value tables as floats in shared memory (every thread of the block calls it).
template <uint32_t TYPE> __device__ __forceinline__ void mmv_table(float *kv) {
  if constexpr (TYPE == ST_TYPE_IQ4_XS || TYPE == ST_TYPE_IQ4_NL) {
    if (threadIdx.x < 16) kv[threadIdx.x] = (float)st_dev_kvalues_iq4nl[threadIdx.x];
    __syncthreads();
  } else if constexpr (TYPE == ST_TYPE_MXFP4) {
    if (threadIdx.x < 16) kv[threadIdx.x] = (float)st_dev_kvalues_mxfp4[threadIdx.x];
    __syncthreads();
  }
}

// Copies the bytes [src[r], src[r] + len) of rows r < nr into the staging buffer, byte i of row r
// at 16 rs r + (src[r] & 15) + i: every 16-byte segment inside a range with one 16-byte load (all
// of them issued before the first store), the partial segments at a range's two ends 2 bytes at
// a time (rows are 2-byte aligned, len even).
template <int PER>
__device__ __forceinline__ void mmv_stage_rows(uint4 *stage, const uint8_t *const *src, int nr, int len, int rs) {
  constexpr int BATCH = PER < 4 ? PER : 4; // loads in flight per thread (registers: 4 per load)
#pragma unroll
  for (int j0 = 0; j0 < PER; j0 += BATCH) {
    uint4 v[BATCH];
#pragma unroll
    for (int j = 0; j < BATCH; j++) {
      const int i = threadIdx.x + MMV_THREADS * (j0 + j), r = i / rs, sg = i - r * rs;
      if (j0 + j < PER && r < nr) {
        const int a = (int)((uintptr_t)src[r] & 15);
        if (16 * sg >= a && 16 * sg + 16 <= a + len) v[j] = __ldcs((const uint4 *)(src[r] - a) + sg);
      }
    }
#pragma unroll
    for (int j = 0; j < BATCH; j++) {
      const int i = threadIdx.x + MMV_THREADS * (j0 + j), r = i / rs, sg = i - r * rs;
      if (j0 + j < PER && r < nr) {
        const int a = (int)((uintptr_t)src[r] & 15);
        if (16 * sg >= a && 16 * sg + 16 <= a + len) {
          stage[i] = v[j];
        } else if (16 * sg < a + len && 16 * sg + 16 > a) {
          const uint8_t *base = src[r] - a;
          uint16_t *dst = (uint16_t *)(stage + i);
          for (int b = max(16 * sg, a); b < min(16 * sg + 16, a + len); b += 2)
            dst[(b - 16 * sg) / 2] = *(const uint16_t *)(base + b);
        }
      }
    }
  }
}

// One warp's share of a row: acc[t] += the chunk at ch (nw weights, staged in shared memory) times
// x[t * ldx .. + nw] for t < nt, a per-lane fma chain (every lane of the warp calls it).
template <uint32_t TYPE, int TT>
__device__ __forceinline__ void mmv_chunk(const uint8_t *ch, int nw, const float *xc, int64_t ldx, int nt,
                                          const float *kv, float (&acc)[TT]) {
  const int lane = threadIdx.x & 31;
  float s0 = 0.0f, s1 = 0.0f;
  if (32 * lane < nw) mmv_scales<TYPE>(ch, lane, s0, s1);
#pragma unroll
  for (int k = 0; k < MMV_CH / 128; k++) {
    const int o = 128 * k + 4 * lane, sb = 4 * k + (lane >> 3);
    const float a0 = __shfl_sync(0xffffffffu, s0, sb);
    const float a1 = mmv_format<TYPE>::MIN ? __shfl_sync(0xffffffffu, s1, sb) : 0.0f;
    if (o < nw) {
#pragma unroll
      for (int t = 0; t < TT; t++)
        if (t < nt) acc[t] = mmv_dot4<TYPE>(ch, o, a0, a1, kv, *(const float4 *)(xc + t * ldx + o), acc[t]);
    }
  }
}

// The block core: res[r * TT + t] = dot(row sm.rows[r], x[t * ldx .. + n]) for r < nr (at most
// mmv_block_rows(n)), t < nt (<= TT). Every thread of the block calls it (it synchronises the
// block); sm.rows is set before, by the threads that read it here (threads r < nr) or before a
// barrier. x: 16-byte aligned rows, ldx a multiple of 4 (mmv_fits); global or shared memory. Q8
// (Q8_0 weights): x is quantised token rows in global memory, ldx bytes apart (st_q8_stride).
template <uint32_t TYPE, int TT, bool Q8 = false>
__device__ __forceinline__ void mmv_block(mmv_smem<TYPE, TT> &sm, int nr, int64_t n, const void *x, int64_t ldx,
                                          int nt) {
  constexpr int QK = mmv_format<TYPE>::QK, BS = mmv_format<TYPE>::BS, CB = mmv_chunk_bytes<TYPE>();
  constexpr int PER = (mmv_stage_segs<TYPE>() + MMV_THREADS - 1) / MMV_THREADS;
  const int S = mmv_slots(n), rs = (S * CB + 15) / 16 + 2;
  const int64_t nch = (n + MMV_CH - 1) / MMV_CH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, my_r = warp / S, my_s = warp % S;
  float acc[TT];
#pragma unroll
  for (int t = 0; t < TT; t++) acc[t] = 0.0f;
  for (int64_t c0 = 0; c0 < nch; c0 += S) {
    const int64_t w0 = c0 * MMV_CH, wn = min((int64_t)S * MMV_CH, n - w0);
    if (threadIdx.x < nr) sm.src[threadIdx.x] = sm.rows[threadIdx.x] + w0 / QK * BS;
    __syncthreads(); // src is set; every warp is done with the previous round's bytes
    mmv_stage_rows<PER>(sm.stage, sm.src, nr, (int)(wn / QK * BS), rs);
    __syncthreads();
    const int64_t c = c0 + my_s;
    if (my_r < nr && c < nch) { // warp-uniform
      const uint8_t *ch = (const uint8_t *)(sm.stage + my_r * rs) + ((uintptr_t)sm.src[my_r] & 15) + my_s * CB;
      const int nw = (int)min((int64_t)MMV_CH, n - c * MMV_CH);
      if constexpr (Q8) {
        static_assert(TYPE == ST_TYPE_Q8_0, "int8 activations pair with Q8_0 weights");
        const int8_t *xq = (const int8_t *)x;
        mmv_chunk_q8<TT>(ch, nw, xq + c * MMV_CH, (const float *)(xq + n) + c * (MMV_CH / 32), ldx, nt, acc);
      } else {
        mmv_chunk<TYPE, TT>(ch, nw, (const float *)x + c * MMV_CH, ldx, nt, sm.kv, acc);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < TT; t++) {
    const float v = st_warp_sum(acc[t]);
    if (lane == 0) sm.red[warp * TT + t] = v;
  }
  __syncthreads();
  if (threadIdx.x < nr * TT) {
    const int r = threadIdx.x / TT, t = threadIdx.x % TT;
    float sum = sm.red[r * S * TT + t];
    for (int sl = 1; sl < S; sl++) sum += sm.red[(r * S + sl) * TT + t];
    sm.res[threadIdx.x] = sum;
  }
  __syncthreads();
}

// ---- the streaming core (one token, rows of at most MMV_ITEMS chunks: one round) -------------
// A persistent block walks row groups g = blockIdx.x, + gridDim.x, ... (mmv_stream_rows(n) rows
// each) through two staging buffers: while its warps compute one group, the next one's bytes are in
// flight into the other buffer. One warp looks a group's rows up and starts their copies (on sm_90 one
// bulk copy a row, counted on the buffer's mbarrier, on which the warps then wait; before sm_90
// cp.async, and a block barrier), the last warp writes the results; one block barrier a group
// (every warp done with its buffer and its sums) is all the warps wait for together. Each row's sum
// is mmv_block's (the same chunks, chains, warp sums and slot order), bit for bit.

// Rows a warp takes in the streaming core: two for the packed formats (they share every activation
// load and the block's fixed costs), four for MXFP4 (a group of its 17-byte blocks is small: with
// four, gpt-oss-20b's 2,880-weight rows make 12 KB groups; bench/RESULTS.md 2026-12-06, -2.7 % of
// the decode step on an 8-layer cut, where four made Q8_0's 5 % slower), one for the float formats
// (their bytes fill the buffers). MMV_STREAM_NR_MAX bounds them (the pipe's per-row arrays).
#define MMV_STREAM_NR_MAX 4
template <uint32_t TYPE> __host__ __device__ constexpr int mmv_stream_nr() {
  return TYPE == ST_TYPE_MXFP4 ? 4 : mmv_format<TYPE>::BS < 2 * mmv_format<TYPE>::QK ? 2 : 1;
}
// Rows of a streaming group for rows of n weights.
template <uint32_t TYPE> __host__ __device__ __forceinline__ int mmv_stream_rows(int64_t n) {
  return mmv_stream_nr<TYPE>() * mmv_block_rows(n);
}
// Segments of one staging buffer, and the dynamic shared memory of the two (at its start).
template <uint32_t TYPE> __host__ __device__ constexpr int mmv_stream_segs() {
  return mmv_stream_nr<TYPE>() * mmv_stage_segs<TYPE>();
}
// The dynamic shared memory of mmv_stream: two buffers of rows.
template <uint32_t TYPE> __host__ __device__ constexpr size_t mmv_pipe_bytes() { return 2 * 16 * (size_t)mmv_stream_segs<TYPE>(); }

// The streaming core's shared state, per buffer b: the group's rows, input row and row count, the
// mbarrier its copies complete on, and its warps' sums.
template <uint32_t TYPE> struct mmv_pipe {
  uint64_t full[2];
  const uint8_t *rows[2][MMV_STREAM_NR_MAX * MMV_ITEMS];
  const void *x[2]; // float32 rows, or (Job::x_q8, or q8[b] set) quantised ones (common.cuh st_q8_stride)
  int nr[2];
  int q8[2]; // Job::x_q8_some: whether the group's x is a quantised row
  float red[2][MMV_STREAM_NR_MAX * MMV_ITEMS];
  float kv[16];
};

// A job tells the streaming core its groups (mmv_stream_rows(n) rows each at most; g < 2^31):
//   int count(int g)                rows of group g present (0: nothing to compute)
//   const uint8_t *row(int g, int r)   row r < count(g)
//   const void *x(int g)            the group's input row: n floats (16-byte aligned), or (x_q8) a
//                                   quantised row of st_q8_stride(n) bytes
//   pre_t pre(int g, int t)         the last warp's lane t calls it a group ahead of put(g) (after
//                                   wait()): the values its put reads from global memory (biases,
//                                   weights), so that their loads overlap a group's compute
//   void put(int g, Sum sum, int nr, int t, const pre_t &p)   the last warp's lane t (0..31)
//                                   calls it; sum(r) is row r's result (r < nr), which any lane
//                                   may ask for, any number of times; p: the lane's pre(g, t)
//   static constexpr bool static_rows   count and row read nothing a kernel still running may write
//                                       (the rows may be fetched before st_dev_griddep_wait)
//   static constexpr bool x_shared      x(g) points into shared memory (else global, read-only)
//   static constexpr bool x_q8          x(g) is a quantised activation row (Q8_0 or MXFP4 weights
//                                       only: mmv_chunk_rows_q8, mmv_chunk_rows_q8_mxfp4)
//   static constexpr bool x_q8_some     (Q8_0 weights only; not with x_q8 or x_shared) group g's x is a
//                                       quantised row where bool q8(int g) says so, else float32
//                                       rows: one launch for products that take their input either way
// count is called by every lane of one warp, row by its lanes r < count(g), x by its lane 0.

// One warp: group g's rows and input into buffer b (lanes r < R), and its copies started: every
// 16-byte aligned segment that holds bytes of row r, whole, at segment rs r of the buffer (so the
// row's byte i lies at 16 rs r + (its address & 15) + i). A misaligned row's first and last
// segments also carry up to 15 bytes before and after it, which no decoder reads: they lie in the
// same allocation (device allocations are at least 256-byte aligned, and mapped in granules that
// end on 16-byte boundaries), so the copies never fault. sm_90: one bulk copy a row, lane 0
// announcing their bytes on full[b] first (0 when the group has no rows); before: cp.async by the
// warp's lanes, one commit.
template <uint32_t TYPE, typename Job>
__device__ __forceinline__ void mmv_fetch(mmv_pipe<TYPE> &sm, uint4 *stage, const Job &job, int g, int b, int R, int len,
                                          int rs) {
  const int lane = threadIdx.x & 31;
  const int nr = job.count(g);
  const uint8_t *src = lane < nr && lane < R ? job.row(g, lane) : (const uint8_t *)NULL;
  if (src) sm.rows[b][lane] = src;
  if (lane == 0) {
    sm.nr[b] = nr;
    sm.x[b] = job.x(g);
    if constexpr (Job::x_q8_some) sm.q8[b] = job.q8(g);
  }
#if ST_DEV_BULK
  const int a = (int)((uintptr_t)src & 15), bytes = src ? (a + len + 15) / 16 * 16 : 0;
  const unsigned total = __reduce_add_sync(0xffffffffu, (unsigned)bytes);
  __syncwarp(); // the rows above are written before the arrival releases them
  if (lane == 0) st_dev_mbar_arrive_tx(&sm.full[b], total);
  __syncwarp();
  if (src) st_dev_bulk_copy(stage + lane * rs, src - a, (unsigned)bytes, &sm.full[b]);
#else
  __syncwarp();
  for (int r = 0; r < nr && r < R; r++) {
    const uint8_t *s = sm.rows[b][r];
    const int nseg = ((int)((uintptr_t)s & 15) + len + 15) / 16;
    for (int sg = lane; sg < nseg; sg += 32) st_dev_cp16(stage + r * rs + sg, (const uint4 *)(s - ((uintptr_t)s & 15)) + sg);
  }
  st_dev_cp_commit();
#endif
}

// Every thread: waits until buffer b's copies of its use `use` (0, 1, ...) have landed (fetcher:
// the warp that started them).
template <uint32_t TYPE> __device__ __forceinline__ void mmv_landed(mmv_pipe<TYPE> &sm, int b, int use, bool fetcher) {
#if ST_DEV_BULK
  (void)fetcher;
  st_dev_mbar_wait(&sm.full[b], (unsigned)use & 1u);
#else
  (void)use;
  if (fetcher) st_dev_cp_wait_prev(); // its newest group (the other buffer's) may fly on
  __syncthreads();
#endif
}

// mmv_chunk for NR rows sharing the activation loads, one token (the same chain per row).
template <uint32_t TYPE, int NR, bool XS>
__device__ __forceinline__ void mmv_chunk_rows(const uint8_t *const (&ch)[NR], int nw, const float *xc, const float *kv,
                                               float (&acc)[NR]) {
  const int lane = threadIdx.x & 31;
  float s0[NR], s1[NR];
#pragma unroll
  for (int q = 0; q < NR; q++) {
    s0[q] = s1[q] = 0.0f;
    if (32 * lane < nw) mmv_scales<TYPE>(ch[q], lane, s0[q], s1[q]);
  }
#pragma unroll
  for (int k = 0; k < MMV_CH / 128; k++) {
    const int o = 128 * k + 4 * lane, sb = 4 * k + (lane >> 3);
    float a0[NR], a1[NR];
#pragma unroll
    for (int q = 0; q < NR; q++) {
      a0[q] = __shfl_sync(0xffffffffu, s0[q], sb);
      a1[q] = mmv_format<TYPE>::MIN ? __shfl_sync(0xffffffffu, s1[q], sb) : 0.0f;
    }
    if (o < nw) {
      const float4 v = XS ? *(const float4 *)(xc + o) : __ldg((const float4 *)(xc + o));
#pragma unroll
      for (int q = 0; q < NR; q++) acc[q] = mmv_dot4<TYPE>(ch[q], o, a0[q], a1[q], kv, v, acc[q]);
    }
  }
}

#ifdef DK_KNOCKOUT
// The knockout build's device mask (scripts/build-decode-variants; decode.cu's device_init sets it
// from STRATA_KNOCKOUT): a job's ko_rows bit runs no group, its ko_compute bit computes none.
static __device__ int dk_ko;
#endif
// Runs the job's n_groups groups of rows of n (<= MMV_ITEMS * MMV_CH) weights. Every thread of the
// block calls it; stage: mmv_pipe_bytes of dynamic shared memory. wait() runs once before the first
// group is computed (and before the first group's rows are looked up unless Job::static_rows):
// st_dev_griddep_wait and the kernel's own prologue; started() right after the first groups'
// copies are started (work that may overlap them; a block barrier follows before the first compute).
template <uint32_t TYPE, typename Job, typename Wait, typename Started>
__device__ __forceinline__ void mmv_stream(mmv_pipe<TYPE> &sm, uint4 *stage, const Job &job, int n_groups, int64_t n,
                                           Wait wait, Started started) {
  constexpr int CB = mmv_chunk_bytes<TYPE>();
  constexpr int NR = mmv_stream_nr<TYPE>(), SEGS = mmv_stream_segs<TYPE>(), PUT = MMV_ITEMS - 1;
  static_assert(NR <= MMV_STREAM_NR_MAX && MMV_STREAM_NR_MAX * MMV_ITEMS <= 32, "a group's rows are one warp's lanes");
  const int S = mmv_slots(n), R = NR * (MMV_ITEMS / S), rs = (S * CB + 15) / 16 + 2;
  const int len = (int)(n / mmv_format<TYPE>::QK * mmv_format<TYPE>::BS);
  const int nch = (int)((n + MMV_CH - 1) / MMV_CH);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, my_r = NR * (warp / S), my_s = warp % S;
  const int G = gridDim.x;
  // the warp that looks rows up and starts copies: one with no chunk to compute where there is one
  // (slot S - 1 when the rows have fewer chunks than slots), else warp 0; the last warp, PUT,
  // writes the results (it has no chunk either in that case)
  const int FETCH = nch < S ? S - 1 : 0;
  int g = blockIdx.x;
#ifdef DK_KNOCKOUT
  if (dk_ko & Job::ko_rows) n_groups = 0;
  const bool ko_compute = (dk_ko & Job::ko_compute) != 0;
#else
  constexpr bool ko_compute = false;
#endif
  if (threadIdx.x == 0) {
    st_dev_mbar_init(&sm.full[0]);
    st_dev_mbar_init(&sm.full[1]);
  }
  if (!Job::static_rows) wait();
  __syncthreads(); // the mbarriers are set up
  if (warp == FETCH) {
    if (g < n_groups) mmv_fetch(sm, stage, job, g, 0, R, len, rs);
    if (g + G < n_groups) mmv_fetch(sm, stage + SEGS, job, g + G, 1, R, len, rs);
#if !ST_DEV_BULK
    else st_dev_cp_commit(); // an empty group: mmv_landed waits for all but the newest
#endif
  }
  if (Job::static_rows) wait();
  started();
  __syncthreads(); // what wait() and started() wrote to shared memory is seen
  typename Job::pre_t pc{};
  if (warp == PUT && g < n_groups) pc = job.pre(g, lane);
  for (int it = 0; g < n_groups; it++, g += G) {
    const int b = it & 1;
    mmv_landed(sm, b, it >> 1, warp == FETCH);
    const int nr = sm.nr[b];
    float acc[NR];
#pragma unroll
    for (int q = 0; q < NR; q++) acc[q] = 0.0f;
    if (!ko_compute && my_r < nr && my_s < nch) { // warp-uniform; a second row past nr repeats the first, unused
      const uint8_t *ch[NR];
#pragma unroll
      for (int q = 0; q < NR; q++) {
        const int r = my_r + q < nr ? my_r + q : my_r;
        ch[q] = (const uint8_t *)(stage + b * SEGS + r * rs) + ((uintptr_t)sm.rows[b][r] & 15) + my_s * CB;
      }
      const int nw = (int)min((int64_t)MMV_CH, n - (int64_t)my_s * MMV_CH);
      if constexpr (Job::x_q8) {
        static_assert(TYPE == ST_TYPE_Q8_0 || TYPE == ST_TYPE_MXFP4, "int8 activations pair with Q8_0 or MXFP4 weights");
        const int8_t *xq = (const int8_t *)sm.x[b];
        if constexpr (TYPE == ST_TYPE_MXFP4)
          mmv_chunk_rows_q8_mxfp4<NR, Job::x_shared>(ch, nw, xq + my_s * MMV_CH,
                                                     (const float *)(xq + n) + my_s * (MMV_CH / 32), acc);
        else
          mmv_chunk_rows_q8<NR, Job::x_shared>(ch, nw, xq + my_s * MMV_CH, (const float *)(xq + n) + my_s * (MMV_CH / 32),
                                               acc);
      } else if (Job::x_q8_some && sm.q8[b]) { // warp-uniform
        if constexpr (Job::x_q8_some) {
          static_assert(TYPE == ST_TYPE_Q8_0 && !Job::x_shared, "mixed inputs: Q8_0 weights, rows in global memory");
          const int8_t *xq = (const int8_t *)sm.x[b];
          mmv_chunk_rows_q8<NR, false>(ch, nw, xq + my_s * MMV_CH, (const float *)(xq + n) + my_s * (MMV_CH / 32), acc);
        }
      } else {
        mmv_chunk_rows<TYPE, NR, Job::x_shared>(ch, nw, (const float *)sm.x[b] + my_s * MMV_CH, sm.kv, acc);
      }
    }
#pragma unroll
    for (int q = 0; q < NR; q++) {
      const float v = st_warp_sum(acc[q]);
      if (lane == 0) sm.red[b][(warp / S) * NR * S + q * S + my_s] = v;
    }
    // every warp is done with buffer b, and its sums are in red[b] (next written two groups on,
    // after the next barrier, which the last warp reaches once it has read them)
    __syncthreads();
    if (warp == FETCH && g + 2 * G < n_groups) mmv_fetch(sm, stage + b * SEGS, job, g + 2 * G, b, R, len, rs);
#if !ST_DEV_BULK
    else if (warp == FETCH) st_dev_cp_commit(); // an empty group: mmv_landed waits for all but the newest
#endif
    if (warp == PUT) {
      const float *red = sm.red[b];
      job.put(g, [red, S](int r) {
        const float *rr = red + r * S;
        float sum = rr[0];
        for (int sl = 1; sl < S; sl++) sum += rr[sl];
        return sum;
      }, nr, lane, pc);
      if (g + G < n_groups) pc = job.pre(g + G, lane);
    }
  }
}
// Persistent blocks of `kernel` (MMV_THREADS threads, `smem` dynamic bytes) the device holds at once,
// at most per_sm an SM when per_sm > 0.
template <typename K> static int mmv_resident_blocks(K kernel, size_t smem, int per_sm = 0) {
  int dev = 0, sms = 0, per = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, MMV_THREADS, smem) != cudaSuccess || per < 1) {
    cudaGetLastError();
    return 132;
  }
  return sms * (per_sm > 0 && per_sm < per ? per_sm : per);
}

// Registers: 64 for a single token (4 blocks, 32 warps per SM), 128 for a batch. MMV_MIN_BLOCKS
// (a build knob, -DMMV_MIN_BLOCKS=5: 48 registers) asks more blocks of the single-token kernels: the
// Q8_0 streaming kernels then spill nothing, the MXFP4 int8 ones 28-36 bytes (not measured yet).
#ifndef MMV_MIN_BLOCKS
#define MMV_MIN_BLOCKS 4
#endif
#define MMV_BOUNDS(TT) __launch_bounds__(MMV_THREADS, (TT) == 1 ? MMV_MIN_BLOCKS : 2)

// Whether `type` has a specialised kernel usable here: n whole blocks, weights (and every row)
// aligned for its loads, activation rows 16-byte aligned and 4-float strided.
template <uint32_t TYPE>
static inline bool mmv_fits(uint64_t row_bytes, const void *W, const float *x, int64_t ldx, int64_t n) {
  constexpr int A = mmv_format<TYPE>::ALIGN;
  return n % mmv_format<TYPE>::QK == 0 && (uintptr_t)W % A == 0 && row_bytes % A == 0 &&
         ((uintptr_t)x & 15) == 0 && (ldx & 3) == 0;
}

#define MMV_TYPES(X)                                                                                         \
  X(ST_TYPE_Q4_K) X(ST_TYPE_Q6_K) X(ST_TYPE_Q8_0) X(ST_TYPE_Q5_K) X(ST_TYPE_IQ4_XS) X(ST_TYPE_Q4_0)           \
  X(ST_TYPE_Q4_1) X(ST_TYPE_Q5_0) X(ST_TYPE_Q5_1) X(ST_TYPE_IQ4_NL) X(ST_TYPE_Q2_K) X(ST_TYPE_Q3_K)           \
  X(ST_TYPE_IQ3_S) X(ST_TYPE_IQ3_XXS) X(ST_TYPE_IQ2_S) X(ST_TYPE_IQ2_XS) X(ST_TYPE_F32) X(ST_TYPE_F16)        \
  X(ST_TYPE_BF16) X(ST_TYPE_MXFP4) X(ST_TYPE_Q1_0) X(ST_TYPE_Q2_0) X(ST_TYPE_TQ1_0) X(ST_TYPE_TQ2_0)              \
  X(ST_TYPE_IQ2_XXS) X(ST_TYPE_IQ1_S) X(ST_TYPE_IQ1_M)

// Calls f(std::integral_constant<uint32_t, TYPE>()) for a type of MMV_TYPES known at run time;
// false (f not called) for another type.
template <typename F> static bool mmv_dispatch(uint32_t type, F &&f) {
  switch (type) {
#define MMV_CASE(TY)                                                                                         \
  case TY: f(std::integral_constant<uint32_t, TY>()); return true;
    MMV_TYPES(MMV_CASE)
#undef MMV_CASE
  default: return false;
  }
}

// Whether mmv_fits for a type known at run time.
static inline bool mmv_fits_any(uint32_t type, uint64_t row_bytes, const void *W, const float *x, int64_t ldx,
                                int64_t n) {
  switch (type) {
#define MMV_CASE(TY)                                                                                         \
  case TY: return mmv_fits<TY>(row_bytes, W, x, ldx, n);
    MMV_TYPES(MMV_CASE)
#undef MMV_CASE
  default: return false;
  }
}

// Whether the int8-activation kernels take a product (Q8_0 weights, n a multiple of 32): st_cuda_matmul's
// test, and the decode step's for its dense products (decode.cu dense_q8), so both paths quantise the same ones.
static inline bool mmv_q8_takes(uint32_t type, int64_t n) { return type == ST_TYPE_Q8_0 && n > 0 && n % 32 == 0; }

#ifdef MMV_LAUNCHERS
// st_cuda_matmul's product: block x takes rows r0 + R x + [0, R) (R = mmv_block_rows(n)), block y
// the token rows TT y + [0, TT). Q8: x is quantised (mmv_block), ldx in bytes.
template <uint32_t TYPE, int TT, bool Q8 = false>
__global__ void MMV_BOUNDS(TT)
    mmv_matmul_kernel(const uint8_t *W, uint64_t row_bytes, int64_t r0, int64_t nrows, const void *x, int64_t ldx,
                      int64_t T, int64_t n, float *out, int64_t ldo) {
  __shared__ mmv_smem<TYPE, TT> sm;
  mmv_table<TYPE>(sm.kv);
  const int64_t rb = (int64_t)blockIdx.x * mmv_block_rows(n), t0 = (int64_t)blockIdx.y * TT;
  const int nr = (int)min((int64_t)mmv_block_rows(n), nrows - rb), nt = (int)min((int64_t)TT, T - t0);
  if (threadIdx.x < nr) sm.rows[threadIdx.x] = W + (uint64_t)(r0 + rb + threadIdx.x) * row_bytes;
  const void *xt = Q8 ? (const void *)((const int8_t *)x + t0 * ldx) : (const void *)((const float *)x + t0 * ldx);
  mmv_block<TYPE, TT, Q8>(sm, nr, n, xt, ldx, nt);
  if (threadIdx.x < nr * TT) {
    const int r = threadIdx.x / TT, t = threadIdx.x % TT;
    if (t < nt) out[(t0 + t) * ldo + rb + r] = sm.res[threadIdx.x];
  }
}

// st_cuda_grouped_matmul's product, the same per group (blockIdx.z) and scaled as it is written.
template <uint32_t TYPE, int TT, bool Q8 = false>
__global__ void MMV_BOUNDS(TT)
    mmv_grouped_kernel(uint64_t row_bytes, const st_cuda_group *groups, int64_t n_out, const void *x, int64_t n,
                       const float *scale, float *out) {
  __shared__ mmv_smem<TYPE, TT> sm;
  const st_cuda_group g = groups[blockIdx.z];
  const int64_t rb = (int64_t)blockIdx.x * mmv_block_rows(n), t0 = (int64_t)blockIdx.y * TT;
  if (rb >= n_out || t0 >= g.n_rows) return; // the whole block
  mmv_table<TYPE>(sm.kv);
  const int nr = (int)min((int64_t)mmv_block_rows(n), n_out - rb), nt = (int)min((int64_t)TT, (int64_t)g.n_rows - t0);
  const int64_t row0 = g.row0 + t0, ldx = Q8 ? st_q8_stride(n) : n;
  if (threadIdx.x < nr) sm.rows[threadIdx.x] = g.W + (uint64_t)(rb + threadIdx.x) * row_bytes;
  const void *xt = Q8 ? (const void *)((const int8_t *)x + row0 * ldx) : (const void *)((const float *)x + row0 * ldx);
  mmv_block<TYPE, TT, Q8>(sm, nr, n, xt, ldx, nt);
  if (threadIdx.x < nr * TT) {
    const int r = threadIdx.x / TT, t = threadIdx.x % TT;
    if (t < nt) out[(row0 + t) * n_out + rb + r] = scale ? sm.res[threadIdx.x] * scale[row0 + t] : sm.res[threadIdx.x];
  }
}

// T token rows of n floats (x, ldx floats apart) quantised into xq (rows st_q8_stride(n) bytes
// apart): block (i, t) takes blocks 8 i .. 8 i + 7 of token t, one per warp.
__global__ void __launch_bounds__(MMV_THREADS) mmv_quantize_kernel(const float *x, int64_t ldx, int64_t n, int8_t *xq) {
  const int64_t t = blockIdx.y, b = (int64_t)blockIdx.x * (MMV_THREADS / 32) + (threadIdx.x >> 5);
  if (b >= n / 32) return; // warp-uniform
  int8_t *row = xq + t * st_q8_stride(n);
  st_dev_q8_row(x + t * ldx, (int)(n / 32), row, (float *)(row + n), (int)b, (int)(n / 32)); // block b alone
}


// Quantises T token rows (x, ldx floats apart) into xq (st_q8_stride(n) bytes a row), on stream.
static inline void mmv_quantize(const float *x, int64_t ldx, int64_t T, int64_t n, int8_t *xq, cudaStream_t stream) {
  const int wpb = MMV_THREADS / 32;
  mmv_quantize_kernel<<<dim3((unsigned)((n / 32 + wpb - 1) / wpb), (unsigned)T), MMV_THREADS, 0, stream>>>(x, ldx, n, xq);
}

// st_cuda_matmul through a specialised kernel; false (nothing queued) for another type or layout.
// xq (Q8_0 weights, mmv_q8_takes): x quantised by mmv_quantize, which the kernels then read.
static inline bool mmv_matmul(uint32_t type, const uint8_t *W, uint64_t row_bytes, int64_t r0, int64_t nrows,
                       const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo,
                       cudaStream_t stream, const int8_t *xq = NULL) {
  if (!mmv_fits_any(type, row_bytes, W + r0 * row_bytes, x, ldx, n)) return false;
  const int rb = mmv_block_rows(n);
  const unsigned gx = (unsigned)((nrows + rb - 1) / rb);
  if (xq && mmv_q8_takes(type, n)) {
    const int64_t ldq = st_q8_stride(n);
    if (T == 1)
      mmv_matmul_kernel<ST_TYPE_Q8_0, 1, true><<<dim3(gx, 1), MMV_THREADS, 0, stream>>>(W, row_bytes, r0, nrows, xq, ldq, T,
                                                                                       n, out, ldo);
    else
      mmv_matmul_kernel<ST_TYPE_Q8_0, MMV_TT, true><<<dim3(gx, (unsigned)((T + MMV_TT - 1) / MMV_TT)), MMV_THREADS, 0,
                                                      stream>>>(W, row_bytes, r0, nrows, xq, ldq, T, n, out, ldo);
    return true;
  }
  switch (type) {
#define MMV_CASE(TY)                                                                                         \
  case TY:                                                                                                   \
    if (T == 1)                                                                                              \
      mmv_matmul_kernel<TY, 1><<<dim3(gx, 1), MMV_THREADS, 0, stream>>>(W, row_bytes, r0, nrows, x, ldx, T, n,  \
                                                                         out, ldo);                          \
    else                                                                                                     \
      mmv_matmul_kernel<TY, MMV_TT><<<dim3(gx, (unsigned)((T + MMV_TT - 1) / MMV_TT)), MMV_THREADS, 0,          \
                                      stream>>>(W, row_bytes, r0, nrows, x, ldx, T, n, out, ldo);             \
    return true;
    MMV_TYPES(MMV_CASE)
#undef MMV_CASE
  default: return false;
  }
}

// st_cuda_grouped_matmul through a specialised kernel, or false. The groups' weights are device
// allocations plus whole rows or blocks (expert_rows.cu), so aligned as their blocks are. xq: as
// for mmv_matmul (the activation rows quantised, rows st_q8_stride(n) bytes apart).
static inline bool mmv_grouped(uint32_t type, uint64_t row_bytes, const st_cuda_group *groups_dev, int n_groups,
                        int max_rows, int64_t n_out, const float *x, int64_t n, const float *scale,
                        float *out, cudaStream_t stream, const int8_t *xq = NULL) {
  if (!mmv_fits_any(type, row_bytes, NULL, x, n, n)) return false;
  const int rb = mmv_block_rows(n);
  const unsigned gx = (unsigned)((n_out + rb - 1) / rb);
  if (xq && mmv_q8_takes(type, n)) {
    if (max_rows == 1)
      mmv_grouped_kernel<ST_TYPE_Q8_0, 1, true><<<dim3(gx, 1, (unsigned)n_groups), MMV_THREADS, 0, stream>>>(
          row_bytes, groups_dev, n_out, xq, n, scale, out);
    else
      mmv_grouped_kernel<ST_TYPE_Q8_0, MMV_TT, true><<<dim3(gx, (unsigned)((max_rows + MMV_TT - 1) / MMV_TT),
                                                            (unsigned)n_groups), MMV_THREADS, 0, stream>>>(
          row_bytes, groups_dev, n_out, xq, n, scale, out);
    return true;
  }
  switch (type) {
#define MMV_CASE(TY)                                                                                         \
  case TY:                                                                                                   \
    if (max_rows == 1)                                                                                       \
      mmv_grouped_kernel<TY, 1><<<dim3(gx, 1, (unsigned)n_groups), MMV_THREADS, 0, stream>>>(                  \
          row_bytes, groups_dev, n_out, x, n, scale, out);                                                   \
    else                                                                                                     \
      mmv_grouped_kernel<TY, MMV_TT><<<dim3(gx, (unsigned)((max_rows + MMV_TT - 1) / MMV_TT), (unsigned)n_groups), \
                                       MMV_THREADS, 0, stream>>>(row_bytes, groups_dev, n_out, x, n, scale, out); \
    return true;
    MMV_TYPES(MMV_CASE)
#undef MMV_CASE
  default: return false;
  }
}
#endif // MMV_LAUNCHERS
#endif
