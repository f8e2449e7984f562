/* Sampling (see sampler.h). */
#include "graph/sampler.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdlib.h>

void st_sampler_init(struct st_sampler *s, float temp, int top_k, float top_p, uint64_t seed) {
  s->temp = temp;
  s->top_k = top_k;
  s->top_p = top_p;
  /* splitmix64 of the seed, so nearby seeds give unrelated streams; never zero */
  uint64_t z = seed + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  s->rng = (z ^ (z >> 31)) | 1;
}

#if defined(__x86_64__)
/* The largest value of v[0..n) (n a multiple of 32) by four AVX2 running maxima: _mm256_max_ps(x, m)
 * keeps m where x is NaN, as `x > m ? x : m` does, and m where they are equal (zeros of either sign). */
__attribute__((target("avx2"))) static float max_avx2(const float *v, int32_t n) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  for (int32_t i = 0; i < n; i += 32) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(v + i), m0), m1 = _mm256_max_ps(_mm256_loadu_ps(v + i + 8), m1);
    m2 = _mm256_max_ps(_mm256_loadu_ps(v + i + 16), m2), m3 = _mm256_max_ps(_mm256_loadu_ps(v + i + 24), m3);
  }
  float b[8];
  _mm256_storeu_ps(b, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  float m = -INFINITY;
  for (int j = 0; j < 8; j++) m = b[j] > m ? b[j] : m;
  return m;
}

/* name(v, i, n, t): the first j >= i, in whole groups of eight from i, where _mm256_cmp_ps(v[j], t,
 * pred) holds; else the index past the last such group (n when n - i is a multiple of 8). */
#define ST_FIRST_AVX2(name, pred) \
  __attribute__((target("avx2"))) static int32_t name(const float *v, int32_t i, int32_t n, float t) { \
    const __m256 tt = _mm256_set1_ps(t); \
    for (; i + 8 <= n; i += 8) { \
      const int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), tt, pred)); \
      if (bits) return i + __builtin_ctz((unsigned)bits); \
    } \
    return i; \
  }
ST_FIRST_AVX2(find_eq_avx2, _CMP_EQ_OQ)    /* v[j] == t */
ST_FIRST_AVX2(find_above_avx2, _CMP_NLE_UQ) /* !(v[j] <= t): above t, or NaN */
#endif

/* Two passes: the largest value over interleaved running maxima (AVX2 where the CPU has it, else a
 * loop of sixteen that the compiler turns into SIMD max instructions), then the first index holding
 * it: the same answer as one sequential scan with strict >, ties to the lower index. NaN never wins
 * except at index 0, as in that scan. */
int32_t st_argmax(const float *v, int32_t n) {
  enum { L = 16 };
  int32_t i = 0;
  float m = -INFINITY;
#if defined(__x86_64__)
  const int avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && n >= 32) m = max_avx2(v, i = n / 32 * 32);
#endif
  float bv[L];
  for (int j = 0; j < L; j++) bv[j] = -INFINITY;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; j++) bv[j] = v[i + j] > bv[j] ? v[i + j] : bv[j];
  for (; i < n; i++) m = v[i] > m ? v[i] : m;
  for (int j = 0; j < L; j++) m = bv[j] > m ? bv[j] : m;
  if (n <= 0 || m == -INFINITY || v[0] != v[0]) return 0;
  i = 0;
#if defined(__x86_64__)
  if (avx2) {
    const int32_t n8 = n / 8 * 8, at = find_eq_avx2(v, 0, n8, m);
    if (at < n8) return at;
    i = n8;
  }
#endif
  for (; i < n; i++)
    if (v[i] == m) return i;
  return 0;
}

struct cand {
  float logit;
  int32_t id;
};

static int by_logit_desc(const void *a, const void *b) {
  const struct cand *x = a, *y = b;
  if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
  return x->id - y->id;
}

static double next_uniform(struct st_sampler *s) {
  s->rng ^= s->rng << 13;
  s->rng ^= s->rng >> 7;
  s->rng ^= s->rng << 17;
  return (double)(s->rng >> 11) / 9007199254740992.0;
}

/* Keeps the m best candidates of n logits in c[0..m), best first: a min-heap of size m over
 * one pass (O(n log m)), then a sort of the m survivors. Once the heap is full, a logit at or below
 * the worst kept one is never kept (a later index loses the tie), so with simd (AVX2 where the CPU
 * has it) runs of such logits are passed over eight at a time: the same heap, the same result. */
static void best_m(const float *logits, int32_t n, int32_t m, struct cand *c, int simd) {
  int32_t size = 0;
#if defined(__x86_64__)
  simd = simd && __builtin_cpu_supports("avx2");
#else
  simd = 0;
#endif
  for (int32_t i = 0; i < n; i++) {
#if defined(__x86_64__)
    if (simd && size == m && (i = find_above_avx2(logits, i, n, c[0].logit)) >= n) break;
#endif
    const struct cand x = {logits[i], i};
    if (size == m && by_logit_desc(&x, &c[0]) >= 0) continue; /* not better than the worst kept */
    int32_t j;
    if (size < m) {
      j = size++; /* sift up */
      while (j > 0 && by_logit_desc(&c[(j - 1) / 2], &x) < 0) {
        c[j] = c[(j - 1) / 2];
        j = (j - 1) / 2;
      }
    } else {
      j = 0; /* replace the root (the worst kept) and sift down */
      for (;;) {
        int32_t l = 2 * j + 1, w = j;
        const struct cand *worst = &x;
        if (l < size && by_logit_desc(&c[l], worst) > 0) w = l, worst = &c[l];
        if (l + 1 < size && by_logit_desc(&c[l + 1], worst) > 0) w = l + 1;
        if (w == j) break;
        c[j] = c[w];
        j = w;
      }
    }
    c[j] = x;
  }
  qsort(c, (size_t)size, sizeof *c, by_logit_desc);
}

int32_t st_sampler_sample(struct st_sampler *s, const float *logits, int32_t n) {
  if (s->temp <= 0.0f) return st_argmax(logits, n);
  int32_t m = s->top_k > 0 && s->top_k < n ? s->top_k : n;
  struct cand *c = malloc(sizeof *c * (size_t)m);
  double *p = malloc(sizeof *p * (size_t)m);
  if (!c || !p) {
    free(c);
    free(p);
    return -1;
  }
  best_m(logits, n, m, c, 1);
  double sum = 0.0;
  for (int32_t i = 0; i < m; i++) sum += p[i] = exp((double)(c[i].logit - c[0].logit) / s->temp);
  if (s->top_p < 1.0f) {
    double acc = 0.0;
    int32_t keep = 0;
    while (keep < m && acc < s->top_p * sum) acc += p[keep++];
    m = keep > 0 ? keep : 1;
    sum = acc > 0 ? acc : p[0];
  }
  double r = next_uniform(s) * sum;
  int32_t pick = c[m - 1].id;
  for (int32_t i = 0; i < m; i++) {
    r -= p[i];
    if (r < 0) {
      pick = c[i].id;
      break;
    }
  }
  free(p);
  free(c);
  return pick;
}

int st_sampler_best(const float *logits, int32_t n, int32_t m, int32_t *ids, int simd) {
  if (m <= 0 || m > n) return -1;
  struct cand *c = malloc(sizeof *c * (size_t)m);
  if (!c) return -1;
  best_m(logits, n, m, c, simd);
  for (int32_t i = 0; i < m; i++) ids[i] = c[i].id;
  free(c);
  return 0;
}
