/* `strata profile`: runs a model over a text and writes every expert pair ranked by how often
 * the router chose it (io/profile.h, doc/expert-profile.md), for the expert caches to fill from. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common.h"
#include "graph/engine.h"
#include "io/model.h"
#include "io/profile.h"
#include "io/tokenizer.h"


int st_cmd_profile(int argc, char **argv) {
  static const struct option longopts[] = {{"model", required_argument, 0, 'm'}, {"file", required_argument, 0, 'f'},
                                           {"n-tokens", required_argument, 0, 'n'}, {"output", required_argument, 0, 'o'},
                                           {"ctx-size", required_argument, 0, 'c'}, {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  const char *model = NULL, *text_path = NULL, *out = NULL;
  long max_tokens = 1 << 20, n_ctx = 0;
  int c, rc = 0;
  opterr = 0;
  optind = 1;
  rc = st_engine_argv_aliases(argc, argv, "profile"); /* -ctk is llama.cpp's --cache-type-k (refused below), not -c tk */
  while (!rc && (c = getopt_long(argc, argv, ":m:f:n:o:c:h", longopts, NULL)) != -1) {
    switch (c) {
    case 'm': model = optarg; break;
    case 'f': text_path = optarg; break;
    case 'o': out = optarg; break;
    case 'n': rc = st_parse_int("-n", optarg, 1, 1L << 30, &max_tokens); break;
    case 'c': rc = st_parse_int("-c", optarg, 16, 1 << 24, &n_ctx); break;
    case 'h':
      printf("usage: strata profile -m FILE -f TEXT_FILE [-n TOKENS] [-c N] -o FILE.profile\n\n"
             "Runs the model over the text (prompt path, in windows of the context) and writes every expert\n"
             "pair ranked by routed count (format: doc/expert-profile.md).\n\n"
             "  -m, --model FILE      MoE GGUF (qwen3moe, deepseek2, gpt-oss, glm4moe)\n"
             "  -f, --file FILE       calibration text (UTF-8)\n"
             "  -n, --n-tokens N      use at most N tokens of it (default: all)\n"
             "  -c, --ctx-size N      window in tokens (default: min(model context, 4096))\n"
             "  -o, --output FILE     profile to write\n"
             "  -h, --help            this help\n"
             "Progress: one line redrawn on a terminal, else a line every 10 s.\n");
      return 0;
    case ':': rc = st_set_error(ST_EINVAL, "option '%s' needs a value", argv[optind - 1]); break;
    default: {
      const char *bad = st_cli_bad_option(argv);
      if (!strncmp(bad, "--cache-type-", 13)) /* -ctk / -ctv, aliased above */
        rc = st_set_error(ST_EINVAL, "%s (-ct%c) does not apply to strata profile: it keeps no KV cache beyond its window",
                          bad, bad[13]);
      else rc = st_set_error(ST_EINVAL, "unknown option '%s' (see strata profile --help)", bad);
    }
    }
  }
  if (!rc && optind < argc) rc = st_set_error(ST_EINVAL, "unexpected argument '%s'", argv[optind]);
  if (!rc && (!model || !text_path || !out)) rc = st_set_error(ST_EINVAL, "need -m FILE, -f TEXT_FILE and -o FILE");
  struct st_model *m = NULL;
  struct st_engine *e = NULL;
  char *text = NULL;
  int32_t *ids = NULL;
  size_t len = 0, n = 0;
  if (!rc) rc = st_check_output("-o", out); /* before the run, not after */
  if (!rc && !(text = st_read_file(text_path, &len))) rc = ST_EIO; /* st_read_file named the file and the reason */
  if (!rc) rc = st_model_load(model, &m);
  if (!rc) rc = st_tokenizer_encode(m->tok, text, len, ST_TOK_PROMPT, &ids, &n);
  if (!rc && n == 0) rc = st_set_error(ST_EINVAL, "%s holds no tokens", text_path);
  if (!rc) rc = st_engine_create(m, &(struct st_engine_opts){.n_ctx = (int)n_ctx}, &e);
  float *logits = rc ? NULL : malloc(sizeof(float) * m->hp.n_vocab);
  if ((size_t)max_tokens < n) n = (size_t)max_tokens;
  double t0 = st_now(), said = t0;
  const int tty = isatty(2); /* a terminal gets one line redrawn; a log a line every 10 s and the last */
  for (size_t done = 0; !rc && done < n;) {
    const size_t w = n - done < (size_t)e->n_ctx ? n - done : (size_t)e->n_ctx;
    st_engine_reset(e);
    rc = st_engine_eval(e, ids + done, (int)w, logits, 0);
    done += w;
    const double now = st_now();
    if (tty || now - said >= 10.0 || done == n) {
      fprintf(stderr, "%sstrata profile: %zu / %zu tokens (%.0f tok/s)%s", tty ? "\r" : "", done, n, done / (now - t0),
              tty ? "" : "\n");
      said = now;
    }
  }
  if (!rc) {
    if (tty) fputc('\n', stderr);
    rc = st_profile_write(out, m->hp.n_layer, m->hp.n_expert, m->hp.n_expert_used, n, e->route_counts);
  }
  if (!rc) /* a leading dense layer's "pairs" are listed with count 0: they have no experts */
    fprintf(stderr, "strata profile: wrote %s: %u pairs ranked over %zu tokens\n", out,
            (m->hp.n_layer - m->hp.n_layer_dense) * m->hp.n_expert, n);
  else fprintf(stderr, "strata profile: %s\n", st_last_error());
  free(logits);
  free(ids);
  free(text);
  st_engine_destroy(e);
  st_model_free(m);
  return rc ? 1 : 0;
}
