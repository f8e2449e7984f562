/* Expert profiles: every expert pair of a model ranked by how often the router chose it over a
 * calibration text (`strata profile`); the expert caches fill in rank order. The text format is
 * documented in doc/expert-profile.md:
 *   strata-expert-profile 1
 *   layers <L> experts <E> top_k <K> tokens <N>
 *   <layer> <expert> <count>        (L * E lines, most-routed first)
 */
#ifndef ST_PROFILE_H
#define ST_PROFILE_H

#include <stdint.h>

struct st_profile_pair {
  uint32_t layer, expert;
  uint64_t count;
};

struct st_profile {
  uint32_t n_layer, n_expert, top_k;
  uint64_t tokens;
  uint64_t total;               /* sum of counts (routed (token, expert) entries) */
  struct st_profile_pair *pairs; /* n_layer * n_expert, ranked; owned */
};

/* Ranks `counts` ([n_layer][n_expert] routed entries) and writes the profile to `path`.
 * Ties are ranked by (layer, expert). Returns 0 or ST_EIO / ST_ENOMEM. */
int st_profile_write(const char *path, uint32_t n_layer, uint32_t n_expert, uint32_t top_k,
                     uint64_t tokens, const uint64_t *counts);

/* Reads `path` and checks it is for a model of n_layer layers, n_expert experts and top-k top_k
 * (ST_EINVAL naming both shapes otherwise); strictly: exact keywords, whole decimal numbers
 * (no sign, none past 2^32 - 1 for layers, experts and top_k, nor past 2^64 - 1 for counts;
 * never wrapped), single spaces, nothing after a line's last number nor after the last pair,
 * lines of any length; every pair once, ranked by count (ST_EFORMAT with the file and line
 * number otherwise). *out is filled; free with st_profile_free(). What it accepts,
 * st_profile_write writes back byte for byte (tests/fuzz_text.c checks it). */
int st_profile_load(const char *path, uint32_t n_layer, uint32_t n_expert, uint32_t top_k, struct st_profile *out);
void st_profile_free(struct st_profile *p);

#endif
