/* Expert profile files (see profile.h). */
#include "io/profile.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <sys/types.h>
#include <string.h>

#include "common.h"

struct ranked {
  uint64_t count;
  uint32_t pair;
};

static int by_count_desc(const void *a, const void *b) {
  const struct ranked *x = a, *y = b;
  if (x->count != y->count) return x->count < y->count ? 1 : -1;
  return x->pair < y->pair ? -1 : x->pair > y->pair;
}

int st_profile_write(const char *path, uint32_t n_layer, uint32_t n_expert, uint32_t top_k,
                     uint64_t tokens, const uint64_t *counts) {
  const size_t n = (size_t)n_layer * n_expert;
  struct ranked *r = malloc(sizeof *r * n);
  if (!r) return st_set_error(ST_ENOMEM, "out of memory ranking %zu expert pairs", n);
  for (size_t i = 0; i < n; i++) r[i] = (struct ranked){counts[i], (uint32_t)i};
  qsort(r, n, sizeof *r, by_count_desc);
  FILE *f = fopen(path, "w");
  if (!f) {
    free(r);
    return st_set_error(ST_EIO, "%s: cannot create: %s", path, strerror(errno));
  }
  fprintf(f, "strata-expert-profile 1\nlayers %u experts %u top_k %u tokens %" PRIu64 "\n", n_layer, n_expert,
          top_k, tokens);
  for (size_t i = 0; i < n; i++)
    fprintf(f, "%u %u %" PRIu64 "\n", r[i].pair / n_expert, r[i].pair % n_expert, r[i].count);
  free(r);
  if (fclose(f)) return st_set_error(ST_EIO, "%s: write failed: %s", path, strerror(errno));
  return 0;
}

/* The profile's lines, numbered, read whole however long (getline). */
struct reader {
  FILE *f;
  const char *path;
  char *line;
  size_t cap;
  size_t no; /* number of the line in `line`, from 1 */
};

static int next_line(struct reader *r) {
  const ssize_t n = getline(&r->line, &r->cap, r->f);
  if (n < 0) return 0;
  r->no++;
  if (memchr(r->line, 0, (size_t)n)) r->line[0] = 1; /* a NUL byte: unparsable, see parse_u64 */
  if (n > 0 && r->line[n - 1] == '\n') r->line[n - 1] = 0;
  return 1;
}

/* A decimal number at *s: digits only (no sign, no spaces), at most `max`; advances *s. */
static int parse_u64(const char **s, uint64_t max, uint64_t *v) {
  const char *p = *s;
  if (*p < '0' || *p > '9') return 0;
  uint64_t x = 0;
  for (; *p >= '0' && *p <= '9'; p++) {
    const unsigned d = (unsigned)(*p - '0');
    if (x > (max - d) / 10) return 0;
    x = x * 10 + d;
  }
  *s = p;
  *v = x;
  return 1;
}

/* The literal `word` at *s (spaces included); advances *s. */
static int expect(const char **s, const char *word) {
  const size_t n = strlen(word);
  if (strncmp(*s, word, n)) return 0;
  *s += n;
  return 1;
}

int st_profile_load(const char *path, uint32_t n_layer, uint32_t n_expert, uint32_t top_k, struct st_profile *out) {
  memset(out, 0, sizeof *out);
  FILE *f = st_fopen_regular(path);
  if (!f) return st_error_context(ST_EIO, "expert profile");
  struct reader r = {f, path, NULL, 0, 0};
  int rc = 0;
  uint64_t version = 0, L = 0, E = 0, K = 0, tokens = 0;
  const char *s = NULL;
  if (!next_line(&r) || (s = r.line, !expect(&s, "strata-expert-profile ")) || !parse_u64(&s, UINT32_MAX, &version) || *s)
    rc = st_set_error(ST_EFORMAT, "%s:1: not an expert profile (expected exactly 'strata-expert-profile 1')", path);
  else if (version != 1)
    rc = st_set_error(ST_EFORMAT, "%s:1: profile version %" PRIu64 " is not supported (this strata reads version 1)", path,
                      version);
  else if (!next_line(&r) || (s = r.line, !expect(&s, "layers ")) || !parse_u64(&s, UINT32_MAX, &L) ||
           !expect(&s, " experts ") || !parse_u64(&s, UINT32_MAX, &E) || !expect(&s, " top_k ") ||
           !parse_u64(&s, UINT32_MAX, &K) || !expect(&s, " tokens ") || !parse_u64(&s, UINT64_MAX, &tokens) || *s)
    rc = st_set_error(ST_EFORMAT, "%s:2: expected 'layers L experts E top_k K tokens N' (whole numbers, single spaces, "
                      "nothing after)", path);
  else if (L != n_layer || E != n_expert || K != top_k)
    rc = st_set_error(ST_EINVAL, "%s: profile is for a model of %" PRIu64 " layers x %" PRIu64 " experts, top-%" PRIu64
                      ", this model has %u x %u, top-%u", path, L, E, K, n_layer, n_expert, top_k);
  const size_t n = (size_t)n_layer * n_expert;
  uint8_t *seen = rc ? NULL : calloc(n ? n : 1, 1);
  out->pairs = rc ? NULL : malloc(sizeof *out->pairs * (n ? n : 1));
  if (!rc && (!seen || !out->pairs)) rc = st_set_error(ST_ENOMEM, "out of memory reading %s", path);
  for (size_t i = 0; !rc && i < n; i++) {
    uint64_t layer, expert, count;
    if (!next_line(&r)) {
      rc = st_set_error(ST_EFORMAT, "%s: ends after %zu of %zu expert pairs", path, i, n);
      break;
    }
    s = r.line;
    if (!parse_u64(&s, UINT32_MAX, &layer) || !expect(&s, " ") || !parse_u64(&s, UINT32_MAX, &expert) ||
        !expect(&s, " ") || !parse_u64(&s, UINT64_MAX, &count) || *s || layer >= n_layer || expert >= n_expert) {
      rc = st_set_error(ST_EFORMAT, "%s:%zu: expected 'layer expert count' (whole numbers, single spaces, nothing after) "
                        "with layer < %u and expert < %u", path, r.no, n_layer, n_expert);
    } else if (seen[layer * n_expert + expert]++) {
      rc = st_set_error(ST_EFORMAT, "%s:%zu: pair (%" PRIu64 ", %" PRIu64 ") appears twice", path, r.no, layer, expert);
    } else if (i > 0 && count > out->pairs[i - 1].count) {
      rc = st_set_error(ST_EFORMAT, "%s:%zu: not ranked (count %" PRIu64 " after %" PRIu64 ")", path, r.no, count,
                        out->pairs[i - 1].count);
    } else if (out->total > UINT64_MAX - count) {
      rc = st_set_error(ST_EFORMAT, "%s:%zu: the counts add up past 2^64", path, r.no);
    } else {
      out->pairs[i] = (struct st_profile_pair){(uint32_t)layer, (uint32_t)expert, count};
      out->total += count;
    }
  }
  if (!rc && next_line(&r)) rc = st_set_error(ST_EFORMAT, "%s:%zu: text after the last of the %zu expert pairs", path, r.no, n);
  if (!rc && ferror(f)) rc = st_set_error(ST_EIO, "%s: read failed", path);
  free(seen);
  free(r.line);
  fclose(f);
  if (rc) {
    st_profile_free(out);
    return rc;
  }
  out->n_layer = (uint32_t)L;
  out->n_expert = (uint32_t)E;
  out->top_k = (uint32_t)K;
  out->tokens = tokens;
  return 0;
}

void st_profile_free(struct st_profile *p) {
  free(p->pairs);
  p->pairs = NULL;
}
