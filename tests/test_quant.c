/* The CPU kernels against float64 references: half/bfloat16 conversions, Q8_0 quantisation
 * error, st_matmul for F32, F16, BF16 and Q8_0 weights on random data at every SIMD level this
 * CPU has (scalar, AVX2, AVX-512), bitwise independence of the token-tile size, and RMSNorm.
 * The i-quants (IQ4_NL, IQ4_XS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): the sign table, a hand-built
 * block of each decoded to values worked out from the format by hand, the quantisers' round
 * trip, and st_matmul on random and on quantised blocks. Every block format's st_matmul runs at
 * every SIMD level, on rows of one block up to several, with tiles of 1 to 4 tokens.
 * st_dense_matmul (the CPU's int8 dense products) against its parts, st_axpy and the batched
 * attention (st_attend_tokens) against their one-row forms, bitwise.
 * Prints every error it measured and the bound it used. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/dot.h"
#include "codelets/iq_grids.h"
#include "codelets/layer_cpu.h"
#include "codelets/quant.h"
#include "testutil.h"

static int n_pass, n_fail;


static uint64_t rng = 88172645463325252ull;
static double urand(void) { /* xorshift64, uniform in [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 4503599627370496.0 - 1.0;
}

static void test_conversions(void) {
  static const float vals[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333333f};
  int ok = 1;
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    const float h = st_fp16_to_f32(st_f32_to_fp16(vals[i]));
    const float b = st_bf16_to_f32(st_f32_to_bf16(vals[i]));
    ok &= fabsf(h - vals[i]) <= fabsf(vals[i]) * 0x1p-11f;
    ok &= fabsf(b - vals[i]) <= fabsf(vals[i]) * 0x1p-8f;
  }
  int all16 = 1; /* every finite half round-trips exactly */
  for (uint32_t u = 0; u < 0x10000; u++)
    if (((u >> 10) & 0x1f) != 0x1f) all16 &= st_f32_to_fp16(st_fp16_to_f32((uint16_t)u)) == u;
  CHECK(ok && all16, "fp16/bf16 conversions: %zu values within half an ulp, all 63488 finite halves round-trip",
        sizeof vals / sizeof vals[0]);
}

static void test_q8_0(void) {
  enum { N = 32 * 64 };
  float x[N], y[N];
  st_block_q8_0 q[N / 32];
  for (int i = 0; i < N; i++) x[i] = (float)(urand() * 3.0);
  st_quantize_row_q8_0(x, q, N);
  st_dequantize_row(ST_TYPE_Q8_0, q, y, N);
  double worst = 0;
  for (int b = 0; b < N / 32; b++) {
    const double d = st_fp16_to_f32(q[b].d);
    for (int j = 0; j < 32; j++) worst = fmax(worst, fabs(y[b * 32 + j] - x[b * 32 + j]) / d);
  }
  /* rounding to the integer grid (0.5 d) plus the scale's own fp16 rounding (127 × 2^-11 d) */
  const double bound = 0.5 + 127.0 / 2048.0;
  CHECK(worst <= bound, "q8_0 quantise/dequantise of %d values: max error %.4f × block scale (≤ %.4f: half a step + fp16 scale rounding)", N, worst, bound);
}

/* Fills a weight matrix of `type` (block formats: random blocks, or with `quantise` the
 * quantiser's blocks of random rows) and returns its dequantised float copy. */
static void *make_weights(uint32_t type, int rows, int n, float *deq, int quantise) {
  const uint64_t rb = st_row_bytes(type, (uint64_t)n);
  uint8_t *w = malloc(rb * (uint64_t)rows);
  float *tmp = malloc(sizeof(float) * (size_t)n);
  for (int r = 0; r < rows; r++) {
    for (int i = 0; i < n; i++) tmp[i] = (float)urand();
    uint8_t *row = w + rb * (uint64_t)r;
    switch (type) {
    case ST_TYPE_F32: memcpy(row, tmp, sizeof(float) * (size_t)n); break;
    case ST_TYPE_F16: for (int i = 0; i < n; i++) ((uint16_t *)row)[i] = st_f32_to_fp16(tmp[i]); break;
    case ST_TYPE_BF16: for (int i = 0; i < n; i++) ((uint16_t *)row)[i] = st_f32_to_bf16(tmp[i]); break;
    case ST_TYPE_Q8_0: st_quantize_row_q8_0(tmp, (st_block_q8_0 *)row, n); break;
    default:
      if (!quantise || st_quantize_row(type, tmp, row, n)) tu_random_row(type, row, n, &rng); /* random blocks, finite scales */
    }
    st_dequantize_row(type, row, deq + (size_t)r * n, n);
  }
  free(tmp);
  return w;
}

/* st_matmul over T tokens (at most 7: a tile of 4 and one of T - 4) against float64, and each
 * token again alone, which must give the same bits. */
static void test_matmul_tokens(uint32_t type, int n, int quantise, int T) {
  enum { ROWS = 37, T_MAX = 19 };
  float *deq = malloc(sizeof(float) * ROWS * (size_t)n), *x = malloc(sizeof(float) * T * (size_t)n);
  void *w = make_weights(type, ROWS, n, deq, quantise);
  for (int i = 0; i < T * n; i++) x[i] = (float)urand();
  const uint64_t rb = st_row_bytes(type, (uint64_t)n);
  const int top = st_dot_force_isa(3);
  for (int level = 0; level <= top && level <= 2; level++) { /* level 3 changes the integer kernels only */
    st_dot_force_isa(level);
    float out[T_MAX * ROWS], one[ROWS];
    st_matmul(type, w, rb, 0, ROWS, x, n, T, n, out, ROWS);
    double worst = 0;
    int same = 1;
    for (int t = 0; t < T; t++) {
      st_matmul(type, w, rb, 0, ROWS, x + (size_t)t * n, n, 1, n, one, ROWS);
      same &= memcmp(one, out + t * ROWS, sizeof one) == 0;
      for (int r = 0; r < ROWS; r++) {
        double ref = 0, mag = 0;
        for (int i = 0; i < n; i++) {
          ref += (double)deq[(size_t)r * n + i] * x[(size_t)t * n + i];
          mag += fabs((double)deq[(size_t)r * n + i] * x[(size_t)t * n + i]);
        }
        worst = fmax(worst, fabs(out[t * ROWS + r] - ref) / mag);
      }
    }
    CHECK(worst <= 1e-6 && same,
          "matmul %s n=%d %s%s: %d×%d outputs, max |Δ|/Σ|w·x| = %.2e (≤ 1e-6) vs float64 of the dequantised rows; T=%d vs T=1 %s",
          st_type_info(type)->name, n, st_dot_isa(), quantise ? ", quantised rows" : "", T, ROWS, worst, T,
          same ? "bitwise identical" : "DIFFER");
  }
  st_dot_force_isa(top);
  free(w);
  free(deq);
  free(x);
}

static void test_matmul_blocks(uint32_t type, int n, int quantise) { test_matmul_tokens(type, n, quantise, 7); }

static void test_matmul(uint32_t type, int n) { test_matmul_blocks(type, n, 0); }

/* Quantise Gaussian data to each format and decode it back: the RMS error relative to the data's
 * RMS must stay under the format's bound (bits per weight). Checks that every quantiser packs
 * its blocks the way the decoder reads them. */
static void test_roundtrip(uint32_t type, double bound) {
  enum { N = 4096 };
  float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
  uint8_t *q = malloc(st_row_bytes(type, N));
  for (int i = 0; i < N; i += 2) { /* Box-Muller */
    const double u1 = (urand() + 1.0) / 2.0 + 1e-12, u2 = (urand() + 1.0) / 2.0;
    x[i] = (float)(sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
    x[i + 1] = (float)(sqrt(-2 * log(u1)) * sin(2 * M_PI * u2));
  }
  int rc = st_quantize_row(type, x, q, N);
  st_dequantize_row(type, q, y, N);
  double se = 0, ss = 0;
  for (int i = 0; i < N; i++) se += (double)(x[i] - y[i]) * (x[i] - y[i]), ss += (double)x[i] * x[i];
  const double rel = sqrt(se / ss);
  CHECK(rc == 0 && rel <= bound, "quantise/decode %s: %d Gaussian weights, RMS error %.4f of the RMS (≤ %.3f)",
        st_type_info(type)->name, N, rel, bound);
  free(x);
  free(y);
  free(q);
}

/* st_iq_signs against ggml's ksigns_iq2xs table (its first and last rows), and the table's rule
 * for all 128 entries: the seven bits unchanged, an even number of bits set. */
static void test_iq_signs(void) {
  static const uint8_t first[16] = {0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15};
  static const uint8_t last[16] = {240, 113, 114, 243, 116, 245, 246, 119, 120, 249, 250, 123, 252, 125, 126, 255};
  int ok = 1;
  for (int i = 0; i < 16; i++) ok &= st_iq_signs((uint32_t)i) == first[i] && st_iq_signs((uint32_t)(112 + i)) == last[i];
  for (uint32_t i = 0; i < 128; i++) ok &= (st_iq_signs(i) & 127) == i && __builtin_popcount(st_iq_signs(i)) % 2 == 0;
  CHECK(ok, "iq sign table: 32 entries equal ggml's ksigns_iq2xs, all 128 keep their 7 bits and have even parity");
}

struct known {
  int at;
  float want;
};

/* Decodes one hand-built block and compares the listed weights with the values worked out by
 * hand from the format (each printed). */
static void check_known(uint32_t type, const void *block, const struct known *k, int nk, const char *what) {
  const uint32_t n = st_type_info(type)->blck_size;
  float *y = malloc(sizeof(float) * n);
  st_dequantize_row(type, block, y, n);
  int ok = 1;
  printf("     %s %s:", st_type_info(type)->name, what);
  for (int i = 0; i < nk; i++) {
    printf(" y[%d]=%g (want %g)", k[i].at, y[k[i].at], k[i].want);
    ok &= y[k[i].at] == k[i].want;
  }
  printf("\n");
  CHECK(ok, "%s hand-built block: %d weights decode to the hand-derived values", st_type_info(type)->name, nk);
  free(y);
}

/* IQ2_XXS, IQ1_S and IQ1_M (issue #25) from ggml's dequantize_row_iq2_xxs / _iq1_s / _iq1_m: */
static void test_iq_low_known_blocks(void) {
  /* MXFP4 (ggml's dequantize_row_mxfp4), e = 127: scale 2^-1; code q is kvalues_mxfp4[q] (0, 1, 2, 3,
   * 4, 6, 8, 12, then the same negated); qs[0] = 0x97 gives weight 0 = 12 / 2 and weight 16 = -1 / 2,
   * qs[15] = 0x3F weight 15 = -12 / 2 and weight 31 = 3 / 2 */
  st_block_mxfp4 f4;
  memset(&f4, 0, sizeof f4);
  f4.e = 127;
  f4.qs[0] = 0x97, f4.qs[15] = 0x3F;
  const struct known kf[] = {{0, 6.0f}, {16, -0.5f}, {15, -6.0f}, {31, 1.5f}, {1, 0.0f}};
  check_known(ST_TYPE_MXFP4, &f4, kf, 5, "e=127, qs[0]=0x97 qs[15]=0x3F rest 0");

  /* IQ2_XXS, d = 1; sub-block 0: index bytes 1, 0, 0, 0 and the word 0x30000001 (group 0's sign
   * field 1 = ggml 0x81: weights 0 and 7 negative; scale 3: (0.5 + 3) / 4 = 0.875); group 0 is
   * iq2xxs_grid[1] = {43, 8, ..., 8}; sub-block 1 all zero: grid[0] = 8s at (0.5 + 0) / 4 */
  st_block_iq2_xxs x;
  memset(&x, 0, sizeof x);
  x.d = st_f32_to_fp16(1.0f);
  uint8_t *q = (uint8_t *)x.qs;
  q[0] = 1, q[4] = 0x01, q[7] = 0x30;
  const struct known kx[] = {{0, -37.625f}, {1, 7.0f}, {7, -7.0f}, {8, 7.0f}, {32, 1.0f}};
  check_known(ST_TYPE_IQ2_XXS, &x, kx, 5, "d=1, idx 1 sign field 1 scale 3, rest 0");

  /* IQ1_S, d = 0.5; qh[0] = 0x2038: scale 2 (dl = 0.5 * 5 = 2.5), group 1's high bits 7 (index
   * 1792 = {1, -1, 0, 1, 1, 0, 0, 1}), shift +1/8; qs[0] = 1: group 0 is iq1s_grid[1] = {1, -1, ..., -1};
   * qh[1] = 0x8000: scale 0 (dl 0.5), shift -1/8, grid[0] all -1 */
  st_block_iq1_s s1;
  memset(&s1, 0, sizeof s1);
  s1.d = st_f32_to_fp16(0.5f);
  s1.qs[0] = 1, s1.qh[0] = 0x2038, s1.qh[1] = 0x8000;
  const struct known ks[] = {{0, 2.8125f}, {1, -2.1875f}, {8, 2.8125f}, {9, -2.1875f}, {10, 0.3125f}, {32, -0.5625f}};
  check_known(ST_TYPE_IQ1_S, &s1, ks, 6, "d=0.5, qh[0]=0x2038 qs[0]=1 qh[1]=0x8000");

  /* IQ1_M, d = 1 (fp16 0x3C00 in the top nibbles of the scale words 0..3: 0, 0, 0xC, 0x3); word 0 =
   * 0x11: sub-block 0's scales 1 and 2 (dl1 = 3, dl2 = 5); qh[0] = 0x78: group 0 high bits 0, shift
   * -1/8; group 1 high bits 7 (index 1792), shift +1/8; qs[0] = 1 */
  st_block_iq1_m m1;
  memset(&m1, 0, sizeof m1);
  m1.qs[0] = 1, m1.qh[0] = 0x78;
  m1.scales[0] = 0x11, m1.scales[5] = 0xC0, m1.scales[7] = 0x30;
  const struct known km[] = {{0, 2.625f}, {1, -3.375f}, {8, 3.375f}, {10, 0.375f}, {16, -4.375f}, {64, -0.875f}};
  check_known(ST_TYPE_IQ1_M, &m1, km, 6, "d=1 in the scale nibbles, scales 1/2, qh[0]=0x78 qs[0]=1");
}

/* The low-bit formats (issue #25) from their definitions in ggml-common.h / ggml-quants.c: */
static void test_lowbit_known_blocks(void) {
  /* Q1_0, d = 0.5: bit j of byte j / 8 set gives +0.5, clear -0.5 */
  st_block_q1_0 q1;
  memset(&q1, 0, sizeof q1);
  q1.d = st_f32_to_fp16(0.5f);
  q1.qs[0] = 0x81, q1.qs[15] = 0x40;
  const struct known k1[] = {{0, 0.5f}, {1, -0.5f}, {7, 0.5f}, {8, -0.5f}, {126, 0.5f}, {127, -0.5f}};
  check_known(ST_TYPE_Q1_0, &q1, k1, 6, "d=0.5, qs[0]=0x81 qs[15]=0x40 rest 0");

  /* Q2_0, d = 0.25: 2-bit q of weight j at bits 2 (j % 4) of byte j / 4, weight (q - 1) d:
   * qs[0] = 0b11100100 gives q 0, 1, 2, 3 -> -0.25, 0, 0.25, 0.5 */
  st_block_q2_0 q2;
  memset(&q2, 0x55, sizeof q2); /* q = 1 everywhere: 0 */
  q2.d = st_f32_to_fp16(0.25f);
  q2.qs[0] = 0xE4, q2.qs[15] = 0x15; /* weight 63: q 0 */
  const struct known k2[] = {{0, -0.25f}, {1, 0.0f}, {2, 0.25f}, {3, 0.5f}, {4, 0.0f}, {63, -0.25f}};
  check_known(ST_TYPE_Q2_0, &q2, k2, 6, "d=0.25, qs[0]=0xE4 qs[15]=0x15 rest 0x55");

  /* TQ1_0, d = 2: a byte holds its trits as ceil(v * 256 / 243) for the base-3 number v of five
   * digits (0, 1, 2 = -1, 0, +1), the first digit most significant. Digits 2,0,1,1,2 (v = 2*81 +
   * 0*27 + 1*9 + 1*3 + 2 = 176; byte ceil(176 * 256 / 243) = 186) in qs[3] give weights 3, 35, 67,
   * 99, 131 = +2, -2, 0, 0, +2; digits 0,0,0,0,2 (v = 2, byte 3) in qs[40] give weights 168 and
   * 232 = -2 and +2; qh[1] with four digits 2,1,1,0 and a fifth 0 (v = 2*81 + 27 + 9 = 198, byte
   * 209) gives weights 241, 245, 249, 253 = +2, 0, 0, -2 */
  st_block_tq1_0 t1;
  memset(t1.qs, 0, sizeof t1.qs);
  memset(t1.qh, 0, sizeof t1.qh);
  t1.d = st_f32_to_fp16(2.0f);
  t1.qs[3] = 186, t1.qs[40] = 3, t1.qh[1] = 209;
  const struct known kt1[] = {{3, 2.0f}, {35, -2.0f}, {67, 0.0f}, {99, 0.0f}, {131, 2.0f}, {0, -2.0f},
                              {168, -2.0f}, {232, 2.0f}, {241, 2.0f}, {245, 0.0f}, {249, 0.0f}, {253, -2.0f}};
  check_known(ST_TYPE_TQ1_0, &t1, kt1, 12, "d=2, qs[3]=186 qs[40]=3 qh[1]=209 rest 0");

  /* TQ2_0, d = 1.5: byte m of group g holds weights 128 g + 32 l + m at bits 2 l; qs[33] = 0x92
   * (q 2, 0, 1, 2) gives weights 129, 161, 193, 225 = +1.5, -1.5, 0, +1.5 */
  st_block_tq2_0 t2;
  memset(t2.qs, 0x55, sizeof t2.qs);
  t2.d = st_f32_to_fp16(1.5f);
  t2.qs[33] = 0x92;
  const struct known kt2[] = {{129, 1.5f}, {161, -1.5f}, {193, 0.0f}, {225, 1.5f}, {1, 0.0f}};
  check_known(ST_TYPE_TQ2_0, &t2, kt2, 5, "d=1.5, qs[33]=0x92 rest 0x55");
}

static void test_iq_known_blocks(void) {
  /* IQ4_NL, d = 0.5: nibble q gives 0.5 * kvalues_iq4nl[q] (levels -127 -104 ... 1 ... 89 113) */
  st_block_iq4_nl nl;
  nl.d = st_f32_to_fp16(0.5f);
  memset(nl.qs, 0x88, sizeof nl.qs);
  nl.qs[0] = 0x1F, nl.qs[1] = 0x80;
  const struct known knl[] = {{0, 56.5f}, {16, -52.0f}, {1, -63.5f}, {17, 0.5f}, {5, 0.5f}};
  check_known(ST_TYPE_IQ4_NL, &nl, knl, 5, "d=0.5, qs[0]=0x1F qs[1]=0x80 rest 0x88");

  /* IQ4_XS, d = 0.25; 6-bit scales ls (low nibble in scales_l, high 2 bits in scales_h), scale
   * ls - 32: sub-block 0 ls=33 (+1), sub-block 5 ls=0 (-32), the others ls=32 (0) */
  st_block_iq4_xs xs;
  memset(&xs, 0, sizeof xs);
  xs.d = st_f32_to_fp16(0.25f);
  xs.scales_l[0] = 0x01;
  xs.scales_h = 0xA2AA; /* high bits 2 everywhere but sub-block 5 (bits 10-11) */
  xs.qs[0] = 0xF0, xs.qs[80] = 0x97;
  const struct known kxs[] = {{0, -31.75f}, {16, 28.25f}, {160, 80.0f}, {176, -104.0f}, {32, 0.0f}};
  check_known(ST_TYPE_IQ4_XS, &xs, kxs, 5, "d=0.25, scales +1 / -32 / 0");

  /* IQ2_XS, d = 1: scales[0] = 0x21 gives 16 weights at (0.5+1)/4 = 0.375, 16 at (0.5+2)/4 = 0.625,
   * the rest (0.5+0)/4 = 0.125. qs[0] = entry 1 {43,8,8,8,8,8,8,8}, sign field 1 (ggml: 129,
   * weights 0 and 7 negative); qs[2] = entry 2 {25,25,8,...}, no signs; qs[4] = entry 0 (all 8) */
  st_block_iq2_xs x2;
  memset(&x2, 0, sizeof x2);
  x2.d = st_f32_to_fp16(1.0f);
  x2.scales[0] = 0x21;
  x2.qs[0] = 1 | 1 << 9, x2.qs[2] = 2;
  const struct known kx2[] = {{0, -16.125f}, {1, 3.0f}, {7, -3.0f}, {16, 15.625f}, {17, 15.625f}, {18, 5.0f}, {32, 1.0f}};
  check_known(ST_TYPE_IQ2_XS, &x2, kx2, 7, "d=1, parity sign");

  /* IQ2_S, d = 1: scales[0] = 0x10 (first 16 at 0.125, next 16 at 0.375); group 0 index
   * 0x00 | qh bits 1 << 8 = 256 {25,25,25,25,25,8,25,8} with sign byte 0x81; group 3 index
   * 0xFF | 3 << 8 = 1023 (all 43) with sign byte 0x02 */
  st_block_iq2_s s2;
  memset(&s2, 0, sizeof s2);
  s2.d = st_f32_to_fp16(1.0f);
  s2.scales[0] = 0x10;
  s2.qh[0] = 0xC1;
  s2.qs[3] = 0xFF, s2.qs[32] = 0x81, s2.qs[35] = 0x02;
  const struct known ks2[] = {{0, -3.125f}, {4, 3.125f}, {5, 1.0f}, {7, -1.0f}, {24, 16.125f}, {25, -16.125f}};
  check_known(ST_TYPE_IQ2_S, &s2, ks2, 6, "d=1, 10-bit indices");

  /* IQ3_XXS, d = 1: sub-block 0 word 0x30000083: scale 3 (d*(0.5+3)/2 = 1.75), sign fields 3
   * (weights 0,1 negative) and 1 (ggml 129: weights 8 and 15 negative); qs[0] = entry 0 {4,4,4,4},
   * qs[1] = entry 5 {62,12,4,4}; other sub-blocks scale 0 (0.25) */
  st_block_iq3_xxs x3;
  memset(&x3, 0, sizeof x3);
  x3.d = st_f32_to_fp16(1.0f);
  x3.qs[1] = 5;
  const uint32_t aux = 0x30000083u;
  memcpy(x3.qs + 64, &aux, 4);
  const struct known kx3[] = {{0, -7.0f}, {1, -7.0f}, {2, 7.0f}, {4, 108.5f}, {5, 21.0f},
                              {8, -7.0f}, {9, 7.0f},  {15, -7.0f}, {32, 1.0f}};
  check_known(ST_TYPE_IQ3_XXS, &x3, kx3, 9, "d=1, packed scale and signs");

  /* IQ3_S, d = 0.5: scales[0] = 0x32 (sub-block 0: 0.5*(1+2*2) = 2.5, sub-block 1: 0.5*(1+2*3) = 3.5),
   * others 0.5; qs[0] = entry 1 {3,1,1,1}, qs[1] = 0 with qh bit 1: entry 256 {7,5,9,5}; sign
   * byte 0x81; sub-block 1 qs[8] = entry 0 {1,1,1,1} */
  st_block_iq3_s s3;
  memset(&s3, 0, sizeof s3);
  s3.d = st_f32_to_fp16(0.5f);
  s3.scales[0] = 0x32;
  s3.qs[0] = 1, s3.qh[0] = 0x02, s3.signs[0] = 0x81;
  const struct known ks3[] = {{0, -7.5f}, {1, 2.5f}, {4, 17.5f}, {6, 22.5f}, {7, -12.5f}, {32, 3.5f}, {64, 0.5f}};
  check_known(ST_TYPE_IQ3_S, &s3, ks3, 7, "d=0.5, 9-bit indices");
}

/* The packed IQ3 grids the VNNI kernel looks up in registers (iq_grids.h) against the grids, entry
 * by entry: nibble k is the level number of byte k. */
static void test_iq3_packed_grids(void) {
  static const uint16_t xxs[256] = ST_IQ3XXS_GRID_NIBBLES, s3[512] = ST_IQ3S_GRID_NIBBLES;
  static const uint8_t xxs_levels[8] = {4, 12, 20, 28, 36, 44, 52, 62};
  int bad_xxs = 0, bad_s = 0;
  for (int i = 0; i < 512; i++)
    for (int k = 0; k < 4; k++) {
      const int ls = (s3[i] >> (4 * k)) & 0xF, gs = (int)(st_iq3s_grid[i] >> (8 * k)) & 0xFF;
      bad_s += ls > 7 || gs != 2 * ls + 1;
      if (i >= 256) continue;
      const int lx = (xxs[i] >> (4 * k)) & 0xF, gx = (int)(st_iq3xxs_grid[i] >> (8 * k)) & 0xFF;
      bad_xxs += lx > 7 || gx != xxs_levels[lx];
    }
  CHECK(bad_xxs == 0 && bad_s == 0, "packed IQ3 grids: 256 IQ3_XXS and 512 IQ3_S entries × 4 bytes, %d and %d differ from the grids",
        bad_xxs, bad_s);
}

/* The byte planes the VBMI kernels look grids up in (iq_grids.h): the IQ3 planes against the
 * nibble words (checked above against the grids); the IQ2 code planes and the IQ2 code words (the
 * kernels without VBMI, and the VBMI gathers' tables) against the grids, entry by entry and byte by byte
 * (code c of byte j: level 8, 25 or 43). */
static int iq2_codes_differ(const uint64_t *grid, int n, const uint8_t *planes, const uint16_t *words) {
  static const uint8_t levels[4] = {8, 25, 43, 0};
  int bad = 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < 8; j++) {
      const int cp = ((j < 4 ? planes[i] : planes[n + i]) >> (2 * (j % 4))) & 3;
      const int cw = (words[i] >> (2 * j)) & 3;
      const int want = (int)((grid[i] >> (8 * j)) & 0xFF);
      bad += (levels[cp] != want) + (levels[cw] != want);
    }
  return bad;
}

static void test_grid_planes(void) {
  static const uint16_t xxs[256] = ST_IQ3XXS_GRID_NIBBLES, s3[512] = ST_IQ3S_GRID_NIBBLES;
  static const uint8_t pxxs[512] = ST_IQ3XXS_GRID_PLANES, ps3[1024] = ST_IQ3S_GRID_PLANES;
  static const uint8_t p2xs[1024] = ST_IQ2XS_GRID_PLANES, p2s[2048] = ST_IQ2S_GRID_PLANES;
  static const uint16_t w2xs[512] = ST_IQ2XS_GRID_CODES, w2s[1024] = ST_IQ2S_GRID_CODES;
  int bad3 = 0;
  for (int i = 0; i < 512; i++) {
    bad3 += ps3[i] != (s3[i] & 0xFF) || ps3[512 + i] != s3[i] >> 8;
    if (i < 256) bad3 += pxxs[i] != (xxs[i] & 0xFF) || pxxs[256 + i] != xxs[i] >> 8;
  }
  const int bad2xs = iq2_codes_differ(st_iq2xs_grid, 512, p2xs, w2xs),
            bad2s = iq2_codes_differ(st_iq2s_grid, 1024, p2s, w2s);
  CHECK(bad3 == 0 && bad2xs == 0 && bad2s == 0,
        "grid byte planes: IQ3 (256 + 512 entries × 2 bytes) %d differ from the nibble words; IQ2 code "
        "planes and code words (512 + 1024 entries × 8 bytes, twice) %d and %d differ from the grids",
        bad3, bad2xs, bad2s);
}

/* Every entry of the four grids at every entry position of a super-block (N grid entries, N
 * super-blocks: entry e of super-block b at index (b + (E + 1) e) mod N, E entries per block, so
 * that one block's indices differ in their high bits too; random signs and scales) through
 * st_matmul_q8 at every level this CPU has and, at the top level, with both grid lookups,
 * against the scalar level: bitwise. */
static void test_grid_every_index(void) {
  static const struct {
    uint32_t type;
    int entries, per_block; /* N, E */
  } grids[] = {{ST_TYPE_IQ2_XS, 512, 32},
               {ST_TYPE_IQ2_S, 1024, 32},
               {ST_TYPE_IQ3_XXS, 256, 64},
               {ST_TYPE_IQ3_S, 512, 64}};
  for (size_t k = 0; k < sizeof grids / sizeof grids[0]; k++) {
    const uint32_t type = grids[k].type;
    const int N = grids[k].entries, E = grids[k].per_block, n = 256 * N;
    const uint64_t rb = st_row_bytes(type, (uint64_t)n), qb = st_q8_row_bytes(type, n);
    uint8_t *w = malloc(rb);
    tu_random_row(type, w, n, &rng); /* finite scales, random signs and grid scales */
    for (int b = 0; b < N; b++) {
      uint8_t *bb = w + (uint64_t)b * st_type_info(type)->type_size;
      for (int e = 0; e < E; e++) {
        const int idx = (b + (E + 1) * e) % N;
        if (type == ST_TYPE_IQ2_XS) {
          st_block_iq2_xs *x = (st_block_iq2_xs *)(void *)bb;
          x->qs[e] = (uint16_t)((x->qs[e] & 0xFE00) | idx);
        } else if (type == ST_TYPE_IQ2_S) {
          st_block_iq2_s *x = (st_block_iq2_s *)(void *)bb;
          x->qs[e] = (uint8_t)idx;
          x->qh[e / 4] = (uint8_t)((x->qh[e / 4] & ~(3 << 2 * (e % 4))) | (idx >> 8) << 2 * (e % 4));
        } else if (type == ST_TYPE_IQ3_XXS) {
          ((st_block_iq3_xxs *)(void *)bb)->qs[e] = (uint8_t)idx;
        } else {
          st_block_iq3_s *x = (st_block_iq3_s *)(void *)bb;
          x->qs[e] = (uint8_t)idx;
          x->qh[e / 8] = (uint8_t)((x->qh[e / 8] & ~(1 << e % 8)) | (idx >> 8) << e % 8);
        }
      }
    }
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++)
      x[i] = (float)urand();
    uint8_t *xq = malloc(qb);
    st_quantize_act(type, x, n, 1, n, xq);
    const int top = st_dot_force_isa(3), lookup = st_dot_grid_lookup(-1);
    float ref, out[5] = {0};
    int runs = 0, same = 1;
    st_dot_force_isa(0);
    st_matmul_q8(type, w, rb, 0, 1, xq, 1, n, &ref, 1);
    for (int level = 1; level <= top + (top == 3); level++) { /* level 3 twice: both lookups */
      st_dot_force_isa(level < 3 ? level : 3);
      st_dot_grid_lookup(level == 4);
      st_matmul_q8(type, w, rb, 0, 1, xq, 1, n, &out[runs], 1);
      same &= memcmp(&ref, &out[runs++], sizeof ref) == 0;
    }
    st_dot_force_isa(top);
    st_dot_grid_lookup(lookup);
    CHECK(same,
          "%s every grid entry at every position (%d super-blocks), levels 1..%d (%d runs, the top one with "
          "both lookups): last %.9g, scalar %.9g: %s",
          st_type_info(type)->name, N, top, runs, (double)(runs ? out[runs - 1] : ref), (double)ref,
          same ? "bitwise equal" : "DIFFER");
    free(w), free(x), free(xq);
  }
}

/* st_quantize_act gives the same quants at every level: the scalar and SIMD quantisers do the same
 * float operations (a multiply, then an add: a compiler that fused them into one FMA in one of
 * them only would round differently near a boundary). Many rows of varied scale, so that values
 * land near rounding boundaries; both activation layouts. */
static void test_act_quant_levels(void) {
  enum { N = 512, ROWS = 400 };
  float *x = malloc(sizeof(float) * N * ROWS);
  for (int r = 0; r < ROWS; r++) {
    const double scale = ldexp(1.0, (int)(urand() * 20.0));
    for (int i = 0; i < N; i++)
      x[r * N + i] = (float)(urand() * scale);
    if (r % 2) { /* half the rows: values a few ulps from a rounding boundary (k + 1/2) / id */
      const float amax = (float)scale, id = 127.0f / amax;
      x[r * N] = amax;
      for (int i = 1; i < N; i++) {
        float v = ((float)(int)(urand() * 126.0) + 0.5f) / id;
        for (int u = (int)(urand() * 3.0); u != 0; u += u > 0 ? -1 : 1)
          v = nextafterf(v, u > 0 ? INFINITY : 0.0f);
        x[r * N + i] = v;
      }
    }
  }
  const uint32_t types[] = {ST_TYPE_Q8_0, ST_TYPE_Q4_K, ST_TYPE_IQ3_S};
  const int top = st_dot_force_isa(3);
  for (int k = 0; k < 3; k++) {
    const uint64_t qb = st_q8_row_bytes(types[k], N);
    uint8_t *a = malloc(qb * ROWS), *b = malloc(qb * ROWS);
    for (int l = 0; l <= top; l++) {
      st_dot_force_isa(0);
      st_quantize_act(types[k], x, N, ROWS, N, a);
      st_dot_force_isa(l);
      st_quantize_act(types[k], x, N, ROWS, N, b);
      uint64_t differ = 0;
      for (uint64_t i = 0; i < qb * ROWS; i++)
        differ += a[i] != b[i];
      CHECK(differ == 0,
            "activation quantisation for %s at level %d (%s): %llu of %llu bytes differ from scalar (%d rows "
            "of %d, "
            "scales 2^-19..2^19, half of them near rounding boundaries)",
            st_type_info(types[k])->name, l, st_dot_q8_isa(), (unsigned long long)differ,
            (unsigned long long)(qb * ROWS), ROWS, N);
    }
    free(a);
    free(b);
  }
  st_dot_force_isa(top);
  free(x);
}

static void test_rmsnorm(void) {
  enum { N = 100 };
  float x[N], w[N], y[N];
  for (int i = 0; i < N; i++) x[i] = (float)urand() * 4, w[i] = 1.0f + (float)urand() * 0.1f;
  st_rmsnorm(x, w, y, N, 1e-6f);
  double ss = 0, worst = 0;
  for (int i = 0; i < N; i++) ss += (double)x[i] * x[i];
  const double s = 1.0 / sqrt(ss / N + 1e-6);
  for (int i = 0; i < N; i++) worst = fmax(worst, fabs(y[i] - x[i] * s * w[i]) / fabs(x[i] * s * w[i] + 1e-30));
  CHECK(worst <= 1e-6, "rmsnorm n=%d: max relative error %.2e (≤ 1e-6) vs float64", N, worst);
}

/* st_matmul_q8_2 (two-term int8 activations: K and V of Q8_0 files): the second term's
 * reconstruction within max|x| / 64,516 per block and element (its definition's bound), the
 * product against float64 of the dequantised rows times the float activations (≤ 3e-5 of Σ|w·x|;
 * one term alone is printed for comparison), every level bitwise equal to the scalar one, and T
 * tokens against one at a time bitwise. */
static void test_int8_two_term(uint32_t type, int n, int T) {
  enum { ROWS = 37 };
  const int qk = st_q8_row_bytes(type, 32) ? 32 : 256; /* the activation blocks: q8_0's or q8_K's */
  const char *name = st_type_info(type)->name;
  float *deq = malloc(sizeof(float) * ROWS * (size_t)n), *x = malloc(sizeof(float) * T * (size_t)n);
  float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
  void *w = make_weights(type, ROWS, n, deq, 1);
  for (int i = 0; i < T * n; i++) x[i] = (float)(urand() * (i % 7 == 0 ? 4.0 : 1.0));
  const uint64_t rb = st_row_bytes(type, (uint64_t)n), qb = st_q8_row_bytes(type, n);
  uint8_t *xq = malloc(qb * (size_t)T), *xr = malloc(qb * (size_t)T);
  st_quantize_act(type, x, n, T, n, xq);
  st_quantize_act_residual(type, x, n, T, n, xq, xr);
  double recon = 0; /* worst |x - (d q + d' q')| / (max|x| of its block / 64516) */
  for (int t = 0; t < T; t++) {
    st_dequantize_act(type, xq + qb * (size_t)t, a, n);
    st_dequantize_act(type, xr + qb * (size_t)t, b, n);
    for (int blk = 0; blk < n / qk; blk++) {
      double mx = 0;
      for (int i = qk * blk; i < qk * blk + qk; i++) mx = fmax(mx, fabs(x[(size_t)t * n + i]));
      for (int i = qk * blk; i < qk * blk + qk; i++)
        recon = fmax(recon, fabs((double)x[(size_t)t * n + i] - ((double)a[i] + (double)b[i])) / (mx / 64516.0));
    }
  }
  CHECK(recon <= 1.001, "two-term int8 activations for %s n=%d: |x - (d q + d' q')| ≤ %.4f of max|x| / 64516 per block of %d (≤ 1.001: the bound and the residual's own rounding)", name, n, recon, qk);
  const int top = st_dot_force_isa(3);
  float *ref = malloc(sizeof(float) * ROWS * (size_t)T), *out = malloc(sizeof(float) * ROWS * (size_t)T);
  float one[ROWS], single[ROWS];
  for (int level = 0; level <= top; level++) {
    st_dot_force_isa(level);
    st_matmul_q8_2(type, w, rb, 0, ROWS, xq, xr, T, n, out, ROWS);
    if (level == 0) memcpy(ref, out, sizeof(float) * ROWS * (size_t)T);
    int same = 1;
    double worst = 0, worst1 = 0;
    for (int t = 0; t < T; t++) {
      st_matmul_q8_2(type, w, rb, 0, ROWS, xq + qb * (size_t)t, xr + qb * (size_t)t, 1, n, one, ROWS);
      st_matmul_q8(type, w, rb, 0, ROWS, xq + qb * (size_t)t, 1, n, single, ROWS);
      same &= memcmp(one, out + t * ROWS, sizeof one) == 0;
      for (int r = 0; r < ROWS; r++) {
        double dot = 0, mag = 0;
        for (int i = 0; i < n; i++) {
          dot += (double)deq[(size_t)r * n + i] * x[(size_t)t * n + i];
          mag += fabs((double)deq[(size_t)r * n + i] * x[(size_t)t * n + i]);
        }
        worst = fmax(worst, fabs(out[t * ROWS + r] - dot) / mag);
        worst1 = fmax(worst1, fabs(single[r] - dot) / mag);
      }
    }
    const int as_scalar = memcmp(out, ref, sizeof(float) * ROWS * (size_t)T) == 0;
    CHECK(worst <= 3e-5 && same && as_scalar,
          "two-term int8 matmul %s n=%d %s: %d×%d outputs, max |Δ|/Σ|w·x| = %.2e (≤ 3e-5; one term: %.2e) vs float64 "
          "of dequantised rows × float activations; T=%d vs T=1 %s; %s scalar",
          name, n, st_dot_q8_isa(), T, ROWS, worst, worst1, T, same ? "bitwise identical" : "DIFFER",
          as_scalar ? "bitwise equal to" : "DIFFERS from");
  }
  st_dot_force_isa(top);
  free(ref), free(out), free(xq), free(xr), free(w), free(deq), free(x), free(a), free(b);
}

/* st_matmul_q8 (integer dot products on quantised activations) at every level this CPU has:
 * against float64 of the dequantised weights times the quantised-then-dequantised activations
 * (the kernels' own problem: ≤ 1e-6 of Σ|w·x|), every level bitwise equal to the scalar one,
 * T tokens vs one at a time bitwise; and the error the activation quantisation adds against the
 * float activations, printed (not a bound of the kernels). */
static void test_int8(uint32_t type, int n, int quantise, int T) {
  enum { ROWS = 37, T_MAX = 19 };
  float *deq = malloc(sizeof(float) * ROWS * (size_t)n), *x = malloc(sizeof(float) * T * (size_t)n);
  float *xd = malloc(sizeof(float) * T * (size_t)n);
  void *w = make_weights(type, ROWS, n, deq, quantise);
  for (int i = 0; i < T * n; i++) x[i] = (float)urand();
  const uint64_t rb = st_row_bytes(type, (uint64_t)n), qb = st_q8_row_bytes(type, n);
  uint8_t *xq = malloc(qb * (size_t)T);
  const int top_q = st_dot_force_isa(3);
  st_dot_force_isa(0);
  st_quantize_act(type, x, n, T, n, xq);
  uint8_t *xq_top = malloc(qb * (size_t)T);
  st_dot_force_isa(top_q);
  st_quantize_act(type, x, n, T, n, xq_top);
  CHECK(memcmp(xq, xq_top, qb * (size_t)T) == 0, "int8 %s n=%d: activation quantisation, %s code bitwise equal to scalar (%d rows)",
        st_type_info(type)->name, n, st_dot_isa(), T);
  free(xq_top);
  for (int t = 0; t < T; t++) st_dequantize_act(type, xq + qb * (size_t)t, xd + (size_t)t * n, n);
  double worst = 0, worst_f = 0, se = 0, ss = 0;
  for (int t = 0; t < T; t++)
    for (int r = 0; r < ROWS; r++) {
      double ref = 0, reff = 0, magf = 0;
      for (int i = 0; i < n; i++) {
        const double wv = deq[(size_t)r * n + i];
        ref += wv * xd[(size_t)t * n + i];
        reff += wv * x[(size_t)t * n + i];
        magf += fabs(wv * x[(size_t)t * n + i]);
      }
      se += (ref - reff) * (ref - reff), ss += reff * reff;
      worst_f = fmax(worst_f, fabs(ref - reff) / magf);
    }
  const int top = st_dot_force_isa(3), gathers = st_dot_grid_lookup(-1);
  float scalar_out[T_MAX * ROWS];
  /* the grid formats at level 3 twice: their grid looked up both ways (st_dot_grid_lookup) */
  const int grid = type == ST_TYPE_IQ2_XS || type == ST_TYPE_IQ2_S || type == ST_TYPE_IQ3_XXS ||
                   type == ST_TYPE_IQ3_S,
            iq2 = type == ST_TYPE_IQ2_XS || type == ST_TYPE_IQ2_S;
  for (int pass = 0; pass <= top + (top == 3 && grid); pass++) {
    const int level = pass < 3 ? pass : 3;
    st_dot_force_isa(level);
    st_dot_grid_lookup(pass == 4 ? !gathers : gathers);
    const char *lookup = level < 3 || !grid        ? ""
                         : !st_dot_grid_lookup(-1) ? " (grid by vpermi2b)"
                         : iq2                     ? " (grid gathered)"
                                                   : " (grid by vpermb pairs)";
    float out[T_MAX * ROWS], one[ROWS];
    st_matmul_q8(type, w, rb, 0, ROWS, xq, T, n, out, ROWS);
    if (level == 0) memcpy(scalar_out, out, sizeof out);
    int same = 1;
    worst = 0;
    for (int t = 0; t < T; t++) {
      st_matmul_q8(type, w, rb, 0, ROWS, xq + qb * (size_t)t, 1, n, one, ROWS);
      same &= memcmp(one, out + t * ROWS, sizeof one) == 0;
      for (int r = 0; r < ROWS; r++) {
        double ref = 0, mag = 0;
        for (int i = 0; i < n; i++) {
          ref += (double)deq[(size_t)r * n + i] * xd[(size_t)t * n + i];
          mag += fabs((double)deq[(size_t)r * n + i] * xd[(size_t)t * n + i]);
        }
        worst = fmax(worst, fabs(out[t * ROWS + r] - ref) / mag);
      }
    }
    const int as_scalar = memcmp(out, scalar_out, sizeof(float) * (size_t)T * ROWS) == 0;
    /* at the AVX-512 levels, the rows of one or two tokens walked the other way (st_dot_row_pairs):
     * the same bits, token by token and for T = 2 */
    int walks = 1;
    const int pairs = st_dot_row_pairs(-1);
    if (level >= 2) {
      walks = st_dot_row_pairs(!pairs) == !pairs; /* the switch took */
      float alt[2 * ROWS];
      for (int t = 0; t < T; t++) {
        for (int r = 0; r < ROWS; r++)
          alt[r] = NAN; /* an output left unwritten differs */
        st_matmul_q8(type, w, rb, 0, ROWS, xq + qb * (size_t)t, 1, n, alt, ROWS);
        walks &= memcmp(alt, out + t * ROWS, sizeof(float) * ROWS) == 0;
        st_matmul_q8(type, w, rb, 5, ROWS - 3, xq + qb * (size_t)t, 1, n, alt, ROWS); /* a slice */
        walks &= memcmp(alt, out + t * ROWS + 5, sizeof(float) * (ROWS - 8)) == 0;
      }
      if (T >= 2) {
        for (int r = 0; r < 2 * ROWS; r++)
          alt[r] = NAN;
        st_matmul_q8(type, w, rb, 0, ROWS, xq, 2, n, alt, ROWS);
        walks &= memcmp(alt, out, sizeof alt) == 0;
      }
      st_dot_row_pairs(pairs);
    }
    /* a task's slice of rows (r0 > 0, as the CPU pool's FFN slices) gives the same bits */
    float sub[T_MAX * ROWS];
    st_matmul_q8(type, w, rb, 5, ROWS - 3, xq, T, n, sub, ROWS);
    int sliced = 1;
    for (int t = 0; t < T; t++)
      sliced &= memcmp(sub + t * ROWS, out + t * ROWS + 5, sizeof(float) * (ROWS - 8)) == 0;
    CHECK(
        worst <= 1e-6 && same && as_scalar && sliced && walks,
        "int8 matmul %s n=%d %s%s%s: %d×%d outputs, max |Δ|/Σ|w·x| = %.2e (≤ 1e-6) vs float64 of dequantised "
        "rows × dequantised activation quants; T=%d vs T=1 %s; rows 5..%d alone %s;%s %s scalar",
        st_type_info(type)->name, n, st_dot_q8_isa(), lookup, quantise ? ", quantised rows" : "", T, ROWS,
        worst, T, same ? "bitwise identical" : "DIFFER", ROWS - 4, sliced ? "bitwise identical" : "DIFFER",
        level < 2 ? ""
        : walks   ? " rows in pairs and one at a time bitwise identical;"
                  : " row walks DIFFER;",
        as_scalar ? "bitwise equal to" : "DIFFERS from");
  }
  st_dot_force_isa(top);
  st_dot_grid_lookup(gathers);
  printf("     int8 %s n=%d: activation quantisation error vs float activations: max |Δ|/Σ|w·x| = %.2e, "
         "RMS Δ / RMS dot = %.2e\n",
         st_type_info(type)->name, n, worst_f, sqrt(se / ss));
  free(w);
  free(deq);
  free(x);
  free(xd);
  free(xq);
}

/* st_dense_terms' rule, and st_dense_matmul (the CPU's dense products) against its parts: one term
 * (Q8_0's Q and attention output) bitwise equal to st_quantize_act + st_matmul_q8, with the cached
 * quants reused by a second call; two terms (a Q4_K matrix) bitwise equal to st_quantize_act,
 * st_quantize_act_residual and st_matmul_q8_2; none bitwise st_matmul. */
static void test_dense_matmul(void) {
  enum { ROWS = 19, T = 5, N = 512 };
  float deq[ROWS * N], x[T * N], want[T * ROWS], got[T * ROWS];
  void *w8 = make_weights(ST_TYPE_Q8_0, ROWS, N, deq, 0), *wk = make_weights(ST_TYPE_Q4_K, ROWS, N, deq, 0);
  for (int i = 0; i < T * N; i++) x[i] = (float)urand();
  memset(want, 0, sizeof want), memset(got, 0, sizeof got); /* r0 = 2: the last two of each token's ROWS outputs stay 0 */
  const uint64_t rb8 = st_row_bytes(ST_TYPE_Q8_0, N), rbk = st_row_bytes(ST_TYPE_Q4_K, N), qb = st_q8_row_bytes(ST_TYPE_Q8_0, N);
  uint8_t *xq_ref = malloc(qb * T);
  st_quantize_act(ST_TYPE_Q8_0, x, N, T, N, xq_ref);
  st_matmul_q8(ST_TYPE_Q8_0, w8, rb8, 2, ROWS, xq_ref, T, N, want, ROWS);
  void *xq = NULL;
  st_dense_matmul(ST_TYPE_Q8_0, w8, rb8, 2, ROWS, x, N, T, N, got, ROWS, 1, &xq);
  int ok = xq && memcmp(xq, xq_ref, qb * T) == 0 && memcmp(want, got, sizeof want) == 0;
  /* the second call reuses the quants (the same x): the same bits again */
  st_dense_matmul(ST_TYPE_Q8_0, w8, rb8, 2, ROWS, x, N, T, N, got, ROWS, 1, &xq);
  ok = ok && memcmp(want, got, sizeof want) == 0;
  CHECK(ok, "st_dense_matmul Q8_0, int8: bitwise st_quantize_act + st_matmul_q8 (%d rows x %d tokens, twice)", ROWS - 2, T);
  const int terms[][4] = {{ST_TYPE_Q8_0, st_dense_terms(ST_TYPE_Q8_0, N, 1, ST_DENSE_QO), st_dense_terms(ST_TYPE_Q8_0, N, 1, ST_DENSE_KV),
                           st_dense_terms(ST_TYPE_Q8_0, N, 1, ST_DENSE_HEAD)},
                          {ST_TYPE_Q4_K, st_dense_terms(ST_TYPE_Q4_K, N, 1, ST_DENSE_QO), st_dense_terms(ST_TYPE_Q4_K, N, 1, ST_DENSE_KV),
                           st_dense_terms(ST_TYPE_Q4_K, N, 1, ST_DENSE_HEAD)},
                          {ST_TYPE_F16, st_dense_terms(ST_TYPE_F16, N, 1, ST_DENSE_QO), st_dense_terms(ST_TYPE_F16, N, 1, ST_DENSE_KV),
                           st_dense_terms(ST_TYPE_F16, N, 1, ST_DENSE_HEAD)}};
  const int expect[3][3] = {{1, 2, 1}, {2, 2, 1}, {0, 0, 0}};
  int rule = st_dense_terms(ST_TYPE_Q4_K, N, 0, ST_DENSE_KV) == 0;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) rule &= terms[i][j + 1] == expect[i][j];
  CHECK(rule, "st_dense_terms (Q, K/V, head): q8_0 %d %d %d, q4_K %d %d %d, f16 %d %d %d; int8 off 0", terms[0][1], terms[0][2],
        terms[0][3], terms[1][1], terms[1][2], terms[1][3], terms[2][1], terms[2][2], terms[2][3]);
  const uint64_t qk = st_q8_row_bytes(ST_TYPE_Q4_K, N);
  uint8_t *xk = malloc(2 * qk * T);
  st_quantize_act(ST_TYPE_Q4_K, x, N, T, N, xk);
  st_quantize_act_residual(ST_TYPE_Q4_K, x, N, T, N, xk, xk + qk * T);
  st_matmul_q8_2(ST_TYPE_Q4_K, wk, rbk, 0, ROWS, xk, xk + qk * T, T, N, want, ROWS);
  void *xq2 = NULL; /* another layout: its own cache of quants */
  st_dense_matmul(ST_TYPE_Q4_K, wk, rbk, 0, ROWS, x, N, T, N, got, ROWS, 2, &xq2);
  CHECK(xq2 && memcmp(xq2, xk, 2 * qk * T) == 0 && memcmp(want, got, sizeof want) == 0,
        "st_dense_matmul Q4_K, two terms: bitwise st_quantize_act + st_quantize_act_residual + st_matmul_q8_2");
  free(xq2), free(xk);
  st_matmul(ST_TYPE_Q8_0, w8, rb8, 0, ROWS, x, N, T, N, want, ROWS);
  st_dense_matmul(ST_TYPE_Q8_0, w8, rb8, 0, ROWS, x, N, T, N, got, ROWS, 0, &xq);
  CHECK(memcmp(want, got, sizeof want) == 0, "st_dense_matmul Q8_0, no terms: bitwise st_matmul");
  free(xq);
  free(xq_ref);
  free(w8);
  free(wk);
}

/* st_axpy at every SIMD level bitwise equal to the plain loop; st_attend_tokens (tiles of
 * tokens x heads) bitwise equal to st_attend_head row by row, with the whole batch in one tile
 * and with scratch for only a few rows (several tiles), for a float32 and a half KV cache; the
 * half cache's output within 1e-5 of max |out| of the float32 path's on the same rounded keys and
 * values (the two differ only in how a row is read). */
static void test_attend_tokens(void) {
  enum { N = 37 };
  float o[N], v[N], want[N];
  for (int i = 0; i < N; i++) o[i] = (float)urand(), v[i] = (float)urand();
  for (int i = 0; i < N; i++) want[i] = o[i] + 0.3f * v[i];
  const int top = st_dot_force_isa(3);
  for (int l = 0; l <= (top < 2 ? top : 2); l++) {
    float got[N];
    memcpy(got, o, sizeof o);
    st_dot_force_isa(l);
    st_axpy(got, 0.3f, v, N);
    CHECK(memcmp(got, want, sizeof want) == 0, "st_axpy at %s (%d floats): bitwise the plain loop", st_dot_isa(), N);
    uint16_t vh[N];
    float want_h[N];
    for (int i = 0; i < N; i++) vh[i] = st_f32_to_fp16(v[i]), want_h[i] = o[i] + 0.3f * st_fp16_to_f32(vh[i]);
    memcpy(got, o, sizeof o);
    st_axpy_f16(got, 0.3f, vh, N);
    CHECK(memcmp(got, want_h, sizeof want_h) == 0, "st_axpy_f16 at %s (%d halves): bitwise the plain loop", st_dot_isa(), N);
    enum { N8 = 64 }; /* a q8_0 KV cache's row of 64 values: 64 quants, then 2 scales */
    float o8[N8], v8[N8], want_8[N8], got_8[N8];
    uint8_t r8[N8 + 4];
    for (int i = 0; i < N8; i++) o8[i] = (float)urand(), v8[i] = 3.0f * (float)urand();
    st_kv_store(ST_TYPE_Q8_0, v8, r8, N8, N8);
    const uint16_t *d8 = (const uint16_t *)(r8 + N8);
    for (int i = 0; i < N8; i++) want_8[i] = o8[i] + 0.3f * (st_fp16_to_f32(d8[i / 32]) * (float)(int8_t)r8[i]);
    memcpy(got_8, o8, sizeof o8);
    st_axpy_kv_q8(got_8, 0.3f, (const int8_t *)r8, d8, N8);
    CHECK(memcmp(got_8, want_8, sizeof want_8) == 0, "st_axpy_kv_q8 at %s (%d values): bitwise the plain loop", st_dot_isa(), N8);
    /* st_kv_q8_scores: 5 query rows (two tiles) against 5 keys of 96 values, against st_matmul on the same values as
     * ggml's Q8_0 blocks */
    enum { HD8 = 96, NK8 = 5, R8 = 5 };
    float kx[NK8 * HD8], qx[R8 * HD8], sc[R8 * NK8];
    uint8_t kr8[NK8 * (HD8 + HD8 / 16)];
    for (int i = 0; i < NK8 * HD8; i++) kx[i] = 2.0f * (float)urand();
    for (int i = 0; i < R8 * HD8; i++) qx[i] = (float)urand();
    st_kv_store(ST_TYPE_Q8_0, kx, kr8, NK8 * HD8, HD8);
    st_kv_q8_scores(kr8, HD8 + HD8 / 16, NK8, qx, HD8, R8, HD8, sc, NK8);
    st_block_q8_0 kb8[NK8 * HD8 / 32];
    float sc_ref[R8 * NK8];
    st_quantize_row(ST_TYPE_Q8_0, kx, kb8, NK8 * HD8); /* the same blocks as the rows hold */
    st_matmul(ST_TYPE_Q8_0, kb8, HD8 / 32 * sizeof(st_block_q8_0), 0, NK8, qx, HD8, R8, HD8, sc_ref, NK8);
    CHECK(!memcmp(sc, sc_ref, sizeof sc), "st_kv_q8_scores at %s (%d x %d dot products of %d): bitwise st_matmul's Q8_0 rows",
          st_dot_isa(), R8, NK8, HD8);
  }
  st_dot_force_isa(top);
  enum { T = 6, NQ = 3, HD = 40, POS0 = 9, KEYS = POS0 + T };
  static float q[T * NQ * HD], k[KEYS * HD], vv[KEYS * HD], ref[T * NQ * HD], out[T * NQ * HD], score[T * NQ * KEYS];
  for (int i = 0; i < T * NQ * HD; i++) q[i] = (float)urand();
  for (int i = 0; i < KEYS * HD; i++) k[i] = (float)urand(), vv[i] = (float)urand();
  static uint16_t kh[KEYS * HD], vh[KEYS * HD];
  static float f32_out[T * NQ * HD];
  for (int kt = 0; kt < 2; kt++) {
    const int type = kt ? ST_TYPE_F16 : ST_TYPE_F32;
    const void *kc = k, *vc = vv;
    if (kt) { /* the half cache, and the float32 one rounded the same way for the comparison */
      st_kv_store(ST_TYPE_F16, k, kh, KEYS * HD, HD);
      st_kv_store(ST_TYPE_F16, vv, vh, KEYS * HD, HD);
      st_dequantize_row(ST_TYPE_F16, kh, k, KEYS * HD);
      st_dequantize_row(ST_TYPE_F16, vh, vv, KEYS * HD);
      for (int t = 0; t < T; t++)
        for (int h = 0; h < NQ; h++)
          st_attend_head(q + (t * NQ + h) * HD, ST_TYPE_F32, k, vv, POS0 + t + 1, HD, score, f32_out + (t * NQ + h) * HD);
      kc = kh, vc = vh;
    }
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NQ; h++)
        st_attend_head(q + (t * NQ + h) * HD, type, kc, vc, POS0 + t + 1, HD, score, ref + (t * NQ + h) * HD);
    const int64_t caps[2] = {T * NQ * KEYS, 2 * NQ * KEYS};
    for (int c = 0; c < 2; c++) {
      memset(out, 0, sizeof out);
      st_attend_tokens(q, T, NQ, HD, POS0, type, kc, vc, out, score, caps[c]);
      CHECK(memcmp(out, ref, sizeof ref) == 0,
            "st_attend_tokens (%d tokens x %d heads, hd %d, from position %d, %s, %s KV cache): bitwise st_attend_head", T,
            NQ, HD, POS0, c ? "tiles of 2 tokens or fewer" : "one tile", kt ? "f16" : "f32");
    }
    if (kt) {
      double mx = 0, mag = 0;
      for (int i = 0; i < T * NQ * HD; i++) mx = fmax(mx, fabs(ref[i] - f32_out[i])), mag = fmax(mag, fabs(f32_out[i]));
      CHECK(mx <= 1e-5 * mag, "f16 KV cache vs float32 on the same rounded keys and values: max |Δ| %.2e (≤ 1e-5 × %.3f)",
            mx, mag);
    }
  }
}

/* The q8_0 KV cache (rows of int8 quants and fp16 scales, head_dim 64): st_attend_tokens bitwise equal to
 * st_attend_head row by row (one tile, and tiles of 2 tokens or fewer), and within 1e-5 of max
 * |out| of the float32 path on the same keys and values decoded from the blocks (scores through
 * st_matmul's Q8_0 rows, P V through st_axpy_q8_0). */
static void test_attend_q8_0(void) {
  enum { T = 6, NQ = 3, HD = 64, POS0 = 9, KEYS = POS0 + T, RB = HD + HD / 16 };
  static float q[T * NQ * HD], k[KEYS * HD], v[KEYS * HD], ref[T * NQ * HD], out[T * NQ * HD], f32_out[T * NQ * HD];
  static float score[T * NQ * KEYS];
  static uint8_t kq[KEYS * RB], vq[KEYS * RB];
  for (int i = 0; i < T * NQ * HD; i++) q[i] = (float)urand();
  for (int i = 0; i < KEYS * HD; i++) k[i] = 2.0f * (float)urand(), v[i] = (float)urand();
  CHECK(st_kv_row_bytes(ST_TYPE_Q8_0, HD) == RB, "q8_0 KV row of %d values: %llu bytes (%d quants, %d fp16 scales)", HD,
        (unsigned long long)st_kv_row_bytes(ST_TYPE_Q8_0, HD), HD, HD / 32);
  st_kv_store(ST_TYPE_Q8_0, k, kq, KEYS * HD, HD);
  st_kv_store(ST_TYPE_Q8_0, v, vq, KEYS * HD, HD);
  /* each row's quants and scales are ggml's Q8_0 of its 32s */
  int same_q = 1;
  for (int r = 0; r < KEYS; r++)
    for (int b = 0; b < HD / 32; b++) {
      st_block_q8_0 blk;
      st_quantize_row_q8_0(k + r * HD + 32 * b, &blk, 32);
      same_q &= !memcmp(blk.qs, kq + r * RB + 32 * b, 32) && !memcmp(&blk.d, kq + r * RB + HD + 2 * b, 2);
    }
  CHECK(same_q, "q8_0 KV rows: quants and scales those of st_quantize_row_q8_0 for each 32 values (%d rows)", KEYS);
  st_kv_load(ST_TYPE_Q8_0, kq, k, KEYS * HD, HD);
  st_kv_load(ST_TYPE_Q8_0, vq, v, KEYS * HD, HD);
  for (int t = 0; t < T; t++)
    for (int h = 0; h < NQ; h++) {
      const int r = t * NQ + h;
      st_attend_head(q + r * HD, ST_TYPE_F32, k, v, POS0 + t + 1, HD, score, f32_out + r * HD);
      st_attend_head(q + r * HD, ST_TYPE_Q8_0, kq, vq, POS0 + t + 1, HD, score, ref + r * HD);
    }
  const int64_t caps[2] = {T * NQ * KEYS, 2 * NQ * KEYS};
  for (int c = 0; c < 2; c++) {
    memset(out, 0, sizeof out);
    st_attend_tokens(q, T, NQ, HD, POS0, ST_TYPE_Q8_0, kq, vq, out, score, caps[c]);
    CHECK(memcmp(out, ref, sizeof ref) == 0,
          "st_attend_tokens (%d tokens x %d heads, hd %d, from position %d, %s, q8_0 KV cache): bitwise st_attend_head", T, NQ,
          HD, POS0, c ? "tiles of 2 tokens or fewer" : "one tile");
  }
  double mx = 0, mag = 0;
  for (int i = 0; i < T * NQ * HD; i++) mx = fmax(mx, fabs(ref[i] - f32_out[i])), mag = fmax(mag, fabs(f32_out[i]));
  CHECK(mx <= 1e-5 * mag, "q8_0 KV cache vs float32 on the keys and values decoded from its blocks: max |Δ| %.2e (≤ 1e-5 × %.3f)",
        mx, mag);
}

/* MXFP4's quantiser against its definition (ggml's quantize_row_mxfp4_ref): the scale exponent
 * floor(log2 max|x|) - 2 + 127, then each weight the level whose float error |level d - x| is
 * smallest, the first on a tie, found here by a plain search weight by weight; the quantiser
 * searches four weights at a time (quant.c). Blocks of uniform values at four magnitudes and of
 * multiples of 1/4, which fall on levels and midpoints (ties). Bitwise. */
static void test_mxfp4_quantize(void) {
  enum { NB = 20000 };
  float *x = malloc(sizeof(float) * 32 * NB);
  st_block_mxfp4 *got = malloc(sizeof *got * NB);
  for (int i = 0; i < 32 * NB; i++) {
    const double u = urand();
    const int kind = i / 32 % 4;
    x[i] = kind == 0 ? (float)u : kind == 1 ? (float)(u * 1e-3) : kind == 2 ? (float)(int)(u * 24) * 0.25f : (float)(u * 37.5);
  }
  st_quantize_row(ST_TYPE_MXFP4, x, got, 32 * NB);
  int differ = -1;
  for (int k = 0; k < NB && differ < 0; k++) {
    const float *v = x + 32 * k;
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
    st_block_mxfp4 want;
    want.e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
    const float d = st_e8m0_to_f32_half(want.e);
    int q[32];
    for (int j = 0; j < 32; j++) {
      int best = 0;
      float best_err = fabsf((float)st_kvalues_mxfp4[0] * d - v[j]);
      for (int l = 1; l < 16; l++) {
        const float err = fabsf((float)st_kvalues_mxfp4[l] * d - v[j]);
        if (err < best_err) best = l, best_err = err;
      }
      q[j] = best;
    }
    for (int j = 0; j < 16; j++) want.qs[j] = (uint8_t)(q[j] | q[j + 16] << 4);
    if (memcmp(&want, got + k, sizeof want)) differ = k;
  }
  CHECK(differ < 0, "quantize mxfp4: %d blocks (ties at levels and midpoints included) bitwise equal to the nearest-level "
                    "search weight by weight (first block that differs: %d)",
        NB, differ);
  free(x), free(got);
}

/* MXFP4 blocks whose E8M0 scales run over the byte's range that keeps the products finite here
 * (0, 1: the subnormal halves; 2..200), in whole quads and a partial last one (the VNNI kernel
 * converts a whole quad's four scales at once): st_matmul_q8 at every ISA level bitwise equal to the
 * scalar kernel, and the scalar kernel against float64 of the dequantised rows (1e-6 of Σ|w·x|). */
static void test_mxfp4_scales(void) {
  enum { ROWS = 5, T = 2 };
  const int n = 32 * 203; /* 203 blocks a row: 50 whole quads and 3 blocks */
  const uint64_t rb = st_row_bytes(ST_TYPE_MXFP4, (uint64_t)n), qb = st_q8_row_bytes(ST_TYPE_MXFP4, n);
  uint8_t *w = malloc(rb * ROWS), *xq = malloc(qb * T);
  float *x = malloc(sizeof(float) * T * n), *deq = malloc(sizeof(float) * n), *xd = malloc(sizeof(float) * n);
  for (int r = 0; r < ROWS; r++)
    for (int b = 0; b < n / 32; b++) {
      st_block_mxfp4 *blk = (st_block_mxfp4 *)(void *)(w + r * rb) + b;
      const int k = (b + 7 * r) % 203;
      blk->e = (uint8_t)(k <= 200 ? k : k - 100); /* 0 .. 200 */
      for (int j = 0; j < 16; j++) blk->qs[j] = (uint8_t)(urand() * 128 + 128);
    }
  for (int i = 0; i < T * n; i++) x[i] = (float)urand();
  st_dot_force_isa(0);
  st_quantize_act(ST_TYPE_MXFP4, x, n, T, n, xq);
  float scalar[T * ROWS];
  st_matmul_q8(ST_TYPE_MXFP4, w, rb, 0, ROWS, xq, T, n, scalar, ROWS);
  double worst = 0;
  for (int t = 0; t < T; t++) {
    st_dequantize_act(ST_TYPE_MXFP4, xq + qb * (size_t)t, xd, n);
    for (int r = 0; r < ROWS; r++) {
      st_dequantize_row(ST_TYPE_MXFP4, w + r * rb, deq, n);
      double ref = 0, mag = 0;
      for (int i = 0; i < n; i++) ref += (double)deq[i] * xd[i], mag += fabs((double)deq[i] * xd[i]);
      worst = fmax(worst, fabs(scalar[t * ROWS + r] - ref) / (mag + 1e-300));
    }
  }
  const int top = st_dot_force_isa(3);
  int same = 1;
  for (int level = 1; level <= top; level++) {
    st_dot_force_isa(level);
    float out[T * ROWS];
    st_matmul_q8(ST_TYPE_MXFP4, w, rb, 0, ROWS, xq, T, n, out, ROWS);
    same &= !memcmp(out, scalar, sizeof out);
  }
  st_dot_force_isa(top);
  CHECK(same && worst <= 1e-6,
        "int8 matmul mxfp4, scales e = 0..200 (subnormal halves included), %d blocks a row: levels 1..%d bitwise equal "
        "to scalar; scalar vs float64 max |Δ|/Σ|w·x| = %.2e (≤ 1e-6)",
        n / 32, top, worst);
  free(w), free(xq), free(x), free(deq), free(xd);
}

int main(void) {
  printf("CPU kernels: %s\n", st_dot_isa());
  test_conversions();
  test_q8_0();
  test_dense_matmul();
  test_attend_tokens();
  test_attend_q8_0();
  const uint32_t types[] = {ST_TYPE_F32, ST_TYPE_F16, ST_TYPE_BF16, ST_TYPE_Q8_0};
  for (int i = 0; i < 4; i++) {
    test_matmul(types[i], 2048);
    test_matmul(types[i], 96);
  }
  test_matmul(ST_TYPE_F32, 40);
  const uint32_t blocks[] = {ST_TYPE_Q4_0, ST_TYPE_Q4_1, ST_TYPE_Q5_0, ST_TYPE_Q5_1, ST_TYPE_Q2_K,
                             ST_TYPE_Q3_K, ST_TYPE_Q4_K, ST_TYPE_Q5_K, ST_TYPE_Q6_K};
  for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) test_matmul(blocks[i], 512);
  test_matmul(ST_TYPE_BF16, 16);
  test_iq_signs();
  test_iq_known_blocks();
  test_lowbit_known_blocks();
  test_iq_low_known_blocks();
  const uint32_t iq_low[] = {ST_TYPE_IQ2_XXS, ST_TYPE_IQ1_S, ST_TYPE_IQ1_M, ST_TYPE_MXFP4};
  for (size_t i = 0; i < sizeof iq_low / sizeof iq_low[0]; i++) test_matmul_blocks(iq_low[i], 512, 0);
  for (size_t i = 0; i < sizeof iq_low / sizeof iq_low[0]; i++) test_matmul_blocks(iq_low[i], 512, 1);
  /* the low-bit formats through the float path (each row decoded once, st_matmul's rule for a
   * format without register kernels): random and quantised blocks */
  const uint32_t lowbit[] = {ST_TYPE_Q1_0, ST_TYPE_Q2_0, ST_TYPE_TQ1_0, ST_TYPE_TQ2_0};
  for (size_t i = 0; i < sizeof lowbit / sizeof lowbit[0]; i++) {
    test_matmul_blocks(lowbit[i], 512, 0);
    test_matmul_blocks(lowbit[i], 512, 1);
  }
  const uint32_t iq[] = {ST_TYPE_IQ4_NL, ST_TYPE_IQ4_XS, ST_TYPE_IQ2_XS, ST_TYPE_IQ2_S, ST_TYPE_IQ3_XXS, ST_TYPE_IQ3_S};
  for (size_t i = 0; i < sizeof iq / sizeof iq[0]; i++) {
    test_matmul_blocks(iq[i], 512, 0);
    test_matmul_blocks(iq[i], 512, 1);
  }
  test_matmul_blocks(ST_TYPE_IQ4_NL, 96, 1);
  /* the register kernels of the legacy blocks (one 32-weight block at a time) and of the grid
   * i-quants (64 weights at a time on AVX-512, 32 on AVX2): short rows, quantised rows, and a
   * tile of 2 tokens (T = 6: tiles of 4 and 2) */
  const uint32_t legacy[] = {ST_TYPE_Q4_1, ST_TYPE_Q5_0, ST_TYPE_Q5_1};
  for (size_t i = 0; i < sizeof legacy / sizeof legacy[0]; i++) {
    test_matmul_tokens(legacy[i], 32, 0, 7);
    test_matmul_tokens(legacy[i], 96, 1, 6);
  }
  for (size_t i = 2; i < sizeof iq / sizeof iq[0]; i++) test_matmul_tokens(iq[i], 256, 1, 6);
  const struct {
    uint32_t type;
    double bound;
  } rt[] = {{ST_TYPE_Q8_0, 0.01}, {ST_TYPE_Q4_0, 0.15}, {ST_TYPE_Q4_1, 0.15}, {ST_TYPE_Q5_0, 0.075},
            {ST_TYPE_Q5_1, 0.075}, {ST_TYPE_Q2_K, 0.60}, {ST_TYPE_Q3_K, 0.30}, {ST_TYPE_Q4_K, 0.15},
            {ST_TYPE_Q5_K, 0.075}, {ST_TYPE_Q6_K, 0.04},
            /* i-quants: measured 0.076 0.077 0.285 0.239 0.177 0.129 when written, bounds ~12% above */
            {ST_TYPE_IQ4_NL, 0.085}, {ST_TYPE_IQ4_XS, 0.085}, {ST_TYPE_IQ2_XS, 0.32}, {ST_TYPE_IQ2_S, 0.27},
            {ST_TYPE_IQ3_XXS, 0.20}, {ST_TYPE_IQ3_S, 0.145},
            /* the low-bit formats with ggml's reference quantisers (a sign and the mean |x|; amax
             * scales for the 2-bit and ternary levels): measured 0.602 0.714 0.819 0.811 when
             * written (1 bit: sqrt(1 - 2/pi) = 0.603 is the best a sign can do), bounds ~12% above */
            {ST_TYPE_Q1_0, 0.68}, {ST_TYPE_Q2_0, 0.80}, {ST_TYPE_TQ1_0, 0.92}, {ST_TYPE_TQ2_0, 0.92},
            /* IQ2_XXS through the grid search of IQ2_XS (one scale per 32 weights): 0.334 when written */
            {ST_TYPE_IQ2_XXS, 0.375},
            /* IQ1_S and IQ1_M through a search over the iq1s grid: 0.452 and 0.407 when written */
            {ST_TYPE_IQ1_S, 0.51}, {ST_TYPE_IQ1_M, 0.46},
            /* MXFP4 with ggml's reference rounding (a power-of-two scale): 0.115 when written */
            {ST_TYPE_MXFP4, 0.13}};
  for (size_t i = 0; i < sizeof rt / sizeof rt[0]; i++) test_roundtrip(rt[i].type, rt[i].bound);
  /* the integer path: both activation layouts, odd block counts (the VNNI kernel's 256-bit
   * tail), random and quantised blocks, tiles of 1 to 4 tokens (Q8_0's AVX-512 kernel: up to 8) */
  const uint32_t int8_types[] = {ST_TYPE_Q8_0, ST_TYPE_Q4_0, ST_TYPE_Q4_1, ST_TYPE_Q5_0, ST_TYPE_Q5_1,
                                 ST_TYPE_IQ4_NL, ST_TYPE_Q2_K, ST_TYPE_Q3_K, ST_TYPE_Q4_K, ST_TYPE_Q5_K,
                                 ST_TYPE_Q6_K, ST_TYPE_IQ4_XS, ST_TYPE_IQ2_XS, ST_TYPE_IQ2_S, ST_TYPE_IQ3_XXS,
                                 ST_TYPE_IQ3_S};
  for (size_t i = 0; i < sizeof int8_types / sizeof int8_types[0]; i++) {
    test_int8(int8_types[i], 2048, 1, 7);
    test_int8(int8_types[i], 768, 0, 6);
  }
  test_int8(ST_TYPE_Q8_0, 96, 0, 7);
  /* Q8_0's AVX-512 kernel past one tile of 8 tokens: the transposed blocks kept for three tiles */
  test_int8(ST_TYPE_Q8_0, 2048, 1, 19);
  test_int8_two_term(ST_TYPE_Q8_0, 2048, 11);
  test_int8_two_term(ST_TYPE_Q8_0, 96, 3);
  /* the K formats' dense products (st_dense_terms): q8_K activations, blocks of 256 */
  test_int8_two_term(ST_TYPE_Q4_K, 2048, 5);
  test_int8_two_term(ST_TYPE_Q6_K, 768, 3);
  test_int8_two_term(ST_TYPE_IQ4_XS, 512, 2);
  /* the low-bit formats through their Q4_0 transcoding: random and quantised blocks, short rows */
  for (size_t i = 0; i < sizeof lowbit / sizeof lowbit[0]; i++) {
    test_int8(lowbit[i], 2048, 1, 7);
    test_int8(lowbit[i], 768, 0, 6);
  }
  test_int8(ST_TYPE_Q2_0, 64, 0, 5);
  /* IQ2_XXS, IQ1_S and IQ1_M's own kernels (dot_lowiq.c): random blocks, IQ2_XXS also quantised */
  for (size_t i = 0; i < sizeof iq_low / sizeof iq_low[0]; i++) {
    test_int8(iq_low[i], 2048, 0, 7);
    test_int8(iq_low[i], 768, 0, 6);
  }
  for (size_t i = 0; i < sizeof iq_low / sizeof iq_low[0]; i++) test_int8(iq_low[i], 512, 1, 5);
  /* IQ1 rows of more than one chunk of indices built ahead (the VBMI kernel: eight super-blocks) */
  test_int8(ST_TYPE_IQ1_S, 2560, 0, 3);
  test_int8(ST_TYPE_IQ1_M, 2560, 0, 3);
  test_int8(ST_TYPE_Q1_0, 128, 1, 3);
  test_int8(ST_TYPE_Q4_0, 32, 1, 5);
  /* the min term (Q4_1, Q5_1) and the fifth bits (Q5_0, Q5_1) in a partial last group of four blocks */
  test_int8(ST_TYPE_Q4_1, 96, 1, 7);
  test_int8(ST_TYPE_Q5_0, 96, 1, 5);
  test_int8(ST_TYPE_Q5_1, 32, 0, 6);
  test_int8(ST_TYPE_IQ4_NL, 224, 1, 4);
  test_int8(ST_TYPE_Q5_1, 160, 1, 3);
  test_int8(ST_TYPE_Q8_0, 192, 0, 2);
  /* rows longer than one chunk of repacked activations (VNNI: 4096 weights), with a partial last group */
  test_int8(ST_TYPE_Q4_1, 4192, 1, 3);
  test_int8(ST_TYPE_Q5_0, 4192, 1, 4);
  /* IQ4_XS rows of more than 16 super-blocks (VNNI: offsets per row instead of per group of rows) */
  test_int8(ST_TYPE_IQ4_XS, 4352, 1, 4);
  test_mxfp4_scales();
  test_mxfp4_quantize();
  test_iq3_packed_grids();
  test_grid_planes();
  test_grid_every_index();
  test_act_quant_levels();
  test_rmsnorm();
  printf("test_quant: %d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
