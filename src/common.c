/* The per-thread error message buffer and small utilities declared in common.h. */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char st_errbuf[1024];

int st_set_error(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st_errbuf, sizeof st_errbuf, fmt, ap);
  va_end(ap);
  return code;
}

int st_error_context(int code, const char *prefix) {
  char tmp[sizeof st_errbuf];
  if (snprintf(tmp, sizeof tmp, "%s: %s", prefix, st_errbuf) >= (int)sizeof tmp)
    tmp[sizeof tmp - 2] = '.'; /* cut at the 1 KiB cap, as st_set_error() cuts */
  memcpy(st_errbuf, tmp, sizeof st_errbuf);
  return code;
}

const char *st_last_error(void) { return st_errbuf; }

double st_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int st_open_regular(const char *path) {
  const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    st_set_error(ST_EIO, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st)) {
    const int e = errno;
    close(fd);
    st_set_error(ST_EIO, "%s: cannot open: %s", path, strerror(e));
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    const char *kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "not a plain file";
    close(fd);
    st_set_error(ST_EIO, "%s: cannot open: not a regular file (%s)", path, kind);
    return -1;
  }
  const int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

FILE *st_fopen_regular(const char *path) {
  const int fd = st_open_regular(path);
  if (fd < 0) return NULL;
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    st_set_error(ST_EIO, "%s: cannot open: %s", path, strerror(errno));
    close(fd);
  }
  return f;
}

int st_check_output(const char *what, const char *path) {
  struct stat st;
  if (!stat(path, &st)) {
    if (S_ISDIR(st.st_mode)) return st_set_error(ST_EIO, "%s %s: is a directory, not a file", what, path);
    if (!S_ISREG(st.st_mode)) return st_set_error(ST_EIO, "%s %s: not a regular file", what, path);
    if (access(path, W_OK)) return st_set_error(ST_EIO, "%s %s: cannot write: %s", what, path, strerror(errno));
    return 0;
  }
  if (errno != ENOENT) return st_set_error(ST_EIO, "%s %s: %s", what, path, strerror(errno));
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  if (stat(dir, &st)) return st_set_error(ST_EIO, "%s %s: directory %s: %s", what, path, dir, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return st_set_error(ST_EIO, "%s %s: %s is not a directory", what, path, dir);
  if (access(dir, W_OK | X_OK)) return st_set_error(ST_EIO, "%s %s: cannot create files in %s: %s", what, path, dir, strerror(errno));
  return 0;
}

int st_utf8_valid(const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  for (size_t i = 0; i < n;) {
    const unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (i + len > n) return 0;
    for (size_t j = 1; j < len; j++) {
      if ((s[i + j] & 0xc0) != 0x80) return 0;
      cp = cp << 6 | (s[i + j] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    i += len;
  }
  return 1;
}

/* Bytes of the well-formed UTF-8 sequence at s (n bytes left), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  for (size_t len = 1; len <= 4 && len <= n; len++)
    if (st_utf8_valid((const char *)s, len)) return len;
  return 0;
}

char *st_utf8_sanitize(char *str, size_t cap) {
  const size_t n = strlen(str);
  if (st_utf8_valid(str, n) || cap == 0) return str;
  char *copy = malloc(n + 1);
  if (!copy) { /* no room to rewrite: drop every byte >= 0x80 */
    for (char *p = str; *p; p++)
      if ((unsigned char)*p >= 0x80) *p = '?';
    return str;
  }
  memcpy(copy, str, n + 1);
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    const size_t len = utf8_seq((const unsigned char *)copy + i, n - i);
    const char *src = len ? copy + i : "\xef\xbf\xbd";
    const size_t w = len ? len : 3;
    if (o + w + 1 > cap) break;
    memcpy(str + o, src, w);
    o += w;
    i += len ? len : 1;
  }
  str[o] = 0;
  free(copy);
  return str;
}

char *st_read_file(const char *path, size_t *len) {
  FILE *f = st_fopen_regular(path);
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap) break;
    char *grown = realloc(buf, 2 * cap + 1);
    if (!grown) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = grown;
    cap *= 2;
  }
  const int err = ferror(f);
  fclose(f);
  if (!buf || err) {
    free(buf);
    st_set_error(buf ? ST_EIO : ST_ENOMEM, "%s: %s", path, buf ? "read failed" : "out of memory reading it");
    return NULL;
  }
  buf[n] = 0;
  if (len) *len = n;
  return buf;
}

int st_all_finite(const float *v, size_t n) {
  enum { L = 16 };
  uint32_t acc[L] = {0}, m = 0;
  size_t i = 0;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; j++) {
      uint32_t u;
      memcpy(&u, v + i + j, sizeof u);
      acc[j] |= (u & 0x7f800000u) + 0x00800000u; /* exponent all ones: the sign bit */
    }
  for (; i < n; i++) {
    uint32_t u;
    memcpy(&u, v + i, sizeof u);
    m |= (u & 0x7f800000u) + 0x00800000u;
  }
  for (int j = 0; j < L; j++) m |= acc[j];
  return !(m & 0x80000000u);
}

#if defined(__x86_64__)
/* st_copy_finite's loop, 32 floats a step in AVX2 registers: an exponent of all ones marks a NaN or
 * an infinity. Returns the floats done (a multiple of 32) and ORs the marks into *bad. */
__attribute__((target("avx2"))) static size_t copy_finite_avx2(float *dst, const float *src, size_t n, int *bad) {
  const __m256i e = _mm256_set1_epi32(0x7f800000);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)(src + i)), b = _mm256_loadu_si256((const __m256i *)(src + i + 8));
    const __m256i c = _mm256_loadu_si256((const __m256i *)(src + i + 16)), d = _mm256_loadu_si256((const __m256i *)(src + i + 24));
    _mm256_storeu_si256((__m256i *)(dst + i), a), _mm256_storeu_si256((__m256i *)(dst + i + 8), b);
    _mm256_storeu_si256((__m256i *)(dst + i + 16), c), _mm256_storeu_si256((__m256i *)(dst + i + 24), d);
    m0 = _mm256_or_si256(m0, _mm256_cmpeq_epi32(_mm256_and_si256(a, e), e));
    m1 = _mm256_or_si256(m1, _mm256_cmpeq_epi32(_mm256_and_si256(b, e), e));
    m2 = _mm256_or_si256(m2, _mm256_cmpeq_epi32(_mm256_and_si256(c, e), e));
    m3 = _mm256_or_si256(m3, _mm256_cmpeq_epi32(_mm256_and_si256(d, e), e));
  }
  const __m256i m = _mm256_or_si256(_mm256_or_si256(m0, m1), _mm256_or_si256(m2, m3));
  *bad |= !_mm256_testz_si256(m, m);
  return i;
}
#endif

int st_copy_finite(float *dst, const float *src, size_t n) {
  int bad = 0;
  size_t i = 0;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) i = copy_finite_avx2(dst, src, n, &bad);
#endif
  memcpy(dst + i, src + i, sizeof(float) * (n - i));
  return !bad && st_all_finite(src + i, n - i);
}

int st_mkdir_p(const char *path, unsigned mode) {
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) {
    errno = ENAMETOOLONG;
    return -1;
  }
  for (char *p = dir + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      const int r = mkdir(dir, 0755);
      *p = '/';
      if (r && errno != EEXIST) return -1;
    }
  if (mkdir(dir, (mode_t)mode) && errno != EEXIST) return -1;
  struct stat sb;
  if (stat(dir, &sb) || !S_ISDIR(sb.st_mode)) {
    errno = ENOTDIR;
    return -1;
  }
  return 0;
}
