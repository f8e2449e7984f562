/* The engine flags every model-running command shares (generate, eval, profile, bench, serve):
 * context, prompt chunk, expert profile, the primary cache, CUDA graphs. One table, one parser,
 * one help text. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common.h"

enum { OPT_PREFILL = ST_ENGINE_OPT_BASE, OPT_PROFILE, OPT_CACHE, OPT_RESERVE, OPT_ADAPT, OPT_ADAPT_INTERVAL, OPT_TRACE, OPT_STREAM, OPT_GRAPHS };

static const struct option engine_longopts[] = {
    {"ctx-size", required_argument, 0, 'c'},
    {"prefill", required_argument, 0, OPT_PREFILL},
    {"expert-profile", required_argument, 0, OPT_PROFILE},
    {"expert-cache", required_argument, 0, OPT_CACHE},
    {"cache-reserve", required_argument, 0, OPT_RESERVE},
    {"adapt-swaps", required_argument, 0, OPT_ADAPT},
    {"adapt-interval", required_argument, 0, OPT_ADAPT_INTERVAL},
    {"trace", required_argument, 0, OPT_TRACE},
    {"prompt-stream", required_argument, 0, OPT_STREAM},
    {"cuda-graphs", required_argument, 0, OPT_GRAPHS},
    {0, 0, 0, 0}};

struct option *st_engine_longopts_with(const struct option *own) {
  size_t a = 0, b = sizeof engine_longopts / sizeof engine_longopts[0];
  while (own[a].name) a++;
  struct option *all = malloc(sizeof *all * (a + b));
  if (!all) return NULL;
  memcpy(all, own, sizeof *all * a);
  memcpy(all + a, engine_longopts, sizeof *all * b);
  return all;
}

int st_engine_opt(int c, const char *arg, struct st_engine_opts *eo) {
  long v;
  double f;
  int rc;
  switch (c) {
  case 'c':
    if ((rc = st_parse_int("-c", arg, 1, 1 << 24, &v))) return rc;
    eo->n_ctx = (int)v;
    return 1;
  case OPT_PREFILL:
    if ((rc = st_parse_int("--prefill", arg, 1, 1 << 16, &v))) return rc;
    eo->prefill = (int)v;
    return 1;
  case OPT_PROFILE: eo->expert_profile = arg; return 1;
  case OPT_CACHE:
    if (!strcmp(arg, "auto")) {
      eo->expert_cache = ST_CACHE_AUTO;
      return 1;
    }
    if ((rc = st_parse_int("--expert-cache", arg, 0, 1 << 30, &v))) return rc;
    eo->expert_cache = (int)v;
    return 1;
  case OPT_RESERVE:
    if ((rc = st_parse_float("--cache-reserve", arg, 0.0, 1e7, &f))) return rc;
    eo->reserve_mib = f;
    return 1;
  case OPT_ADAPT:
    if ((rc = st_parse_int("--adapt-swaps", arg, 0, 1 << 20, &v))) return rc;
    eo->adapt_swaps = (int)v;
    return 1;
  case OPT_ADAPT_INTERVAL:
    if ((rc = st_parse_int("--adapt-interval", arg, 1, 1 << 24, &v))) return rc;
    eo->adapt_interval = (int)v;
    return 1;
  case OPT_TRACE: eo->trace_dir = arg; return 1;
  case OPT_STREAM:
    if (strcmp(arg, "auto") && strcmp(arg, "off"))
      return st_set_error(ST_EINVAL, "--prompt-stream expects auto or off, got '%s'", arg);
    eo->prompt_stream_off = !strcmp(arg, "off");
    return 1;
  case OPT_GRAPHS:
    if (!strcmp(arg, "on")) eo->cuda_graphs = ST_CUDA_GRAPHS_ON;
    else if (!strcmp(arg, "off")) eo->cuda_graphs = ST_CUDA_GRAPHS_OFF;
    else if (!strcmp(arg, "both")) eo->cuda_graphs = ST_CUDA_GRAPHS_BOTH;
    else return st_set_error(ST_EINVAL, "--cuda-graphs expects on or off (both: strata bench), got '%s'", arg);
    return 1;
  default: return 0;
  }
}

int st_engine_opts_check(const struct st_engine_opts *eo) {
  if (eo->expert_cache && !eo->expert_profile)
    return st_set_error(ST_EINVAL, "--expert-cache needs --expert-profile FILE (`strata profile` writes one)");
  if (eo->adapt_swaps && !eo->expert_cache) return st_set_error(ST_EINVAL, "--adapt-swaps needs an enabled --expert-cache");
  if (eo->cuda_graphs == ST_CUDA_GRAPHS_BOTH)
    return st_set_error(ST_EINVAL, "--cuda-graphs both is for strata bench; here give on or off");
  return 0;
}

void st_engine_opts_help(FILE *f) {
  fprintf(f,
          "  -c, --ctx-size N       KV-cache length in tokens (default: min(model context, 4096))\n"
          "      --prefill N        prompt chunk in tokens (default 512)\n"
          "      --expert-profile F expert profile (strata profile) ranking the pairs the caches take\n"
          "      --expert-cache N|auto  primary-cache slots (expert pairs) on CUDA0; auto = what fits after\n"
          "                         the dense weights, KV cache, prompt buffers and --cache-reserve (default 0 = off)\n"
          "      --cache-reserve MIB  CUDA0 memory --expert-cache auto leaves free, MiB (default 1024)\n"
          "      --adapt-swaps N    adaptive cache: swap up to N cold cached pairs for hot CPU-pool pairs per\n"
          "                         round (default 0 = static cache)\n"
          "      --adapt-interval N tokens between adaptive rounds (default 32)\n"
          "      --trace DIR        record the run into DIR: events.tsv and StarPU's FxT trace (see strata trace)\n"
          "      --prompt-stream auto|off  prompt path: let a model-based scheduler (STARPU_SCHED=dmda, dmdas,\n"
          "                         heteroprio) run an uncached expert on CUDA0, streaming its weights (default auto)\n"
          "      --cuda-graphs on|off  decode steps: capture each dense task's kernels on CUDA0 (attention,\n"
          "                         attn_output, router, combine, head) as a CUDA graph and replay it; same\n"
          "                         logits either way; no effect without a GPU (default on; bench: also both)\n");
}
