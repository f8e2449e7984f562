/* The CPU kernels against float64 references: half/bfloat16 conversions, Q8_0 quantisation
 * error, st_matmul for F32, F16, BF16 and Q8_0 weights on random data at every SIMD level this
 * CPU has (scalar, AVX2, AVX-512), bitwise independence of the token-tile size, and RMSNorm.
 * Prints every error it measured and the bound it used. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/dot.h"
#include "codelets/quant.h"
#include "testutil.h"

static int n_pass, n_fail;

#define CHECK(ok, ...)                 \
  do {                                 \
    printf("%s ", (ok) ? "PASS" : "FAIL"); \
    printf(__VA_ARGS__);               \
    printf("\n");                      \
    (ok) ? n_pass++ : n_fail++;        \
  } while (0)

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

/* Fills a weight matrix of `type` and returns its dequantised float copy. */
static void *make_weights(uint32_t type, int rows, int n, float *deq) {
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
    default: tu_random_row(type, row, n, &rng); /* no quantiser yet: random blocks, finite scales */
    }
    st_dequantize_row(type, row, deq + (size_t)r * n, n);
  }
  free(tmp);
  return w;
}

static void test_matmul(uint32_t type, int n) {
  enum { ROWS = 37, T = 7 };
  float *deq = malloc(sizeof(float) * ROWS * (size_t)n), *x = malloc(sizeof(float) * T * (size_t)n);
  void *w = make_weights(type, ROWS, n, deq);
  for (int i = 0; i < T * n; i++) x[i] = (float)urand();
  const uint64_t rb = st_row_bytes(type, (uint64_t)n);
  const int top = st_dot_force_isa(2);
  for (int level = 0; level <= top; level++) {
    st_dot_force_isa(level);
    float out[T * ROWS], one[ROWS];
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
          "matmul %s n=%d %s: %d×%d outputs, max |Δ|/Σ|w·x| = %.2e (≤ 1e-6) vs float64; T=7 vs T=1 %s",
          st_type_info(type)->name, n, st_dot_isa(), T, ROWS, worst, same ? "bitwise identical" : "DIFFER");
  }
  st_dot_force_isa(top);
  free(w);
  free(deq);
  free(x);
}

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

int main(void) {
  printf("CPU kernels: %s\n", st_dot_isa());
  test_conversions();
  test_q8_0();
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
  const struct {
    uint32_t type;
    double bound;
  } rt[] = {{ST_TYPE_Q8_0, 0.01}, {ST_TYPE_Q4_0, 0.15}, {ST_TYPE_Q4_1, 0.15}, {ST_TYPE_Q5_0, 0.075},
            {ST_TYPE_Q5_1, 0.075}, {ST_TYPE_Q2_K, 0.60}, {ST_TYPE_Q3_K, 0.30}, {ST_TYPE_Q4_K, 0.15},
            {ST_TYPE_Q5_K, 0.075}, {ST_TYPE_Q6_K, 0.04}};
  for (size_t i = 0; i < sizeof rt / sizeof rt[0]; i++) test_roundtrip(rt[i].type, rt[i].bound);
  test_rmsnorm();
  printf("test_quant: %d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
