/* GGUF reader and writer (gguf.h). The reader maps a file read-only and validates everything
 * before handing out pointers into the mapping: every count and length is checked against the
 * bytes left in the file before anything is allocated, so a hostile file fails fast with a
 * one-line message instead of asking for terabytes. Format: ggml docs/gguf.md, versions 2 and 3
 * (version 1 used 32-bit counts and is refused). */
#include "io/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codelets/quant.h"
#include "common.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_SHOWN_NAME 96 /* longest key / tensor name quoted in a message */

/* The handle with what the public struct does not need to show. */
struct gguf_priv {
  struct st_gguf pub;
  int mapped;                   /* pub.map came from mmap (st_gguf_open) */
  struct st_gguf_str **str_idx; /* per KV: index of a string array's elements, else NULL */
};

/* Bytes of one element of a fixed-size value type; 0 for string/array/unknown. */
static size_t vtype_size(uint32_t t) {
  switch (t) {
  case ST_GGUF_UINT8:
  case ST_GGUF_INT8:
  case ST_GGUF_BOOL: return 1;
  case ST_GGUF_UINT16:
  case ST_GGUF_INT16: return 2;
  case ST_GGUF_UINT32:
  case ST_GGUF_INT32:
  case ST_GGUF_FLOAT32: return 4;
  case ST_GGUF_UINT64:
  case ST_GGUF_INT64:
  case ST_GGUF_FLOAT64: return 8;
  default: return 0;
  }
}

const char *st_gguf_vtype_name(uint32_t type) {
  static const char *const names[] = {"uint8",  "int8",  "uint16", "int16",  "uint32",
                                      "int32",  "float32", "bool", "string", "array",
                                      "uint64", "int64", "float64"};
  return type < sizeof names / sizeof names[0] ? names[type] : "unknown";
}

/* Copies a name from the file into `buf` for a message: non-printable bytes escaped, long names
 * cut, so that the message stays one line whatever the file holds. */
static const char *shown(char *buf, size_t bufsz, const char *p, uint64_t len) {
  size_t o = 0;
  for (uint64_t i = 0; i < len && o + 8 < bufsz; i++) {
    unsigned char c = (unsigned char)p[i];
    if (i >= GGUF_MAX_SHOWN_NAME) {
      memcpy(buf + o, "...", 3);
      o += 3;
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      buf[o++] = (char)c;
    } else if (c >= 0x80) {
      buf[o++] = (char)c; /* UTF-8 bytes are kept; they never contain a newline */
    } else {
      o += (size_t)snprintf(buf + o, bufsz - o, "\\x%02x", c);
    }
  }
  buf[o] = 0;
  return buf;
}

/* ---- Reader ---------------------------------------------------------------------------------- */

struct cursor {
  const uint8_t *base;
  size_t size, pos;
  const char *name; /* file name for messages */
  const char *what; /* what is being read, for truncation messages */
};

static size_t left(const struct cursor *c) { return c->size - c->pos; }

static int truncated(const struct cursor *c, size_t need) {
  return st_set_error(ST_EFORMAT, "%s: truncated at byte %zu reading %s (need %zu bytes, %zu left)",
                      c->name, c->pos, c->what, need, left(c));
}

static int rd_bytes(struct cursor *c, void *dst, size_t n) {
  if (left(c) < n) return truncated(c, n);
  memcpy(dst, c->base + c->pos, n);
  c->pos += n;
  return 0;
}

static int rd_u32(struct cursor *c, uint32_t *v) { return rd_bytes(c, v, 4); }
static int rd_u64(struct cursor *c, uint64_t *v) { return rd_bytes(c, v, 8); }

static int rd_str(struct cursor *c, struct st_gguf_str *s) {
  uint64_t len = 0;
  int rc = rd_u64(c, &len);
  if (rc) return rc;
  if (len > left(c))
    return st_set_error(ST_EFORMAT,
                        "%s: string length %llu at byte %zu (%s) exceeds the %zu bytes left in the file",
                        c->name, (unsigned long long)len, c->pos - 8, c->what, left(c));
  s->len = len;
  s->ptr = (const char *)c->base + c->pos;
  c->pos += (size_t)len;
  return 0;
}

/* Decodes one scalar of type t at the cursor into kv->v. */
static void decode_scalar(uint32_t t, const uint8_t *p, struct st_gguf_kv *kv) {
  switch (t) {
  case ST_GGUF_UINT8: kv->v.u64 = p[0]; break;
  case ST_GGUF_INT8: kv->v.i64 = (int8_t)p[0]; break;
  case ST_GGUF_BOOL: kv->v.u64 = p[0] != 0; break;
  case ST_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u64 = x; break; }
  case ST_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i64 = x; break; }
  case ST_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u64 = x; break; }
  case ST_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i64 = x; break; }
  case ST_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f64 = x; break; }
  case ST_GGUF_UINT64: memcpy(&kv->v.u64, p, 8); break;
  case ST_GGUF_INT64: memcpy(&kv->v.i64, p, 8); break;
  case ST_GGUF_FLOAT64: memcpy(&kv->v.f64, p, 8); break;
  default: ST_ASSERT(!"decode_scalar: not a scalar type");
  }
}

static int rd_kv(struct gguf_priv *gp, struct cursor *c, uint64_t idx) {
  struct st_gguf_kv *kv = &gp->pub.kv[idx];
  char nb[GGUF_MAX_SHOWN_NAME * 4 + 16];
  char what[sizeof nb + 48];
  snprintf(what, sizeof what, "key of KV %llu", (unsigned long long)idx);
  c->what = what;
  int rc = rd_str(c, &kv->key);
  if (rc) return rc;
  shown(nb, sizeof nb, kv->key.ptr, kv->key.len);
  snprintf(what, sizeof what, "value of key %s", nb);
  if ((rc = rd_u32(c, &kv->type))) return rc;
  uint32_t t = kv->type;
  if (t == ST_GGUF_STRING) return rd_str(c, &kv->v.str);
  if (t == ST_GGUF_ARRAY) {
    uint32_t et;
    uint64_t n;
    if ((rc = rd_u32(c, &et)) || (rc = rd_u64(c, &n))) return rc;
    if (et == ST_GGUF_ARRAY)
      return st_set_error(ST_EFORMAT, "%s: key %s: nested arrays are not supported", c->name, nb);
    size_t es = et == ST_GGUF_STRING ? 8 : vtype_size(et);
    if (!es)
      return st_set_error(ST_EFORMAT, "%s: key %s: unknown array element type %u", c->name, nb,
                          et);
    if (n > left(c) / es)
      return st_set_error(ST_EFORMAT,
                          "%s: key %s: array of %llu %s elements exceeds the %zu bytes left in the file",
                          c->name, nb, (unsigned long long)n, st_gguf_vtype_name(et), left(c));
    kv->v.arr.type = et;
    kv->v.arr.n = n;
    kv->v.arr.data = c->base + c->pos;
    if (et != ST_GGUF_STRING) {
      c->pos += (size_t)(n * es);
      return 0;
    }
    /* n <= bytes left / 8, so the index is at most twice the file size. */
    struct st_gguf_str *ix = malloc((n ? n : 1) * sizeof *ix);
    if (!ix)
      return st_set_error(ST_ENOMEM, "%s: key %s: out of memory indexing %llu strings", c->name,
                          nb, (unsigned long long)n);
    gp->str_idx[idx] = ix;
    kv->v.arr.data = (const uint8_t *)ix;
    for (uint64_t i = 0; i < n; i++) {
      snprintf(what, sizeof what, "element %llu of key %s", (unsigned long long)i, nb);
      if ((rc = rd_str(c, &ix[i]))) return rc;
    }
    return 0;
  }
  size_t es = vtype_size(t);
  if (!es) return st_set_error(ST_EFORMAT, "%s: key %s: unknown value type %u", c->name, nb, t);
  if (left(c) < es) return truncated(c, es);
  decode_scalar(t, c->base + c->pos, kv);
  c->pos += es;
  return 0;
}

static int rd_tensor_info(struct st_gguf *g, struct cursor *c, uint64_t idx) {
  struct st_gguf_tensor *t = &g->tensor[idx];
  char nb[GGUF_MAX_SHOWN_NAME * 4 + 16];
  char what[sizeof nb + 48];
  snprintf(what, sizeof what, "name of tensor info %llu", (unsigned long long)idx);
  c->what = what;
  int rc = rd_str(c, &t->name);
  if (rc) return rc;
  shown(nb, sizeof nb, t->name.ptr, t->name.len);
  snprintf(what, sizeof what, "info of tensor %s", nb);
  if ((rc = rd_u32(c, &t->n_dims))) return rc;
  if (t->n_dims < 1 || t->n_dims > ST_GGUF_MAX_DIMS)
    return st_set_error(ST_EFORMAT, "%s: tensor %s: %u dimensions (must be 1..%d)", c->name, nb,
                        t->n_dims, ST_GGUF_MAX_DIMS);
  uint64_t nel = 1;
  for (uint32_t d = 0; d < ST_GGUF_MAX_DIMS; d++) {
    t->ne[d] = 1;
    if (d >= t->n_dims) continue;
    if ((rc = rd_u64(c, &t->ne[d]))) return rc;
    if (t->ne[d] == 0)
      return st_set_error(ST_EFORMAT, "%s: tensor %s: dimension %u is zero", c->name, nb, d);
    if (t->ne[d] > (uint64_t)INT64_MAX / nel)
      return st_set_error(ST_EFORMAT, "%s: tensor %s: element count overflows (dimension %u = %llu)",
                          c->name, nb, d, (unsigned long long)t->ne[d]);
    nel *= t->ne[d];
  }
  if ((rc = rd_u32(c, &t->type)) || (rc = rd_u64(c, &t->offset))) return rc;
  const struct st_type_info *ti = st_type_info(t->type);
  if (!ti->type_size)
    return st_unsupported_type(ST_EFORMAT, t->type, nb, c->name, "its block size is not known, so the file cannot be read");
  uint64_t rb = st_row_bytes(t->type, t->ne[0]);
  if (!rb)
    return st_set_error(ST_EFORMAT, "%s: tensor %s: row length %llu is not a multiple of %s's block of %u",
                        c->name, nb, (unsigned long long)t->ne[0], ti->name, ti->blck_size);
  uint64_t rows = nel / t->ne[0];
  if (rb > UINT64_MAX / rows)
    return st_set_error(ST_EFORMAT, "%s: tensor %s: byte size overflows", c->name, nb);
  t->nbytes = rb * rows;
  return 0;
}

static int cmp_str(const struct st_gguf_str *a, const struct st_gguf_str *b) {
  uint64_t n = a->len < b->len ? a->len : b->len;
  int r = n ? memcmp(a->ptr, b->ptr, (size_t)n) : 0;
  if (r) return r;
  return a->len < b->len ? -1 : a->len > b->len;
}

static int cmp_tensor_name(const void *a, const void *b) {
  return cmp_str(&(*(const struct st_gguf_tensor *const *)a)->name,
                 &(*(const struct st_gguf_tensor *const *)b)->name);
}

static int cmp_kv_key(const void *a, const void *b) {
  return cmp_str(&(*(const struct st_gguf_kv *const *)a)->key,
                 &(*(const struct st_gguf_kv *const *)b)->key);
}

static int cmp_tensor_offset(const void *a, const void *b) {
  const struct st_gguf_tensor *x = *(const struct st_gguf_tensor *const *)a;
  const struct st_gguf_tensor *y = *(const struct st_gguf_tensor *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Tensor layout checks: alignment, inside the file, no overlap, unique names. */
static int check_tensors(struct st_gguf *g, const char *name) {
  char nb[GGUF_MAX_SHOWN_NAME * 4 + 16], nb2[sizeof nb];
  uint64_t n = g->n_tensors;
  if (!n) return 0;
  if (g->data_offset > g->size)
    return st_set_error(ST_EFORMAT, "%s: tensor data section starts at byte %llu, past end of file (%zu bytes)",
                        name, (unsigned long long)g->data_offset, g->size);
  uint64_t avail = g->size - g->data_offset;
  for (uint64_t i = 0; i < n; i++) {
    struct st_gguf_tensor *t = &g->tensor[i];
    shown(nb, sizeof nb, t->name.ptr, t->name.len);
    if (t->offset % g->alignment)
      return st_set_error(ST_EFORMAT, "%s: tensor %s: offset %llu is not a multiple of the alignment %llu",
                          name, nb, (unsigned long long)t->offset, (unsigned long long)g->alignment);
    if (t->offset > avail || t->nbytes > avail - t->offset) {
      if (t->offset > UINT64_MAX - g->data_offset || t->nbytes > UINT64_MAX - g->data_offset - t->offset)
        return st_set_error(ST_EFORMAT, "%s: tensor %s: data offset %llu + %llu bytes is past end of file (%zu bytes)",
                            name, nb, (unsigned long long)t->offset, (unsigned long long)t->nbytes, g->size);
      return st_set_error(ST_EFORMAT, "%s: tensor %s: data [%llu, %llu) extends past end of file (%zu bytes)",
                          name, nb, (unsigned long long)(g->data_offset + t->offset),
                          (unsigned long long)(g->data_offset + t->offset + t->nbytes), g->size);
    }
    t->data = (const uint8_t *)g->map + g->data_offset + t->offset;
  }
  struct st_gguf_tensor **ord = malloc(n * sizeof *ord);
  if (!ord) return st_set_error(ST_ENOMEM, "%s: out of memory sorting %llu tensors", name, (unsigned long long)n);
  for (uint64_t i = 0; i < n; i++) ord[i] = &g->tensor[i];
  int rc = 0;
  qsort(ord, n, sizeof *ord, cmp_tensor_name);
  for (uint64_t i = 1; i < n && !rc; i++)
    if (!cmp_str(&ord[i - 1]->name, &ord[i]->name))
      rc = st_set_error(ST_EFORMAT, "%s: duplicate tensor name %s", name,
                        shown(nb, sizeof nb, ord[i]->name.ptr, ord[i]->name.len));
  qsort(ord, n, sizeof *ord, cmp_tensor_offset);
  for (uint64_t i = 1; i < n && !rc; i++) {
    const struct st_gguf_tensor *a = ord[i - 1], *b = ord[i];
    if (a->offset + a->nbytes > b->offset)
      rc = st_set_error(ST_EFORMAT, "%s: tensors %s [%llu, %llu) and %s [%llu, %llu) overlap", name,
                        shown(nb, sizeof nb, a->name.ptr, a->name.len),
                        (unsigned long long)(g->data_offset + a->offset),
                        (unsigned long long)(g->data_offset + a->offset + a->nbytes),
                        shown(nb2, sizeof nb2, b->name.ptr, b->name.len),
                        (unsigned long long)(g->data_offset + b->offset),
                        (unsigned long long)(g->data_offset + b->offset + b->nbytes));
  }
  free(ord);
  return rc;
}

static int check_kvs(struct st_gguf *g, const char *name) {
  char nb[GGUF_MAX_SHOWN_NAME * 4 + 16];
  uint64_t n = g->n_kv;
  if (!n) return 0;
  const struct st_gguf_kv **ord = malloc(n * sizeof *ord);
  if (!ord) return st_set_error(ST_ENOMEM, "%s: out of memory sorting %llu keys", name, (unsigned long long)n);
  for (uint64_t i = 0; i < n; i++) ord[i] = &g->kv[i];
  qsort(ord, n, sizeof *ord, cmp_kv_key);
  int rc = 0;
  for (uint64_t i = 1; i < n && !rc; i++)
    if (!cmp_str(&ord[i - 1]->key, &ord[i]->key))
      rc = st_set_error(ST_EFORMAT, "%s: duplicate key %s", name,
                        shown(nb, sizeof nb, ord[i]->key.ptr, ord[i]->key.len));
  free(ord);
  return rc;
}

static int parse(struct gguf_priv *gp, const char *name) {
  struct st_gguf *g = &gp->pub;
  struct cursor c = {g->map, g->size, 0, name, "header"};
  if (g->size == 0) return st_set_error(ST_EFORMAT, "%s: empty file", name);
  char magic[4];
  if (g->size < 4)
    return st_set_error(ST_EFORMAT, "%s: not a GGUF file (%zu bytes, too short for the magic)", name, g->size);
  rd_bytes(&c, magic, 4);
  if (memcmp(magic, "GGUF", 4))
    return st_set_error(ST_EFORMAT, "%s: not a GGUF file (magic %02x %02x %02x %02x, expected \"GGUF\")",
                        name, (unsigned char)magic[0], (unsigned char)magic[1],
                        (unsigned char)magic[2], (unsigned char)magic[3]);
  int rc;
  if ((rc = rd_u32(&c, &g->version))) return rc;
  if (g->version == 1)
    return st_set_error(ST_EFORMAT, "%s: GGUF version 1 is not supported (only versions 2 and 3); "
                                    "convert the file with a current llama.cpp", name);
  if (g->version != 2 && g->version != 3)
    return st_set_error(ST_EFORMAT, "%s: unsupported GGUF version %u (only versions 2 and 3)%s", name,
                        g->version, (g->version & 0xffff) == 0 ? "; a big-endian file?" : "");
  if ((rc = rd_u64(&c, &g->n_tensors)) || (rc = rd_u64(&c, &g->n_kv))) return rc;
  /* A KV takes at least 8 (key length) + 4 (type) + 1 (smallest value) bytes; a tensor info at
   * least 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset). */
  if (g->n_kv > left(&c) / 13)
    return st_set_error(ST_EFORMAT, "%s: KV count %llu cannot fit in the %zu bytes left in the file",
                        name, (unsigned long long)g->n_kv, left(&c));
  if (g->n_tensors > left(&c) / 32)
    return st_set_error(ST_EFORMAT, "%s: tensor count %llu cannot fit in the %zu bytes left in the file",
                        name, (unsigned long long)g->n_tensors, left(&c));
  if (g->n_kv * 13 + g->n_tensors * 32 > left(&c))
    return st_set_error(ST_EFORMAT, "%s: %llu KVs and %llu tensor infos cannot fit in the %zu bytes left in the file",
                        name, (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, left(&c));
  g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
  gp->str_idx = calloc(g->n_kv ? g->n_kv : 1, sizeof *gp->str_idx);
  g->tensor = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensor);
  if (!g->kv || !gp->str_idx || !g->tensor) return st_set_error(ST_ENOMEM, "%s: out of memory", name);
  for (uint64_t i = 0; i < g->n_kv; i++)
    if ((rc = rd_kv(gp, &c, i))) return rc;
  if ((rc = check_kvs(g, name))) return rc;
  g->alignment = GGUF_DEFAULT_ALIGNMENT;
  const struct st_gguf_kv *al = st_gguf_find_kv(g, "general.alignment");
  if (al) {
    uint64_t a;
    if (st_gguf_get_u64(g, "general.alignment", &a))
      return st_set_error(ST_EFORMAT, "%s: general.alignment has type %s, expected an integer", name,
                          st_gguf_vtype_name(al->type));
    if (a == 0 || (a & (a - 1)))
      return st_set_error(ST_EFORMAT, "%s: general.alignment %llu is not a power of two", name,
                          (unsigned long long)a);
    g->alignment = a;
  }
  for (uint64_t i = 0; i < g->n_tensors; i++)
    if ((rc = rd_tensor_info(g, &c, i))) return rc;
  uint64_t pos = c.pos;
  if (pos > UINT64_MAX - (g->alignment - 1))
    return st_set_error(ST_EFORMAT, "%s: general.alignment %llu too large", name, (unsigned long long)g->alignment);
  g->data_offset = (pos + g->alignment - 1) / g->alignment * g->alignment;
  return check_tensors(g, name);
}

static void free_handle(struct gguf_priv *gp) {
  if (!gp) return;
  struct st_gguf *g = &gp->pub;
  if (gp->str_idx)
    for (uint64_t i = 0; i < g->n_kv; i++) free(gp->str_idx[i]);
  free(gp->str_idx);
  free(g->kv);
  free(g->tensor);
  if (gp->mapped && g->map) munmap(g->map, g->size);
  free(g->path);
  free(gp);
}

static int open_common(struct gguf_priv *gp, const char *name, struct st_gguf **out) {
  int rc = parse(gp, name);
  if (rc) {
    free_handle(gp);
    return rc;
  }
  *out = &gp->pub;
  return 0;
}

int st_gguf_open_buffer(const void *buf, size_t size, const char *name, struct st_gguf **out) {
  *out = NULL;
  if (!name) name = "<buffer>";
  struct gguf_priv *gp = calloc(1, sizeof *gp);
  if (!gp || !(gp->pub.path = strdup(name))) {
    free(gp);
    return st_set_error(ST_ENOMEM, "%s: out of memory", name);
  }
  gp->pub.map = (void *)buf;
  gp->pub.size = buf ? size : 0;
  return open_common(gp, gp->pub.path, out);
}

int st_gguf_open(const char *path, struct st_gguf **out) {
  *out = NULL;
  int fd = st_open_regular(path); /* never blocks on a FIFO */
  if (fd < 0) return ST_EIO;
  struct stat st;
  if (fstat(fd, &st)) {
    int e = errno;
    close(fd);
    return st_set_error(ST_EIO, "%s: cannot stat: %s", path, strerror(e));
  }
  struct gguf_priv *gp = calloc(1, sizeof *gp);
  if (!gp || !(gp->pub.path = strdup(path))) {
    free(gp);
    close(fd);
    return st_set_error(ST_ENOMEM, "%s: out of memory", path);
  }
  gp->pub.size = (size_t)st.st_size;
  if (gp->pub.size) {
    void *m = mmap(NULL, gp->pub.size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      close(fd);
      free_handle(gp);
      return st_set_error(ST_EIO, "%s: cannot map %zu bytes: %s", path, (size_t)st.st_size, strerror(e));
    }
    gp->pub.map = m;
    gp->mapped = 1;
  }
  close(fd);
  return open_common(gp, gp->pub.path, out);
}

void st_gguf_close(struct st_gguf *g) {
  /* pub is the first member of gguf_priv */
  free_handle((struct gguf_priv *)g);
}

/* The pages of [p, p + n) inside g's file mapping: those wholly inside (inward) or every one it
 * touches, as [*a, *b). 0 when there are none (a buffer handle, a range outside the mapping). */
static int map_pages(const struct st_gguf *g, const void *p, size_t n, int inward, uintptr_t *a, uintptr_t *b) {
  const struct gguf_priv *gp = (const struct gguf_priv *)g;
  if (!gp->mapped || !g->map) return 0;
  const uintptr_t lo = (uintptr_t)g->map, hi = lo + g->size, page = (uintptr_t)sysconf(_SC_PAGESIZE);
  *a = (uintptr_t)p, *b = *a + n;
  if (*a < lo || *b > hi || *b <= *a) return 0;
  *a = inward ? (*a + page - 1) & ~(page - 1) : *a & ~(page - 1);
  if (inward) *b &= ~(page - 1);
  return *b > *a;
}

int st_gguf_release_pages(const struct st_gguf *g, const void *p, size_t n) {
  uintptr_t a, b;
  return map_pages(g, p, n, 1, &a, &b) && madvise((void *)a, b - a, MADV_DONTNEED) ? errno : 0;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

int st_gguf_populate(const struct st_gguf *g, const void *p, size_t n) {
  uintptr_t a, b;
  return map_pages(g, p, n, 0, &a, &b) && madvise((void *)a, b - a, MADV_POPULATE_READ) ? errno : 0;
}

static int str_eq(struct st_gguf_str s, const char *z) {
  size_t n = strlen(z);
  return s.len == n && !memcmp(s.ptr, z, n);
}

const struct st_gguf_kv *st_gguf_find_kv(const struct st_gguf *g, const char *key) {
  for (uint64_t i = 0; i < g->n_kv; i++)
    if (str_eq(g->kv[i].key, key)) return &g->kv[i];
  return NULL;
}

const struct st_gguf_tensor *st_gguf_find_tensor(const struct st_gguf *g, const char *name) {
  for (uint64_t i = 0; i < g->n_tensors; i++)
    if (str_eq(g->tensor[i].name, name)) return &g->tensor[i];
  return NULL;
}

static int is_signed(uint32_t t) {
  return t == ST_GGUF_INT8 || t == ST_GGUF_INT16 || t == ST_GGUF_INT32 || t == ST_GGUF_INT64;
}
static int is_unsigned(uint32_t t) {
  return t == ST_GGUF_UINT8 || t == ST_GGUF_UINT16 || t == ST_GGUF_UINT32 || t == ST_GGUF_UINT64;
}

static int missing(const struct st_gguf *g, const char *key) {
  return st_set_error(ST_EFORMAT, "%s: missing key %s", g->path, key);
}

static int wrong_type(const struct st_gguf *g, const char *key, uint32_t t, const char *want) {
  return st_set_error(ST_EFORMAT, "%s: key %s has type %s, expected %s", g->path, key,
                      st_gguf_vtype_name(t), want);
}

int st_gguf_get_u64(const struct st_gguf *g, const char *key, uint64_t *out) {
  const struct st_gguf_kv *kv = st_gguf_find_kv(g, key);
  if (!kv) return missing(g, key);
  if (is_unsigned(kv->type)) {
    *out = kv->v.u64;
    return 0;
  }
  if (is_signed(kv->type)) {
    if (kv->v.i64 < 0)
      return st_set_error(ST_EFORMAT, "%s: key %s is negative (%lld)", g->path, key, (long long)kv->v.i64);
    *out = (uint64_t)kv->v.i64;
    return 0;
  }
  return wrong_type(g, key, kv->type, "an integer");
}

int st_gguf_get_f32(const struct st_gguf *g, const char *key, float *out) {
  const struct st_gguf_kv *kv = st_gguf_find_kv(g, key);
  if (!kv) return missing(g, key);
  if (kv->type != ST_GGUF_FLOAT32 && kv->type != ST_GGUF_FLOAT64)
    return wrong_type(g, key, kv->type, "float32 or float64");
  double d = kv->v.f64; /* float64 beyond float's range becomes +-inf rather than UB */
  *out = d > FLT_MAX ? INFINITY : d < -FLT_MAX ? -INFINITY : (float)d;
  return 0;
}

int st_gguf_get_bool(const struct st_gguf *g, const char *key, int *out) {
  const struct st_gguf_kv *kv = st_gguf_find_kv(g, key);
  if (!kv) return missing(g, key);
  if (kv->type != ST_GGUF_BOOL) return wrong_type(g, key, kv->type, "bool");
  *out = kv->v.u64 != 0;
  return 0;
}

int st_gguf_get_str(const struct st_gguf *g, const char *key, char **out) {
  const struct st_gguf_kv *kv = st_gguf_find_kv(g, key);
  if (!kv) return missing(g, key);
  if (kv->type != ST_GGUF_STRING) return wrong_type(g, key, kv->type, "string");
  char *s = malloc((size_t)kv->v.str.len + 1);
  if (!s) return st_set_error(ST_ENOMEM, "%s: key %s: out of memory", g->path, key);
  memcpy(s, kv->v.str.ptr, (size_t)kv->v.str.len);
  s[kv->v.str.len] = 0;
  *out = s;
  return 0;
}

/* For arrays of strings, arr.data points at the index of st_gguf_str built while the elements
 * were checked (owned by the handle), so element access is O(1). */
struct st_gguf_str st_gguf_arr_str(const struct st_gguf_kv *kv, uint64_t i) {
  ST_ASSERT(kv->type == ST_GGUF_ARRAY && kv->v.arr.type == ST_GGUF_STRING && i < kv->v.arr.n);
  return ((const struct st_gguf_str *)(const void *)kv->v.arr.data)[i];
}

int64_t st_gguf_arr_int(const struct st_gguf_kv *kv, uint64_t i) {
  ST_ASSERT(kv->type == ST_GGUF_ARRAY && i < kv->v.arr.n);
  const uint8_t *p = kv->v.arr.data + i * vtype_size(kv->v.arr.type);
  struct st_gguf_kv tmp;
  switch (kv->v.arr.type) {
  case ST_GGUF_FLOAT32:
  case ST_GGUF_FLOAT64: /* truncated toward zero, saturated; NaN gives 0 */
    decode_scalar(kv->v.arr.type, p, &tmp);
    if (!(tmp.v.f64 == tmp.v.f64)) return 0;
    if (tmp.v.f64 >= 9223372036854775807.0) return INT64_MAX;
    if (tmp.v.f64 <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)tmp.v.f64;
  case ST_GGUF_STRING: ST_ASSERT(!"st_gguf_arr_int on an array of strings"); return 0;
  default: decode_scalar(kv->v.arr.type, p, &tmp); return tmp.v.i64;
  }
}

double st_gguf_arr_float(const struct st_gguf_kv *kv, uint64_t i) {
  ST_ASSERT(kv->type == ST_GGUF_ARRAY && i < kv->v.arr.n);
  const uint8_t *p = kv->v.arr.data + i * vtype_size(kv->v.arr.type);
  struct st_gguf_kv tmp;
  switch (kv->v.arr.type) {
  case ST_GGUF_FLOAT32:
  case ST_GGUF_FLOAT64: decode_scalar(kv->v.arr.type, p, &tmp); return tmp.v.f64;
  case ST_GGUF_STRING: ST_ASSERT(!"st_gguf_arr_float on an array of strings"); return 0;
  default:
    decode_scalar(kv->v.arr.type, p, &tmp);
    return is_signed(kv->v.arr.type) ? (double)tmp.v.i64 : (double)tmp.v.u64;
  }
}

/* ---- Writer ---------------------------------------------------------------------------------- */

#define GGUF_WRITE_BUFFER (8u << 20) /* stdio buffer: large sequential writes */

struct wtensor {
  char *name;
  uint32_t type, n_dims;
  uint64_t ne[ST_GGUF_MAX_DIMS];
  uint64_t nbytes, offset;
};

struct st_gguf_writer {
  uint8_t *kvbuf; /* serialised KV pairs */
  size_t kvlen, kvcap;
  char **keys;
  uint64_t n_kv;
  struct wtensor *t;
  uint64_t n_t, cap_t;
  uint64_t data_size; /* bytes of the data section so far (offsets of declared tensors) */
  FILE *f;
  char *path;
  char *tmp; /* the file being written, beside path: renamed over it by finish, removed otherwise */
  char *vbuf;
  uint64_t cur;     /* tensor being written */
  uint64_t cur_done; /* bytes of it written */
  int began, failed;
};

/* The partial file of the writer that began last and has not finished (for a signal handler). */
static char *volatile partial_path;

void st_gguf_writer_remove_partial(void) {
  char *p = partial_path;
  if (p) unlink(p);
}

struct st_gguf_writer *st_gguf_writer_new(void) { return calloc(1, sizeof(struct st_gguf_writer)); }

void st_gguf_writer_free(struct st_gguf_writer *w) {
  if (!w) return;
  if (w->f) fclose(w->f);
  if (w->tmp) unlink(w->tmp); /* not finished: the destination keeps what it had */
  if (partial_path == w->tmp) partial_path = NULL;
  free(w->tmp);
  for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
  for (uint64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
  free(w->keys);
  free(w->t);
  free(w->kvbuf);
  free(w->path);
  free(w->vbuf);
  free(w);
}

static int kv_put(struct st_gguf_writer *w, const void *p, size_t n) {
  if (w->kvlen + n > w->kvcap) {
    size_t cap = w->kvcap ? w->kvcap : 4096;
    while (cap < w->kvlen + n) cap *= 2;
    uint8_t *nb = realloc(w->kvbuf, cap);
    if (!nb) return st_set_error(ST_ENOMEM, "gguf writer: out of memory (%zu bytes of metadata)", cap);
    w->kvbuf = nb;
    w->kvcap = cap;
  }
  memcpy(w->kvbuf + w->kvlen, p, n);
  w->kvlen += n;
  return 0;
}

static int kv_put_u32(struct st_gguf_writer *w, uint32_t v) { return kv_put(w, &v, 4); }
static int kv_put_u64(struct st_gguf_writer *w, uint64_t v) { return kv_put(w, &v, 8); }
static int kv_put_str(struct st_gguf_writer *w, const char *s) {
  uint64_t n = strlen(s);
  int rc = kv_put_u64(w, n);
  return rc ? rc : kv_put(w, s, (size_t)n);
}

/* Starts a KV: checks the writer state and the key, records the key, writes key and type. */
static int kv_begin(struct st_gguf_writer *w, const char *key, uint32_t type) {
  if (w->began) return st_set_error(ST_EINVAL, "gguf writer: key %s added after begin", key);
  if (!key || !*key) return st_set_error(ST_EINVAL, "gguf writer: empty key");
  for (uint64_t i = 0; i < w->n_kv; i++)
    if (!strcmp(w->keys[i], key)) return st_set_error(ST_EINVAL, "gguf writer: duplicate key %s", key);
  char **nk = realloc(w->keys, (w->n_kv + 1) * sizeof *nk);
  if (!nk) return st_set_error(ST_ENOMEM, "gguf writer: out of memory");
  w->keys = nk;
  if (!(nk[w->n_kv] = strdup(key))) return st_set_error(ST_ENOMEM, "gguf writer: out of memory");
  w->n_kv++;
  int rc = kv_put_str(w, key);
  return rc ? rc : kv_put_u32(w, type);
}

int st_gguf_writer_add_u32(struct st_gguf_writer *w, const char *key, uint32_t v) {
  int rc = kv_begin(w, key, ST_GGUF_UINT32);
  return rc ? rc : kv_put(w, &v, 4);
}

int st_gguf_writer_add_f32(struct st_gguf_writer *w, const char *key, float v) {
  int rc = kv_begin(w, key, ST_GGUF_FLOAT32);
  return rc ? rc : kv_put(w, &v, 4);
}

int st_gguf_writer_add_bool(struct st_gguf_writer *w, const char *key, int v) {
  uint8_t b = v != 0;
  int rc = kv_begin(w, key, ST_GGUF_BOOL);
  return rc ? rc : kv_put(w, &b, 1);
}

int st_gguf_writer_add_str(struct st_gguf_writer *w, const char *key, const char *v) {
  int rc = kv_begin(w, key, ST_GGUF_STRING);
  return rc ? rc : kv_put_str(w, v);
}

static int arr_begin(struct st_gguf_writer *w, const char *key, uint32_t et, uint64_t n) {
  int rc = kv_begin(w, key, ST_GGUF_ARRAY);
  if (!rc) rc = kv_put_u32(w, et);
  if (!rc) rc = kv_put_u64(w, n);
  return rc;
}

int st_gguf_writer_add_arr_str(struct st_gguf_writer *w, const char *key, const char *const *v,
                               uint64_t n) {
  int rc = arr_begin(w, key, ST_GGUF_STRING, n);
  for (uint64_t i = 0; i < n && !rc; i++) rc = kv_put_str(w, v[i]);
  return rc;
}

int st_gguf_writer_add_arr_i32(struct st_gguf_writer *w, const char *key, const int32_t *v,
                               uint64_t n) {
  int rc = arr_begin(w, key, ST_GGUF_INT32, n);
  if (!rc && n > SIZE_MAX / 4) return st_set_error(ST_ENOMEM, "gguf writer: key %s: array too large", key);
  return rc ? rc : kv_put(w, v, (size_t)n * 4);
}

int st_gguf_writer_add_arr_f32(struct st_gguf_writer *w, const char *key, const float *v,
                               uint64_t n) {
  int rc = arr_begin(w, key, ST_GGUF_FLOAT32, n);
  if (!rc && n > SIZE_MAX / 4) return st_set_error(ST_ENOMEM, "gguf writer: key %s: array too large", key);
  return rc ? rc : kv_put(w, v, (size_t)n * 4);
}

static uint64_t align_up(uint64_t x) {
  return (x + GGUF_DEFAULT_ALIGNMENT - 1) / GGUF_DEFAULT_ALIGNMENT * GGUF_DEFAULT_ALIGNMENT;
}

int st_gguf_writer_add_tensor(struct st_gguf_writer *w, const char *name, uint32_t type,
                              uint32_t n_dims, const uint64_t *ne) {
  if (w->began) return st_set_error(ST_EINVAL, "gguf writer: tensor %s added after begin", name);
  if (!name || !*name) return st_set_error(ST_EINVAL, "gguf writer: empty tensor name");
  if (n_dims < 1 || n_dims > ST_GGUF_MAX_DIMS)
    return st_set_error(ST_EINVAL, "gguf writer: tensor %s: %u dimensions (must be 1..%d)", name,
                        n_dims, ST_GGUF_MAX_DIMS);
  const struct st_type_info *ti = st_type_info(type);
  if (!ti->type_size) return st_set_error(ST_EINVAL, "gguf writer: unknown tensor type %u for %s", type, name);
  uint64_t rows = 1;
  for (uint32_t d = 0; d < n_dims; d++) {
    if (!ne[d]) return st_set_error(ST_EINVAL, "gguf writer: tensor %s: dimension %u is zero", name, d);
    if (d && ne[d] > (uint64_t)INT64_MAX / rows)
      return st_set_error(ST_EINVAL, "gguf writer: tensor %s: element count overflows", name);
    if (d) rows *= ne[d];
  }
  uint64_t rb = st_row_bytes(type, ne[0]);
  if (!rb)
    return st_set_error(ST_EINVAL, "gguf writer: tensor %s: row length %llu is not a multiple of %s's block of %u",
                        name, (unsigned long long)ne[0], ti->name, ti->blck_size);
  if (rb > (UINT64_MAX / 2) / rows)
    return st_set_error(ST_EINVAL, "gguf writer: tensor %s: byte size overflows", name);
  for (uint64_t i = 0; i < w->n_t; i++)
    if (!strcmp(w->t[i].name, name))
      return st_set_error(ST_EINVAL, "gguf writer: duplicate tensor name %s", name);
  if (w->n_t == w->cap_t) {
    uint64_t cap = w->cap_t ? 2 * w->cap_t : 64;
    struct wtensor *nt = realloc(w->t, cap * sizeof *nt);
    if (!nt) return st_set_error(ST_ENOMEM, "gguf writer: out of memory");
    w->t = nt;
    w->cap_t = cap;
  }
  struct wtensor *t = &w->t[w->n_t];
  memset(t, 0, sizeof *t);
  if (!(t->name = strdup(name))) return st_set_error(ST_ENOMEM, "gguf writer: out of memory");
  t->type = type;
  t->n_dims = n_dims;
  for (uint32_t d = 0; d < ST_GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
  t->nbytes = rb * rows;
  t->offset = w->data_size;
  w->data_size = align_up(t->offset + t->nbytes);
  w->n_t++;
  return 0;
}

static int wr(struct st_gguf_writer *w, const void *p, size_t n) {
  if (w->failed) return ST_EIO;
  if (n && fwrite(p, 1, n, w->f) != n) {
    w->failed = 1;
    return st_set_error(ST_EIO, "%s: write failed: %s", w->path, strerror(errno));
  }
  return 0;
}

static int wr_zeros(struct st_gguf_writer *w, size_t n) {
  static const uint8_t zeros[GGUF_DEFAULT_ALIGNMENT];
  ST_ASSERT(n <= sizeof zeros);
  return wr(w, zeros, n);
}

/* Bytes of the header, KV pairs and tensor infos begin writes, before the padding to the alignment. */
static uint64_t header_bytes(const struct st_gguf_writer *w) {
  uint64_t pos = 24 + w->kvlen;
  for (uint64_t i = 0; i < w->n_t; i++) pos += 8 + strlen(w->t[i].name) + 4 + 8 * (uint64_t)w->t[i].n_dims + 4 + 8;
  return pos;
}

uint64_t st_gguf_writer_file_bytes(const struct st_gguf_writer *w) { return align_up(header_bytes(w)) + w->data_size; }

int st_gguf_writer_begin(struct st_gguf_writer *w, const char *path) {
  if (w->began) return st_set_error(ST_EINVAL, "gguf writer: begin called twice");
  free(w->path);
  if (!(w->path = strdup(path))) return st_set_error(ST_ENOMEM, "gguf writer: out of memory");
  /* written as PATH.part.XXXXXX and renamed at the end: an interrupted or failed write leaves an
   * existing PATH as it was, and never a partial file under its name */
  const size_t tl = strlen(path) + sizeof ".part.XXXXXX";
  if (!(w->tmp = malloc(tl))) return st_set_error(ST_ENOMEM, "gguf writer: out of memory");
  snprintf(w->tmp, tl, "%s.part.XXXXXX", path);
  const int fd = mkstemp(w->tmp);
  if (fd < 0) {
    const int e = errno;
    free(w->tmp);
    w->tmp = NULL;
    return st_set_error(ST_EIO, "%s: cannot create: %s", path, strerror(e));
  }
  fchmod(fd, 0644);
  partial_path = w->tmp;
  w->f = fdopen(fd, "wb");
  if (!w->f) {
    close(fd);
    return st_set_error(ST_EIO, "%s: cannot create: %s", path, strerror(errno));
  }
  w->vbuf = malloc(GGUF_WRITE_BUFFER);
  if (w->vbuf) setvbuf(w->f, w->vbuf, _IOFBF, GGUF_WRITE_BUFFER);
  w->began = 1;
  uint32_t version = 3;
  int rc = wr(w, "GGUF", 4);
  if (!rc) rc = wr(w, &version, 4);
  if (!rc) rc = wr(w, &w->n_t, 8);
  if (!rc) rc = wr(w, &w->n_kv, 8);
  if (!rc) rc = wr(w, w->kvbuf, w->kvlen);
  for (uint64_t i = 0; i < w->n_t && !rc; i++) {
    const struct wtensor *t = &w->t[i];
    uint64_t n = strlen(t->name);
    rc = wr(w, &n, 8);
    if (!rc) rc = wr(w, t->name, (size_t)n);
    if (!rc) rc = wr(w, &t->n_dims, 4);
    if (!rc) rc = wr(w, t->ne, 8 * (size_t)t->n_dims);
    if (!rc) rc = wr(w, &t->type, 4);
    if (!rc) rc = wr(w, &t->offset, 8);
  }
  const uint64_t pos = header_bytes(w);
  if (!rc) rc = wr_zeros(w, (size_t)(align_up(pos) - pos));
  w->cur = 0;
  w->cur_done = 0;
  return rc;
}

int st_gguf_writer_write_data(struct st_gguf_writer *w, const void *data, size_t n) {
  if (!w->began || !w->f) return st_set_error(ST_EINVAL, "gguf writer: write before begin");
  const uint8_t *p = data;
  while (n) {
    if (w->cur >= w->n_t)
      return st_set_error(ST_EINVAL, "%s: %zu bytes written past the last tensor's declared size",
                          w->path, n);
    struct wtensor *t = &w->t[w->cur];
    uint64_t room = t->nbytes - w->cur_done;
    size_t take = n < room ? n : (size_t)room;
    int rc = wr(w, p, take);
    if (rc) return rc;
    p += take;
    n -= take;
    w->cur_done += take;
    if (w->cur_done == t->nbytes) {
      if ((rc = wr_zeros(w, (size_t)(align_up(t->nbytes) - t->nbytes)))) return rc;
      w->cur++;
      w->cur_done = 0;
    }
  }
  return 0;
}

int st_gguf_writer_write_tensor(struct st_gguf_writer *w, const void *data, size_t n) {
  if (!w->began || !w->f) return st_set_error(ST_EINVAL, "gguf writer: write before begin");
  if (w->cur >= w->n_t) return st_set_error(ST_EINVAL, "%s: every declared tensor is already written", w->path);
  const struct wtensor *t = &w->t[w->cur];
  if (w->cur_done || n != t->nbytes)
    return st_set_error(ST_EINVAL, "%s: tensor %s: write_tensor got %zu bytes, declared %llu (%llu already written)",
                        w->path, t->name, n, (unsigned long long)t->nbytes,
                        (unsigned long long)w->cur_done);
  return st_gguf_writer_write_data(w, data, n);
}

int st_gguf_writer_finish(struct st_gguf_writer *w) {
  if (!w->began || !w->f) return st_set_error(ST_EINVAL, "gguf writer: finish before begin");
  int rc = 0;
  if (w->cur < w->n_t)
    rc = st_set_error(ST_EINVAL, "%s: tensor %s incomplete (%llu of %llu bytes written; %llu tensors left)",
                      w->path, w->t[w->cur].name, (unsigned long long)w->cur_done,
                      (unsigned long long)w->t[w->cur].nbytes, (unsigned long long)(w->n_t - w->cur));
  if (!rc && (w->failed || fflush(w->f) || ferror(w->f)))
    rc = st_set_error(ST_EIO, "%s: write failed: %s", w->path, strerror(errno));
  if (!rc && fsync(fileno(w->f))) rc = st_set_error(ST_EIO, "%s: sync failed: %s", w->path, strerror(errno));
  if (fclose(w->f) && !rc) rc = st_set_error(ST_EIO, "%s: close failed: %s", w->path, strerror(errno));
  w->f = NULL;
  if (!rc && rename(w->tmp, w->path)) rc = st_set_error(ST_EIO, "%s: cannot rename %s over it: %s", w->path, w->tmp, strerror(errno));
  if (rc) unlink(w->tmp);
  if (partial_path == w->tmp) partial_path = NULL;
  free(w->tmp);
  w->tmp = NULL;
  return rc;
}
