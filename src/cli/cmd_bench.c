/* `strata bench`: flashbench-style speed table. Prompt tok/s for each prompt size (one prompt
 * from an empty context), decode tok/s at each context depth (the context filled to the depth,
 * untimed, then greedy decode steps timed), each with the tier counters of that measurement.
 * With --cuda-graphs both, each decode depth is measured with CUDA graphs off, then on, and the
 * two are compared (tok/s, host time in the dense codelets, graph counters).
 * With -r N every test runs N times (after one warm-up, in one engine, as llama-bench's -r) and
 * each row reports the run with the median time, listing every run's tok/s.
 * A table on stdout, or JSON with --json. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/cli.h"
#include "codelets/quant.h"
#include "io/arch.h"
#include "io/learned.h"
#include "codelets/cuda/cuda_codelets.h" /* struct st_cuda_graph_stats (C only, no CUDA headers) */
#include "codelets/dot.h"
#include "common.h"
#include "config.h"
#include "graph/engine.h"
#include "graph/sampler.h"
#include "io/model.h"

#define MAX_SIZES 16
#define MAX_REPS 16

static int parse_list(const char *flag, const char *s, long *v, int *n) {
  *n = 0;
  char *copy = strdup(s), *save = NULL;
  int rc = copy ? 0 : st_set_error(ST_ENOMEM, "out of memory");
  if (!rc && (strstr(s, ",,") || *s == ',' || (*s && s[strlen(s) - 1] == ',')))
    rc = st_set_error(ST_EINVAL, "%s: an empty size in '%s'", flag, s);
  for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok && !rc; tok = strtok_r(NULL, ",", &save)) {
    if (*n == MAX_SIZES) rc = st_set_error(ST_EINVAL, "%s takes at most %d sizes", flag, MAX_SIZES);
    else rc = st_parse_int(flag, tok, 0, 1 << 24, &v[(*n)++]);
  }
  free(copy);
  if (!rc && *n == 0) rc = st_set_error(ST_EINVAL, "%s: no sizes in '%s'", flag, s);
  return rc;
}

struct result {
  const char *test;
  long tokens, depth;
  double seconds;
  struct st_engine_stats delta;
  int graphs;                     /* decode rows: CUDA graphs on (1) or off (0); prompt rows: -1 */
  double gpu_busy;                /* StarPU's executing time of the primary's CUDA worker / wall time */
  struct st_cuda_graph_stats gd; /* graph counters and dense host time of the measurement */
};

static struct st_cuda_graph_stats graph_stats_now(void) {
  struct st_cuda_graph_stats g = {0};
#ifdef ST_HAVE_CUDA
  st_cuda_graph_stats(&g);
#endif
  return g;
}

static struct st_cuda_graph_stats graph_stats_delta(const struct st_cuda_graph_stats *a) {
  struct st_cuda_graph_stats d = graph_stats_now();
  d.captures -= a->captures;
  d.updates -= a->updates;
  d.instantiations -= a->instantiations;
  d.reinstantiations -= a->reinstantiations;
  d.launches -= a->launches;
  d.fallbacks -= a->fallbacks;
  d.dense_calls -= a->dense_calls;
  d.dense_host_s -= a->dense_host_s;
  return d;
}

/* Host time inside the dense CUDA codelets per decode token, microseconds. */
static double dense_us(const struct result *r) { return r->tokens ? 1e6 * r->gd.dense_host_s / r->tokens : 0.0; }
static const char *graphs_word(int g) { return g < 0 ? "-" : g ? "on" : "off"; }

static struct st_engine_stats stats_delta(const struct st_engine_stats *a, const struct st_engine_stats *b) {
  struct st_engine_stats d = *b;
  for (int t = 0; t < ST_TIER_MAX; t++) {
    d.expert_tasks[t] -= a->expert_tasks[t];
    d.expert_entries[t] -= a->expert_entries[t];
    d.tier_bytes[t] -= a->tier_bytes[t];
    d.tier_bytes_unpacked[t] -= a->tier_bytes_unpacked[t];
  }
  d.tasks -= a->tasks;
  d.h2d_bytes -= a->h2d_bytes;
  d.stream_tasks -= a->stream_tasks;
  d.stream_entries -= a->stream_entries;
  d.stream_bytes -= a->stream_bytes;
  d.swaps -= a->swaps;
  d.wait_routing_s -= a->wait_routing_s;
  d.wait_end_s -= a->wait_end_s;
  d.submit_s -= a->submit_s;
  d.step_s -= a->step_s;
  d.gpu_steps -= a->gpu_steps;
  d.gpu_span_s -= a->gpu_span_s;
  d.gpu_gap_s -= a->gpu_gap_s;
  d.host_tail_s -= a->host_tail_s;
  d.host_between_s -= a->host_between_s;
  return d;
}

/* GPU memory per card, MiB: the most seen at the samples (after start and after each test). */
#define MAX_CARDS 8
static double peak_gpu_mib[MAX_CARDS];
static int n_cards;
static void sample_gpu_mem(void) {
#ifdef ST_HAVE_CUDA
  if (!n_cards) n_cards = st_cuda_device_count() < MAX_CARDS ? st_cuda_device_count() : MAX_CARDS;
  for (int d = 0; d < n_cards; d++) {
    const double u = st_cuda_device_used_mib(d);
    peak_gpu_mib[d] = u > peak_gpu_mib[d] ? u : peak_gpu_mib[d];
  }
#endif
}

/* Resets StarPU's profiling counters of worker w (-1: none); starts a busy-share measurement. */
static void busy_reset(int w) {
  struct starpu_profiling_worker_info info;
  if (w >= 0) starpu_profiling_worker_get_info(w, &info);
}
/* Worker w's executing time since busy_reset over `wall` seconds (0 without a worker). */
static double busy_share(int w, double wall) {
  struct starpu_profiling_worker_info info;
  if (w < 0 || wall <= 0 || starpu_profiling_worker_get_info(w, &info)) return 0.0;
  const double s = info.executing_time.tv_sec + info.executing_time.tv_nsec * 1e-9;
  return s / wall < 1.0 ? s / wall : 1.0;
}

/* Synthetic prompt ids: ordinary word pieces cycled (the speed does not depend on the text). */
/* Share of routed entries the GPU caches served in a measurement. */
static double share(const struct result *r) {
  const double g = (double)st_stats_gpu_entries(&r->delta), all = (double)st_stats_routed_entries(&r->delta);
  return all > 0 ? g / all : 0.0;
}

/* FLOPs (two per multiply-add) of n tokens at positions depth..depth+n-1: per token and layer the
 * products of the layer's matrices (its architecture's tensor list, st_arch_layer_tensors: the
 * attention projections, MLA's per-head k_b and v_b, the router, the k routed experts' gate, up
 * and down, a shared expert or a dense layer's FFN), and attention's scores and P V over the keys
 * each token sees (depth + its index + 1, at most the sliding window on a sliding layer; MLA: the
 * absorbed queries of head_dim and values of kv_lora_rank against the cached rows); the output
 * head for `heads` positions (a prompt: the last one; decode: every step). Norms, RoPE, softmax
 * and the activations are left out (their share is under 1 % of a qwen3moe layer). */
static double model_flops(const struct st_model *m, long n, long depth, long heads) {
  const struct st_hparams *hp = &m->hp;
  const struct st_arch *A = st_arch_of(hp->arch);
  const double d = hp->n_embd;
  double total = 2.0 * d * hp->n_vocab * heads;
  for (uint32_t l = 0; l < hp->n_layer; l++) {
    struct st_layer_tensor t[ST_LAYER_MAX_TENSORS];
    const int nt = st_arch_layer_tensors(A, hp, l, t);
    double macs = 0;
    for (int i = 0; i < nt; i++) {
      if (t[i].kind == ST_TK_NORM || t[i].kind == ST_TK_BIAS) continue;
      const double mat = (double)t[i].ne[0] * (double)(t[i].nd > 1 ? t[i].ne[1] : 1);
      const int experts = t[i].nd == 3 && strstr(t[i].suffix, "_exps") != NULL;
      macs += experts ? mat * hp->n_expert_used : mat * (double)(t[i].nd == 3 ? t[i].ne[2] : 1);
    }
    /* keys summed over the tokens, each seeing depth + its index + 1, up to the window */
    double keys = (double)n * depth + (double)n * (n + 1) / 2;
    if (m->layers[l].swa && (double)depth + n > hp->n_swa) {
      keys = 0;
      for (long i = 0; i < n; i++) keys += (double)(depth + i + 1 < (long)hp->n_swa ? depth + i + 1 : (long)hp->n_swa);
    }
    const double per_key = hp->attn_kind == ST_ATTN_MLA ? (double)hp->n_head * (hp->head_dim + hp->kv_lora)
                                                        : 2.0 * hp->n_head * hp->head_dim;
    total += 2.0 * (macs * n + per_key * keys);
  }
  return total;
}

static void fill_ids(int32_t *ids, long n, uint32_t vocab) {
  for (long i = 0; i < n; i++) ids[i] = (int32_t)((1000 + (i * 37) % 5000) % vocab);
}

/* --isa NAME: the kernels' SIMD level (st_dot_force_isa), refused when this CPU lacks it. */
static int force_isa(const char *name) {
  static const char *names[] = {"scalar", "avx2", "avx512", "avx512vbmi"};
  int l = 0;
  while (l < 4 && strcasecmp(names[l], name))
    l++;
  if (l == 4)
    return st_set_error(ST_EINVAL, "--isa must be scalar, avx2, avx512 or avx512vbmi, got '%s'", name);
  const int top = st_dot_force_isa(3);
  if (l > top) return st_set_error(ST_EINVAL, "--isa %s: this CPU has up to %s", name, names[top]);
  st_dot_force_isa(l);
  return 0;
}

int st_cmd_bench(int argc, char **argv) {
  static const struct option own[] = {{"model", required_argument, 0, 'm'},
                                      {"prompt", required_argument, 0, 'P'},
                                      {"decode", required_argument, 0, 'D'},
                                      {"depth", required_argument, 0, 'd'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {"roofline", no_argument, 0, 'R'},
                                      {"kernels", no_argument, 0, 'K'},
                                      {"threads", required_argument, 0, 'T'},
                                      {"repetitions", required_argument, 0, 'r'},
                                      {"formats", required_argument, 0, 'F'},
                                      {"isa", required_argument, 0, 'I'},
                                      {"row-length", required_argument, 0, 'L'},
                                      {"grid-lookup", required_argument, 0, 'G'},
                                      {"row-pairs", required_argument, 0, 'W'},
                                      {0, 0, 0, 0}};
  const char *model = NULL, *formats = NULL, *isa = NULL, *lookup = NULL, *pairs = NULL;
  long prompts[MAX_SIZES] = {512}, depths[MAX_SIZES] = {0}, n_decode = 128;
  int n_prompts = 1, n_depths = 1, json = 0, roofline = 0, kernels = 0, graphs_both = 0, c, rc = 0;
  long threads = 0, reps = 1, row_length = 0;
  struct st_engine_opts eo;
  st_engine_opts_init(&eo);
  rc = st_engine_argv_aliases(argc, argv, "bench");
  struct option *longopts = rc ? NULL : st_engine_longopts_with(own);
  if (!rc && !longopts) rc = st_set_error(ST_ENOMEM, "out of memory");
  opterr = 0;
  optind = 1;
  while (!rc && (c = getopt_long(argc, argv, ":m:c:r:h", longopts, NULL)) != -1) {
    const int handled = st_engine_opt(c, optarg, &eo);
    if (handled) {
      rc = handled < 0 ? handled : 0;
      continue;
    }
    switch (c) {
    case 'm': model = optarg; break;
    case 'P': rc = parse_list("--prompt", optarg, prompts, &n_prompts); break;
    case 'd': rc = parse_list("--depth", optarg, depths, &n_depths); break;
    case 'D': rc = st_parse_int("--decode", optarg, 0, 1 << 20, &n_decode); break;
    case 'j': json = 1; break;
    case 'R': roofline = 1; break;
    case 'K': kernels = 1; break;
    case 'T': rc = st_parse_int("--threads", optarg, 1, 256, &threads); break;
    case 'F': formats = optarg; break;
    case 'I': isa = optarg; break;
    case 'G': lookup = optarg; break;
    case 'W': pairs = optarg; break;
    case 'L': rc = st_parse_int("--row-length", optarg, 256, 65536, &row_length); break;
    case 'r': rc = st_parse_int("--repetitions", optarg, 1, MAX_REPS, &reps); break;
    case 'h':
      printf(
          "usage: strata bench -m FILE [--prompt 512,4096] [--decode 128] [--depth 0,1024] [-r N] [--json]\n"
          "                    [--cuda-graphs on|off|both] [engine flags]\n\n"
          "  -m, --model FILE       MoE GGUF (qwen3moe, deepseek2, gpt-oss, glm4moe)\n"
          "      --prompt LIST      prompt sizes in tokens, each timed from an empty context (default 512)\n"
          "      --decode N         decode steps timed at each depth (default 128; 0 = skip decode)\n"
          "      --depth LIST       context depths in tokens before decoding (default 0); a depth equal to\n"
          "                         the last --prompt size decodes in that prompt's context (no second "
          "prefill)\n"
          "  -r, --repetitions N    run every test N times in the same engine (1..16, default 1); each row\n"
          "                         is the run with the median time (the lower one for an even N), and\n"
          "                         every run's tok/s is listed\n"
          "      --json             print JSON instead of the table\n"
          "      --roofline         measure host and GPU memory bandwidth and print, per decode row, the\n"
          "                         expert-bandwidth roofline 1 / ((1-f) B / BW_host + f B / BW_gpu)\n"
          "      --kernels          no model: mat-vec GB/s per weight format on the CPU (and CUDA), against\n"
          "                         the memory bandwidths measured in the same run\n"
          "      --threads N        CPU threads for --kernels (default: online CPUs)\n"
          "      --formats LIST     --kernels: only these weight formats, e.g. q4_K,iq3_xxs (default: all but\n"
          "                         iq2_xxs, iq1_s, iq1_m, q2_0, q1_0, tq2_0, tq1_0, mxfp4: named only)\n"
          "      --isa NAME         --kernels: cap the CPU kernels at scalar, avx2, avx512 or avx512vbmi\n"
          "                         (default: the best this CPU has)\n"
          "      --grid-lookup permute|gather\n"
          "                         --kernels at avx512vbmi: how the grids are looked up: permute, all\n"
          "                         by vpermi2b; gather, IQ2_XS/IQ2_S by vpgatherdd and IQ3_XXS/IQ3_S\n"
          "                         by vpermb pairs (same bits; default: gather on Intel CPUs with AMX,\n"
          "                         else permute)\n"
          "      --row-pairs on|off --kernels at avx512vnni and avx512vbmi: the K and grid formats' rows\n"
          "                         two at a time (on) or one at a time (off) (same bits; default: on\n"
          "                         on Intel CPUs, else off)\n"
          "      --row-length N     --kernels: weights per row, a multiple of 256 (default 4096)\n"
          "      --cuda-graphs both measure each decode depth with CUDA graphs off, then on, and compare\n"
          "                         (tok/s, the dense codelets' host time per token, graph counters)\n"
          "Engine flags as for generate, but -c defaults to what the largest test needs (its prompt, or its\n"
          "depth plus --decode), not min(model context, 4096):\n");
      st_engine_opts_help(stdout);
      free(longopts);
      return 0;
    case ':': rc = st_set_error(ST_EINVAL, "option '%s' needs a value", argv[optind - 1]); break;
    default: rc = st_set_error(ST_EINVAL, "unknown option '%s' (see strata bench --help)", st_cli_bad_option(argv));
    }
  }
  free(longopts);
  if (!rc && optind < argc) rc = st_set_error(ST_EINVAL, "unexpected argument '%s'", argv[optind]);
  if (!rc && model && kernels)
    rc = st_set_error(ST_EINVAL, "--kernels takes no model: it times the kernels on rows of its own (drop -m, or --kernels for the model bench)");
  if (!rc && reps > 1 && kernels) rc = st_set_error(ST_EINVAL, "--repetitions applies to the model bench, not --kernels");
  if (!rc && formats && !kernels) rc = st_set_error(ST_EINVAL, "--formats applies to --kernels");
  if (!rc && isa && !kernels) rc = st_set_error(ST_EINVAL, "--isa applies to --kernels");
  if (!rc && row_length && !kernels) rc = st_set_error(ST_EINVAL, "--row-length applies to --kernels");
  if (!rc && lookup && !kernels) rc = st_set_error(ST_EINVAL, "--grid-lookup applies to --kernels");
  if (!rc && pairs && !kernels) rc = st_set_error(ST_EINVAL, "--row-pairs applies to --kernels");
  if (!rc && isa) rc = force_isa(isa);
  if (!rc && lookup) {
    if (strcasecmp(lookup, "permute") && strcasecmp(lookup, "gather"))
      rc = st_set_error(ST_EINVAL, "--grid-lookup must be permute or gather, got '%s'", lookup);
    else if (strcmp(st_dot_q8_isa(), "avx512vbmi"))
      rc = st_set_error(ST_EINVAL, "--grid-lookup needs the avx512vbmi kernels (these are %s)",
                        st_dot_q8_isa());
    else
      st_dot_grid_lookup(strcasecmp(lookup, "gather") == 0);
  }
  if (!rc && pairs) {
    if (strcasecmp(pairs, "on") && strcasecmp(pairs, "off"))
      rc = st_set_error(ST_EINVAL, "--row-pairs must be on or off, got '%s'", pairs);
    else if (strncmp(st_dot_q8_isa(), "avx512", 6))
      rc = st_set_error(ST_EINVAL, "--row-pairs needs the avx512vnni or avx512vbmi kernels (these are %s)",
                        st_dot_q8_isa());
    else
      st_dot_row_pairs(strcasecmp(pairs, "on") == 0);
  }
  if (!rc && kernels) {
    rc = st_kernel_bench(threads ? (int)threads : (int)sysconf(_SC_NPROCESSORS_ONLN), json, formats,
                         row_length ? row_length : 4096);
    if (rc) fprintf(stderr, "strata bench: %s\n", st_last_error());
    return rc ? 1 : 0;
  }
  if (!rc && threads && !kernels) rc = st_set_error(ST_EINVAL, "--threads applies to --kernels (the model bench uses StarPU's workers: STARPU_NCPU)");
  if (!rc && !model) rc = st_set_error(ST_EINVAL, "no model given (-m FILE)");
  if (eo.cuda_graphs == ST_CUDA_GRAPHS_BOTH) {
    graphs_both = 1;
    eo.cuda_graphs = ST_CUDA_GRAPHS_ON;
  }
  if (!rc) rc = st_engine_opts_check(&eo);
  long need = n_decode > 0 ? 1 : 0;
  for (int i = 0; i < n_prompts; i++) need = prompts[i] > need ? prompts[i] : need;
  for (int i = 0; i < n_depths && n_decode > 0; i++) need = depths[i] + n_decode > need ? depths[i] + n_decode : need;
  if (!rc && eo.n_ctx && need > eo.n_ctx)
    rc = st_set_error(ST_EINVAL, "the largest test needs %ld tokens of context, -c gives %d", need, eo.n_ctx);
  if (!eo.n_ctx) eo.n_ctx = (int)need;

  struct st_model *m = NULL;
  struct st_engine *e = NULL;
  struct st_learned learned = {0};
  if (!rc) rc = st_model_load(model, &m);
  if (!rc) st_cli_learn_begin(&learned, m, &eo, 0); /* read only: a benchmark's tokens are not learned */
  if (!rc) rc = st_engine_create(m, &eo, &e);
  if (!rc) st_cli_learn_say(&learned);
  if (!rc) sample_gpu_mem();
  int32_t *ids = rc ? NULL : malloc(sizeof(int32_t) * (size_t)need);
  float *logits = rc ? NULL : malloc(sizeof(float) * m->hp.n_vocab);
  struct result res[3 * MAX_SIZES * MAX_REPS];
  int n_res = 0;
  if (!rc && (!ids || !logits)) rc = st_set_error(ST_ENOMEM, "out of memory");
  if (!rc) fill_ids(ids, need, m->hp.n_vocab);
  /* warm-up, untimed: first touches of the mapped weights, CUDA contexts, performance models;
   * then two one-token steps, which instantiate the decode path's CUDA graphs when they are on */
  const int graphs_on = !rc && st_engine_set_cuda_graphs(e, 1);
  if (!rc) st_engine_set_cuda_graphs(e, eo.cuda_graphs != ST_CUDA_GRAPHS_OFF);
  if (graphs_both && !graphs_on) {
    fprintf(stderr, "strata bench: --cuda-graphs both: no CUDA worker runs the dense work, so graphs have no effect; "
                    "measuring once\n");
    graphs_both = 0;
  }
  if (!rc) rc = st_engine_eval(e, ids, (int)(need < 32 ? need : 32), logits, 0);
  if (!rc) st_engine_reset(e);
  for (long i = 0; i < 2 && i < need && !rc; i++) rc = st_engine_eval(e, ids + i, 1, logits, 0);
  int per_rep = 0; /* results of one repetition; repetition r's are res[r * per_rep ...] */
  for (long rep = 0; rep < reps && !rc; rep++) {
    long held = 0; /* the engine's context holds ids[0..held) from the last prompt test */
    int32_t held_next = ids ? ids[0] : 0;
    for (int i = 0; i < n_prompts && !rc; i++) {
      if (prompts[i] == 0) continue;
      st_engine_reset(e);
      const struct st_engine_stats before = e->stats;
      busy_reset(e->placement.cuda0_worker);
      const double t0 = st_now();
      rc = st_engine_eval(e, ids, (int)prompts[i], logits, 0);
      const double dt = st_now() - t0;
      res[n_res++] = (struct result){"prompt", prompts[i], 0, dt, stats_delta(&before, &e->stats), -1,
                                     busy_share(e->placement.cuda0_worker, dt), {0}};
      sample_gpu_mem();
      if (!rc) held = prompts[i], held_next = st_argmax(logits, (int32_t)m->hp.n_vocab);
    }
    /* a depth equal to the last prompt's size decodes first, in that prompt's context: the prefill
     * would evaluate the same ids in the same chunks, so it is not run a second time */
    int order[MAX_SIZES];
    for (int i = 0; i < n_depths; i++) order[i] = i;
    for (int i = 1; i < n_depths; i++)
      if (held > 0 && depths[order[i]] == held && depths[order[0]] != held) {
        const int t = order[0];
        order[0] = order[i];
        order[i] = t;
      }
    for (int oi = 0; oi < n_depths && n_decode > 0 && !rc; oi++)
      for (int pass = graphs_both ? 0 : 1; pass < 2 && !rc; pass++) {
        const int i = order[oi];
        const int graphs = graphs_both ? st_engine_set_cuda_graphs(e, pass) : e->cuda_graphs;
        int32_t id = ids[0];
        if (oi == 0 && held > 0 && depths[i] == held && e->n_past == held) {
          id = held_next;
        } else {
          st_engine_reset(e);
          if (depths[i] > 0 && !(rc = st_engine_eval(e, ids, (int)depths[i], logits, 0))) id = st_argmax(logits, (int32_t)m->hp.n_vocab);
        }
        const struct st_engine_stats before = e->stats;
        const struct st_cuda_graph_stats gbefore = graph_stats_now();
        busy_reset(e->placement.cuda0_worker);
        const double t0 = st_now();
        for (long s = 0; s < n_decode && !rc; s++) rc = st_engine_eval_next(e, id, &id); /* greedy */
        const double dt = st_now() - t0;
        res[n_res++] = (struct result){"decode", n_decode, depths[i], dt, stats_delta(&before, &e->stats),
                                       graphs, busy_share(e->placement.cuda0_worker, dt), graph_stats_delta(&gbefore)};
        sample_gpu_mem();
      }
    if (rep == 0) per_rep = n_res;
  }
  /* each row becomes the repetition with the median time; runs[] keeps every run's tok/s */
  double runs[3 * MAX_SIZES][MAX_REPS];
  if (!rc && reps > 1) {
    for (int j = 0; j < per_rep; j++) {
      int idx[MAX_REPS];
      for (int r = 0; r < reps; r++) idx[r] = r * per_rep + j, runs[j][r] = res[idx[r]].tokens / res[idx[r]].seconds;
      for (int r = 1; r < reps; r++) /* insertion sort of the runs by time */
        for (int q = r; q > 0 && res[idx[q]].seconds < res[idx[q - 1]].seconds; q--) {
          const int t = idx[q];
          idx[q] = idx[q - 1];
          idx[q - 1] = t;
        }
      res[j] = res[idx[(reps - 1) / 2]];
    }
    n_res = per_rep;
  }
  /* Roofline: B = expert bytes read per decode token (top-k pairs of every layer), f = the
   * share of routed entries the GPU cache served in that row, bandwidths measured now. */
  double bw_host = 0, bw_gpu = 0, pair_b = 0;
  if (!rc && roofline) {
    bw_host = st_host_read_bandwidth(st_engine_n_cpu_workers(e), (size_t)1 << 30);
    if (st_engine_n_cuda_workers(e) > 0) bw_gpu = st_cuda_copy_bandwidth((size_t)1 << 30);
    for (uint32_t l = 0; l < m->hp.n_layer; l++) pair_b += (double)st_pair_bytes_layer(m, l) * m->hp.n_expert_used;
  }
/* a decode row's per-step mean of a GPU decode step's timer (engine stats), us */
#define STEP_US(r, f) ((r)->delta.gpu_steps ? (r)->delta.f / (double)(r)->delta.gpu_steps * 1e6 : 0.0)
#define TFLOPS(r) (model_flops(m, (r)->tokens, (r)->depth, strcmp((r)->test, "decode") ? 1 : (r)->tokens) / (r)->seconds / 1e12)
#define ROOFLINE(r)                                                                                    \
  (strcmp((r)->test, "decode") || !roofline || bw_host <= 0 ? 0.0 : 1.0 / ((1.0 - share(r)) * pair_b / bw_host + \
                                                                          (bw_gpu > 0 ? share(r) * pair_b / bw_gpu : 0.0)))
  if (!rc && json) {
    printf("{\"model\": \"%s\", \"cpu_workers\": %d, \"cuda_workers\": %d, \"cache_slots\": %d, \"cache_mass_share\": %.4f, "
           "\"n_ctx\": %d, \"kv_type\": \"%s\", \"kv_mib\": %.4f, \"results\": [",
           model, st_engine_n_cpu_workers(e), st_engine_n_cuda_workers(e), e->placement.cache[0].n_slots, e->cache_mass_share,
           e->n_ctx, st_type_info((uint32_t)e->kv_type)->name, st_engine_kv_bytes(e) / 1048576.0);
    for (int i = 0; i < n_res; i++) {
      const struct result *r = &res[i];
      printf("%s\n  {\"test\": \"%s\", \"tokens\": %ld, \"depth\": %ld, \"seconds\": %.4f, \"tok_s\": %.3f, "
             "\"entries_cpu\": %llu, \"entries_gpu\": %llu, \"h2d_mib\": %.2f, \"stream_tasks\": %llu, \"entries_stream\": %llu, \"stream_mib\": %.2f, \"swaps\": %llu, "
             "\"wait_routing_s\": %.4f, \"wait_end_s\": %.4f, \"submit_s\": %.4f, \"step_s\": %.4f, \"roofline_tok_s\": %.2f, \"cuda_graphs\": %s%s%s, "
             "\"graph_captures\": %llu, \"graph_updates\": %llu, \"graph_instantiations\": %llu, "
             "\"graph_reinstantiations\": %llu, \"graph_launches\": %llu, \"graph_fallbacks\": %llu, "
             "\"dense_calls\": %llu, \"dense_host_us_per_token\": %.2f, \"tasks_per_token\": %.1f, "
             "\"gpu_busy_share\": %.4f, \"tflop_s\": %.6g, \"gpu_span_us_per_step\": %.2f, \"gpu_gap_us_per_step\": %.2f, "
             "\"host_tail_us_per_step\": %.2f, \"host_between_us_per_step\": %.2f, \"tok_s_runs\": [",
             i ? "," : "", r->test, r->tokens, r->depth, r->seconds, r->tokens / r->seconds,
             (unsigned long long)r->delta.expert_entries[ST_TIER_CPU_POOL],
             (unsigned long long)st_stats_gpu_entries(&r->delta), r->delta.h2d_bytes / 1048576.0,
             (unsigned long long)r->delta.stream_tasks, (unsigned long long)r->delta.stream_entries,
             r->delta.stream_bytes / 1048576.0,
             (unsigned long long)r->delta.swaps, r->delta.wait_routing_s, r->delta.wait_end_s, r->delta.submit_s, r->delta.step_s, ROOFLINE(r),
             r->graphs < 0 ? "" : "\"", r->graphs < 0 ? "null" : graphs_word(r->graphs), r->graphs < 0 ? "" : "\"",
             (unsigned long long)r->gd.captures, (unsigned long long)r->gd.updates,
             (unsigned long long)r->gd.instantiations, (unsigned long long)r->gd.reinstantiations,
             (unsigned long long)r->gd.launches, (unsigned long long)r->gd.fallbacks,
             (unsigned long long)r->gd.dense_calls, dense_us(r), (double)r->delta.tasks / (double)r->tokens,
             r->gpu_busy, TFLOPS(r), STEP_US(r, gpu_span_s), STEP_US(r, gpu_gap_s), STEP_US(r, host_tail_s),
             STEP_US(r, host_between_s));
      for (int q = 0; q < reps; q++) printf("%s%.3f", q ? ", " : "", reps > 1 ? runs[i][q] : r->tokens / r->seconds);
      printf("]}");
    }
    printf("\n], \"cuda_graphs_compare\": [");
    for (int i = 1, n = 0; graphs_both && i < n_res; i++) {
      const struct result *off = &res[i - 1], *on = &res[i];
      if (strcmp(on->test, "decode") || on->graphs != 1 || off->graphs != 0) continue;
      printf("%s\n  {\"depth\": %ld, \"tok_s_off\": %.3f, \"tok_s_on\": %.3f, \"ratio\": %.4f, "
             "\"dense_host_us_per_token_off\": %.2f, \"dense_host_us_per_token_on\": %.2f}",
             n++ ? "," : "", on->depth, off->tokens / off->seconds, on->tokens / on->seconds,
             off->seconds / on->seconds * on->tokens / off->tokens, dense_us(off), dense_us(on));
    }
    printf("], \"bw_host_gbs\": %.2f, \"bw_gpu_gbs\": %.2f, \"expert_bytes_per_token\": %.0f, \"peak_rss_gib\": %.3f, "
           "\"peak_gpu_mib\": [", bw_host / 1e9, bw_gpu / 1e9, pair_b, st_peak_rss_gib());
    for (int d = 0; d < n_cards; d++) printf("%s%.0f", d ? ", " : "", peak_gpu_mib[d]);
    printf("]}\n");
  } else if (!rc) {
    const double kv_mib = st_engine_kv_bytes(e) / 1048576.0;
    printf("strata bench: %s; %d CPU + %d CUDA workers; primary cache %d slots, GPU caches %.1f%% of the profile's routed "
           "mass; context %d tokens, KV cache %s (%.*f MiB)%s\n",
           model, st_engine_n_cpu_workers(e), st_engine_n_cuda_workers(e), e->placement.cache[0].n_slots,
           100.0 * e->cache_mass_share, e->n_ctx, st_type_info((uint32_t)e->kv_type)->name, st_mib_digits(kv_mib), kv_mib,
           reps > 1 ? "; each row: the run with the median time" : "");
    if (roofline)
      printf("roofline inputs: host read %.1f GB/s (%d threads), GPU copy %.1f GB/s, experts read per token %.1f MiB\n",
             bw_host / 1e9, st_engine_n_cpu_workers(e), bw_gpu / 1e9, pair_b / 1048576.0);
    printf("%-8s %8s %8s %10s %10s %12s %12s %9s %10s %10s %10s %6s %10s %8s %7s %8s\n", "test", "tokens", "depth", "seconds",
           "tok/s", "GPU entries", "CPU entries", "cache %", "H2D MiB", "routing s", "roof tok/s", "graphs", "dense us/t",
           "tasks/t", "GPU %", "TFLOP/s");
    for (int i = 0; i < n_res; i++) {
      const struct result *r = &res[i];
      const uint64_t g = st_stats_gpu_entries(&r->delta), cpu = r->delta.expert_entries[ST_TIER_CPU_POOL];
      char rl[24] = "-"; /* the roofline only where --roofline measured its inputs (a decode row) */
      if (ROOFLINE(r) > 0) snprintf(rl, sizeof rl, "%.1f", ROOFLINE(r));
      printf("%-8s %8ld %8ld %10.3f %10.2f %12llu %12llu %9.1f %10.1f %10.3f %10s %6s %10.1f %8.1f %7.1f %8.3f\n", r->test,
             r->tokens, r->depth, r->seconds, r->tokens / r->seconds, (unsigned long long)g, (unsigned long long)cpu,
             100.0 * share(r), r->delta.h2d_bytes / 1048576.0, r->delta.wait_routing_s, rl,
             graphs_word(r->graphs), r->graphs < 0 ? 0.0 : dense_us(r), (double)r->delta.tasks / (double)r->tokens,
             100.0 * r->gpu_busy, TFLOPS(r));
    }
    for (int i = 0; i < n_res; i++) {
      const struct result *r = &res[i];
      if (r->test[0] == 'd' && r->delta.gpu_steps)
        printf("decode at depth %ld, per step: GPU span %.1f us (the first kernel's start to the head's end), GPU idle "
               "between steps %.1f us, host after the head's flag %.1f us, host between steps %.1f us\n",
               r->depth, STEP_US(r, gpu_span_s), STEP_US(r, gpu_gap_s), STEP_US(r, host_tail_s), STEP_US(r, host_between_s));
      if (r->graphs == 1)
        printf("cuda graphs, decode at depth %ld: %llu captures, %llu updates, %llu instantiations, %llu re-instantiations, "
               "%llu launches, %llu fallbacks\n", r->depth, (unsigned long long)r->gd.captures,
               (unsigned long long)r->gd.updates, (unsigned long long)r->gd.instantiations,
               (unsigned long long)r->gd.reinstantiations, (unsigned long long)r->gd.launches,
               (unsigned long long)r->gd.fallbacks);
      if (graphs_both && r->graphs == 1 && i > 0 && res[i - 1].graphs == 0) {
        const struct result *off = &res[i - 1];
        printf("cuda graphs, decode at depth %ld: off %.2f tok/s, on %.2f tok/s, on/off %.3f; dense codelets' host time "
               "%.1f -> %.1f us per token\n", r->depth, off->tokens / off->seconds, r->tokens / r->seconds,
               off->seconds / r->seconds * r->tokens / off->tokens, dense_us(off), dense_us(r));
      }
    }
    for (int i = 0; i < n_res; i++)
      if (res[i].delta.stream_tasks)
        printf("prompt of %ld: %llu uncached experts streamed to CUDA0 for %llu rows, %.1f MiB of weights (H2D MiB counts "
               "every host->device copy)\n", res[i].tokens, (unsigned long long)res[i].delta.stream_tasks,
               (unsigned long long)res[i].delta.stream_entries, res[i].delta.stream_bytes / 1048576.0);
    for (int i = 0; i < n_res && e->placement.n_caches > 1; i++) { /* per card, with helpers, a peer or a split */
      char tiers[1024];
      st_engine_tier_report(e, &res[i].delta, NULL, tiers, sizeof tiers);
      printf("  %s %ld: %s\n", res[i].test, res[i].test[0] == 'p' ? res[i].tokens : res[i].depth, tiers);
    }
    for (int i = 0; i < n_res && reps > 1; i++) {
      printf("%s %s %ld%s, %ld runs (tok/s):", res[i].test, res[i].test[0] == 'p' ? "of" : "at depth",
             res[i].test[0] == 'p' ? res[i].tokens : res[i].depth,
             graphs_both && res[i].graphs >= 0 ? (res[i].graphs ? " (graphs on)" : " (graphs off)") : "", reps);
      for (int q = 0; q < reps; q++) printf(" %.2f", runs[i][q]);
      printf("\n");
    }
    printf("peak resident memory %.2f GiB\n", st_peak_rss_gib());
    for (int d = 0; d < n_cards; d++) printf("peak GPU memory CUDA%d: %.0f MiB (in use on the card, sampled after each test)\n", d, peak_gpu_mib[d]);
  }
#undef ROOFLINE
  if (rc) fprintf(stderr, "strata bench: %s\n", st_last_error());
  free(ids);
  free(logits);
  st_engine_destroy(e);
  st_learned_close(&learned);
  st_model_free(m);
  return rc ? 1 : 0;
}
