/* `strata tokenize`: the ids of a text as a JSON array. Needs only a GGUF's tokenizer keys, so
 * vocabulary-only files (no tensors) work. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common.h"
#include "io/gguf.h"
#include "io/tokenizer.h"

int st_cmd_tokenize(int argc, char **argv) {
  static const struct option longopts[] = {{"model", required_argument, 0, 'm'},
                                           {"prompt", required_argument, 0, 'p'},
                                           {"no-special", no_argument, 0, 's'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  const char *model = NULL, *prompt = NULL;
  int special = 1, c, rc = 0;
  opterr = 0;
  optind = 1;
  while (!rc && (c = getopt_long(argc, argv, ":m:p:h", longopts, NULL)) != -1) {
    switch (c) {
    case 'm': model = optarg; break;
    case 'p': prompt = optarg; break;
    case 's': special = 0; break;
    case 'h':
      printf("usage: strata tokenize -m FILE -p TEXT [--no-special]\n\n"
             "  -m, --model FILE   GGUF with a gpt2/qwen2 tokenizer (a vocabulary-only file is fine)\n"
             "  -p, --prompt TEXT  text to tokenize; special tokens such as <|im_start|> are parsed\n"
             "      --no-special   treat special-token text as plain text\n"
             "  -h, --help         this help\n"
             "Prints the ids as a JSON array on stdout. No BOS is added.\n");
      return 0;
    case ':': rc = st_set_error(ST_EINVAL, "option '%s' needs a value", argv[optind - 1]); break;
    default: rc = st_set_error(ST_EINVAL, "unknown option '%s' (see strata tokenize --help)", st_cli_bad_option(argv));
    }
  }
  if (!rc && optind < argc) rc = st_set_error(ST_EINVAL, "unexpected argument '%s'", argv[optind]);
  if (!rc && (!model || !prompt)) rc = st_set_error(ST_EINVAL, "need -m FILE and -p TEXT");
  struct st_gguf *g = NULL;
  struct st_tokenizer *tok = NULL;
  int32_t *ids = NULL;
  size_t n = 0;
  if (!rc) rc = st_gguf_open(model, &g);
  if (!rc) {
    rc = st_tokenizer_load(g, &tok);
    if (rc) st_error_context(rc, model);
  }
  if (!rc) rc = st_tokenizer_encode(tok, prompt, strlen(prompt), special, &ids, &n);
  if (!rc) st_print_ids(stdout, ids, n);
  else fprintf(stderr, "strata tokenize: %s\n", st_last_error());
  free(ids);
  st_tokenizer_free(tok);
  st_gguf_close(g);
  return rc ? 1 : 0;
}
