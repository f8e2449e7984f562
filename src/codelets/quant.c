/* Type table and reference (scalar) quantise/dequantise routines for the types strata
 * computes. Geometry from ggml.c's type_traits; Q8_0 rounding from quantize_row_q8_0_ref. */
#include "codelets/quant.h"

#include "common.h"

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

/* ---- quantisers ---------------------------------------------------------------------------- */

static float absmax_signed(const float *x, int n) { /* the value of largest magnitude, with its sign */
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; j++)
    if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
  return max;
}

static void minmax(const float *x, int n, float *mn, float *mx) {
  *mn = x[0], *mx = x[0];
  for (int j = 1; j < n; j++) *mn = x[j] < *mn ? x[j] : *mn, *mx = x[j] > *mx ? x[j] : *mx;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static void quant_q4_0(const float *x, st_block_q4_0 *b) {
  const float d = absmax_signed(x, 32) / -8.0f, id = d ? 1.0f / d : 0.0f;
  b->d = st_f32_to_fp16(d);
  for (int j = 0; j < 16; j++) {
    const int x0 = clampi((int8_t)(x[j] * id + 8.5f), 0, 15), x1 = clampi((int8_t)(x[16 + j] * id + 8.5f), 0, 15);
    b->qs[j] = (uint8_t)(x0 | (x1 << 4));
  }
}

static void quant_q4_1(const float *x, st_block_q4_1 *b) {
  float mn, mx;
  minmax(x, 32, &mn, &mx);
  const float d = (mx - mn) / 15.0f, id = d ? 1.0f / d : 0.0f;
  b->d = st_f32_to_fp16(d);
  b->m = st_f32_to_fp16(mn);
  for (int j = 0; j < 16; j++) {
    const int x0 = clampi((int8_t)((x[j] - mn) * id + 0.5f), 0, 15), x1 = clampi((int8_t)((x[16 + j] - mn) * id + 0.5f), 0, 15);
    b->qs[j] = (uint8_t)(x0 | (x1 << 4));
  }
}

static void quant_q5(const float *x, int with_min, uint16_t *dh, uint16_t *mh, uint8_t *qh4, uint8_t *qs) {
  float d, mn = 0.0f, mx;
  if (with_min) {
    minmax(x, 32, &mn, &mx);
    d = (mx - mn) / 31.0f;
  } else {
    d = absmax_signed(x, 32) / -16.0f;
  }
  const float id = d ? 1.0f / d : 0.0f;
  *dh = st_f32_to_fp16(d);
  if (mh) *mh = st_f32_to_fp16(mn);
  uint32_t qh = 0;
  for (int j = 0; j < 16; j++) {
    const int x0 = with_min ? clampi((int)((x[j] - mn) * id + 0.5f), 0, 31) : clampi((int8_t)(x[j] * id + 16.5f), 0, 31);
    const int x1 = with_min ? clampi((int)((x[16 + j] - mn) * id + 0.5f), 0, 31) : clampi((int8_t)(x[16 + j] * id + 16.5f), 0, 31);
    qs[j] = (uint8_t)((x0 & 0xF) | ((x1 & 0xF) << 4));
    qh |= (uint32_t)((x0 & 0x10) >> 4) << j;
    qh |= (uint32_t)((x1 & 0x10) >> 4) << (j + 16);
  }
  memcpy(qh4, &qh, 4);
}

/* Packs 8 6-bit scales and mins the way scale_min_k4 reads them. */
static void pack_scale_min_k4(const uint8_t *ls, const uint8_t *lm, uint8_t *q) {
  memset(q, 0, 12);
  for (int j = 0; j < 8; j++) {
    if (j < 4) {
      q[j] = ls[j];
      q[j + 4] = lm[j];
    } else {
      q[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      q[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
      q[j] |= (uint8_t)((lm[j] >> 4) << 6);
    }
  }
}

/* Q4_K / Q5_K: 8 sub-blocks of 32 weights, each y = d*ls*q - dmin*lm with q in [0, levels]. */
static void quant_q45_K(const float *x, int levels, uint16_t *dh, uint16_t *mh, uint8_t *scales, uint8_t *qh, uint8_t *qs) {
  float sc[8], mins[8], maxsc = 0.0f, maxmin = 0.0f;
  for (int j = 0; j < 8; j++) {
    float mn, mx;
    minmax(x + 32 * j, 32, &mn, &mx);
    mn = mn < 0.0f ? mn : 0.0f;
    sc[j] = (mx - mn) / (float)levels;
    mins[j] = -mn;
    maxsc = sc[j] > maxsc ? sc[j] : maxsc;
    maxmin = mins[j] > maxmin ? mins[j] : maxmin;
  }
  const float d = maxsc / 63.0f, dmin = maxmin / 63.0f;
  *dh = st_f32_to_fp16(d);
  *mh = st_f32_to_fp16(dmin);
  const float df = st_fp16_to_f32(*dh), mf = st_fp16_to_f32(*mh);
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; j++) {
    ls[j] = (uint8_t)clampi(d ? (int)lrintf(sc[j] / d) : 0, 0, 63);
    lm[j] = (uint8_t)clampi(dmin ? (int)lrintf(mins[j] / dmin) : 0, 0, 63);
  }
  pack_scale_min_k4(ls, lm, scales);
  if (qh) memset(qh, 0, 32);
  for (int j = 0; j < 8; j++) {
    const float step = df * ls[j], off = mf * lm[j];
    for (int l = 0; l < 32; l++) {
      const int q = step ? clampi((int)lrintf((x[32 * j + l] + off) / step), 0, levels) : 0;
      const int byte = (j / 2) * 32 + l;
      if (j % 2 == 0) qs[byte] = (uint8_t)(q & 0xF);
      else qs[byte] |= (uint8_t)((q & 0xF) << 4);
      if (qh && (q & 0x10)) qh[l] |= (uint8_t)(1u << j);
    }
  }
}

static void quant_q6_K(const float *x, st_block_q6_K *b) {
  float sc[16], amax = 0.0f;
  for (int j = 0; j < 16; j++) {
    sc[j] = absmax_signed(x + 16 * j, 16) / -32.0f;
    amax = fabsf(sc[j]) > amax ? fabsf(sc[j]) : amax;
  }
  const float d = amax / 127.0f;
  b->d = st_f32_to_fp16(d);
  const float df = st_fp16_to_f32(b->d);
  for (int j = 0; j < 16; j++) b->scales[j] = (int8_t)clampi(d ? (int)lrintf(sc[j] / d) : 0, -128, 127);
  memset(b->ql, 0, sizeof b->ql);
  memset(b->qh, 0, sizeof b->qh);
  for (int i = 0; i < ST_QK_K; i++) {
    const float step = df * b->scales[i / 16];
    const int q = (step ? clampi((int)lrintf(x[i] / step), -32, 31) : 0) + 32;
    /* the layout dequant_q6_K reads: 128-weight halves, four 32-weight quarters */
    const int n = i / 128, r = i % 128, quarter = r / 32, l = r % 32;
    uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
    const int lo_at = l + (quarter & 1 ? 32 : 0);
    ql[lo_at] |= (uint8_t)(quarter < 2 ? (q & 0xF) : ((q & 0xF) << 4));
    qh[l] |= (uint8_t)(((q >> 4) & 3) << (2 * quarter));
  }
}

static void quant_q2_K(const float *x, st_block_q2_K *b) {
  float sc[16], mins[16], maxsc = 0.0f, maxmin = 0.0f;
  for (int j = 0; j < 16; j++) {
    float mn, mx;
    minmax(x + 16 * j, 16, &mn, &mx);
    mn = mn < 0.0f ? mn : 0.0f;
    sc[j] = (mx - mn) / 3.0f;
    mins[j] = -mn;
    maxsc = sc[j] > maxsc ? sc[j] : maxsc;
    maxmin = mins[j] > maxmin ? mins[j] : maxmin;
  }
  const float d = maxsc / 15.0f, dmin = maxmin / 15.0f;
  b->d = st_f32_to_fp16(d);
  b->dmin = st_f32_to_fp16(dmin);
  const float df = st_fp16_to_f32(b->d), mf = st_fp16_to_f32(b->dmin);
  memset(b->qs, 0, sizeof b->qs);
  for (int j = 0; j < 16; j++) {
    const int ls = clampi(d ? (int)lrintf(sc[j] / d) : 0, 0, 15), lm = clampi(dmin ? (int)lrintf(mins[j] / dmin) : 0, 0, 15);
    b->scales[j] = (uint8_t)(ls | (lm << 4));
  }
  for (int i = 0; i < ST_QK_K; i++) {
    /* the layout dequant_q2_K reads: scale index is = n*8 + shift*2 + half */
    const int n = i / 128, r = i % 128, shift = r / 32, half = (r % 32) / 16, l = r % 16;
    const int is = n * 8 + shift * 2 + half;
    const float step = df * (b->scales[is] & 0xF), off = mf * (b->scales[is] >> 4);
    const int q = step ? clampi((int)lrintf((x[i] + off) / step), 0, 3) : 0;
    b->qs[n * 32 + l + 16 * half] |= (uint8_t)(q << (2 * shift));
  }
}

static void quant_q3_K(const float *x, st_block_q3_K *b) {
  float sc[16], amax = 0.0f;
  for (int j = 0; j < 16; j++) {
    sc[j] = absmax_signed(x + 16 * j, 16) / -4.0f;
    amax = fabsf(sc[j]) > amax ? fabsf(sc[j]) : amax;
  }
  const float d = amax / 31.0f;
  b->d = st_f32_to_fp16(d);
  const float df = st_fp16_to_f32(b->d);
  int ls[16];
  for (int j = 0; j < 16; j++) ls[j] = clampi(d ? (int)lrintf(sc[j] / d) : 0, -32, 31) + 32;
  /* pack 16 6-bit scales as dequant_q3_K unpacks them: low nibbles in bytes 0..7, high 2 bits
   * in bytes 8..11 */
  memset(b->scales, 0, sizeof b->scales);
  for (int j = 0; j < 16; j++) {
    const int g = j / 4, bb = j % 4;
    b->scales[(g & 1) * 4 + bb] |= (uint8_t)((ls[j] & 0xF) << (4 * (g >> 1)));
    b->scales[8 + bb] |= (uint8_t)(((ls[j] >> 4) & 3) << (2 * g));
  }
  memset(b->qs, 0, sizeof b->qs);
  memset(b->hmask, 0, sizeof b->hmask);
  for (int i = 0; i < ST_QK_K; i++) {
    const int n = i / 128, r = i % 128, shift = r / 32, half = (r % 32) / 16, l = r % 16;
    const int is = n * 8 + shift * 2 + half;
    const float step = df * (float)(ls[is] - 32);
    const int q = (step ? clampi((int)lrintf(x[i] / step), -4, 3) : 0) + 4; /* 0..7 */
    b->qs[n * 32 + l + 16 * half] |= (uint8_t)((q & 3) << (2 * shift));
    if (q & 4) b->hmask[l + 16 * half] |= (uint8_t)(1u << (n * 4 + shift));
  }
}

int st_quantize_row(uint32_t type, const float *x, void *out, int64_t n) {
  uint8_t *o = out;
  switch (type) {
  case ST_TYPE_F32: memcpy(out, x, (size_t)n * 4); return 0;
  case ST_TYPE_F16:
    for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = st_f32_to_fp16(x[i]);
    return 0;
  case ST_TYPE_BF16:
    for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = st_f32_to_bf16(x[i]);
    return 0;
  case ST_TYPE_Q8_0: st_quantize_row_q8_0(x, out, n); return 0;
  case ST_TYPE_Q4_0:
    for (int64_t i = 0; i < n / 32; i++) quant_q4_0(x + 32 * i, (st_block_q4_0 *)out + i);
    return 0;
  case ST_TYPE_Q4_1:
    for (int64_t i = 0; i < n / 32; i++) quant_q4_1(x + 32 * i, (st_block_q4_1 *)out + i);
    return 0;
  case ST_TYPE_Q5_0:
    for (int64_t i = 0; i < n / 32; i++) {
      st_block_q5_0 *b = (st_block_q5_0 *)out + i;
      quant_q5(x + 32 * i, 0, &b->d, NULL, b->qh, b->qs);
    }
    return 0;
  case ST_TYPE_Q5_1:
    for (int64_t i = 0; i < n / 32; i++) {
      st_block_q5_1 *b = (st_block_q5_1 *)out + i;
      quant_q5(x + 32 * i, 1, &b->d, &b->m, b->qh, b->qs);
    }
    return 0;
  case ST_TYPE_Q2_K:
    for (int64_t i = 0; i < n / ST_QK_K; i++) quant_q2_K(x + ST_QK_K * i, (st_block_q2_K *)out + i);
    return 0;
  case ST_TYPE_Q3_K:
    for (int64_t i = 0; i < n / ST_QK_K; i++) quant_q3_K(x + ST_QK_K * i, (st_block_q3_K *)out + i);
    return 0;
  case ST_TYPE_Q4_K:
    for (int64_t i = 0; i < n / ST_QK_K; i++) {
      st_block_q4_K *b = (st_block_q4_K *)out + i;
      quant_q45_K(x + ST_QK_K * i, 15, &b->d, &b->dmin, b->scales, NULL, b->qs);
    }
    return 0;
  case ST_TYPE_Q5_K:
    for (int64_t i = 0; i < n / ST_QK_K; i++) {
      st_block_q5_K *b = (st_block_q5_K *)out + i;
      quant_q45_K(x + ST_QK_K * i, 31, &b->d, &b->dmin, b->scales, b->qh, b->qs);
    }
    return 0;
  case ST_TYPE_Q6_K:
    for (int64_t i = 0; i < n / ST_QK_K; i++) quant_q6_K(x + ST_QK_K * i, (st_block_q6_K *)out + i);
    return 0;
  default:
    (void)o;
    return st_set_error(ST_EUNSUP, "no quantiser for %s", st_type_info(type)->name);
  }
}
