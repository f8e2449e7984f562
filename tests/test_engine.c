/* Engine behaviours the fixtures do not reach, on a small model made with the mkmodel code
 * (Q8_0, expert FFN 512, the Qwen3 vocabulary of the fixtures): the CPU pool's FFN split
 * (two 256-row slices summed by the combine) against the unsplit expert (STRATA_FF_SLICE=0),
 * and the expert-profile file round trip and its refusals. Prints what it compared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codelets/quant.h"
#include "common.h"
#include "graph/engine.h"
#include "graph/sampler.h"
#include "io/mkmodel.h"
#include "io/model.h"
#include "io/profile.h"

static int n_pass, n_fail;
#define CHECK(ok, ...)                     \
  do {                                     \
    printf("%s ", (ok) ? "PASS" : "FAIL"); \
    printf(__VA_ARGS__);                   \
    printf("\n");                          \
    (ok) ? n_pass++ : n_fail++;            \
  } while (0)

static int eval_logits(struct st_model *m, const int32_t *ids, int n, float *logits, int *parts) {
  struct st_engine *e = NULL;
  int rc = st_engine_create(m, &(struct st_engine_opts){.n_ctx = 128, .prefill = 16}, &e);
  if (!rc) rc = st_engine_eval(e, ids, n, logits, 0);
  if (!rc) *parts = e->ff_parts;
  st_engine_destroy(e);
  return rc;
}

static void test_ff_split(const char *fixtures) {
  char vocab_path[4096], model_path[] = "/tmp/strata-test-engine-XXXXXX";
  snprintf(vocab_path, sizeof vocab_path, "%s/tokenizer/vocab-qwen3.gguf", fixtures);
  struct st_mkmodel_config cfg;
  struct st_mkmodel_vocab vocab;
  int fd = mkstemp(model_path);
  if (fd < 0 || st_mkmodel_preset("tiny", &cfg) || st_mkmodel_vocab_load(vocab_path, &vocab)) {
    CHECK(0, "ff split: setup: %s", st_last_error());
    return;
  }
  close(fd);
  cfg.n_ff_exp = 512;
  cfg.type = ST_TYPE_Q8_0;
  cfg.progress = 0;
  struct st_model *m = NULL;
  int rc = st_mkmodel_write(&cfg, &vocab, model_path, NULL);
  st_mkmodel_vocab_free(&vocab);
  if (!rc) rc = st_model_load(model_path, &m);
  if (rc) {
    CHECK(0, "ff split: model: %s", st_last_error());
    unlink(model_path);
    return;
  }
  enum { N = 40 };
  int32_t ids[N];
  for (int i = 0; i < N; i++) ids[i] = 1000 + (i * 37) % 5000;
  const int V = (int)m->hp.n_vocab;
  float *split = malloc(sizeof(float) * V), *whole = malloc(sizeof(float) * V);
  int p_split = 0, p_whole = 0;
  unsetenv("STRATA_FF_SLICE");
  rc = eval_logits(m, ids, N, split, &p_split);
  setenv("STRATA_FF_SLICE", "0", 1);
  if (!rc) rc = eval_logits(m, ids, N, whole, &p_whole);
  unsetenv("STRATA_FF_SLICE");
  if (rc) {
    CHECK(0, "ff split: eval: %s", st_last_error());
  } else {
    double mx = 0, scale = 0;
    for (int i = 0; i < V; i++) {
      mx = fmax(mx, fabs(split[i] - whole[i]));
      scale = fmax(scale, fabs(whole[i]));
    }
    CHECK(p_split == 2 && p_whole == 1 && mx <= 1e-5 * scale && st_argmax(split, V) == st_argmax(whole, V),
          "CPU-pool FFN split (%d slices of 256) vs whole expert (%d): %d logits, max |Δ| = %.2e (≤ 1e-5 × %.2f), same argmax",
          p_split, p_whole, V, mx, scale);
  }
  free(split);
  free(whole);
  st_model_free(m);
  unlink(model_path);
}

static void test_profile(void) {
  char path[] = "/tmp/strata-test-profile-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return;
  close(fd);
  uint64_t counts[3 * 4] = {5, 0, 9, 1, 7, 7, 2, 0, 3, 3, 3, 8};
  struct st_profile p;
  int rc = st_profile_write(path, 3, 4, 2, 20, counts);
  if (!rc) rc = st_profile_load(path, 3, 4, &p);
  const int ok = !rc && p.pairs[0].layer == 0 && p.pairs[0].expert == 2 && p.pairs[0].count == 9 &&
                 p.pairs[1].layer == 2 && p.pairs[1].expert == 3 && p.total == 48;
  CHECK(ok, "profile round trip: 12 pairs ranked, first (L0, E2, 9) then (L2, E3, 8), total 48");
  if (!rc) st_profile_free(&p);
  rc = st_profile_load(path, 4, 4, &p);
  CHECK(rc == ST_EINVAL, "profile for another model refused: %s", st_last_error());
  FILE *f = fopen(path, "w");
  fputs("strata-expert-profile 1\nlayers 1 experts 2 top_k 1 tokens 3\n0 0 1\n0 1 2\n", f);
  fclose(f);
  rc = st_profile_load(path, 1, 2, &p);
  CHECK(rc == ST_EFORMAT, "unranked profile refused: %s", st_last_error());
  unlink(path);
}

int main(void) {
  const char *fx = getenv("FIXTURES") ? getenv("FIXTURES") : "../shared/fixtures";
  test_profile();
  test_ff_split(fx);
  printf("test_engine: %d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
