/* Sampling: greedy is the argmax; top-k keeps only the k best ids and samples them with the
 * softmax(logit / T) frequencies (checked over 20,000 draws against the exact probabilities);
 * a tiny top-p keeps only the best id; the same seed gives the same draws. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "graph/sampler.h"

int main(void) {
  enum { N = 1000, DRAWS = 20000 };
  float logits[N];
  int pass = 0, fail = 0;
  for (int i = 0; i < N; i++) logits[i] = (float)((i * 7919) % 1000) / 250.0f; /* 0 .. 4 */
  logits[123] = 6.0f, logits[456] = 5.5f, logits[789] = 5.0f;
  struct st_sampler s;
  st_sampler_init(&s, 0.0f, 40, 0.95f, 1);
  int32_t g = st_sampler_sample(&s, logits, N);
  printf("%s greedy: %d (want 123)\n", g == 123 ? "PASS" : "FAIL", g);
  g == 123 ? pass++ : fail++;

  st_sampler_init(&s, 0.7f, 3, 1.0f, 5);
  int counts[N] = {0}, outside = 0;
  for (int d = 0; d < DRAWS; d++) {
    int32_t id = st_sampler_sample(&s, logits, N);
    counts[id]++;
    outside += id != 123 && id != 456 && id != 789;
  }
  const int ids[3] = {123, 456, 789};
  double z = 0, worst = 0;
  for (int j = 0; j < 3; j++) z += exp(logits[ids[j]] / 0.7);
  for (int j = 0; j < 3; j++) worst = fmax(worst, fabs((double)counts[ids[j]] / DRAWS - exp(logits[ids[j]] / 0.7) / z));
  const int ok = outside == 0 && worst < 0.02;
  printf("%s top-k 3, T 0.7: %d of %d draws outside the top 3; max |frequency - probability| = %.4f (< 0.02)\n",
         ok ? "PASS" : "FAIL", outside, DRAWS, worst);
  ok ? pass++ : fail++;

  st_sampler_init(&s, 1.0f, 0, 0.01f, 9);
  int only_best = 1;
  for (int d = 0; d < 200; d++) only_best &= st_sampler_sample(&s, logits, N) == 123;
  printf("%s top-p 0.01 over all %d ids: 200 draws all give the best id\n", only_best ? "PASS" : "FAIL", N);
  only_best ? pass++ : fail++;

  struct st_sampler a, b;
  st_sampler_init(&a, 1.0f, 40, 0.95f, 77);
  st_sampler_init(&b, 1.0f, 40, 0.95f, 77);
  int same = 1;
  for (int d = 0; d < 100; d++) same &= st_sampler_sample(&a, logits, N) == st_sampler_sample(&b, logits, N);
  printf("%s seed 77 twice: 100 identical draws\n", same ? "PASS" : "FAIL");
  same ? pass++ : fail++;
  printf("test_sampler: %d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
}
