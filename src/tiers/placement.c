/* Expert placement (see placement.h). The CPU pool is the only tier so far. */
#include "tiers/placement.h"

#include <stdlib.h>

#include "common.h"

const char *st_tier_name(enum st_tier t) {
  static const char *names[ST_TIER_COUNT] = {"CPU", "CUDA0"};
  return (unsigned)t < ST_TIER_COUNT ? names[t] : "?";
}

int st_placement_init(struct st_placement *p, uint32_t n_layer, uint32_t n_expert) {
  p->n_layer = n_layer;
  p->n_expert = n_expert;
  p->tier = calloc((size_t)n_layer * n_expert, 1);
  if (!p->tier) return st_set_error(ST_ENOMEM, "out of memory for the placement table");
  return 0;
}

void st_placement_free(struct st_placement *p) {
  free(p->tier);
  p->tier = NULL;
}

int st_placement_worker(const struct st_placement *p, enum st_tier t) {
  (void)p;
  (void)t;
  return -1;
}
