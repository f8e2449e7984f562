/* The engine API in plain sight: load a GGUF, start StarPU through the engine, tokenize a
 * prompt, run it, print the five most likely next tokens, shut down.
 * Build: make examples/top_logits; run: examples/top_logits MODEL.gguf "Some text" */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "graph/engine.h"
#include "io/model.h"
#include "io/tokenizer.h"

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MODEL.gguf TEXT\n", argv[0]);
    return 1;
  }
  struct st_model *model = NULL;
  struct st_engine *engine = NULL;
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = st_model_load(argv[1], &model);
  if (!rc) rc = st_tokenizer_encode(model->tok, argv[2], strlen(argv[2]), 1, &ids, &n);
  if (!rc) rc = st_engine_create(model, &(struct st_engine_opts){0}, &engine);
  float *logits = rc ? NULL : malloc(sizeof(float) * model->hp.n_vocab);
  if (!rc) rc = st_engine_eval(engine, ids, (int)n, logits, 0);
  if (rc) {
    fprintf(stderr, "%s\n", st_last_error());
  } else {
    printf("%zu prompt tokens; next-token candidates:\n", n);
    for (int k = 0; k < 5; k++) { /* five passes of argmax: fine for a demo */
      int best = 0;
      for (uint32_t i = 1; i < model->hp.n_vocab; i++)
        if (logits[i] > logits[best]) best = (int)i;
      char piece[256];
      int len = st_tokenizer_token_bytes(model->tok, best, piece, sizeof piece - 1);
      piece[len > 0 ? len : 0] = 0;
      printf("  %6d  %8.4f  '%s'\n", best, logits[best], piece);
      logits[best] = -1e30f;
    }
  }
  free(logits);
  free(ids);
  st_engine_destroy(engine);
  st_model_free(model);
  return rc ? 1 : 0;
}
