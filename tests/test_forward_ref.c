/* The forward pass against the fixtures' references (fixtures/README.md): for each model and
 * prompt, top-1 agreement at every position by reference margin, the full last-position logits
 * (mean |Δ|/σ, and max |Δ| on the float32-activation path), the greedy continuation up to the
 * first near-tie, and the routing of the first prompt; then prompt chunking (--prefill 1, 7,
 * 512 give the same logits within 1e-5 relative). The CPU pool of the quantised fixtures runs
 * the default int8 path (int8 activations, integer kernels); the same checks once more on the CPU
 * pool with STRATA_INT8_DOT=0 (float32 activations) against the same tolerances. On a GPU the
 * prompt GEMMs round their inputs to TF32 by default (STRATA_CUBLAS_TF32) and cached Q8_0 experts
 * take int8 activations (STRATA_INT8_DOT; on the tensor cores with STRATA_MMQ): those paths are
 * held to the tolerance blocks and the int8 chunking bound, not to the float32 path's max
 * |Δlogit| (its numbers are printed); STRATA_CUBLAS_TF32=0 STRATA_INT8_DOT=0 is the float32 path
 * the tight bound holds (scripts/gpu-check.sh runs both). Every number compared is printed. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codelets/dot.h"
#include "codelets/quant.h"
#include "common.h"
#include "graph/engine.h"
#include "graph/sampler.h"
#include "io/arch.h"
#include "io/model.h"
#include "io/profile.h"
#include "refcheck.h"

static int n_pass, n_fail, n_skip;

/* The routing bound of the q8_0 KV cache's pass. Its keys and values carry int8 rounding (about
 * 0.4 % of a block's largest value) into every later token's attention, which moves router
 * near-ties as int8 K and V projections did (attention.c: 6 of the small Q4_K_M fixture's 56
 * `short` expert sets; so does this cache); the logits, top-1 and greedy rules stay the files'.
 * A wrong cache (a misread block, a wrong row) scrambles most sets. */
#define Q8_KV_ROUTING 0.85

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "PASS" : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  ok ? n_pass++ : n_fail++;
}

/* routing_need: the share of the first prompt's expert sets that must be equal where a path's own
 * rounding is coarser than the fixtures assume (the q8_0 KV cache), or 0: the file's bound. */
static void run_prompt(struct st_engine *e, const struct ref_file *r, const struct ref_prompt *p,
                       const char *tag, int32_t *trace, const char *reduced, double routing_need) {
  const int V = r->n_vocab, n = p->n_ids;
  float *logits = malloc(sizeof(float) * (size_t)V * n);
  st_engine_reset(e);
  e->routing_trace = trace;
  if (st_engine_eval(e, p->ids, n, logits, 1)) {
    check(0, "%s/%s: eval failed: %s", tag, p->name, st_last_error());
    free(logits);
    return;
  }
  e->routing_trace = NULL;
  const double sigma = ref_sigma(p->last_logits, V);

  /* top-1 agreement by reference margin, and |Δ| on the reference's top-8 logits */
  int n01 = 0, a01 = 0, n025 = 0, a025 = 0;
  double top8_max = 0;
  for (int t = 0; t < n; t++) {
    const float *l = logits + (size_t)t * V;
    const double margin = p->top8_logits[t * 8] - p->top8_logits[t * 8 + 1];
    const int agree = st_argmax(l, V) == p->top8_ids[t * 8];
    if (margin > 0.1 * sigma) n01++, a01 += agree;
    if (margin > 0.25 * sigma) n025++, a025 += agree;
    for (int j = 0; j < 8; j++) top8_max = fmax(top8_max, fabs(l[p->top8_ids[t * 8 + j]] - p->top8_logits[t * 8 + j]));
  }
  const double f01 = n01 ? (double)a01 / n01 : 1.0, f025 = n025 ? (double)a025 / n025 : 1.0;
  check(f01 >= r->tol_top1_01 && f025 >= r->tol_top1_025,
        "%s/%s top-1: %d/%d positions agree where margin > 0.1σ (%.3f, need %.2f), %d/%d where > 0.25σ "
        "(%.3f, need %.2f); max |Δ| on reference top-8 logits %.2e",
        tag, p->name, a01, n01, f01, r->tol_top1_01, a025, n025, f025, r->tol_top1_025, top8_max);

  /* full last-position logits */
  const float *last = logits + (size_t)(n - 1) * V;
  double sum = 0, mx = 0;
  for (int i = 0; i < V; i++) {
    const double dlt = fabs(last[i] - p->last_logits[i]);
    sum += dlt;
    mx = fmax(mx, dlt);
  }
  const double mean_over_sigma = sum / V / sigma;
  check(mean_over_sigma <= r->tol_mean_over_sigma,
        "%s/%s last logits (%d values): mean |Δ|/σ = %.2e (≤ %.2f), σ = %.4f, max |Δ| = %.2e", tag,
        p->name, V, mean_over_sigma, r->tol_mean_over_sigma, sigma, mx);
  if (reduced) /* int8 activations or TF32 GEMMs: the tolerance blocks above, not the float32 bound */
    printf("     %s/%s %s path: max |Δlogit| = %.3e, mean |Δ|/σ = %.3e\n", tag, p->name, reduced, mx, mean_over_sigma);
  if (r->tol_f32_max_abs > 0 && !reduced)
    check(mx <= r->tol_f32_max_abs, "%s/%s float32-activation path (bf16 weights × f32 activations, %s kernels): max |Δlogit| = %.2e (≤ %.0e)",
          tag, p->name, st_dot_isa(), mx, r->tol_f32_max_abs);

  /* greedy continuation, judged up to the first step whose reference margin is below 0.1σ */
  int32_t id = st_argmax(last, V);
  int judged = 0, equal = 0;
  for (int s = 0; s < p->n_greedy; s++) {
    if (p->greedy_margins[s] < 0.1 * sigma) break;
    judged++;
    if (id != p->greedy_ids[s]) break;
    equal++;
    if (s + 1 < p->n_greedy && st_engine_eval(e, &id, 1, logits, 0) == 0) id = st_argmax(logits, V);
  }
  check(equal == judged, "%s/%s greedy: %d/%d steps equal before the first near-tie (of %d steps)", tag,
        p->name, equal, judged, p->n_greedy);

  if (trace && p->routing_experts) {
    int same = 0, total = 0;
    for (int l = 0; l < r->n_layer; l++)
      for (int t = 0; t < n && p->routing_layer[l]; t++) {
        const int32_t *mine = trace + ((size_t)l * e->n_ctx + t) * r->k;
        const int32_t *ref = p->routing_experts + ((size_t)l * n + t) * r->k;
        int match = 1;
        for (int j = 0; j < r->k; j++) {
          int found = 0;
          for (int i = 0; i < r->k; i++) found |= mine[i] == ref[j];
          match &= found;
        }
        same += match;
        total++;
      }
    /* int8 activations (or TF32) move router near-ties: llama.cpp's own int8 path changes 1-3 % of
     * the archs/ fixtures' expert sets, and its README asks such a test to accept one flipped pair
     * where the bound allows none (42 or 56 pairs at 0.99) */
    const double need = routing_need > 0 ? routing_need : r->tol_routing;
    const int allowed = reduced && (int)((1.0 - need) * total) < 1 ? 1 : (int)((1.0 - need) * total);
    char why[96] = "";
    if (routing_need > 0) snprintf(why, sizeof why, " for the q8_0 KV cache, where the file asks %.2f", r->tol_routing);
    else if (reduced) snprintf(why, sizeof why, ", or one flipped pair on a reduced-precision path");
    check((double)same / total >= need || total - same <= allowed,
          "%s/%s routing: %d/%d (token, layer) expert sets equal (%.3f, need %.2f%s)", tag, p->name, same, total,
          (double)same / total, need, why);
  }
  free(logits);
}

/* Chunkings of one prompt give the same logits within 1e-5 relative: every path computes a token
 * the same way whatever the chunk, up to the GPU prompt path's cuBLAS (another summation order
 * than the decode kernels). Where that meets int8 activations (`mixed`: the CPU pool's, or the
 * GPU's int8 kernels below cuBLAS's rows for Q8_0 experts), a
 * rounding-level difference in the dense part can move an activation across an int8 quantisation
 * step, so the bound is then the int8 path's: mean |Δ|/σ ≤ 0.01 and the same argmax; the same
 * bound holds TF32 GEMMs (STRATA_CUBLAS_TF32), whose rounding differs between chunkings where a
 * token's rows go through cuBLAS in one chunking and the float32 kernels in another. On a GPU the
 * one-token chunks run as decode steps, whose fused mat-vec kernels sum in another order than the
 * prompt path's kernels even without cuBLAS (STRATA_CUBLAS=0), so int8 activations take the
 * int8 bound there too. */
static void run_chunking(struct st_engine *e, const struct ref_file *r, const char *tag, int mixed) {
  const struct ref_prompt *p = &r->p[0];
  for (int i = 1; i < r->n_prompts; i++)
    if (r->p[i].n_ids > p->n_ids) p = &r->p[i];
  const int V = r->n_vocab;
  const int chunks[] = {512, 7, 1};
  float *base = calloc((size_t)V, sizeof(float)), *l = calloc((size_t)V, sizeof(float));
  for (int c = 0; c < 3; c++) {
    st_engine_reset(e);
    st_engine_set_prefill(e, chunks[c]);
    if (st_engine_eval(e, p->ids, p->n_ids, c ? l : base, 0)) {
      check(0, "%s chunking: eval failed: %s", tag, st_last_error());
      break;
    }
    if (!c) continue;
    double mx = 0, scale = 0, sum = 0;
    for (int i = 0; i < V; i++) {
      mx = fmax(mx, fabs(l[i] - base[i]));
      scale = fmax(scale, fabs(base[i]));
      sum += fabs(l[i] - base[i]);
    }
    if (mixed && mx > 1e-5 * scale) {
      const double rel = sum / V / ref_sigma(base, V);
      check(rel <= 0.01 && st_argmax(l, V) == st_argmax(base, V),
            "%s/%s chunking: --prefill %d vs 512 over %d tokens: max |Δ| = %.2e, mean |Δ|/σ = %.2e (≤ 0.01, cuBLAS "
            "prompt path with int8 activations or TF32), same argmax", tag, p->name, chunks[c], p->n_ids, mx, rel);
      continue;
    }
    check(mx <= 1e-5 * scale, "%s/%s chunking: --prefill %d vs 512 over %d tokens: max |Δ| = %.2e (≤ 1e-5 × max|logit| = %.2e)%s",
          tag, p->name, chunks[c], p->n_ids, mx, 1e-5 * scale, memcmp(l, base, sizeof(float) * V) ? "" : ", bitwise identical");
  }
  st_engine_set_prefill(e, 512);
  free(base);
  free(l);
}

int main(int argc, char **argv) {
  const char *fx = ref_fixtures("the forward pass against the float32 references");
  if (!fx) return 77; /* automake's SKIP */
  char dir[4096];
  /* models/: qwen3moe; archs/: deepseek2, gpt-oss, glm4moe (on a GPU host gpt-oss and glm4moe run on
   * CUDA0 like qwen3moe; deepseek2's GPU kernels are not written yet: the CPU pool computes it,
   * STARPU_NCUDA=0 below) */
  static const char *refs[] = {"models/tiny-bf16-reference.json",           "models/tiny-q8_0-reference.json",
                               "models/small-q4_k_m-reference.json",        "archs/tiny-deepseek2-bf16-reference.json",
                               "archs/tiny-deepseek2-q8_0-reference.json",  "archs/tiny-gpt-oss-bf16-reference.json",
                               "archs/tiny-gpt-oss-q8_0-reference.json",    "archs/tiny-glm4moe-bf16-reference.json",
                               "archs/tiny-glm4moe-q8_0-reference.json"};
  for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++) {
    const char *slash = strchr(refs[i], '/'), *name = slash + 1;
    snprintf(dir, sizeof dir, "%s/%.*s", fx, (int)(slash - refs[i]), refs[i]);
    /* optional arguments: run only the references whose name starts with one of them */
    int wanted = argc < 2;
    for (int a = 1; a < argc; a++) wanted |= strncmp(name, argv[a], strlen(argv[a])) == 0;
    if (!wanted) continue;
    struct ref_file r;
    if (ref_load(dir, name, &r)) {
      check(0, "load reference %s/%s", dir, name);
      continue;
    }
    char tag[64];
    snprintf(tag, sizeof tag, "%.*s", (int)(strstr(name, "-reference") - name), name);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, r.model_file);
    struct st_model *m = NULL;
    int rc = st_model_load(path, &m);
    if (rc == ST_EUNSUP) {
      printf("SKIP %s: %s (the K-quant kernels come with the quantisation issue)\n", tag, st_last_error());
      n_skip++;
      ref_free(&r);
      continue;
    }
    if (rc) {
      check(0, "%s: load: %s", tag, st_last_error());
      ref_free(&r);
      continue;
    }
    /* gpt-oss, glm4moe and deepseek2 take the GPU decode step (their prompts one token at a time);
     * an architecture whose GPU kernels are not checked yet (st_arch::gpu 0) computes on CPU
     * workers only (the engine refuses a CUDA worker) */
    const char *ncuda_arch = getenv("STARPU_NCUDA");
    char *ncuda_arch_was = ncuda_arch ? strdup(ncuda_arch) : NULL;
    if (!st_arch_on_gpu(m->hp.arch)) setenv("STARPU_NCUDA", "0", 1);
    /* Pass 1: the default placement (dense work on CUDA0 when StarPU has a CUDA worker, every
     * expert on the CPU pool). On a GPU machine, passes 2 and 3 cache half and then all of the
     * expert pairs on CUDA0, ranked by the routing pass 1 measured. Pass 4: the half KV cache
     * (--cache-type-k f16 --cache-type-v f16), every pair cached on a GPU machine, the CPU pool
     * without one; held to the tolerance blocks (K and V rounded to 11 significant bits), not to
     * the float32 bound. Pass 5: the q8_0 KV cache (int8 values, an fp16 scale for each 32), where the
     * rows are whole blocks, as pass 4 (on CPU workers where the GPU's attention does not take the
     * model: MLA's latent cache); held to the tolerance blocks too. */
    const int n_pairs = (int)(m->hp.n_layer * m->hp.n_expert);
    char profile[] = "/tmp/strata-test-profile-XXXXXX";
    int have_profile = 0;
    const int caches[5] = {0, n_pairs / 2, n_pairs, n_pairs, n_pairs};
    for (int pass = 0; pass < 5; pass++) {
      const int half_kv = pass == 3, q8_kv = pass == 4;
      const int kv_type = half_kv ? ST_TYPE_F16 : q8_kv ? ST_TYPE_Q8_0 : ST_TYPE_F32;
      struct st_engine *e = NULL;
      struct st_engine_opts eo = {.n_ctx = 1024, .prefill = 512, .expert_cache = caches[pass],
                                  .expert_profile = have_profile ? profile : NULL,
                                  .kv_type = kv_type, .kv_type_v = kv_type};
      if (pass > 0 && pass < 3 && !have_profile) continue;
      if ((half_kv || q8_kv) && !have_profile) eo.expert_cache = 0;
      rc = st_engine_create(m, &eo, &e);
      if (rc == ST_EUNSUP && q8_kv && strstr(st_last_error(), "on a GPU")) { /* the CPU workers' q8_0 cache instead */
        printf("     %s q8_0 KV cache on CPU workers: %s\n", tag, st_last_error());
        const char *ncuda_q8 = getenv("STARPU_NCUDA");
        char *ncuda_q8_was = ncuda_q8 ? strdup(ncuda_q8) : NULL;
        setenv("STARPU_NCUDA", "0", 1);
        eo.expert_cache = 0, eo.expert_profile = NULL;
        rc = st_engine_create(m, &eo, &e);
        if (ncuda_q8_was) setenv("STARPU_NCUDA", ncuda_q8_was, 1);
        else unsetenv("STARPU_NCUDA");
        free(ncuda_q8_was);
      }
      if (rc == ST_EUNSUP && q8_kv) {
        printf("SKIP %s q8_0 KV cache: %s\n", tag, st_last_error());
        n_skip++;
        break;
      }
      if (rc) {
        check(0, "%s: engine: %s", tag, st_last_error());
        break;
      }
      char ptag[192];
      char path_name[96] = "CPU";
      if (e->placement.cuda0_worker >= 0 && e->cublas_rows > 0)
        snprintf(path_name, sizeof path_name, "CUDA0 %s, cuBLAS from %d rows", e->cublas_tf32 ? "TF32" : "float32",
                 e->cublas_rows);
      else if (e->placement.cuda0_worker >= 0)
        snprintf(path_name, sizeof path_name, "CUDA0 float32 kernels");
      snprintf(ptag, sizeof ptag, "%s [%s, %d/%d experts cached%s]", tag, path_name, e->placement.cache[0].n_slots,
               n_pairs, half_kv ? ", f16 KV cache" : q8_kv ? ", q8_0 KV cache" : "");
      /* int8 where the CPU pool computes experts whose type has integer kernels, and where CUDA0's
       * cached Q8_0 experts take the GPU's int8 kernels (decode and batches below cuBLAS) */
      const int q8 = e->int8_dot && e->placement.cache[0].n_slots < n_pairs &&
                     st_q8_row_bytes(m->layers[m->hp.n_layer_dense].gate_exps.type, (int64_t)m->hp.n_embd) > 0;
      const int gpu_q8 = e->int8_dot && e->placement.cache[0].n_slots > 0 && m->layers[m->hp.n_layer_dense].gate_exps.type == ST_TYPE_Q8_0;
      if (gpu_q8)
        strncat(path_name, e->mmq && e->cublas_rows > 0 ? ", int8 Q8_0 experts, tensor cores from 9 rows" : ", int8 Q8_0 experts",
                sizeof path_name - strlen(path_name) - 1);
      printf("%s: %s, %d prompts, %d CPU + %d CUDA workers, CPU kernels %s (int8: %s)\n", ptag, path,
             r.n_prompts, st_engine_n_cpu_workers(e), st_engine_n_cuda_workers(e), st_dot_isa(),
             q8 ? st_dot_q8_isa() : "off");
      int32_t *trace = calloc((size_t)m->hp.n_layer * e->n_ctx * m->hp.n_expert_used, sizeof(int32_t));
      const int tf32 = e->cublas_tf32 && e->placement.cuda0_worker >= 0;
      const char *reduced = (q8 || gpu_q8) && tf32 ? "int8 + TF32" : q8 || gpu_q8 ? "int8" : tf32 ? "TF32" : NULL;
      char reduced_kv[64];
      if (half_kv || q8_kv)
        snprintf(reduced_kv, sizeof reduced_kv, "%s%s%s KV", reduced ? reduced : "", reduced ? " + " : "",
                 half_kv ? "f16" : "q8_0"),
            reduced = reduced_kv;
      for (int j = 0; j < r.n_prompts; j++)
        run_prompt(e, &r, &r.p[j], ptag, j == 0 ? trace : NULL, reduced, q8_kv ? Q8_KV_ROUTING : 0);
      run_chunking(e, &r, ptag, (q8 || gpu_q8 || tf32) && e->placement.cuda0_worker >= 0);
      if (pass == 0 && e->placement.cuda0_worker >= 0) {
        int fd = mkstemp(profile);
        if (fd >= 0) {
          close(fd);
          have_profile = st_profile_write(profile, m->hp.n_layer, m->hp.n_expert, m->hp.n_expert_used,
                                          1, e->route_counts) == 0;
        }
      }
      if (pass == 0 && e->placement.cuda0_worker < 0)
        printf("SKIP %s cache passes: StarPU found no CUDA device\n", tag), n_skip++;
      free(trace);
      st_engine_destroy(e);
    }
    if (have_profile) unlink(profile);
    /* STRATA_INT8_DOT=0 on the CPU pool, where the experts' type has integer kernels (the default
     * passes above used them): the float32-activation kernels */
    if (st_q8_row_bytes(m->layers[m->hp.n_layer_dense].gate_exps.type, (int64_t)m->hp.n_embd) > 0) {
      const char *ncuda = getenv("STARPU_NCUDA");
      char *ncuda_was = ncuda ? strdup(ncuda) : NULL;
      setenv("STRATA_INT8_DOT", "0", 1);
      setenv("STARPU_NCUDA", "0", 1);
      struct st_engine *e = NULL;
      struct st_engine_opts eo = {.n_ctx = 1024, .prefill = 512};
      if (st_engine_create(m, &eo, &e)) {
        check(0, "%s: engine (STRATA_INT8_DOT=0): %s", tag, st_last_error());
      } else {
        char ptag[192];
        snprintf(ptag, sizeof ptag, "%s [CPU, STRATA_INT8_DOT=0, %s float32 kernels]", tag, st_dot_isa());
        printf("%s: %s, %d prompts, %d CPU workers, int8 %d\n", ptag, path, r.n_prompts, st_engine_n_cpu_workers(e),
               e->int8_dot);
        int32_t *trace = calloc((size_t)m->hp.n_layer * e->n_ctx * m->hp.n_expert_used, sizeof(int32_t));
        for (int j = 0; j < r.n_prompts; j++)
          run_prompt(e, &r, &r.p[j], ptag, j == 0 ? trace : NULL, NULL, 0);
        free(trace);
        st_engine_destroy(e);
      }
      unsetenv("STRATA_INT8_DOT");
      if (ncuda_was)
        setenv("STARPU_NCUDA", ncuda_was, 1);
      else
        unsetenv("STARPU_NCUDA");
      free(ncuda_was);
    }
    if (ncuda_arch_was) setenv("STARPU_NCUDA", ncuda_arch_was, 1);
    else unsetenv("STARPU_NCUDA");
    free(ncuda_arch_was);
    st_model_free(m);
    ref_free(&r);
  }
  printf("test_forward_ref: %d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
  return n_fail ? 1 : 0;
}
