/* `strata generate` and `strata eval`: load a model, start the engine, run a prompt; generate
 * streams sampled text and reports speed and per-tier expert work, eval writes logits. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "codelets/quant.h"
#include "io/gguf.h"
#include "io/chat_template.h"
#include "io/arch.h"
#include "io/learned.h"
#include "codelets/cuda/cuda_codelets.h"
#include "common.h"
#include "config.h"
#include "graph/engine.h"
#include "graph/sampler.h"
#include "io/model.h"
#include "io/tokenizer.h"

struct run_opts {
  const char *model, *prompt, *prompt_ids, *logits_out;
  struct st_engine_opts eo;
  long n_predict, seed, top_k;
  double temp, top_p;
  int chat, print_ids, ignore_eos, all_logits;
};

enum { OPT_PROMPT_IDS = 256, OPT_PRINT_IDS, OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_SEED,
       OPT_CHAT, OPT_LOGITS_OUT, OPT_IGNORE_EOS, OPT_ALL_LOGITS };

static void generate_help(FILE *f, const char *cmd) {
  const int gen = !strcmp(cmd, "generate");
  fprintf(f, "usage: strata %s -m FILE (-p TEXT | --prompt-ids IDS) [options]\n\n", cmd);
  fprintf(f,
          "  -m, --model FILE       qwen3moe, deepseek2, gpt-oss or glm4moe GGUF file (F32/F16/BF16,\n"
          "                         Q4_0..Q8_0, Q2_K..Q6_K, IQ1..IQ4,\n"
          "                         Q2_0, Q1_0, TQ2_0, TQ1_0, MXFP4 tensors)\n"
          "  -p, --prompt TEXT      prompt text; special tokens such as <|im_start|> are parsed\n"
          "      --prompt-ids IDS   prompt as token ids, e.g. 1,2,3 or [1,2,3] (instead of -p)\n");
  st_engine_opts_help(f);
  if (gen)
    fprintf(f,
            "  -n, --n-predict N      tokens to generate (default 128; 0 = prompt only)\n"
            "      --chat             wrap the prompt as one user turn in the model's chat template family (Qwen\n"
            "                         ChatML, DeepSeek-V3, gpt-oss harmony, GLM-4, Kimi K2; else ChatML), then\n"
            "                         the assistant's reply\n"
            "      --temp T           sampling temperature (default 0.8; 0 = greedy)\n"
            "      --top-k K          keep the K most likely tokens (default 40; 0 = all)\n"
            "      --top-p P          nucleus sampling mass (default 0.95; 1 = off)\n"
            "      --seed S           sampling seed (default 42; -1: a seed of its own, printed)\n"
            "      --ignore-eos       keep generating after an end-of-text token\n"
            "      --print-ids        print the generated ids as a JSON array instead of the text\n"
            "Ctrl-C (SIGINT) stops generating after the token in progress: the text so far, the timings and the\n"
            "learned expert profile as at a normal end, exit status 130; a second Ctrl-C kills at once.\n");
  else
    fprintf(f,
            "      --chat             wrap the prompt as one user turn in the model's chat template family, then\n"
            "                         the assistant's reply (as strata generate --chat)\n"
            "      --logits-out FILE  write the last position's logits (float32, little-endian, n_vocab values)\n"
            "      --all-logits       write every position's logits instead ([n_prompt][n_vocab]); the prompt then\n"
            "                         runs in chunks of at most 512 tokens (the logits buffer's rows)\n");
  fprintf(f,
          "  -h, --help             this help\n\n"
          "StarPU's environment variables choose the scheduler and workers (STARPU_SCHED, STARPU_NCPU,\n"
          "STARPU_NCUDA, ...); see doc/tuning.md.\n");
}

static int parse_run_opts(int argc, char **argv, struct run_opts *o) {
  *o = (struct run_opts){.n_predict = 128, .seed = 42, .top_k = 40, .temp = 0.8, .top_p = 0.95};
  st_engine_opts_init(&o->eo);
  static const struct option own[] = {
      {"model", required_argument, 0, 'm'},       {"prompt", required_argument, 0, 'p'},
      {"n-predict", required_argument, 0, 'n'},
      {"prompt-ids", required_argument, 0, OPT_PROMPT_IDS},
      {"print-ids", no_argument, 0, OPT_PRINT_IDS},
      {"temp", required_argument, 0, OPT_TEMP},   {"top-k", required_argument, 0, OPT_TOP_K},
      {"top-p", required_argument, 0, OPT_TOP_P}, {"seed", required_argument, 0, OPT_SEED},
      {"chat", no_argument, 0, OPT_CHAT},
      {"logits-out", required_argument, 0, OPT_LOGITS_OUT},
      {"all-logits", no_argument, 0, OPT_ALL_LOGITS},
      {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
      {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
  const int gen = !strcmp(argv[0], "generate");
  int arc = st_engine_argv_aliases(argc, argv, argv[0]);
  if (arc) return arc;
  struct option *longopts = st_engine_longopts_with(own);
  if (!longopts) return st_set_error(ST_ENOMEM, "out of memory");
  opterr = 0;
  optind = 1;
  int c, rc = 0;
  while (!rc && (c = getopt_long(argc, argv, gen ? ":m:p:n:c:h" : ":m:p:c:h", longopts, NULL)) != -1) {
    const int handled = st_engine_opt(c, optarg, &o->eo);
    if (handled) {
      rc = handled < 0 ? handled : 0;
      continue;
    }
    /* the sampling flags are generate's, the logits files eval's */
    const int sampling = c == OPT_PRINT_IDS || c == OPT_TEMP || c == OPT_TOP_K || c == OPT_TOP_P || c == OPT_SEED ||
                         c == OPT_IGNORE_EOS;
    const char *flag = NULL;
    for (const struct option *op = own; op->name && !flag; op++)
      if (op->val == c) flag = op->name;
    if (sampling && !gen) {
      rc = st_set_error(ST_EINVAL, "--%s applies to strata generate (eval samples nothing; see strata eval --help)", flag);
      continue;
    }
    if ((c == OPT_LOGITS_OUT || c == OPT_ALL_LOGITS) && gen) {
      rc = st_set_error(ST_EINVAL, "--%s applies to strata eval (see strata generate --help)", flag);
      continue;
    }
    switch (c) {
    case 'm': o->model = optarg; break;
    case 'p': o->prompt = optarg; break;
    case 'n': rc = st_parse_int("-n", optarg, 0, 1 << 20, &o->n_predict); break;
    case OPT_PROMPT_IDS: o->prompt_ids = optarg; break;
    case OPT_PRINT_IDS: o->print_ids = 1; break;
    case OPT_TEMP: rc = st_parse_float("--temp", optarg, 0.0, 100.0, &o->temp); break;
    case OPT_TOP_K: rc = st_parse_int("--top-k", optarg, 0, 1 << 24, &o->top_k); break;
    case OPT_TOP_P: rc = st_parse_float("--top-p", optarg, 0.0, 1.0, &o->top_p); break;
    case OPT_SEED: rc = st_parse_int("--seed", optarg, -1, 0x7fffffffL, &o->seed); break;
    case OPT_CHAT: o->chat = 1; break;
    case OPT_LOGITS_OUT: o->logits_out = optarg; break;
    case OPT_ALL_LOGITS: o->all_logits = 1; break;
    case OPT_IGNORE_EOS: o->ignore_eos = 1; break;
    case 'h':
      generate_help(stdout, argv[0]);
      free(longopts);
      return 1;
    case ':': rc = st_set_error(ST_EINVAL, "option '%s' needs a value", argv[optind - 1]); break;
    default:
      rc = st_set_error(ST_EINVAL, "unknown option '%s' (see strata %s --help)", st_cli_bad_option(argv), argv[0]);
    }
  }
  free(longopts);
  if (rc) return rc;
  if (optind < argc)
    return st_set_error(ST_EINVAL, "unexpected argument '%s' (see strata %s --help)", argv[optind], argv[0]);
  if (!o->model) return st_set_error(ST_EINVAL, "no model given (-m FILE)");
  if (!o->prompt == !o->prompt_ids) return st_set_error(ST_EINVAL, "give exactly one of -p TEXT and --prompt-ids IDS");
  if (o->prompt && !*o->prompt) return st_set_error(ST_EINVAL, "the prompt is empty");
  if (o->chat && o->prompt_ids) return st_set_error(ST_EINVAL, "--chat applies to -p TEXT, not to --prompt-ids");
  return st_engine_opts_check(&o->eo);
}

/* Model, tokenizer, engine and the prompt's ids, set up from the options. */
struct session {
  struct st_model *model;
  struct st_engine *engine;
  struct st_learned learned;
  int32_t *ids;
  size_t n_ids;
};

static void session_free(struct session *s) {
  st_learned_close(&s->learned);
  st_engine_destroy(s->engine);
  st_model_free(s->model);
  free(s->ids);
}

static int session_open(const struct run_opts *o, struct session *s) {
  *s = (struct session){0};
  double t0 = st_now();
  int rc = st_model_load(o->model, &s->model);
  if (rc) return rc;
  const struct st_hparams *hp = &s->model->hp;
  if (o->prompt_ids) {
    if ((rc = st_parse_ids(o->prompt_ids, &s->ids, &s->n_ids))) return rc;
  } else {
    const char *text = o->prompt;
    char *wrapped = NULL;
    if (o->chat) { /* one user turn in the model's template family (io/chat_template.h), as serve renders it */
      char *tmpl = NULL;
      if (st_gguf_get_str(s->model->gguf, "tokenizer.chat_template", &tmpl)) tmpl = NULL;
      const enum st_chat_kind kind = st_chat_template_detect(tmpl);
      free(tmpl);
      const struct st_chat_msg turn = {"user", text};
      if ((rc = st_chat_render(kind, &turn, 1, 1, 1, &wrapped))) return rc;
      text = wrapped;
    }
    rc = st_tokenizer_encode(s->model->tok, text, strlen(text), ST_TOK_PROMPT, &s->ids, &s->n_ids);
    free(wrapped);
    if (rc) return rc;
    if (s->n_ids == 0) return st_set_error(ST_EINVAL, "the prompt has no tokens");
  }
  const int n_ctx = st_engine_ctx_size(hp, o->eo.n_ctx);
  if ((int64_t)s->n_ids > n_ctx)
    return st_set_error(ST_EINVAL, "the prompt has %zu tokens, more than the context of %d tokens (raise -c)",
                        s->n_ids, n_ctx);
  for (size_t i = 0; i < s->n_ids; i++)
    if (s->ids[i] < 0 || (uint32_t)s->ids[i] >= hp->n_vocab)
      return st_set_error(ST_EINVAL, "token id %d is out of range (vocabulary of %u)", s->ids[i], hp->n_vocab);
  struct st_engine_opts eo = o->eo;
  eo.n_ctx = n_ctx;
  st_cli_learn_begin(&s->learned, s->model, &eo, 1);
  if ((rc = st_engine_create(s->model, &eo, &s->engine))) return rc;
  st_cli_learn_say(&s->learned);
  const double kv_mib = st_engine_kv_bytes(s->engine) / 1048576.0;
  fprintf(stderr,
          "strata: loaded %s: %s, %u layers, %u experts (top-%u), hidden %u, vocab %u; "
          "context %d tokens (KV cache %s, %.*f MiB), prompt chunk %d tokens; %.2f s\n",
          o->model, st_arch_of(hp->arch)->name, hp->n_layer, hp->n_expert, hp->n_expert_used, hp->n_embd, hp->n_vocab, s->engine->n_ctx,
          st_type_info((uint32_t)s->engine->kv_type)->name, st_mib_digits(kv_mib), kv_mib,
          s->engine->prefill, st_now() - t0);
  return 0;
}

/* One line of CUDA graph counters (cuda/graph.cu) when the engine uses graphs. */
static void report_graphs(const struct st_engine *e) {
#ifdef ST_HAVE_CUDA
  if (!e->cuda_graphs) return;
  struct st_cuda_graph_stats g;
  st_cuda_graph_stats(&g);
  fprintf(stderr, "cuda graphs: %llu captures, %llu updates, %llu instantiations, %llu re-instantiations, %llu launches, "
                  "%llu fallbacks; dense codelets' host time %.1f us per one-token call (%llu calls)\n",
          (unsigned long long)g.captures, (unsigned long long)g.updates, (unsigned long long)g.instantiations,
          (unsigned long long)g.reinstantiations, (unsigned long long)g.launches, (unsigned long long)g.fallbacks,
          g.dense_calls ? 1e6 * g.dense_host_s / (double)g.dense_calls : 0.0, (unsigned long long)g.dense_calls);
#else
  (void)e;
#endif
}

/* n_steps: the decode steps of the n_gen tokens (the first comes from the prompt's logits, and the
 * last is not run), whose time t_gen is: tok/s is steps a second, as llama.cpp's eval rate. */
static void report(const struct session *s, size_t n_prompt, double t_prompt, size_t n_gen, size_t n_steps, double t_gen) {
  const struct st_engine_stats *st = &s->engine->stats;
  struct starpu_sched_policy *pol = starpu_sched_ctx_get_sched_policy(0);
  fprintf(stderr, "\nprompt: %zu tokens in %.3f s (%.2f tok/s)\n", n_prompt, t_prompt,
          t_prompt > 0 ? n_prompt / t_prompt : 0.0);
  fprintf(stderr, "decode: %zu tokens, %zu decode steps in %.3f s (%.2f tok/s)\n", n_gen, n_steps, t_gen,
          t_gen > 0 ? n_steps / t_gen : 0.0);
  fprintf(stderr, "StarPU workers: %d CPU, %d CUDA; scheduler %s\n", st_engine_n_cpu_workers(s->engine),
          st_engine_n_cuda_workers(s->engine), pol && pol->policy_name ? pol->policy_name : "?");
  char tiers[1024];
  st_engine_tier_report(s->engine, NULL, NULL, tiers, sizeof tiers);
  fprintf(stderr, "%s\n", tiers);
  const uint64_t gpu = st_stats_gpu_entries(st), all = st_stats_routed_entries(st);
  if (st_engine_n_cuda_workers(s->engine) > 0)
    fprintf(stderr, "routed entries served by the GPU caches: %.1f%% (%llu of %llu); host->device %.1f MiB; adaptive swaps %llu\n",
            all ? 100.0 * gpu / all : 0.0, (unsigned long long)gpu, (unsigned long long)all,
            st->h2d_bytes / 1048576.0, (unsigned long long)st->swaps);
  fprintf(stderr, "tasks submitted: %llu; executed per worker:", (unsigned long long)st->tasks);
  for (unsigned w = 0; w < starpu_worker_get_count(); w++) {
    struct starpu_profiling_worker_info info;
    char name[64];
    starpu_worker_get_name((int)w, name, sizeof name);
    if (starpu_profiling_worker_get_info((int)w, &info) == 0)
      fprintf(stderr, "%s %s %d", w ? "," : "", name, info.executed_tasks);
  }
  fputc('\n', stderr);
  report_graphs(s->engine);
  st_memory_log("at exit", s->model, &s->engine->arena, s->engine->placement.tier); /* STRATA_MEMORY_LOG=1 */
  fprintf(stderr, "peak resident memory %.2f GiB (%.1f MiB); anonymous %.1f MiB at the end\n", st_peak_rss_gib(),
          st_peak_rss_gib() * 1024.0, st_anon_rss_mib());
}

/* Set by the first SIGINT during generation: the loop stops after the token in progress and the
 * run ends as a finished one would (its text, timings, learned profile), exiting 130 as a shell's
 * interrupted command does. The handler is reset on delivery, so a second Ctrl-C kills at once. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
  (void)sig;
  interrupted = 1;
}

int st_cmd_generate(int argc, char **argv) {
  struct run_opts o;
  int rc = parse_run_opts(argc, argv, &o);
  if (rc == 1) return 0; /* --help */
  struct session s = {0};
  if (!rc) rc = session_open(&o, &s);
  if (rc) {
    fprintf(stderr, "strata generate: %s\n", st_last_error());
    session_free(&s);
    return 1;
  }
  const struct st_hparams *hp = &s.model->hp;
  float *logits = malloc(sizeof(float) * hp->n_vocab);
  int32_t *gen = malloc(sizeof(int32_t) * ((size_t)o.n_predict + 1));
  struct st_sampler smp;
  if (o.seed < 0) { /* llama.cpp's -1: a seed of its own, printed so that the run can be repeated */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    o.seed = (long)(((uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec * 2654435761u ^ (uint64_t)getpid() << 16) & 0x7fffffff);
    fprintf(stderr, "strata: --seed -1: sampling seed %ld\n", o.seed);
  }
  st_sampler_init(&smp, (float)o.temp, (int)o.top_k, (float)o.top_p, (uint64_t)o.seed);
  struct st_detok dt;
  st_detok_init(&dt, s.model->tok);
  const size_t text_cap = 3 * (st_tokenizer_max_token_bytes(s.model->tok) + 4) + 1;
  char *text = malloc(text_cap);

  /* after the engine's start: StarPU installs SIGINT handlers of its own at starpu_init */
  struct sigaction sa = {0};
  sa.sa_handler = on_sigint;
  sa.sa_flags = (int)SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  double t0 = st_now();
  rc = !logits || !gen || !text ? st_set_error(ST_ENOMEM, "out of memory") : 0;
  if (!rc) rc = st_engine_eval(s.engine, s.ids, (int)s.n_ids, logits, 0);
  const double t_prompt = st_now() - t0;
  size_t n_gen = 0, n_steps = 0;
  t0 = st_now();
  /* greedy: each step's next id from st_engine_eval_next (a GPU step's head finds it) */
  const int greedy = smp.temp <= 0.0f;
  int32_t next = -1;
  while (!rc && !interrupted && (long)n_gen < o.n_predict) {
    int32_t id = next >= 0 ? next : st_sampler_sample(&smp, logits, (int32_t)hp->n_vocab);
    if (id < 0) {
      rc = st_set_error(ST_ENOMEM, "out of memory sampling");
      break;
    }
    gen[n_gen++] = id;
    if (!o.print_ids && !st_tokenizer_is_special(s.model->tok, id)) {
      st_detok_push(&dt, id, text, text_cap);
      fputs(text, stdout);
      fflush(stdout);
    } else if (!o.print_ids && st_tokenizer_is_shown(s.model->tok, id)) { /* <think>, harmony's markers */
      const int b = st_tokenizer_token_bytes(s.model->tok, id, text, text_cap - 1);
      if (b > 0) fwrite(text, 1, (size_t)b, stdout), fflush(stdout);
    }
    if (!o.ignore_eos && st_tokenizer_is_eog(s.model->tok, id)) break;
    if ((long)n_gen == o.n_predict || interrupted) break;
    if (s.engine->n_past >= s.engine->n_ctx) {
      fprintf(stderr, "\nstrata generate: the context of %d tokens is full; stopping\n", s.engine->n_ctx);
      break;
    }
    rc = greedy ? st_engine_eval_next(s.engine, id, &next) : st_engine_eval(s.engine, &id, 1, logits, 0);
    n_steps++;
  }
  const double t_gen = st_now() - t0;
  if (!rc) {
    if (o.print_ids) {
      st_print_ids(stdout, gen, n_gen);
    } else {
      st_detok_flush(&dt, text, text_cap);
      fputs(text, stdout);
      fputc('\n', stdout);
    }
    fflush(stdout);
    if (interrupted) fprintf(stderr, "strata generate: interrupted (SIGINT) after %zu generated tokens\n", n_gen);
    st_cli_learn_save(&s.learned, s.engine);
    report(&s, s.n_ids, t_prompt, n_gen, n_steps, t_gen);
  } else {
    fprintf(stderr, "strata generate: %s\n", st_last_error());
  }
  free(logits);
  free(gen);
  free(text);
  session_free(&s);
  return rc ? 1 : interrupted ? 130 : 0;
}

int st_cmd_eval(int argc, char **argv) {
  struct run_opts o;
  int rc = parse_run_opts(argc, argv, &o);
  if (rc == 1) return 0;
  if (!rc && o.all_logits && !o.logits_out) rc = st_set_error(ST_EINVAL, "--all-logits writes to --logits-out FILE, and none was given");
  if (!rc && o.logits_out) rc = st_check_output("--logits-out", o.logits_out); /* before the run, not after */
  struct session s = {0};
  if (!rc) rc = session_open(&o, &s);
  float *logits = NULL;
  size_t n_rows = o.all_logits ? s.n_ids : 1;
  if (!rc) {
    const size_t V = s.model->hp.n_vocab;
    logits = malloc(sizeof(float) * V * n_rows);
    if (!logits) rc = st_set_error(ST_ENOMEM, "out of memory for logits");
    double t0 = st_now();
    if (!rc) rc = st_engine_eval(s.engine, s.ids, (int)s.n_ids, logits, o.all_logits);
    if (!rc) {
      const float *last = logits + (n_rows - 1) * V;
      int32_t best = st_argmax(last, (int32_t)V);
      fprintf(stderr, "strata eval: %zu tokens in %.3f s; last position argmax %d (logit %.4f)\n", s.n_ids,
              st_now() - t0, best, last[best]);
      report_graphs(s.engine);
      st_cli_learn_save(&s.learned, s.engine);
      if (o.logits_out) {
        FILE *f = fopen(o.logits_out, "wb");
        if (!f) rc = st_set_error(ST_EIO, "--logits-out %s: cannot create: %s", o.logits_out, strerror(errno));
        else if (fwrite(logits, sizeof(float) * V, n_rows, f) != n_rows) {
          rc = st_set_error(ST_EIO, "--logits-out %s: write failed: %s", o.logits_out, strerror(errno));
          fclose(f);
        } else if (fclose(f)) {
          rc = st_set_error(ST_EIO, "--logits-out %s: write failed: %s", o.logits_out, strerror(errno));
        }
      }
    }
  }
  if (rc) fprintf(stderr, "strata eval: %s\n", st_last_error());
  free(logits);
  session_free(&s);
  return rc ? 1 : 0;
}
