/* Where each expert pair's weights live and its rows are computed (the tiers of DESIGN.md).
 * This is the only place that decides an expert task's worker; the graph asks, codelets never
 * know. Until the GPU caches exist every pair belongs to the CPU pool. */
#ifndef ST_PLACEMENT_H
#define ST_PLACEMENT_H

#include <stdint.h>

enum st_tier {
  ST_TIER_CPU_POOL = 0, /* CPU workers, weights read from the host expert arena */
  ST_TIER_PRIMARY = 1,  /* primary cache: slots on CUDA0 */
  ST_TIER_COUNT = 2,
};

/* Short name used in task names, logs and stats: "CPU", "CUDA0". */
const char *st_tier_name(enum st_tier t);

struct st_placement {
  uint32_t n_layer, n_expert;
  uint8_t *tier; /* [n_layer][n_expert] enum st_tier, owned */
};

/* Every pair on the CPU pool. Returns 0 or ST_ENOMEM. Free with st_placement_free(). */
int st_placement_init(struct st_placement *p, uint32_t n_layer, uint32_t n_expert);
void st_placement_free(struct st_placement *p);

static inline enum st_tier st_placement_tier(const struct st_placement *p, uint32_t layer,
                                             uint32_t expert) {
  return (enum st_tier)p->tier[(uint64_t)layer * p->n_expert + expert];
}

/* The StarPU worker an expert-row task of this tier must run on, or -1 for "any worker of the
 * codelet's CPU variant" (the CPU pool). */
int st_placement_worker(const struct st_placement *p, enum st_tier t);

#endif
