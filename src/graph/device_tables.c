/* The tiers' device tables for the decode step (graph/decode.h): for each expert pair, where its
 * slot starts in the primary cache on the GPU (gate, up and down one after the other, as
 * tiers/placement.c loads them), or NULL when another tier computes it; the decode GPU tasks read
 * it with the routing, on the device. Also each layer's flag "the CPU pool owns one of its
 * pairs", which decides whether the layer gets CPU-pool lanes. */
#include <stdlib.h>

#include "common.h"
#include "graph/decode.h"
#include "graph/engine.h"

int st_decode_tables_update(struct st_engine *e) {
  struct st_decode *d = e->dec;
  const struct st_placement *pl = &e->placement;
  const uint32_t L = e->hp.n_layer, E = e->hp.n_expert;
  for (uint32_t l = 0; l < L; l++) {
    d->layer_cpu[l] = 0;
    for (uint32_t x = 0; x < E && !e->model->layers[l].dense; x++) /* a dense layer has no experts */
      d->layer_cpu[l] |= st_placement_tier(pl, l, x) == ST_TIER_CPU_POOL;
  }
  if (!d->gpu) return 0;
  const size_t n = (size_t)L * E;
  uintptr_t *table = malloc(sizeof *table * n);
  if (!table) return st_set_error(ST_ENOMEM, "out of memory for the slot table");
  const struct st_expert_cache *C = &pl->cache[0];
  for (size_t i = 0; i < n; i++)
    table[i] = pl->tier[i] == ST_TIER_PRIMARY && pl->slot[i] >= 0 ? C->dev + C->slot_off[pl->slot[i]] : 0;
  const int rc = starpu_interface_copy((uintptr_t)table, 0, STARPU_MAIN_RAM, (uintptr_t)d->ctx.dev.slot_ptr, 0,
                                       d->primary_node, sizeof *table * n, NULL);
  free(table);
  return rc ? st_set_error(ST_ERUNTIME, "copying the slot table to the primary GPU failed (%d)", rc) : 0;
}
