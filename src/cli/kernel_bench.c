/* `strata bench --kernels`: the expert-row kernels alone. For each weight format, a mat-vec (one
 * token, as at decode) over a weight matrix much larger than the caches, split by rows over N
 * threads like the CPU pool's tasks: GB/s of weights read, against the host read bandwidth
 * measured in the same run; and on a GPU the CUDA mat-vec against its copy bandwidth. For the
 * formats with integer kernels (st_matmul_q8, STRATA_INT8_DOT) the same mat-vec with quantised
 * activations, each thread quantising the token first as a CPU-pool task does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/cli.h"
#include "codelets/dot.h"
#include "codelets/quant.h"
#include "common.h"
#include "config.h"
#ifdef ST_HAVE_CUDA
#include <cuda_runtime.h>

#include "codelets/cuda/cuda_codelets.h"
#endif

/* Device-to-device copy bandwidth of the current CUDA device (cli.h). */
double st_cuda_copy_bandwidth(size_t bytes) {
#ifdef ST_HAVE_CUDA
  void *a = NULL, *b = NULL;
  cudaEvent_t e0, e1;
  double best = 0.0;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    return 0.0;
  }
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemset(a, 1, bytes);
  for (int rep = 0; rep < 4; rep++) {
    float ms = 0.0f;
    cudaEventRecord(e0, 0);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    const double bw = ms > 0 ? 2.0 * (double)bytes / (ms * 1e-3) : 0.0;
    best = rep > 0 && bw > best ? bw : best; /* the first copy warms up */
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return best;
#else
  (void)bytes;
  return 0.0;
#endif
}

struct part {
  uint32_t type;
  const uint8_t *w;
  uint64_t row_bytes;
  int64_t r0, r1, n;
  const float *x;
  float *out;
  void *xq; /* non-NULL: quantise x into it, then the integer kernels */
};

static void *run_part(void *arg) {
  const struct part *p = arg;
  if (p->xq) {
    st_quantize_act(p->type, p->x, p->n, 1, p->n, p->xq);
    st_matmul_q8(p->type, p->w, p->row_bytes, p->r0, p->r1, p->xq, 1, p->n, p->out + p->r0, 0);
  } else {
    st_matmul(p->type, p->w, p->row_bytes, p->r0, p->r1, p->x, p->n, 1, p->n, p->out + p->r0, 0);
  }
  return NULL;
}

/* Seconds for one mat-vec of `rows` rows with `threads` threads (best of reps, on one thread team
 * created once, as the CPU pool's long-lived workers); with `int8`, the integer kernels on
 * activations each thread quantises (xq: threads rows of st_q8_row_bytes(type, n) bytes). */
static double cpu_matvec(uint32_t type, const uint8_t *w, uint64_t row_bytes, int64_t rows, int64_t n, const float *x,
                         float *out, int threads, int reps, uint8_t *xq) {
  struct part parts[256];
  const uint64_t qb = xq ? st_q8_row_bytes(type, n) : 0;
  for (int i = 0; i < threads; i++)
    parts[i] = (struct part){type, w, row_bytes, rows * i / threads, rows * (i + 1) / threads, n, x, out,
                             xq ? xq + qb * (uint64_t)i : NULL};
  return st_team_best_seconds(threads, run_part, parts, sizeof parts[0], reps);
}

/* Rounds per format: each round reads the reference, then runs the float and the integer kernels
 * (best of ROUND_REPS each); a share is the median over rounds of kernel GB/s / the read of the
 * same round, so that the host's bandwidth moving between seconds (shared hosts: 76-151 GB/s
 * within one run) moves both sides of each ratio together. */
enum { ROUNDS = 5, ROUND_REPS = 2, DISTINCT_ROWS = 64 }; /* ROUNDS odd: a true median */

/* One format's CPU figures: medians over ROUNDS of GB/s and of the per-round shares. */
struct cpu_figures {
  double read_gbs, gbs, share, int8_gbs, int8_share;
};

/* Runs the rounds for weights w (rows of rb bytes); returns -1 when the thread team fails. */
static int cpu_rounds(uint32_t t, const uint8_t *w, uint64_t rb, int64_t rows, int64_t n, const float *x,
                      float *out, int threads, uint8_t *xq, const uint8_t *ref, uint64_t ref_bytes,
                      struct cpu_figures *f) {
  double rd[ROUNDS], g[ROUNDS], gs[ROUNDS], q[ROUNDS], qs[ROUNDS];
  const double bytes = (double)rb * (double)rows;
  const int int8 = st_q8_row_bytes(t, n) > 0;
  for (int r = 0; r < ROUNDS; r++) {
    rd[r] = st_host_read_bandwidth_of(ref, (size_t)ref_bytes, threads, ROUND_REPS);
    const double sec = cpu_matvec(t, w, rb, rows, n, x, out, threads, ROUND_REPS, NULL);
    const double sec8 = int8 ? cpu_matvec(t, w, rb, rows, n, x, out, threads, ROUND_REPS, xq) : 1.0;
    if (rd[r] <= 0 || sec <= 0 || sec8 <= 0) return -1;
    g[r] = bytes / sec, gs[r] = g[r] / rd[r];
    q[r] = int8 ? bytes / sec8 : 0.0, qs[r] = q[r] / rd[r];
  }
  *f = (struct cpu_figures){st_median(rd, ROUNDS) / 1e9, st_median(g, ROUNDS) / 1e9, st_median(gs, ROUNDS),
                            st_median(q, ROUNDS) / 1e9, st_median(qs, ROUNDS)};
  return 0;
}

/* Marks in *pick which of the n types `formats` names (comma-separated, case-insensitive GGUF type
 * names; NULL: the first n_default of them); an unknown name is an error that lists the known ones. */
static int pick_formats(const char *formats, const uint32_t *types, int n, int n_default, int *pick) {
  for (int i = 0; i < n; i++)
    pick[i] = formats == NULL && i < n_default;
  if (!formats) return 0;
  char *copy = strdup(formats), *save = NULL;
  if (!copy) return st_set_error(ST_ENOMEM, "out of memory");
  int rc = 0, any = 0;
  for (char *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
    int i = 0;
    while (i < n && strcasecmp(st_type_info(types[i])->name, tok))
      i++;
    if (i == n) {
      char known[256] = "";
      for (int j = 0; j < n; j++) {
        strncat(known, st_type_info(types[j])->name, sizeof known - strlen(known) - 1);
        if (j + 1 < n) strncat(known, ", ", sizeof known - strlen(known) - 1);
      }
      rc = st_set_error(ST_EINVAL, "--formats: unknown format '%s' (known: %s)", tok, known);
    } else
      pick[i] = any = 1;
  }
  free(copy);
  if (!rc && !any) rc = st_set_error(ST_EINVAL, "--formats: no format named in '%s'", formats);
  return rc;
}

int st_kernel_bench(int threads, int json, const char *formats, int64_t n) {
  static const uint32_t types[] = {ST_TYPE_F32,  ST_TYPE_F16,  ST_TYPE_BF16, ST_TYPE_Q8_0, ST_TYPE_Q4_0,
                                   ST_TYPE_Q4_1, ST_TYPE_Q5_0, ST_TYPE_Q5_1, ST_TYPE_Q2_K, ST_TYPE_Q3_K,
                                   ST_TYPE_Q4_K, ST_TYPE_Q5_K, ST_TYPE_Q6_K, ST_TYPE_IQ4_NL, ST_TYPE_IQ4_XS,
                                   ST_TYPE_IQ3_S, ST_TYPE_IQ3_XXS, ST_TYPE_IQ2_S, ST_TYPE_IQ2_XS,
                                   /* named only: their float kernels decode each row first and take
                                    * minutes over the 2 GiB a format reads */
                                   ST_TYPE_IQ2_XXS, ST_TYPE_IQ1_S, ST_TYPE_IQ1_M, ST_TYPE_Q2_0, ST_TYPE_Q1_0,
                                   ST_TYPE_TQ2_0, ST_TYPE_TQ1_0, ST_TYPE_MXFP4};
  enum { NTYPES = sizeof types / sizeof types[0], NDEFAULT = 19 };
  int pick[NTYPES];
  const int prc = pick_formats(formats, types, NTYPES, NDEFAULT, pick);
  if (prc) return prc;
  if (n < 256 || n > 65536 || n % 256)
    return st_set_error(ST_EINVAL, "--row-length must be a multiple of 256 from 256 to 65536, got %lld",
                        (long long)n);
  const uint64_t target = st_bench_bytes(); /* bytes of weights per format */
  if (threads < 1) threads = 1;
  if (threads > 256) threads = 256;
  /* the reference buffer stays for the whole run: it is read again in every round; the weights
   * of every format go into one buffer of the same size, so that all formats read the same pages
   * (huge or not: a fresh buffer per format got a different share of huge pages each time) */
  uint8_t *ref = st_bench_buffer((size_t)target), *w = st_bench_buffer((size_t)target);
  if (ref) memset(ref, 1, (size_t)target);
  if (w) memset(w, 1, (size_t)target);
  const double bw_host = st_host_read_bandwidth_of(ref, (size_t)target, threads, 5);
  if (bw_host <= 0 || !w) {
    free(ref);
    free(w);
    return st_set_error(ST_ENOMEM,
                        "two %llu MiB buffers could not be allocated, or %d threads could not read them",
                        (unsigned long long)(target >> 20), threads);
  }
  double bw_gpu = 0.0;
#ifdef ST_HAVE_CUDA
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) bw_gpu = st_cuda_copy_bandwidth((size_t)1 << 30);
#endif
  int rc = 0;
  float *x = malloc(sizeof(float) * (size_t)n), *rows_f = malloc(sizeof(float) * (size_t)n * DISTINCT_ROWS);
  uint64_t rb_min = UINT64_MAX; /* the smallest row: the most rows */
  for (int k = 0; k < NTYPES; k++)
    if (st_row_bytes(types[k], (uint64_t)n) < rb_min) rb_min = st_row_bytes(types[k], (uint64_t)n);
  float *out = malloc(sizeof(float) * (size_t)(target / rb_min + 1));
  uint64_t qb = 0; /* the largest activation layout */
  for (int k = 0; k < NTYPES; k++)
    if (st_q8_row_bytes(types[k], n) > qb) qb = st_q8_row_bytes(types[k], n);
  uint8_t *xq = malloc(qb * (size_t)threads);
  if (!x || !rows_f || !out || !xq) {
    rc = st_set_error(ST_ENOMEM, "out of memory");
    goto done;
  }
  st_bench_inputs(x, rows_f, n, DISTINCT_ROWS); /* DISTINCT_ROWS rows, tiled over the matrix */
  /* only the avx512vbmi integer kernels choose how to look the grids up, and only the AVX-512 ones
   * whether to walk rows in pairs */
  const int vbmi = !strcmp(st_dot_q8_isa(), "avx512vbmi"), gathered = st_dot_grid_lookup(-1),
            avx512 = !strncmp(st_dot_q8_isa(), "avx512", 6), paired = st_dot_row_pairs(-1);
  if (json)
    printf("{\"threads\": %d, \"cpu_kernels\": \"%s\", \"int8_kernels\": \"%s\", \"row_length\": %lld, "
           "\"grid_lookup\": %s, \"row_pairs\": %s, \"rounds\": %d, \"host_read_gbs\": %.2f, "
           "\"gpu_copy_gbs\": %.2f, \"formats\": [",
           threads, st_dot_isa(), st_dot_q8_isa(), (long long)n,
           !vbmi      ? "null"
           : gathered ? "\"gather\""
                      : "\"permute\"",
           !avx512  ? "null"
           : paired ? "true"
                    : "false",
           ROUNDS, bw_host / 1e9, bw_gpu / 1e9);
  else {
    printf("strata bench --kernels: mat-vec (1 token) over %llu MiB of weights per format, rows of %lld\n",
           (unsigned long long)(target >> 20), (long long)n);
    printf("host read bandwidth %.1f GB/s (%d threads, %s kernels)", bw_host / 1e9, threads, st_dot_isa());
    if (bw_gpu > 0) printf("; GPU copy bandwidth %.1f GB/s", bw_gpu / 1e9);
    printf(" (int8: %s kernels%s%s)\n", st_dot_q8_isa(),
           !vbmi      ? ""
           : gathered ? ", grids gathered (IQ2) and by vpermb pairs (IQ3)"
                      : ", grids by vpermi2b",
           !avx512  ? ""
           : paired ? ", K and grid rows in pairs"
                    : ", K and grid rows one at a time");
    printf("CPU: %d rounds per format of (host read: best of %d with and %d without prefetch; float kernel,\n"
           "int8 kernel: best of %d each); medians of GB/s and of the per-round shares of the read\n",
           ROUNDS, ROUND_REPS, ROUND_REPS, ROUND_REPS);
    printf("%-8s %10s %10s %10s %9s %10s %9s %10s %9s\n", "format", "bits/w", "host GB/s", "CPU GB/s",
           "of host", "int8 GB/s", "of host", "GPU GB/s", "of GPU");
  }
  int printed = 0; /* JSON rows so far */
  for (int k = 0; k < NTYPES; k++) {
    if (!pick[k]) continue;
    const uint32_t t = types[k];
    const uint64_t rb = st_row_bytes(t, (uint64_t)n);
    const int64_t rows = (int64_t)(target / rb);
    int qrc = 0;
    for (int64_t r = 0; r < DISTINCT_ROWS && r < rows && !qrc; r++)
      qrc = st_quantize_row(t, rows_f + r * n, w + (uint64_t)r * rb, n);
    if (qrc) {
      rc = st_set_error(ST_ERUNTIME, "quantising a %s row failed", st_type_info(t)->name);
      goto done;
    }
    for (int64_t r = DISTINCT_ROWS; r < rows; r++)
      memcpy(w + (uint64_t)r * rb, w + (uint64_t)(r % DISTINCT_ROWS) * rb, rb);
    struct cpu_figures f;
    if (cpu_rounds(t, w, rb, rows, n, x, out, threads, xq, ref, target, &f)) {
      rc = st_set_error(ST_ERUNTIME, "%d CPU threads could not be started", threads);
      goto done;
    }
    double gpu_gbs = 0.0;
#ifdef ST_HAVE_CUDA
    if (bw_gpu > 0) {
      const double gs = st_cuda_matvec_seconds(t, rb, rows, n, 20);
      if (gs > 0) gpu_gbs = (double)rb * (double)rows / gs / 1e9;
    }
#endif
    const double bits = 8.0 * (double)rb / (double)n;
    if (json)
      printf(
          "%s\n  {\"format\": \"%s\", \"bits_per_weight\": %.3f, \"host_read_gbs\": %.2f, \"cpu_gbs\": %.2f, "
          "\"cpu_share\": %.3f, \"int8_gbs\": %.2f, \"int8_share\": %.3f, \"gpu_gbs\": %.2f, \"gpu_share\": "
          "%.3f}",
          printed++ ? "," : "", st_type_info(t)->name, bits, f.read_gbs, f.gbs, f.share, f.int8_gbs,
          f.int8_share, gpu_gbs, bw_gpu > 0 ? gpu_gbs * 1e9 / bw_gpu : 0.0);
    else {
      /* the GPU columns: "-" without a GPU or a GPU kernel for the format */
      char gcol[32] = "         -          ";
      if (gpu_gbs > 0) snprintf(gcol, sizeof gcol, "%10.1f %8.1f%%", gpu_gbs, 100.0 * gpu_gbs * 1e9 / bw_gpu);
      if (f.int8_gbs > 0)
        printf("%-8s %10.3f %10.1f %10.2f %8.1f%% %10.2f %8.1f%% %s\n", st_type_info(t)->name, bits, f.read_gbs,
               f.gbs, 100.0 * f.share, f.int8_gbs, 100.0 * f.int8_share, gcol);
      else
        printf("%-8s %10.3f %10.1f %10.2f %8.1f%% %10s %9s %s\n", st_type_info(t)->name, bits, f.read_gbs, f.gbs,
               100.0 * f.share, "-", "", gcol);
    }
    fflush(stdout);
  }
  if (json) printf("\n]}\n");
done:
  free(ref);
  free(w);
  free(xq);
  free(x);
  free(rows_f);
  free(out);
  return rc;
}
