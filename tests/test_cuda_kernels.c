/* The CUDA kernels' weight decoder against the CPU's dequantisation, for every block format
 * strata computes, on random blocks (scales kept finite). Two independent implementations of
 * ggml's layouts (quant.c decodes whole blocks, the CUDA decoder one element at a time) must
 * agree. Then the matrix products: the float32 kernels and the prompt path's cuBLAS GEMM
 * against the CPU's. Skipped (exit 77) without a CUDA device or a CUDA build. */
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
  printf("test_cuda_kernels: %d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
#endif
}
