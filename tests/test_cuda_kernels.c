/* The CUDA kernels' weight decoder against the CPU's dequantisation, for every block format
 * strata computes, on random blocks (scales kept finite). Two independent implementations of
 * ggml's layouts (quant.c decodes whole blocks, the CUDA decoder one element at a time) must
 * agree. Then the matrix products: the float32 kernels and the prompt path's cuBLAS GEMM
 * against the CPU's, and the decode kernels specialised on a block format (mmv.cuh), plain and
 * grouped, against the CPU's and against themselves in other batches (bitwise). Then causal
 * attention, the prompt path's flash kernel and the decode path's split-K kernels, against a
 * float64 reference, with the prompt kernel's speed-up printed. Skipped (exit 77) without a CUDA
 * device or a CUDA build. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/dot.h"
#include "codelets/layer_cpu.h"
#include "codelets/quant.h"
#include "config.h"
#include "testutil.h"
#ifdef ST_HAVE_CUDA
#include <cuda_runtime.h>

#include "codelets/cuda/cuda_codelets.h"

/* matmul.cu: st_cuda_grouped_matmul on host data (expert g: weights W[g], n_rows[g] consecutive
 * rows of x), for this test; int8 2: the tensor-core kernel (st_cuda_mmq_grouped). 0, or -1 on a
 * CUDA error. */
int st_cuda_grouped_rows(uint32_t type, const void *const *W, uint64_t row_bytes, int n_groups, const int32_t *n_rows,
                         int64_t n_out, const float *x, int64_t n, const float *scale, float *out, int int8);

/* decode.cu: `rows` rows of n weights times one activation row (host data) through the decode step's
 * streaming core (dk_mv) on `grid` blocks. 0, or -1 on a CUDA error. */
int st_cuda_stream_rows(uint32_t type, const void *W, uint64_t row_bytes, int64_t rows, const float *x, int64_t n,
                        int grid, float *out);

double st_cuda_mmq_seconds(int n_groups, int rows, int64_t n_out, int64_t n, int reps);

static double uniform(uint64_t *rng) { /* in [-1, 1) */
  *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
  return (double)(*rng >> 11) * 0x1p-52 - 1.0;
}

/* Causal attention in float64: token t's head h (q [T][nq * hd]) over keys and values 0..pos0 + t
 * (k, v [pos0 + T][hd]), scores scaled by 1/sqrt(hd) (as the kernels' float scale). abs_score
 * (may be NULL): the largest sum of |q_i k_i| times the scale over every row and key (what a
 * relative rounding of the queries can move a score by, per unit of that rounding). */
static void attention_ref(const float *q, const float *k, const float *v, int T, int pos0, int nq, int hd,
                          double *out, double *abs_score) {
  double amax = 0;
  const double scale = 1.0f / sqrtf((float)hd);
  double *s = malloc(sizeof(double) * (size_t)(pos0 + T));
  for (int t = 0; t < T; t++)
    for (int h = 0; h < nq; h++) {
      const float *qh = q + ((size_t)t * nq + h) * hd;
      double *o = out + ((size_t)t * nq + h) * hd, mx = -INFINITY, sum = 0;
      for (int j = 0; j <= pos0 + t; j++) {
        double d[4] = {0, 0, 0, 0}, a = 0; /* four chains: hd is a multiple of 4 here */
        for (int c = 0; c < hd; c += 4)
          for (int u = 0; u < 4; u++) {
            const double x = (double)qh[c + u] * k[(size_t)j * hd + c + u];
            d[u] += x;
            if (abs_score) a += fabs(x);
          }
        s[j] = (d[0] + d[1] + d[2] + d[3]) * scale;
        amax = fmax(amax, a * scale);
        mx = fmax(mx, s[j]);
      }
      for (int c = 0; c < hd; c++) o[c] = 0;
      for (int j = 0; j <= pos0 + t; j++) {
        const double p = exp(s[j] - mx);
        sum += p;
        for (int c = 0; c < hd; c++) o[c] += p * v[(size_t)j * hd + c];
      }
      for (int c = 0; c < hd; c++) o[c] /= sum;
    }
  if (abs_score) *abs_score = amax;
  free(s);
}

/* max |a - b| over n values, and max |ref| into *mag */
static double max_diff(const float *a, const double *b, size_t n, double *mag) {
  double w = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    w = fmax(w, isfinite(a[i]) ? fabs(a[i] - b[i]) : INFINITY);
    m = fmax(m, fabs(b[i]));
  }
  if (mag) *mag = m;
  return w;
}
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
                                   ST_TYPE_IQ3_XXS, ST_TYPE_IQ3_S, ST_TYPE_Q1_0, ST_TYPE_Q2_0, ST_TYPE_TQ1_0,
                                   ST_TYPE_TQ2_0, ST_TYPE_IQ2_XXS, ST_TYPE_IQ1_S, ST_TYPE_IQ1_M, ST_TYPE_MXFP4};
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
      int ok2 = st_cuda_matmul_rows(t, row, st_row_bytes(t, K), R, x, T, K, got, 0) == 0;
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
    int ok = st_cuda_gemm_rows(t, w, rb, R, x, T, K, got) == 0 && st_cuda_matmul_rows(t, w, rb, R, x, T, K, ker, 0) == 0;
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
   * the IQ2/IQ3 grid formats' not even 4-byte aligned; MXFP4's 1344 weights, 714 bytes). Against the CPU's product at
   * T = 1, 3 and 8 (error measured against sum_j |w_j x_j|, as above); then bitwise: each token
   * alone (T = 1) gives the bits it gets inside the T = 8 batch, and a second launch repeats them. */
  static const uint32_t mmv_types[] = {ST_TYPE_Q4_K, ST_TYPE_Q6_K, ST_TYPE_Q8_0, ST_TYPE_Q5_K, ST_TYPE_IQ4_XS,
                                       ST_TYPE_Q4_0, ST_TYPE_Q4_1, ST_TYPE_Q5_0, ST_TYPE_Q5_1, ST_TYPE_IQ4_NL,
                                       ST_TYPE_Q2_K, ST_TYPE_Q3_K, ST_TYPE_IQ3_S, ST_TYPE_IQ3_XXS, ST_TYPE_IQ2_S,
                                       ST_TYPE_IQ2_XS, ST_TYPE_MXFP4, ST_TYPE_Q1_0, ST_TYPE_Q2_0, ST_TYPE_TQ1_0,
                                       ST_TYPE_TQ2_0, ST_TYPE_IQ2_XXS, ST_TYPE_IQ1_S, ST_TYPE_IQ1_M};
  for (size_t k = 0; k < sizeof mmv_types / sizeof mmv_types[0]; k++) {
    enum { R = 37, TM = 8 };
    const uint32_t t = mmv_types[k];
    const char *name = st_type_info(t)->name;
    /* MXFP4's 17-byte blocks: an even number a row (mmv_format's ALIGN), 42 */
    const int K = t == ST_TYPE_MXFP4 ? 1344 : st_type_info(t)->blck_size == 32 ? 1312 : 1280;
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
      int ok = st_cuda_matmul_rows(t, w, rb, R, x, T, K, got, 0) == 0;
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
    const int repeat = st_cuda_matmul_rows(t, w, rb, R, x, TM, K, again, 0) == 0 &&
                       !memcmp(got, again, sizeof(float) * TM * R);
    int differ = -1;
    for (int tt = 0; differ < 0 && tt < TM; tt++)
      if (st_cuda_matmul_rows(t, w, rb, R, x + (size_t)tt * K, 1, K, one, 0) != 0 ||
          memcmp(one, got + (size_t)tt * R, sizeof(float) * R))
        differ = tt;
    const int same = repeat && differ < 0;
    printf("%s %s: each of %d tokens alone (T = 1) bitwise equal to its row of the T = 8 batch (first token that "
           "differs: %d); a second T = 8 launch %s\n",
           same ? "PASS" : "FAIL", name, TM, differ, repeat ? "repeats its bits" : "DIFFERS");
    same ? pass++ : fail++;

    /* The decode step's streaming core (mmv.cuh mmv_stream: bulk copies on sm_90) against the block
     * core above at T = 1, bitwise (the same chunks, chains, warp sums and slot order): rows of K
     * weights (two chunks, two slots) and of N3 (three chunks in four slots, where the warp of the
     * empty slot looks the rows up and starts their copies), 37 rows on 3 blocks, so that each
     * block walks several groups through both staging buffers and both phases of their barriers. */
    {
      const int N3 = st_type_info(t)->blck_size == 32 ? 2880 : 2816;
      const uint64_t rb3 = st_row_bytes(t, N3);
      uint8_t *w3 = malloc(rb3 * R);
      float *x3 = malloc(sizeof(float) * N3), *blk = malloc(sizeof(float) * R), *str = malloc(sizeof(float) * R);
      tu_random_row(t, w3, (int64_t)R * N3, &rng);
      for (int i = 0; i < N3; i++) x3[i] = (float)((i * 7919) % 200 - 100) / 100.0f;
      for (int v = 0; v < 2; v++) {
        const int nn = v ? N3 : K;
        const uint64_t rbv = v ? rb3 : rb;
        const uint8_t *wv = v ? w3 : w;
        const float *xv = v ? x3 : x;
        int ok = st_cuda_matmul_rows(t, wv, rbv, R, xv, 1, nn, blk, 0) == 0 &&
                 st_cuda_stream_rows(t, wv, rbv, R, xv, nn, 3, str) == 0;
        int first = -1;
        for (int r = 0; ok && first < 0 && r < R; r++)
          if (memcmp(&blk[r], &str[r], sizeof(float))) first = r;
        ok = ok && first < 0;
        printf("%s %s: the decode step's streaming core (dk_mv, 3 blocks) vs the block core, %d rows of %d, "
               "bitwise (first row that differs: %d)\n",
               ok ? "PASS" : "FAIL", name, R, nn, first);
        ok ? pass++ : fail++;
      }
      free(w3);
      free(x3);
      free(blk);
      free(str);
    }

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
    int ok = st_cuda_grouped_rows(t, ws, rb, G, nrows, R, xa, K, sc, gout, 0) == 0;
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
                                    alone, 0) == 0 &&
               !memcmp(alone, gout + (size_t)row0[1] * R, sizeof(float) * (size_t)nrows[1] * R);
    for (int a = row0[1]; bits && a < row0[1] + nrows[1]; a++)
      bits = st_cuda_grouped_rows(t, &ws[1], rb, 1, &one_row, R, xa + (size_t)a * K, K, sc + a, alone, 0) == 0 &&
             !memcmp(alone, gout + (size_t)a * R, sizeof(float) * R);
    printf("%s %s: grouped kernel, expert 1 alone and each of its rows alone bitwise equal to the 3-expert launch\n",
           bits ? "PASS" : "FAIL", name);
    bits ? pass++ : fail++;
    if (st_q8_row_bytes(t, K) > 0 && t == ST_TYPE_Q8_0) {
      /* int8 activations on the GPU (STRATA_INT8_DOT; Q8_0 weights): against the CPU's integer
       * product st_matmul_q8 on st_quantize_act's quants (the same quants and block scales, so
       * only the order of the float additions differs: bound 1e-5 of sum|w x|) and, printed with
       * a bound of 5e-3, the float32 product; then the bit checks above for the int8 kernels */
      const uint64_t qb = st_q8_row_bytes(t, K);
      uint8_t *xq = malloc(qb * NA);
      float *qwant = malloc(sizeof(float) * NA * R);
      st_quantize_act(t, x, K, TM, K, xq);
      st_matmul_q8(t, w, rb, 0, R, xq, TM, K, qwant, R);
      for (int T = 1; T <= TM; T = T == 1 ? 3 : T + 5) {
        int ok8 = st_cuda_matmul_rows(t, w, rb, R, x, T, K, got, 1) == 0;
        double wq = 0, wf = 0;
        for (int i = 0; ok8 && i < T * R; i++) {
          wq = fmax(wq, fabs((double)got[i] - qwant[i]) / ((double)mag[i] + 1e-30));
          wf = fmax(wf, fabs((double)got[i] - want[i]) / ((double)mag[i] + 1e-30));
          ok8 &= isfinite(got[i]);
        }
        ok8 &= wq <= 1e-5 && wf <= 5e-3;
        printf("%s %s: int8 decode kernel vs CPU st_matmul_q8, %d rows x %d tokens of %d, max |Δ| / sum|w x| %.2e (≤ 1e-5); "
               "vs the float32 product %.2e (≤ 5e-3)\n",
               ok8 ? "PASS" : "FAIL", name, R, T, K, wq, wf);
        ok8 ? pass++ : fail++;
      }
      const int rep8 = st_cuda_matmul_rows(t, w, rb, R, x, TM, K, again, 1) == 0 && !memcmp(got, again, sizeof(float) * TM * R);
      int diff8 = -1;
      for (int tt = 0; diff8 < 0 && tt < TM; tt++)
        if (st_cuda_matmul_rows(t, w, rb, R, x + (size_t)tt * K, 1, K, one, 1) != 0 ||
            memcmp(one, got + (size_t)tt * R, sizeof(float) * R))
          diff8 = tt;
      printf("%s %s: int8 kernel, each of %d tokens alone (T = 1) bitwise equal to its row of the T = 8 batch (first "
             "token that differs: %d); a second T = 8 launch %s\n",
             rep8 && diff8 < 0 ? "PASS" : "FAIL", name, TM, diff8, rep8 ? "repeats its bits" : "DIFFERS");
      rep8 && diff8 < 0 ? pass++ : fail++;
      /* grouped: the 3 experts against the CPU's integer product, then expert 1's rows alone */
      st_quantize_act(t, xa, K, NA, K, xq);
      int okg = st_cuda_grouped_rows(t, ws, rb, G, nrows, R, xa, K, sc, gout, 1) == 0;
      double wg = 0;
      for (int g = 0; okg && g < G; g++) {
        st_matmul_q8(t, ws[g], rb, 0, R, xq + qb * (size_t)row0[g], nrows[g], K, gwant + (size_t)row0[g] * R, R);
        for (int a = row0[g]; a < row0[g] + nrows[g]; a++)
          for (int r = 0; r < R; r++) {
            const float *wr = wf + (size_t)((r + 5 * g) % R) * K;
            double m = 0;
            for (int j = 0; j < K; j++) m += fabs((double)wr[j] * xa[(size_t)a * K + j]);
            wg = fmax(wg, fabs((double)gout[a * R + r] - (double)gwant[a * R + r] * sc[a]) / (m * sc[a] + 1e-30));
            okg &= isfinite(gout[a * R + r]);
          }
      }
      int bitsg = okg;
      for (int a = row0[1]; bitsg && a < row0[1] + nrows[1]; a++)
        bitsg = st_cuda_grouped_rows(t, &ws[1], rb, 1, &one_row, R, xa + (size_t)a * K, K, sc + a, alone, 1) == 0 &&
                !memcmp(alone, gout + (size_t)a * R, sizeof(float) * R);
      okg &= wg <= 1e-5 && bitsg;
      printf("%s %s: grouped int8 kernel (3 experts) vs CPU st_matmul_q8, max |Δ| / sum|w x| %.2e (≤ 1e-5); each row "
             "of expert 1 alone %s\n",
             okg ? "PASS" : "FAIL", name, wg, bitsg ? "bitwise equal to the launch" : "DIFFERS");
      okg ? pass++ : fail++;
      free(xq);
      free(qwant);
    }
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
  /* The router's top-k (router.cu, common.cuh st_dev_softmax_topk_block) against the CPU's
   * selection (st_route_topk), on 64 rows of 128 logits in steps of 1/64 (many exact ties, which go
   * to the lower expert id) and k = 8: the same experts in the same
   * order, weights within 1e-6 relative (CPU and GPU expf differ by an ulp or so). Blocks of 128
   * threads (the router codelet's: one thread ranks an expert) and 256 (the decode step's
   * dk_gateup: two threads' shares added). */
  for (int threads = 128; threads <= 256; threads *= 2) {
    enum { TR = 64, E = 128, KR = 8 };
    float *lg = malloc(sizeof(float) * TR * E), *tmp = malloc(sizeof(float) * E);
    struct st_route got_r[TR * KR], want_r[KR];
    for (int i = 0; i < TR * E; i++) lg[i] = (float)((int)(uniform(&rng) * 256.0)) / 64.0f;
    int ok = st_cuda_softmax_topk_rows(lg, TR, E, KR, threads, got_r) == 0, same = 1;
    double worst = 0;
    for (int t = 0; ok && t < TR; t++) {
      memcpy(tmp, lg + (size_t)t * E, sizeof(float) * E);
      st_route_topk(tmp, E, KR, want_r);
      for (int j = 0; j < KR; j++) {
        same &= got_r[t * KR + j].expert == want_r[j].expert;
        worst = fmax(worst, fabs((double)got_r[t * KR + j].weight - want_r[j].weight) / want_r[j].weight);
      }
    }
    ok &= same && worst <= 1e-6;
    printf("%s router top-k on the GPU (%d threads a block) vs the CPU's: %d rows of %d logits with ties, k = %d: "
           "%s experts in the same order, weights max relative difference %.2e (≤ 1e-6)\n",
           ok ? "PASS" : "FAIL", threads, TR, E, KR, same ? "the same" : "DIFFERENT", worst);
    ok ? pass++ : fail++;
    free(lg);
    free(tmp);
  }
  /* Causal attention (attention.cu): the prompt path's tiled flash kernel (T > 1) and the decode
   * path's split-K kernels, on random queries (x 8, so that the softmax is far from uniform), keys
   * and values, against a float64 reference and against each other: max |Δ| ≤ 1e-4 × max |ref|.
   * Shapes cross the kernels' edges: a tile of 64 query rows (T x nq), the tiles of 64 keys, the
   * split of long contexts into chunks (from about 16,000 keys chunks of ATT_MMA_CHUNK keys or
   * more: the half cache's tensor-core blocks), head_dim 64, 128 and 256. Then the flash kernel repeats
   * its bits on a second launch. Each shape twice: a float32 KV cache, then a half one (the keys
   * and values rounded to half first, so that the float64 reference sees what the cache holds).
   * The half cache's split-K kernels (head_dim 64 and 128 from sm_80: attend_group_chunk_mma)
   * round the queries and P to half on the tensor cores: their bound adds to 1e-4 × max|ref| the
   * first-order effect of those roundings, (2 δ + 2^-10) × max|v| with δ = 2^-11 × the largest
   * sum of |q_i k_i| × scale (a score's shift); the flash kernel keeps float32 math (1e-4). */
  static const int shapes[][2] = {{2, 0}, {7, 5}, {64, 0}, {100, 300}, {512, 0}, {512, 3000}, {33, 4096}, {1, 20000}, {3, 17000},
                                  {1, 0}, {1, 63}, {1, 100}, {1, 127}, {1, 128}}; /* T = 1 up to 128 keys: the short-context block */
  static const int hds[] = {64, 128, 256}, nqs[] = {1, 8};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int hi = 0; hi < 3; hi++)
      for (int ni = 0; ni < 2; ni++) {
        const int T = shapes[si][0], pos0 = shapes[si][1], hd = hds[hi], nq = nqs[ni];
        const size_t qn = (size_t)T * nq * hd, kn = (size_t)(pos0 + T) * hd;
        float *q = malloc(sizeof(float) * qn), *k = malloc(sizeof(float) * kn), *v = malloc(sizeof(float) * kn);
        float *fl = malloc(sizeof(float) * qn), *fl2 = malloc(sizeof(float) * qn), *sk = malloc(sizeof(float) * qn);
        double *ref = malloc(sizeof(double) * qn), *skd = malloc(sizeof(double) * qn), mag = 0;
        for (size_t i = 0; i < qn; i++) q[i] = (float)(8.0 * uniform(&rng));
        for (size_t i = 0; i < kn; i++) k[i] = (float)uniform(&rng), v[i] = (float)uniform(&rng);
        for (int kt = 0; kt < 3; kt++) {
          const int kv_type = kt == 2 ? ST_TYPE_Q8_0 : kt ? ST_TYPE_F16 : ST_TYPE_F32;
          const char *kvn = kt == 2 ? "q8_0" : kt ? "f16" : "f32";
          if (kt == 1)
            for (size_t i = 0; i < kn; i++)
              k[i] = st_fp16_to_f32(st_f32_to_fp16(k[i])), v[i] = st_fp16_to_f32(st_f32_to_fp16(v[i]));
          /* q8_0: every block of 32 keys' (values') floats scaled by its own power of two, 2^-4 .. 2^4
           * (so that a block read with another block's scale shows), given to the GPU, which quantises
           * them (bitwise as the CPU: st_cuda_kv_q8_store_rows below); the reference takes what every
           * GPU kernel reads, the half d q of the CPU's blocks */
          float *kg = k, *vg = v, *kr = k, *vr = v;
          if (kt == 2) {
            kg = malloc(sizeof(float) * kn), vg = malloc(sizeof(float) * kn);
            kr = malloc(sizeof(float) * kn), vr = malloc(sizeof(float) * kn);
            for (size_t b = 0; b < kn / 32; b++) {
              const float sk2 = ldexpf(1.0f, (int)floor((uniform(&rng) + 1.0) * 4.5) - 4);
              const float sv2 = ldexpf(1.0f, (int)floor((uniform(&rng) + 1.0) * 4.5) - 4);
              for (int i = 0; i < 32; i++) kg[32 * b + i] = k[32 * b + i] * sk2, vg[32 * b + i] = v[32 * b + i] * sv2;
            }
            uint8_t *rows = malloc(st_kv_row_bytes(ST_TYPE_Q8_0, hd) * (size_t)(pos0 + T));
            for (int kvi = 0; kvi < 2; kvi++) {
              float *dq = kvi ? vr : kr;
              st_kv_store(ST_TYPE_Q8_0, kvi ? vg : kg, rows, (int64_t)kn, hd);
              st_kv_load(ST_TYPE_Q8_0, rows, dq, (int64_t)kn, hd); /* d q exactly */
              for (size_t i = 0; i < kn; i++) dq[i] = st_fp16_to_f32(st_f32_to_fp16(dq[i]));
            }
            free(rows);
          }
          int ok = st_cuda_attention_rows(q, kg, vg, T, pos0, nq, hd, kv_type, 1, 0, fl, NULL) == 0 &&
                   st_cuda_attention_rows(q, kg, vg, T, pos0, nq, hd, kv_type, 1, 0, fl2, NULL) == 0 &&
                   st_cuda_attention_rows(q, kg, vg, T, pos0, nq, hd, kv_type, 0, 0, sk, NULL) == 0;
          double abs_score = 0, vmax = 0;
          attention_ref(q, kr, vr, T, pos0, nq, hd, ref, kt ? &abs_score : NULL);
          for (size_t i = 0; i < kn; i++) vmax = fmax(vmax, fabs(vr[i]));
          if (kt == 2) free(kg), free(vg), free(kr), free(vr);
          for (size_t i = 0; i < qn; i++) skd[i] = sk[i];
          mag = 0;
          const double d_flash = max_diff(fl, ref, qn, &mag), d_split = max_diff(sk, ref, qn, NULL);
          const double d_both = max_diff(fl, skd, qn, NULL), tol = 1e-4 * mag;
          /* (q8_0: the reference holds the halves the kernels read, as a half cache's does) */
          const double tol_split = tol + (kt ? (2 * 0x1p-11 * abs_score + 0x1p-10) * vmax : 0);
          const int same = ok && !memcmp(fl, fl2, sizeof(float) * qn);
          /* one token: both launches are the split-K kernels; a half cache of head_dim 64 or 128 on sm_80 and
           * later: the flash kernel on the tensor cores (attend_flash_mma), Q and P rounded to half as the
           * split-K tensor-core kernels round them, and each kernel's error may add to the other's */
          int dev = 0, major = 0;
          cudaGetDevice(&dev);
          cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
          const char *fm_env = getenv("STRATA_FLASH_MMA");
          const int flash_mma = kt && (hd == 64 || hd == 128) && major >= 8 && T > 1 && !(fm_env && atoi(fm_env) == 0);
          const double tol_flash = T > 1 && !flash_mma ? tol : tol_split, tol_both = flash_mma ? 2 * tol_split : tol_split;
          ok = ok && d_flash <= tol_flash && d_split <= tol_split && d_both <= tol_both;
          printf("%s attention T=%d pos0=%d nq=%d hd=%d %s KV: max |Δ| flash%s vs float64 %.2e (≤ %.2e), "
                 "split-K vs float64 %.2e (≤ %.2e), flash vs split-K %.2e (≤ %.2e)\n",
                 ok ? "PASS" : "FAIL", T, pos0, nq, hd, kvn, flash_mma ? " (tensor cores)" : "", d_flash, tol_flash, d_split,
                 tol_split, d_both, tol_both);
          ok ? pass++ : fail++;
          printf("%s attention T=%d pos0=%d nq=%d hd=%d %s KV: a second flash launch %s\n", same ? "PASS" : "FAIL", T,
                 pos0, nq, hd, kvn, same ? "repeats its bits" : "DIFFERS");
          same ? pass++ : fail++;
        }
        free(q);
        free(k);
        free(v);
        free(fl);
        free(fl2);
        free(sk);
        free(ref);
        free(skd);
      }
  /* The q8_0 KV cache's quantiser on the GPU (kv_store_q8, the rows the CUDA codelets store)
   * against the CPU's (st_kv_store): bitwise, on random rows with a block of zeros, one of a single
   * value and one of ties. */
  {
    enum { ROWS = 37, HD = 128 };
    float *x = malloc(sizeof(float) * ROWS * HD);
    for (int i = 0; i < ROWS * HD; i++) x[i] = (float)(4.0 * uniform(&rng));
    /* a block of zeros, one of a single value, and one whose scale is 1 (max 127) with 31 values
     * halfway between integers: roundf's ties away from zero, which rintf's ties to even would not give */
    for (int i = 0; i < 32; i++) x[i] = 0.0f, x[32 + i] = 0.75f, x[64 + i] = i == 0 ? 127.0f : (float)(i - 16) + 0.5f;
    const size_t qb = st_kv_row_bytes(ST_TYPE_Q8_0, HD) * ROWS;
    uint8_t *want = malloc(qb), *got = malloc(qb);
    st_kv_store(ST_TYPE_Q8_0, x, want, ROWS * HD, HD);
    const int rc = st_cuda_kv_q8_store_rows(x, ROWS, HD, got);
    const int ok = rc == 0 && !memcmp(want, got, qb);
    printf("%s q8_0 KV rows quantised on the GPU (%d rows of %d): %s the CPU's st_kv_store\n", ok ? "PASS" : "FAIL", ROWS, HD,
           rc ? "(CUDA error) vs" : ok ? "bitwise equal to" : "DIFFER from");
    ok ? pass++ : fail++;
    free(x), free(want), free(got);
  }
  /* The decode step's attention (rope_append's launch computing short contexts itself, the split-K
   * kernels the rest) against the attention codelet's T = 1 kernels: outputs, their int8 rows (hd a
   * multiple of 32: the writers' st_dev_q8_span against one launch over the row) and caches bit for bit,
   * on the fixtures' shape and Qwen3-30B-A3B's, short contexts, their edge, and long ones (at 20,000
   * keys the half cache's chunks take the tensor-core kernels). */
  {
    static const int shapes[2][3] = {{4, 2, 16}, {32, 4, 128}}; /* Hq, G, hd */
    static const int positions[] = {0, 63, 127, 128, 200, 3000, 20000};
    for (int si = 0; si < 2; si++)
      for (int kt = 0; kt < 3; kt++)
        for (size_t pi = 0; pi < sizeof positions / sizeof positions[0]; pi++) {
          const int Hq = shapes[si][0], G = shapes[si][1], hd = shapes[si][2], pos = positions[pi];
          if (kt == 2 && hd % 32) continue; /* q8_0 rows are whole blocks of 32 */
          const int kv_type = kt == 2 ? ST_TYPE_Q8_0 : kt ? ST_TYPE_F16 : ST_TYPE_F32;
          int same = 0;
          const int rc = st_cuda_decode_attention_check(Hq, G, hd, kv_type, pos, 1000u + (uint32_t)pi, &same);
          const int ok = rc == 0 && same;
          printf("%s decode step's attention, Hq=%d G=%d hd=%d %s KV, position %d: output%s and caches %s the attention "
                 "codelet's T = 1 kernels'%s\n",
                 ok ? "PASS" : "FAIL", Hq, G, hd, kt == 2 ? "q8_0" : kt ? "f16" : "f32", pos,
                 hd % 32 ? "" : ", its int8 row (the output projection's input)",
                 rc ? "(CUDA error) vs" : same ? "bitwise equal to" : "DIFFER from",
                 kt == 2 ? " (and the new rows to the float32 cache's, quantised)" : "");
          ok ? pass++ : fail++;
        }
  }
  /* MLA's decode attention (deepseek2 on the GPU's decode step, cuda/mla.cuh) against float64: the
   * token's cache row (latent normed, rope part roped) and every head's output through the absorbed
   * query, the split attention over chunks of 128 keys and v_b, on the fixture's shape and
   * DeepSeek-V2-Lite's, before, at and past a chunk's edge. Bounds: 1e-4 of the output's largest
   * magnitude with a float32 cache, 4e-3 with a half one (the reference rounds the rows as the
   * cache stores them). */
  {
    static const int shapes[2][5] = {{4, 32, 16, 32, 32}, {16, 128, 64, 512, 128}}; /* heads, qk_nope, n_rot, kv_lora, hv */
    static const int positions[] = {0, 5, 127, 128, 300};
    for (int si = 0; si < 2; si++)
      for (int kt = 0; kt < 2; kt++)
        for (size_t pi = 0; pi < sizeof positions / sizeof positions[0]; pi++) {
          const int H = shapes[si][0], nope = shapes[si][1], nr = shapes[si][2], kl = shapes[si][3], hv = shapes[si][4];
          const int hd = kl + nr, qk = nope + nr, pos = positions[pi];
          const float eps = 1e-6f, scale = 1.0f / sqrtf((float)qk);
          uint64_t rng = 77 + (uint64_t)pi * 13 + (uint64_t)si * 1001 + (uint64_t)kt;
          float *q = malloc(sizeof(float) * H * qk), *kv = malloc(sizeof(float) * hd), *nw = malloc(sizeof(float) * kl);
          float *rows = malloc(sizeof(float) * ((size_t)pos + 1) * hd), *cs = malloc(sizeof(float) * nr);
          float *kb = malloc(sizeof(float) * H * kl * nope), *vb = malloc(sizeof(float) * H * hv * kl);
          float *attn = malloc(sizeof(float) * H * hv), *row = malloc(sizeof(float) * hd);
          double *ref = malloc(sizeof(double) * H * hv), *crow = malloc(sizeof(double) * hd);
          double *qm = malloc(sizeof(double) * hd), *sc = malloc(sizeof(double) * (pos + 1)), *olat = malloc(sizeof(double) * kl);
          for (int i = 0; i < H * qk; i++) q[i] = (float)uniform(&rng);
          for (int i = 0; i < hd; i++) kv[i] = (float)uniform(&rng);
          for (int i = 0; i < kl; i++) nw[i] = (float)(1.0 + 0.5 * uniform(&rng));
          for (size_t i = 0; i < (size_t)pos * hd; i++) rows[i] = (float)uniform(&rng);
          for (int i = 0; i < nr / 2; i++) {
            const double a = (pos + 1) * pow(10000.0, -2.0 * i / nr);
            cs[2 * i] = (float)cos(a), cs[2 * i + 1] = (float)sin(a);
          }
          for (int i = 0; i < H * kl * nope; i++) kb[i] = (float)(uniform(&rng) / sqrt((double)nope));
          for (int i = 0; i < H * hv * kl; i++) vb[i] = (float)(uniform(&rng) / sqrt((double)kl));
          const int rc = st_cuda_mla_check(H, nope, nr, kl, hv, pos, kt ? ST_TYPE_F16 : ST_TYPE_F32, q, kv, nw, eps, rows, cs, kb,
                                           vb, scale, attn, row);
          /* the reference: the new row, then each head; the cache's values as it stores them */
          double ss = 0.0;
          for (int i = 0; i < kl; i++) ss += (double)kv[i] * kv[i];
          const double rs = 1.0 / sqrt(ss / kl + eps);
          for (int i = 0; i < kl; i++) crow[i] = kv[i] * rs * nw[i];
          for (int i = 0; i < nr / 2; i++) {
            const double x0 = kv[kl + 2 * i], x1 = kv[kl + 2 * i + 1];
            crow[kl + 2 * i] = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
            crow[kl + 2 * i + 1] = x0 * cs[2 * i + 1] + x1 * cs[2 * i];
          }
          double row_err = 0.0, row_mag = 0.0;
          for (int i = 0; i < hd; i++) {
            row_err = fmax(row_err, fabs(row[i] - crow[i]));
            row_mag = fmax(row_mag, fabs(crow[i]));
          }
          #define KVAL(v) (kt ? (double)st_fp16_to_f32(st_f32_to_fp16((float)(v))) : (double)(float)(v))
          for (int h = 0; h < H; h++) {
            for (int r = 0; r < kl; r++) {
              double a = 0.0;
              for (int j = 0; j < nope; j++) a += (double)kb[((size_t)h * kl + r) * nope + j] * q[(size_t)h * qk + j];
              qm[r] = a;
            }
            for (int i = 0; i < nr / 2; i++) {
              const double x0 = q[(size_t)h * qk + nope + 2 * i], x1 = q[(size_t)h * qk + nope + 2 * i + 1];
              qm[kl + 2 * i] = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
              qm[kl + 2 * i + 1] = x0 * cs[2 * i + 1] + x1 * cs[2 * i];
            }
            double mx = -INFINITY;
            for (int j = 0; j <= pos; j++) {
              double a = 0.0;
              for (int i = 0; i < hd; i++) a += qm[i] * (j < pos ? KVAL(rows[(size_t)j * hd + i]) : KVAL(crow[i]));
              sc[j] = a * scale;
              mx = fmax(mx, sc[j]);
            }
            double sum = 0.0;
            for (int j = 0; j <= pos; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int i = 0; i < kl; i++) {
              double a = 0.0;
              for (int j = 0; j <= pos; j++) a += sc[j] * (j < pos ? KVAL(rows[(size_t)j * hd + i]) : KVAL(crow[i]));
              olat[i] = a / sum;
            }
            for (int r = 0; r < hv; r++) {
              double a = 0.0;
              for (int i = 0; i < kl; i++) a += (double)vb[((size_t)h * hv + r) * kl + i] * olat[i];
              ref[(size_t)h * hv + r] = a;
            }
          }
          #undef KVAL
          double mag = 0.0;
          const double err = max_diff(attn, ref, (size_t)H * hv, &mag);
          const double bound = (kt ? 4e-3 : 1e-4) * (mag > 0 ? mag : 1.0), rbound = (kt ? 1e-3 : 1e-5) * (row_mag > 0 ? row_mag : 1.0);
          const int ok = rc == 0 && err <= bound && row_err <= rbound;
          printf("%s MLA decode attention, %d heads, qk_nope %d, rope %d, kv_lora %d, v %d, %s cache, position %d: max |Δ| "
                 "%.3g (bound %.3g, largest %.3g); cache row max |Δ| %.3g (bound %.3g)%s\n",
                 ok ? "PASS" : "FAIL", H, nope, nr, kl, hv, kt ? "f16" : "f32", pos, err, bound, mag, row_err, rbound,
                 rc ? " (CUDA error)" : "");
          ok ? pass++ : fail++;
          free(q), free(kv), free(nw), free(rows), free(cs), free(kb), free(vb), free(attn), free(row), free(ref), free(crow);
          free(qm), free(sc), free(olat);
        }
  }
  /* The speed-up on a prompt chunk at long context (Qwen3-30B-A3B's group: 8 query heads of 128),
   * printed, not checked; the two kernels must still agree. */
  {
    enum { T = 512, POS0 = 16384, NQ = 8, HD = 128, REPS = 5 };
    const size_t qn = (size_t)T * NQ * HD, kn = (size_t)(POS0 + T) * HD;
    float *q = malloc(sizeof(float) * qn), *k = malloc(sizeof(float) * kn), *v = malloc(sizeof(float) * kn);
    float *fl = malloc(sizeof(float) * qn), *sk = malloc(sizeof(float) * qn);
    double *skd = malloc(sizeof(double) * qn), ms_flash = 0, ms_split = 0, mag = 0;
    for (size_t i = 0; i < qn; i++) q[i] = (float)(8.0 * uniform(&rng));
    for (size_t i = 0; i < kn; i++) k[i] = (float)uniform(&rng), v[i] = (float)uniform(&rng);
    int ok = st_cuda_attention_rows(q, k, v, T, POS0, NQ, HD, ST_TYPE_F32, 0, REPS, sk, &ms_split) == 0 &&
             st_cuda_attention_rows(q, k, v, T, POS0, NQ, HD, ST_TYPE_F32, 1, REPS, fl, &ms_flash) == 0;
    for (size_t i = 0; i < qn; i++) skd[i] = sk[i];
    const double d = max_diff(fl, skd, qn, &mag);
    ok = ok && d <= 1e-4 * mag;
    printf("%s attention T=%d pos0=%d nq=%d hd=%d: max |Δ| flash vs split-K %.2e (≤ 1e-4 × max|split-K| = %.2e)\n",
           ok ? "PASS" : "FAIL", T, POS0, NQ, HD, d, 1e-4 * mag);
    ok ? pass++ : fail++;
    printf("TIME attention T=%d pos0=%d nq=%d hd=%d (one KV group): split-K (decode kernels) %.3f ms, flash %.3f ms, "
           "speed-up %.1fx (mean of %d launches)\n",
           T, POS0, NQ, HD, ms_split, ms_flash, ms_flash > 0 ? ms_split / ms_flash : 0.0, REPS);
    /* the prompt's flash kernel on a half cache (the default cache type: on sm_80 and later, head_dim
     * 64 or 128, attend_flash_mma on the tensor cores unless STRATA_FLASH_MMA=0), against the float32
     * cache's, here and on a whole 4,096-token prompt's chunk (T = 4096 at position 0) */
    double ms_half = 0, ms32_p = 0, ms16_p = 0;
    const size_t qn4 = (size_t)4096 * NQ * HD; /* k and v hold 4,096 rows and more */
    float *q4 = malloc(sizeof(float) * qn4), *o4 = malloc(sizeof(float) * qn4);
    for (size_t i = 0; i < qn4; i++) q4[i] = (float)(8.0 * uniform(&rng));
    ok = st_cuda_attention_rows(q, k, v, T, POS0, NQ, HD, ST_TYPE_F16, 1, REPS, fl, &ms_half) == 0 &&
         st_cuda_attention_rows(q4, k, v, 4096, 0, NQ, HD, ST_TYPE_F32, 1, REPS, o4, &ms32_p) == 0 &&
         st_cuda_attention_rows(q4, k, v, 4096, 0, NQ, HD, ST_TYPE_F16, 1, REPS, o4, &ms16_p) == 0;
    free(q4);
    free(o4);
    printf("%s TIME attention, flash, f32 KV against f16 KV (one KV group, nq=%d hd=%d): T=%d pos0=%d %.3f -> %.3f ms "
           "(%.1fx); T=4096 pos0=0 %.3f -> %.3f ms (%.1fx) (mean of %d launches)\n", ok ? "PASS" : "FAIL", NQ, HD, T, POS0,
           ms_flash, ms_half, ms_half > 0 ? ms_flash / ms_half : 0.0, ms32_p, ms16_p, ms16_p > 0 ? ms32_p / ms16_p : 0.0, REPS);
    ok ? pass++ : fail++;
    free(q);
    free(k);
    free(v);
    free(fl);
    free(sk);
    free(skd);
  }
  /* The tensor-core expert product of the prompt path (mmq.cuh: Q8_0 weights, int8 activations):
   * three experts of 9, 37 and 70 token rows (partial tiles of 32 tokens, one expert of 3 tiles),
   * 200 weight rows (a partial tile of 128) of 1280 weights (10 stages of 4 blocks), routing weights, against the CPU's integer product
   * st_matmul_q8 on st_quantize_act's quants (the same integer block sums and scales: only the order
   * of the float additions differs, bound 1e-5 of sum|w x|); then expert 1 alone, each of its rows
   * alone and a second launch give the bits of the 3-expert launch. */
  {
    enum { K = 1280, R = 200, G = 3, NA = 116 };
    const int32_t nrows[G] = {9, 37, 70}, row0[G] = {0, 9, 46}, one_row = 1;
    const uint32_t t = ST_TYPE_Q8_0;
    const uint64_t rb = st_row_bytes(t, K), qb = st_q8_row_bytes(t, K);
    uint8_t *w = malloc(rb * R * G);
    float *wf = malloc(sizeof(float) * (size_t)R * K * G), *xa = malloc(sizeof(float) * NA * K);
    float *sc = malloc(sizeof(float) * NA), *got = malloc(sizeof(float) * NA * R), *want = malloc(sizeof(float) * NA * R);
    float *again = malloc(sizeof(float) * NA * R), *alone = malloc(sizeof(float) * NA * R);
    uint8_t *xq = malloc(qb * NA);
    const void *ws[G];
    for (int r = 0; r < R * G; r++) {
      tu_random_row(t, w + rb * (size_t)r, K, &rng);
      st_dequantize_row(t, w + rb * (size_t)r, wf + (size_t)r * K, K);
    }
    for (int g = 0; g < G; g++) ws[g] = w + rb * (size_t)R * g;
    for (int i = 0; i < NA * K; i++) xa[i] = (float)uniform(&rng) * (i % 97 == 0 ? 8.0f : 1.0f);
    for (int i = 0; i < NA; i++) sc[i] = 0.25f + 0.0625f * (float)(i % 13);
    st_quantize_act(t, xa, K, NA, K, xq);
    int ok = st_cuda_grouped_rows(t, ws, rb, G, nrows, R, xa, K, sc, got, 2) == 0;
    double worst = 0;
    for (int g = 0; ok && g < G; g++) {
      st_matmul_q8(t, ws[g], rb, 0, R, xq + qb * (size_t)row0[g], nrows[g], K, want + (size_t)row0[g] * R, R);
      for (int a = row0[g]; a < row0[g] + nrows[g]; a++)
        for (int r = 0; r < R; r++) {
          const float *wr = wf + ((size_t)g * R + r) * K;
          double m = 0;
          for (int j = 0; j < K; j++) m += fabs((double)wr[j] * xa[(size_t)a * K + j]);
          worst = fmax(worst, fabs((double)got[a * R + r] - (double)want[a * R + r] * sc[a]) / (m * sc[a] + 1e-30));
          ok &= isfinite(got[a * R + r]);
        }
    }
    ok &= worst <= 1e-5;
    printf("%s q8_0: tensor-core grouped kernel (3 experts of 9, 37, 70 rows, routing weights) vs CPU st_matmul_q8, "
           "%d rows of %d, max |Δ| / sum|w x| %.2e (≤ 1e-5)\n",
           ok ? "PASS" : "FAIL", R, K, worst);
    ok ? pass++ : fail++;
    int bits = st_cuda_grouped_rows(t, ws, rb, G, nrows, R, xa, K, sc, again, 2) == 0 && !memcmp(again, got, sizeof(float) * NA * R);
    const int rep = bits;
    bits = bits && st_cuda_grouped_rows(t, &ws[1], rb, 1, &nrows[1], R, xa + (size_t)row0[1] * K, K, sc + row0[1], alone, 2) == 0 &&
           !memcmp(alone, got + (size_t)row0[1] * R, sizeof(float) * (size_t)nrows[1] * R);
    for (int a = row0[1]; bits && a < row0[1] + nrows[1]; a++)
      bits = st_cuda_grouped_rows(t, &ws[1], rb, 1, &one_row, R, xa + (size_t)a * K, K, sc + a, alone, 2) == 0 &&
             !memcmp(alone, got + (size_t)a * R, sizeof(float) * R);
    printf("%s q8_0: tensor-core kernel: a second launch %s; expert 1 alone and each of its rows alone %s\n",
           bits ? "PASS" : "FAIL", rep ? "repeats its bits" : "DIFFERS",
           bits ? "bitwise equal to the 3-expert launch" : "DIFFER");
    bits ? pass++ : fail++;
    free(w);
    free(wf);
    free(xa);
    free(sc);
    free(got);
    free(want);
    free(again);
    free(alone);
    free(xq);
  }
  /* The decode attention's time per KV group (one token, Qwen3-30B-A3B's group of 8 query heads of
   * 128) at a few context lengths, printed, not checked: the K and V bytes over the time. */
  {
    enum { NQ = 8, HD = 128, REPS = 20 };
    static const int ctxs[] = {512, 4096, 32768};
    for (int ci = 0; ci < 3; ci++) {
      const int n = ctxs[ci];
      const size_t qn = (size_t)NQ * HD, kn = (size_t)n * HD;
      float *q = malloc(sizeof(float) * qn), *k = malloc(sizeof(float) * kn), *v = malloc(sizeof(float) * kn);
      float *o = malloc(sizeof(float) * qn);
      double ms = 0;
      for (size_t i = 0; i < qn; i++) q[i] = (float)uniform(&rng);
      for (size_t i = 0; i < kn; i++) k[i] = (float)uniform(&rng), v[i] = (float)uniform(&rng);
      for (int kt = 0; kt < 2; kt++)
        if (st_cuda_attention_rows(q, k, v, 1, n - 1, NQ, HD, kt ? ST_TYPE_F16 : ST_TYPE_F32, 0, REPS, o, &ms) == 0)
          printf("TIME decode attention over %d keys (one KV group, nq=%d hd=%d, %s KV): %.1f us, K and V %.1f MB, %.0f GB/s\n",
                 n, NQ, HD, kt ? "f16" : "f32", 1e3 * ms, (kt ? 4e-6 : 8e-6) * kn, ms > 0 ? (kt ? 4e-6 : 8e-6) * kn / ms : 0.0);
      free(q);
      free(k);
      free(v);
      free(o);
    }
  }
  /* The tensor-core expert product's time (Qwen3-30B-A3B's gate: 128 experts of 768 x 2048 Q8_0)
   * for 8 to 256 token rows an expert, printed, not checked: the weight bytes and int8 operations
   * over the time. */
  for (int rows = 8; rows <= 256; rows *= 2) {
    const double s = st_cuda_mmq_seconds(128, rows, 768, 2048, 10);
    if (s > 0)
      printf("TIME tensor-core expert product, 128 experts x %d rows, 768 x 2048 Q8_0: %.1f us, weights %.0f GB/s, "
             "%.1f int8 TOP/s\n", rows, 1e6 * s, 128.0 * 768 * 2176 / s * 1e-9, 2.0 * 128 * rows * 768 * 2048 / s * 1e-12);
  }
  printf("test_cuda_kernels: %d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
#endif
}
