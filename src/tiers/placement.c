/* Expert placement and the GPU expert caches (see placement.h). Weights are copied into a cache
 * with starpu_interface_copy and registered with their home on the cache device's memory node,
 * so the scheduler sees them as resident there and never moves or evicts them. */
#include "tiers/placement.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "io/model.h"
#include "tiers/arena.h"

int st_cuda_worker_of_device(int device) {
  const unsigned n = starpu_worker_get_count();
  for (unsigned w = 0; w < n; w++)
    if (starpu_worker_get_type((int)w) == STARPU_CUDA_WORKER && starpu_worker_get_devid((int)w) == device)
      return (int)w;
  return -1;
}

static int visible_error(const char *what, int device) {
  return st_set_error(ST_EINVAL, "%s: CUDA device %d is not visible (StarPU has %u CUDA worker%s; check "
                      "CUDA_VISIBLE_DEVICES, STARPU_NCUDA and STARPU_WORKERS_CUDAID)",
                      what, device, starpu_cuda_worker_get_count(), starpu_cuda_worker_get_count() == 1 ? "" : "s");
}

int st_placement_init(struct st_placement *p, uint32_t n_layer, uint32_t n_expert, int primary_device) {
  memset(p, 0, sizeof *p);
  p->n_layer = n_layer;
  p->n_expert = n_expert;
  p->tier = calloc((size_t)n_layer * n_expert, 1);
  p->slot = malloc(sizeof(int32_t) * (size_t)n_layer * n_expert);
  p->layer_stage = calloc(n_layer ? n_layer : 1, 1);
  if (!p->tier || !p->slot || !p->layer_stage) return st_set_error(ST_ENOMEM, "out of memory for the placement table");
  for (size_t i = 0; i < (size_t)n_layer * n_expert; i++) p->slot[i] = -1;
  p->cuda0_worker = -1;
  if (starpu_cuda_worker_get_count() == 0) return 0;
  int rc = st_placement_add_cache(p, ST_ROLE_PRIMARY, primary_device);
  if (rc) return st_error_context(rc, primary_device ? "STRATA_PRIMARY_DEVICE" : "the primary device");
  p->cuda0_worker = p->cache[0].worker;
  p->cuda0_node = p->cache[0].node;
  return 0;
}

int st_placement_add_cache_on_worker(struct st_placement *p, enum st_cache_role role, int worker) {
  if (p->n_caches == ST_MAX_CACHES) return st_set_error(ST_EINVAL, "more than %d expert caches", ST_MAX_CACHES);
  if (worker < 0 || starpu_worker_get_type(worker) != STARPU_CUDA_WORKER)
    return st_set_error(ST_EINVAL, "StarPU worker %d is not a CUDA worker", worker);
  const int device = starpu_worker_get_devid(worker);
  int same_device = 0;
  for (int c = 0; c < p->n_caches; c++) {
    if (p->cache[c].worker == worker)
      return st_set_error(ST_EINVAL, "CUDA%d already holds the %s cache", device, c ? "other" : "primary");
    same_device += p->cache[c].device == device;
  }
  struct st_expert_cache *c = &p->cache[p->n_caches++];
  memset(c, 0, sizeof *c);
  c->role = role;
  c->device = device;
  c->worker = worker;
  c->node = starpu_worker_get_memory_node((unsigned)worker);
  /* a second cache on one device (STARPU_NWORKER_PER_CUDA > 1, to test three helpers on fewer cards) */
  if (same_device) snprintf(c->name, sizeof c->name, "CUDA%d.%d", device, same_device);
  else snprintf(c->name, sizeof c->name, "CUDA%d", device);
  return 0;
}

int st_placement_add_cache(struct st_placement *p, enum st_cache_role role, int device) {
  const int w = st_cuda_worker_of_device(device);
  if (w < 0) return visible_error("expert cache", device);
  for (int c = 0; c < p->n_caches; c++)
    if (p->cache[c].device == device)
      return st_set_error(ST_EINVAL, "CUDA%d already holds the %s cache", device, c ? "other" : "primary");
  return st_placement_add_cache_on_worker(p, role, w);
}

void st_placement_free(struct st_placement *p) {
  for (int i = 0; i < p->n_caches; i++) {
    struct st_expert_cache *c = &p->cache[i];
    if (c->h)
      for (size_t s = 0; s < (size_t)c->n_slots * 3; s++)
        if (c->h[s]) starpu_data_unregister(c->h[s]);
    if (c->dev) starpu_free_on_node(c->node, c->dev, c->bytes);
    free(c->h);
    free(c->slot_pair);
    free(c->slot_off);
  }
  free(p->tier);
  free(p->slot);
  free(p->layer_stage);
  memset(p, 0, sizeof *p);
}

const char *st_placement_tier_name(const struct st_placement *p, int tier) {
  if (tier == ST_TIER_CPU_POOL) return "CPU";
  if (tier >= 1 && tier <= p->n_caches) return p->cache[tier - 1].name;
  return tier == ST_TIER_PRIMARY ? "CUDA0" : "?";
}

struct st_target st_placement_dense_target(const struct st_placement *p, uint32_t layer) {
  if (p->cuda0_worker < 0) return (struct st_target){STARPU_CPU, -1, NULL, NULL, 0};
  const int stage = layer < p->n_layer ? p->layer_stage[layer] : (p->n_stages > 1 ? p->n_stages - 1 : 0);
  return (struct st_target){STARPU_CUDA, p->cache[stage].worker, NULL, NULL, 0};
}

struct st_target st_placement_expert_target(const struct st_placement *p, int tier) {
  if (tier >= 1 && tier <= p->n_caches) return (struct st_target){STARPU_CUDA, p->cache[tier - 1].worker, NULL, NULL, 0};
  return (struct st_target){STARPU_CPU, -1, NULL, NULL, 0};
}

uint64_t st_pair_bytes_layer(const struct st_model *m, uint32_t layer) {
  const struct st_layer *L = &m->layers[layer];
  return st_expert_bytes(&L->gate_exps) + st_expert_bytes(&L->up_exps) + st_expert_bytes(&L->down_exps);
}

uint64_t st_pair_bytes_aligned(const struct st_model *m, uint32_t layer) {
  return (st_pair_bytes_layer(m, layer) + 255) & ~(uint64_t)255;
}

uint64_t st_pair_bytes(const struct st_model *m) {
  uint64_t most = 0;
  for (uint32_t l = 0; l < m->hp.n_layer; l++) {
    const uint64_t b = st_pair_bytes_aligned(m, l);
    most = b > most ? b : most;
  }
  return most;
}

/* Copies pair's weights into `slot` of cache c and registers its three handles there. */
static int load_slot(struct st_placement *p, int ci, const struct st_model *m, int slot, int32_t pair) {
  struct st_expert_cache *c = &p->cache[ci];
  const uint32_t layer = (uint32_t)pair / p->n_expert, expert = (uint32_t)pair % p->n_expert;
  const struct st_layer *L = &m->layers[layer];
  const struct st_weight *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
  uintptr_t dst = c->dev + c->slot_off[slot];
  for (int i = 0; i < 3; i++) {
    const uint64_t bytes = st_expert_bytes(w[i]);
    const void *src = st_host_arena_src(p->arena, m, layer, expert, i);
    int rc = starpu_interface_copy((uintptr_t)src, 0, STARPU_MAIN_RAM, dst, 0, c->node, bytes, NULL);
    if (rc) return st_set_error(ST_ERUNTIME, "copying expert (%u, %u) to %s failed (%d)", layer, expert, c->name, rc);
    starpu_vector_data_register(&c->h[(size_t)slot * 3 + i], (int)c->node, dst, (uint32_t)w[i]->ne[1],
                                (size_t)w[i]->row_bytes);
    /* read-only: no implicit dependencies (engine.c reg_read_only says why) */
    starpu_data_set_sequential_consistency_flag(c->h[(size_t)slot * 3 + i], 0);
    dst += bytes;
    c->bytes_uploaded += bytes;
  }
  if (p->release_source) st_host_arena_release_pair(p->arena, m, layer, expert);
  c->slot_pair[slot] = pair;
  p->slot[pair] = slot;
  p->tier[pair] = (uint8_t)(1 + ci);
  return 0;
}

int st_expert_cache_fill(struct st_placement *p, int ci, const struct st_model *m, const int32_t *pairs, int n,
                         uint64_t keep_free) {
  if (n <= 0) return 0;
  struct st_expert_cache *c = &p->cache[ci];
  const int uniform = c->role != ST_ROLE_HELPER;
  c->slot_off = malloc(sizeof(uint64_t) * (size_t)n);
  c->slot_pair = malloc(sizeof(int32_t) * (size_t)n);
  c->h = calloc((size_t)n * 3, sizeof(starpu_data_handle_t));
  if (!c->slot_off || !c->slot_pair || !c->h) return st_set_error(ST_ENOMEM, "out of memory for the cache table");
  uint64_t total = 0;
  for (int s = 0; s < n; s++) {
    c->slot_off[s] = total;
    total += uniform ? st_pair_bytes(m) : st_pair_bytes_aligned(m, (uint32_t)pairs[s] / p->n_expert);
  }
  const starpu_ssize_t avail = starpu_memory_get_available(c->node);
  if ((int64_t)(total + keep_free) > (int64_t)avail)
    return st_set_error(ST_ENOMEM, "the %s expert cache of %d pairs needs %.2f GiB on %s and %.2f GiB must stay free, "
                        "%.2f GiB are available (lower its slot count)",
                        ci == 0 ? "primary" : c->name, n, total / 1073741824.0, c->name, keep_free / 1073741824.0,
                        avail / 1073741824.0);
  c->dev = starpu_malloc_on_node(c->node, total);
  if (!c->dev)
    return st_set_error(ST_ENOMEM, "the expert cache of %d pairs needs %.2f GiB on %s, %.2f GiB are available (lower its slot count)",
                        n, total / 1073741824.0, c->name, avail / 1073741824.0);
  c->bytes = total;
  c->n_slots = n;
  for (int s = 0; s < n; s++) c->slot_pair[s] = -1;
  const double t0 = st_now();
  double shown = t0;
  for (int s = 0; s < n; s++) {
    int rc = load_slot(p, ci, m, s, pairs[s]);
    if (rc) return rc;
    const double now = st_now();
    if (now - shown > 0.5 || (s + 1 == n && now - t0 > 0.5)) { /* a progress line on long fills */
      fprintf(stderr, "\rstrata: filling the %s expert cache: %d / %d expert pairs (%.2f GiB, %.0f MiB/s)", c->name,
              s + 1, n, (double)(c->slot_off[s] + st_pair_bytes_layer(m, (uint32_t)pairs[s] / p->n_expert)) / 1073741824.0,
              (double)c->bytes_uploaded / 1048576.0 / (now - t0));
      shown = now;
      if (s + 1 == n) fputc('\n', stderr);
    }
  }
  return 0;
}

int st_expert_cache_swap(struct st_placement *p, int ci, const struct st_model *m, int slot, int32_t pair) {
  struct st_expert_cache *c = &p->cache[ci];
  const uint64_t room = (slot + 1 < c->n_slots ? c->slot_off[slot + 1] : c->bytes) - c->slot_off[slot];
  if (st_pair_bytes_layer(m, (uint32_t)pair / p->n_expert) > room)
    return st_set_error(ST_EINVAL, "%s slot %d holds %" PRIu64 " bytes, too few for pair (%u, %u)", c->name, slot, room,
                        (uint32_t)pair / p->n_expert, (uint32_t)pair % p->n_expert);
  const int32_t old = c->slot_pair[slot];
  for (int i = 0; i < 3; i++) {
    starpu_data_unregister(c->h[(size_t)slot * 3 + i]);
    c->h[(size_t)slot * 3 + i] = NULL;
  }
  if (old >= 0) {
    p->slot[old] = -1;
    p->tier[old] = ST_TIER_CPU_POOL;
  }
  return load_slot(p, ci, m, slot, pair);
}
