/* Type table and reference (scalar) quantise/dequantise routines for the types strata
 * computes. Geometry from ggml.c's type_traits; Q8_0 rounding from quantize_row_q8_0_ref. */
#include "codelets/quant.h"

#include <math.h>
#include <stdio.h>

static const struct st_type_info type_table[ST_TYPE_COUNT] = {
    [ST_TYPE_F32] = {"f32", 1, 4, 1},
    [ST_TYPE_F16] = {"f16", 1, 2, 1},
    [ST_TYPE_Q4_0] = {"q4_0", 32, 18, 1},
    [ST_TYPE_Q4_1] = {"q4_1", 32, 20, 1},
    [ST_TYPE_Q5_0] = {"q5_0", 32, 22, 1},
    [ST_TYPE_Q5_1] = {"q5_1", 32, 24, 1},
    [ST_TYPE_Q8_0] = {"q8_0", 32, 34, 1},
    [ST_TYPE_Q8_1] = {"q8_1", 32, 36, 0},
    [ST_TYPE_Q2_K] = {"q2_K", 256, 84, 1},
    [ST_TYPE_Q3_K] = {"q3_K", 256, 110, 1},
    [ST_TYPE_Q4_K] = {"q4_K", 256, 144, 1},
    [ST_TYPE_Q5_K] = {"q5_K", 256, 176, 1},
    [ST_TYPE_Q6_K] = {"q6_K", 256, 210, 1},
    [ST_TYPE_Q8_K] = {"q8_K", 256, 292, 0},
    [ST_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66, 0},
    [ST_TYPE_IQ2_XS] = {"iq2_xs", 256, 74, 0},
    [ST_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98, 0},
    [ST_TYPE_IQ1_S] = {"iq1_s", 256, 50, 0},
    [ST_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, 0},
    [ST_TYPE_IQ3_S] = {"iq3_s", 256, 110, 0},
    [ST_TYPE_IQ2_S] = {"iq2_s", 256, 82, 0},
    [ST_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, 0},
    [ST_TYPE_I8] = {"i8", 1, 1, 0},
    [ST_TYPE_I16] = {"i16", 1, 2, 0},
    [ST_TYPE_I32] = {"i32", 1, 4, 0},
    [ST_TYPE_I64] = {"i64", 1, 8, 0},
    [ST_TYPE_F64] = {"f64", 1, 8, 0},
    [ST_TYPE_IQ1_M] = {"iq1_m", 256, 56, 0},
    [ST_TYPE_BF16] = {"bf16", 1, 2, 1},
    [ST_TYPE_TQ1_0] = {"tq1_0", 256, 54, 0},
    [ST_TYPE_TQ2_0] = {"tq2_0", 256, 66, 0},
};

const struct st_type_info *st_type_info(uint32_t type) {
  static _Thread_local struct st_type_info unknown;
  static _Thread_local char name[32];
  if (type < ST_TYPE_COUNT && type_table[type].type_size) return &type_table[type];
  snprintf(name, sizeof name, "type%u", type);
  unknown = (struct st_type_info){name, 1, 0, 0};
  return &unknown;
}

uint64_t st_row_bytes(uint32_t type, uint64_t n) {
  const struct st_type_info *ti = st_type_info(type);
  if (!ti->type_size || n % ti->blck_size) return 0;
  return n / ti->blck_size * ti->type_size;
}

void st_quantize_row_q8_0(const float *x, st_block_q8_0 *y, int64_t n) {
  for (int64_t b = 0; b < n / ST_QK8_0; b++) {
    float amax = 0.0f;
    for (int j = 0; j < ST_QK8_0; j++) {
      const float a = fabsf(x[b * ST_QK8_0 + j]);
      amax = a > amax ? a : amax; /* not fmaxf: a libm call at -O2 */
    }
    const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    y[b].d = st_f32_to_fp16(d);
    for (int j = 0; j < ST_QK8_0; j++) y[b].qs[j] = (int8_t)roundf(x[b * ST_QK8_0 + j] * id);
  }
}

/* The 6-bit scale and min j of a Q4_K/Q5_K block (ggml's get_scale_min_k4). */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

static void dequant_q4_0(const st_block_q4_0 *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int j = 0; j < 16; j++) {
    y[j] = (float)((b->qs[j] & 0xF) - 8) * d;
    y[j + 16] = (float)((b->qs[j] >> 4) - 8) * d;
  }
}

static void dequant_q4_1(const st_block_q4_1 *b, float *y) {
  const float d = st_fp16_to_f32(b->d), m = st_fp16_to_f32(b->m);
  for (int j = 0; j < 16; j++) {
    y[j] = (float)(b->qs[j] & 0xF) * d + m;
    y[j + 16] = (float)(b->qs[j] >> 4) * d + m;
  }
}

static void dequant_q5(const uint8_t *qh4, const uint8_t *qs, float d, float m, int offset, float *y) {
  uint32_t qh;
  memcpy(&qh, qh4, 4);
  for (int j = 0; j < 16; j++) {
    const int h0 = (int)(((qh >> j) << 4) & 0x10), h1 = (int)((qh >> (j + 12)) & 0x10);
    y[j] = (float)(((qs[j] & 0xF) | h0) - offset) * d + m;
    y[j + 16] = (float)(((qs[j] >> 4) | h1) - offset) * d + m;
  }
}

static void dequant_q2_K(const st_block_q2_K *b, float *y) {
  const float d = st_fp16_to_f32(b->d), min = st_fp16_to_f32(b->dmin);
  const uint8_t *q = b->qs;
  int is = 0;
  for (int n = 0; n < ST_QK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; half++) {
        const uint8_t sc = b->scales[is++];
        const float dl = d * (float)(sc & 0xF), ml = min * (float)(sc >> 4);
        for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
      }
    }
    q += 32;
  }
}

static void dequant_q3_K(const st_block_q3_K *b, float *y) {
  uint32_t aux[4];
  memcpy(aux, b->scales, 12);
  const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f, tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
  aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
  aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4);
  aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
  int8_t scales[16];
  memcpy(scales, aux, 16);
  const float d = st_fp16_to_f32(b->d);
  const uint8_t *q = b->qs;
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < ST_QK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; half++) {
        const float dl = d * (float)(scales[is++] - 32);
        for (int l = 0; l < 16; l++)
          *y++ = dl * (float)(((q[l + 16 * half] >> shift) & 3) - ((b->hmask[l + 16 * half] & m) ? 0 : 4));
      }
      m <<= 1;
    }
    q += 32;
  }
}

static void dequant_q45_K(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, uint16_t dh, uint16_t mh, float *y) {
  const float d = st_fp16_to_f32(dh), min = st_fp16_to_f32(mh);
  int is = 0;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < ST_QK_K; j += 64) {
    uint8_t sc, m;
    scale_min_k4(is, scales, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; l++) *y++ = d1 * (float)((qs[l] & 0xF) + (qh && (qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; l++) *y++ = d2 * (float)((qs[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0)) - m2;
    qs += 32;
    is += 2;
    u1 = (uint8_t)(u1 << 2);
    u2 = (uint8_t)(u2 << 2);
  }
}

static void dequant_q6_K(const st_block_q6_K *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  const uint8_t *ql = b->ql, *qh = b->qh;
  const int8_t *sc = b->scales;
  for (int n = 0; n < ST_QK_K; n += 128) {
    for (int l = 0; l < 32; l++) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * (float)sc[is] * (float)q1;
      y[l + 32] = d * (float)sc[is + 2] * (float)q2;
      y[l + 64] = d * (float)sc[is + 4] * (float)q3;
      y[l + 96] = d * (float)sc[is + 6] * (float)q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

void st_dequantize_row(uint32_t type, const void *row, float *out, int64_t n) {
  switch (type) {
  case ST_TYPE_F32:
    memcpy(out, row, (size_t)n * 4);
    break;
  case ST_TYPE_F16:
    for (int64_t i = 0; i < n; i++) out[i] = st_fp16_to_f32(((const uint16_t *)row)[i]);
    break;
  case ST_TYPE_BF16:
    for (int64_t i = 0; i < n; i++) out[i] = st_bf16_to_f32(((const uint16_t *)row)[i]);
    break;
  case ST_TYPE_Q8_0: {
    const st_block_q8_0 *b = row;
    for (int64_t i = 0; i < n / ST_QK8_0; i++) {
      const float d = st_fp16_to_f32(b[i].d);
      for (int j = 0; j < ST_QK8_0; j++) out[i * ST_QK8_0 + j] = d * (float)b[i].qs[j];
    }
    break;
  }
  case ST_TYPE_Q4_0:
    for (int64_t i = 0; i < n / 32; i++) dequant_q4_0((const st_block_q4_0 *)row + i, out + 32 * i);
    break;
  case ST_TYPE_Q4_1:
    for (int64_t i = 0; i < n / 32; i++) dequant_q4_1((const st_block_q4_1 *)row + i, out + 32 * i);
    break;
  case ST_TYPE_Q5_0:
    for (int64_t i = 0; i < n / 32; i++) {
      const st_block_q5_0 *b = (const st_block_q5_0 *)row + i;
      dequant_q5(b->qh, b->qs, st_fp16_to_f32(b->d), 0.0f, 16, out + 32 * i);
    }
    break;
  case ST_TYPE_Q5_1:
    for (int64_t i = 0; i < n / 32; i++) {
      const st_block_q5_1 *b = (const st_block_q5_1 *)row + i;
      dequant_q5(b->qh, b->qs, st_fp16_to_f32(b->d), st_fp16_to_f32(b->m), 0, out + 32 * i);
    }
    break;
  case ST_TYPE_Q2_K:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_q2_K((const st_block_q2_K *)row + i, out + ST_QK_K * i);
    break;
  case ST_TYPE_Q3_K:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_q3_K((const st_block_q3_K *)row + i, out + ST_QK_K * i);
    break;
  case ST_TYPE_Q4_K:
    for (int64_t i = 0; i < n / ST_QK_K; i++) {
      const st_block_q4_K *b = (const st_block_q4_K *)row + i;
      dequant_q45_K(b->scales, b->qs, NULL, b->d, b->dmin, out + ST_QK_K * i);
    }
    break;
  case ST_TYPE_Q5_K:
    for (int64_t i = 0; i < n / ST_QK_K; i++) {
      const st_block_q5_K *b = (const st_block_q5_K *)row + i;
      dequant_q45_K(b->scales, b->qs, b->qh, b->d, b->dmin, out + ST_QK_K * i);
    }
    break;
  case ST_TYPE_Q6_K:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_q6_K((const st_block_q6_K *)row + i, out + ST_QK_K * i);
    break;
  default:
    ST_QUANT_UNREACHABLE(type);
  }
}
