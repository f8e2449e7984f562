/* Memory bandwidths for the bench's roofline figure and --kernels, measured in the same run: the
 * host's read bandwidth with N threads (each sums its share of a buffer much larger than the
 * caches), and the thread team both CPU measurements run on (st_team_best_seconds). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli/membw.h"
#include "common.h"

/* A team of threads created once: each repetition releases them together through a barrier and
 * ends when the last is done, so thread creation and start-up skew stay out of the timing (the CPU
 * pool's StarPU workers are long-lived threads too). */
struct team {
  pthread_barrier_t start, end;
  pthread_mutex_t gate; /* held by the creator until every thread exists (or one failed) */
  int reps;             /* read under the gate: 0 when a thread could not be created */
  void *(*fn)(void *);
};

struct member {
  struct team *t;
  void *arg;
};

static void *member_run(void *arg) {
  const struct member *m = arg;
  pthread_mutex_lock(&m->t->gate);
  const int reps = m->t->reps;
  pthread_mutex_unlock(&m->t->gate);
  for (int r = 0; r < reps; r++) {
    pthread_barrier_wait(&m->t->start);
    m->t->fn(m->arg);
    pthread_barrier_wait(&m->t->end);
  }
  return NULL;
}

double st_team_best_seconds(int threads, void *(*fn)(void *), void *args, size_t arg_size, int reps) {
  if (threads < 1 || threads > 256 || reps < 1) return -1.0;
  struct team t = {.reps = reps, .fn = fn};
  struct member m[256];
  pthread_t tid[256];
  if (pthread_mutex_init(&t.gate, NULL)) return -1.0;
  if (pthread_barrier_init(&t.start, NULL, (unsigned)threads + 1)) {
    pthread_mutex_destroy(&t.gate);
    return -1.0;
  }
  if (pthread_barrier_init(&t.end, NULL, (unsigned)threads + 1)) {
    pthread_barrier_destroy(&t.start);
    pthread_mutex_destroy(&t.gate);
    return -1.0;
  }
  int started = 0;
  pthread_mutex_lock(&t.gate);
  for (; started < threads; started++) {
    m[started] = (struct member){&t, (char *)args + arg_size * (size_t)started};
    if (pthread_create(&tid[started], NULL, member_run, &m[started])) break;
  }
  if (started < threads) t.reps = 0; /* the threads that exist leave without waiting on a barrier */
  pthread_mutex_unlock(&t.gate);
  double best = -1.0;
  if (started == threads) {
    for (int r = 0; r < reps; r++) {
      const double t0 = st_now();
      pthread_barrier_wait(&t.start);
      pthread_barrier_wait(&t.end);
      const double dt = st_now() - t0;
      best = best < 0 || dt < best ? dt : best;
    }
  }
  for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
  pthread_barrier_destroy(&t.start);
  pthread_barrier_destroy(&t.end);
  pthread_mutex_destroy(&t.gate);
  return best;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double st_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[(n - 1) / 2];
}

void st_bench_inputs(float *x, float *rows, int64_t n, int distinct) {
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)(i % 17) / 17.0f;
  uint32_t lcg = 12345;
  for (int64_t i = 0; i < n * distinct; i++) {
    float v = 0.0f;
    for (int k = 0; k < 4; k++) {
      lcg = lcg * 1664525u + 1013904223u;
      v += (float)(lcg >> 8) / 16777216.0f - 0.5f;
    }
    rows[i] = v;
  }
}

uint64_t st_bench_bytes(void) {
  uint64_t bytes = (uint64_t)1 << 30;
#ifdef _SC_LEVEL3_CACHE_SIZE
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0 && 4 * (uint64_t)l3 > bytes) bytes = 4 * (uint64_t)l3;
#endif
  return bytes;
}

void *st_bench_buffer(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, (size_t)2 << 20, bytes)) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE); /* as the host expert arena: fewer TLB misses; a hint only */
#endif
  return p;
}

struct reader {
  const uint64_t *p;
  size_t n;
  int prefetch; /* 1: also ask for the lines 2 KiB ahead, as the integer kernels do */
  uint64_t sum;
};

/* Sums its share with the widest vector loads the CPU has (AVX-512, AVX2, else SSE2) into
 * independent accumulators that stay in registers, so that the loop is bound by memory and not by
 * issuing loads: the reference must read at least as fast as the kernels it is compared with (a
 * scalar loop read 37 GB/s on two cores where the int8 kernels read more). The AVX loops run with
 * and without software prefetch, and the faster counts (the kernels prefetch). */
typedef uint64_t v2u64 __attribute__((vector_size(16)));

static uint64_t sum_sse2(const uint64_t *p, size_t n) {
  const v2u64 *v = (const v2u64 *)p;
  v2u64 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
  for (size_t i = 0; i + 8 <= n / 2; i += 8) {
    s0 += v[i], s1 += v[i + 1], s2 += v[i + 2], s3 += v[i + 3];
    s4 += v[i + 4], s5 += v[i + 5], s6 += v[i + 6], s7 += v[i + 7];
  }
  const v2u64 s = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
  return s[0] + s[1];
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *p, size_t n, int prefetch) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    if (prefetch) {
      _mm_prefetch((const char *)(p + i + 256), _MM_HINT_T0);
      _mm_prefetch((const char *)(p + i + 264), _MM_HINT_T0);
    }
    s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *)(p + i)));
    s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *)(p + i + 4)));
    s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *)(p + i + 8)));
    s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *)(p + i + 12)));
  }
  uint64_t out[4];
  _mm256_storeu_si256((__m256i *)out, _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
  return out[0] + out[1] + out[2] + out[3];
}

__attribute__((target("avx512f"))) static uint64_t sum_avx512(const uint64_t *p, size_t n, int prefetch) {
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    if (prefetch)
      for (size_t j = 0; j < 32; j += 8)
        _mm_prefetch((const char *)(p + i + 256 + j), _MM_HINT_T0);
    s0 = _mm512_add_epi64(s0, _mm512_load_si512((const void *)(p + i)));
    s1 = _mm512_add_epi64(s1, _mm512_load_si512((const void *)(p + i + 8)));
    s2 = _mm512_add_epi64(s2, _mm512_load_si512((const void *)(p + i + 16)));
    s3 = _mm512_add_epi64(s3, _mm512_load_si512((const void *)(p + i + 24)));
  }
  return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
}
#endif

static void *read_part(void *arg) {
  struct reader *r = arg;
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f"))
    r->sum = sum_avx512(r->p, r->n, r->prefetch);
  else if (__builtin_cpu_supports("avx2"))
    r->sum = sum_avx2(r->p, r->n, r->prefetch);
  else
#endif
    r->sum = sum_sse2(r->p, r->n);
  return NULL;
}

double st_host_read_bandwidth_of(const void *buf, size_t bytes, int threads, int reps) {
  if (!buf || threads < 1 || threads > 256 || reps < 1) return 0.0;
  struct reader r[256];
  const size_t n = bytes / sizeof(uint64_t), per = n / (size_t)threads / 32 * 32; /* whole 256-byte steps */
  double best = 0.0;
  for (int pf = 0; pf < 2; pf++) { /* without, then with software prefetch: the faster counts */
    for (int i = 0; i < threads; i++)
      r[i] = (struct reader){(const uint64_t *)buf + (size_t)i * per, per, pf, 0};
    const double sec = st_team_best_seconds(threads, read_part, r, sizeof r[0], reps);
    const double bw = sec > 0 ? (double)(per * (size_t)threads * sizeof(uint64_t)) / sec : 0.0;
    best = bw > best ? bw : best;
  }
  return best;
}

double st_host_read_bandwidth(int threads, size_t bytes) {
  if (threads < 1) threads = 1;
  if (threads > 256) threads = 256;
  uint64_t *buf = st_bench_buffer(bytes);
  if (!buf) return 0.0;
  memset(buf, 1, bytes);
  const double best = st_host_read_bandwidth_of(buf, bytes, threads, 5);
  free(buf);
  return best;
}
