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
 * entries: a slot count, or a negative number for "auto": then the card takes pairs while their
 * sizes (layer_bytes[layer], bytes of one pair of that layer) fit in helper_budget[h] bytes.
 * helper_budget and layer_bytes may be NULL when no helper is auto. Returns 0, or ST_EINVAL for a
 * profile of another shape or more than 3 helpers, or ST_ENOMEM. */
int st_plan_tiers_budget(const struct st_profile *prof, uint32_t n_layer, uint32_t n_expert, int primary_slots,
                         const int *helper_slots, const uint64_t *helper_budget, const uint64_t *layer_bytes,
                         int n_helpers, enum st_helper_placement mode, uint8_t *owner);

/* The same with slot counts only. */
int st_plan_tiers(const struct st_profile *prof, uint32_t n_layer, uint32_t n_expert, int primary_slots,
                  const int *helper_slots, int n_helpers, enum st_helper_placement mode, uint8_t *owner);

/* The candidate order every tier fills in: the profile's routed pairs by rank, then the pairs it
 * never saw routed in expert-then-layer order. order has n_layer * n_expert entries
 * (layer * n_expert + expert). Returns 0, ST_EINVAL (another model's profile) or ST_ENOMEM. */
int st_plan_order(const struct st_profile *prof, uint32_t n_layer, uint32_t n_expert, uint32_t *order);

#endif
