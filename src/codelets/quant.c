/* Type table and reference (scalar) quantise/dequantise routines for the types strata
 * computes. Geometry from ggml.c's type_traits; Q8_0 rounding from quantize_row_q8_0_ref; the
 * i-quants' layouts and tables from ggml-common.h (iq_grids.h). */
#include "codelets/quant.h"

#include "codelets/iq_grids.h"
#include "common.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>

const int8_t st_kvalues_iq4nl[16] = ST_KVALUES_IQ4NL_VALUES;
const uint64_t st_iq2xs_grid[512] = ST_IQ2XS_GRID_VALUES;
const uint64_t st_iq2s_grid[1024] = ST_IQ2S_GRID_VALUES;
const uint32_t st_iq3xxs_grid[256] = ST_IQ3XXS_GRID_VALUES;
const uint32_t st_iq3s_grid[512] = ST_IQ3S_GRID_VALUES;
const uint64_t st_iq2xxs_grid[256] = ST_IQ2XXS_GRID_VALUES;
const uint64_t st_iq1s_grid[2048] = ST_IQ1S_GRID_VALUES;
/* MXFP4's E2M1 values, doubled (ggml-common.h kvalues_mxfp4: format data) */
const int8_t st_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

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
    [ST_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66, 1},
    [ST_TYPE_IQ2_XS] = {"iq2_xs", 256, 74, 1},
    [ST_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98, 1},
    [ST_TYPE_IQ1_S] = {"iq1_s", 256, 50, 1},
    [ST_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, 1},
    [ST_TYPE_IQ3_S] = {"iq3_s", 256, 110, 1},
    [ST_TYPE_IQ2_S] = {"iq2_s", 256, 82, 1},
    [ST_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, 1},
    [ST_TYPE_I8] = {"i8", 1, 1, 0},
    [ST_TYPE_I16] = {"i16", 1, 2, 0},
    [ST_TYPE_I32] = {"i32", 1, 4, 0},
    [ST_TYPE_I64] = {"i64", 1, 8, 0},
    [ST_TYPE_F64] = {"f64", 1, 8, 0},
    [ST_TYPE_IQ1_M] = {"iq1_m", 256, 56, 1},
    [ST_TYPE_BF16] = {"bf16", 1, 2, 1},
    [ST_TYPE_TQ1_0] = {"tq1_0", 256, 54, 1},
    [ST_TYPE_TQ2_0] = {"tq2_0", 256, 66, 1},
    [ST_TYPE_MXFP4] = {"mxfp4", 32, 17, 1},
    [ST_TYPE_NVFP4] = {"nvfp4", 64, 36, 0},
    [ST_TYPE_Q1_0] = {"q1_0", 128, 18, 1},
    [ST_TYPE_Q2_0] = {"q2_0", 64, 18, 1},
};

/* The ids ggml has removed (ggml.h keeps them as comments), by their old names. */
static const char *removed_name(uint32_t type) {
  switch (type) {
  case 4: return "q4_2";
  case 5: return "q4_3";
  case 31: return "q4_0_4_4";
  case 32: return "q4_0_4_8";
  case 33: return "q4_0_8_8";
  case 36: return "iq4_nl_4_4";
  case 37: return "iq4_nl_4_8";
  case 38: return "iq4_nl_8_8";
  default: return NULL;
  }
}

const struct st_type_info *st_type_info(uint32_t type) {
  static _Thread_local struct st_type_info unknown;
  static _Thread_local char name[32];
  if (type < ST_TYPE_COUNT && type_table[type].type_size) return &type_table[type];
  const char *old = removed_name(type);
  if (old) snprintf(name, sizeof name, "%s", old);
  else snprintf(name, sizeof name, "type%u", type);
  unknown = (struct st_type_info){name, 1, 0, 0};
  return &unknown;
}

int st_unsupported_type(int code, uint32_t type, const char *tensor, const char *file, const char *why) {
  const int known = (type < ST_TYPE_COUNT && type_table[type].type_size) || removed_name(type);
  char tail[160] = "";
  if (why) snprintf(tail, sizeof tail, " (%s)", why);
  if (known)
    return st_set_error(code, "unsupported tensor type %s (id %u) for %s in %s%s", st_type_info(type)->name, type, tensor,
                        file, tail);
  return st_set_error(code, "unsupported tensor type id %u (unknown to ggml) for %s in %s%s", type, tensor, file, tail);
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

/* ---- i-quant decoders (ggml's dequantize_row_iq*) ---- */

/* +1 or -1 for sign bit j, without a branch (random signs mispredict: 4 ns a weight with one). */
static inline float iq_sign(uint32_t signs, int j) { return 1.0f - 2.0f * (float)((signs >> j) & 1); }

/* 8 (IQ2) or 4 (IQ3) weights of one grid entry: dl * magnitude * sign, sign bit j for weight j. */
static void iq_emit8(uint64_t grid, uint32_t signs, float dl, float *y) {
  for (int j = 0; j < 8; j++) y[j] = dl * (float)((grid >> (8 * j)) & 0xFF) * iq_sign(signs, j);
}

static void iq_emit4(uint32_t grid, uint32_t signs, float dl, float *y) {
  for (int j = 0; j < 4; j++) y[j] = dl * (float)((grid >> (8 * j)) & 0xFF) * iq_sign(signs, j);
}

static void dequant_iq4_nl(const st_block_iq4_nl *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int j = 0; j < 16; j++) {
    y[j] = d * (float)st_kvalues_iq4nl[b->qs[j] & 0xF];
    y[j + 16] = d * (float)st_kvalues_iq4nl[b->qs[j] >> 4];
  }
}

/* The signed 6-bit scale of sub-block ib (32 weights) of an IQ4_XS block. */
static int iq4_xs_scale(const st_block_iq4_xs *b, int ib) {
  return (((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b->scales_h >> (2 * ib)) & 3) << 4)) - 32;
}

static void dequant_iq4_xs(const st_block_iq4_xs *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int ib = 0; ib < 8; ib++) {
    const float dl = d * (float)iq4_xs_scale(b, ib);
    const uint8_t *qs = b->qs + 16 * ib;
    for (int j = 0; j < 16; j++) {
      y[32 * ib + j] = dl * (float)st_kvalues_iq4nl[qs[j] & 0xF];
      y[32 * ib + j + 16] = dl * (float)st_kvalues_iq4nl[qs[j] >> 4];
    }
  }
}

/* IQ2 sub-block scale: 4-bit s of 16 weights, d * (0.5 + s) / 4. */
static float iq2_scale(float d, int s) { return d * (0.5f + (float)s) * 0.25f; }

static void dequant_iq2_xs(const st_block_iq2_xs *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int g = 0; g < 32; g++) { /* groups of 8, four per 32-weight sub-block */
    const float dl = iq2_scale(d, (b->scales[g / 4] >> (4 * ((g % 4) / 2))) & 0xF);
    iq_emit8(st_iq2xs_grid[b->qs[g] & 511], st_iq_signs(b->qs[g] >> 9), dl, y + 8 * g);
  }
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static void dequant_iq2_xxs(const st_block_iq2_xxs *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  const uint8_t *q = (const uint8_t *)b->qs;
  for (int ib = 0; ib < 8; ib++) {
    const uint32_t idx = le32(q + 8 * ib), aux = le32(q + 8 * ib + 4);
    const float dl = iq2_scale(d, (int)(aux >> 28));
    for (int l = 0; l < 4; l++)
      iq_emit8(st_iq2xxs_grid[(idx >> (8 * l)) & 0xFF], st_iq_signs((aux >> (7 * l)) & 127), dl, y + 32 * ib + 8 * l);
  }
}

/* 8 weights dl * (value + delta) of an iq1s grid entry (dequantize_row_iq1_s's operations). */
static void iq1_emit8(uint64_t grid, float dl, float delta, float *y) {
  for (int j = 0; j < 8; j++) y[j] = dl * ((float)(int8_t)(grid >> (8 * j)) + delta);
}

static void dequant_iq1_s(const st_block_iq1_s *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int ib = 0; ib < 8; ib++) {
    const unsigned qh = b->qh[ib];
    const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1), delta = qh & 0x8000 ? -ST_IQ1_DELTA : ST_IQ1_DELTA;
    for (int l = 0; l < 4; l++)
      iq1_emit8(st_iq1s_grid[b->qs[4 * ib + l] | ((qh >> (3 * l)) & 7) << 8], dl, delta, y + 32 * ib + 8 * l);
  }
}

/* IQ1_M's fp16 d from the top nibbles of its four scale words. */
static float iq1m_d(const st_block_iq1_m *b) {
  uint16_t sc[4];
  for (int k = 0; k < 4; k++) sc[k] = (uint16_t)(b->scales[2 * k] | b->scales[2 * k + 1] << 8);
  return st_fp16_to_f32((uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000)));
}

static void dequant_iq1_m(const st_block_iq1_m *b, float *y) {
  const float d = iq1m_d(b);
  for (int ib = 0; ib < 8; ib++) {
    const unsigned sc = (unsigned)(b->scales[2 * (ib / 2)] | b->scales[2 * (ib / 2) + 1] << 8);
    const float dl1 = d * (float)(2 * ((sc >> (6 * (ib % 2))) & 7) + 1);
    const float dl2 = d * (float)(2 * ((sc >> (6 * (ib % 2) + 3)) & 7) + 1);
    const uint8_t *qs = b->qs + 4 * ib, *qh = b->qh + 2 * ib;
    for (int l = 0; l < 4; l++) {
      const unsigned h = qh[l / 2] >> (4 * (l % 2)); /* the group's high bits (0..2) and shift sign (3) */
      const float delta = h & 8 ? -ST_IQ1_DELTA : ST_IQ1_DELTA;
      iq1_emit8(st_iq1s_grid[qs[l] | (h & 7) << 8], l < 2 ? dl1 : dl2, delta, y + 32 * ib + 8 * l);
    }
  }
}

static void dequant_iq2_s(const st_block_iq2_s *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int g = 0; g < 32; g++) {
    const int ib = g / 4, l = g % 4;
    const float dl = iq2_scale(d, (b->scales[ib] >> (4 * (l / 2))) & 0xF);
    const int idx = b->qs[g] | (((b->qh[ib] >> (2 * l)) & 3) << 8);
    iq_emit8(st_iq2s_grid[idx], b->qs[32 + g], dl, y + 8 * g);
  }
}

static void dequant_iq3_xxs(const st_block_iq3_xxs *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int ib = 0; ib < 8; ib++) {
    uint32_t aux;
    memcpy(&aux, b->qs + 64 + 4 * ib, 4);
    const float dl = d * (0.5f + (float)(aux >> 28)) * 0.5f;
    for (int l = 0; l < 4; l++) { /* 8 weights: two grid entries, one sign field */
      const uint8_t signs = st_iq_signs((aux >> (7 * l)) & 127);
      float *yl = y + 32 * ib + 8 * l;
      iq_emit4(st_iq3xxs_grid[b->qs[8 * ib + 2 * l]], signs & 0xF, dl, yl);
      iq_emit4(st_iq3xxs_grid[b->qs[8 * ib + 2 * l + 1]], signs >> 4, dl, yl + 4);
    }
  }
}

static void dequant_iq3_s(const st_block_iq3_s *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int ib = 0; ib < 8; ib++) {
    const float dl = d * (float)(1 + 2 * ((b->scales[ib / 2] >> (4 * (ib % 2))) & 0xF));
    for (int k = 0; k < 8; k++) { /* groups of 4 */
      const int idx = b->qs[8 * ib + k] | (((b->qh[ib] >> k) & 1) << 8);
      iq_emit4(st_iq3s_grid[idx], (b->signs[4 * ib + k / 2] >> (4 * (k % 2))) & 0xF, dl, y + 32 * ib + 4 * k);
    }
  }
}

/* ---- the low-bit formats (quant.h): decoders as ggml's dequantize_row_q1_0, _q2_0, _tq1_0, _tq2_0 */

static void dequant_q1_0(const st_block_q1_0 *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int j = 0; j < ST_QK1_0; j++) y[j] = (b->qs[j / 8] >> (j % 8)) & 1 ? d : -d;
}

static void dequant_q2_0(const st_block_q2_0 *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int j = 0; j < ST_QK2_0; j++) y[j] = (float)(((b->qs[j / 4] >> (2 * (j % 4))) & 3) - 1) * d;
}

/* Trit n (0..4) of a TQ1_0 byte: the n-th base-3 digit of the fraction q / 243, as 0, 1 or 2. */
static inline int tq1_trit(uint8_t q, int n) {
  static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
  return (int)(((unsigned)(uint8_t)(q * pow3[n]) * 3) >> 8);
}

static void dequant_tq1_0(const st_block_tq1_0 *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int n = 0; n < 5; n++)
    for (int m = 0; m < 32; m++) y[32 * n + m] = (float)(tq1_trit(b->qs[m], n) - 1) * d;
  for (int n = 0; n < 5; n++)
    for (int m = 0; m < 16; m++) y[160 + 16 * n + m] = (float)(tq1_trit(b->qs[32 + m], n) - 1) * d;
  for (int n = 0; n < 4; n++)
    for (int j = 0; j < 4; j++) y[240 + 4 * n + j] = (float)(tq1_trit(b->qh[j], n) - 1) * d;
}

static void dequant_tq2_0(const st_block_tq2_0 *b, float *y) {
  const float d = st_fp16_to_f32(b->d);
  for (int g = 0; g < 2; g++)
    for (int l = 0; l < 4; l++)
      for (int m = 0; m < 32; m++) y[128 * g + 32 * l + m] = (float)(((b->qs[32 * g + m] >> (2 * l)) & 3) - 1) * d;
}

static void dequant_mxfp4(const st_block_mxfp4 *b, float *y) {
  const float d = st_e8m0_to_f32_half(b->e);
  for (int j = 0; j < 16; j++) {
    y[j] = (float)st_kvalues_mxfp4[b->qs[j] & 0xF] * d;
    y[j + 16] = (float)st_kvalues_mxfp4[b->qs[j] >> 4] * d;
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
  case ST_TYPE_IQ4_NL:
    for (int64_t i = 0; i < n / ST_QK4_NL; i++) dequant_iq4_nl((const st_block_iq4_nl *)row + i, out + ST_QK4_NL * i);
    break;
  case ST_TYPE_IQ4_XS:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_iq4_xs((const st_block_iq4_xs *)row + i, out + ST_QK_K * i);
    break;
  case ST_TYPE_IQ2_XS:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_iq2_xs((const st_block_iq2_xs *)row + i, out + ST_QK_K * i);
    break;
  case ST_TYPE_IQ2_S:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_iq2_s((const st_block_iq2_s *)row + i, out + ST_QK_K * i);
    break;
  case ST_TYPE_IQ3_XXS:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_iq3_xxs((const st_block_iq3_xxs *)row + i, out + ST_QK_K * i);
    break;
  case ST_TYPE_IQ3_S:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_iq3_s((const st_block_iq3_s *)row + i, out + ST_QK_K * i);
    break;
  case ST_TYPE_MXFP4:
    for (int64_t i = 0; i < n / 32; i++) dequant_mxfp4((const st_block_mxfp4 *)row + i, out + 32 * i);
    break;
  case ST_TYPE_IQ2_XXS:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_iq2_xxs((const st_block_iq2_xxs *)row + i, out + ST_QK_K * i);
    break;
  case ST_TYPE_IQ1_S:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_iq1_s((const st_block_iq1_s *)row + i, out + ST_QK_K * i);
    break;
  case ST_TYPE_IQ1_M:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_iq1_m((const st_block_iq1_m *)row + i, out + ST_QK_K * i);
    break;
  case ST_TYPE_Q1_0:
    for (int64_t i = 0; i < n / ST_QK1_0; i++) dequant_q1_0((const st_block_q1_0 *)row + i, out + ST_QK1_0 * i);
    break;
  case ST_TYPE_Q2_0:
    for (int64_t i = 0; i < n / ST_QK2_0; i++) dequant_q2_0((const st_block_q2_0 *)row + i, out + ST_QK2_0 * i);
    break;
  case ST_TYPE_TQ1_0:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_tq1_0((const st_block_tq1_0 *)row + i, out + ST_QK_K * i);
    break;
  case ST_TYPE_TQ2_0:
    for (int64_t i = 0; i < n / ST_QK_K; i++) dequant_tq2_0((const st_block_tq2_0 *)row + i, out + ST_QK_K * i);
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

/* ---- i-quant quantisers ---------------------------------------------------------------------
 * IQ4_NL / IQ4_XS follow ggml's quantize_row_iq4_nl_impl (no importance matrix). The grid formats
 * use the simpler search quant.h describes. */

/* Index of the IQ4 level nearest to v: the number of midpoints between levels below v. */
static int iq4_index(float v) {
  static const float mid[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                                7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};
  int k = 0;
  for (int step = 8; step > 0; step >>= 1) /* binary search over the 15 midpoints */
    if (k + step <= 15 && v > mid[k + step - 1]) k += step;
  return k;
}

/* The scale of one block of 32 on the IQ4 levels, weights x^2: the best by least squares of the
 * candidates that map the largest weight to 127 or to -127 + t, t in [-7, 7]. 0 for a zero block. */
static float iq4_block_scale(const float *x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; j++)
    if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
  if (amax < 1e-30f) return 0.0f;
  float best = 0.0f, d = 0.0f;
  for (int t = -8; t <= 7; t++) {
    const float id = t < -7 ? -(float)st_kvalues_iq4nl[0] / max : ((float)t + (float)st_kvalues_iq4nl[0]) / max;
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int j = 0; j < 32; j++) {
      const float q = (float)st_kvalues_iq4nl[iq4_index(id * x[j])], w = x[j] * x[j];
      sumqx += w * q * x[j];
      sumq2 += w * q * q;
    }
    if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

/* 32 weights as IQ4 indices for the decoder's scale dl, packed as IQ4_NL's qs. */
static void iq4_pack(const float *x, float dl, uint8_t *qs) {
  const float id = dl != 0.0f ? 1.0f / dl : 0.0f;
  for (int j = 0; j < 16; j++)
    qs[j] = (uint8_t)(iq4_index(x[j] * id) | (iq4_index(x[j + 16] * id) << 4));
}

static void quant_iq4_nl(const float *x, st_block_iq4_nl *b) {
  b->d = st_f32_to_fp16(iq4_block_scale(x));
  iq4_pack(x, st_fp16_to_f32(b->d), b->qs);
}

static void quant_iq4_xs(const float *x, st_block_iq4_xs *b) {
  float sc[8], max_scale = 0.0f, amax = 0.0f;
  for (int ib = 0; ib < 8; ib++) {
    sc[ib] = iq4_block_scale(x + 32 * ib);
    if (fabsf(sc[ib]) > amax) amax = fabsf(sc[ib]), max_scale = sc[ib];
  }
  /* the largest scale becomes -32 steps of d, the one end 6 signed bits reach */
  const float d = -max_scale / 32.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  b->d = st_f32_to_fp16(d);
  const float df = st_fp16_to_f32(b->d);
  b->scales_h = 0;
  memset(b->scales_l, 0, sizeof b->scales_l);
  for (int ib = 0; ib < 8; ib++) {
    const int l = clampi((int)lrintf(id * sc[ib]), -32, 31), ls = l + 32;
    b->scales_l[ib / 2] |= (uint8_t)((ls & 0xF) << (4 * (ib % 2)));
    b->scales_h |= (uint16_t)((ls >> 4) << (2 * ib));
    iq4_pack(x + 32 * ib, df * (float)l, b->qs + 16 * ib);
  }
}

/* A grid of magnitude patterns prepared for the search: the entries' magnitudes, and for each
 * "code" (the pattern of per-weight nearest levels, weight j the base-nlev digit j) whether it is
 * an entry, and the IQ_NEAR entries nearest to it, the only ones the search tries. Built once
 * per process (iq_grids_init) and read-only afterwards. */
#define IQ_NEAR 16
#define IQ_MAX_CODES 6561 /* 3^8 (IQ2) >= 8^4 (IQ3) */
struct iq_grid {
  int dim, n, nlev;
  float levels[8], mid[7];
  uint8_t mag[2048 * 8];
  float magf[2048 * 8];
  uint8_t exact[IQ_MAX_CODES];
  int16_t near[IQ_MAX_CODES][IQ_NEAR];
};
enum { IQ_GRID_2XS, IQ_GRID_2S, IQ_GRID_3XXS, IQ_GRID_3S, IQ_GRID_2XXS, IQ_GRID_1S };
static struct iq_grid iq_grids[6];
static pthread_once_t iq_grids_once = PTHREAD_ONCE_INIT;

/* table: n uint64 entries (dim 8) or n uint32 entries (dim 4). */
static void iq_grid_build(struct iq_grid *g, const void *table, int n, int dim, const uint8_t *levels, int nlev) {
  g->dim = dim, g->n = n, g->nlev = nlev;
  for (int k = 0; k < nlev; k++) g->levels[k] = levels[k];
  for (int k = 0; k + 1 < nlev; k++) g->mid[k] = 0.5f * (float)(levels[k] + levels[k + 1]);
  for (int e = 0; e < n; e++)
    for (int j = 0; j < dim; j++) {
      const uint64_t v = dim == 8 ? ((const uint64_t *)table)[e] : ((const uint32_t *)table)[e];
      g->mag[e * dim + j] = (uint8_t)(v >> (8 * j));
      g->magf[e * dim + j] = g->mag[e * dim + j];
    }
  int ncodes = 1;
  for (int j = 0; j < dim; j++) ncodes *= nlev;
  for (int c = 0; c < ncodes; c++) {
    int p[8], best_d[IQ_NEAR] = {INT_MAX}, cnt = 0;
    for (int j = 0, v = c; j < dim; j++, v /= nlev) p[j] = levels[v % nlev];
    for (int e = 0; e < n; e++) {
      int dist = 0;
      for (int j = 0; j < dim; j++) dist += (p[j] - g->mag[e * dim + j]) * (p[j] - g->mag[e * dim + j]);
      if (cnt == IQ_NEAR && dist >= best_d[IQ_NEAR - 1]) continue;
      int at = cnt < IQ_NEAR ? cnt++ : IQ_NEAR - 1; /* insertion into the sorted list */
      while (at > 0 && best_d[at - 1] > dist) {
        best_d[at] = best_d[at - 1];
        g->near[c][at] = g->near[c][at - 1];
        at--;
      }
      best_d[at] = dist;
      g->near[c][at] = (int16_t)e;
    }
    g->exact[c] = best_d[0] == 0;
  }
}

static void iq_grids_init(void) {
  static const uint8_t l2[3] = {8, 25, 43}, l3xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62},
                       l3s[8] = {1, 3, 5, 7, 9, 11, 13, 15};
  iq_grid_build(&iq_grids[IQ_GRID_2XS], st_iq2xs_grid, 512, 8, l2, 3);
  iq_grid_build(&iq_grids[IQ_GRID_2S], st_iq2s_grid, 1024, 8, l2, 3);
  iq_grid_build(&iq_grids[IQ_GRID_3XXS], st_iq3xxs_grid, 256, 4, l3xxs, 8);
  iq_grid_build(&iq_grids[IQ_GRID_3S], st_iq3s_grid, 512, 4, l3s, 8);
  iq_grid_build(&iq_grids[IQ_GRID_2XXS], st_iq2xxs_grid, 256, 8, l2, 3);
  /* IQ1: the values -1, 0, +1 as the levels 0, 1, 2 (each byte + 1) */
  static const uint8_t l1[3] = {0, 1, 2};
  static uint64_t shifted[2048];
  for (int e = 0; e < 2048; e++) {
    shifted[e] = 0;
    for (int j = 0; j < 8; j++) shifted[e] |= (uint64_t)(uint8_t)((st_iq1s_grid[e] >> (8 * j)) + 1) << (8 * j);
  }
  iq_grid_build(&iq_grids[IQ_GRID_1S], shifted, 2048, 8, l1, 3);
}

/* The entry for target magnitudes t[dim] (in grid units): the code's own entry when the code is
 * on the grid (then no entry is nearer), else the nearest of its IQ_NEAR neighbours. */
static int iq_nearest(const struct iq_grid *g, const float *t) {
  int code = 0;
  for (int j = g->dim - 1; j >= 0; j--) {
    int k = 0;
    for (int m = 0; m < g->nlev - 1; m++) k += t[j] > g->mid[m];
    code = code * g->nlev + k;
  }
  const int16_t *cand = g->near[code];
  if (g->exact[code]) return cand[0];
  int best = cand[0];
  float best_err = INFINITY;
  for (int c = 0; c < IQ_NEAR; c++) {
    const float *m = g->magf + cand[c] * g->dim;
    float err = 0.0f;
    for (int j = 0; j < g->dim; j++) err += (t[j] - m[j]) * (t[j] - m[j]);
    if (err < best_err) best_err = err, best = cand[c];
  }
  return best;
}

/* Fits n weights a (signs taken out; a flipped weight is negative) with scale sigma: picks an
 * entry per group of dim into idx and returns the squared error. */
static float iq_fit(const struct iq_grid *g, const float *a, int n, float sigma, uint16_t *idx) {
  const float inv = sigma > 0.0f ? 1.0f / sigma : 0.0f;
  float err = 0.0f;
  for (int k = 0; k < n / g->dim; k++) {
    float t[8];
    for (int j = 0; j < g->dim; j++) t[j] = a[k * g->dim + j] * inv;
    idx[k] = (uint16_t)iq_nearest(g, t);
    const uint8_t *m = g->mag + idx[k] * g->dim;
    for (int j = 0; j < g->dim; j++) {
      const float e = a[k * g->dim + j] - sigma * (float)m[j];
      err += e * e;
    }
  }
  return err;
}

/* The best scale of one sub-block of n weights: candidates that put the largest weight at 0.55
 * to 1.15 of the top level, each refined once by least squares for the entries it chose. */
static float iq_best_scale(const struct iq_grid *g, const float *a, int n) {
  float amax = 0.0f;
  for (int j = 0; j < n; j++) amax = fabsf(a[j]) > amax ? fabsf(a[j]) : amax;
  if (amax == 0.0f) return 0.0f;
  const float top = g->levels[g->nlev - 1];
  float best = 0.0f, best_err = INFINITY;
  uint16_t idx[32], idx2[32];
  for (int c = 0; c < 5; c++) {
    float sigma = amax / (top * (0.55f + 0.15f * (float)c));
    float err = iq_fit(g, a, n, sigma, idx);
    double num = 0.0, den = 0.0;
    for (int j = 0; j < n; j++) {
      const double m = g->mag[idx[j / g->dim] * g->dim + j % g->dim];
      num += a[j] * m;
      den += m * m;
    }
    if (num > 0.0 && den > 0.0) {
      const float ls = (float)(num / den), err2 = iq_fit(g, a, n, ls, idx2);
      if (err2 < err) err = err2, sigma = ls;
    }
    if (err < best_err) best_err = err, best = sigma;
  }
  return best;
}

/* What the grid formats share: one fp16 scale d, a 4-bit scale per sub-block of `sub` weights,
 * a grid entry per group of dim, a sign byte per 8 weights (bit j: weight j negative). */
struct iq_fitted {
  uint16_t d;
  uint8_t scale[16];
  uint16_t idx[64];
  uint8_t signs[32];
};

/* Sub-block scale for 4-bit code s as the decoders form it: d * (a + b s). */
static float iq_sub_scale(uint32_t type, float d, int s) {
  if (type == ST_TYPE_IQ3_XXS) return d * (0.5f + (float)s) * 0.5f;
  if (type == ST_TYPE_IQ3_S) return d * (float)(1 + 2 * s);
  return iq2_scale(d, s);
}

static void iq_quant_block(uint32_t type, const float *x, struct iq_fitted *o) {
  const int parity = type == ST_TYPE_IQ2_XS || type == ST_TYPE_IQ3_XXS || type == ST_TYPE_IQ2_XXS;
  const struct iq_grid *g = &iq_grids[type == ST_TYPE_IQ2_XS ? IQ_GRID_2XS : type == ST_TYPE_IQ2_S ? IQ_GRID_2S
                                      : type == ST_TYPE_IQ3_XXS ? IQ_GRID_3XXS : type == ST_TYPE_IQ2_XXS ? IQ_GRID_2XXS
                                      : IQ_GRID_3S];
  const int sub = g->dim == 8 && type != ST_TYPE_IQ2_XXS ? 16 : 32; /* weights per 4-bit scale */
  float a[ST_QK_K];
  for (int k = 0; k < 32; k++) {
    const float *xk = x + 8 * k;
    uint8_t s = 0;
    int jmin = 0;
    for (int j = 0; j < 8; j++) {
      if (xk[j] < 0.0f) s |= (uint8_t)(1u << j);
      a[8 * k + j] = fabsf(xk[j]);
      if (fabsf(xk[j]) < fabsf(xk[jmin])) jmin = j;
    }
    if (parity && __builtin_parity(s)) { /* the smallest weight takes the sign the parity forces */
      s ^= (uint8_t)(1u << jmin);
      a[8 * k + jmin] = -a[8 * k + jmin];
    }
    o->signs[k] = s;
  }
  float sig[16] = {0}, smax = 0.0f;
  for (int b = 0; b < ST_QK_K / sub; b++) {
    sig[b] = iq_best_scale(g, a + sub * b, sub);
    smax = sig[b] > smax ? sig[b] : smax;
  }
  o->d = st_f32_to_fp16(smax / iq_sub_scale(type, 1.0f, 15));
  const float d = st_fp16_to_f32(o->d), a0 = iq_sub_scale(type, d, 0), step = iq_sub_scale(type, d, 1) - a0;
  for (int b = 0; b < ST_QK_K / sub; b++) {
    const int s0 = step > 0.0f ? clampi((int)lrintf((sig[b] - a0) / step), 0, 15) : 0;
    float best_err = INFINITY;
    uint16_t idx[8];
    for (int s = s0 > 0 ? s0 - 1 : 0; s <= s0 + 1 && s <= 15; s++) {
      const float err = iq_fit(g, a + sub * b, sub, iq_sub_scale(type, d, s), idx);
      if (err < best_err) {
        best_err = err;
        o->scale[b] = (uint8_t)s;
        memcpy(o->idx + b * (sub / g->dim), idx, sizeof(uint16_t) * (size_t)(sub / g->dim));
      }
    }
  }
}

static void quant_iq_grid(uint32_t type, const float *x, uint8_t *out) {
  struct iq_fitted f;
  iq_quant_block(type, x, &f);
  switch (type) {
  case ST_TYPE_IQ2_XXS: { /* per 32 weights: four grid index bytes, then the signs and scale word */
    st_block_iq2_xxs *b = (st_block_iq2_xxs *)out;
    b->d = f.d;
    uint8_t *q = (uint8_t *)b->qs;
    for (int ib = 0; ib < 8; ib++) {
      uint32_t aux = (uint32_t)f.scale[ib] << 28;
      for (int l = 0; l < 4; l++) {
        q[8 * ib + l] = (uint8_t)f.idx[4 * ib + l];
        aux |= (uint32_t)(f.signs[4 * ib + l] & 127) << (7 * l);
      }
      for (int k = 0; k < 4; k++) q[8 * ib + 4 + k] = (uint8_t)(aux >> (8 * k));
    }
    break;
  }
  case ST_TYPE_IQ2_XS: {
    st_block_iq2_xs *b = (st_block_iq2_xs *)out;
    b->d = f.d;
    for (int g = 0; g < 32; g++) b->qs[g] = (uint16_t)(f.idx[g] | (f.signs[g] & 127) << 9);
    for (int ib = 0; ib < 8; ib++) b->scales[ib] = (uint8_t)(f.scale[2 * ib] | f.scale[2 * ib + 1] << 4);
    break;
  }
  case ST_TYPE_IQ2_S: {
    st_block_iq2_s *b = (st_block_iq2_s *)out;
    b->d = f.d;
    memset(b->qh, 0, sizeof b->qh);
    for (int g = 0; g < 32; g++) {
      b->qs[g] = (uint8_t)f.idx[g];
      b->qs[32 + g] = f.signs[g];
      b->qh[g / 4] |= (uint8_t)((f.idx[g] >> 8) << (2 * (g % 4)));
    }
    for (int ib = 0; ib < 8; ib++) b->scales[ib] = (uint8_t)(f.scale[2 * ib] | f.scale[2 * ib + 1] << 4);
    break;
  }
  case ST_TYPE_IQ3_XXS: {
    st_block_iq3_xxs *b = (st_block_iq3_xxs *)out;
    b->d = f.d;
    for (int ib = 0; ib < 8; ib++) {
      uint32_t aux = (uint32_t)f.scale[ib] << 28;
      for (int l = 0; l < 4; l++) aux |= (uint32_t)(f.signs[4 * ib + l] & 127) << (7 * l);
      memcpy(b->qs + 64 + 4 * ib, &aux, 4);
    }
    for (int k = 0; k < 64; k++) b->qs[k] = (uint8_t)f.idx[k];
    break;
  }
  default: { /* IQ3_S */
    st_block_iq3_s *b = (st_block_iq3_s *)out;
    b->d = f.d;
    memset(b->qh, 0, sizeof b->qh);
    memset(b->scales, 0, sizeof b->scales);
    for (int k = 0; k < 64; k++) {
      b->qs[k] = (uint8_t)f.idx[k];
      b->qh[k / 8] |= (uint8_t)((f.idx[k] >> 8) << (k % 8));
    }
    memcpy(b->signs, f.signs, 32);
    for (int ib = 0; ib < 8; ib++) b->scales[ib / 2] |= (uint8_t)(f.scale[ib] << (4 * (ib % 2)));
  }
  }
}

/* MXFP4 as ggml's quantize_row_mxfp4_ref: e = floor(log2(max |x|)) - 2 + 127, each weight the
 * nearest of the 16 levels (the first on a tie: a level replaces the best only when its error is
 * strictly smaller). The search runs level by level over four weights at a time in GCC's generic
 * vectors (SSE2 or NEON): the same float errors |level d - x| and the same choices as a search
 * weight by weight, about four times faster (strata mkmodel's gpt-oss experts). */
typedef float mx_v4f __attribute__((vector_size(16)));
typedef int32_t mx_v4i __attribute__((vector_size(16)));
static void quant_mxfp4(const float *x, st_block_mxfp4 *b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
  b->e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
  const float d = st_e8m0_to_f32_half(b->e);
  const mx_v4i nosign = {INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX};
  mx_v4f xv[8], best_err[8];
  mx_v4i best[8];
  for (int v = 0; v < 8; v++) {
    memcpy(&xv[v], x + 4 * v, sizeof xv[v]);
    const float l0 = (float)st_kvalues_mxfp4[0] * d;
    best_err[v] = (mx_v4f)((mx_v4i)((mx_v4f){l0, l0, l0, l0} - xv[v]) & nosign);
    best[v] = (mx_v4i){0, 0, 0, 0};
  }
  for (int i = 1; i < 16; i++) {
    const float l = (float)st_kvalues_mxfp4[i] * d;
    const mx_v4f lv = {l, l, l, l};
    const mx_v4i iv = {i, i, i, i};
    for (int v = 0; v < 8; v++) {
      const mx_v4f err = (mx_v4f)((mx_v4i)(lv - xv[v]) & nosign);
      const mx_v4i better = err < best_err[v]; /* -1 where strictly smaller (never for a NaN) */
      best_err[v] = (mx_v4f)(((mx_v4i)err & better) | ((mx_v4i)best_err[v] & ~better));
      best[v] = (iv & better) | (best[v] & ~better);
    }
  }
  int32_t q[32];
  memcpy(q, best, sizeof q);
  for (int j = 0; j < 16; j++) b->qs[j] = (uint8_t)(q[j] | q[j + 16] << 4);
}

/* ---- IQ1_S and IQ1_M: a search over the iq1s grid (not llama.cpp's: theirs needs an importance
 * matrix and searches harder; these are for benchmark models) ----------------------------------- */

/* Group of 8 weights x at scale dl with the shift of sign neg (-1/8 if neg): the nearest grid
 * entry into *idx; returns the squared error. */
static float iq1_group(const float *x, float dl, int neg, uint16_t *idx) {
  const struct iq_grid *g = &iq_grids[IQ_GRID_1S];
  const float delta = neg ? -ST_IQ1_DELTA : ST_IQ1_DELTA, inv = dl > 0.0f ? 1.0f / dl : 0.0f;
  float t[8];
  for (int j = 0; j < 8; j++) t[j] = x[j] * inv - delta + 1.0f;
  *idx = (uint16_t)iq_nearest(g, t);
  float err = 0.0f;
  for (int j = 0; j < 8; j++) {
    const float e = x[j] - dl * ((float)g->mag[*idx * 8 + j] - 1.0f + delta);
    err += e * e;
  }
  return err;
}

/* n weights (groups of 8) at scale dl: each group's entry and shift (per group when neg < 0, else
 * neg for all); returns the squared error. */
static float iq1_fit(const float *x, int n, float dl, int neg, uint16_t *idx, uint8_t *negs) {
  float err = 0.0f;
  for (int k = 0; k < n / 8; k++) {
    uint16_t i0, i1;
    const float e0 = iq1_group(x + 8 * k, dl, neg < 0 ? 0 : neg, &i0);
    if (neg >= 0) {
      idx[k] = i0, negs[k] = (uint8_t)neg, err += e0;
      continue;
    }
    const float e1 = iq1_group(x + 8 * k, dl, 1, &i1);
    idx[k] = e1 < e0 ? i1 : i0, negs[k] = e1 < e0, err += e1 < e0 ? e1 : e0;
  }
  return err;
}

/* The best scale of n weights (candidates putting the largest at 0.6 .. 1.2 of 1 + 1/8, each refined
 * once by least squares), for a shift shared by all (neg 0 or 1) or chosen per group (neg < 0). */
static float iq1_best_scale(const float *x, int n, int neg) {
  float amax = 0.0f;
  for (int j = 0; j < n; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
  if (amax == 0.0f) return 0.0f;
  const struct iq_grid *g = &iq_grids[IQ_GRID_1S];
  float best = 0.0f, best_err = INFINITY;
  uint16_t idx[4];
  uint8_t negs[4];
  for (int c = 0; c < 5; c++) {
    float dl = amax / (1.125f * (0.6f + 0.15f * (float)c));
    float err = iq1_fit(x, n, dl, neg, idx, negs);
    double num = 0.0, den = 0.0;
    for (int j = 0; j < n; j++) {
      const double v = (double)g->mag[idx[j / 8] * 8 + j % 8] - 1.0 + (negs[j / 8] ? -ST_IQ1_DELTA : ST_IQ1_DELTA);
      num += x[j] * v, den += v * v;
    }
    if (num > 0.0 && den > 0.0) {
      const float ls = (float)(num / den), err2 = iq1_fit(x, n, ls, neg, idx, negs);
      if (err2 < err) err = err2, dl = ls;
    }
    if (err < best_err) best_err = err, best = dl;
  }
  return best;
}

/* The 3-bit scale s (dl = d (2 s + 1)) and the fit at it, trying s around the nearest. */
static int iq1_scale_code(const float *x, int n, float d, float dl, int neg, uint16_t *idx, uint8_t *negs) {
  const int s0 = d > 0.0f ? clampi((int)lrintf((dl / d - 1.0f) / 2.0f), 0, 7) : 0;
  float best_err = INFINITY;
  int best = s0;
  uint16_t ti[4];
  uint8_t tn[4];
  for (int s = s0 > 0 ? s0 - 1 : 0; s <= s0 + 1 && s <= 7; s++) {
    const float err = iq1_fit(x, n, d * (float)(2 * s + 1), neg, ti, tn);
    if (err < best_err) {
      best_err = err, best = s;
      memcpy(idx, ti, sizeof(uint16_t) * (size_t)(n / 8));
      memcpy(negs, tn, (size_t)(n / 8));
    }
  }
  return best;
}

static void quant_iq1_s(const float *x, st_block_iq1_s *b) {
  float dl[8], smax = 0.0f;
  int neg[8];
  for (int ib = 0; ib < 8; ib++) { /* the shift's sign: whichever fits the sub-block better */
    const float d0 = iq1_best_scale(x + 32 * ib, 32, 0), d1 = iq1_best_scale(x + 32 * ib, 32, 1);
    uint16_t idx[4];
    uint8_t negs[4];
    const float e0 = iq1_fit(x + 32 * ib, 32, d0, 0, idx, negs), e1 = iq1_fit(x + 32 * ib, 32, d1, 1, idx, negs);
    neg[ib] = e1 < e0, dl[ib] = e1 < e0 ? d1 : d0;
    smax = dl[ib] > smax ? dl[ib] : smax;
  }
  b->d = st_f32_to_fp16(smax / 15.0f);
  const float d = st_fp16_to_f32(b->d);
  for (int ib = 0; ib < 8; ib++) {
    uint16_t idx[4];
    uint8_t negs[4];
    const int s = iq1_scale_code(x + 32 * ib, 32, d, dl[ib], neg[ib], idx, negs);
    unsigned qh = (unsigned)s << 12 | (unsigned)neg[ib] << 15;
    for (int l = 0; l < 4; l++) {
      b->qs[4 * ib + l] = (uint8_t)idx[l];
      qh |= (unsigned)(idx[l] >> 8) << (3 * l);
    }
    b->qh[ib] = (uint16_t)qh;
  }
}

static void quant_iq1_m(const float *x, st_block_iq1_m *b) {
  float dl[16], smax = 0.0f;
  for (int h = 0; h < 16; h++) { /* 16-weight halves, the shift chosen per group of 8 */
    dl[h] = iq1_best_scale(x + 16 * h, 16, -1);
    smax = dl[h] > smax ? dl[h] : smax;
  }
  const uint16_t dh = st_f32_to_fp16(smax / 15.0f);
  const float d = st_fp16_to_f32(dh);
  uint16_t sc[4] = {0, 0, 0, 0};
  memset(b->qh, 0, sizeof b->qh);
  for (int h = 0; h < 16; h++) {
    uint16_t idx[2];
    uint8_t negs[2];
    const int s = iq1_scale_code(x + 16 * h, 16, d, dl[h], -1, idx, negs);
    const int ib = h / 2;
    sc[ib / 2] |= (uint16_t)(s << (6 * (ib % 2) + 3 * (h % 2)));
    for (int l = 0; l < 2; l++) {
      const int gl = 2 * (h % 2) + l; /* the group within the 32-weight sub-block */
      b->qs[4 * ib + gl] = (uint8_t)idx[l];
      b->qh[2 * ib + gl / 2] |= (uint8_t)(((idx[l] >> 8) | negs[l] << 3) << (4 * (gl % 2)));
    }
  }
  for (int k = 0; k < 4; k++) {
    sc[k] |= (uint16_t)(((dh >> (4 * k)) & 0xF) << 12);
    b->scales[2 * k] = (uint8_t)sc[k], b->scales[2 * k + 1] = (uint8_t)(sc[k] >> 8);
  }
}

/* The low-bit formats' quantisers, as ggml's quantize_row_*_ref define them (so that a model
 * strata makes holds what llama-quantize would write from the same floats): Q1_0 d = mean |x|,
 * the sign bit (x >= 0); Q2_0 d = max |x|, q = clamp(round(x / d) + 1, 0, 3); TQ1_0 and TQ2_0
 * d = max |x|, trits lroundf(x / d) + 1 (TQ1_0 packs five as the ceiling of their base-3 value
 * times 256 / 243). */
static void quant_q1_0(const float *x, st_block_q1_0 *b) {
  float sum = 0.0f;
  for (int j = 0; j < ST_QK1_0; j++) sum += fabsf(x[j]);
  b->d = st_f32_to_fp16(sum / ST_QK1_0);
  memset(b->qs, 0, sizeof b->qs);
  for (int j = 0; j < ST_QK1_0; j++)
    if (x[j] >= 0.0f) b->qs[j / 8] |= (uint8_t)(1 << (j % 8));
}

static float absmax(const float *x, int n) {
  float amax = 0.0f;
  for (int j = 0; j < n; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
  return amax;
}

static void quant_q2_0(const float *x, st_block_q2_0 *b) {
  const float d = absmax(x, ST_QK2_0), id = d > 0.0f ? 1.0f / d : 0.0f;
  b->d = st_f32_to_fp16(d);
  memset(b->qs, 0, sizeof b->qs);
  for (int j = 0; j < ST_QK2_0; j++) b->qs[j / 4] |= (uint8_t)(clampi((int)roundf(x[j] * id) + 1, 0, 3) << (2 * (j % 4)));
}

/* Five (or four) trits of x[0], x[stride], ... as one TQ1_0 byte. */
static uint8_t tq1_pack(const float *x, int stride, int count, float id) {
  unsigned q = 0;
  for (int n = 0; n < count; n++) q = q * 3 + (unsigned)(lroundf(x[n * stride] * id) + 1);
  for (int n = count; n < 5; n++) q *= 3; /* four trits a byte: the fifth digit 0 */
  return (uint8_t)((q * 256 + 242) / 243);
}

static void quant_tq1_0(const float *x, st_block_tq1_0 *b) {
  const float d = absmax(x, ST_QK_K), id = d ? 1.0f / d : 0.0f;
  b->d = st_f32_to_fp16(d);
  for (int m = 0; m < 32; m++) b->qs[m] = tq1_pack(x + m, 32, 5, id);
  for (int m = 0; m < 16; m++) b->qs[32 + m] = tq1_pack(x + 160 + m, 16, 5, id);
  for (int j = 0; j < 4; j++) b->qh[j] = tq1_pack(x + 240 + j, 4, 4, id);
}

static void quant_tq2_0(const float *x, st_block_tq2_0 *b) {
  const float d = absmax(x, ST_QK_K), id = d ? 1.0f / d : 0.0f;
  b->d = st_f32_to_fp16(d);
  for (int g = 0; g < 2; g++)
    for (int m = 0; m < 32; m++) {
      unsigned q = 0;
      for (int l = 0; l < 4; l++) q |= (unsigned)((lroundf(x[128 * g + 32 * l + m] * id) + 1) & 3) << (2 * l);
      b->qs[32 * g + m] = (uint8_t)q;
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
  case ST_TYPE_IQ4_NL:
    for (int64_t i = 0; i < n / ST_QK4_NL; i++) quant_iq4_nl(x + ST_QK4_NL * i, (st_block_iq4_nl *)out + i);
    return 0;
  case ST_TYPE_IQ4_XS:
    for (int64_t i = 0; i < n / ST_QK_K; i++) quant_iq4_xs(x + ST_QK_K * i, (st_block_iq4_xs *)out + i);
    return 0;
  case ST_TYPE_MXFP4:
    for (int64_t i = 0; i < n / 32; i++) quant_mxfp4(x + 32 * i, (st_block_mxfp4 *)out + i);
    return 0;
  case ST_TYPE_IQ1_S:
    pthread_once(&iq_grids_once, iq_grids_init);
    for (int64_t i = 0; i < n / ST_QK_K; i++) quant_iq1_s(x + ST_QK_K * i, (st_block_iq1_s *)out + i);
    return 0;
  case ST_TYPE_IQ1_M:
    pthread_once(&iq_grids_once, iq_grids_init);
    for (int64_t i = 0; i < n / ST_QK_K; i++) quant_iq1_m(x + ST_QK_K * i, (st_block_iq1_m *)out + i);
    return 0;
  case ST_TYPE_IQ2_XXS:
  case ST_TYPE_IQ2_XS:
  case ST_TYPE_IQ2_S:
  case ST_TYPE_IQ3_XXS:
  case ST_TYPE_IQ3_S:
    pthread_once(&iq_grids_once, iq_grids_init);
    for (int64_t i = 0; i < n / ST_QK_K; i++) quant_iq_grid(type, x + ST_QK_K * i, o + (uint64_t)i * st_type_info(type)->type_size);
    return 0;
  case ST_TYPE_Q1_0:
    for (int64_t i = 0; i < n / ST_QK1_0; i++) quant_q1_0(x + ST_QK1_0 * i, (st_block_q1_0 *)out + i);
    return 0;
  case ST_TYPE_Q2_0:
    for (int64_t i = 0; i < n / ST_QK2_0; i++) quant_q2_0(x + ST_QK2_0 * i, (st_block_q2_0 *)out + i);
    return 0;
  case ST_TYPE_TQ1_0:
    for (int64_t i = 0; i < n / ST_QK_K; i++) quant_tq1_0(x + ST_QK_K * i, (st_block_tq1_0 *)out + i);
    return 0;
  case ST_TYPE_TQ2_0:
    for (int64_t i = 0; i < n / ST_QK_K; i++) quant_tq2_0(x + ST_QK_K * i, (st_block_tq2_0 *)out + i);
    return 0;
  default:
    (void)o;
    return st_set_error(ST_EUNSUP, "no quantiser for %s", st_type_info(type)->name);
  }
}
