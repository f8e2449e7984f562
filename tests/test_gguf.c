/* Tests of the GGUF reader and writer (src/io/gguf.h): the fixture models open and carry the
 * expected keys; a file written with every KV kind and F32/BF16/Q8_0 tensors reads back byte for
 * byte; malformed files (built in memory) are refused with the right code and a one-line
 * message naming the file. Exit 0 when every case passes, 1 otherwise. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codelets/quant.h"
#include "common.h"
#include "io/gguf.h"

static int n_pass, n_fail;

static void result(const char *name, int ok, const char *fmt, ...) {
  printf("%-40s %s", name, ok ? "PASS" : "FAIL");
  if (fmt && *fmt) {
    va_list ap;
    va_start(ap, fmt);
    printf("  ");
    vprintf(fmt, ap);
    va_end(ap);
  }
  printf("\n");
  fflush(stdout);
  if (ok) n_pass++;
  else n_fail++;
}

static void skip(const char *name, const char *why) { printf("%-40s SKIP  %s\n", name, why); }

/* ---- a little byte builder for hand-made files ---------------------------------------------- */

struct buf {
  uint8_t *p;
  size_t n, cap;
};

static void put(struct buf *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p + b->n, p, n);
  b->n += n;
}
static void put_u8(struct buf *b, uint8_t v) { put(b, &v, 1); }
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct buf *b, const char *s) {
  put_u64(b, strlen(s));
  put(b, s, strlen(s));
}
static void hdr(struct buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  put(b, "GGUF", 4);
  put_u32(b, version);
  put_u64(b, n_tensors);
  put_u64(b, n_kv);
}
static void kv_u32(struct buf *b, const char *key, uint32_t v) {
  put_str(b, key);
  put_u32(b, ST_GGUF_UINT32);
  put_u32(b, v);
}
static void tinfo(struct buf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                  uint32_t type, uint64_t offset) {
  put_str(b, name);
  put_u32(b, n_dims);
  for (uint32_t i = 0; i < n_dims; i++) put_u64(b, ne[i]);
  put_u32(b, type);
  put_u64(b, offset);
}
static void pad_zeros(struct buf *b, size_t align) {
  while (b->n % align) put_u8(b, 0);
}
static void zeros(struct buf *b, size_t n) {
  for (size_t i = 0; i < n; i++) put_u8(b, 0);
}

/* Opens a copy of exactly `n` bytes (so valgrind/ASan see any over-read). */
static int open_bytes(const void *p, size_t n, const char *name, struct st_gguf **g) {
  void *copy = malloc(n ? n : 1);
  memcpy(copy, p, n);
  int rc = st_gguf_open_buffer(n ? copy : NULL, n, name, g);
  if (rc == 0) {
    st_gguf_close(*g); /* the copy is freed below; callers only need the status */
    *g = NULL;
  }
  free(copy);
  return rc;
}

/* Expects open to fail with `code` and a one-line message naming the file and containing `want`. */
static void expect_bad(const char *case_name, struct buf *b, int code, const char *want) {
  struct st_gguf *g = NULL;
  int rc = open_bytes(b->p, b->n, "bad.gguf", &g);
  const char *msg = st_last_error();
  /* every message names the file: first, or (a tensor type's, st_unsupported_type) as "in FILE" */
  int ok = rc == code && (strncmp(msg, "bad.gguf: ", 10) == 0 || strstr(msg, " in bad.gguf")) && strstr(msg, want) &&
           !strchr(msg, '\n');
  result(case_name, ok, "rc=%d (want %d) msg: %s", rc, code, rc ? msg : "(none)");
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* ---- fixtures -------------------------------------------------------------------------------- */

static const char *fixtures_dir(void) {
  const char *f = getenv("STRATA_FIXTURES");
  return f && *f ? f : "../shared/fixtures";
}

static int str_is(struct st_gguf_str s, const char *z) {
  return s.len == strlen(z) && !memcmp(s.ptr, z, s.len);
}

static void test_fixture(const char *rel, int tiny_model) {
  char path[4096], name[128];
  snprintf(path, sizeof path, "%s/%s", fixtures_dir(), rel);
  snprintf(name, sizeof name, "fixture %s", strrchr(rel, '/') + 1);
  if (access(path, R_OK)) {
    char why[4200];
    snprintf(why, sizeof why, "%s not found (set STRATA_FIXTURES)", path);
    skip(name, why);
    return;
  }
  struct st_gguf *g;
  int rc = st_gguf_open(path, &g);
  if (rc) {
    result(name, 0, "open failed: %s", st_last_error());
    return;
  }
  int ok = 1;
  char detail[512] = "";
  char *arch = NULL;
  if (st_gguf_get_str(g, "general.architecture", &arch) || strcmp(arch, "qwen3moe")) ok = 0;
  uint64_t blocks = 0;
  if (st_gguf_get_u64(g, "qwen3moe.block_count", &blocks) || blocks != 4) ok = 0;
  const struct st_gguf_kv *tok = st_gguf_find_kv(g, "tokenizer.ggml.tokens");
  uint64_t ntok = tok && tok->type == ST_GGUF_ARRAY && tok->v.arr.type == ST_GGUF_STRING ? tok->v.arr.n : 0;
  if (!ntok || !str_is(st_gguf_arr_str(tok, 0), "!")) ok = 0;
  const struct st_gguf_kv *tt = st_gguf_find_kv(g, "tokenizer.ggml.token_type");
  if (!tt || tt->type != ST_GGUF_ARRAY || tt->v.arr.n != ntok || st_gguf_arr_int(tt, 0) != 1) ok = 0;
  float eps = 0;
  if (st_gguf_get_f32(g, "qwen3moe.attention.layer_norm_rms_epsilon", &eps) || fabsf(eps - 1e-6f) > 1e-9f) ok = 0;
  int add_bos = -1;
  if (st_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) || add_bos != 0) ok = 0;
  if (tiny_model == 1 && ntok != 8224) ok = 0;
  if (tiny_model == 0 && (ntok != 151936 || g->n_tensors != 0)) ok = 0;
  if (tiny_model == 1) {
    const struct st_gguf_tensor *t = st_gguf_find_tensor(g, "blk.0.ffn_gate_exps.weight");
    if (!t || t->n_dims != 3 || t->ne[0] != 64 || t->ne[1] != 64 || t->ne[2] != 16) ok = 0;
    const struct st_gguf_tensor *e = st_gguf_find_tensor(g, "token_embd.weight");
    if (!e || e->ne[1] != 8224) ok = 0;
  }
  /* Wrong-type getter: a string read as an integer must fail naming the key. */
  uint64_t dummy;
  if (st_gguf_get_u64(g, "general.architecture", &dummy) != ST_EFORMAT ||
      !strstr(st_last_error(), "general.architecture"))
    ok = 0;
  if (st_gguf_get_u64(g, "no.such.key", &dummy) != ST_EFORMAT || !strstr(st_last_error(), "missing key"))
    ok = 0;
  snprintf(detail, sizeof detail,
           "version %u, n_kv %llu, n_tensors %llu, arch %s, block_count %llu, tokens %llu, data at %llu",
           g->version, (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors,
           arch ? arch : "?", (unsigned long long)blocks, (unsigned long long)ntok,
           (unsigned long long)g->data_offset);
  result(name, ok, "%s", detail);
  free(arch);
  st_gguf_close(g);
}

/* ---- writer round trip ----------------------------------------------------------------------- */

static char tmpdir_path[4096];

static void tmp_path(char *out, size_t n, const char *base) {
  const char *t = getenv("TMPDIR");
  snprintf(out, n, "%s/%s-%ld.gguf", t && *t ? t : "/tmp", base, (long)getpid());
}

static void test_roundtrip(void) {
  char path[4096];
  tmp_path(path, sizeof path, "test_gguf_rt");
  snprintf(tmpdir_path, sizeof tmpdir_path, "%s", path);
  const char *strs[] = {"alpha", "", "g\xc3\xa9n\xc3\xa9ral", "a b"};
  int32_t ints[] = {-5, 0, 7, 2147483647};
  float floats[] = {0.5f, -1.25f, 3e10f};
  uint64_t ne_f32[] = {8, 3}, ne_bf16[] = {16, 2, 2}, ne_q8[] = {64, 3};
  float f32d[24], bf_src[64], q_src[192];
  uint16_t bf16d[64];
  st_block_q8_0 q8d[6];
  for (int i = 0; i < 24; i++) f32d[i] = (float)i * 0.25f - 2.0f;
  for (int i = 0; i < 64; i++) {
    bf_src[i] = sinf((float)i) * 3.0f;
    bf16d[i] = st_f32_to_bf16(bf_src[i]);
  }
  for (int i = 0; i < 192; i++) q_src[i] = cosf((float)i * 0.37f) * 0.8f;
  for (int r = 0; r < 3; r++) st_quantize_row_q8_0(q_src + 64 * r, q8d + 2 * r, 64);

  struct st_gguf_writer *w = st_gguf_writer_new();
  int rc = 0;
  rc |= st_gguf_writer_add_str(w, "general.architecture", "qwen3moe");
  rc |= st_gguf_writer_add_u32(w, "test.u32", 4000000000u);
  rc |= st_gguf_writer_add_f32(w, "test.f32", 1.5e-6f);
  rc |= st_gguf_writer_add_bool(w, "test.bool", 1);
  rc |= st_gguf_writer_add_arr_str(w, "test.arr_str", strs, 4);
  rc |= st_gguf_writer_add_arr_i32(w, "test.arr_i32", ints, 4);
  rc |= st_gguf_writer_add_arr_f32(w, "test.arr_f32", floats, 3);
  rc |= st_gguf_writer_add_arr_str(w, "test.arr_empty", strs, 0);
  int dup = st_gguf_writer_add_u32(w, "test.u32", 1);
  rc |= st_gguf_writer_add_tensor(w, "t.f32", ST_TYPE_F32, 2, ne_f32);
  rc |= st_gguf_writer_add_tensor(w, "t.bf16", ST_TYPE_BF16, 3, ne_bf16);
  rc |= st_gguf_writer_add_tensor(w, "t.q8_0", ST_TYPE_Q8_0, 2, ne_q8);
  int bad_q8 = st_gguf_writer_add_tensor(w, "t.bad", ST_TYPE_Q8_0, 2, (uint64_t[]){33, 1});
  const uint64_t predicted = st_gguf_writer_file_bytes(w);
  rc |= st_gguf_writer_begin(w, path);
  /* F32 streamed in three uneven pieces, BF16 in one call, Q8_0 in two pieces. */
  rc |= st_gguf_writer_write_data(w, f32d, 20);
  rc |= st_gguf_writer_write_data(w, (uint8_t *)f32d + 20, 50);
  rc |= st_gguf_writer_write_data(w, (uint8_t *)f32d + 70, sizeof f32d - 70);
  int short_tensor = st_gguf_writer_write_tensor(w, bf16d, 10);
  rc |= st_gguf_writer_write_tensor(w, bf16d, sizeof bf16d);
  rc |= st_gguf_writer_write_data(w, q8d, 100);
  rc |= st_gguf_writer_write_data(w, (uint8_t *)q8d + 100, sizeof q8d - 100);
  int extra = st_gguf_writer_write_data(w, "x", 1);
  rc |= st_gguf_writer_finish(w);
  st_gguf_writer_free(w);
  result("writer: refuses duplicate key", dup == ST_EINVAL, "%d", dup);
  result("writer: refuses row not multiple of block", bad_q8 == ST_EINVAL, "%d", bad_q8);
  result("writer: refuses partial write_tensor", short_tensor == ST_EINVAL, "%d", short_tensor);
  result("writer: refuses data past last tensor", extra == ST_EINVAL, "%d", extra);
  {
    struct stat sb;
    const int st_ok = stat(path, &sb) == 0;
    result("writer: st_gguf_writer_file_bytes before begin = the finished file's size", st_ok && (uint64_t)sb.st_size == predicted,
           "predicted %llu, file %lld bytes", (unsigned long long)predicted, st_ok ? (long long)sb.st_size : -1LL);
  }
  if (rc) {
    result("writer: round trip", 0, "writer failed: %s", st_last_error());
    return;
  }
  struct st_gguf *g;
  if ((rc = st_gguf_open(path, &g))) {
    result("writer: round trip", 0, "reopen failed: %s", st_last_error());
    return;
  }
  int ok = g->version == 3 && g->alignment == 32 && g->n_kv == 8 && g->n_tensors == 3 &&
           g->data_offset % 32 == 0;
  uint64_t u;
  float f;
  int b;
  char *s = NULL;
  ok &= !st_gguf_get_u64(g, "test.u32", &u) && u == 4000000000u;
  ok &= !st_gguf_get_f32(g, "test.f32", &f) && f == 1.5e-6f;
  ok &= !st_gguf_get_bool(g, "test.bool", &b) && b == 1;
  ok &= !st_gguf_get_str(g, "general.architecture", &s) && !strcmp(s, "qwen3moe");
  free(s);
  const struct st_gguf_kv *kv = st_gguf_find_kv(g, "test.arr_str");
  ok &= kv && kv->v.arr.type == ST_GGUF_STRING && kv->v.arr.n == 4;
  for (int i = 0; kv && i < 4; i++) ok &= str_is(st_gguf_arr_str(kv, (uint64_t)i), strs[i]);
  kv = st_gguf_find_kv(g, "test.arr_i32");
  ok &= kv && kv->v.arr.type == ST_GGUF_INT32 && kv->v.arr.n == 4;
  for (int i = 0; kv && i < 4; i++) ok &= st_gguf_arr_int(kv, (uint64_t)i) == ints[i];
  kv = st_gguf_find_kv(g, "test.arr_f32");
  ok &= kv && kv->v.arr.type == ST_GGUF_FLOAT32 && kv->v.arr.n == 3;
  for (int i = 0; kv && i < 3; i++) ok &= (float)st_gguf_arr_float(kv, (uint64_t)i) == floats[i];
  kv = st_gguf_find_kv(g, "test.arr_empty");
  ok &= kv && kv->v.arr.n == 0;
  int kv_ok = ok;

  const struct st_gguf_tensor *t0 = st_gguf_find_tensor(g, "t.f32");
  const struct st_gguf_tensor *t1 = st_gguf_find_tensor(g, "t.bf16");
  const struct st_gguf_tensor *t2 = st_gguf_find_tensor(g, "t.q8_0");
  int t_ok = t0 && t1 && t2;
  double max_bf = 0, max_q8 = 0;
  if (t_ok) {
    t_ok &= t0->nbytes == sizeof f32d && !memcmp(t0->data, f32d, sizeof f32d) && t0->ne[1] == 3 &&
            t0->ne[2] == 1 && t0->n_dims == 2;
    t_ok &= t1->nbytes == sizeof bf16d && !memcmp(t1->data, bf16d, sizeof bf16d) && t1->n_dims == 3 &&
            t1->ne[2] == 2 && t1->type == ST_TYPE_BF16;
    t_ok &= t2->nbytes == sizeof q8d && !memcmp(t2->data, q8d, sizeof q8d) && t2->type == ST_TYPE_Q8_0;
    t_ok &= t0->offset % 32 == 0 && t1->offset % 32 == 0 && t2->offset % 32 == 0;
    float row[64];
    for (int r = 0; r < 2; r++) {
      st_dequantize_row(ST_TYPE_BF16, (const uint8_t *)t1->data + 32 * r, row, 16);
      for (int i = 0; i < 16; i++) max_bf = fmax(max_bf, fabs(row[i] - bf_src[16 * r + i]));
    }
    for (int r = 0; r < 3; r++) {
      st_dequantize_row(ST_TYPE_Q8_0, (const uint8_t *)t2->data + 68 * r, row, 64);
      for (int i = 0; i < 64; i++) max_q8 = fmax(max_q8, fabs(row[i] - q_src[64 * r + i]));
    }
    t_ok &= max_bf < 0.02 && max_q8 < 0.01;
  }
  result("writer: round trip KVs", kv_ok, "version %u, %llu KVs, alignment %llu, data at %llu",
         g->version, (unsigned long long)g->n_kv, (unsigned long long)g->alignment,
         (unsigned long long)g->data_offset);
  result("writer: round trip tensors", t_ok, "bytes equal; max |bf16-f32| %.4g, max |q8_0-f32| %.4g",
         max_bf, max_q8);
  st_gguf_close(g);
}

/* Every byte-length prefix of the round-trip file must be refused (and not crash). */
static void test_truncation(void) {
  FILE *f = fopen(tmpdir_path, "rb");
  if (!f) {
    skip("truncated at every byte", "round-trip file missing");
    return;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *p = malloc((size_t)n);
  if (fread(p, 1, (size_t)n, f) != (size_t)n) n = 0;
  fclose(f);
  struct st_gguf *g;
  /* Prefixes that only cut the zero padding after the last tensor are valid files. */
  long data_end = 0;
  if (st_gguf_open_buffer(p, (size_t)n, "full.gguf", &g) == 0) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
      long e = (long)(g->data_offset + g->tensor[i].offset + g->tensor[i].nbytes);
      if (e > data_end) data_end = e;
    }
    st_gguf_close(g);
  }
  long refused = 0, bad_code = 0, accepted_tail = 0;
  char first[256] = "", mid[256] = "";
  for (long k = 0; k < n; k++) {
    int rc = open_bytes(p, (size_t)k, "cut.gguf", &g);
    if (k >= data_end && rc == 0) accepted_tail++;
    else if (k < data_end && rc == ST_EFORMAT) refused++;
    else bad_code++;
    if (k == 0) snprintf(first, sizeof first, "%s", st_last_error());
    if (k == 100) snprintf(mid, sizeof mid, "%s", st_last_error());
  }
  int full = open_bytes(p, (size_t)n, "full.gguf", &g);
  result("truncated at every byte", n > 0 && refused == data_end && bad_code == 0 && full == 0,
         "%ld of %ld prefixes refused, %ld accepted (cut in the final padding); [0]: %s; [100]: %s",
         refused, data_end, accepted_tail, first, mid);
  free(p);
  unlink(tmpdir_path);
}

/* ---- malformed inputs -------------------------------------------------------------------------- */

static void test_malformed(void) {
  struct buf b = {0};
  uint64_t ne1[] = {32}, ne2[] = {32, 2};

  expect_bad("empty file", &b, ST_EFORMAT, "empty file");

  put(&b, "GGML", 4), put_u32(&b, 3), put_u64(&b, 0), put_u64(&b, 0);
  expect_bad("wrong magic", &b, ST_EFORMAT, "not a GGUF file");

  hdr(&b, 1, 0, 0);
  expect_bad("version 1", &b, ST_EFORMAT, "version 1");

  hdr(&b, 99, 0, 0);
  expect_bad("version 99", &b, ST_EFORMAT, "version 99");

  hdr(&b, 3, 0, 1ull << 60), zeros(&b, 64);
  expect_bad("huge KV count", &b, ST_EFORMAT, "KV count");

  hdr(&b, 3, 1ull << 60, 0), zeros(&b, 64);
  expect_bad("huge tensor count", &b, ST_EFORMAT, "tensor count");

  hdr(&b, 3, 0, 1), put_u64(&b, 1ull << 60), zeros(&b, 64);
  expect_bad("huge string length (key)", &b, ST_EFORMAT, "string length");

  hdr(&b, 3, 0, 1), put_str(&b, "k"), put_u32(&b, ST_GGUF_STRING), put_u64(&b, ~0ull), zeros(&b, 8);
  expect_bad("huge string length (value)", &b, ST_EFORMAT, "key k");

  hdr(&b, 3, 0, 1), put_str(&b, "arr"), put_u32(&b, ST_GGUF_ARRAY), put_u32(&b, ST_GGUF_UINT32),
      put_u64(&b, 1ull << 60), zeros(&b, 64);
  expect_bad("huge array count", &b, ST_EFORMAT, "key arr: array of 1152921504606846976");

  hdr(&b, 3, 0, 1), put_str(&b, "arr"), put_u32(&b, ST_GGUF_ARRAY), put_u32(&b, ST_GGUF_STRING),
      put_u64(&b, 1ull << 62), zeros(&b, 64);
  expect_bad("huge string array count", &b, ST_EFORMAT, "key arr");

  hdr(&b, 3, 0, 1), put_str(&b, "arr"), put_u32(&b, ST_GGUF_ARRAY), put_u32(&b, ST_GGUF_STRING),
      put_u64(&b, 2), put_str(&b, "ok"), put_u64(&b, 1000), zeros(&b, 16);
  expect_bad("string array element past end", &b, ST_EFORMAT, "element 1 of key arr");

  hdr(&b, 3, 0, 1), put_str(&b, "nest"), put_u32(&b, ST_GGUF_ARRAY), put_u32(&b, ST_GGUF_ARRAY),
      put_u64(&b, 1), put_u32(&b, ST_GGUF_UINT8), put_u64(&b, 1), put_u8(&b, 0), zeros(&b, 16);
  expect_bad("nested array", &b, ST_EFORMAT, "key nest: nested arrays");

  hdr(&b, 3, 0, 1), put_str(&b, "odd"), put_u32(&b, 13), put_u64(&b, 0);
  expect_bad("unknown value type", &b, ST_EFORMAT, "key odd: unknown value type 13");

  hdr(&b, 3, 0, 1), put_str(&b, "odd"), put_u32(&b, ST_GGUF_ARRAY), put_u32(&b, 77), put_u64(&b, 0);
  expect_bad("unknown array element type", &b, ST_EFORMAT, "unknown array element type 77");

  hdr(&b, 3, 0, 2), kv_u32(&b, "twice", 1), kv_u32(&b, "twice", 2);
  expect_bad("duplicate key", &b, ST_EFORMAT, "duplicate key twice");

  hdr(&b, 3, 1, 0), tinfo(&b, "w", 1, ne1, 4, 0), pad_zeros(&b, 32), zeros(&b, 64);
  expect_bad("unknown tensor type (4)", &b, ST_EFORMAT, "unsupported tensor type q4_2 (id 4) for w in");

  hdr(&b, 3, 1, 0), tinfo(&b, "w", 1, ne1, 1000, 0), pad_zeros(&b, 32), zeros(&b, 64);
  expect_bad("unknown tensor type (1000)", &b, ST_EFORMAT, "unsupported tensor type id 1000 (unknown to ggml) for w in");

  hdr(&b, 3, 1, 0), tinfo(&b, "w", 0, NULL, ST_TYPE_F32, 0), zeros(&b, 64);
  expect_bad("0 dims", &b, ST_EFORMAT, "tensor w: 0 dimensions");

  hdr(&b, 3, 1, 0), tinfo(&b, "w", 5, (uint64_t[]){1, 1, 1, 1, 1}, ST_TYPE_F32, 0), zeros(&b, 64);
  expect_bad("5 dims", &b, ST_EFORMAT, "tensor w: 5 dimensions");

  hdr(&b, 3, 1, 0), tinfo(&b, "w", 2, (uint64_t[]){4, 0}, ST_TYPE_F32, 0), zeros(&b, 64);
  expect_bad("zero dim", &b, ST_EFORMAT, "tensor w: dimension 1 is zero");

  hdr(&b, 3, 1, 0), tinfo(&b, "w", 3, (uint64_t[]){1ull << 32, 1ull << 32, 4}, ST_TYPE_F32, 0),
      zeros(&b, 64);
  expect_bad("dims product overflows", &b, ST_EFORMAT, "tensor w: element count overflows");

  hdr(&b, 3, 1, 0), tinfo(&b, "w", 2, (uint64_t[]){1ull << 61, 2}, ST_TYPE_F32, 0), zeros(&b, 64);
  expect_bad("byte size overflows", &b, ST_EFORMAT, "tensor w: byte size overflows");

  hdr(&b, 3, 1, 0), tinfo(&b, "w", 1, (uint64_t[]){33}, ST_TYPE_Q8_0, 0), zeros(&b, 64);
  expect_bad("row not a block multiple", &b, ST_EFORMAT, "not a multiple of q8_0's block");

  hdr(&b, 3, 1, 0), tinfo(&b, "w", 1, ne1, ST_TYPE_F32, 8), pad_zeros(&b, 32), zeros(&b, 256);
  expect_bad("misaligned offset", &b, ST_EFORMAT, "tensor w: offset 8 is not a multiple");

  hdr(&b, 3, 1, 0), tinfo(&b, "blk.0.attn_q.weight", 2, ne2, ST_TYPE_F32, 0), pad_zeros(&b, 32),
      zeros(&b, 200);
  expect_bad("tensor past end of file", &b, ST_EFORMAT,
             "tensor blk.0.attn_q.weight: data [96, 352) extends past end of file (296 bytes)");

  hdr(&b, 3, 1, 0), tinfo(&b, "w", 1, ne1, ST_TYPE_F32, 1ull << 63), pad_zeros(&b, 32), zeros(&b, 200);
  expect_bad("tensor offset far past end", &b, ST_EFORMAT, "tensor w");

  hdr(&b, 3, 2, 0), tinfo(&b, "a", 1, ne1, ST_TYPE_F32, 0), tinfo(&b, "b", 1, ne1, ST_TYPE_F32, 96),
      pad_zeros(&b, 32), zeros(&b, 256);
  expect_bad("two overlapping tensors", &b, ST_EFORMAT, "tensors a [");

  hdr(&b, 3, 2, 0), tinfo(&b, "a", 1, ne1, ST_TYPE_F32, 0), tinfo(&b, "a", 1, ne1, ST_TYPE_F32, 128),
      pad_zeros(&b, 32), zeros(&b, 256);
  expect_bad("duplicate tensor name", &b, ST_EFORMAT, "duplicate tensor name a");

  hdr(&b, 3, 0, 1), kv_u32(&b, "general.alignment", 48);
  expect_bad("alignment not a power of two", &b, ST_EFORMAT, "general.alignment 48 is not a power of two");

  hdr(&b, 3, 0, 1), kv_u32(&b, "general.alignment", 0);
  expect_bad("alignment zero", &b, ST_EFORMAT, "not a power of two");

  hdr(&b, 3, 0, 1), put_str(&b, "general.alignment"), put_u32(&b, ST_GGUF_STRING), put_str(&b, "32");
  expect_bad("alignment of type string", &b, ST_EFORMAT, "general.alignment has type string");

  hdr(&b, 3, 1, 0), tinfo(&b, "bad\nname", 0, NULL, ST_TYPE_F32, 0), zeros(&b, 64);
  expect_bad("newline in a name stays one line", &b, ST_EFORMAT, "bad\\x0aname");
}

/* Every scalar value type decodes; alignment 64 is honoured; version 2 is read. */
static void test_scalar_types(void) {
  struct buf b = {0};
  hdr(&b, 2, 1, 14);
  put_str(&b, "u8"), put_u32(&b, ST_GGUF_UINT8), put_u8(&b, 250);
  put_str(&b, "i8"), put_u32(&b, ST_GGUF_INT8), put_u8(&b, 0xfb);
  put_str(&b, "u16"), put_u32(&b, ST_GGUF_UINT16), put(&b, &(uint16_t){65000}, 2);
  put_str(&b, "i16"), put_u32(&b, ST_GGUF_INT16), put(&b, &(int16_t){-300}, 2);
  put_str(&b, "u32"), put_u32(&b, ST_GGUF_UINT32), put_u32(&b, 4000000000u);
  put_str(&b, "i32"), put_u32(&b, ST_GGUF_INT32), put(&b, &(int32_t){-70000}, 4);
  put_str(&b, "f32"), put_u32(&b, ST_GGUF_FLOAT32), put(&b, &(float){0.25f}, 4);
  put_str(&b, "bool"), put_u32(&b, ST_GGUF_BOOL), put_u8(&b, 1);
  put_str(&b, "str"), put_u32(&b, ST_GGUF_STRING), put_str(&b, "hi");
  put_str(&b, "u64"), put_u32(&b, ST_GGUF_UINT64), put_u64(&b, 1ull << 40);
  put_str(&b, "i64"), put_u32(&b, ST_GGUF_INT64), put(&b, &(int64_t){-(1ll << 40)}, 8);
  put_str(&b, "f64"), put_u32(&b, ST_GGUF_FLOAT64), put(&b, &(double){-2.5}, 8);
  put_str(&b, "arr_u16"), put_u32(&b, ST_GGUF_ARRAY), put_u32(&b, ST_GGUF_UINT16), put_u64(&b, 2),
      put(&b, (uint16_t[]){7, 65535}, 4);
  kv_u32(&b, "general.alignment", 64);
  tinfo(&b, "t", 1, (uint64_t[]){16}, ST_TYPE_F32, 0);
  pad_zeros(&b, 64);
  size_t data_at = b.n;
  for (int i = 0; i < 16; i++) put(&b, &(float){(float)i}, 4);
  struct st_gguf *g = NULL;
  uint8_t *copy = malloc(b.n);
  memcpy(copy, b.p, b.n);
  int rc = st_gguf_open_buffer(copy, b.n, "scalars.gguf", &g);
  int ok = rc == 0;
  if (ok) {
    const struct st_gguf_kv *kv;
    uint64_t u;
    float f;
    ok &= g->version == 2 && g->alignment == 64 && g->data_offset == data_at;
    ok &= !st_gguf_get_u64(g, "u8", &u) && u == 250;
    ok &= (kv = st_gguf_find_kv(g, "i8")) && kv->v.i64 == -5;
    ok &= st_gguf_get_u64(g, "i8", &u) == ST_EFORMAT; /* negative */
    ok &= !st_gguf_get_u64(g, "u16", &u) && u == 65000;
    ok &= (kv = st_gguf_find_kv(g, "i16")) && kv->v.i64 == -300;
    ok &= !st_gguf_get_u64(g, "u32", &u) && u == 4000000000u;
    ok &= (kv = st_gguf_find_kv(g, "i32")) && kv->v.i64 == -70000;
    ok &= !st_gguf_get_f32(g, "f32", &f) && f == 0.25f;
    ok &= (kv = st_gguf_find_kv(g, "bool")) && kv->v.u64 == 1;
    ok &= (kv = st_gguf_find_kv(g, "str")) && str_is(kv->v.str, "hi");
    ok &= !st_gguf_get_u64(g, "u64", &u) && u == 1ull << 40;
    ok &= (kv = st_gguf_find_kv(g, "i64")) && kv->v.i64 == -(1ll << 40);
    ok &= !st_gguf_get_f32(g, "f64", &f) && f == -2.5f;
    ok &= (kv = st_gguf_find_kv(g, "arr_u16")) && st_gguf_arr_int(kv, 1) == 65535 &&
          st_gguf_arr_float(kv, 0) == 7.0;
    ok &= st_gguf_get_bool(g, "u8", &(int){0}) == ST_EFORMAT;
    const struct st_gguf_tensor *t = st_gguf_find_tensor(g, "t");
    ok &= t && ((const float *)t->data)[15] == 15.0f;
    ok &= st_gguf_find_tensor(g, "nope") == NULL;
    st_gguf_close(g);
  }
  result("every scalar type, v2, alignment 64", ok, "rc=%d %s", rc, rc ? st_last_error() : "");
  free(copy);
  free(b.p);
}

static void test_open_errors(void) {
  struct st_gguf *g;
  int rc = st_gguf_open("/nonexistent/x.gguf", &g);
  result("missing file", rc == ST_EIO && strstr(st_last_error(), "/nonexistent/x.gguf"), "%s",
         st_last_error());
  char path[4096];
  tmp_path(path, sizeof path, "test_gguf_empty");
  FILE *f = fopen(path, "wb");
  if (f) fclose(f);
  rc = st_gguf_open(path, &g);
  result("empty file on disk", rc == ST_EFORMAT && strstr(st_last_error(), "empty file"), "%s",
         st_last_error());
  unlink(path);
}

int main(void) {
  test_fixture("models/tiny-qwen3moe-bf16.gguf", 1);
  test_fixture("models/tiny-qwen3moe-q8_0.gguf", 1);
  test_fixture("models/small-qwen3moe-q4_k_m.gguf", 2);
  test_fixture("tokenizer/vocab-qwen3.gguf", 0);
  test_roundtrip();
  test_truncation();
  test_scalar_types();
  test_open_errors();
  test_malformed();
  printf("test_gguf: %d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
