/* libFuzzer target for strata's text parsers: the first input byte picks one (expert profile,
 * events.tsv, serve config), the rest is written to a private temporary file and loaded; an
 * accepted trace is also rendered (summary and critical path), an accepted profile written back
 * and read again with the same counts. Any crash, leak or out-of-bounds
 * read under the sanitizers is a failure. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/config.h"
#include "io/profile.h"
#include "io/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  char path[64];
  snprintf(path, sizeof path, "/tmp/strata-fuzz-text-%d", (int)getpid());
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  fwrite(data + 1, 1, size - 1, f);
  fclose(f);
  switch (data[0] % 3) {
  case 0: { /* an accepted profile round-trips: written back and read again, the same counts */
    struct st_profile p, q;
    if (!st_profile_load(path, 2, 4, 2, &p)) {
      uint64_t counts[8] = {0};
      for (int i = 0; i < 8; i++) counts[p.pairs[i].layer * 4 + p.pairs[i].expert] = p.pairs[i].count;
      char back[80];
      snprintf(back, sizeof back, "%s.back", path);
      if (st_profile_write(back, 2, 4, 2, p.tokens, counts) || st_profile_load(back, 2, 4, 2, &q)) abort();
      if (q.tokens != p.tokens || q.total != p.total) abort();
      for (int i = 0; i < 8; i++)
        if (counts[q.pairs[i].layer * 4 + q.pairs[i].expert] != q.pairs[i].count) abort();
      st_profile_free(&q);
      st_profile_free(&p);
      unlink(back);
    }
    break;
  }
  case 1: {
    struct st_trace tr;
    if (!st_trace_load(path, &tr)) {
      FILE *null = fopen("/dev/null", "w");
      if (null) {
        st_trace_write_summary(&tr, null);
        fclose(null);
      }
    }
    st_trace_free(&tr);
    break;
  }
  default: {
    struct st_config c;
    memset(&c, 0, sizeof c);
    st_config_load(path, &c);
    st_config_free(&c); /* also after an error (config.h) */
    break;
  }
  }
  unlink(path);
  return 0;
}
