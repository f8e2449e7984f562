/* The CUDA kernels' weight decoder against the CPU's dequantisation, for every block format
 * strata computes, on random blocks (scales kept finite). Two independent implementations of
 * ggml's layouts (quant.c decodes whole blocks, the CUDA decoder one element at a time) must
 * agree. Skipped (exit 77) without a CUDA device or a CUDA build. */
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
  printf("test_cuda_kernels: %d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
#endif
}
