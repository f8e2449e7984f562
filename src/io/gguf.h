/* GGUF files: a reader that maps a file read-only and checks it, and a streaming writer.
 * Format: ggml's docs/gguf.md (versions 2 and 3): magic "GGUF", version, tensor count, KV count,
 * KV pairs, tensor infos, padding to `general.alignment` (default 32), tensor data. All integers
 * little-endian. */
#ifndef ST_GGUF_H
#define ST_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* GGUF metadata value types (gguf.md `gguf_metadata_value_type`). */
enum st_gguf_vtype {
  ST_GGUF_UINT8 = 0,
  ST_GGUF_INT8 = 1,
  ST_GGUF_UINT16 = 2,
  ST_GGUF_INT16 = 3,
  ST_GGUF_UINT32 = 4,
  ST_GGUF_INT32 = 5,
  ST_GGUF_FLOAT32 = 6,
  ST_GGUF_BOOL = 7,
  ST_GGUF_STRING = 8,
  ST_GGUF_ARRAY = 9,
  ST_GGUF_UINT64 = 10,
  ST_GGUF_INT64 = 11,
  ST_GGUF_FLOAT64 = 12,
};

/* A string inside the mapped file: not NUL-terminated. */
struct st_gguf_str {
  uint64_t len;
  const char *ptr;
};

/* One metadata key/value. Scalars are decoded into `u`; strings point into the mapping; arrays
 * give their element type, count and a pointer to the first element in the mapping (for arrays
 * of strings, use st_gguf_arr_str(); there `data` points at an index owned by the handle, not
 * at the mapping). */
struct st_gguf_kv {
  struct st_gguf_str key;
  uint32_t type; /* enum st_gguf_vtype */
  union {
    uint64_t u64;
    int64_t i64;
    double f64;
    struct st_gguf_str str;
    struct {
      uint32_t type; /* element type; never ST_GGUF_ARRAY (nested arrays are refused) */
      uint64_t n;
      const uint8_t *data;
    } arr;
  } v;
};

#define ST_GGUF_MAX_DIMS 4

struct st_gguf_tensor {
  struct st_gguf_str name;
  uint32_t n_dims;
  uint64_t ne[ST_GGUF_MAX_DIMS]; /* ne[0] is the contiguous dimension (row length); unused = 1 */
  uint32_t type;                 /* enum st_type (ggml_type number) */
  uint64_t offset;               /* from the start of the data section */
  uint64_t nbytes;               /* checked: within the file, no overlap with another tensor */
  const void *data;              /* into the mapping */
};

struct st_gguf {
  char *path;   /* owned copy of the file name, for messages */
  void *map;    /* read-only mmap of the whole file (NULL for an empty file) */
  size_t size;  /* bytes */
  uint32_t version;
  uint64_t alignment;
  uint64_t n_kv, n_tensors;
  struct st_gguf_kv *kv;         /* n_kv entries, owned */
  struct st_gguf_tensor *tensor; /* n_tensors entries, owned */
  uint64_t data_offset;          /* start of the tensor data section in the file */
};

/* Opens and validates `path`: magic, version 2 or 3, counts bounded by the file size, every
 * string/array inside the file, known value and tensor types, 1..4 dims with no zero dimension
 * and no overflow, tensor data aligned, inside the file and not overlapping. Tensor types that
 * strata does not compute are accepted here (the model loader refuses them by name).
 * On success *out is an owned handle (free with st_gguf_close) and 0 is returned; otherwise a
 * negative ST_E* code with a message naming the file and what is wrong. */
int st_gguf_open(const char *path, struct st_gguf **out);

/* Same checks on a buffer the caller owns (not copied; must outlive the handle). Used by the
 * fuzz target. `name` is used in messages. */
int st_gguf_open_buffer(const void *buf, size_t size, const char *name, struct st_gguf **out);

void st_gguf_close(struct st_gguf *g);

/* Drops the process's pages of the mapping that lie wholly inside [p, p + n) (madvise
 * MADV_DONTNEED on the read-only private mapping: the data stays valid and is read again from the
 * page cache on the next access), so a copied region stops counting in resident memory. A no-op
 * for a buffer handle (st_gguf_open_buffer) or a range outside the mapping. Returns 0, or the
 * errno of a failed madvise (the pages then stay resident; callers count it, the memory log shows it). */
int st_gguf_release_pages(const struct st_gguf *g, const void *p, size_t n);

/* Maps [p, p + n) of the mapping into the process now (madvise MADV_POPULATE_READ: the pages read
 * and their page-table entries made), so that the first access does not fault page by page. A
 * no-op for a buffer handle or a range outside the mapping. Returns 0, or the errno of a failed
 * madvise (EINVAL before Linux 5.14): the pages then fault in on first use, as without it. */
int st_gguf_populate(const struct st_gguf *g, const void *p, size_t n);

/* Lookups: NULL / -1 when absent. */
const struct st_gguf_kv *st_gguf_find_kv(const struct st_gguf *g, const char *key);
const struct st_gguf_tensor *st_gguf_find_tensor(const struct st_gguf *g, const char *name);

/* Typed getters. Integer getters accept any integer type whose value fits; float getters accept
 * FLOAT32/FLOAT64. Return 0 on success; ST_EFORMAT with a message naming the key when the key is
 * present with the wrong type; ST_EFORMAT ("missing key") when absent. */
int st_gguf_get_u64(const struct st_gguf *g, const char *key, uint64_t *out);
int st_gguf_get_f32(const struct st_gguf *g, const char *key, float *out);
int st_gguf_get_bool(const struct st_gguf *g, const char *key, int *out);
/* Returns a malloc'd NUL-terminated copy in *out (caller frees). */
int st_gguf_get_str(const struct st_gguf *g, const char *key, char **out);

/* Element i of an array of strings (checked when the file was opened). */
struct st_gguf_str st_gguf_arr_str(const struct st_gguf_kv *kv, uint64_t i);
/* Element i of a numeric array, converted. */
int64_t st_gguf_arr_int(const struct st_gguf_kv *kv, uint64_t i);
double st_gguf_arr_float(const struct st_gguf_kv *kv, uint64_t i);

/* Name of a value type ("uint32", "string", ...). */
const char *st_gguf_vtype_name(uint32_t type);

/* ---- Writer --------------------------------------------------------------------------------
 * Usage: st_gguf_writer_new(); add KVs and tensor infos (shapes, types); st_gguf_writer_begin()
 * writes the header and infos; then st_gguf_writer_write_tensor() for each tensor in the order
 * they were added (data may be streamed in pieces with st_gguf_writer_write_data()); finally
 * st_gguf_writer_finish(). Always writes GGUF version 3 with alignment 32. */
struct st_gguf_writer;

struct st_gguf_writer *st_gguf_writer_new(void);
void st_gguf_writer_free(struct st_gguf_writer *w);
int st_gguf_writer_add_u32(struct st_gguf_writer *w, const char *key, uint32_t v);
int st_gguf_writer_add_f32(struct st_gguf_writer *w, const char *key, float v);
int st_gguf_writer_add_bool(struct st_gguf_writer *w, const char *key, int v);
int st_gguf_writer_add_str(struct st_gguf_writer *w, const char *key, const char *v);
/* Arrays: the writer copies the values. */
int st_gguf_writer_add_arr_str(struct st_gguf_writer *w, const char *key, const char *const *v,
                               uint64_t n);
int st_gguf_writer_add_arr_i32(struct st_gguf_writer *w, const char *key, const int32_t *v,
                               uint64_t n);
int st_gguf_writer_add_arr_f32(struct st_gguf_writer *w, const char *key, const float *v,
                               uint64_t n);
/* Declares a tensor: `ne` has n_dims entries, ne[0] contiguous. */
int st_gguf_writer_add_tensor(struct st_gguf_writer *w, const char *name, uint32_t type,
                              uint32_t n_dims, const uint64_t *ne);
/* Bytes of the file the writer will have written once every declared tensor is (header, KV pairs,
 * tensor infos, the data section with its padding): for a free-space check before begin. */
uint64_t st_gguf_writer_file_bytes(const struct st_gguf_writer *w);
/* Opens `path` for writing (as PATH.part.XXXXXX beside it, mode 0644, renamed over PATH by
 * st_gguf_writer_finish; st_gguf_writer_free removes it when unfinished) and writes header, KVs and
 * tensor infos. */
int st_gguf_writer_begin(struct st_gguf_writer *w, const char *path);
/* Appends bytes of the current tensor; when a tensor's bytes are complete the writer pads to
 * the alignment before the next one. Writing more than the declared size is an error. */
int st_gguf_writer_write_data(struct st_gguf_writer *w, const void *data, size_t n);
/* Writes the whole of the current tensor in one call: `n` must equal its declared size (bytes)
 * and none of it may have been written yet. */
int st_gguf_writer_write_tensor(struct st_gguf_writer *w, const void *data, size_t n);
/* Removes the partial file of the writer begun last and not yet finished, if any; only unlink(2),
 * so a SIGINT/SIGTERM handler may call it before the process ends. */
void st_gguf_writer_remove_partial(void);
/* Checks every tensor was written completely, flushes, syncs, closes and renames the file over
 * PATH (an existing file there is replaced only now). */
int st_gguf_writer_finish(struct st_gguf_writer *w);

#endif
