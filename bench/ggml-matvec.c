/* strata's int8 CPU mat-vec kernels against llama.cpp's own, in one process: for each weight
 * format, one token's mat-vec (as at decode) over a weight matrix much larger than the caches,
 * split by rows over N threads of one team created once, measured the way `strata bench --kernels`
 * does (src/cli/kernel_bench.c; its thread team and host read are src/cli/membw.c's): 64 distinct rows of n =
 * 4096 quantised by st_quantize_row and tiled over max(1 GiB, 4 x L3) bytes; per round the host read
 * bandwidth on the same threads, then strata's kernel (each thread st_quantize_act, then st_matmul_q8 over
 * its rows) and ggml's (each thread quantises the token with the from_float of the format's vec_dot_type,
 * then calls the format's vec_dot once per row, as ggml_compute_forward_mul_mat_id does for an expert's rows
 * that are not repacked; ggml shares one quantised token between its threads, 4096 floats, a cost too small
 * to matter), best of 2 each; medians over the rounds of GB/s and of the per-round shares of the read and
 * strata/ggml ratios. strata's block layouts are ggml's, so both read the same bytes; a correctness line
 * compares their results on the 64 rows. Built by bench/vs-ggml.sh against ggml's static CPU backend
 * (llama.cpp from node-llama-cpp). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/membw.h"
#include "codelets/dot.h"
#include "codelets/quant.h"
#include "common.h"
#include "ggml-cpu.h"
#include "ggml.h"

enum { N = 4096, DISTINCT_ROWS = 64, REPS = 2, MAX_THREADS = 256, MAX_ROUNDS = 99 };

/* the formats: strata's type and ggml's (the same id: GGUF's), named as both name them */
#define FORMAT(t)                                                                                            \
  { ST_TYPE_##t, GGML_TYPE_##t }
static const struct format {
  uint32_t st;
  enum ggml_type gg;
} formats[] = {FORMAT(Q8_0),  FORMAT(Q4_0),    FORMAT(Q4_1),  FORMAT(Q5_0),  FORMAT(Q5_1),   FORMAT(Q2_K),
               FORMAT(Q3_K),  FORMAT(Q4_K),    FORMAT(Q5_K),  FORMAT(Q6_K),  FORMAT(IQ4_NL), FORMAT(IQ4_XS),
               FORMAT(IQ3_S), FORMAT(IQ3_XXS), FORMAT(IQ2_S), FORMAT(IQ2_XS)};
enum { NFORMATS = sizeof formats / sizeof formats[0] };

static const char *name_of(const struct format *f) {
  return st_type_info(f->st)->name;
}

/* ---- the two mat-vecs --------------------------------------------------------------------------- */

struct part {
  const struct format *f;
  const uint8_t *w;
  uint64_t rb;
  int64_t r0, r1;
  const float *x;
  float *out;
  void *xq; /* this thread's quantised token */
};

/* kernel_bench.c's run_part, int8 path */
static void *run_strata(void *arg) {
  const struct part *p = arg;
  st_quantize_act(p->f->st, p->x, N, 1, N, p->xq);
  st_matmul_q8(p->f->st, p->w, p->rb, p->r0, p->r1, p->xq, 1, N, p->out + p->r0, 0);
  return NULL;
}

/* ggml's mul_mat(_id) inner loop for one token and rows of one thread */
static void *run_ggml(void *arg) {
  const struct part *p = arg;
  const struct ggml_type_traits_cpu *tt = ggml_get_type_traits_cpu(p->f->gg);
  ggml_get_type_traits_cpu(tt->vec_dot_type)->from_float(p->x, p->xq, N);
  for (int64_t r = p->r0; r < p->r1; r++)
    tt->vec_dot(N, p->out + r, 0, p->w + (uint64_t)r * p->rb, 0, p->xq, 0, 1);
  return NULL;
}

static double matvec_seconds(void *(*fn)(void *), const struct format *f, const uint8_t *w, uint64_t rb,
                             int64_t rows, const float *x, float *out, int threads, uint8_t *xq,
                             uint64_t qb) {
  struct part parts[MAX_THREADS];
  for (int i = 0; i < threads; i++)
    parts[i] =
        (struct part){f, w, rb, rows * i / threads, rows * (i + 1) / threads, x, out, xq + qb * (uint64_t)i};
  return st_team_best_seconds(threads, fn, parts, sizeof parts[0], REPS);
}

/* bytes of activations one thread needs: the larger of strata's and ggml's layouts */
static uint64_t act_bytes(const struct format *f) {
  const uint64_t s = st_q8_row_bytes(f->st, N);
  const uint64_t g = ggml_row_size(ggml_get_type_traits_cpu(f->gg)->vec_dot_type, N);
  return ((s > g ? s : g) + 63) / 64 * 64;
}

struct figures {
  double bits, read, strata, strata_share, ggml, ggml_share, ratio;
  double err, err_strata, err_ggml; /* |strata - ggml| / |ggml|; each against the exact dot */
};

/* The integer in s, all of it, within lo..hi; else -1 (lo >= 0). */
static int int_arg(const char *s, int lo, int hi) {
  char *end = NULL;
  const long v = strtol(s, &end, 10);
  return end != s && *end == '\0' && v >= lo && v <= hi ? (int)v : -1;
}

/* 1 for `yes`, 0 for `no` (either case), else -1. */
static int word_arg(const char *s, const char *yes, const char *no) {
  return !strcasecmp(s, yes) ? 1 : !strcasecmp(s, no) ? 0 : -1;
}

/* strata's result is wrong: further than 1e-2 (relative to the largest exact dot) from the exact dot
 * of the dequantised rows, and more than twice as far as ggml's (both use 8-bit activations) */
static int strata_off(const struct figures *o) {
  return o->err_strata > 1e-2 && o->err_strata > 2 * o->err_ggml;
}

/* The formats llama.cpp's CPU backend repacks into 8-row interleaved blocks by default
 * (ggml-cpu/repack.cpp, on AVX2: Q4_0, Q4_K, IQ4_NL; on AVX-512 also Q2_K) and then multiplies with
 * its repacked GEMV kernels, expert rows (MUL_MAT_ID) included: for these the vec_dot timed here is
 * not what llama.cpp runs. */
static int llama_repacks(enum ggml_type t) {
  return t == GGML_TYPE_Q4_0 || t == GGML_TYPE_Q4_K || t == GGML_TYPE_IQ4_NL || t == GGML_TYPE_Q2_K;
}

static int usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--formats a,b,...] [--threads N] [--rounds R] [--grid-lookup permute|gather]\n"
          "       [--row-pairs on|off]\n"
          "  formats: q8_0 q4_0 q4_1 q5_0 q5_1 q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs iq3_s iq3_xxs iq2_s\n"
          "  iq2_xs (default all); threads 1..%d (default: online CPUs); rounds 1..%d (default 5);\n"
          "  grid-lookup: strata's level-3 grid lookups (st_dot_grid_lookup); row-pairs: its AVX-512 K and\n"
          "  grid rows in pairs or one at a time (st_dot_row_pairs); both default to strata's choice for\n"
          "  this CPU, as strata bench --kernels --grid-lookup / --row-pairs\n",
          argv0, MAX_THREADS, MAX_ROUNDS);
  return 2;
}

int main(int argc, char **argv) {
  const char *list = NULL;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = online < 1 ? 1 : online > MAX_THREADS ? MAX_THREADS : (int)online, rounds = 5;
  for (int i = 1; i < argc; i++) {
    int v = 0;
    if (i + 1 < argc && !strcmp(argv[i], "--formats"))
      list = argv[++i];
    else if (i + 1 < argc && !strcmp(argv[i], "--threads"))
      v = threads = int_arg(argv[++i], 1, MAX_THREADS);
    else if (i + 1 < argc && !strcmp(argv[i], "--rounds"))
      v = rounds = int_arg(argv[++i], 1, MAX_ROUNDS);
    else if (i + 1 < argc && !strcmp(argv[i], "--grid-lookup"))
      st_dot_grid_lookup(v = word_arg(argv[++i], "gather", "permute")); /* -1: a query, no change */
    else if (i + 1 < argc && !strcmp(argv[i], "--row-pairs"))
      st_dot_row_pairs(v = word_arg(argv[++i], "on", "off"));
    else
      v = -1;
    if (v < 0) {
      fprintf(stderr, "ggml-matvec: bad option or value '%s'\n", argv[i]);
      return usage(argv[0]);
    }
  }
  int pick[NFORMATS];
  for (int k = 0; k < NFORMATS; k++)
    pick[k] = list == NULL;
  if (list) {
    char *copy = strdup(list), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
      int k = 0;
      while (k < NFORMATS && strcasecmp(name_of(&formats[k]), tok))
        k++;
      if (k == NFORMATS) {
        fprintf(stderr, "ggml-matvec: unknown format '%s'\n", tok);
        return usage(argv[0]);
      }
      pick[k] = 1;
    }
    free(copy);
    int any = 0;
    for (int k = 0; k < NFORMATS; k++)
      any |= pick[k];
    if (!any) {
      fprintf(stderr, "ggml-matvec: --formats names no format\n");
      return usage(argv[0]);
    }
  }
  /* ggml's CPU backend is built for AVX-512 (F, BW, DQ, VL, CD, VBMI, VNNI, BF16) unconditionally */
  static const char *const need[] = {"avx2",     "fma",        "f16c",       "bmi2",
                                     "avx512f",  "avx512bw",   "avx512dq",   "avx512vl",
                                     "avx512cd", "avx512vbmi", "avx512vnni", "avx512bf16"};
  __builtin_cpu_init();
  const int have[] = {__builtin_cpu_supports("avx2"),       __builtin_cpu_supports("fma"),
                      __builtin_cpu_supports("f16c"),       __builtin_cpu_supports("bmi2"),
                      __builtin_cpu_supports("avx512f"),    __builtin_cpu_supports("avx512bw"),
                      __builtin_cpu_supports("avx512dq"),   __builtin_cpu_supports("avx512vl"),
                      __builtin_cpu_supports("avx512cd"),   __builtin_cpu_supports("avx512vbmi"),
                      __builtin_cpu_supports("avx512vnni"), __builtin_cpu_supports("avx512bf16")};
  for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
    if (!have[i]) {
      fprintf(stderr, "ggml-matvec: this CPU lacks %s, which the ggml build here needs\n", need[i]);
      return 1;
    }
  ggml_cpu_init();

  const uint64_t bytes = st_bench_bytes(); /* weights per format, and the reference read */
  uint8_t *ref = st_bench_buffer(bytes), *w = st_bench_buffer(bytes);
  uint64_t qb = 0, rb_min = UINT64_MAX;
  for (int k = 0; k < NFORMATS; k++) {
    qb = act_bytes(&formats[k]) > qb ? act_bytes(&formats[k]) : qb;
    rb_min = st_row_bytes(formats[k].st, N) < rb_min ? st_row_bytes(formats[k].st, N) : rb_min;
  }
  uint8_t *xq = aligned_alloc(64, qb * (uint64_t)threads);
  float *x = malloc(sizeof(float) * N), *rows_f = malloc(sizeof(float) * N * DISTINCT_ROWS);
  float *out = malloc(sizeof(float) * (bytes / rb_min + 1)), *out_g = malloc(sizeof(float) * DISTINCT_ROWS);
  float *deq = malloc(sizeof(float) * N);
  if (!ref || !w || !xq || !x || !rows_f || !out || !out_g || !deq) {
    fprintf(stderr, "ggml-matvec: out of memory (two buffers of %llu MiB)\n",
            (unsigned long long)(bytes >> 20));
    return 1;
  }
  memset(ref, 1, bytes); /* its pages exist before the first read */
  st_bench_inputs(x, rows_f, N, DISTINCT_ROWS); /* kernel_bench.c's token and rows */
  const double read0 = st_host_read_bandwidth_of(ref, bytes, threads, 5);
  printf("ggml-matvec: mat-vec (1 token) over %llu MiB of weights per format, rows of %d, %d threads, %d "
         "rounds\n",
         (unsigned long long)(bytes >> 20), N, threads, rounds);
  printf(
      "host read %.1f GB/s; strata int8 kernels %s%s%s; ggml %s %s (built for AVX2 %d, AVX512 %d, VBMI %d, "
      "VNNI %d, BF16 %d)\n",
      read0 / 1e9, st_dot_q8_isa(),
      strcmp(st_dot_q8_isa(), "avx512vbmi") ? ""
      : st_dot_grid_lookup(-1)              ? " (grids gathered / vpermb pairs)"
                                            : " (grids by vpermi2b)",
      strncmp(st_dot_q8_isa(), "avx512", 6) ? ""
      : st_dot_row_pairs(-1)                ? ", K and grid rows in pairs"
                                            : ", K and grid rows one at a time",
      ggml_version(), ggml_commit(), ggml_cpu_has_avx2(), ggml_cpu_has_avx512(), ggml_cpu_has_avx512_vbmi(),
      ggml_cpu_has_avx512_vnni(), ggml_cpu_has_avx512_bf16());
  printf(
      "per round: host read (best of %d with, %d without prefetch), strata and ggml (best of %d each, the\n"
      "order alternating by round); medians over rounds of GB/s and of the per-round ratios\n",
      REPS, REPS, REPS);

  struct figures fig[NFORMATS];
  int bad = 0; /* a format where strata_off */
  for (int k = 0; k < NFORMATS; k++) {
    if (!pick[k]) continue;
    const struct format *f = &formats[k];
    const uint64_t rb = st_row_bytes(f->st, N);
    if (rb != ggml_row_size(f->gg, N) || strcmp(name_of(f), ggml_type_name(f->gg))) {
      fprintf(stderr, "ggml-matvec: strata's %s rows: %llu bytes, ggml's %s: %zu\n", name_of(f),
              (unsigned long long)rb, ggml_type_name(f->gg), ggml_row_size(f->gg, N));
      return 1;
    }
    const int64_t rows = (int64_t)(bytes / rb);
    for (int r = 0; r < DISTINCT_ROWS; r++)
      if (st_quantize_row(f->st, rows_f + (size_t)r * N, w + (uint64_t)r * rb, N)) {
        fprintf(stderr, "ggml-matvec: quantising a %s row failed: %s\n", name_of(f), st_last_error());
        return 1;
      }
    for (int64_t r = DISTINCT_ROWS; r < rows; r++)
      memcpy(w + (uint64_t)r * rb, w + (uint64_t)(r % DISTINCT_ROWS) * rb, rb);

    /* correctness on the 64 distinct rows (one thread each way): max |strata - ggml| / max |ggml|,
     * and each one's max error against the exact dot of the dequantised row with x, over max |exact| */
    matvec_seconds(run_ggml, f, w, rb, DISTINCT_ROWS, x, out_g, 1, xq, qb);
    matvec_seconds(run_strata, f, w, rb, DISTINCT_ROWS, x, out, 1, xq, qb);
    double diff = 0.0, mag = 0.0, es = 0.0, eg = 0.0, me = 0.0;
    for (int r = 0; r < DISTINCT_ROWS; r++) {
      st_dequantize_row(f->st, w + (uint64_t)r * rb, deq, N);
      double exact = 0.0;
      for (int i = 0; i < N; i++)
        exact += (double)deq[i] * x[i];
      diff = fmax(diff, fabs((double)out[r] - out_g[r]));
      mag = fmax(mag, fabs((double)out_g[r]));
      es = fmax(es, fabs(out[r] - exact)), eg = fmax(eg, fabs(out_g[r] - exact)), me = fmax(me, fabs(exact));
    }
    const double err = mag > 0 ? diff / mag : (diff > 0 ? INFINITY : 0.0);

    double rd[MAX_ROUNDS], s[MAX_ROUNDS], ss[MAX_ROUNDS], g[MAX_ROUNDS], gs[MAX_ROUNDS], q[MAX_ROUNDS];
    const double wbytes = (double)rb * (double)rows;
    for (int r = 0; r < rounds; r++) {
      rd[r] = st_host_read_bandwidth_of(ref, bytes, threads, REPS);
      double sec_s, sec_g;
      if (r % 2 == 0) {
        sec_s = matvec_seconds(run_strata, f, w, rb, rows, x, out, threads, xq, qb);
        sec_g = matvec_seconds(run_ggml, f, w, rb, rows, x, out, threads, xq, qb);
      } else {
        sec_g = matvec_seconds(run_ggml, f, w, rb, rows, x, out, threads, xq, qb);
        sec_s = matvec_seconds(run_strata, f, w, rb, rows, x, out, threads, xq, qb);
      }
      if (rd[r] <= 0 || sec_s <= 0 || sec_g <= 0) {
        fprintf(stderr, "ggml-matvec: a measurement failed\n");
        return 1;
      }
      s[r] = wbytes / sec_s, ss[r] = s[r] / rd[r];
      g[r] = wbytes / sec_g, gs[r] = g[r] / rd[r];
      q[r] = sec_g / sec_s;
    }
    struct figures *o = &fig[k];
    o->bits = 8.0 * (double)rb / N;
    o->read = st_median(rd, rounds) / 1e9;
    o->strata = st_median(s, rounds) / 1e9, o->strata_share = st_median(ss, rounds);
    o->ggml = st_median(g, rounds) / 1e9, o->ggml_share = st_median(gs, rounds);
    o->ratio = st_median(q, rounds);
    o->err = err, o->err_strata = me > 0 ? es / me : es, o->err_ggml = me > 0 ? eg / me : eg;
    printf("%-8s %.3f bits/w: read %5.1f GB/s | strata %5.1f GB/s (%5.1f%%) | ggml %5.1f GB/s (%5.1f%%) | "
           "strata/ggml %.2f | max|strata-ggml|/max|ggml| %.1e (vs exact: strata %.1e, ggml %.1e)%s\n",
           name_of(f), o->bits, o->read, o->strata, 100 * o->strata_share, o->ggml, 100 * o->ggml_share,
           o->ratio, o->err, o->err_strata, o->err_ggml,
           strata_off(o)                 ? "  <<<<<< strata off the exact dot (> 1e-2 and > 2x ggml's)"
           : o->err <= 1e-2              ? ""
           : o->err_ggml > o->err_strata ? " (the two differ by > 1e-2; ggml is the one further from exact)"
                                         : "  <<<<<< MISMATCH > 1e-2 (strata further from exact)");
    bad |= strata_off(o);
    fflush(stdout);
  }

  printf("\n| format | bits/w | read GB/s | strata GB/s | of read | ggml GB/s | of read | strata/ggml | "
         "rel. diff | strata err | ggml err |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int k = 0; k < NFORMATS; k++) {
    const struct figures *o = &fig[k];
    if (pick[k])
      printf("| %s%s | %.3f | %.1f | %.1f | %.1f%% | %.1f | %.1f%% | %.2f | %.0e | %.0e | %.0e |\n",
             name_of(&formats[k]), llama_repacks(formats[k].gg) ? " *" : "", o->bits, o->read, o->strata,
             100 * o->strata_share, o->ggml, 100 * o->ggml_share, o->ratio, o->err, o->err_strata,
             o->err_ggml);
  }
  printf("\n* llama.cpp repacks these by default and runs its repacked GEMV kernels, not the vec_dot timed "
         "here\n");
  free(ref);
  free(w);
  free(xq);
  free(x);
  free(rows_f);
  free(out);
  free(out_g);
  free(deq);
  return bad;
}
