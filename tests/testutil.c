/* Helpers shared by the kernel tests (see testutil.h). */
#include "testutil.h"

#include <string.h>

#include "codelets/quant.h"

void tu_random_row(uint32_t t, uint8_t *row, int64_t n, uint64_t *rng) {
  const uint64_t bytes = st_row_bytes(t, (uint64_t)n);
  for (uint64_t i = 0; i < bytes; i++) {
    *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
    row[i] = (uint8_t)*rng;
  }
  if (t == ST_TYPE_F32)
    for (int64_t i = 0; i < n; i++) {
      const float v = (float)((int)(row[4 * i] % 200) - 100) / 37.0f;
      memcpy(row + 4 * i, &v, 4);
    }
  if (t == ST_TYPE_F16 || t == ST_TYPE_BF16)
    for (int64_t i = 0; i < n; i++)
    {
      const float v = (float)(row[2 * i] % 200) / 50.0f - 2.0f;
      const uint16_t h = t == ST_TYPE_F16 ? st_f32_to_fp16(v) : st_f32_to_bf16(v);
      memcpy(row + 2 * i, &h, 2);
    }
  const struct st_type_info *ti = st_type_info(t);
  for (uint64_t b = 0; ti->blck_size > 1 && b < (uint64_t)n / ti->blck_size; b++) {
    uint8_t *blk = row + b * ti->type_size;
    const uint16_t d = st_f32_to_fp16(0.01f + (float)(blk[5] % 50) / 1000.0f), m = st_f32_to_fp16(0.003f);
    size_t at[2] = {0, 2}; /* where the fp16 scales sit in each layout (quant.h) */
    int count = 1;
    if (t == ST_TYPE_Q4_1 || t == ST_TYPE_Q5_1 || t == ST_TYPE_Q4_K || t == ST_TYPE_Q5_K) count = 2;
    if (t == ST_TYPE_Q2_K) at[0] = 80, at[1] = 82, count = 2;
    if (t == ST_TYPE_Q3_K) at[0] = 108;
    if (t == ST_TYPE_Q6_K) at[0] = 208;
    if (t == ST_TYPE_TQ1_0) at[0] = 52;
    if (t == ST_TYPE_MXFP4) { /* an E8M0 scale near 2^-7 */
      blk[0] = (uint8_t)(120 + blk[0] % 4);
      continue;
    }
    if (t == ST_TYPE_IQ1_M) { /* d lives in the scale words' top nibbles: a small positive half */
      const uint16_t h = d;
      for (int k = 0; k < 4; k++) blk[48 + 2 * k + 1] = (uint8_t)((blk[48 + 2 * k + 1] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4));
      continue;
    }
    if (t == ST_TYPE_TQ2_0) at[0] = 64;
    memcpy(blk + at[0], &d, 2);
    if (count == 2) memcpy(blk + at[1], &m, 2);
  }
}
