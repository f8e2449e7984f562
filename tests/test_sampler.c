/* Sampling: greedy is the argmax; top-k keeps only the k best ids and samples them with the
 * softmax(logit / T) frequencies (checked over 20,000 draws against the exact probabilities);
 * a tiny top-p keeps only the best id; the same seed gives the same draws. */
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>

#include <string.h>

#include "codelets/decode.h" /* st_argmax_key: the GPU head's argmax */
#include "common.h"
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

  /* st_argmax (interleaved maxima) against one sequential scan: random logits with many ties (values
   * in steps of 1/8), lengths 0..67 and 151,680, a NaN first or inside, -inf everywhere */
  {
    enum { V = 151680 };
    float *v = malloc(sizeof(float) * V);
    int same = 0, tried = 0;
    uint64_t r = 12345;
    for (int round = 0; round < 200 && v; round++) {
      const int n = round < 68 ? round : round < 190 ? 68 + (round * 977) % 4000 : V;
      for (int i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((r >> 33) % 40) / 8.0f;
      }
      if (round == 100 && n > 0) v[0] = NAN;
      if (round == 101 && n > 5) v[5] = NAN;
      if (round == 102)
        for (int i = 0; i < n; i++) v[i] = -INFINITY;
      int32_t want = 0;
      for (int32_t i = 1; i < n; i++)
        if (v[i] > v[want]) want = i;
      same += st_argmax(v, n) == want;
      tried++;
    }
    free(v);
    printf("%s st_argmax equals a sequential first-max scan on %d of %d vectors (ties, NaN, -inf, 0..151680 long)\n",
           same == tried && tried == 200 ? "PASS" : "FAIL", same, tried);
    same == tried && tried == 200 ? pass++ : fail++;
  }

  /* the GPU head's argmax (decode.h st_argmax_key: the largest key of (logit, id), taken in any
   * order) against st_argmax: finite logits with many ties (steps of 1/8, negative too), -0 and +0
   * among the largest, every order of visiting the ids the same (forward, backward) */
  {
    enum { V = 151680 };
    float *v = malloc(sizeof(float) * V);
    int same = 0, tried = 0;
    uint64_t r = 777;
    for (int round = 0; round < 120 && v; round++) {
      const int n = round < 40 ? round + 1 : round < 110 ? 41 + (round * 977) % 4000 : V;
      for (int i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((int)((r >> 33) % 40) - 30) / 8.0f;
      }
      if (round % 3 == 0) /* the largest is zero, both signs, -0 first */
        for (int i = 0; i < n; i++) v[i] = v[i] > 0.0f ? (i % 2 ? 0.0f : -0.0f) : v[i];
      uint64_t fwd = 0, bwd = 0;
      for (int i = 0; i < n; i++) {
        const uint64_t kf = st_argmax_key(v[i], (uint32_t)i), kb = st_argmax_key(v[n - 1 - i], (uint32_t)(n - 1 - i));
        fwd = kf > fwd ? kf : fwd;
        bwd = kb > bwd ? kb : bwd;
      }
      const int32_t want = st_argmax(v, n);
      same += st_argmax_key_id(fwd) == want && st_argmax_key_id(bwd) == want;
      tried++;
    }
    free(v);
    printf("%s the largest st_argmax_key names st_argmax's id on %d of %d vectors (ties, -0 and +0, 1..151680 long, "
           "both orders)\n", same == tried && tried == 120 ? "PASS" : "FAIL", same, tried);
    same == tried && tried == 120 ? pass++ : fail++;
  }

  /* the top-k cut's m best ids with runs below the worst kept passed over eight at a time (AVX2)
   * against the plain heap: random logits with many ties (steps of 1/8), rising and falling runs,
   * NaN, +inf and -inf inside, lengths 1..4000 and 151,680, m from 1 to n; then the time of each on
   * 151,680 logits spread as a model's (printed, not checked) */
  {
    enum { V = 151680, M = 256 };
    float *v = malloc(sizeof(float) * V);
    int32_t a[M], b[M];
    int same = 0, tried = 0;
    uint64_t r = 777;
    for (int round = 0; round < 160 && v; round++) {
      const int n = round < 120 ? 1 + (round * 613) % 4000 : V;
      for (int i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = round % 5 == 1 ? (float)i / 64.0f : round % 5 == 2 ? -(float)i / 64.0f : (float)((r >> 33) % 40) / 8.0f;
      }
      if (round % 7 == 3) v[(round * 104729) % n] = NAN;
      if (round % 7 == 4) v[(round * 7919) % n] = INFINITY, v[(round * 31) % n] = -INFINITY;
      const int m = round % 4 == 0 ? 1 : round % 4 == 1 ? (n < 40 ? n : 40) : round % 4 == 2 ? (n < M ? n : M) : (n < 7 ? n : 7);
      same += st_sampler_best(v, n, m, a, 1) == 0 && st_sampler_best(v, n, m, b, 0) == 0 && !memcmp(a, b, sizeof(int32_t) * m);
      tried++;
    }
    printf("%s top-k candidates with runs passed over in AVX2 equal the plain heap's on %d of %d vectors (ties, runs, "
           "NaN, inf, lengths 1..151680, m 1..256)\n", same == tried && tried == 160 ? "PASS" : "FAIL", same, tried);
    same == tried && tried == 160 ? pass++ : fail++;
    for (int i = 0; i < V && v; i++) { /* a model's logits: most near -2 (sd about 1.5), a few far above */
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      const double u1 = ((r >> 11) + 0.5) / 9007199254740992.0;
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      const double u2 = (double)(r >> 11) / 9007199254740992.0;
      v[i] = (float)(-2.0 + 1.5 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)) + (i % 997 == 0 ? 8.0f : 0.0f);
    }
    double us[2] = {0, 0};
    for (int simd = 1; simd >= 0 && v; simd--) {
      const double t0 = st_now();
      for (int rep = 0; rep < 20; rep++) st_sampler_best(v, V, 40, a, simd);
      us[simd] = (st_now() - t0) / 20 * 1e6;
    }
    printf("INFO top-40 of 151,680 logits: %.1f us with the AVX2 pass-over, %.1f us by the plain heap (this machine)\n",
           us[1], us[0]);
    free(v);
  }

  /* st_copy_finite (a decode step's logits out of the GPU's mailbox): the copy is exact and its flag is
   * st_all_finite's and a plain isfinite scan's, with one NaN, +inf or -inf at any of several places
   * (the interleaved part, the tail), lengths 0..40 and 151,680 */
  {
    enum { V = 151680 };
    float *src = malloc(sizeof(float) * V), *dst = malloc(sizeof(float) * V);
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    int agree = 0, tried = 0, copies = 0;
    for (int round = 0; round < 120 && src && dst; round++) {
      const size_t n = round < 41 ? (size_t)round : V;
      for (size_t i = 0; i < n; i++) src[i] = (float)((i * 7919) % 1000) / 250.0f - 2.0f;
      if (round >= 41 && round % 4 != 0) src[(size_t)(round * 104729) % n] = bad[round % 3];
      if (round < 41 && n > 0 && round % 2) src[n - 1 - (size_t)round % n] = bad[round % 3];
      int want = 1;
      for (size_t i = 0; i < n; i++) want &= isfinite(src[i]) != 0;
      memset(dst, 0x5a, sizeof(float) * V);
      const int got = st_copy_finite(dst, src, n);
      agree += got == want && st_all_finite(src, n) == want;
      copies += memcmp(dst, src, sizeof(float) * n) == 0;
      tried++;
    }
    free(src), free(dst);
    printf("%s st_copy_finite: copies exact %d of %d, finite flag equals st_all_finite and an isfinite scan on %d of %d "
           "(NaN, +inf, -inf, lengths 0..40 and 151680)\n", agree == tried && copies == tried && tried == 120 ? "PASS" : "FAIL",
           copies, tried, agree, tried);
    agree == tried && copies == tried && tried == 120 ? pass++ : fail++;
  }

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
