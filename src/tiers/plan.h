/* The fill plan of the expert tiers: which device owns each expert pair, from the expert
 * profile's ranking and each tier's slot count, as the seeds (SECOND_GPU.md) specify:
 *  - CUDA0 (the primary cache) takes the first `primary` ranked pairs;
 *  - with one helper card, it takes the next pairs of the ranking;
 *  - with several helpers (`stripe`), the remaining ranked pairs go round robin over the cards;
 *  - in both cases the ranking is then extended with every pair the profile never saw routed, in
 *    expert-then-layer order, and distributed the same way;
 *  - `layer` placement gives each layer to one helper (layer modulo the number of helpers), which
 *    takes its layers' pairs most-routed first, then the unranked ones;
 *  - a card stops taking pairs when its slots are full; its remaining candidates are not passed to
 *    another card, and they stay on the CPU pool.
 * Each pair ends with exactly one owner. This is the planning step of the helper tiers (the
 * second-GPU issue); the devices are not touched here. */
#ifndef ST_PLAN_H
#define ST_PLAN_H

#include <stdint.h>

struct st_profile;

enum { ST_OWNER_CPU = 0, ST_OWNER_CUDA0 = 1 /* helpers: ST_OWNER_CUDA0 + 1 .. + 3 */ };

enum st_helper_placement { ST_PLACE_STRIPE = 0, ST_PLACE_LAYER = 1 };

/* Fills owner[layer * n_expert + expert] for every pair. helper_slots has n_helpers (0..3)
 * entries. Returns 0, or ST_EINVAL for a profile of another shape or more than 3 helpers, or
 * ST_ENOMEM. */
int st_plan_tiers(const struct st_profile *prof, uint32_t n_layer, uint32_t n_expert, int primary_slots,
                  const int *helper_slots, int n_helpers, enum st_helper_placement mode, uint8_t *owner);

#endif
