/* libFuzzer target for the GGUF reader and the model loader (`make tests/fuzz_gguf`, `make fuzz`):
 * opens the input with st_gguf_open_buffer and, when it is accepted, reads every KV through the
 * public accessors and the first and last byte of every tensor, so that any pointer the reader
 * hands out that is not inside the buffer shows up under AddressSanitizer; then loads it as a model
 * (st_model_from_gguf: every architecture's hyper-parameters, tensor shapes and types, the
 * tokenizer), which must accept or refuse it without a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "io/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct st_gguf *g;
  if (st_gguf_open_buffer(data, size, "fuzz.gguf", &g)) return 0;
  volatile uint64_t sink = 0;
  for (uint64_t i = 0; i < g->n_kv; i++) {
    const struct st_gguf_kv *kv = &g->kv[i];
    char key[256];
    size_t kl = kv->key.len < sizeof key - 1 ? (size_t)kv->key.len : sizeof key - 1;
    memcpy(key, kv->key.ptr, kl);
    key[kl] = 0;
    if (kv->key.len) sink += (uint8_t)kv->key.ptr[kv->key.len - 1];
    /* Getters (only meaningful when the key has no NUL and fits the buffer). */
    if (kl == kv->key.len && !memchr(kv->key.ptr, 0, kl)) {
      uint64_t u;
      float f;
      int b;
      char *s = NULL;
      if (!st_gguf_get_u64(g, key, &u)) sink += u;
      if (!st_gguf_get_f32(g, key, &f)) sink += (uint64_t)(f == f);
      if (!st_gguf_get_bool(g, key, &b)) sink += (uint64_t)b;
      if (!st_gguf_get_str(g, key, &s)) {
        sink += strlen(s);
        free(s);
      }
    }
    if (kv->type == ST_GGUF_STRING && kv->v.str.len) sink += (uint8_t)kv->v.str.ptr[kv->v.str.len - 1];
    if (kv->type == ST_GGUF_ARRAY) {
      for (uint64_t j = 0; j < kv->v.arr.n; j++) {
        if (kv->v.arr.type == ST_GGUF_STRING) {
          struct st_gguf_str s = st_gguf_arr_str(kv, j);
          if (s.len) sink += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
        } else {
          sink += (uint64_t)st_gguf_arr_int(kv, j);
          sink += (uint64_t)(st_gguf_arr_float(kv, j) != 0);
        }
      }
    }
    sink += (uint64_t)strlen(st_gguf_vtype_name(kv->type));
  }
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const struct st_gguf_tensor *t = &g->tensor[i];
    const uint8_t *p = t->data;
    sink += p[0] + p[t->nbytes - 1];
    if (t->name.len) sink += (uint8_t)t->name.ptr[t->name.len - 1];
  }
  (void)sink;
  st_gguf_close(g);
  struct st_model *m = NULL;
  if (st_gguf_open_buffer(data, size, "fuzz.gguf", &g) == 0 && st_model_from_gguf(g, &m) == 0) st_model_free(m);
  return 0;
}
