/* Status codes, the error message buffer and invariant checks shared by every strata module.
 * Functions that can fail return 0 or a negative ST_E* code and record a one-line message with
 * st_set_error(); main() prints st_last_error() and exits non-zero (STYLE.md: errors are values). */
#ifndef ST_COMMON_H
#define ST_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  ST_OK = 0,
  ST_EIO = -1,      /* a file could not be opened, read, mapped or written */
  ST_EFORMAT = -2,  /* malformed input: GGUF, JSON, profile, config */
  ST_EUNSUP = -3,   /* well-formed but not supported (tensor type, architecture) */
  ST_EINVAL = -4,   /* bad argument or flag combination */
  ST_ENOMEM = -5,   /* an allocation failed or a size does not fit */
  ST_ERUNTIME = -6, /* StarPU or a device reported a failure */
};

/* Records a printf-style message for the calling thread and returns `code`, so that
 * `return st_set_error(ST_EFORMAT, "...")` reads naturally. The message is truncated to
 * 1 KiB. */
int st_set_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the calling thread's current message with `prefix: ` (for adding context, e.g. the
 * file name, as the error travels up) and returns `code`. */
int st_error_context(int code, const char *prefix);

/* The calling thread's last message ("" if none). Owned by the thread; valid until the next
 * st_set_error() on that thread. */
const char *st_last_error(void);

/* A broken internal invariant: prints the condition and aborts. Never used for bad input. */
#define ST_ASSERT(cond)                                                                      \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "strata: internal invariant broken at %s:%d: %s\n", __FILE__, __LINE__, \
              #cond);                                                                        \
      abort();                                                                               \
    }                                                                                        \
  } while (0)

/* Opens `path` read-only when it is a regular file, without ever blocking on a FIFO, a socket or
 * a device (opened O_NONBLOCK, checked with fstat, then the flag cleared): the descriptor, or -1
 * with ST_EIO recorded as "<path>: cannot open: <reason>" (the system's, or "not a regular file
 * (a FIFO)", "(a directory)", ...). The caller closes it. */
int st_open_regular(const char *path);
/* The same as a FILE * opened "rb" (fclose it), or NULL with the error recorded. */
FILE *st_fopen_regular(const char *path);

/* The whole of regular file `path` (st_fopen_regular) in a malloc'd buffer with a NUL after its
 * *len bytes (len may be NULL); NULL with ST_EIO / ST_ENOMEM recorded, naming the file. */
char *st_read_file(const char *path, size_t *len);

/* Whether `path` can be written as an output file, checked before a long run: an existing path
 * must be a regular file the process may write, a new one needs a writable directory. 0, or
 * ST_EIO recorded as "<what> <path>: <reason>" (the system's, or "a directory", ...). */
int st_check_output(const char *what, const char *path);

/* Whether s[0..n) is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past
 * U+10FFFF). */
int st_utf8_valid(const char *s, size_t n);

/* Rewrites the NUL-terminated s in place (cap bytes available) so that it is valid UTF-8: every
 * byte that does not start a well-formed sequence becomes U+FFFD (3 bytes; the text is cut to
 * fit cap). For text from a client or a file that goes into JSON. Returns s. */
char *st_utf8_sanitize(char *s, size_t cap);

/* Monotonic wall-clock time in seconds. */
double st_now(void);

/* 1 when none of the n floats at v is an infinity or a NaN, else 0 (their exponent bits ORed
 * over sixteen interleaved accumulators: a SIMD loop, about 4x a scalar isfinite scan). */
int st_all_finite(const float *v, size_t n);
/* Copies n floats from src to dst (not overlapping) and returns st_all_finite of them, in one pass
 * over src (a decode step's logits out of the GPU's mailbox). */
int st_copy_finite(float *dst, const float *src, size_t n);

/* mkdir -p: creates `path` and the folders above it (0755, the last one `mode`, e.g. 0700). 0, or -1
 * with errno set (ENOTDIR where a component, or path itself, is not a folder). */
int st_mkdir_p(const char *path, unsigned mode);

#ifdef __cplusplus
}
#endif

#endif
