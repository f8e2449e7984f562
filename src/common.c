/* The per-thread error message buffer and small utilities declared in common.h. */
#include "common.h"

#include <stdarg.h>
#include <string.h>
#include <time.h>

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
