/* Where each expert pair's weights live and its rows are computed (the tiers of DESIGN.md), and
 * where the dense work runs. This is the only place that decides a task's target; the graph
 * asks, codelets never know. */
#ifndef ST_PLACEMENT_H
#define ST_PLACEMENT_H

#include <starpu.h>
#include <stdint.h>

#include "codelets/codelets.h"

struct st_model;
struct st_profile;

enum st_tier {
  ST_TIER_CPU_POOL = 0, /* CPU workers, weights read from the host expert arena */
  ST_TIER_PRIMARY = 1,  /* primary cache: slots on CUDA0 */
  ST_TIER_COUNT = 2,
};

/* Short name used in task names, logs and stats: "CPU", "CUDA0". */
const char *st_tier_name(enum st_tier t);

/* The primary cache: `n_slots` expert pairs whose gate/up/down weights were copied once into
 * device memory of CUDA0 and registered there as their home, so StarPU never evicts them. */
struct st_primary_cache {
  int n_slots;
  uint64_t slot_bytes;          /* gate + up + down bytes of one pair */
  uintptr_t dev;                /* n_slots * slot_bytes on CUDA0 (starpu_malloc_on_node) */
  int32_t *slot_pair;           /* [n_slots] layer * n_expert + expert, or -1 */
  starpu_data_handle_t *h;      /* [n_slots][3] gate, up, down */
  uint64_t bytes_uploaded;      /* host->device bytes written into the slots */
};

struct st_placement {
  uint32_t n_layer, n_expert;
  uint8_t *tier;     /* [n_layer][n_expert] enum st_tier, owned */
  int32_t *slot;     /* [n_layer][n_expert] primary-cache slot or -1, owned */
  int cuda0_worker;  /* StarPU worker id of CUDA0, -1 when StarPU has no CUDA worker */
  unsigned cuda0_node;
  struct st_primary_cache cache;
};

/* Every pair on the CPU pool; dense work on CUDA0 when StarPU has a CUDA worker (StarPU must be
 * initialised). Returns 0 or ST_ENOMEM. Free with st_placement_free(). */
int st_placement_init(struct st_placement *p, uint32_t n_layer, uint32_t n_expert);
void st_placement_free(struct st_placement *p);

static inline enum st_tier st_placement_tier(const struct st_placement *p, uint32_t layer,
                                             uint32_t expert) {
  return (enum st_tier)p->tier[(uint64_t)layer * p->n_expert + expert];
}

/* Target of the dense tasks (attention, projections, router, combine, output head): the CUDA0
 * worker when there is one, else any CPU worker. */
struct st_target st_placement_dense_target(const struct st_placement *p);

/* Target of an expert-row task of tier t: the CUDA0 worker for the primary cache, the CPU
 * workers for the pool. */
struct st_target st_placement_expert_target(const struct st_placement *p, enum st_tier t);

/* Bytes of one expert pair's three matrices in `layer`; and the most of any layer (the size of a
 * cache slot: layers may mix types, as Q4_K_M files do for ffn_down). */
uint64_t st_pair_bytes_layer(const struct st_model *m, uint32_t layer);
uint64_t st_pair_bytes(const struct st_model *m);

/* Fills the primary cache with the first `n_slots` pairs of the profile's ranking (fewer when
 * the model has fewer pairs), copying their weights to CUDA0. Needs a CUDA worker (ST_EINVAL
 * "no CUDA device" otherwise) and that the slots fit (ST_ENOMEM naming GiB needed and free).
 * Returns 0 or an error, with the placement unchanged on error. */
int st_primary_cache_fill(struct st_placement *p, const struct st_model *m,
                          const struct st_profile *prof, int n_slots);

/* Replaces the pair in `slot` with (layer, expert): copies its weights into the slot and
 * re-registers the slot's handles; the old pair returns to the CPU pool. No task may be using
 * the slot (call between rounds, after starpu_task_wait_for_all). */
int st_primary_cache_swap(struct st_placement *p, const struct st_model *m, int slot,
                          uint32_t layer, uint32_t expert);

/* The gate/up/down handles of a cached pair's slot. */
static inline starpu_data_handle_t *st_primary_cache_handles(const struct st_placement *p, int slot) {
  return p->cache.h + (size_t)slot * 3;
}

#endif
