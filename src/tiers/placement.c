/* Expert placement and the primary cache (see placement.h). Weights are copied into the cache
 * with starpu_interface_copy and registered with their home on CUDA0's memory node, so the
 * scheduler sees them as resident there and never moves or evicts them. */
#include "tiers/placement.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "io/model.h"
#include "io/profile.h"

const char *st_tier_name(enum st_tier t) {
  static const char *names[ST_TIER_COUNT] = {"CPU", "CUDA0"};
  return (unsigned)t < ST_TIER_COUNT ? names[t] : "?";
}

int st_placement_init(struct st_placement *p, uint32_t n_layer, uint32_t n_expert) {
  memset(p, 0, sizeof *p);
  p->n_layer = n_layer;
  p->n_expert = n_expert;
  p->tier = calloc((size_t)n_layer * n_expert, 1);
  p->slot = malloc(sizeof(int32_t) * (size_t)n_layer * n_expert);
  if (!p->tier || !p->slot) return st_set_error(ST_ENOMEM, "out of memory for the placement table");
  for (size_t i = 0; i < (size_t)n_layer * n_expert; i++) p->slot[i] = -1;
  p->cuda0_worker = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
  if (p->cuda0_worker >= 0) p->cuda0_node = starpu_worker_get_memory_node((unsigned)p->cuda0_worker);
  return 0;
}

void st_placement_free(struct st_placement *p) {
  struct st_primary_cache *c = &p->cache;
  if (c->h) {
    for (size_t i = 0; i < (size_t)c->n_slots * 3; i++)
      if (c->h[i]) starpu_data_unregister(c->h[i]);
    starpu_free_on_node(p->cuda0_node, c->dev, (size_t)c->n_slots * c->slot_bytes);
  }
  free(c->h);
  free(c->slot_pair);
  free(p->tier);
  free(p->slot);
  memset(p, 0, sizeof *p);
}

struct st_target st_placement_dense_target(const struct st_placement *p) {
  if (p->cuda0_worker >= 0) return (struct st_target){STARPU_CUDA, p->cuda0_worker, NULL, NULL};
  return (struct st_target){STARPU_CPU, -1, NULL, NULL};
}

struct st_target st_placement_expert_target(const struct st_placement *p, enum st_tier t) {
  if (t == ST_TIER_PRIMARY) return (struct st_target){STARPU_CUDA, p->cuda0_worker, NULL, NULL};
  return (struct st_target){STARPU_CPU, -1, NULL, NULL};
}

uint64_t st_pair_bytes_layer(const struct st_model *m, uint32_t layer) {
  const struct st_layer *L = &m->layers[layer];
  return st_expert_bytes(&L->gate_exps) + st_expert_bytes(&L->up_exps) + st_expert_bytes(&L->down_exps);
}

uint64_t st_pair_bytes(const struct st_model *m) {
  uint64_t most = 0;
  for (uint32_t l = 0; l < m->hp.n_layer; l++) {
    const uint64_t b = st_pair_bytes_layer(m, l);
    most = b > most ? b : most;
  }
  return most;
}

/* Copies (layer, expert)'s weights into `slot` and registers its three handles there. */
static int load_slot(struct st_placement *p, const struct st_model *m, int slot, uint32_t layer, uint32_t expert) {
  struct st_primary_cache *c = &p->cache;
  const struct st_layer *L = &m->layers[layer];
  const struct st_weight *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
  uintptr_t dst = c->dev + (uintptr_t)slot * c->slot_bytes;
  for (int i = 0; i < 3; i++) {
    const uint64_t bytes = st_expert_bytes(w[i]);
    int rc = starpu_interface_copy((uintptr_t)st_expert_ptr(w[i], expert), 0, STARPU_MAIN_RAM, dst, 0,
                                   p->cuda0_node, bytes, NULL);
    if (rc) return st_set_error(ST_ERUNTIME, "copying expert (%u, %u) to CUDA0 failed (%d)", layer, expert, rc);
    starpu_vector_data_register(&c->h[(size_t)slot * 3 + i], (int)p->cuda0_node, dst, (uint32_t)w[i]->ne[1],
                                (size_t)w[i]->row_bytes);
    dst += bytes;
    c->bytes_uploaded += bytes;
  }
  const size_t pair = (size_t)layer * p->n_expert + expert;
  c->slot_pair[slot] = (int32_t)pair;
  p->slot[pair] = slot;
  p->tier[pair] = ST_TIER_PRIMARY;
  return 0;
}

int st_primary_cache_fill(struct st_placement *p, const struct st_model *m,
                          const struct st_profile *prof, int n_slots) {
  if (n_slots <= 0) return 0;
  if (p->cuda0_worker < 0)
    return st_set_error(ST_EINVAL, "--expert-cache needs a CUDA device, and StarPU found none (check STARPU_NCUDA and the driver)");
  const int n_pairs = (int)(p->n_layer * p->n_expert);
  if (n_slots > n_pairs) n_slots = n_pairs;
  struct st_primary_cache *c = &p->cache;
  c->slot_bytes = st_pair_bytes(m);
  const size_t total = (size_t)n_slots * c->slot_bytes;
  const starpu_ssize_t avail = starpu_memory_get_available(p->cuda0_node);
  c->dev = starpu_malloc_on_node(p->cuda0_node, total);
  if (!c->dev)
    return st_set_error(ST_ENOMEM, "the primary cache of %d experts needs %.2f GiB on CUDA0, %.2f GiB are available (lower --expert-cache)",
                        n_slots, total / 1073741824.0, avail / 1073741824.0);
  c->n_slots = n_slots;
  c->slot_pair = malloc(sizeof(int32_t) * (size_t)n_slots);
  c->h = calloc((size_t)n_slots * 3, sizeof(starpu_data_handle_t));
  if (!c->slot_pair || !c->h) return st_set_error(ST_ENOMEM, "out of memory for the cache table");
  const double t0 = st_now();
  double shown = t0;
  for (int s = 0; s < n_slots; s++) {
    int rc = load_slot(p, m, s, prof->pairs[s].layer, prof->pairs[s].expert);
    if (rc) return rc;
    const double now = st_now();
    if (now - shown > 0.5 || (s + 1 == n_slots && now - t0 > 0.5)) { /* a progress line on long fills */
      fprintf(stderr, "\rstrata: filling the primary cache: %d / %d expert pairs (%.2f GiB, %.0f MiB/s)", s + 1, n_slots,
              (double)(s + 1) * c->slot_bytes / 1073741824.0, (double)(s + 1) * c->slot_bytes / 1048576.0 / (now - t0));
      shown = now;
      if (s + 1 == n_slots) fputc('\n', stderr);
    }
  }
  return 0;
}

int st_primary_cache_swap(struct st_placement *p, const struct st_model *m, int slot,
                          uint32_t layer, uint32_t expert) {
  struct st_primary_cache *c = &p->cache;
  const int32_t old = c->slot_pair[slot];
  for (int i = 0; i < 3; i++) {
    starpu_data_unregister(c->h[(size_t)slot * 3 + i]);
    c->h[(size_t)slot * 3 + i] = NULL;
  }
  if (old >= 0) {
    p->slot[old] = -1;
    p->tier[old] = ST_TIER_CPU_POOL;
  }
  return load_slot(p, m, slot, layer, expert);
}
