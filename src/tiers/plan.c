/* The tiers' fill plan (see plan.h). */
#include "tiers/plan.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "io/profile.h"

int st_plan_order(const struct st_profile *prof, uint32_t n_layer, uint32_t n_expert, uint32_t *order) {
  if (prof->n_layer != n_layer || prof->n_expert != n_expert)
    return st_set_error(ST_EINVAL, "the profile is for %u x %u expert pairs, the model has %u x %u", prof->n_layer,
                        prof->n_expert, n_layer, n_expert);
  const size_t n = (size_t)n_layer * n_expert;
  uint8_t *seen = calloc(n ? n : 1, 1);
  if (!seen) return st_set_error(ST_ENOMEM, "out of memory planning %zu expert pairs", n);
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (prof->pairs[i].count > 0) {
      const uint32_t p = prof->pairs[i].layer * n_expert + prof->pairs[i].expert;
      order[m++] = p;
      seen[p] = 1;
    }
  for (uint32_t x = 0; x < n_expert; x++)
    for (uint32_t l = 0; l < n_layer; l++)
      if (!seen[l * n_expert + x]) order[m++] = l * n_expert + x;
  free(seen);
  return 0;
}

int st_plan_tiers_budget(const struct st_profile *prof, uint32_t n_layer, uint32_t n_expert, int primary_slots,
                         const int *helper_slots, const uint64_t *helper_budget, const uint64_t *layer_bytes,
                         int n_helpers, enum st_helper_placement mode, uint8_t *owner) {
  if (n_helpers < 0 || n_helpers > 3) return st_set_error(ST_EINVAL, "%d helper cards (at most 3)", n_helpers);
  const size_t m = (size_t)n_layer * n_expert;
  uint32_t *order = malloc(sizeof *order * (m ? m : 1));
  if (!order) return st_set_error(ST_ENOMEM, "out of memory planning %zu expert pairs", m);
  int rc = st_plan_order(prof, n_layer, n_expert, order);
  if (rc) {
    free(order);
    return rc;
  }
  memset(owner, ST_OWNER_CPU, m);
  size_t next = 0;
  for (int s = 0; s < primary_slots && next < m; s++) owner[order[next++]] = ST_OWNER_CUDA0;
  int left[3] = {0, 0, 0}, full[3] = {0, 0, 0};
  uint64_t room[3] = {0, 0, 0};
  for (int h = 0; h < n_helpers; h++) {
    const int by_bytes = helper_slots[h] < 0;
    left[h] = by_bytes ? -1 : helper_slots[h];
    room[h] = by_bytes ? helper_budget[h] : 0;
  }
  for (size_t k = 0; next + k < m && n_helpers > 0; k++) {
    const uint32_t pair = order[next + k];
    /* stripe: the k-th remaining candidate belongs to card k mod n; layer: to its layer's card;
     * one card: to that card. A full card's candidates stay on the CPU pool (the seeds: a card's
     * truncated tail is not redistributed). */
    const int card = mode == ST_PLACE_LAYER ? (int)((pair / n_expert) % (uint32_t)n_helpers) : (int)(k % (size_t)n_helpers);
    if (full[card]) continue;
    if (left[card] >= 0) {
      if (left[card] == 0) {
        full[card] = 1;
        continue;
      }
      left[card]--;
    } else {
      const uint64_t b = layer_bytes[pair / n_expert];
      if (b > room[card]) {
        full[card] = 1;
        continue;
      }
      room[card] -= b;
    }
    owner[pair] = (uint8_t)(ST_OWNER_CUDA0 + 1 + card);
  }
  free(order);
  return 0;
}

int st_plan_tiers(const struct st_profile *prof, uint32_t n_layer, uint32_t n_expert, int primary_slots,
                  const int *helper_slots, int n_helpers, enum st_helper_placement mode, uint8_t *owner) {
  return st_plan_tiers_budget(prof, n_layer, n_expert, primary_slots, helper_slots, NULL, NULL, n_helpers, mode, owner);
}
