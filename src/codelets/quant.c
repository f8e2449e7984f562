/* Type table and reference (scalar) quantise/dequantise routines for the types strata
 * computes. Geometry from ggml.c's type_traits; Q8_0 rounding from quantize_row_q8_0_ref. */
#include "codelets/quant.h"

#include <math.h>
#include <stdio.h>

static const struct st_type_info type_table[ST_TYPE_COUNT] = {
    [ST_TYPE_F32] = {"f32", 1, 4, 1},
    [ST_TYPE_F16] = {"f16", 1, 2, 1},
    [ST_TYPE_Q4_0] = {"q4_0", 32, 18, 0},
    [ST_TYPE_Q4_1] = {"q4_1", 32, 20, 0},
    [ST_TYPE_Q5_0] = {"q5_0", 32, 22, 0},
    [ST_TYPE_Q5_1] = {"q5_1", 32, 24, 0},
    [ST_TYPE_Q8_0] = {"q8_0", 32, 34, 1},
    [ST_TYPE_Q8_1] = {"q8_1", 32, 36, 0},
    [ST_TYPE_Q2_K] = {"q2_K", 256, 84, 0},
    [ST_TYPE_Q3_K] = {"q3_K", 256, 110, 0},
    [ST_TYPE_Q4_K] = {"q4_K", 256, 144, 0},
    [ST_TYPE_Q5_K] = {"q5_K", 256, 176, 0},
    [ST_TYPE_Q6_K] = {"q6_K", 256, 210, 0},
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
  default:
    ST_QUANT_UNREACHABLE(type);
  }
}
