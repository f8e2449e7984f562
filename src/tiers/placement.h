/* Where each expert pair's weights live and its rows are computed (the tiers of DESIGN.md), and
 * where each layer's dense work runs. This is the only place that decides a task's target; the
 * graph asks, codelets never know.
 *
 * An expert pair has exactly one owner: the CPU pool, or one GPU expert cache. The caches are
 * numbered: cache 0 is the primary cache (on CUDA0, or the device STRATA_PRIMARY_DEVICE names),
 * which also runs the dense layers; then either up to three helper caches (the seeds'
 * --expert-cache-device1..3), or one peer tier (--peer-device), or, with a layer split, one cache
 * per further pipeline stage. A pair's tier is 0 for the CPU pool and 1 + i for cache i. */
#ifndef ST_PLACEMENT_H
#define ST_PLACEMENT_H

#include <starpu.h>
#include <stdint.h>

#include "codelets/codelets.h"

struct st_model;
struct st_profile;
struct st_host_arena;

#define ST_MAX_CACHES 8 /* the primary and 3 helpers, or the primary and a peer, or 8 split stages */

enum st_tier {
  ST_TIER_CPU_POOL = 0, /* CPU workers, weights read from the host expert arena */
  ST_TIER_PRIMARY = 1,  /* cache 0: the primary cache; tiers 2.. are caches 1.. */
  ST_TIER_MAX = 1 + ST_MAX_CACHES,
};

enum st_cache_role {
  ST_ROLE_PRIMARY, /* CUDA0: dense layers, KV cache, attention, the adaptive primary cache */
  ST_ROLE_HELPER,  /* --expert-cache-device1..3: a static cache on another card */
  ST_ROLE_PEER,    /* --peer-device: a second adaptive cache, data over P2P (or the host route) */
  ST_ROLE_STAGE,   /* --layer-split: a later pipeline stage, its layers' dense work and experts */
};

/* One GPU expert cache: slots in one device allocation, each slot one pair's gate, up and down
 * matrices, registered with their home on that device so StarPU never evicts or moves them.
 * Adaptive caches (primary, peer, stages) have slots of one size (the largest pair of any layer:
 * swaps cross layers); helper slots have the aligned size of the pair they hold (the seeds' "actual
 * aligned expert bytes"), and helpers only ever swap within a layer. */
struct st_expert_cache {
  enum st_cache_role role;
  int device;                /* CUDA ordinal (StarPU's devid) */
  int worker;                /* StarPU worker id of that device's CUDA worker */
  unsigned node;             /* its memory node */
  char name[32];             /* "CUDA1" ("CUDA1.1": a second cache on that device), for names, logs, stats */
  int n_slots;
  uint64_t bytes;            /* the allocation: sum of the slot sizes */
  uintptr_t dev;             /* starpu_malloc_on_node(node, bytes) */
  uint64_t *slot_off;        /* [n_slots] byte offset of each slot in dev */
  int32_t *slot_pair;        /* [n_slots] layer * n_expert + expert, or -1 */
  starpu_data_handle_t *h;   /* [n_slots][3] gate, up, down */
  uint64_t bytes_uploaded;   /* host->device bytes written into the slots */
};

struct st_placement {
  uint32_t n_layer, n_expert;
  uint8_t *tier;  /* [n_layer][n_expert] enum st_tier (0 = CPU pool, 1 + i = cache i), owned */
  int32_t *slot;  /* [n_layer][n_expert] slot in its cache, or -1 */
  int n_caches;   /* caches in use (cache[0] exists whenever a CUDA worker does) */
  struct st_expert_cache cache[ST_MAX_CACHES];
  int n_helpers;  /* caches 1..n_helpers are helpers */
  int peer;       /* index of the peer cache (1), or 0 = no peer tier */
  int n_stages;   /* > 1 with a layer split: cache s is stage s */
  uint8_t *layer_stage; /* [n_layer] the cache (stage) whose device runs the layer's dense work */
  int cuda0_worker;     /* the primary's StarPU worker, -1 when StarPU has no CUDA worker */
  unsigned cuda0_node;
  /* where a cache reads a pair it loads (tiers/arena.h): "through the source", the host expert
   * arena when it holds the pair, the mapped file otherwise; NULL = the mapped file */
  const struct st_host_arena *arena;
  int release_source;   /* after loading a pair from the mapped file, release its pages there */
};

/* Every pair on the CPU pool; dense work on the primary device when StarPU has a CUDA worker
 * (StarPU must be initialised). primary_device is the CUDA ordinal of the primary (0 unless
 * STRATA_PRIMARY_DEVICE says otherwise); ST_EINVAL when StarPU has no worker on it while it has
 * CUDA workers. Returns 0, ST_EINVAL or ST_ENOMEM. Free with st_placement_free(). */
int st_placement_init(struct st_placement *p, uint32_t n_layer, uint32_t n_expert, int primary_device);
void st_placement_free(struct st_placement *p);

/* StarPU's CUDA worker on CUDA ordinal `device`, or -1 when that device is not visible to StarPU. */
int st_cuda_worker_of_device(int device);

/* Adds an empty cache of `role` on CUDA ordinal `device` as cache p->n_caches. ST_EINVAL when the
 * device is not visible (naming how many are), or when ST_MAX_CACHES are in use. */
int st_placement_add_cache(struct st_placement *p, enum st_cache_role role, int device);

/* The same on a given CUDA worker: with STARPU_NWORKER_PER_CUDA > 1 several workers share a device,
 * and helper caches may then share one (named "CUDA1.1", ...) so that three helpers can be tested on
 * fewer cards. ST_EINVAL for a worker that is not CUDA or already holds a cache. */
int st_placement_add_cache_on_worker(struct st_placement *p, enum st_cache_role role, int worker);

static inline enum st_tier st_placement_tier(const struct st_placement *p, uint32_t layer,
                                             uint32_t expert) {
  return (enum st_tier)p->tier[(uint64_t)layer * p->n_expert + expert];
}

/* Routed rows (entries) of a batch of T tokens, top-k each, that cache c computes itself; the
 * rest of its experts' rows run on the primary, their weights streamed there. T x k (all) except
 * for the peer tier on the prompt path (T > 1): --peer-prefill-rows, -1 = half of T x k (the
 * seeds' peer-tier-pull-request.txt). p->peer = 0 means no peer: cache 0 is the primary then. */
static inline int st_placement_rows_budget(const struct st_placement *p, int c, int T, int k, int peer_prefill_rows) {
  if (p->peer > 0 && c == p->peer && T > 1) return peer_prefill_rows < 0 ? T * k / 2 : peer_prefill_rows;
  return T * k;
}

/* Short name of a tier, used in task names, logs and stats: "CPU", "CUDA0", "CUDA1", ... */
const char *st_placement_tier_name(const struct st_placement *p, int tier);

/* Target of the dense tasks of `layer` (attention, projections, router, combine): its stage's
 * CUDA worker (the primary without a layer split), else any CPU worker. layer = n_layer is the
 * output head, which runs on the last stage. */
struct st_target st_placement_dense_target(const struct st_placement *p, uint32_t layer);

/* Target of an expert-row task of tier t: that cache's CUDA worker, or the CPU workers for the pool. */
struct st_target st_placement_expert_target(const struct st_placement *p, int tier);

/* Bytes of one expert pair's three matrices in `layer`; and the most of any layer (the size of an
 * adaptive cache's slot: layers may mix types, as Q4_K_M files do for ffn_down). */
uint64_t st_pair_bytes_layer(const struct st_model *m, uint32_t layer);
uint64_t st_pair_bytes(const struct st_model *m);
/* st_pair_bytes_layer rounded up to 256 bytes: a helper slot's size. */
uint64_t st_pair_bytes_aligned(const struct st_model *m, uint32_t layer);

/* Fills cache `c` with the pairs listed in `pairs` (n of them, layer * n_expert + expert, in
 * fill order), copying their weights to its device (from p->arena or the mapping), and marks them as owned by it. Adaptive
 * caches (all roles but helpers) get slots of st_pair_bytes each. Refuses with ST_ENOMEM, naming
 * the GiB needed and available, when the slots would leave less than `keep_free` bytes free on
 * the device (the seeds: each helper keeps 512 MiB). Prints a progress line on long fills.
 * Returns 0 or an error; on error the cache may hold part of the list (free the placement). */
int st_expert_cache_fill(struct st_placement *p, int c, const struct st_model *m, const int32_t *pairs, int n,
                         uint64_t keep_free);

/* Replaces the pair in `slot` of cache `c` with `pair` (layer * n_expert + expert): copies its
 * weights into the slot (which must be large enough: ST_EINVAL otherwise) and re-registers the
 * slot's handles; the old pair returns to the CPU pool. No task may be using the slot (call
 * between rounds, after starpu_task_wait_for_all). */
int st_expert_cache_swap(struct st_placement *p, int c, const struct st_model *m, int slot, int32_t pair);

/* The gate/up/down handles of slot `slot` of cache `c`. */
static inline starpu_data_handle_t *st_expert_cache_handles(const struct st_placement *p, int c, int slot) {
  return p->cache[c].h + (size_t)slot * 3;
}

#endif
