/* Token sampling from logits: greedy, or temperature with top-k and top-p (nucleus, Holtzman et
 * al. 2019) filtering, as llama.cpp's samplers apply them (top-k, then top-p, then temperature). */
#ifndef ST_SAMPLER_H
#define ST_SAMPLER_H

#include <stdint.h>

struct st_sampler {
  float temp;   /* <= 0: greedy (argmax, ties to the lower id) */
  int top_k;    /* <= 0: no top-k cut */
  float top_p;  /* >= 1: no nucleus cut */
  uint64_t rng; /* xorshift state, seeded by st_sampler_init */
};

void st_sampler_init(struct st_sampler *s, float temp, int top_k, float top_p, uint64_t seed);

/* Picks one id from n logits (a temporary of n entries is allocated); returns -1 only when that
 * allocation fails. */
int32_t st_sampler_sample(struct st_sampler *s, const float *logits, int32_t n);

/* For tests: ids[0..m) = the m best of n logits as the top-k cut keeps them, best first (logit
 * descending, ties to the lower id), with simd 1 as st_sampler_sample finds them (AVX2 where the
 * CPU has it), with 0 by the plain heap alone. 0, or -1 for m outside 1..n or a failed allocation. */
int st_sampler_best(const float *logits, int32_t n, int32_t m, int32_t *ids, int simd);

/* Index of the largest value (ties to the lower index). */
int32_t st_argmax(const float *v, int32_t n);

#endif
