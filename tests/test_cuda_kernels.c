/* The CUDA kernels' weight decoder against the CPU's dequantisation, for every block format
 * strata computes, on random blocks (scales kept finite). Two independent implementations of
 * ggml's layouts (quant.c decodes whole blocks, the CUDA decoder one element at a time) must
 * agree. Then the matrix products: the float32 kernels and the prompt path's cuBLAS GEMM
 * against the CPU's, and the decode kernels specialised on a block format (mmv.cuh), plain and
 * grouped, against the CPU's and against themselves in other batches (bitwise). Skipped (exit 77)
 * without a CUDA device or a CUDA build. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/dot.h"
#include "codelets/quant.h"
#include "config.h"
#include "testutil.h"
#ifdef ST_HAVE_CUDA
#include <cuda_runtime.h>

#include "codelets/cuda/cuda_codelets.h"

/* matmul.cu: st_cuda_grouped_matmul on host data (expert g: weights W[g], n_rows[g] consecutive
 * rows of x), for this test. 0, or -1 on a CUDA error. */
int st_cuda_grouped_rows(uint32_t type, const void *const *W, uint64_t row_bytes, int n_groups, const int32_t *n_rows,
                         int64_t n_out, const float *x, int64_t n, const float *scale, float *out);
#endif

int main(void) {
#ifndef ST_HAVE_CUDA
  printf("SKIP test_cuda_kernels: strata was built without CUDA\n");
  return 77;
#else
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP test_cuda_kernels: no CUDA device\n");
    return 77;
  }
  static const uint32_t types[] = {ST_TYPE_F32, ST_TYPE_F16, ST_TYPE_BF16, ST_TYPE_Q8_0, ST_TYPE_Q4_0, ST_TYPE_Q4_1,
                                   ST_TYPE_Q5_0, ST_TYPE_Q5_1, ST_TYPE_Q2_K, ST_TYPE_Q3_K, ST_TYPE_Q4_K, ST_TYPE_Q5_K,
                                   ST_TYPE_Q6_K, ST_TYPE_IQ4_NL, ST_TYPE_IQ4_XS, ST_TYPE_IQ2_XS, ST_TYPE_IQ2_S,
                                   ST_TYPE_IQ3_XXS, ST_TYPE_IQ3_S};
  enum { N = 1024 };
  int pass = 0, fail = 0;
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    const uint32_t t = types[k];
    const uint64_t bytes = st_row_bytes(t, N);
    const struct st_type_info *ti = st_type_info(t);
    uint8_t *row = malloc(bytes);
    tu_random_row(t, row, N, &rng);
    float *cpu = malloc(sizeof(float) * N), *gpu = malloc(sizeof(float) * N);
    st_dequantize_row(t, row, cpu, N);
    int ok = st_cuda_dequantize_row(t, row, bytes, gpu, N) == 0;
    double worst = 0;
    for (int i = 0; ok && i < N; i++) {
      const double err = fabs((double)cpu[i] - gpu[i]) / (fabs(cpu[i]) + 1e-6);
      worst = fmax(worst, err);
      ok &= isfinite(cpu[i]) && err <= 1e-6;
    }
    printf("%s %s: %d weights, CUDA decoder vs CPU dequantisation, max relative difference %.2e (≤ 1e-6)\n",
           ok ? "PASS" : "FAIL", ti->name, N, worst);
    ok ? pass++ : fail++;
    /* the matrix-product kernel on the same weights as 4 rows of 256, for 1 and 5 tokens */
    for (int T = 1; T <= 5; T += 4) {
      enum { R = N / 256, K = 256 };
      float x[5 * K], got[5 * R], want[5 * R];
      for (int i = 0; i < T * K; i++) x[i] = (float)((i * 7919) % 200 - 100) / 100.0f;
      st_matmul(t, row, st_row_bytes(t, K), 0, R, x, K, T, K, want, R);
      int ok2 = st_cuda_matmul_rows(t, row, st_row_bytes(t, K), R, x, T, K, got) == 0;
      double w2 = 0;
      for (int i = 0; ok2 && i < T * R; i++) {
        const double err = fabs((double)got[i] - want[i]) / (fabs(want[i]) + 1e-3);
        w2 = fmax(w2, err);
        ok2 &= isfinite(got[i]) && err <= 1e-4;
      }
      printf("%s %s: CUDA matrix product vs CPU, %d rows x %d tokens of %d, max relative difference %.2e (≤ 1e-4)\n",
             ok2 ? "PASS" : "FAIL", ti->name, R, T, K, w2);
      ok2 ? pass++ : fail++;
    }
    free(row);
    free(cpu);
    free(gpu);
  }
  /* The prompt path's cuBLAS product (weights dequantised to float32, float32 GEMM without TF32)
   * against the CPU's matrix product, 96 rows of 512 weights times 64 tokens. Each output is a
   * dot product of 512 terms summed in another order, so the error is measured against the sum
   * of the terms' magnitudes, sum_j |w_j x_j| (a float32 sum's rounding bound scales with it),
   * and must stay below 1e-5 of it (float32 rounding, 6e-8 per addition, stays far below; a
   * TF32 or half-precision path would exceed it). The float32 kernel is measured the same way. */
  static const uint32_t gemm_types[] = {ST_TYPE_F32, ST_TYPE_BF16, ST_TYPE_Q8_0, ST_TYPE_Q4_K};
  for (size_t k = 0; k < sizeof gemm_types / sizeof gemm_types[0]; k++) {
    enum { R = 96, K = 512, T = 64 };
    const uint32_t t = gemm_types[k];
    const uint64_t rb = st_row_bytes(t, K);
    uint8_t *w = malloc(rb * R);
    float *wf = malloc(sizeof(float) * R * K), *x = malloc(sizeof(float) * T * K);
    float *want = malloc(sizeof(float) * T * R), *got = malloc(sizeof(float) * T * R), *ker = malloc(sizeof(float) * T * R);
    tu_random_row(t, w, (int64_t)R * K, &rng);
    st_dequantize_row(t, w, wf, (int64_t)R * K);
    for (int i = 0; i < T * K; i++) x[i] = (float)((i * 7919) % 200 - 100) / 100.0f;
    st_matmul(t, w, rb, 0, R, x, K, T, K, want, R);
    int ok = st_cuda_gemm_rows(t, w, rb, R, x, T, K, got) == 0 && st_cuda_matmul_rows(t, w, rb, R, x, T, K, ker) == 0;
    double worst = 0, worst_ker = 0;
    for (int tt = 0; ok && tt < T; tt++)
      for (int r = 0; r < R; r++) {
        double mag = 0;
        for (int j = 0; j < K; j++) mag += fabs((double)wf[(size_t)r * K + j] * x[(size_t)tt * K + j]);
        const size_t o = (size_t)tt * R + r;
        worst = fmax(worst, fabs((double)got[o] - want[o]) / (mag + 1e-30));
        worst_ker = fmax(worst_ker, fabs((double)ker[o] - want[o]) / (mag + 1e-30));
        ok &= isfinite(got[o]);
      }
    ok &= worst <= 1e-5;
    printf("%s %s: cuBLAS product (prompt path) vs CPU, %d rows x %d tokens of %d, max |Δ| / sum|w x| %.2e (≤ 1e-5; "
           "the float32 kernel: %.2e)\n",
           ok ? "PASS" : "FAIL", st_type_info(t)->name, R, T, K, worst, worst_ker);
    ok ? pass++ : fail++;
    free(w);
    free(wf);
    free(x);
    free(want);
    free(got);
    free(ker);
  }
  /* The decode kernels specialised on a block format (mmv.cuh), used for any number of tokens by
   * the plain product and by the grouped expert product. 37 rows (not a multiple of the 8 rows of
   * a thread block nor of a warp's 2), a row of 1280 weights (a chunk of 1024 and a partial one;
   * 1312 for the 32-weight blocks, whose last chunk then ends inside a warp step), rows whose
   * bytes are not 16-byte aligned for every format but Q4_K and Q5_K (Q5_0's, IQ4_NL's, Q3_K's and
   * the IQ2/IQ3 grid formats' not even 4-byte aligned). Against the CPU's product at
   * T = 1, 3 and 8 (error measured against sum_j |w_j x_j|, as above); then bitwise: each token
   * alone (T = 1) gives the bits it gets inside the T = 8 batch, and a second launch repeats them. */
  static const uint32_t mmv_types[] = {ST_TYPE_Q4_K, ST_TYPE_Q6_K, ST_TYPE_Q8_0, ST_TYPE_Q5_K, ST_TYPE_IQ4_XS,
                                       ST_TYPE_Q4_0, ST_TYPE_Q4_1, ST_TYPE_Q5_0, ST_TYPE_Q5_1, ST_TYPE_IQ4_NL,
                                       ST_TYPE_Q2_K, ST_TYPE_Q3_K, ST_TYPE_IQ3_S, ST_TYPE_IQ3_XXS, ST_TYPE_IQ2_S,
                                       ST_TYPE_IQ2_XS};
  for (size_t k = 0; k < sizeof mmv_types / sizeof mmv_types[0]; k++) {
    enum { R = 37, TM = 8 };
    const uint32_t t = mmv_types[k];
    const char *name = st_type_info(t)->name;
    const int K = st_type_info(t)->blck_size == 32 ? 1312 : 1280;
    const uint64_t rb = st_row_bytes(t, K);
    uint8_t *w = malloc(rb * R);
    float *wf = malloc(sizeof(float) * R * K), *x = malloc(sizeof(float) * TM * K);
    float *mag = malloc(sizeof(float) * TM * R), *want = malloc(sizeof(float) * TM * R);
    float *got = malloc(sizeof(float) * TM * R), *again = malloc(sizeof(float) * TM * R);
    float *one = malloc(sizeof(float) * R);
    tu_random_row(t, w, (int64_t)R * K, &rng);
    st_dequantize_row(t, w, wf, (int64_t)R * K);
    for (int i = 0; i < TM * K; i++) x[i] = (float)((i * 7919) % 200 - 100) / 100.0f;
    st_matmul(t, w, rb, 0, R, x, K, TM, K, want, R);
    for (int tt = 0; tt < TM; tt++)
      for (int r = 0; r < R; r++) {
        double m = 0;
        for (int j = 0; j < K; j++) m += fabs((double)wf[(size_t)r * K + j] * x[(size_t)tt * K + j]);
        mag[tt * R + r] = (float)m;
      }
    for (int T = 1; T <= TM; T = T == 1 ? 3 : T + 5) {
      int ok = st_cuda_matmul_rows(t, w, rb, R, x, T, K, got) == 0;
      double worst = 0;
      for (int i = 0; ok && i < T * R; i++) {
        worst = fmax(worst, fabs((double)got[i] - want[i]) / ((double)mag[i] + 1e-30));
        ok &= isfinite(got[i]);
      }
      ok &= worst <= 1e-5;
      printf("%s %s: specialised decode kernel vs CPU, %d rows x %d tokens of %d, max |Δ| / sum|w x| %.2e (≤ 1e-5)\n",
             ok ? "PASS" : "FAIL", name, R, T, K, worst);
      ok ? pass++ : fail++;
    }
    /* got now holds the T = 8 batch */
    const int repeat = st_cuda_matmul_rows(t, w, rb, R, x, TM, K, again) == 0 &&
                       !memcmp(got, again, sizeof(float) * TM * R);
    int differ = -1;
    for (int tt = 0; differ < 0 && tt < TM; tt++)
      if (st_cuda_matmul_rows(t, w, rb, R, x + (size_t)tt * K, 1, K, one) != 0 ||
          memcmp(one, got + (size_t)tt * R, sizeof(float) * R))
        differ = tt;
    const int same = repeat && differ < 0;
    printf("%s %s: each of %d tokens alone (T = 1) bitwise equal to its row of the T = 8 batch (first token that "
           "differs: %d); a second T = 8 launch %s\n",
           same ? "PASS" : "FAIL", name, TM, differ, repeat ? "repeats its bits" : "DIFFERS");
    same ? pass++ : fail++;

    /* The grouped expert product: three experts (the rows of w rotated) with 1, 8 and 3 activation
     * rows and a routing weight per row, against the CPU (times the weight); then expert 1 launched
     * alone, and each of its rows alone, give the bits of the 3-expert launch. */
    enum { G = 3, NA = 12 };
    const int32_t nrows[G] = {1, 8, 3}, row0[G] = {0, 1, 9}, one_row = 1;
    const void *ws[G];
    uint8_t *wg = malloc(rb * R * G);
    for (int g = 0; g < G; g++) {
      for (int r = 0; r < R; r++) memcpy(wg + rb * (size_t)(g * R + r), w + rb * (size_t)((r + 5 * g) % R), rb);
      ws[g] = wg + rb * (size_t)g * R;
    }
    float *xa = malloc(sizeof(float) * NA * K), *sc = malloc(sizeof(float) * NA);
    float *gout = malloc(sizeof(float) * NA * R), *gwant = malloc(sizeof(float) * NA * R);
    float *alone = malloc(sizeof(float) * NA * R);
    for (int i = 0; i < NA * K; i++) xa[i] = (float)((i * 104729) % 200 - 100) / 100.0f;
    for (int i = 0; i < NA; i++) sc[i] = 0.25f + 0.0625f * (float)i;
    int ok = st_cuda_grouped_rows(t, ws, rb, G, nrows, R, xa, K, sc, gout) == 0;
    double worst = 0;
    for (int g = 0; ok && g < G; g++) {
      st_matmul(t, ws[g], rb, 0, R, xa + (size_t)row0[g] * K, K, nrows[g], K, gwant + (size_t)row0[g] * R, R);
      for (int a = row0[g]; a < row0[g] + nrows[g]; a++)
        for (int r = 0; r < R; r++) {
          const float *wr = wf + (size_t)((r + 5 * g) % R) * K;
          double m = 0;
          for (int j = 0; j < K; j++) m += fabs((double)wr[j] * xa[(size_t)a * K + j]);
          const double d = fabs((double)gout[a * R + r] - (double)gwant[a * R + r] * sc[a]);
          worst = fmax(worst, d / (m * sc[a] + 1e-30));
          ok &= isfinite(gout[a * R + r]);
        }
    }
    ok &= worst <= 1e-5;
    printf("%s %s: grouped decode kernel (3 experts of 1, 8, 3 rows, routing weights) vs CPU, %d rows of %d, "
           "max |Δ| / sum|w x| %.2e (≤ 1e-5)\n",
           ok ? "PASS" : "FAIL", name, R, K, worst);
    ok ? pass++ : fail++;
    int bits = st_cuda_grouped_rows(t, &ws[1], rb, 1, &nrows[1], R, xa + (size_t)row0[1] * K, K, sc + row0[1],
                                    alone) == 0 &&
               !memcmp(alone, gout + (size_t)row0[1] * R, sizeof(float) * (size_t)nrows[1] * R);
    for (int a = row0[1]; bits && a < row0[1] + nrows[1]; a++)
      bits = st_cuda_grouped_rows(t, &ws[1], rb, 1, &one_row, R, xa + (size_t)a * K, K, sc + a, alone) == 0 &&
             !memcmp(alone, gout + (size_t)a * R, sizeof(float) * R);
    printf("%s %s: grouped kernel, expert 1 alone and each of its rows alone bitwise equal to the 3-expert launch\n",
           bits ? "PASS" : "FAIL", name);
    bits ? pass++ : fail++;
    free(wg);
    free(xa);
    free(sc);
    free(gout);
    free(gwant);
    free(alone);
    free(w);
    free(wf);
    free(x);
    free(mag);
    free(want);
    free(got);
    free(again);
    free(one);
  }
  printf("test_cuda_kernels: %d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
#endif
}
