/* Sampling (see sampler.h). */
#include "graph/sampler.h"

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

int32_t st_argmax(const float *v, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; i++)
    if (v[i] > v[best]) best = i;
  return best;
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

int32_t st_sampler_sample(struct st_sampler *s, const float *logits, int32_t n) {
  if (s->temp <= 0.0f) return st_argmax(logits, n);
  struct cand *c = malloc(sizeof *c * (size_t)n);
  if (!c) return -1;
  for (int32_t i = 0; i < n; i++) c[i] = (struct cand){logits[i], i};
  qsort(c, (size_t)n, sizeof *c, by_logit_desc);
  int32_t m = s->top_k > 0 && s->top_k < n ? s->top_k : n;
  double sum = 0.0;
  double *p = malloc(sizeof *p * (size_t)m);
  if (!p) {
    free(c);
    return -1;
  }
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
