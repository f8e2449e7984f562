/* Expert profile files (see profile.h). */
#include "io/profile.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
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

int st_profile_load(const char *path, uint32_t n_layer, uint32_t n_expert, struct st_profile *out) {
  memset(out, 0, sizeof *out);
  FILE *f = st_fopen_regular(path);
  if (!f) return st_error_context(ST_EIO, "expert profile");
  char line[256];
  int rc = 0;
  unsigned version = 0;
  uint32_t L = 0, E = 0, K = 0;
  uint64_t tokens = 0;
  if (!fgets(line, sizeof line, f) || sscanf(line, "strata-expert-profile %u", &version) != 1)
    rc = st_set_error(ST_EFORMAT, "%s:1: not an expert profile (expected 'strata-expert-profile 1')", path);
  else if (version != 1)
    rc = st_set_error(ST_EFORMAT, "%s:1: profile version %u is not supported (this strata reads version 1)", path, version);
  else if (!fgets(line, sizeof line, f) ||
           sscanf(line, "layers %" SCNu32 " experts %" SCNu32 " top_k %" SCNu32 " tokens %" SCNu64, &L, &E, &K, &tokens) != 4)
    rc = st_set_error(ST_EFORMAT, "%s:2: expected 'layers L experts E top_k K tokens N'", path);
  else if (L != n_layer || E != n_expert)
    rc = st_set_error(ST_EINVAL, "%s: profile is for a model of %u layers x %u experts, this model has %u x %u",
                      path, L, E, n_layer, n_expert);
  const size_t n = (size_t)n_layer * n_expert;
  uint8_t *seen = rc ? NULL : calloc(n, 1);
  out->pairs = rc ? NULL : malloc(sizeof *out->pairs * n);
  if (!rc && (!seen || !out->pairs)) rc = st_set_error(ST_ENOMEM, "out of memory reading %s", path);
  for (size_t i = 0; !rc && i < n; i++) {
    struct st_profile_pair p;
    char extra;
    if (!fgets(line, sizeof line, f)) {
      rc = st_set_error(ST_EFORMAT, "%s: ends after %zu of %zu expert pairs", path, i, n);
    } else if (sscanf(line, "%" SCNu32 " %" SCNu32 " %" SCNu64 " %c", &p.layer, &p.expert, &p.count, &extra) != 3 ||
               p.layer >= n_layer || p.expert >= n_expert) {
      rc = st_set_error(ST_EFORMAT, "%s:%zu: expected 'layer expert count' with layer < %u and expert < %u", path,
                        i + 3, n_layer, n_expert);
    } else if (seen[(size_t)p.layer * n_expert + p.expert]++) {
      rc = st_set_error(ST_EFORMAT, "%s:%zu: pair (%u, %u) appears twice", path, i + 3, p.layer, p.expert);
    } else if (i > 0 && p.count > out->pairs[i - 1].count) {
      rc = st_set_error(ST_EFORMAT, "%s:%zu: not ranked (count %" PRIu64 " after %" PRIu64 ")", path, i + 3, p.count,
                        out->pairs[i - 1].count);
    } else {
      out->pairs[i] = p;
      out->total += p.count;
    }
  }
  free(seen);
  fclose(f);
  if (rc) {
    st_profile_free(out);
    return rc;
  }
  out->n_layer = L;
  out->n_expert = E;
  out->top_k = K;
  out->tokens = tokens;
  return 0;
}

void st_profile_free(struct st_profile *p) {
  free(p->pairs);
  p->pairs = NULL;
}
