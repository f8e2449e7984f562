/* The GGUF `gpt2` byte-level BPE tokenizer with the pre-tokenizers of the architectures strata
 * computes (`qwen2`; `deepseek-v3`, `gpt-4o` (gpt-oss's o200k), `glm4`, `kimi-k2`), written to give the ids
 * llama.cpp gives (llama-vocab.cpp: special-token partition, regex split, GPT-2
 * bytes_to_unicode, BPE by merge rank with a priority queue). Token text -> id and merge pair ->
 * rank lookups use glibc's hsearch_r tables (built once at load, read-only afterwards, so encode
 * may run on several threads at once); the pre-split regex is compiled once with PCRE2 (UTF, UCP,
 * MATCH_INVALID_UTF, JIT when available). Everything kept is copied out of the GGUF. */
#define _GNU_SOURCE
#include "io/tokenizer.h"

#include "common.h"
#include "io/gguf.h"

#include <search.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* GGUF tokenizer.ggml.token_type values (llama.cpp LLAMA_TOKEN_TYPE_*). */
enum {
  TOK_NORMAL = 1,
  TOK_UNKNOWN = 2,
  TOK_CONTROL = 3,
  TOK_USER_DEFINED = 4,
  TOK_UNUSED = 5,
  TOK_BYTE = 6,
};

/* GPT-2 bytes_to_unicode() maps bytes to code points 33..323. */
#define BYTE_CP_LIMIT 324

/* White_Space as llama.cpp's unicode tables define it (and as Oniguruma / Rust regex `\s` do);
 * PCRE2's UCP `\s` would also take U+180E, so the class is spelt out. */
#define WS                                                                                         \
  "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"         \
  "\\x{202F}\\x{205F}\\x{3000}"

/* Qwen2's pre-tokenizer regex in llama.cpp's form (LLAMA_VOCAB_PRE_TYPE_QWEN2): the HF
 * `(?i:'s|'t|...)` is written with explicit [sS] classes so that case folding cannot pull in
 * other letters (U+017F folds to s under PCRE2 caseless UTF matching). */
static const char qwen2_regex[] = "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
                                  "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
                                  "|\\p{N}"
                                  "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
                                  "|[" WS "]*[\\r\\n]+"
                                  "|[" WS "]+(?![^" WS "])"
                                  "|[" WS "]+";

/* The other pre-tokenizers, from llama-vocab.cpp's llm_tokenizer_bpe (de3ff815) in the same form
 * (explicit [sS] classes for the contractions, White_Space spelt out for \s). GLM-4
 * (LLAMA_VOCAB_PRE_TYPE_CHATGLM4): llama3's split, digits in threes. */
static const char glm4_regex[] = "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
                                 "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
                                 "|\\p{N}{1,3}"
                                 "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
                                 "|[" WS "]*[\\r\\n]+"
                                 "|[" WS "]+(?![^" WS "])"
                                 "|[" WS "]+";
/* gpt-oss (o200k_harmony, `gpt-4o`: LLAMA_VOCAB_PRE_TYPE_GPT4O, the regex of its tokenizer.json):
 * words split at lower-to-upper case changes, contractions kept with them, digits in threes */
#define CONTRACTION "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
static const char gpt4o_regex[] = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" CONTRACTION
                                  "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" CONTRACTION
                                  "|\\p{N}{1,3}"
                                  "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*"
                                  "|[" WS "]*[\\r\\n]+"
                                  "|[" WS "]+(?![^" WS "])"
                                  "|[" WS "]+";
/* DeepSeek-V3 (`deepseek-v3`: LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM): three splits in turn, each
 * over the pieces of the one before: digits in threes; runs of CJK ideographs, hiragana and
 * katakana; then words, punctuation and spaces */
static const char ds3_regex1[] = "\\p{N}{1,3}";
static const char ds3_regex2[] = "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+";
static const char ds3_regex3[] = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
                                 "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                                 "| ?[\\p{P}\\p{S}]+[\\r\\n]*"
                                 "|[" WS "]*[\\r\\n]+"
                                 "|[" WS "]+(?![^" WS "])"
                                 "|[" WS "]+";

/* Kimi K2 (`kimi-k2`: the regex of its tokenization_kimi.py, whose class intersections
 * [...&&[^\p{Han}]] are written as a negative lookahead per character): runs of Han, then gpt-4o's
 * words without Han letters, digits in threes */
#define NOHAN_UP "(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define NOHAN_LO "(?:(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"
static const char kimi_k2_regex[] = "\\p{Han}+"
                                    "|[^\\r\\n\\p{L}\\p{N}]?" NOHAN_UP "*" NOHAN_LO "+" CONTRACTION
                                    "|[^\\r\\n\\p{L}\\p{N}]?" NOHAN_UP "+" NOHAN_LO "*" CONTRACTION
                                    "|\\p{N}{1,3}"
                                    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
                                    "|[" WS "]*[\\r\\n]+"
                                    "|[" WS "]+(?![^" WS "])"
                                    "|[" WS "]+";

/* DeepSeek-V2 / DeepSeek-LLM (`deepseek-llm`: LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM): six splits in turn,
 * copied from llama-vocab.cpp (line breaks; Latin-like letters with an optional space before; ASCII
 * and full-width punctuation likewise; trailing spaces (ECMAScript's $: the piece's end); CJK;
 * numbers) */
static const char dsllm_regex1[] = "[\r\n]";
static const char dsllm_regex2[] = "[" WS "]?" "[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
static const char dsllm_regex3[] = "[" WS "]?" "[!-/:-~！-／：-～‘-‟　-。]+";
static const char dsllm_regex4[] = "[" WS "]+\\z";
static const char dsllm_regex5[] = "[一-龥ࠀ-一가-퟿]+";
static const char dsllm_regex6[] = "\\p{N}+";

/* tokenizer.ggml.pre values strata splits, and their regexes (applied in turn). */
static const struct pre_type {
  const char *name;
  const char *regex[6];
} pre_types[] = {
    {"qwen2", {qwen2_regex}},           {"deepseek-r1-qwen", {qwen2_regex}},
    {"deepseek-v3", {ds3_regex1, ds3_regex2, ds3_regex3}},
    {"gpt-4o", {gpt4o_regex}},          {"glm4", {glm4_regex}},
    {"chatglm-bpe", {glm4_regex}},      {"kimi-k2", {kimi_k2_regex}},
    {"deepseek-llm", {dsllm_regex1, dsllm_regex2, dsllm_regex3, dsllm_regex4, dsllm_regex5, dsllm_regex6}},
};
#define MAX_RE 6

struct st_tokenizer {
  int32_t n_vocab;
  char *text;                     /* token texts back to back, each NUL-terminated (hash keys) */
  size_t *text_off;               /* n_vocab + 1 offsets into text (length = next - this - 1) */
  char *bytes;                    /* decoded token bytes back to back */
  size_t *bytes_off;              /* n_vocab + 1 offsets into bytes */
  uint8_t *type;                  /* token_type per id */
  size_t max_bytes;               /* longest decoded token */
  char *merges;                   /* merge strings "left right", NUL-terminated (hash keys) */
  struct hsearch_data *tok_map;   /* token text -> id */
  struct hsearch_data *merge_map; /* "left right" -> rank */
  int32_t *special;               /* control / user-defined / unknown ids, longest text first */
  size_t n_special;
  int32_t eos, eot;
  int32_t eog[8]; /* the end-of-generation ids (st_tokenizer_is_eog) */
  int n_eog;
  int32_t bos_add; /* the BOS id a prompt starts with (tokenizer.ggml.add_bos_token), or -1 */
  int32_t shown[6]; /* control tokens a generation shows as text (st_tokenizer_is_shown) */
  int n_shown;
  pcre2_code *re[MAX_RE]; /* the pre-tokenizer's regexes, applied in turn (n_re of them) */
  int n_re;
  uint16_t byte_cp[256];          /* byte -> code point */
  int16_t cp_byte[BYTE_CP_LIMIT]; /* code point -> byte, -1 if none */
};

/* ---- UTF-8 helpers ------------------------------------------------------------------------ */

/* Classifies the sequence at s[0..n): returns 1 for one complete valid character of *len bytes,
 * 0 for a valid but incomplete prefix (all n bytes), -1 for invalid with *len the maximal
 * invalid subpart (Unicode 15 §3.9, "U+FFFD substitution of maximal subparts"). */
static int utf8_check(const unsigned char *s, size_t n, size_t *len) {
  unsigned c = s[0];
  size_t need;
  unsigned lo = 0x80, hi = 0xBF;
  if (c < 0x80) {
    *len = 1;
    return 1;
  }
  if (c >= 0xC2 && c <= 0xDF)
    need = 1;
  else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *len = 1;
    return -1;
  }
  for (size_t i = 1; i <= need; i++) {
    if (i >= n) {
      *len = n;
      return 0;
    }
    unsigned b = s[i];
    unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      *len = i;
      return -1;
    }
  }
  *len = need + 1;
  return 1;
}

/* Decodes one character of a valid UTF-8 string (the token texts of a byte-level vocab). */
static uint32_t utf8_cp(const unsigned char *s, size_t n, size_t *len) {
  if (utf8_check(s, n, len) != 1) {
    *len = 1;
    return 0xFFFFFFFFu;
  }
  switch (*len) {
  case 1:
    return s[0];
  case 2:
    return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
  case 3:
    return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
  default:
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
  }
}

/* ---- growable buffers --------------------------------------------------------------------- */

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 64;
  while (c < need) {
    if (c > SIZE_MAX / 2 / elem) return st_set_error(ST_ENOMEM, "tokenizer: buffer too large");
    c *= 2;
  }
  void *q = realloc(*p, c * elem);
  if (!q) return st_set_error(ST_ENOMEM, "tokenizer: out of memory (%zu bytes)", c * elem);
  *p = q;
  *cap = c;
  return 0;
}

struct idvec {
  int32_t *v;
  size_t n, cap;
};

static int idvec_push(struct idvec *a, int32_t id) {
  int rc = grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v);
  if (rc) return rc;
  a->v[a->n++] = id;
  return 0;
}

/* ---- loading ------------------------------------------------------------------------------ */

static void build_byte_maps(struct st_tokenizer *t) {
  int n = 0;
  for (int i = 0; i < BYTE_CP_LIMIT; i++)
    t->cp_byte[i] = -1;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    t->byte_cp[b] = (uint16_t)(printable ? b : 256 + n++);
    t->cp_byte[t->byte_cp[b]] = (int16_t)b;
  }
}

static const struct st_gguf_kv *find_array(const struct st_gguf *g, const char *key,
                                           int want_strings, int *rc) {
  const struct st_gguf_kv *kv = st_gguf_find_kv(g, key);
  *rc = 0;
  if (!kv) return NULL;
  if (kv->type != ST_GGUF_ARRAY || (want_strings && kv->v.arr.type != ST_GGUF_STRING) ||
      (!want_strings && (kv->v.arr.type == ST_GGUF_STRING || kv->v.arr.type == ST_GGUF_FLOAT32 ||
                         kv->v.arr.type == ST_GGUF_FLOAT64))) {
    *rc = st_set_error(ST_EFORMAT, "tokenizer: key %s is %s%s%s, expected an array of %s", key,
                       st_gguf_vtype_name(kv->type), kv->type == ST_GGUF_ARRAY ? " of " : "",
                       kv->type == ST_GGUF_ARRAY ? st_gguf_vtype_name(kv->v.arr.type) : "",
                       want_strings ? "strings" : "integers");
  }
  return kv;
}

static int check_str_key(const struct st_gguf *g, const char *key, const char *want) {
  const struct st_gguf_kv *kv = st_gguf_find_kv(g, key);
  if (!kv)
    return st_set_error(ST_EUNSUP, "tokenizer: %s is missing (only \"%s\" is supported)", key,
                        want);
  if (kv->type != ST_GGUF_STRING)
    return st_set_error(ST_EFORMAT, "tokenizer: key %s is %s, expected a string", key,
                        st_gguf_vtype_name(kv->type));
  if (kv->v.str.len != strlen(want) || memcmp(kv->v.str.ptr, want, kv->v.str.len) != 0) {
    int n = kv->v.str.len > 64 ? 64 : (int)kv->v.str.len;
    return st_set_error(ST_EUNSUP, "tokenizer: %s \"%.*s\" is not supported (only \"%s\")", key, n,
                        kv->v.str.ptr, want);
  }
  return 0;
}

static int copy_tokens(struct st_tokenizer *t, const struct st_gguf_kv *tokens,
                       const struct st_gguf_kv *types) {
  size_t n = (size_t)t->n_vocab, total = 0;
  for (size_t i = 0; i < n; i++) {
    struct st_gguf_str s = st_gguf_arr_str(tokens, i);
    total += (size_t)s.len + 1;
  }
  t->text = malloc(total ? total : 1);
  t->text_off = malloc((n + 1) * sizeof *t->text_off);
  t->type = malloc(n ? n : 1);
  /* Byte-level decoding never grows a token; raw-text tokens are copied as they are. */
  t->bytes = malloc(total ? total : 1);
  t->bytes_off = malloc((n + 1) * sizeof *t->bytes_off);
  if (!t->text || !t->text_off || !t->type || !t->bytes || !t->bytes_off)
    return st_set_error(ST_ENOMEM, "tokenizer: out of memory for %zu tokens", n);
  size_t off = 0, boff = 0;
  for (size_t i = 0; i < n; i++) {
    struct st_gguf_str s = st_gguf_arr_str(tokens, i);
    int64_t ty = types ? st_gguf_arr_int(types, i) : TOK_NORMAL;
    t->type[i] = (uint8_t)(ty >= TOK_NORMAL && ty <= TOK_BYTE ? ty : TOK_NORMAL);
    t->text_off[i] = off;
    memcpy(t->text + off, s.ptr, (size_t)s.len);
    t->text[off + s.len] = '\0';
    t->bytes_off[i] = boff;
    const unsigned char *u = (const unsigned char *)s.ptr;
    if (t->type[i] == TOK_NORMAL || t->type[i] == TOK_BYTE) {
      for (size_t j = 0; j < s.len;) {
        size_t l;
        uint32_t cp = utf8_cp(u + j, (size_t)s.len - j, &l);
        if (cp < BYTE_CP_LIMIT && t->cp_byte[cp] >= 0)
          t->bytes[boff++] = (char)t->cp_byte[cp];
        else {
          memcpy(t->bytes + boff, u + j, l);
          boff += l;
        }
        j += l;
      }
    } else {
      memcpy(t->bytes + boff, s.ptr, (size_t)s.len);
      boff += (size_t)s.len;
    }
    if (boff - t->bytes_off[i] > t->max_bytes) t->max_bytes = boff - t->bytes_off[i];
    off += (size_t)s.len + 1;
  }
  t->text_off[n] = off;
  t->bytes_off[n] = boff;
  return 0;
}

static int build_token_map(struct st_tokenizer *t) {
  t->tok_map = calloc(1, sizeof *t->tok_map);
  if (!t->tok_map || !hcreate_r((size_t)t->n_vocab * 2 + 16, t->tok_map)) {
    free(t->tok_map);
    t->tok_map = NULL;
    return st_set_error(ST_ENOMEM, "tokenizer: cannot create the token table");
  }
  for (int32_t i = 0; i < t->n_vocab; i++) {
    ENTRY e = {.key = t->text + t->text_off[i], .data = (void *)(intptr_t)i}, *r;
    if (!hsearch_r(e, ENTER, &r, t->tok_map))
      return st_set_error(ST_ENOMEM, "tokenizer: token table full");
    r->data = (void *)(intptr_t)i; /* a repeated text maps to its last id, as in llama.cpp */
  }
  return 0;
}

static int build_merge_map(struct st_tokenizer *t, const struct st_gguf_kv *merges) {
  size_t n = (size_t)merges->v.arr.n, total = 0;
  for (size_t i = 0; i < n; i++)
    total += (size_t)st_gguf_arr_str(merges, i).len + 1;
  t->merges = malloc(total ? total : 1);
  t->merge_map = calloc(1, sizeof *t->merge_map);
  if (!t->merges || !t->merge_map || !hcreate_r(n * 2 + 16, t->merge_map)) {
    free(t->merge_map);
    t->merge_map = NULL;
    return st_set_error(ST_ENOMEM, "tokenizer: cannot create the merge table (%zu merges)", n);
  }
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    struct st_gguf_str s = st_gguf_arr_str(merges, i);
    /* llama.cpp splits at the first space after position 0; a merge without one is unused. */
    const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', (size_t)s.len - 1) : NULL;
    if (!sp || memchr(s.ptr, '\0', (size_t)s.len)) continue;
    char *key = t->merges + off;
    memcpy(key, s.ptr, (size_t)s.len);
    key[s.len] = '\0';
    off += (size_t)s.len + 1;
    ENTRY e = {.key = key, .data = (void *)(intptr_t)i}, *r;
    if (!hsearch_r(e, ENTER, &r, t->merge_map)) /* keeps the first rank of a repeated pair */
      return st_set_error(ST_ENOMEM, "tokenizer: merge table full");
  }
  return 0;
}

static size_t tok_len(const struct st_tokenizer *t, int32_t id) {
  return t->text_off[id + 1] - t->text_off[id] - 1;
}

/* qsort has no context argument; the comparison key (length, then id) is packed instead. */
static int cmp_special(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int build_special(struct st_tokenizer *t) {
  size_t n = 0;
  for (int32_t i = 0; i < t->n_vocab; i++) {
    uint8_t ty = t->type[i];
    if ((ty == TOK_CONTROL || ty == TOK_USER_DEFINED || ty == TOK_UNKNOWN) && tok_len(t, i) > 0)
      n++;
  }
  uint64_t *keys = malloc((n ? n : 1) * sizeof *keys);
  t->special = malloc((n ? n : 1) * sizeof *t->special);
  if (!keys || !t->special) {
    free(keys);
    return st_set_error(ST_ENOMEM, "tokenizer: out of memory");
  }
  n = 0;
  for (int32_t i = 0; i < t->n_vocab; i++) {
    uint8_t ty = t->type[i];
    if ((ty == TOK_CONTROL || ty == TOK_USER_DEFINED || ty == TOK_UNKNOWN) && tok_len(t, i) > 0) {
      uint64_t len = tok_len(t, i) > 0xFFFFFFFFu ? 0xFFFFFFFFu : tok_len(t, i);
      keys[n++] = ((0xFFFFFFFFu - len) << 32) | (uint32_t)i; /* longest first, then by id */
    }
  }
  qsort(keys, n, sizeof *keys, cmp_special);
  for (size_t i = 0; i < n; i++)
    t->special[i] = (int32_t)(keys[i] & 0xFFFFFFFFu);
  t->n_special = n;
  free(keys);
  return 0;
}

static int compile_regex(struct st_tokenizer *t, const struct pre_type *p) {
  for (t->n_re = 0; t->n_re < MAX_RE && p->regex[t->n_re]; t->n_re++) {
    int err;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p->regex[t->n_re], PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &erroff, NULL);
    if (!re) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return st_set_error(ST_ERUNTIME, "tokenizer: PCRE2 cannot compile the %s regex %d at %zu: %s", p->name, t->n_re,
                          (size_t)erroff, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is used if JIT is unavailable */
    t->re[t->n_re] = re;
  }
  return 0;
}

/* The pre-tokenizer tokenizer.ggml.pre names (ST_EUNSUP naming the ones strata splits otherwise). */
static int find_pre(const struct st_gguf *g, const struct pre_type **out) {
  const struct st_gguf_kv *kv = st_gguf_find_kv(g, "tokenizer.ggml.pre");
  if (!kv) return st_set_error(ST_EUNSUP, "tokenizer: tokenizer.ggml.pre is missing");
  if (kv->type != ST_GGUF_STRING)
    return st_set_error(ST_EFORMAT, "tokenizer: key tokenizer.ggml.pre is %s, expected a string", st_gguf_vtype_name(kv->type));
  for (size_t i = 0; i < sizeof pre_types / sizeof pre_types[0]; i++)
    if (kv->v.str.len == strlen(pre_types[i].name) && !memcmp(kv->v.str.ptr, pre_types[i].name, kv->v.str.len)) {
      *out = &pre_types[i];
      return 0;
    }
  const int n = kv->v.str.len > 64 ? 64 : (int)kv->v.str.len;
  return st_set_error(ST_EUNSUP, "tokenizer: tokenizer.ggml.pre \"%.*s\" is not supported (strata splits qwen2, "
                      "deepseek-r1-qwen, deepseek-llm, deepseek-v3, gpt-4o, glm4, chatglm-bpe, kimi-k2)", n, kv->v.str.ptr);
}

static int32_t lookup_token(const struct st_tokenizer *t, const char *text) {
  ENTRY e = {.key = (char *)text, .data = NULL}, *r;
  if (!hsearch_r(e, FIND, &r, t->tok_map)) return -1;
  return (int32_t)(intptr_t)r->data;
}

int st_tokenizer_load(const struct st_gguf *g, struct st_tokenizer **out) {
  int rc;
  *out = NULL;
  if ((rc = check_str_key(g, "tokenizer.ggml.model", "gpt2"))) return rc;
  const struct pre_type *pre = NULL;
  if ((rc = find_pre(g, &pre))) return rc;
  const struct st_gguf_kv *tokens = find_array(g, "tokenizer.ggml.tokens", 1, &rc);
  if (rc) return rc;
  if (!tokens) return st_set_error(ST_EFORMAT, "tokenizer: tokenizer.ggml.tokens is missing");
  const struct st_gguf_kv *types = find_array(g, "tokenizer.ggml.token_type", 0, &rc);
  if (rc) return rc;
  const struct st_gguf_kv *merges = find_array(g, "tokenizer.ggml.merges", 1, &rc);
  if (rc) return rc;
  if (!merges) return st_set_error(ST_EFORMAT, "tokenizer: tokenizer.ggml.merges is missing");
  if (tokens->v.arr.n == 0 || tokens->v.arr.n > INT32_MAX)
    return st_set_error(ST_EFORMAT, "tokenizer: tokenizer.ggml.tokens has %llu entries",
                        (unsigned long long)tokens->v.arr.n);
  if (types && types->v.arr.n != tokens->v.arr.n)
    return st_set_error(ST_EFORMAT, "tokenizer: %llu token types for %llu tokens",
                        (unsigned long long)types->v.arr.n, (unsigned long long)tokens->v.arr.n);
  if (merges->v.arr.n > INT32_MAX) return st_set_error(ST_EFORMAT, "tokenizer: too many merges");

  struct st_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return st_set_error(ST_ENOMEM, "tokenizer: out of memory");
  t->n_vocab = (int32_t)tokens->v.arr.n;
  t->eos = t->eot = t->bos_add = -1;
  build_byte_maps(t);
  if ((rc = copy_tokens(t, tokens, types)) || (rc = build_token_map(t)) ||
      (rc = build_merge_map(t, merges)) || (rc = build_special(t)) || (rc = compile_regex(t, pre))) {
    st_tokenizer_free(t);
    return rc;
  }
  if (st_gguf_find_kv(g, "tokenizer.ggml.eos_token_id")) {
    uint64_t eos;
    if ((rc = st_gguf_get_u64(g, "tokenizer.ggml.eos_token_id", &eos))) {
      st_tokenizer_free(t);
      return rc;
    }
    if (eos >= (uint64_t)t->n_vocab) {
      const int32_t nv = t->n_vocab;
      st_tokenizer_free(t);
      return st_set_error(ST_EFORMAT, "tokenizer: eos_token_id %llu outside the %d-token vocabulary",
                          (unsigned long long)eos, nv);
    }
    t->eos = (int32_t)eos;
  }
  t->eot = lookup_token(t, "<|im_end|>");
  /* end of generation, as llama.cpp's vocabulary gathers it: eos, the eot/eom ids a file names, and
   * the end-of-turn tokens of the chat families strata renders (ChatML, gpt-oss's harmony, GLM's
   * next turn, DeepSeek's end of sentence) */
  static const char *const ends[] = {"<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|user|>", "<|observation|>",
                                     "<｜end▁of▁sentence｜>"};
  int32_t cand[2 + sizeof ends / sizeof ends[0] + 2];
  int nc = 0;
  cand[nc++] = t->eos;
  static const char *const keys[] = {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
  for (int i = 0; i < 2; i++) {
    uint64_t v;
    if (!st_gguf_find_kv(g, keys[i])) continue;
    if ((rc = st_gguf_get_u64(g, keys[i], &v)) || v >= (uint64_t)t->n_vocab) {
      const int32_t nv = t->n_vocab;
      st_tokenizer_free(t);
      return rc ? rc : st_set_error(ST_EFORMAT, "tokenizer: %s %llu outside the %d-token vocabulary", keys[i],
                                    (unsigned long long)v, nv);
    }
    cand[nc++] = (int32_t)v;
  }
  for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) cand[nc++] = lookup_token(t, ends[i]);
  /* o200k_harmony (gpt-oss): <|end|> closes the reasoning channel before the answer, so it ends
   * nothing when <|return|> and <|call|> exist (llama.cpp's workaround, llama-vocab.cpp) */
  const int32_t harmony_end = lookup_token(t, "<|return|>") >= 0 && lookup_token(t, "<|call|>") >= 0 ? lookup_token(t, "<|end|>") : -1;
  for (int i = 0; i < nc; i++) {
    int dup = cand[i] < 0 || cand[i] == harmony_end;
    for (int j = 0; j < t->n_eog && !dup; j++) dup = t->eog[j] == cand[i];
    if (!dup && t->n_eog < (int)(sizeof t->eog / sizeof t->eog[0])) t->eog[t->n_eog++] = cand[i];
  }
  /* control tokens shown in generated text: Qwen3's reasoning markers, and gpt-oss's harmony
   * structure tokens llama.cpp always renders (llama-vocab.cpp: <|channel|>, <|message|>, <|start|>,
   * <|constrain|>), so that a reader can split the reasoning from the answer */
  static const char *const shown[] = {"<think>", "</think>", "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
  for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++) {
    const int32_t id = lookup_token(t, shown[i]);
    if (id >= 0) t->shown[t->n_shown++] = id;
  }
  /* the BOS a prompt starts with, when the file asks for one (llama.cpp's add_bos) */
  int add_bos = 0;
  uint64_t bos = 0;
  if (st_gguf_find_kv(g, "tokenizer.ggml.add_bos_token") && (rc = st_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos))) {
    st_tokenizer_free(t);
    return rc;
  }
  if (add_bos) {
    if (!st_gguf_find_kv(g, "tokenizer.ggml.bos_token_id") || (rc = st_gguf_get_u64(g, "tokenizer.ggml.bos_token_id", &bos)) ||
        bos >= (uint64_t)t->n_vocab) {
      const int32_t nv = t->n_vocab;
      st_tokenizer_free(t);
      return rc ? rc : st_set_error(ST_EFORMAT, "tokenizer: add_bos_token is set but bos_token_id is %s (%d-token vocabulary)",
                                    bos ? "outside the vocabulary" : "missing", nv);
    }
    t->bos_add = (int32_t)bos;
  }
  *out = t;
  return 0;
}

void st_tokenizer_free(struct st_tokenizer *t) {
  if (!t) return;
  if (t->tok_map) hdestroy_r(t->tok_map);
  if (t->merge_map) hdestroy_r(t->merge_map);
  free(t->tok_map);
  free(t->merge_map);
  for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
  free(t->text);
  free(t->text_off);
  free(t->bytes);
  free(t->bytes_off);
  free(t->type);
  free(t->merges);
  free(t->special);
  free(t);
}

/* ---- encoding ----------------------------------------------------------------------------- */

struct symbol {
  int32_t prev, next;
  uint32_t start, n; /* span of the byte-level word; n == 0 once merged into its left neighbour */
};

struct bigram {
  int32_t rank, left, right;
  uint32_t size;
};

/* Scratch space reused across the words of one encode call. */
struct bpe_work {
  char *word; /* byte-level encoded piece */
  size_t word_cap;
  struct symbol *sym;
  size_t sym_cap;
  struct bigram *heap;
  size_t heap_n, heap_cap;
  char *key; /* NUL-terminated lookup key */
  size_t key_cap;
};

/* Lowest rank first; among equal ranks, leftmost first (llama.cpp llm_bigram_bpe::comparator). */
static int bigram_before(const struct bigram *a, const struct bigram *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(struct bpe_work *w, struct bigram b) {
  size_t i = w->heap_n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!bigram_before(&b, &w->heap[p])) break;
    w->heap[i] = w->heap[p];
    i = p;
  }
  w->heap[i] = b;
}

static struct bigram heap_pop(struct bpe_work *w) {
  struct bigram top = w->heap[0], last = w->heap[--w->heap_n];
  size_t i = 0, n = w->heap_n;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && bigram_before(&w->heap[c + 1], &w->heap[c])) c++;
    if (!bigram_before(&w->heap[c], &last)) break;
    w->heap[i] = w->heap[c];
    i = c;
  }
  if (n) w->heap[i] = last;
  return top;
}

static void try_bigram(const struct st_tokenizer *t, struct bpe_work *w, int32_t left,
                       int32_t right) {
  if (left < 0 || right < 0) return;
  const struct symbol *l = &w->sym[left], *r = &w->sym[right];
  char *k = w->key;
  memcpy(k, w->word + l->start, l->n);
  k[l->n] = ' ';
  memcpy(k + l->n + 1, w->word + r->start, r->n);
  k[l->n + 1 + r->n] = '\0';
  ENTRY e = {.key = k, .data = NULL}, *res;
  if (!hsearch_r(e, FIND, &res, t->merge_map)) return;
  struct bigram b = {(int32_t)(intptr_t)res->data, left, right, l->n + r->n};
  heap_push(w, b);
}

/* BPE of one pre-tokenized piece (raw bytes) into ids (llama.cpp llm_tokenizer_bpe_session). */
static int bpe_piece(const struct st_tokenizer *t, struct bpe_work *w, const unsigned char *p,
                     size_t n, struct idvec *ids) {
  int rc;
  if (n == 0) return 0;
  if (n > UINT32_MAX / 4) return st_set_error(ST_EINVAL, "tokenizer: piece of %zu bytes", n);
  if ((rc = grow((void **)&w->word, &w->word_cap, 2 * n, 1)) ||
      (rc = grow((void **)&w->sym, &w->sym_cap, 2 * n, sizeof *w->sym)) ||
      (rc = grow((void **)&w->heap, &w->heap_cap, 6 * n, sizeof *w->heap)) ||
      (rc = grow((void **)&w->key, &w->key_cap, 4 * n + 2, 1)))
    return rc;
  size_t len = 0;
  int32_t ns = 0;
  for (size_t i = 0; i < n; i++) {
    uint16_t cp = t->byte_cp[p[i]];
    w->sym[ns] = (struct symbol){ns - 1, ns + 1, (uint32_t)len, cp < 0x80 ? 1u : 2u};
    if (cp < 0x80)
      w->word[len++] = (char)cp;
    else {
      w->word[len++] = (char)(0xC0 | (cp >> 6));
      w->word[len++] = (char)(0x80 | (cp & 0x3F));
    }
    ns++;
  }
  w->sym[ns - 1].next = -1;
  w->heap_n = 0;
  for (int32_t i = 1; i < ns; i++)
    try_bigram(t, w, i - 1, i);
  while (w->heap_n) {
    struct bigram b = heap_pop(w);
    struct symbol *l = &w->sym[b.left], *r = &w->sym[b.right];
    if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* outdated */
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0) w->sym[r->next].prev = b.left;
    try_bigram(t, w, l->prev, b.left);
    try_bigram(t, w, b.left, l->next);
  }
  for (int32_t i = 0; i >= 0; i = w->sym[i].next) {
    const struct symbol *s = &w->sym[i];
    memcpy(w->key, w->word + s->start, s->n);
    w->key[s->n] = '\0';
    int32_t id = lookup_token(t, w->key);
    if (id >= 0) {
      if ((rc = idvec_push(ids, id))) return rc;
      continue;
    }
    /* Not in the vocabulary: llama.cpp falls back to the tokens of its single bytes. */
    for (uint32_t j = 0; j < s->n; j++) {
      char one[2] = {w->word[s->start + j], '\0'};
      id = lookup_token(t, one);
      if (id >= 0 && (rc = idvec_push(ids, id))) return rc;
    }
  }
  return 0;
}

/* A piece after the pre-tokenizer's regex `level`: split further by the next one, or BPE-encoded. */
static int encode_raw_level(const struct st_tokenizer *t, struct bpe_work *w, pcre2_match_data *md, const char *s, size_t n,
                            struct idvec *ids, int level);

static int piece_out(const struct st_tokenizer *t, struct bpe_work *w, pcre2_match_data *md, const char *s, size_t n,
                     struct idvec *ids, int level) {
  return level + 1 < t->n_re ? encode_raw_level(t, w, md, s, n, ids, level + 1) : bpe_piece(t, w, (const unsigned char *)s, n, ids);
}

/* Splits raw text with the pre-tokenizer's regex `level` into its matches and the text between them
 * (llama.cpp's unicode_regex_split: every piece is kept, and split again by the next regex), then
 * BPE-encodes each piece. Bytes the regex cannot match (invalid UTF-8) form pieces of their own, so
 * they are still encoded byte by byte. */
static int encode_raw_level(const struct st_tokenizer *t, struct bpe_work *w, pcre2_match_data *md, const char *s, size_t n,
                            struct idvec *ids, int level) {
  size_t pos = 0;
  int rc;
  while (pos < n) {
    int m = pcre2_match(t->re[level], (PCRE2_SPTR)s, n, pos, 0, md, NULL);
    if (m == PCRE2_ERROR_NOMATCH) break;
    if (m < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(m, msg, sizeof msg);
      return st_set_error(ST_ERUNTIME, "tokenizer: regex match failed: %s", (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    if (ov[1] <= ov[0]) return st_set_error(ST_ERUNTIME, "tokenizer: empty regex match");
    /* the next level reuses md: the match's bounds first */
    const size_t m0 = ov[0], m1 = ov[1];
    if (m0 > pos && (rc = piece_out(t, w, md, s + pos, m0 - pos, ids, level))) return rc;
    if ((rc = piece_out(t, w, md, s + m0, m1 - m0, ids, level))) return rc;
    pos = m1;
  }
  return pos < n ? piece_out(t, w, md, s + pos, n - pos, ids, level) : 0;
}

static int encode_raw(const struct st_tokenizer *t, struct bpe_work *w, pcre2_match_data *md, const char *s, size_t n,
                      struct idvec *ids) {
  return encode_raw_level(t, w, md, s, n, ids, 0);
}

struct fragment {
  int32_t id; /* -1 for raw text */
  size_t off, len;
};

/* llama.cpp tokenizer_st_partition: each special token, longest first, splits every raw
 * fragment at all its occurrences. */
static int partition_special(const struct st_tokenizer *t, const char *text, size_t len,
                             int parse_special, struct fragment **frag, size_t *nfrag) {
  size_t n = 1, cap = 0;
  struct fragment *f = NULL, *nf = NULL;
  size_t nf_cap = 0;
  int rc = grow((void **)&f, &cap, 1, sizeof *f);
  if (rc) return rc;
  f[0] = (struct fragment){-1, 0, len};
  for (size_t s = 0; s < t->n_special; s++) {
    int32_t id = t->special[s];
    if (!parse_special && t->type[id] != TOK_USER_DEFINED) continue;
    const char *tt = t->text + t->text_off[id];
    size_t tl = tok_len(t, id), m = 0;
    for (size_t i = 0; i < n; i++) {
      if (f[i].id >= 0 || f[i].len < tl) {
        if ((rc = grow((void **)&nf, &nf_cap, m + 1, sizeof *nf))) goto fail;
        nf[m++] = f[i];
        continue;
      }
      size_t off = f[i].off, end = f[i].off + f[i].len;
      const char *hit;
      while (off < end && (hit = memmem(text + off, end - off, tt, tl)) != NULL) {
        size_t h = (size_t)(hit - text);
        if ((rc = grow((void **)&nf, &nf_cap, m + 2, sizeof *nf))) goto fail;
        if (h > off) nf[m++] = (struct fragment){-1, off, h - off};
        nf[m++] = (struct fragment){id, h, tl};
        off = h + tl;
      }
      if (off < end) {
        if ((rc = grow((void **)&nf, &nf_cap, m + 1, sizeof *nf))) goto fail;
        nf[m++] = (struct fragment){-1, off, end - off};
      }
    }
    struct fragment *tmp = f;
    size_t tcap = cap;
    f = nf;
    cap = nf_cap;
    n = m;
    nf = tmp;
    nf_cap = tcap;
  }
  free(nf);
  *frag = f;
  *nfrag = n;
  return 0;
fail:
  free(f);
  free(nf);
  return rc;
}

int st_tokenizer_encode(const struct st_tokenizer *t, const char *text, size_t len,
                        int flags, int32_t **ids, size_t *n) {
  const int parse_special = flags & ST_TOK_SPECIAL;
  *ids = NULL;
  *n = 0;
  if (!t || (!text && len)) return st_set_error(ST_EINVAL, "tokenizer: encode without text");
  struct idvec out = {0};
  struct bpe_work w = {0};
  struct fragment *frag = NULL;
  size_t nfrag = 0;
  pcre2_match_data *md = pcre2_match_data_create(16, NULL); /* the regexes' groups: a few each */
  int rc = md ? 0 : st_set_error(ST_ENOMEM, "tokenizer: out of memory for regex match data");
  if (!rc && (flags & ST_TOK_BOS) && t->bos_add >= 0) rc = idvec_push(&out, t->bos_add);
  if (!rc) rc = partition_special(t, text ? text : "", len, parse_special, &frag, &nfrag);
  for (size_t i = 0; !rc && i < nfrag; i++) {
    if (frag[i].id >= 0)
      rc = idvec_push(&out, frag[i].id);
    else
      rc = encode_raw(t, &w, md, text + frag[i].off, frag[i].len, &out);
  }
  free(frag);
  free(w.word);
  free(w.sym);
  free(w.heap);
  free(w.key);
  pcre2_match_data_free(md);
  if (rc) {
    free(out.v);
    return rc;
  }
  *ids = out.v ? out.v : malloc(sizeof(int32_t)); /* an empty result is still freeable */
  if (!*ids) return st_set_error(ST_ENOMEM, "tokenizer: out of memory");
  *n = out.n;
  return 0;
}

/* ---- queries and decoding ----------------------------------------------------------------- */

int32_t st_tokenizer_n_vocab(const struct st_tokenizer *t) { return t->n_vocab; }
int32_t st_tokenizer_eos(const struct st_tokenizer *t) { return t->eos; }
int32_t st_tokenizer_eot(const struct st_tokenizer *t) { return t->eot; }

int st_tokenizer_is_eog(const struct st_tokenizer *t, int32_t id) {
  for (int i = 0; i < t->n_eog; i++)
    if (t->eog[i] == id) return 1;
  return 0;
}

int st_tokenizer_is_shown(const struct st_tokenizer *t, int32_t id) {
  if (!st_tokenizer_is_special(t, id)) return id >= 0 && id < t->n_vocab;
  for (int i = 0; i < t->n_shown; i++)
    if (t->shown[i] == id) return 1;
  return 0;
}

int st_tokenizer_is_special(const struct st_tokenizer *t, int32_t id) {
  if (id < 0 || id >= t->n_vocab) return 0;
  return t->type[id] == TOK_CONTROL || t->type[id] == TOK_USER_DEFINED;
}

size_t st_tokenizer_max_token_bytes(const struct st_tokenizer *t) { return t->max_bytes; }

int st_tokenizer_token_bytes(const struct st_tokenizer *t, int32_t id, char *buf, size_t cap) {
  if (id < 0 || id >= t->n_vocab)
    return st_set_error(ST_EINVAL, "tokenizer: token id %d outside the %d-token vocabulary", id,
                        t->n_vocab);
  size_t n = t->bytes_off[id + 1] - t->bytes_off[id];
  if (n > cap) n = cap;
  if (n > INT32_MAX) n = INT32_MAX;
  memcpy(buf, t->bytes + t->bytes_off[id], n);
  return (int)n;
}

void st_detok_init(struct st_detok *d, const struct st_tokenizer *t) {
  d->tok = t;
  d->n_pending = 0;
}

/* Output of the detokenizer: at most cap-1 bytes; once a character does not fit, nothing more
 * is written (so the output is always a prefix cut at a character boundary). */
struct sink {
  char *out;
  size_t cap, w;
  int full;
};

static void put(struct sink *k, const void *s, size_t n) {
  if (k->full || k->w + n + 1 > k->cap) {
    k->full = 1;
    return;
  }
  memcpy(k->out + k->w, s, n);
  k->w += n;
}

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Emits the complete characters of s[0..n), replacing invalid subparts with U+FFFD, and returns
 * how many trailing bytes are a valid but incomplete character (to be held back). */
static size_t emit_utf8(const unsigned char *s, size_t n, struct sink *k) {
  size_t i = 0;
  while (i < n) {
    size_t l;
    int r = utf8_check(s + i, n - i, &l);
    if (r == 0) return n - i;
    if (r > 0)
      put(k, s + i, l);
    else
      put(k, replacement, sizeof replacement);
    i += l;
  }
  return 0;
}

size_t st_detok_push(struct st_detok *d, int32_t id, char *out, size_t cap) {
  struct sink k = {out, cap, 0, 0};
  if (cap) out[0] = '\0';
  if (!d->tok || id < 0 || id >= d->tok->n_vocab) return 0;
  const struct st_tokenizer *t = d->tok;
  const unsigned char *b = (const unsigned char *)t->bytes + t->bytes_off[id];
  size_t n = t->bytes_off[id + 1] - t->bytes_off[id], used = 0;
  /* Complete the held-back character with the first bytes of this token. */
  while (d->n_pending && used < n) {
    d->pending[d->n_pending++] = (char)b[used++];
    size_t l;
    int r = utf8_check((const unsigned char *)d->pending, d->n_pending, &l);
    if (r == 0) continue;
    if (r > 0) {
      put(&k, d->pending, l);
      d->n_pending = 0;
    } else {
      /* Invalid: replace the maximal subpart and re-read the rest as new input. */
      put(&k, replacement, sizeof replacement);
      size_t back = d->n_pending - l;
      used -= back;
      d->n_pending = 0;
    }
  }
  if (used < n) {
    size_t hold = emit_utf8(b + used, n - used, &k);
    memcpy(d->pending, b + n - hold, hold);
    d->n_pending = hold;
  }
  if (cap) out[k.w] = '\0';
  return k.w;
}

size_t st_detok_flush(struct st_detok *d, char *out, size_t cap) {
  struct sink k = {out, cap, 0, 0};
  if (d->n_pending) put(&k, replacement, sizeof replacement);
  d->n_pending = 0;
  if (cap) out[k.w] = '\0';
  return k.w;
}
