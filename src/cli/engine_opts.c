/* The engine flags every model-running command shares (generate, eval, profile, bench, serve):
 * context, prompt chunk, expert profile, the primary cache, CUDA graphs. One table, one parser,
 * one help text. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "codelets/quant.h"
#include "common.h"
#include "tiers/plan.h"

enum {
  OPT_PREFILL = ST_ENGINE_OPT_BASE, OPT_PROFILE, OPT_CACHE, OPT_RESERVE, OPT_ADAPT, OPT_ADAPT_INTERVAL, OPT_TRACE,
  OPT_STREAM, OPT_HELPER1, OPT_HELPER2, OPT_HELPER3, OPT_PLACEMENT, OPT_REMOTE_PLACEMENT, OPT_REMOTE_OPT, OPT_PEER,
  OPT_PEER_RESERVE, OPT_PEER_SLOTS, OPT_PEER_ADAPT, OPT_PEER_PREFILL, OPT_LAYER_SPLIT, OPT_GRAPHS, OPT_RESIDENT,
  OPT_GPU_MEM, OPT_NO_LEARN, OPT_CACHE_TYPE_K, OPT_CACHE_TYPE_V
};

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
    {"expert-cache-device1", required_argument, 0, OPT_HELPER1},
    {"expert-cache-device2", required_argument, 0, OPT_HELPER2},
    {"expert-cache-device3", required_argument, 0, OPT_HELPER3},
    {"gpu-placement", required_argument, 0, OPT_PLACEMENT},
    {"expert-cache-remote-placement", required_argument, 0, OPT_REMOTE_PLACEMENT},
    {"remote-expert-opt", no_argument, 0, OPT_REMOTE_OPT},
    {"peer-device", required_argument, 0, OPT_PEER},
    {"peer-reserve-mib", required_argument, 0, OPT_PEER_RESERVE},
    {"peer-slots", required_argument, 0, OPT_PEER_SLOTS},
    {"peer-adapt-swaps", required_argument, 0, OPT_PEER_ADAPT},
    {"peer-prefill-rows", required_argument, 0, OPT_PEER_PREFILL},
    {"layer-split", required_argument, 0, OPT_LAYER_SPLIT},
    {"cuda-graphs", required_argument, 0, OPT_GRAPHS},
    {"resident-experts", no_argument, 0, OPT_RESIDENT},
    {"gpu-mem", required_argument, 0, OPT_GPU_MEM},
    {"no-learn", no_argument, 0, OPT_NO_LEARN},
    {"cache-type-k", required_argument, 0, OPT_CACHE_TYPE_K},
    {"cache-type-v", required_argument, 0, OPT_CACHE_TYPE_V},
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

/* llama.cpp's flags with no strata counterpart of the same name, and where strata's is. */
static const struct {
  const char *flag[2];
  const char *instead;
} llama_flags[] = {
    {{"-ngl", "--n-gpu-layers"},
     "the dense work goes to the primary GPU whole; --expert-cache N|auto and --gpu-mem GIB choose the experts' tiers"},
    {{"-ncmoe", "--n-cpu-moe"}, "the experts' tiers come from --expert-cache N|auto, --gpu-mem GIB and the expert profile"},
    {{"-cmoe", "--cpu-moe"}, "the experts' tiers come from --expert-cache N|auto (0: every expert on the CPU pool)"},
    {{"-ot", "--override-tensor"}, "the experts' tiers come from --expert-cache N|auto, --gpu-mem GIB and the expert profile"},
    {{"-fa", "--flash-attn"}, "strata's attention is always the fused (flash) kind: leave it out"},
    {{"-ub", "--ubatch-size"}, "--prefill N sets the prompt chunk, tokens"},
    {{"-b", "--batch-size"}, "--prefill N sets the prompt chunk, tokens"},
    {{"-t", "--threads"}, "StarPU's CPU workers are STARPU_NCPU=N (doc/tuning.md)"},
};

const char *st_cli_bad_option(char **argv) {
  static char buf[8];
  if (optopt <= 0 || optopt >= 128) return argv[optind - 1];
  snprintf(buf, sizeof buf, "-%c", optopt);
  return buf;
}

int st_engine_argv_aliases(int argc, char **argv, const char *cmd) {
  static char ctk[] = "--cache-type-k", ctv[] = "--cache-type-v";
  for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) {
    if (!strcmp(argv[i], "-ctk")) argv[i] = ctk;
    else if (!strcmp(argv[i], "-ctv")) argv[i] = ctv;
    else if (i > 1 && (!strcmp(argv[i - 1], "-p") || !strcmp(argv[i - 1], "--prompt"))) continue; /* a prompt's text */
    else
      for (size_t f = 0; f < sizeof llama_flags / sizeof llama_flags[0]; f++) {
        const size_t n = strlen(llama_flags[f].flag[1]);
        const int is_long = !strncmp(argv[i], llama_flags[f].flag[1], n) && (argv[i][n] == 0 || argv[i][n] == '=');
        if (!strcmp(argv[i], llama_flags[f].flag[0]) || is_long) {
          if (!strcmp(llama_flags[f].flag[1], "--threads") && !strcmp(cmd, "bench")) break; /* bench --kernels' own */
          return st_set_error(ST_EINVAL, "%s is llama.cpp's flag, not strata's: %s (see strata %s --help)", argv[i],
                              llama_flags[f].instead, cmd);
        }
      }
  }
  return 0;
}

/* N or auto (ST_CACHE_AUTO) expert slots. */
static int parse_slots(const char *flag, const char *arg, int *out) {
  long v;
  if (!strcmp(arg, "auto")) {
    *out = ST_CACHE_AUTO;
    return 1;
  }
  int rc = st_parse_int(flag, arg, 0, 1 << 30, &v);
  if (rc) return rc;
  *out = (int)v;
  return 1;
}

/* f32 or f16 (llama.cpp's names for the KV cache types strata computes) into *type. */
static int parse_cache_type(const char *flag, const char *arg, int *type) {
  if (!strcmp(arg, "f32")) *type = ST_TYPE_F32;
  else if (!strcmp(arg, "f16")) *type = ST_TYPE_F16;
  else if (!strcmp(arg, "q8_0")) *type = ST_TYPE_Q8_0;
  else {
    static const char *quantised[] = {"q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "bf16"}; /* llama.cpp's other KV types */
    int q = 0;
    for (size_t i = 0; i < sizeof quantised / sizeof quantised[0]; i++) q |= !strcmp(arg, quantised[i]);
    return st_set_error(ST_EINVAL, "%s expects f32, f16 or q8_0, got '%s'%s", flag, arg,
                        q ? " (strata's KV cache takes no other of llama.cpp's types)" : "");
  }
  return 1;
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
  case OPT_CACHE: return parse_slots("--expert-cache", arg, &eo->expert_cache);
  case OPT_HELPER1:
  case OPT_HELPER2:
  case OPT_HELPER3: {
    char flag[32];
    snprintf(flag, sizeof flag, "--expert-cache-device%d", c - OPT_HELPER1 + 1);
    return parse_slots(flag, arg, &eo->helper_cache[c - OPT_HELPER1]);
  }
  case OPT_PLACEMENT:
  case OPT_REMOTE_PLACEMENT:
    if (strcmp(arg, "stripe") && strcmp(arg, "layer"))
      return st_set_error(ST_EINVAL, "%s expects stripe or layer, got '%s'",
                          c == OPT_PLACEMENT ? "--gpu-placement" : "--expert-cache-remote-placement", arg);
    eo->gpu_placement = !strcmp(arg, "layer") ? ST_PLACE_LAYER : ST_PLACE_STRIPE;
    return 1;
  case OPT_REMOTE_OPT: eo->remote_expert_opt = 1; return 1;
  case OPT_PEER:
    if ((rc = st_parse_int("--peer-device", arg, 1, 63, &v))) return rc;
    eo->peer_device = (int)v;
    return 1;
  case OPT_PEER_RESERVE:
    if ((rc = st_parse_float("--peer-reserve-mib", arg, 0.0, 1e7, &f))) return rc;
    eo->peer_reserve_mib = f;
    return 1;
  case OPT_PEER_SLOTS:
    if ((rc = st_parse_int("--peer-slots", arg, 0, 1 << 30, &v))) return rc;
    eo->peer_slots = (int)v;
    return 1;
  case OPT_PEER_ADAPT:
    if ((rc = st_parse_int("--peer-adapt-swaps", arg, -1, 1 << 20, &v))) return rc;
    eo->peer_adapt_swaps = (int)v;
    return 1;
  case OPT_PEER_PREFILL:
    if ((rc = st_parse_int("--peer-prefill-rows", arg, -1, 1 << 24, &v))) return rc;
    eo->peer_prefill_rows = (int)v;
    return 1;
  case OPT_LAYER_SPLIT:
    if (strcmp(arg, "auto")) return st_set_error(ST_EINVAL, "--layer-split expects auto, got '%s'", arg);
    eo->layer_split = 1;
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
  case OPT_RESIDENT: eo->resident_experts = 1; return 1;
  case OPT_GPU_MEM:
    if ((rc = st_parse_float("--gpu-mem", arg, 1.0, 1e5, &f))) return rc;
    eo->gpu_mem_gib = f;
    return 1;
  case OPT_NO_LEARN: eo->no_learn = 1; return 1;
  case OPT_CACHE_TYPE_K: return parse_cache_type("--cache-type-k", arg, &eo->kv_type);
  case OPT_CACHE_TYPE_V: return parse_cache_type("--cache-type-v", arg, &eo->kv_type_v);
  case OPT_STREAM:
    eo->prompt_stream_rows = !strcmp(arg, "off") ? -1 : 0;
    if (eo->prompt_stream_rows == 0 && strcmp(arg, "auto")) {
      char *end;
      v = strtol(arg, &end, 10);
      if (end == arg || *end || v < 1 || v > 1000000)
        return st_set_error(ST_EINVAL, "--prompt-stream expects auto, off or a row count from 1 to 1000000, got '%s'", arg);
      eo->prompt_stream_rows = (int)v;
    }
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
  const int helpers = eo->helper_cache[0] || eo->helper_cache[1] || eo->helper_cache[2];
  /* the peer tier's refusals, word for word as the seeds give them */
  if (eo->peer_device > 0 && eo->layer_split)
    return st_set_error(ST_EINVAL, "--peer-device cannot be combined with --layer-split (use one or the other)");
  if (eo->peer_device > 0 && helpers)
    return st_set_error(ST_EINVAL, "--peer-device cannot be combined with --expert-cache-device1..3 (the peer tier already caches experts there)");
  if (eo->peer_device > 0 && !eo->expert_profile)
    return st_set_error(ST_EINVAL, "--peer-device needs --expert-profile FILE (`strata profile` writes one)");
  if (eo->peer_device > 0 && (!eo->expert_cache || eo->expert_cache == ST_CACHE_DEFAULT))
    return st_set_error(ST_EINVAL, "--peer-device needs an enabled expert cache (--expert-cache N|auto)");
  if (eo->peer_device <= 0 && (eo->peer_slots || eo->peer_reserve_mib != 600 || eo->peer_adapt_swaps != -1 ||
                               eo->peer_prefill_rows != -1))
    return st_set_error(ST_EINVAL, "--peer-reserve-mib, --peer-slots, --peer-adapt-swaps and --peer-prefill-rows need --peer-device N");
  for (int h = 1; h < 3; h++)
    if (eo->helper_cache[h] && !eo->helper_cache[h - 1])
      return st_set_error(ST_EINVAL, "--expert-cache-device%d needs --expert-cache-device%d: tiers must be enabled in order",
                          h + 1, h);
  if (helpers && !eo->expert_profile)
    return st_set_error(ST_EINVAL, "--expert-cache-device1..3 need --expert-profile FILE (`strata profile` writes one)");
  if (helpers && eo->layer_split)
    return st_set_error(ST_EINVAL, "--layer-split cannot be combined with --expert-cache-device1..3 (a layer split gives "
                        "every visible GPU a stage and an expert cache of its own)");
  if (eo->remote_expert_opt && !helpers)
    return st_set_error(ST_EINVAL, "--remote-expert-opt needs a helper cache (--expert-cache-device1 N|auto)");
  if (eo->gpu_placement == ST_PLACE_LAYER && !helpers)
    return st_set_error(ST_EINVAL, "--gpu-placement layer needs a helper cache (--expert-cache-device1 N|auto)");
  if (eo->adapt_swaps && !eo->expert_cache) return st_set_error(ST_EINVAL, "--adapt-swaps needs an enabled --expert-cache");
  if (eo->kv_type != eo->kv_type_v)
    return st_set_error(ST_EINVAL, "--cache-type-k %s with --cache-type-v %s: strata's K and V caches have one type; "
                        "give both the same", st_type_info((uint32_t)eo->kv_type)->name,
                        st_type_info((uint32_t)eo->kv_type_v)->name);
  if (eo->cuda_graphs == ST_CUDA_GRAPHS_BOTH)
    return st_set_error(ST_EINVAL, "--cuda-graphs both is for strata bench; here give on or off");
  return 0;
}

void st_engine_opts_help(FILE *f) {
  fprintf(f,
          "  -c, --ctx-size N       KV-cache length in tokens (default: min(model context, 4096))\n"
          "  -ctk, --cache-type-k T KV cache element type T, f32, f16 or q8_0 (default f16, as llama.cpp; f32:\n"
          "  -ctv, --cache-type-v T the exact float32 path); K and V must be given the same type. f16 halves the\n"
          "                         cache's memory, and on sm_80+ GPUs the prompt's attention and the decode\n"
          "                         attention past about 16,000 tokens run on the tensor cores (queries and\n"
          "                         softmax weights in half there); q8_0 (int8 values with an fp16 scale a 32,\n"
          "                         as ggml's Q8_0: 1.0625 bytes a value) needs rows of a multiple of 32 values (on a GPU:\n"
          "                         no MLA); rows are computed in float32 and rounded on the way in\n"
          "      --prefill N        prompt chunk in tokens (default 4096 with a GPU, 512 on CPU workers alone)\n"
          "      --expert-profile F expert profile (strata profile) ranking the pairs the caches take (default:\n"
          "                         the profile learned on this model file by earlier runs, else a prior that gives\n"
          "                         every layer the same share; doc/expert-profile.md)\n"
          "      --no-learn         neither read nor write the learned expert profile ($XDG_CACHE_HOME/strata/ or\n"
          "                         ~/.cache/strata/; default: learn)\n"
          "      --expert-cache N|auto  primary-cache slots (expert pairs) on CUDA0; auto = what fits after\n"
          "                         the dense weights, KV cache, prompt buffers and --cache-reserve; 0 = off\n"
          "                         (default: auto when StarPU finds a GPU and no other tier flag is given)\n"
          "      --cache-reserve MIB  CUDA0 memory --expert-cache auto leaves free, MiB (default 1024)\n"
          "      --gpu-mem GIB      cap on what strata takes on each GPU, GiB: the CUDA context, StarPU's\n"
          "                         allocations (caches, weights, KV, buffers: STARPU_LIMIT_CUDA_MEM) and\n"
          "                         --cache-reserve (half kernel scratch, half free within StarPU's share);\n"
          "                         --expert-cache auto sizes within it\n"
          "                         (default: the whole card)\n"
          "      --adapt-swaps N    adaptive cache: swap up to N cold cached pairs for hot CPU-pool pairs per\n"
          "                         round (default 0 = static cache)\n"
          "      --adapt-interval N tokens between adaptive rounds (default 32)\n"
          "      --trace DIR        record the run into DIR: events.tsv and StarPU's FxT trace (see strata trace)\n"
          "      --prompt-stream auto|off|N  prompt path: an expert outside the GPU caches with N rows or more in a\n"
          "                         chunk runs on CUDA0, its weights copied there once for the chunk (from the\n"
          "                         pinned host arena, or the mapped file with STRATA_HOST_ARENA=0);\n"
          "                         auto = 32 rows; off = the CPU pool computes every uncached expert (default auto)\n"
          "      --cuda-graphs on|off  decode steps: capture each dense task's kernels on CUDA0 (attention,\n"
          "                         attn_output, router, combine, head) as a CUDA graph and replay it; same\n"
          "                         logits either way; no effect without a GPU (default off; bench: also both)\n"
          "      --resident-experts low-RAM mode: the expert pairs the GPU caches hold stay out of the host expert\n"
          "                         arena (the CPU pool's RAM copy); refills read them from the file (default off:\n"
          "                         every pair is copied to RAM)\n"

          "  second-GPU tiers (doc/tiers.md):\n"
          "      --expert-cache-device1..3 N|auto  helper caches: N expert pairs on the 1st..3rd visible GPU after\n"
          "                         the primary (auto = what fits, keeping 512 MiB free); enable in order (default off)\n"
          "      --gpu-placement stripe|layer  helpers: ranked pairs round robin over the cards, or each layer\n"
          "                         on one card (layer mod cards) (default stripe; alias --expert-cache-remote-placement)\n"
          "      --remote-expert-opt  helpers sum their experts' rows per token on their GPU and adapt within\n"
          "                         a layer (not bitwise identical: the summation order changes) (default off)\n"
          "      --peer-device N    peer tier: a second adaptive cache on CUDA device N >= 1, data over P2P (default off)\n"
          "      --peer-reserve-mib M  MiB left free on the peer card (default 600)\n"
          "      --peer-slots N     cap on the peer's expert pairs (default 0 = as many as fit)\n"
          "      --peer-adapt-swaps N  swaps per adaptive round on the peer (default -1 = --adapt-swaps)\n"
          "      --peer-prefill-rows N  rows of each prompt chunk the peer computes (default -1 = half of chunk x\n"
          "                         top-k; 0 = prompt rows stay on the primary)\n"
          "      --layer-split auto consecutive layers on consecutive GPUs, each with --expert-cache of its own\n"
          "                         (default off)\n");
}
