/* Tests the Qwen2/Qwen3 tokenizer (src/io/tokenizer.c): the ids of every case in
 * $FIXTURES/tokenizer/qwen3-tokenizer-cases.json (llama.cpp's qwen2 vocab tests and Hugging Face
 * ids) with the full vocabulary, the prompt ids of the tiny model fixture (truncated vocabulary,
 * special tokens in the text), decode(encode(text)) == text, the streaming detokenizer (whole
 * UTF-8 characters per push, exact text overall), invalid UTF-8 input, refusal of a non-gpt2
 * tokenizer, and the load time. FIXTURES defaults to ../shared/fixtures. Exit 0 pass, 1 fail. */
#include "common.h"
#include "io/gguf.h"
#include "io/tokenizer.h"
#include "refcheck.h"

#include <cjson/cJSON.h>
#include <string.h>
#include <unistd.h>

/* Id cases (fixture texts compared with expected ids) and the other checks, counted apart. */
static int n_cases, n_cases_failed, n_checks, n_checks_failed;

static void result(int ok) {
  n_checks++;
  if (!ok) n_checks_failed++;
}

static cJSON *load_json(const char *path) {
  char *s = ref_slurp(path, NULL);
  if (!s) {
    fprintf(stderr, "test_tokenizer: cannot read %s\n", path);
    return NULL;
  }
  cJSON *j = cJSON_Parse(s);
  free(s);
  if (!j) fprintf(stderr, "test_tokenizer: cannot parse %s\n", path);
  return j;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
  fprintf(stderr, "    %s (%zu):", label, n);
  for (size_t i = 0; i < n; i++)
    fprintf(stderr, " %d", ids[i]);
  fprintf(stderr, "\n");
}

static int valid_utf8(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    unsigned c = u[i];
    size_t need = c < 0x80                 ? 0
                  : c >= 0xC2 && c <= 0xDF ? 1
                  : c >= 0xE0 && c <= 0xEF ? 2
                  : c >= 0xF0 && c <= 0xF4 ? 3
                                           : 99;
    if (need == 99 || i + need >= n + (need ? 0 : 1)) return 0;
    for (size_t k = 1; k <= need; k++)
      if ((u[i + k] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && u[i + 1] < 0xA0) return 0;
    if (c == 0xED && u[i + 1] > 0x9F) return 0;
    if (c == 0xF0 && u[i + 1] < 0x90) return 0;
    if (c == 0xF4 && u[i + 1] > 0x8F) return 0;
    i += need + 1;
  }
  return 1;
}

/* decode(ids) by token_bytes, compared with text. */
static int check_roundtrip(const struct st_tokenizer *t, const char *name, const char *text,
                           size_t len, const int32_t *ids, size_t n) {
  size_t cap = len + 64, w = 0;
  char *buf = malloc(cap), tok[4096];
  int ok = buf != NULL;
  for (size_t i = 0; ok && i < n; i++) {
    int b = st_tokenizer_token_bytes(t, ids[i], tok, sizeof tok);
    if (b < 0 || w + (size_t)b > cap) {
      ok = 0;
      break;
    }
    memcpy(buf + w, tok, (size_t)b);
    w += (size_t)b;
  }
  ok = ok && w == len && memcmp(buf, text, len) == 0;
  if (!ok) fprintf(stderr, "FAIL round-trip %s: decode(encode(text)) != text\n", name);
  free(buf);
  return ok;
}

/* Streams ids one at a time through st_detok; each push must be valid UTF-8 and the whole
 * stream must equal `want`. */
static int check_stream(const struct st_tokenizer *t, const char *name, const char *want,
                        size_t want_len, const int32_t *ids, size_t n) {
  struct st_detok d;
  size_t cap = 3 * (st_tokenizer_max_token_bytes(t) + 4) + 1, total = 0;
  char *piece = malloc(cap), *all = malloc(want_len * 3 + 16);
  int ok = piece && all;
  st_detok_init(&d, t);
  for (size_t i = 0; ok && i <= n; i++) {
    size_t w = i < n ? st_detok_push(&d, ids[i], piece, cap) : st_detok_flush(&d, piece, cap);
    if (!valid_utf8(piece, w) || strlen(piece) != w) {
      fprintf(stderr, "FAIL stream %s: push %zu gave a partial or invalid UTF-8 piece\n", name, i);
      ok = 0;
    }
    if (total + w > want_len * 3 + 8) {
      ok = 0;
      break;
    }
    memcpy(all + total, piece, w);
    total += w;
  }
  if (ok && (total != want_len || memcmp(all, want, want_len) != 0)) {
    fprintf(stderr, "FAIL stream %s: streamed text (%zu bytes) != expected (%zu bytes)\n", name,
            total, want_len);
    ok = 0;
  }
  free(piece);
  free(all);
  return ok;
}

/* Encodes text and compares with the expected ids (a cJSON array). */
static void check_case(const struct st_tokenizer *t, const char *name, const char *text,
                       const cJSON *jids) {
  size_t len = strlen(text), n = 0, ne = (size_t)cJSON_GetArraySize(jids);
  int32_t *ids = NULL, *want = malloc((ne ? ne : 1) * sizeof *want);
  for (size_t i = 0; i < ne; i++)
    want[i] = (int32_t)cJSON_GetArrayItem(jids, (int)i)->valueint;
  int rc = st_tokenizer_encode(t, text, len, 1, &ids, &n);
  int ok = rc == 0 && n == ne && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
  if (!ok) {
    fprintf(stderr, "FAIL ids %s: rc %d %s\n", name, rc, rc ? st_last_error() : "");
    print_ids("expected", want, ne);
    print_ids("got", ids, n);
  }
  n_cases++;
  if (!ok) n_cases_failed++;
  if (rc == 0) {
    result(check_roundtrip(t, name, text, len, ids, n));
    result(check_stream(t, name, text, len, ids, n));
  }
  free(ids);
  free(want);
}

static struct st_tokenizer *open_tokenizer(const char *path, double *ms) {
  struct st_gguf *g = NULL;
  struct st_tokenizer *t = NULL;
  if (st_gguf_open(path, &g)) {
    fprintf(stderr, "test_tokenizer: %s\n", st_last_error());
    return NULL;
  }
  double t0 = st_now();
  int rc = st_tokenizer_load(g, &t);
  if (ms) *ms = 1e3 * (st_now() - t0);
  st_gguf_close(g); /* the tokenizer must not need the file any more */
  if (rc) fprintf(stderr, "test_tokenizer: load %s: %s\n", path, st_last_error());
  return t;
}

static void check_full_vocab(const char *fix) {
  char path[4096];
  double ms = 0;
  snprintf(path, sizeof path, "%s/tokenizer/vocab-qwen3.gguf", fix);
  struct st_tokenizer *t = open_tokenizer(path, &ms);
  result(t != NULL);
  if (!t) return;
  printf("test_tokenizer: loaded %d tokens in %.1f ms\n", st_tokenizer_n_vocab(t), ms);
  result(ms < 5000.0); /* ~70 ms natively; the bound only catches a gross regression (valgrind) */
  int ok = st_tokenizer_n_vocab(t) == 151936 && st_tokenizer_eos(t) == 151645 &&
           st_tokenizer_eot(t) == 151645 && st_tokenizer_is_special(t, 151644) &&
           st_tokenizer_is_special(t, 151667) && !st_tokenizer_is_special(t, 9707);
  if (!ok) fprintf(stderr, "FAIL vocab size / eos / eot / special flags\n");
  result(ok);

  snprintf(path, sizeof path, "%s/tokenizer/qwen3-tokenizer-cases.json", fix);
  cJSON *j = load_json(path);
  result(j != NULL);
  const cJSON *cases = j ? cJSON_GetObjectItem(j, "cases") : NULL;
  int n_cases = 0;
  const cJSON *c;
  cJSON_ArrayForEach(c, cases) {
    const cJSON *name = cJSON_GetObjectItem(c, "name"), *text = cJSON_GetObjectItem(c, "text");
    check_case(t, cJSON_IsString(name) ? name->valuestring : "?",
               cJSON_IsString(text) ? text->valuestring : "", cJSON_GetObjectItem(c, "ids"));
    n_cases++;
  }
  printf("test_tokenizer: %d fixture cases encoded (ids, round-trip, stream each)\n", n_cases);
  cJSON_Delete(j);

  /* Without parse_special, control-token text is ordinary text. */
  const char *chat = "<|im_start|>user";
  int32_t *ids = NULL;
  size_t n = 0;
  ok = st_tokenizer_encode(t, chat, strlen(chat), 0, &ids, &n) == 0 && n > 2;
  for (size_t i = 0; ok && i < n; i++)
    ok = !st_tokenizer_is_special(t, ids[i]);
  if (!ok) fprintf(stderr, "FAIL parse_special=0 still produced a control token\n");
  result(ok && check_roundtrip(t, "no-special", chat, strlen(chat), ids, n));
  free(ids);

  /* Invalid UTF-8 is encoded byte-wise and comes back unchanged from token_bytes; the stream
   * shows it as U+FFFD. */
  const char bad[] = "ok\xff\xfe caf\xc3 \xe2\x82 end\xf0\x9f\x98";
  ok = st_tokenizer_encode(t, bad, sizeof bad - 1, 1, &ids, &n) == 0;
  result(ok && check_roundtrip(t, "invalid-utf8", bad, sizeof bad - 1, ids, n));
  const char *shown = "ok\xef\xbf\xbd\xef\xbf\xbd caf\xef\xbf\xbd \xef\xbf\xbd end\xef\xbf\xbd";
  result(ok && check_stream(t, "invalid-utf8", shown, strlen(shown), ids, n));
  free(ids);

  /* A long word (no spaces) and a long whitespace run stay fast and exact. */
  size_t big = 1 << 20;
  char *s = malloc(big + 1);
  for (size_t i = 0; i < big; i++)
    s[i] = i < big / 2 ? "abcdefghij"[i % 10] : (i % 7 ? ' ' : '\n');
  s[big] = '\0';
  double t0 = st_now();
  ok = st_tokenizer_encode(t, s, big, 1, &ids, &n) == 0;
  double enc_ms = 1e3 * (st_now() - t0);
  printf("test_tokenizer: encoded a 1 MiB adversarial text into %zu ids in %.1f ms\n", n, enc_ms);
  result(ok && check_roundtrip(t, "long", s, big, ids, n));
  free(ids);
  free(s);

  char tb[8];
  result(st_tokenizer_token_bytes(t, -1, tb, sizeof tb) < 0 &&
         st_tokenizer_token_bytes(t, 151936, tb, sizeof tb) < 0);
  st_tokenizer_free(t);
}

static void check_model_prompts(const char *fix) {
  char path[4096];
  snprintf(path, sizeof path, "%s/models/tiny-qwen3moe-bf16.gguf", fix);
  struct st_tokenizer *t = open_tokenizer(path, NULL);
  result(t != NULL);
  if (!t) return;
  result(st_tokenizer_n_vocab(t) == 8224 && st_tokenizer_eot(t) == 8194);
  snprintf(path, sizeof path, "%s/models/tiny-bf16-reference.json", fix);
  cJSON *j = load_json(path);
  result(j != NULL);
  int np = 0;
  const cJSON *p, *prompts = j ? cJSON_GetObjectItem(j, "prompts") : NULL;
  cJSON_ArrayForEach(p, prompts) {
    const cJSON *name = cJSON_GetObjectItem(p, "name"), *text = cJSON_GetObjectItem(p, "text");
    char label[256];
    snprintf(label, sizeof label, "tiny-prompt-%s", cJSON_IsString(name) ? name->valuestring : "?");
    check_case(t, label, cJSON_IsString(text) ? text->valuestring : "",
               cJSON_GetObjectItem(p, "ids"));
    np++;
  }
  printf("test_tokenizer: %d tiny-model prompts encoded\n", np);
  cJSON_Delete(j);
  st_tokenizer_free(t);
}

/* The other pre-tokenizers (gpt-4o, deepseek-v3, glm4) against llama.cpp's ids for one varied text
 * (tests/data/pretok-ids.txt: llama-tokenize on the archs/ fixture's vocabulary with
 * tokenizer.ggml.pre set to each; here the loaded GGUF's key is pointed at each name in turn). */
static void check_pretypes(const char *fix) {
  char path[4096], *text = NULL, *lines = NULL;
  snprintf(path, sizeof path, "%s/archs/tiny-gpt-oss-q8_0.gguf", fix);
  const char *src = getenv("srcdir") ? getenv("srcdir") : ".";
  char tpath[4096], ipath[4096];
  snprintf(tpath, sizeof tpath, "%s/tests/data/pretok-text.txt", src);
  snprintf(ipath, sizeof ipath, "%s/tests/data/pretok-ids.txt", src);
  struct st_gguf *g = NULL;
  text = ref_slurp(tpath, NULL);
  lines = ref_slurp(ipath, NULL);
  if (!text || !lines || st_gguf_open(path, &g)) {
    printf("SKIP pre-tokenizers: cannot read %s, %s or %s\n", tpath, ipath, path);
    free(text), free(lines);
    return;
  }
  struct st_gguf_kv *pre = (struct st_gguf_kv *)st_gguf_find_kv(g, "tokenizer.ggml.pre");
  for (char *line = strtok(lines, "\n"); line && pre; line = strtok(NULL, "\n")) {
    if (line[0] == '#') continue;
    char *sp = strchr(line, ' ');
    if (!sp) continue;
    *sp = 0;
    pre->v.str.ptr = line; /* the key's value, for this load */
    pre->v.str.len = strlen(line);
    cJSON *want = cJSON_Parse(sp + 1);
    struct st_tokenizer *t = NULL;
    char label[96];
    snprintf(label, sizeof label, "pre-tokenizer %s (llama.cpp's ids)", line);
    if (st_tokenizer_load(g, &t)) {
      fprintf(stderr, "FAIL %s: %s\n", label, st_last_error());
      n_cases++, n_cases_failed++;
    } else {
      check_case(t, label, text, want);
      printf("test_tokenizer: %s: %d ids compared\n", label, cJSON_GetArraySize(want));
    }
    st_tokenizer_free(t);
    cJSON_Delete(want);
  }
  st_gguf_close(g);
  free(text);
  free(lines);
}

/* A vocabulary-only GGUF whose tokenizer.ggml.model is not gpt2 must be refused by name. */
static void check_refusal(void) {
  char path[] = "/tmp/test_tokenizer_llama_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    result(0);
    return;
  }
  close(fd);
  const char *toks[] = {"a", "b"};
  struct st_gguf_writer *w = st_gguf_writer_new();
  int rc = !w || st_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama") ||
           st_gguf_writer_add_str(w, "tokenizer.ggml.pre", "qwen2") ||
           st_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 2) ||
           st_gguf_writer_begin(w, path) || st_gguf_writer_finish(w);
  st_gguf_writer_free(w);
  struct st_gguf *g = NULL;
  struct st_tokenizer *t = NULL;
  if (!rc) rc = st_gguf_open(path, &g);
  int ok = 0;
  if (!rc) {
    rc = st_tokenizer_load(g, &t);
    ok = rc == ST_EUNSUP && t == NULL && strstr(st_last_error(), "llama") != NULL;
    printf("test_tokenizer: non-gpt2 vocabulary refused: %s\n", st_last_error());
  } else {
    fprintf(stderr, "test_tokenizer: cannot write %s: %s\n", path, st_last_error());
  }
  if (!ok) fprintf(stderr, "FAIL refusal of a \"llama\" tokenizer (rc %d)\n", rc);
  result(ok);
  st_tokenizer_free(t);
  st_gguf_close(g);
  remove(path);
}

int main(void) {
  const char *fix = ref_fixtures("the Qwen3 tokenizer cases and the tiny model's prompts (external references)");
  if (fix) {
    check_full_vocab(fix);
    check_model_prompts(fix);
    check_pretypes(fix);
  }
  check_refusal();
  printf("test_tokenizer: other checks (round-trip, stream, load, refusal, ...): %d, %d failed\n",
         n_checks, n_checks_failed);
  printf("test_tokenizer: checked %d cases, %d passed, %d failed\n", n_cases,
         n_cases - n_cases_failed, n_cases_failed);
  return n_cases_failed || n_checks_failed ? 1 : 0;
}
