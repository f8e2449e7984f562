/* Tensor element types and quantisation block layouts, described once for every backend.
 * Type numbers and block layouts are those of ggml (ggml.h `enum ggml_type`, ggml-common.h
 * block structs), so GGUF files written by llama.cpp and ik_llama.cpp load unchanged. */
#ifndef ST_QUANT_H
#define ST_QUANT_H

#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ggml_type numbers as stored in GGUF tensor infos. */
enum st_type {
  ST_TYPE_F32 = 0,
  ST_TYPE_F16 = 1,
  ST_TYPE_Q4_0 = 2,
  ST_TYPE_Q4_1 = 3,
  ST_TYPE_Q5_0 = 6,
  ST_TYPE_Q5_1 = 7,
  ST_TYPE_Q8_0 = 8,
  ST_TYPE_Q8_1 = 9,
  ST_TYPE_Q2_K = 10,
  ST_TYPE_Q3_K = 11,
  ST_TYPE_Q4_K = 12,
  ST_TYPE_Q5_K = 13,
  ST_TYPE_Q6_K = 14,
  ST_TYPE_Q8_K = 15,
  ST_TYPE_IQ2_XXS = 16,
  ST_TYPE_IQ2_XS = 17,
  ST_TYPE_IQ3_XXS = 18,
  ST_TYPE_IQ1_S = 19,
  ST_TYPE_IQ4_NL = 20,
  ST_TYPE_IQ3_S = 21,
  ST_TYPE_IQ2_S = 22,
  ST_TYPE_IQ4_XS = 23,
  ST_TYPE_I8 = 24,
  ST_TYPE_I16 = 25,
  ST_TYPE_I32 = 26,
  ST_TYPE_I64 = 27,
  ST_TYPE_F64 = 28,
  ST_TYPE_IQ1_M = 29,
  ST_TYPE_BF16 = 30,
  ST_TYPE_TQ1_0 = 34,
  ST_TYPE_TQ2_0 = 35,
  ST_TYPE_MXFP4 = 39,
  ST_TYPE_NVFP4 = 40,
  ST_TYPE_Q1_0 = 41,
  ST_TYPE_Q2_0 = 42,
  ST_TYPE_COUNT = 43,
};

/* Q8_0: 32 weights, one fp16 scale (ggml-common.h block_q8_0). */
#define ST_QK8_0 32
typedef struct {
  uint16_t d; /* fp16 scale */
  int8_t qs[ST_QK8_0];
} st_block_q8_0;
static_assert(sizeof(st_block_q8_0) == 2 + ST_QK8_0, "block_q8_0 size");

/* Legacy 32-weight blocks (ggml-common.h block_q4_0 ... block_q5_1). */
typedef struct {
  uint16_t d;
  uint8_t qs[16]; /* low nibbles: weights 0..15, high nibbles: 16..31; value - 8 */
} st_block_q4_0;
static_assert(sizeof(st_block_q4_0) == 18, "block_q4_0 size");
typedef struct {
  uint16_t d, m;
  uint8_t qs[16];
} st_block_q4_1;
static_assert(sizeof(st_block_q4_1) == 20, "block_q4_1 size");
typedef struct {
  uint16_t d;
  uint8_t qh[4]; /* the fifth bit of each weight */
  uint8_t qs[16];
} st_block_q5_0;
static_assert(sizeof(st_block_q5_0) == 22, "block_q5_0 size");
typedef struct {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
} st_block_q5_1;
static_assert(sizeof(st_block_q5_1) == 24, "block_q5_1 size");

/* K-quant super-blocks of 256 weights (ggml-common.h block_q2_K ... block_q6_K). */
#define ST_QK_K 256
typedef struct {
  uint8_t scales[16]; /* 4-bit scale (low) and min (high) per 16 weights */
  uint8_t qs[64];     /* 2-bit quants */
  uint16_t d, dmin;
} st_block_q2_K;
static_assert(sizeof(st_block_q2_K) == 84, "block_q2_K size");
typedef struct {
  uint8_t hmask[32];  /* high bit of each 3-bit quant */
  uint8_t qs[64];     /* low 2 bits */
  uint8_t scales[12]; /* 16 6-bit scales, packed */
  uint16_t d;
} st_block_q3_K;
static_assert(sizeof(st_block_q3_K) == 110, "block_q3_K size");
typedef struct {
  uint16_t d, dmin;
  uint8_t scales[12]; /* 8 6-bit scales and 8 6-bit mins, packed */
  uint8_t qs[128];    /* 4-bit quants */
} st_block_q4_K;
static_assert(sizeof(st_block_q4_K) == 144, "block_q4_K size");
typedef struct {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32]; /* fifth bits */
  uint8_t qs[128];
} st_block_q5_K;
static_assert(sizeof(st_block_q5_K) == 176, "block_q5_K size");
typedef struct {
  uint8_t ql[128];   /* low 4 bits */
  uint8_t qh[64];    /* high 2 bits */
  int8_t scales[16]; /* 8-bit scale per 16 weights */
  uint16_t d;
} st_block_q6_K;
static_assert(sizeof(st_block_q6_K) == 210, "block_q6_K size");

/* i-quants (ggml-common.h block_iq4_nl, block_iq4_xs, block_iq2_xs, block_iq2_s, block_iq3_xxs,
 * block_iq3_s). The grid formats store, per group of 8 (IQ2) or 4 (IQ3) weights, an index into a
 * grid of magnitude patterns (iq_grids.h) and, per 8 weights, a sign byte; a weight is
 * sub-block scale * magnitude * sign. */
#define ST_QK4_NL 32
typedef struct {
  uint16_t d;      /* fp16 scale */
  uint8_t qs[16];  /* 4-bit indices into st_kvalues_iq4nl: low nibbles weights 0..15, high 16..31 */
} st_block_iq4_nl;
static_assert(sizeof(st_block_iq4_nl) == 18, "block_iq4_nl size");
typedef struct {
  uint16_t d;          /* fp16 super-block scale */
  uint16_t scales_h;   /* high 2 bits of the 8 6-bit sub-block scales (scale - 32 multiplies d) */
  uint8_t scales_l[4]; /* low 4 bits of the sub-block scales, two per byte */
  uint8_t qs[128];     /* per 32 weights, 16 bytes laid out as IQ4_NL's */
} st_block_iq4_xs;
static_assert(sizeof(st_block_iq4_xs) == 136, "block_iq4_xs size");
typedef struct {
  uint16_t d;
  uint16_t qs[32];    /* per 8 weights: 9-bit index into st_iq2xs_grid | 7 sign bits << 9 */
  uint8_t scales[8];  /* per 32 weights, two 4-bit scales s (16 weights each): d * (0.5 + s) / 4 */
} st_block_iq2_xs;
static_assert(sizeof(st_block_iq2_xs) == 74, "block_iq2_xs size");
typedef struct {
  uint16_t d;
  uint8_t qs[64];     /* 32 low bytes of the 10-bit st_iq2s_grid indices, then 32 sign bytes */
  uint8_t qh[8];      /* per 32 weights, the indices' top 2 bits, 2 bits per group of 8 */
  uint8_t scales[8];  /* as IQ2_XS */
} st_block_iq2_s;
static_assert(sizeof(st_block_iq2_s) == 82, "block_iq2_s size");
typedef struct {
  uint16_t d;
  uint8_t qs[96]; /* 64 indices into st_iq3xxs_grid (one per 4 weights), then per 32 weights a
                   * uint32: four 7-bit sign fields | 4-bit scale s << 28 (d * (0.5 + s) / 2) */
} st_block_iq3_xxs;
static_assert(sizeof(st_block_iq3_xxs) == 98, "block_iq3_xxs size");
typedef struct {
  uint16_t d;
  uint8_t qs[64];    /* low bytes of the 9-bit st_iq3s_grid indices, one per 4 weights */
  uint8_t qh[8];     /* per 32 weights, the 8 indices' top bits */
  uint8_t signs[32]; /* one sign bit per weight */
  uint8_t scales[4]; /* 4-bit scale s per 32 weights, two per byte: d * (1 + 2 s) */
} st_block_iq3_s;
static_assert(sizeof(st_block_iq3_s) == 110, "block_iq3_s size");

/* IQ2_XXS (ggml-common.h block_iq2_xxs): 256 weights, d, then per 32 weights 8 bytes: four grid
 * indices (one byte each, into st_iq2xxs_grid, 8 magnitudes a group), then a 32-bit word with four
 * 7-bit sign fields (group l at bits 7 l, st_iq_signs) and a 4-bit scale s in bits 28..31: weights
 * d (0.5 + s) / 4 * magnitude * sign. */
typedef struct {
  uint16_t d;
  uint16_t qs[32];
} st_block_iq2_xxs;
static_assert(sizeof(st_block_iq2_xxs) == 66, "block_iq2_xxs size");
/* IQ1_S (block_iq1_s): 256 weights, d, the low 8 bits of 32 grid indices (st_iq1s_grid: 8 values
 * of {-1, 0, +1}), then per 32 weights a 16-bit word: the indices' high 3 bits (group l at bits
 * 3 l), a 3-bit scale s in bits 12..14 and the sign of the shift in bit 15: weights
 * d (2 s + 1) (value + shift), shift = -1/8 when bit 15 is set, else +1/8 (ST_IQ1_DELTA). */
#define ST_IQ1_DELTA 0.125f
typedef struct {
  uint16_t d;
  uint8_t qs[32];
  uint16_t qh[8];
} st_block_iq1_s;
static_assert(sizeof(st_block_iq1_s) == 50, "block_iq1_s size");
/* IQ1_M (block_iq1_m): 256 weights and no separate d: per 32 weights four index bytes and two qh
 * bytes (each: two groups' high 3 bits at bits 0..2 and 4..6, their shift signs at bits 3 and 7),
 * per 16 weights a 3-bit scale in `scales` (four 16-bit words, 6 bits per 32 weights), and the
 * fp16 d spread over the top nibbles of those four words (word k's bits 12..15 are d's bits
 * 4 k .. 4 k + 3). */
typedef struct {
  uint8_t qs[32];
  uint8_t qh[16];
  uint8_t scales[8];
} st_block_iq1_m;
static_assert(sizeof(st_block_iq1_m) == 56, "block_iq1_m size");

/* MXFP4 (ggml-common.h block_mxfp4, the OCP microscaling FP4 format): 32 weights, an E8M0 scale
 * byte e and 16 bytes of 4-bit E2M1 codes (low nibbles weights 0..15, high nibbles 16..31); weight
 * = st_kvalues_mxfp4[code] * 2^(e - 128) (ggml's GGML_E8M0_TO_FP32_HALF: the table holds twice
 * the E2M1 values). */
typedef struct {
  uint8_t e;
  uint8_t qs[16];
} st_block_mxfp4;
static_assert(sizeof(st_block_mxfp4) == 17, "block_mxfp4 size");
extern const int8_t st_kvalues_mxfp4[16];

/* 2^(e - 128) as a float (e = 0 and 1 give the subnormals 2^-128 and 2^-127), as ggml builds it. */
static inline float st_e8m0_to_f32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* The low-bit formats (ggml-common.h block_q1_0, block_q2_0, block_tq1_0, block_tq2_0).
 * Q1_0: 128 weights, d (fp16) and one bit each, weight j = bit j ? d : -d (bit j of byte j / 8,
 * least significant first). */
#define ST_QK1_0 128
typedef struct {
  uint16_t d;
  uint8_t qs[ST_QK1_0 / 8];
} st_block_q1_0;
static_assert(sizeof(st_block_q1_0) == 18, "block_q1_0 size");
/* Q2_0: 64 weights, d and 2 bits each, weight j = (q - 1) d with q bits 2 (j % 4) of byte j / 4. */
#define ST_QK2_0 64
typedef struct {
  uint16_t d;
  uint8_t qs[ST_QK2_0 / 4];
} st_block_q2_0;
static_assert(sizeof(st_block_q2_0) == 18, "block_q2_0 size");
/* TQ1_0: 256 ternary weights (-1, 0, +1 times d): qs[48] hold five trits a byte as the fixed-point
 * fraction q / 243 of base-3 digits (trit n of a byte: ((uint8_t)(q * 3^n) * 3) >> 8), the first 32
 * bytes for weights 0..159 (byte m, trit n: weight 32 n + m), the last 16 for weights 160..239
 * (weight 160 + 16 n + m); qh[4] four trits a byte for weights 240..255 (byte j, trit n: weight
 * 240 + 4 n + j); then d. Digit value 0, 1, 2 means -1, 0, +1. */
typedef struct {
  uint8_t qs[48];
  uint8_t qh[4];
  uint16_t d;
} st_block_tq1_0;
static_assert(sizeof(st_block_tq1_0) == 54, "block_tq1_0 size");
/* TQ2_0: 256 ternary weights, 2 bits each (q - 1 times d): byte m of each 32-byte group g holds
 * weights 128 g + 32 l + m at bits 2 l; then d. */
typedef struct {
  uint8_t qs[ST_QK_K / 4];
  uint16_t d;
} st_block_tq2_0;
static_assert(sizeof(st_block_tq2_0) == 66, "block_tq2_0 size");

/* The i-quant lookup tables (values in iq_grids.h, defined in quant.c). */
extern const int8_t st_kvalues_iq4nl[16];
extern const uint64_t st_iq2xs_grid[512];
extern const uint64_t st_iq2s_grid[1024];
extern const uint32_t st_iq3xxs_grid[256];
extern const uint32_t st_iq3s_grid[512];
extern const uint64_t st_iq2xxs_grid[256];
extern const uint64_t st_iq1s_grid[2048];

/* IQ2_XS/IQ3_XXS sign byte of a 7-bit sign field: the eighth sign makes the number of negative
 * weights even (ggml's ksigns_iq2xs[i]; bit j set = weight j negative). */
static inline uint8_t st_iq_signs(uint32_t field7) {
  return (uint8_t)(field7 | (uint32_t)__builtin_parity(field7 & 127) << 7);
}

/* Per-type geometry: elements per block and bytes per block (0 bytes = unknown type).
 * Source: ggml.c type_traits (blck_size, type_size). */
struct st_type_info {
  const char *name;   /* ggml's name, e.g. "q8_0" */
  uint32_t blck_size; /* elements per block */
  uint32_t type_size; /* bytes per block */
  int computed;       /* 1 when strata has kernels for it */
};

/* Info for a type number (ggml's numbering, ggml.h enum ggml_type); type_size 0 for numbers ggml
 * does not define now: named as ggml named them for the ids it has removed (q4_2, q4_0_4_4, ...),
 * "type<N>" for the others. */
const struct st_type_info *st_type_info(uint32_t type);

/* Sets the one message for a tensor whose type strata does not compute, and returns `code`:
 * "unsupported tensor type NAME (id N) for TENSOR in FILE" (NAME llama.cpp's, when ggml has or had
 * one), or "unsupported tensor type id N (unknown to ggml) for TENSOR in FILE"; `why`, if not
 * NULL, is added in parentheses at the end. */
int st_unsupported_type(int code, uint32_t type, const char *tensor, const char *file, const char *why);

/* Bytes of a row of `n` elements of `type`, or 0 when n is not a multiple of the block size
 * or the type is unknown. */
uint64_t st_row_bytes(uint32_t type, uint64_t n);

/* IEEE half and bfloat16 conversions (round to nearest even on the way down). */
static inline float st_fp16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else { /* subnormal */
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        exp--;
      }
      mant &= 0x3ff;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t st_f32_to_fp16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)h;
}

static inline float st_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t st_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
  return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

/* Quantises `n` floats (n a multiple of 32) to Q8_0 as ggml's quantize_row_q8_0_ref does:
 * d = max|x| / 127, q = round(x / d). */
void st_quantize_row_q8_0(const float *x, st_block_q8_0 *y, int64_t n);

#define ST_QUANT_UNREACHABLE(t) do { fprintf(stderr, "strata: internal invariant broken: dequantize type %u\n", (unsigned)(t)); abort(); } while (0)

/* Quantises one row of `n` floats (n a multiple of the block size) to `type`: F32, F16, BF16,
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 as ggml's quantize_row_*_ref do (same rounding), and Q2_K..Q6_K
 * with a simpler rule than ggml's iterative search (per sub-block range, scales rounded to
 * their bit widths): valid blocks that any GGUF reader decodes, with a somewhat larger error
 * than llama.cpp's quantiser.
 * IQ4_NL and IQ4_XS follow ggml's quantize_row_iq4_nl_impl without an importance matrix
 * (weights x^2; the best of 15 scales around max/-127 by least squares on the non-linear
 * levels; IQ4_XS then rounds the 8 sub-block scales to 6 bits of one fp16 super-block scale).
 * IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S use a simpler search than ggml's (which uses an importance
 * matrix and iterates sign flips): signs from the data (IQ2_XS/IQ3_XXS: when a group of 8 has an
 * odd number of negative weights, the smallest one's sign flips, as the format's parity
 * demands), then per sub-block a few candidate scales, each with the nearest grid point
 * per group among the grid entries nearest the per-weight rounding, refined once by least
 * squares; the 4-bit sub-block scales are rounded against one fp16 super-block scale. Their
 * blocks are valid for every reader but the error is larger than llama.cpp's: they are for
 * benchmark models (`strata mkmodel`), not for production quantisation.
 * Returns 0, or ST_EUNSUP for a type it cannot write. */
int st_quantize_row(uint32_t type, const float *x, void *out, int64_t n);

/* Dequantises one row of `n` elements of `type` into `out`: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (the
 * types st_type_info marks computed), as ggml's dequantize_row_* define them. */
void st_dequantize_row(uint32_t type, const void *row, float *out, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
