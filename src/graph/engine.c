/* Builds and runs the StarPU task graph of a batch (see engine.h). Per layer: one attention task
 * per KV head, the attention output projection in row slices, the router; the host then reads
 * the routing table, submits one expert-row task per active expert pair (large ones sliced by
 * rows) on the worker its tier gives, and a combine task that sums the experts' outputs in
 * top-k slot order. Slicing never depends on the number of workers, so logits are bitwise
 * identical under any scheduler or worker count. */
#include "graph/engine.h"

#include <errno.h>
#include <math.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codelets/codelets.h"
#include "codelets/layer_cpu.h"
#include "codelets/quant.h"
#include "common.h"
#include "graph/recorder.h"
#include "graph/sampler.h"
#include "io/arch.h"
#include "io/gguf.h"
#include "config.h"
#ifdef ST_HAVE_CUDA
#include "codelets/cuda/cuda_codelets.h"
#endif
#include "graph/batch.h"
#include "graph/decode.h"
#include "graph/prompt.h"
#include "io/profile.h"
#include "tiers/plan.h"


/* The engine's STRATA_ switches (doc/tuning.md), read once, here, and refused when malformed:
 * a typo must not silently change what runs. */
struct env_conf {
  long ff_slice;       /* STRATA_FF_SLICE: FFN rows per CPU-pool slice, 0 = no split */
  long cublas;         /* STRATA_CUBLAS: 0 never, 1 from CUBLAS_ROWS token rows, N >= 2 from N */
  long cublas_tf32;    /* STRATA_CUBLAS_TF32: 0 (float32 GEMMs, CUBLAS_COMPUTE_32F_PEDANTIC) or 1 (TF32 tensor cores) */
  long int8_dot;       /* STRATA_INT8_DOT: 0 or 1 */
  long mmq;            /* STRATA_MMQ: 0 or 1 */
  long flash_mma;      /* STRATA_FLASH_MMA: 0 or 1 */
  long primary_device; /* STRATA_PRIMARY_DEVICE: CUDA ordinal of the primary */
  long decode_graph;   /* STRATA_DECODE_GRAPH: 0 or 1 */
  long prompt_lanes;   /* STRATA_PROMPT_LANES: 0 or 1 */
  long pdl;            /* STRATA_PDL: 0 or 1 */
  long layer_span;     /* STRATA_LAYER_SPAN: 0 (every layer) or 1..4096 (default 12) */
  long mxfp4_int8;     /* STRATA_MXFP4_INT8: 0 or 1 */
  long step_wait;      /* STRATA_STEP_WAIT: 0 or 1 */
  long presubmit;      /* STRATA_PRESUBMIT: 0 or 1 */
  long gpu_argmax;     /* STRATA_GPU_ARGMAX: 0 or 1 */
  long lane_stats;     /* STRATA_LANE_STATS: 0 or 1 */
  long lane_token;     /* STRATA_LANE_TOKEN: 0 or 1 */
  int lane_rows[ST_LANE_ROW_KINDS]; /* STRATA_LANE_ROWS (0: the default) */
  int has_primary;     /* STRATA_PRIMARY_DEVICE is set */
};
#define ST_CUDA_CONTEXT_MIB 600 /* a CUDA context with cuBLAS on an H200, about (--gpu-mem) */
#define FF_SLICE 0      /* STRATA_FF_SLICE's default: the prompt path's CPU-pool experts are not split
                          * (the decode step's lanes share an expert between workers instead) */
#define CUBLAS_ROWS 32

/* A whole number in [lo, hi] from `name`, def when unset; ST_EINVAL naming the variable. */
static int env_long(const char *name, long lo, long hi, long def, long *out) {
  const char *v = getenv(name);
  *out = def;
  if (!v) return 0;
  char *end;
  errno = 0;
  const long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return st_set_error(ST_EINVAL, "%s=%s: expected a whole number %ld..%ld (doc/tuning.md)", name, v, lo, hi);
  *out = x;
  return 0;
}

void st_engine_gpu_memory_log(const char *stage) {
#ifdef ST_HAVE_CUDA
  if (!st_memory_log_on()) return;
  for (unsigned w = 0; w < starpu_worker_get_count(); w++) {
    if (starpu_worker_get_type((int)w) != STARPU_CUDA_WORKER) continue;
    const int dev = starpu_worker_get_devid((int)w);
    int seen = 0; /* one line per device (several workers may share one) */
    for (unsigned v = 0; v < w; v++) seen |= starpu_worker_get_type((int)v) == STARPU_CUDA_WORKER && starpu_worker_get_devid((int)v) == dev;
    if (seen) continue;
    const unsigned node = starpu_worker_get_memory_node(w);
    const double total = (double)starpu_memory_get_total(node), avail = (double)starpu_memory_get_available(node);
    fprintf(stderr, "strata: memory: %s: CUDA%d in use on the card %.0f MiB; StarPU's allocations %.0f MiB of its limit %.0f MiB\n",
            stage, dev, st_cuda_device_used_mib(dev), (total - avail) / 1048576.0, total / 1048576.0);
  }
#else
  (void)stage;
#endif
}

/* StarPU aborts the process when it cannot create its sampling folder (performance models, bus
 * calibration; StarPU 1.3's common/utils.c: $STARPU_PERF_MODEL_DIR, else .starpu/sampling under
 * $XDG_CACHE_HOME, $STARPU_HOME, $HOME or /tmp, the first set): the engine makes it first, and
 * refuses with the reason where it cannot. */
static int starpu_folder_ok(void) {
  static const char *vars[] = {"XDG_CACHE_HOME", "STARPU_HOME", "HOME"};
  const char *var = "STARPU_PERF_MODEL_DIR", *base = getenv(var);
  char path[4096];
  if (base) snprintf(path, sizeof path, "%s", base);
  else {
    for (int i = 0; i < 3 && !base; i++) base = getenv(var = vars[i]);
    if (!base) base = "/tmp", var = "no STARPU_HOME or HOME";
    snprintf(path, sizeof path, "%s/.starpu/sampling", base);
  }
  if (!st_mkdir_p(path, 0755) && access(path, W_OK) == 0) return 0;
  const int err = errno ? errno : EACCES;
  return st_set_error(ST_EINVAL, "StarPU's folder %s (from %s) cannot be created or written: %s; set %s to a writable "
                      "folder (doc/tuning.md)", path, var, strerror(err), base == getenv(var) ? var : "STARPU_HOME");
}

static int read_env(struct env_conf *c) {
  int rc = env_long("STRATA_FF_SLICE", 0, 1 << 20, FF_SLICE, &c->ff_slice);
  if (!rc && c->ff_slice % 32)
    rc = st_set_error(ST_EINVAL, "STRATA_FF_SLICE=%ld: expected 0 or a multiple of 32 (doc/tuning.md)", c->ff_slice);
  if (!rc) rc = env_long("STRATA_CUBLAS", 0, 1 << 20, 1, &c->cublas);
  if (!rc) rc = env_long("STRATA_CUBLAS_TF32", 0, 1, 1, &c->cublas_tf32);
  if (!rc) rc = env_long("STRATA_INT8_DOT", 0, 1, 1, &c->int8_dot);
  if (!rc) rc = env_long("STRATA_MMQ", 0, 1, 1, &c->mmq);
  if (!rc) rc = env_long("STRATA_FLASH_MMA", 0, 1, 1, &c->flash_mma);
  if (!rc) rc = env_long("STRATA_PRIMARY_DEVICE", 0, 63, 0, &c->primary_device);
  if (!rc) rc = env_long("STRATA_DECODE_GRAPH", 0, 1, 1, &c->decode_graph);
  if (!rc) rc = env_long("STRATA_PROMPT_LANES", 0, 1, 1, &c->prompt_lanes);
  if (!rc) rc = env_long("STRATA_PDL", 0, 1, 1, &c->pdl);
  if (!rc) rc = env_long("STRATA_LAYER_SPAN", 0, 4096, 12, &c->layer_span);
  if (!rc) rc = env_long("STRATA_MXFP4_INT8", 0, 1, 1, &c->mxfp4_int8);
  if (!rc) rc = env_long("STRATA_STEP_WAIT", 0, 1, 1, &c->step_wait);
  if (!rc) rc = env_long("STRATA_PRESUBMIT", 0, 1, 1, &c->presubmit);
  if (!rc) rc = env_long("STRATA_GPU_ARGMAX", 0, 1, 1, &c->gpu_argmax);
  if (!rc) rc = env_long("STRATA_LANE_STATS", 0, 1, 0, &c->lane_stats);
  if (!rc) rc = env_long("STRATA_LANE_TOKEN", 0, 1, 1, &c->lane_token);
  if (!rc) rc = st_decode_lane_rows_env(c->lane_rows);
  long memory_log; /* read by tiers/arena.c st_memory_log_on; checked here like the others */
  if (!rc) rc = env_long("STRATA_MEMORY_LOG", 0, 1, 0, &memory_log);
  c->has_primary = getenv("STRATA_PRIMARY_DEVICE") != NULL;
  return rc;
}

/* FFN slices per CPU-pool expert task (STRATA_FF_SLICE rows each; 0 = no split; a slice that does
 * not divide the FFN, or more than half of it, does not split either): a fixed function of the
 * model and that setting, never of the workers, so the summation order (and the logits) stay the
 * same under any scheduler. */
static int ff_parts_for(const struct st_hparams *hp, long slice) {
  if (slice <= 0 || hp->n_ff_exp < 2 * slice || hp->n_ff_exp % slice) return 1;
  return (int)(hp->n_ff_exp / slice);
}

#define HEAD_SLICE_ROWS 4096    /* output-head rows per task */
#define O_SLICE_ROWS 512        /* attention-output rows per task */

starpu_data_handle_t st_engine_reg(const void *ptr, uint64_t nx, uint64_t elemsize) {
  starpu_data_handle_t h;
  starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)ptr, (uint32_t)nx, (size_t)elemsize);
  return h;
}

/* A read-only weight: no task ever writes it, so it needs no implicit dependencies; and with them
 * StarPU built with FxT (as strata's is) records every reader's job id on the handle in a list
 * only a writer clears ("ghost accessors", implicit_data_deps.c), which grew the process by about
 * 94 bytes per task (issue #21). */
static starpu_data_handle_t reg_read_only(const void *ptr, uint64_t nx, uint64_t elemsize) {
  starpu_data_handle_t h = st_engine_reg(ptr, nx, elemsize);
  starpu_data_set_sequential_consistency_flag(h, 0);
  return h;
}

static starpu_data_handle_t reg_weight(const struct st_weight *w) {
  return reg_read_only(w->data, w->ne[1] * w->ne[2], w->row_bytes);
}

struct st_wdesc st_engine_wdesc(const struct st_weight *w) {
  return (struct st_wdesc){w->type, w->row_bytes, (int64_t)w->ne[0]};
}


/* Task names of one layer: router, combine, one expert group per GPU cache (ST_MAX_CACHES), one per
 * attention group, one per attn_output slice. */
int st_engine_names_per_layer(const struct st_engine *e) { return NAME_ATTN + (int)e->hp.n_head_kv + e->n_slices_o; }

/* Every task name the graph uses, made once (StarPU keeps the pointer, not a copy), NAME_BYTES each. */
#define NAME_BYTES 56
static int make_names(struct st_engine *e) {
  const struct st_hparams *hp = &e->hp;
  const int per_layer = st_engine_names_per_layer(e);
  const size_t n_names = 2 * (size_t)hp->n_layer * hp->n_expert + (size_t)hp->n_layer * per_layer + e->n_slices_head;
  e->names = malloc(n_names * NAME_BYTES);
  e->expert_names = malloc(sizeof(char *) * (size_t)hp->n_layer * hp->n_expert);
  e->stream_names = malloc(sizeof(char *) * (size_t)hp->n_layer * hp->n_expert);
  e->layer_names = malloc(sizeof(char *) * (size_t)hp->n_layer * per_layer);
  e->head_names = malloc(sizeof(char *) * (size_t)e->n_slices_head);
  if (!e->names || !e->expert_names || !e->stream_names || !e->layer_names || !e->head_names)
    return st_set_error(ST_ENOMEM, "out of memory for task names");
  char *p = e->names;
#define NAME(dst, ...)               \
  do {                               \
    snprintf(p, NAME_BYTES, __VA_ARGS__); \
    (dst) = p;                       \
    p += NAME_BYTES;                 \
  } while (0)
  for (uint32_t l = 0; l < hp->n_layer; l++) {
    for (uint32_t x = 0; x < hp->n_expert; x++) {
      NAME(e->expert_names[l * hp->n_expert + x], "expert_rows L%u E%u CPU", l, x);
      NAME(e->stream_names[l * hp->n_expert + x], "expert_rows L%u E%u CUDA0 stream", l, x);
    }
    const char **ln = e->layer_names + (size_t)l * per_layer;
    NAME(ln[0], "router L%u", l);
    NAME(ln[1], "combine L%u", l);
    for (int c = 0; c < ST_MAX_CACHES; c++)
      NAME(ln[2 + c], "expert_rows L%u %s", l, c < e->placement.n_caches ? e->placement.cache[c].name : "CUDA?");
    for (uint32_t g = 0; g < hp->n_head_kv; g += (uint32_t)e->attn_groups_per_task)
      if (e->attn_groups_per_task == 1) NAME(ln[NAME_ATTN + g], "attention L%u G%u", l, g);
      else NAME(ln[NAME_ATTN + g / e->attn_groups_per_task], "attention L%u", l);
    for (int s = 0; s < e->n_slices_o; s++) NAME(ln[NAME_ATTN + hp->n_head_kv + s], "attn_output L%u S%d", l, s);
  }
  for (int s = 0; s < e->n_slices_head; s++) NAME(e->head_names[s], "output_head S%d", s);
#undef NAME
  return 0;
}

int st_engine_ctx_size(const struct st_hparams *hp, int requested) {
  return requested > 0 ? requested : (int)(hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
}

struct st_target st_engine_traced(const struct st_engine *e, struct st_target t) {
  if (e->rec) {
    t.done = st_recorder_task_done;
    t.done_arg = e->rec;
  }
  return t;
}
#define traced st_engine_traced

static uint64_t weight_bytes(const struct st_weight *w) { return w->row_bytes * w->ne[1] * w->ne[2]; }

void st_engine_opts_init(struct st_engine_opts *o) {
  memset(o, 0, sizeof *o);
  o->kv_type = o->kv_type_v = ST_TYPE_F16; /* llama.cpp's default; a zeroed struct means f32 */
  o->expert_cache = ST_CACHE_DEFAULT;
  o->peer_reserve_mib = 600;
  o->peer_adapt_swaps = -1;
  o->peer_prefill_rows = -1;
}

void st_engine_layer_weights(const struct st_layer *L, const struct st_weight **ws) {
  const struct st_weight *all[W_COUNT] = {&L->attn_norm, &L->wq,     &L->wk,       &L->wv,    &L->wo,
                                          &L->q_norm,    &L->k_norm, &L->ffn_norm, &L->router};
  memcpy(ws, all, sizeof all);
}

void st_engine_mla_weights(const struct st_layer *L, const struct st_weight **mw) {
  const struct st_weight *all[ST_MLA_W] = {&L->wq_a, &L->wq_b, &L->wkv_a, &L->wk_b, &L->wv_b, &L->q_a_norm, &L->kv_a_norm};
  memcpy(mw, all, sizeof all);
}

/* Bytes of the dense weights of layers [l0, l1) (and of the output head when `head`). */
static uint64_t dense_bytes(const struct st_engine *e, uint32_t l0, uint32_t l1, int head) {
  uint64_t dense = head ? weight_bytes(&e->model->output) + weight_bytes(&e->model->output_norm) : 0;
  for (uint32_t l = l0; l < l1; l++) {
    const struct st_layer *L = &e->model->layers[l];
    const struct st_weight *ws[W_COUNT];
    st_engine_layer_weights(L, ws);
    for (int i = 0; i < W_COUNT; i++) dense += weight_bytes(ws[i]);
    /* the fixed FFN (a dense layer's, a shared expert), on the GPU with the dense work */
    const struct st_weight *fw[6] = {&L->ffn_gate, &L->ffn_up, &L->ffn_down, &L->gate_shexp, &L->up_shexp, &L->down_shexp};
    for (int i = 0; i < 6; i++) dense += fw[i]->data ? weight_bytes(fw[i]) : 0;
    /* MLA's matrices and norms */
    const struct st_weight *mw[ST_MLA_W];
    st_engine_mla_weights(L, mw);
    for (int i = 0; i < ST_MLA_W; i++) dense += mw[i]->data ? weight_bytes(mw[i]) : 0;
  }
  return dense;
}

/* --expert-cache auto on cache c running the dense work of layers [l0, l1): the slots that fit
 * after those layers' dense weights, their KV cache, the prompt-path buffers and a reserve. */
static int auto_slots(const struct st_engine *e, int c, uint32_t l0, uint32_t l1, int head, double reserve_mib) {
  const struct st_hparams *hp = &e->hp;
  const struct st_expert_cache *C = &e->placement.cache[c];
  const uint64_t slot_bytes = st_pair_bytes(e->model), dense = dense_bytes(e, l0, l1, head);
  const uint64_t kv = (uint64_t)(l1 - l0) * hp->n_head_kv * 2 * (uint64_t)e->n_ctx * st_kv_row_bytes(e->kv_type, (int)hp->head_dim);
  /* a chunk's activations, attention rows, expert rows and intermediates; the logits of one token
   * (a chunk's head computes the last token's; --all-logits chunks hold more for a moment, and StarPU
   * makes room by dropping weight replicas it copies back later) */
  const uint64_t buffers = (uint64_t)e->prefill_cap * 4 *
                               (6ull * hp->n_embd + (uint64_t)hp->n_head * hp->head_dim +
                                (uint64_t)hp->n_expert_used * (hp->n_embd + 2ull * hp->n_ff_exp)) +
                           4ull * hp->n_vocab +
                           /* a q8_0 cache: a chunk's flash attention reads one KV group's keys and values
                            * as a half copy of the whole context (codelets/cuda/attention.cu attend) */
                           (e->kv_type == ST_TYPE_Q8_0 ? 4ull * (uint64_t)e->n_ctx * hp->head_dim : 0);
  /* with --gpu-mem half the reserve is outside StarPU's limit (kernel scratch) and half inside it:
   * StarPU's transient replicas (a batch's handles on the prompt path and the per-task path) need room
   * there, or every allocation evicts a dense weight or a KV replica and the run thrashes
   * (measured on the H200: 26 GB host->device for 32 decode tokens with no room left) */
  const double reserve_all = reserve_mib > 0 ? reserve_mib : 1024;
  const uint64_t reserve = (uint64_t)((e->gpu_mem_capped ? reserve_all / 2 : reserve_all) * 1048576.0);
  const int64_t avail = (int64_t)starpu_memory_get_available(C->node);
  const int64_t left = avail - (int64_t)(dense + kv + buffers + reserve);
  const int slots = left > 0 ? (int)(left / (int64_t)slot_bytes) : 0;
  fprintf(stderr,
          "strata: --expert-cache auto: %s has %.2f GiB available; dense weights %.2f GiB, KV cache %.2f GiB, "
          "prompt buffers %.2f GiB, reserve %.2f GiB leave %d slots of %.2f MiB\n",
          C->name, avail / 1073741824.0, dense / 1073741824.0, kv / 1073741824.0, buffers / 1073741824.0,
          reserve / 1073741824.0, slots, slot_bytes / 1048576.0);
  return slots;
}

#define HELPER_KEEP_FREE (512ull << 20) /* the seeds: each helper card keeps at least 512 MiB free */

/* The i-th (1-based) CUDA worker other than the primary's: first one worker of each visible device
 * other than the primary, in device order (the seeds' rule for helpers; a layer split's stages);
 * then, with more_per_card, when StarPU runs several workers per device (STARPU_NWORKER_PER_CUDA >
 * 1, for testing three helpers on fewer cards), the further workers in (device, worker) order. -1
 * when there is none. */
static int nth_other_worker(const struct st_placement *pl, int i, int more_per_card) {
  for (int round = 0; round < 1 + more_per_card; round++) {
    for (int dev = 0; dev < STARPU_NMAXWORKERS && i > 0; dev++) {
      int k = 0; /* the k-th worker of this device */
      for (unsigned w = 0; w < starpu_worker_get_count(); w++) {
        if (starpu_worker_get_type((int)w) != STARPU_CUDA_WORKER || starpu_worker_get_devid((int)w) != dev) continue;
        const int first = k++ == 0;
        if ((int)w == pl->cache[0].worker) continue;
        if (round == 0 ? !first || dev == pl->cache[0].device : first && dev != pl->cache[0].device) continue;
        if (--i == 0) return (int)w;
      }
    }
  }
  return -1;
}

/* Loads the profile and fills the GPU expert caches: the primary (--expert-cache), the helpers
 * (--expert-cache-device1..3) or the peer tier (--peer-device), or one cache per stage of a layer
 * split (--layer-split), in the seeds' fill order (tiers/plan.h). */
static int setup_tiers_with(struct st_engine *e, const struct st_engine_opts *o, const struct st_profile *prof) {
  const struct st_hparams *hp = &e->hp;
  struct st_placement *pl = &e->placement;
  const uint32_t E = hp->n_expert, n_pairs = hp->n_layer * hp->n_expert;
  e->adapt_swaps = o->adapt_swaps;
  e->adapt_interval = o->adapt_interval > 0 ? o->adapt_interval : 32;
  e->peer_adapt_swaps = o->peer_adapt_swaps < 0 ? o->adapt_swaps : o->peer_adapt_swaps;
  e->peer_prefill_rows = o->peer_prefill_rows;
  int n_helpers = 0;
  while (n_helpers < 3 && o->helper_cache[n_helpers]) n_helpers++;
  for (int h = n_helpers; h < 3; h++)
    if (o->helper_cache[h])
      return st_set_error(ST_EINVAL, "--expert-cache-device%d needs --expert-cache-device%d: tiers must be enabled in order",
                          h + 1, h);
  /* the primary cache by default: what fits on CUDA0 when StarPU found one and no other tier is asked for */
  const int cache = o->expert_cache != ST_CACHE_DEFAULT ? o->expert_cache
                    : pl->cuda0_worker >= 0 && !n_helpers && o->peer_device <= 0 && !o->layer_split ? ST_CACHE_AUTO
                                                                                                       : 0;
  if (!cache && !n_helpers && o->peer_device <= 0 && !o->layer_split) return 0;
  if (o->layer_split && (n_helpers || o->peer_device > 0))
    return st_set_error(ST_EINVAL, "--layer-split cannot be combined with helper caches or the peer tier");
  if (n_helpers && o->peer_device > 0)
    return st_set_error(ST_EINVAL, "--peer-device cannot be combined with --expert-cache-device1..3 (the peer tier already caches experts there)");
  if (pl->cuda0_worker < 0) {
    const char *what = o->layer_split ? "--layer-split" : o->peer_device > 0 ? "--peer-device" : n_helpers ? "--expert-cache-device1" : "--expert-cache";
    return st_set_error(ST_EINVAL, "%s needs a CUDA device, and StarPU found none (check STARPU_NCUDA and the driver)", what);
  }
  /* devices first: a missing card is refused before anything is copied */
  if (o->layer_split) {
    for (int i = 1, w; (w = nth_other_worker(pl, i, 0)) >= 0; i++) {
      int rc = st_placement_add_cache_on_worker(pl, ST_ROLE_STAGE, w);
      if (rc) return rc;
    }
    if (pl->n_caches < 2)
      return st_set_error(ST_EINVAL, "--layer-split auto needs at least two visible CUDA devices, StarPU has %d",
                          pl->n_caches);
    pl->n_stages = pl->n_caches;
    for (uint32_t l = 0; l < hp->n_layer; l++) pl->layer_stage[l] = (uint8_t)((uint64_t)l * pl->n_stages / hp->n_layer);
  }
  for (int h = 0; h < n_helpers; h++) {
    const int w = nth_other_worker(pl, h + 1, 1);
    if (w < 0)
      return st_set_error(ST_EINVAL, "--expert-cache-device%d: no CUDA device is visible for it (StarPU has %u CUDA "
                          "worker%s; a helper takes a visible device other than the primary)",
                          h + 1, starpu_cuda_worker_get_count(), starpu_cuda_worker_get_count() == 1 ? "" : "s");
    int rc = st_placement_add_cache_on_worker(pl, ST_ROLE_HELPER, w);
    if (rc) return rc;
  }
  pl->n_helpers = n_helpers;
  if (o->peer_device > 0) {
    if (o->peer_device == pl->cache[0].device)
      return st_set_error(ST_EINVAL, "--peer-device %d is the primary device", o->peer_device);
    int rc = st_placement_add_cache(pl, ST_ROLE_PEER, o->peer_device);
    if (rc) return st_error_context(rc, "--peer-device");
    pl->peer = pl->n_caches - 1;
  }
  e->remote_opt = o->remote_expert_opt && n_helpers > 0;
  if (!cache && !n_helpers && o->peer_device <= 0) return 0; /* a layer split of the dense work only */
  /* no profile yet: a prior that needs no calibration, the plan's order for pairs never seen routed:
   * expert x of every layer before expert x + 1 of any, so every layer gets the same share of the
   * slots (with no routing seen, each layer's top-k is as likely to fall on any of its experts) */
  struct st_profile prior = {hp->n_layer, E, hp->n_expert_used, 0, 0, NULL};
  if (!prof) {
    prior.pairs = calloc(n_pairs ? n_pairs : 1, sizeof *prior.pairs);
    if (!prior.pairs) return st_set_error(ST_ENOMEM, "out of memory for the expert caches' prior");
    for (uint32_t i = 0; i < n_pairs; i++) prior.pairs[i] = (struct st_profile_pair){i / E, i % E, 0};
    prof = &prior;
    fprintf(stderr, "strata: expert profile: none yet; the caches start from a prior (every layer the same share "
                    "of the slots) and the run's routing is learned for the next one (--expert-profile, --no-learn)\n");
  }

  int rc = 0;
  uint32_t *order = malloc(sizeof *order * n_pairs);
  uint8_t *owner = malloc(n_pairs);
  int32_t *list = malloc(sizeof *list * n_pairs);
  uint64_t *layer_bytes = malloc(sizeof *layer_bytes * hp->n_layer);
  if (!order || !owner || !list || !layer_bytes) rc = st_set_error(ST_ENOMEM, "out of memory planning the expert caches");
  if (!rc) rc = st_plan_order(prof, hp->n_layer, E, order);
  for (uint32_t l = 0; !rc && l < hp->n_layer; l++) layer_bytes[l] = st_pair_bytes_aligned(e->model, l);
  if (!rc && pl->n_stages > 1) {
    /* each stage: the ranked pairs of its own layers, --expert-cache of them (auto: what fits) */
    memset(owner, 0, n_pairs);
    for (int s = 0; s < pl->n_stages && !rc; s++) {
      uint32_t l0 = hp->n_layer, l1 = 0;
      for (uint32_t l = 0; l < hp->n_layer; l++)
        if (pl->layer_stage[l] == s) l0 = l < l0 ? l : l0, l1 = l + 1;
      const int want = cache == ST_CACHE_AUTO ? auto_slots(e, s, l0, l1, s == pl->n_stages - 1, o->reserve_mib) : cache;
      for (uint32_t i = 0, taken = 0; i < n_pairs && (int)taken < want; i++)
        if (pl->layer_stage[order[i] / E] == s) owner[order[i]] = (uint8_t)(1 + s), taken++;
    }
  } else if (!rc) {
    int primary = cache == ST_CACHE_AUTO ? auto_slots(e, 0, 0, hp->n_layer, 1, o->reserve_mib) : cache;
    int cards = n_helpers, slots[3] = {0, 0, 0};
    uint64_t budget[3] = {0, 0, 0};
    for (int h = 0; h < n_helpers; h++) {
      slots[h] = o->helper_cache[h] == ST_CACHE_AUTO ? -1 : o->helper_cache[h];
      const int64_t avail = (int64_t)starpu_memory_get_available(pl->cache[1 + h].node);
      if (avail < (int64_t)HELPER_KEEP_FREE)
        rc = st_set_error(ST_ENOMEM, "%s has %.0f MiB available, and a helper card must keep at least 512 MiB free",
                          pl->cache[1 + h].name, avail / 1048576.0);
      budget[h] = avail > (int64_t)HELPER_KEEP_FREE ? (uint64_t)avail - HELPER_KEEP_FREE : 0;
    }
    if (pl->peer) {
      /* the peer: the ranked pairs CUDA0 does not hold, as many as fit (or --peer-slots) */
      cards = 1;
      const uint64_t keep = (uint64_t)(o->peer_reserve_mib * 1048576.0);
      const int64_t avail = (int64_t)starpu_memory_get_available(pl->cache[pl->peer].node);
      const int fit = avail > (int64_t)keep ? (int)(((uint64_t)avail - keep) / st_pair_bytes(e->model)) : 0;
      slots[0] = o->peer_slots > 0 && o->peer_slots < fit ? o->peer_slots : fit;
    }
    if (!rc)
      rc = st_plan_tiers_budget(prof, hp->n_layer, E, primary, slots, budget, layer_bytes, cards,
                                o->gpu_placement == ST_PLACE_LAYER ? ST_PLACE_LAYER : ST_PLACE_STRIPE, owner);
  }
  /* a leading dense layer (deepseek2, glm4moe) has no expert pairs to cache */
  for (uint32_t i = 0; i < n_pairs && !rc; i++)
    if (e->model->layers[i / E].dense) owner[i] = 0;
  /* fill each cache with its pairs in candidate order */
  for (int c = 0; c < pl->n_caches && !rc; c++) {
    int n = 0;
    for (uint32_t i = 0; i < n_pairs; i++)
      if (owner[order[i]] == 1 + c) list[n++] = (int32_t)order[i];
    const uint64_t keep = pl->cache[c].role == ST_ROLE_HELPER ? HELPER_KEEP_FREE
                          : pl->cache[c].role == ST_ROLE_PEER ? (uint64_t)(o->peer_reserve_mib * 1048576.0)
                                                               : 0;
    rc = st_expert_cache_fill(pl, c, e->model, list, n, keep);
  }
  if (!rc) {
    static const char *roles[] = {"primary", "helper", "peer", "stage"};
    double all = 0;
    for (int c = 0; c < pl->n_caches; c++) {
      uint64_t held = 0;
      for (uint32_t i = 0; i < n_pairs; i++)
        if (pl->tier[prof->pairs[i].layer * E + prof->pairs[i].expert] == 1 + c) held += prof->pairs[i].count;
      e->cache_mass[c] = prof->total ? (double)held / (double)prof->total : 0.0;
      all += e->cache_mass[c];
      if (prof == &prior)
        fprintf(stderr, "strata: %s expert cache: %d of %u expert pairs on %s (%.2f GiB), from the prior\n",
                roles[pl->cache[c].role], pl->cache[c].n_slots, n_pairs, pl->cache[c].name,
                pl->cache[c].bytes / 1073741824.0);
      else
        fprintf(stderr, "strata: %s expert cache: %d of %u expert pairs on %s (%.2f GiB), %.1f%% of the profile's routed mass\n",
                roles[pl->cache[c].role], pl->cache[c].n_slots, n_pairs, pl->cache[c].name,
                pl->cache[c].bytes / 1073741824.0, 100.0 * e->cache_mass[c]);
    }
    e->cache_mass_share = all;
    if (pl->n_caches > 1)
      fprintf(stderr, "strata: GPU expert caches hold %.1f%% of the profile's routed mass%s%s\n", 100.0 * all,
              pl->n_helpers ? (o->gpu_placement == ST_PLACE_LAYER ? "; helper placement layer" : "; helper placement stripe") : "",
              e->remote_opt ? "; --remote-expert-opt on" : "");
  }
  free(order);
  free(owner);
  free(list);
  free(layer_bytes);
  free(prior.pairs);
  return rc;
}

/* Loads --expert-profile once (a bad profile is refused even when no cache reads it), then places
 * the tiers. */
static int setup_tiers(struct st_engine *e, const struct st_engine_opts *o) {
  if (!o->expert_profile) return setup_tiers_with(e, o, NULL);
  struct st_profile prof;
  int rc = st_profile_load(o->expert_profile, e->hp.n_layer, e->hp.n_expert, e->hp.n_expert_used, &prof);
  if (rc) return rc;
  rc = setup_tiers_with(e, o, &prof);
  st_profile_free(&prof);
  return rc;
}

/* The host expert arena (tiers/arena.h), once the GPU caches are filled: every pair, or with
 * --resident-experts the CPU pool's, copied into RAM; later refills read through it. */
static int setup_host_arena(struct st_engine *e, const struct st_engine_opts *o, const struct st_host_arena_conf *conf) {
  if (conf->off) {
    fprintf(stderr, "strata: host expert arena: off (STRATA_HOST_ARENA=0): the CPU pool reads the mapped file\n");
    return 0;
  }
  const size_t n_pairs = (size_t)e->hp.n_layer * e->hp.n_expert;
  uint8_t *keep = malloc(n_pairs);
  if (!keep) return st_set_error(ST_ENOMEM, "out of memory planning the host expert arena");
  st_host_arena_plan(e->placement.tier, n_pairs, o->resident_experts, keep);
  const int can_pin = starpu_cuda_worker_get_count() > 0;
  int rc = st_host_arena_create(&e->arena, e->model, keep, o->resident_experts, conf, can_pin);
  free(keep);
  if (!rc) e->placement.arena = &e->arena;
  return rc;
}

/* One handle per matrix of every pair, home in main RAM over its source: the arena's copy, or the
 * mapping for a pair left in the file. A pair's source never changes (swaps copy from it and
 * leave it in place), so the handles stay registered until st_engine_destroy. */
/* The CPU pool's handles of expert pair (l, x), registered on first use over the pair's source
 * (the arena copy, or the mapped file). Registration is lazy because StarPU touches a buffer's first
 * page when it is registered: over a file mapped with huge folios that maps 2 MiB per matrix, and
 * registering the pairs the GPU caches hold (in --resident-experts mode, left in the file) would
 * bring ~2 MiB x 3 of each back into memory (measured: 36.6 instead of ~12 GiB resident on the
 * qwen3-30b-a3b preset with 4,000 pairs cached, bench/RESULTS.md). */
static void pair_handles(struct st_engine *e, uint32_t l, uint32_t x, starpu_data_handle_t out[3], int read_only) {
  const struct st_layer *L = &e->model->layers[l];
  const struct st_weight *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
  for (int i = 0; i < 3; i++) {
    const void *src = st_host_arena_src(&e->arena, e->model, l, x, i);
    out[i] = read_only ? reg_read_only(src, w[i]->ne[1], w[i]->row_bytes) : st_engine_reg(src, w[i]->ne[1], w[i]->row_bytes);
  }
}

const starpu_data_handle_t *st_engine_expert_handles(struct st_engine *e, uint32_t l, uint32_t x) {
  starpu_data_handle_t *he = e->h_expert + ((size_t)l * e->hp.n_expert + x) * 3;
  if (!he[0]) pair_handles(e, l, x, he, 1);
  return he;
}

void st_engine_expert_handles_once(struct st_engine *e, uint32_t l, uint32_t x, starpu_data_handle_t out[3]) {
  pair_handles(e, l, x, out, 0); /* sequential consistency on: the unregistration waits for the task */
}

/* Registers the handles of the pairs the CPU pool computes at start; the GPU caches' pairs get
 * theirs when they first run on the CPU pool or stream (st_engine_expert_handles). */
static void register_expert_handles(struct st_engine *e) {
  for (uint32_t l = 0; l < e->hp.n_layer; l++)
    for (uint32_t x = 0; x < e->hp.n_expert; x++)
      if (st_placement_tier(&e->placement, l, x) == ST_TIER_CPU_POOL) st_engine_expert_handles(e, l, x);
}

int st_engine_kv_planes(const struct st_hparams *hp) { return hp->attn_kind == ST_ATTN_MLA ? 1 : 2; }

int st_engine_kv_rows(const struct st_engine *e, uint32_t l) {
  const uint32_t ring = e->hp.n_swa + (uint32_t)e->prefill_cap;
  return e->model->layers[l].swa && ring < (uint32_t)e->n_ctx ? (int)ring : e->n_ctx;
}

uint64_t st_engine_kv_layer_bytes(const struct st_engine *e, uint32_t l) {
  return (uint64_t)e->hp.n_head_kv * (uint64_t)st_engine_kv_planes(&e->hp) * (uint64_t)st_engine_kv_rows(e, l) *
         st_kv_row_bytes(e->kv_type, (int)e->hp.head_dim);
}

uint64_t st_engine_kv_bytes(const struct st_engine *e) {
  uint64_t b = 0;
  for (uint32_t l = 0; l < e->hp.n_layer; l++) b += st_engine_kv_layer_bytes(e, l);
  return b;
}

int st_engine_visible_cards(void) {
#ifdef ST_HAVE_CUDA
  const char *nc = getenv("STARPU_NCUDA");
  return nc && !strcmp(nc, "0") ? 0 : st_cuda_device_count();
#else
  return 0;
#endif
}

/* --prefill's default: ST_PREFILL_GPU tokens where a GPU computes the prompt (its uncached experts
 * cross the bus once a chunk, and its tensor-core products take bigger tiles), ST_PREFILL_CPU on CPU
 * workers alone (a GPU build on a host without a card, or STARPU_NCUDA=0). */
static int default_prefill(void) { return st_engine_visible_cards() > 0 ? ST_PREFILL_GPU : ST_PREFILL_CPU; }

int st_engine_create(struct st_model *m, const struct st_engine_opts *o, struct st_engine **out) {
  *out = NULL;
  struct st_engine *e = calloc(1, sizeof *e);
  if (!e) return st_set_error(ST_ENOMEM, "out of memory");
  e->model = m;
  e->hp = m->hp;
  const struct st_hparams *hp = &e->hp;
  e->n_ctx = st_engine_ctx_size(hp, o->n_ctx);
  if (hp->n_ctx_train && (uint64_t)e->n_ctx > hp->n_ctx_train)
    fprintf(stderr, "strata: warning: a context of %d tokens is longer than the model was trained for (%llu): "
            "positions past it are extrapolated\n", e->n_ctx, (unsigned long long)hp->n_ctx_train);
  e->prefill = o->prefill > 0 ? o->prefill : default_prefill();
  if (e->prefill > e->n_ctx) e->prefill = e->n_ctx;
  e->prefill_cap = e->prefill;
  e->logits_rows = e->prefill < ST_LOGITS_ROWS ? e->prefill : ST_LOGITS_ROWS;

  struct env_conf env;
  int rc = read_env(&env);
  /* an FFN slice splits down's rows inside the FFN: it must end on the blocks of every layer's
   * down matrix (a 256-weight K or i-quant block cannot be cut at 64) */
  for (uint32_t l = 0; !rc && env.ff_slice > 0 && ff_parts_for(hp, env.ff_slice) > 1 && l < hp->n_layer; l++) {
    const struct st_weight *dw = &m->layers[l].down_exps;
    const uint32_t bs = st_type_info(dw->type)->blck_size;
    if (env.ff_slice % bs)
      rc = st_set_error(ST_EINVAL, "STRATA_FF_SLICE=%ld: this model's %s expert down matrices (%s) take slices of a multiple of %u "
                                   "(doc/tuning.md)", env.ff_slice, st_type_info(dw->type)->name, dw->name, bs);
  }
  if (rc) {
    free(e);
    return rc;
  }
  const size_t T = (size_t)e->prefill, d = hp->n_embd, k = hp->n_expert_used;
  const size_t qw = (size_t)hp->n_head * hp->head_dim;
  e->kv_type = o->kv_type == ST_TYPE_F16 || o->kv_type == ST_TYPE_Q8_0 ? o->kv_type : ST_TYPE_F32;
  /* a q8_0 row is whole blocks of 32 (the row's elements: head_dim, MLA's latent and RoPE parts,
   * and the V part V reads in place: MLA's latent) */
  if (e->kv_type == ST_TYPE_Q8_0 && (hp->head_dim % ST_QK8_0 || (hp->attn_kind == ST_ATTN_MLA && hp->kv_lora % ST_QK8_0)))
    rc = st_set_error(ST_EUNSUP, "--cache-type-k q8_0: this model's KV rows (%u values%s) are not whole q8_0 blocks of 32; "
                      "use f16 or f32", hp->head_dim, hp->attn_kind == ST_ATTN_MLA ? ", MLA's latent part among them" : "");
  const uint64_t kv_row = st_kv_row_bytes(e->kv_type, (int)hp->head_dim);
  const size_t kv_bytes = (size_t)st_engine_kv_bytes(e);
  if (!rc) {
    e->kv = calloc(kv_bytes, 1);
    e->x = malloc(sizeof(float) * T * d);
    e->h = malloc(sizeof(float) * T * d);
    e->ffn_in = malloc(sizeof(float) * T * d);
    e->xo = malloc(sizeof(float) * T * d);
    e->attn = malloc(sizeof(float) * T * qw);
    e->ff_parts = ff_parts_for(hp, env.ff_slice);
    e->expert_out = malloc(sizeof(float) * T * k * d * (size_t)e->ff_parts);
    e->logits = malloc(sizeof(float) * (size_t)e->logits_rows * hp->n_vocab);
    e->routing = malloc(sizeof(struct st_route) * T * k);
    e->h_layer = calloc((size_t)hp->n_layer * W_COUNT, sizeof(starpu_data_handle_t));
    e->h_fixed = calloc((size_t)hp->n_layer * 3, sizeof(starpu_data_handle_t));
    e->h_mla = calloc((size_t)hp->n_layer * ST_MLA_W, sizeof(starpu_data_handle_t));
    e->h_expert = calloc((size_t)hp->n_layer * hp->n_expert * 3, sizeof(starpu_data_handle_t));
    e->h_kv = calloc((size_t)hp->n_layer * hp->n_head_kv * 2, sizeof(starpu_data_handle_t));
    e->route_counts = calloc((size_t)hp->n_layer * hp->n_expert, sizeof(uint64_t));
    e->live_counts = calloc((size_t)hp->n_layer * hp->n_expert, sizeof(uint64_t));
    if (!e->kv || !e->x || !e->h || !e->ffn_in || !e->xo || !e->attn || !e->expert_out ||
        !e->logits || !e->routing || !e->h_layer || !e->h_fixed || !e->h_mla || !e->h_expert || !e->h_kv || !e->route_counts ||
        !e->live_counts)
      rc = st_set_error(ST_ENOMEM, "out of memory for the KV cache (%.1f MiB for %d tokens, %s) and batch buffers",
                        kv_bytes / 1048576.0, e->n_ctx, st_type_info((uint32_t)e->kv_type)->name);
  }
  if (rc) {
    st_engine_destroy(e);
    return rc;
  }

  /* StarPU's FxT trace only when recording (a FxT build writes one by default, at a cost);
   * a user's own STARPU_FXT_TRACE wins. */
  if (o->trace_dir && (rc = st_recorder_check_dir(o->trace_dir))) {
    st_engine_destroy(e);
    return rc;
  }
  if (o->trace_dir) st_recorder_clear_dir(o->trace_dir);
  if (o->trace_dir) {
    char prefix[4200];
    snprintf(prefix, sizeof prefix, "%s/", o->trace_dir);
    setenv("STARPU_FXT_PREFIX", prefix, 1);
    setenv("STARPU_FXT_TRACE", "1", 1);
  } else {
    setenv("STARPU_FXT_TRACE", "0", 0);
  }
  /* the host expert arena's switches (STRATA_HOST_ARENA, STRATA_ARENA_PIN_GIB) */
  struct st_host_arena_conf arena_conf;
  if ((rc = st_host_arena_conf_from_env(&arena_conf))) {
    st_engine_destroy(e);
    return rc;
  }
  /* the second-GPU switches, read once here (doc/tuning.md) */
  const char *env_primary = getenv("STRATA_PRIMARY_DEVICE");
  const int primary_device = env_primary ? atoi(env_primary) : 0;
  const int cublas_rows = env.cublas == 1 ? CUBLAS_ROWS : (int)env.cublas;
  e->int8_dot = (int)env.int8_dot;
  e->mmq = (int)env.mmq;
  e->flash_mma = (int)env.flash_mma;
  e->decode_graph = (int)env.decode_graph;
  e->prompt_lanes = (int)env.prompt_lanes;
  e->pdl = (int)env.pdl;
  e->layer_span = (int)env.layer_span;
  e->mxfp4_int8 = (int)env.mxfp4_int8;
  e->presubmit = (int)env.presubmit;
  e->gpu_argmax = (int)env.gpu_argmax;
  e->lane_stats = (int)env.lane_stats;
  e->lane_token = (int)env.lane_token;
  memcpy(e->lane_rows, env.lane_rows, sizeof e->lane_rows);
  e->step_wait = (int)env.step_wait;
  if (env_primary && primary_device > 0 && o->layer_split) {
    st_engine_destroy(e);
    return st_set_error(ST_EINVAL, "--layer-split cannot be used with STRATA_PRIMARY_DEVICE set (stage 0 is the primary, "
                        "later stages must be after it)");
  }
  if (o->peer_device > 0) {
    const char *no_p2p = getenv("STRATA_PEER_NO_P2P");
    if (no_p2p && atoi(no_p2p) == 1) {
      fprintf(stderr, "strata: peer tier: STRATA_PEER_NO_P2P=1: activations and rows take the host route\n");
      setenv("STARPU_ENABLE_CUDA_GPU_GPU_DIRECT", "0", 1);
    }
#ifdef ST_HAVE_CUDA
    else if (o->peer_device < st_cuda_device_count()) {
      char why[256];
      if (st_cuda_p2p_check(primary_device, o->peer_device, why, sizeof why)) {
        fprintf(stderr, "strata: peer tier: P2P between CUDA%d and CUDA%d works (a test copy each way arrived intact)\n",
                primary_device, o->peer_device);
      } else {
        fprintf(stderr, "strata: peer tier: P2P between CUDA%d and CUDA%d does not work (%s): using the host route\n",
                primary_device, o->peer_device, why);
        setenv("STARPU_ENABLE_CUDA_GPU_GPU_DIRECT", "0", 1);
      }
    }
#endif
  }
  /* StarPU aborts on a malformed worker count: check the ones a user sets most */
  static const char *const counts[] = {"STARPU_NCPU", "STARPU_NCUDA"};
  for (int i = 0; i < 2; i++) {
    const char *v = getenv(counts[i]);
    long x;
    if (v && (rc = env_long(counts[i], i == 0 ? 1 : 0, 4096, 0, &x))) {
      st_engine_destroy(e);
      return i == 0 && !strcmp(v, "0") ? st_set_error(ST_EINVAL, "STARPU_NCPU=0: strata needs at least one CPU worker") : rc;
    }
    /* a CPU worker spins on its core while it waits: more workers than cores wait on each other */
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (v && i == 0 && cores > 0 && x > 4 * cores) {
      st_engine_destroy(e);
      return st_set_error(ST_EINVAL, "STARPU_NCPU=%ld: more than 4 CPU workers a core on this machine's %ld cores (the "
                          "workers would wait on each other for minutes; doc/tuning.md)", x, cores);
    }
    if (v && i == 0 && cores > 0 && x > cores)
      fprintf(stderr, "strata: STARPU_NCPU=%ld is more than this machine's %ld cores: the CPU workers share cores and "
              "every step waits for the slowest (doc/tuning.md)\n", x, cores);
  }
  /* --gpu-mem: StarPU's allocations on each card stay within the cap less the CUDA context and the
   * kernels' scratch (--cache-reserve); a user's own STARPU_LIMIT_CUDA_MEM wins. Without a card it
   * is refused as the GPU tiers are. */
  {
    const char *nc = getenv("STARPU_NCUDA");
    if (o->gpu_mem_gib > 0 && st_engine_visible_cards() <= 0) {
      st_engine_destroy(e);
      return st_set_error(ST_EINVAL, "--gpu-mem needs a CUDA device, and %s (check STARPU_NCUDA and the driver)",
                          nc && !strcmp(nc, "0") ? "STARPU_NCUDA=0 starts none" : "StarPU found none");
    }
  }
  if (o->gpu_mem_gib > 0) {
    const double reserve = o->reserve_mib > 0 ? o->reserve_mib : 1024;
    const long limit = (long)(o->gpu_mem_gib * 1024.0 - ST_CUDA_CONTEXT_MIB - reserve / 2);
    if (limit < 256) {
      st_engine_destroy(e);
      return st_set_error(ST_EINVAL, "--gpu-mem %.2f GiB leaves %ld MiB after the CUDA context (about %d MiB) and "
                          "--cache-reserve (%.0f MiB): give at least %.1f GiB", o->gpu_mem_gib, limit, ST_CUDA_CONTEXT_MIB,
                          reserve, (256 + ST_CUDA_CONTEXT_MIB + reserve) / 1024.0);
    }
    if (getenv("STARPU_LIMIT_CUDA_MEM")) {
      fprintf(stderr, "strata: --gpu-mem: STARPU_LIMIT_CUDA_MEM=%s is set and wins\n", getenv("STARPU_LIMIT_CUDA_MEM"));
    } else {
      char v[32];
      snprintf(v, sizeof v, "%ld", limit);
      setenv("STARPU_LIMIT_CUDA_MEM", v, 1);
      fprintf(stderr, "strata: --gpu-mem %.2f GiB: StarPU may take %ld MiB on each GPU (the rest: the CUDA context, "
              "about %d MiB, and %.0f MiB of kernel scratch, half of --cache-reserve; the other half stays free within "
              "StarPU's share)\n", o->gpu_mem_gib, limit, ST_CUDA_CONTEXT_MIB, reserve / 2);
    }
    e->gpu_mem_capped = 1;
  }
  /* the decode step queues up to this many GPU tasks on CUDA0's stream ahead of the one running */
  setenv("STARPU_CUDA_PIPELINE", "4", 0);
  /* StarPU's notices (a FxT build's warning on every start, perf models being calibrated) are not
   * the user's business unless asked for: STARPU_SILENT=0 shows them. Its errors print regardless. */
  setenv("STARPU_SILENT", "1", 0);
  struct starpu_conf conf;
  starpu_conf_init(&conf);
  /* On a bigger machine keep one core for the thread that submits the graph and reads each
   * layer's routing: every wait there stalls the whole layer. STARPU_NCPU overrides. */
  if (!getenv("STARPU_NCPU") && sysconf(_SC_NPROCESSORS_ONLN) >= 8) conf.reserve_ncpus = 1;
  /* an architecture whose GPU kernels are not checked (st_arch::gpu; none today) runs on CPU workers: unless the user
   * asks for GPUs (a GPU tier flag, or STARPU_NCUDA), StarPU starts without CUDA workers, and a note
   * says so. */
  const int gpu_asked = o->expert_cache > 0 || o->expert_cache == ST_CACHE_AUTO || o->helper_cache[0] || o->helper_cache[1] ||
                        o->helper_cache[2] || o->peer_device > 0 || o->layer_split || o->gpu_mem_gib > 0 ||
                        o->cuda_graphs != ST_CUDA_GRAPHS_OFF || getenv("STARPU_NCUDA");
  if (!st_arch_on_gpu(hp->arch) && !gpu_asked) {
    conf.ncuda = 0;
#ifdef ST_HAVE_CUDA
    if (st_cuda_device_count() > 0)
      fprintf(stderr, "strata: architecture %s computes on CPU workers only so far: the GPUs stay unused "
              "(STRATA_GPU_ARCHS=%s tries its unchecked GPU kernels)\n", st_arch_of(hp->arch)->name, st_arch_of(hp->arch)->name);
#endif
  }
  const int folder_rc = starpu_folder_ok();
  if (folder_rc) {
    st_engine_destroy(e);
    return folder_rc;
  }
  int sret = starpu_init(&conf);
  if (sret) {
    st_engine_destroy(e);
    return st_set_error(ST_ERUNTIME, "StarPU failed to start (starpu_init returned %d)", sret);
  }
  starpu_profiling_status_set(STARPU_PROFILING_ENABLE); /* per-worker task counts for reports */
  {
    const char *want = getenv("STARPU_SCHED");
    struct starpu_sched_policy *pol = starpu_sched_ctx_get_sched_policy(0);
    if (want && *want && pol && pol->policy_name && strcmp(want, pol->policy_name))
      fprintf(stderr, "strata: STARPU_SCHED=%s is not one of StarPU's schedulers; StarPU uses %s (see doc/tuning.md)\n",
              want, pol->policy_name);
  }
  e->started = 1;
  if (starpu_cpu_worker_get_count() == 0) {
    st_engine_destroy(e);
    return st_set_error(ST_ERUNTIME, "StarPU started with no CPU worker (check STARPU_NCPU)");
  }
#ifdef ST_HAVE_CUDA
  if (starpu_cuda_worker_get_count() > 0) starpu_execute_on_each_worker(st_cuda_worker_init, NULL, STARPU_CUDA);
  if (starpu_cuda_worker_get_count() > 0 && cublas_rows > 0) starpu_cublas_init(); /* a handle per CUDA worker */
  st_cuda_gemm_set_tf32((int)env.cublas_tf32);
  e->cublas_rows = starpu_cuda_worker_get_count() > 0 ? cublas_rows : 0;
  e->cublas_tf32 = e->cublas_rows > 0 && env.cublas_tf32;
#else
  (void)cublas_rows;
#endif
  rc = st_placement_init(&e->placement, hp->n_layer, hp->n_expert, primary_device);
  e->placement.release_source = !arena_conf.off; /* the arena, not the mapping, backs the CPU pool */
  /* Dense work on the CPU is sliced so that every CPU worker gets a share; a GPU takes it whole
   * (a slice there would only add task overhead). The slicing depends on the device kind only. */
  if (e->placement.cuda0_worker >= 0) {
    e->attn_groups_per_task = (int)hp->n_head_kv;
    e->n_slices_o = 1;
    e->n_slices_head = 1;
  } else {
    e->attn_groups_per_task = 1;
    e->n_slices_o = st_div_up((int)hp->n_embd, O_SLICE_ROWS);
    while (hp->n_embd % e->n_slices_o) e->n_slices_o++;
    e->n_slices_head = st_div_up((int)hp->n_vocab, HEAD_SLICE_ROWS);
  }
  /* --prompt-stream: on the prompt path an uncached expert with enough rows in the chunk runs on
   * CUDA0, its weights streamed there by StarPU from the pinned host arena; a rule on the chunk's
   * routing alone, so the same prompt runs the same tasks in the same places under any scheduler */
  e->prompt_stream = o->prompt_stream_rows < 0 || e->placement.cuda0_worker < 0 ? 0
                     : o->prompt_stream_rows > 0                            ? o->prompt_stream_rows
                                                                            : ST_STREAM_ROWS;
  /* default_prefill saw a card, but StarPU runs no CUDA worker (STARPU_WORKERS_CUDAID, a failed
   * start, an architecture kept on CPU workers): chunks of the CPU's default in the larger buffers */
  if (o->prefill <= 0 && e->placement.cuda0_worker < 0 && e->prefill > ST_PREFILL_CPU) e->prefill = ST_PREFILL_CPU;
  st_engine_set_cuda_graphs(e, o->cuda_graphs != ST_CUDA_GRAPHS_OFF);
  /* deepseek2 runs on the CPU lanes only so far (graph/decode.h, decode_lane.c) */
  const char *why_arch = NULL;
  if (!rc && e->placement.cuda0_worker >= 0 && !st_decode_gpu_arch(e, &why_arch))
    rc = st_set_error(ST_EUNSUP, "architecture %s computes on CPU workers only so far (%s): leave out the GPU flags and "
                      "STARPU_NCUDA (or set STARPU_NCUDA=0)", st_arch_of(hp->arch)->name, why_arch);
  if (!rc && hp->arch != ST_ARCH_QWEN3MOE && !e->decode_graph)
    rc = st_set_error(ST_EUNSUP, "architecture %s computes through the decode lanes only: STRATA_DECODE_GRAPH=0 takes "
                      "qwen3moe", st_arch_of(hp->arch)->name);
  /* a q8_0 cache on the GPUs: codelets/cuda/attention.cu reads it everywhere but in MLA's kernels */
  if (!rc && e->placement.cuda0_worker >= 0 && e->kv_type == ST_TYPE_Q8_0 && hp->attn_kind == ST_ATTN_MLA)
    rc = st_set_error(ST_EUNSUP, "--cache-type-k q8_0 on a GPU: MLA's latent cache (%s) is f16 or f32 there; use f16, or run "
                      "on CPU workers alone (STARPU_NCUDA=0)", st_arch_of(hp->arch)->name);
  if (!rc && e->placement.cuda0_worker >= 0 && hp->head_dim > 256 && hp->attn_kind != ST_ATTN_MLA)
    rc = st_set_error(ST_EUNSUP, "head_dim %u: the CUDA attention kernel handles at most 256", hp->head_dim);
  if (!rc && e->placement.cuda0_worker >= 0 && hp->n_expert > 1024)
    rc = st_set_error(ST_EUNSUP, "%u experts: the CUDA router handles at most 1024", hp->n_expert);
  if (rc) {
    st_engine_destroy(e);
    return rc;
  }
  e->h_output_norm = reg_weight(&m->output_norm);
  e->h_output = reg_weight(&m->output);
  size_t kv_at = 0; /* layer l's cache after the earlier layers' (st_engine_kv_layer_bytes) */
  for (uint32_t l = 0; l < hp->n_layer; l++) {
    const struct st_layer *L = &m->layers[l];
    const struct st_weight *ws[W_COUNT];
    st_engine_layer_weights(L, ws);
    for (int i = 0; i < W_COUNT; i++) e->h_layer[l * W_COUNT + i] = reg_weight(ws[i]);
    /* the per-task path's and the GPU's handles (MLA's cache holds one plane); a sliding layer's
     * planes hold its ring (st_engine_kv_rows) */
    const int planes = st_engine_kv_planes(hp), rows = st_engine_kv_rows(e, l);
    /* the decode step's GPU task reads a fixed FFN (a dense layer's, a shared expert) as weights too */
    const struct st_weight *fw[3] = {L->dense ? &L->ffn_gate : &L->gate_shexp, L->dense ? &L->ffn_up : &L->up_shexp,
                                     L->dense ? &L->ffn_down : &L->down_shexp};
    for (int i = 0; i < 3 && fw[0]->data && e->placement.cuda0_worker >= 0; i++)
      e->h_fixed[l * 3 + i] = reg_weight(fw[i]);
    /* MLA's latent rows (one plane, n_head_kv 1) and matrices for the GPU's decode step */
    const struct st_weight *mw[ST_MLA_W];
    st_engine_mla_weights(L, mw);
    for (int i = 0; i < ST_MLA_W && hp->attn_kind == ST_ATTN_MLA && e->placement.cuda0_worker >= 0; i++)
      if (mw[i]->data) e->h_mla[l * ST_MLA_W + i] = reg_weight(mw[i]);
    for (uint32_t g = 0; g < hp->n_head_kv; g++)
      for (int c = 0; c < planes; c++) {
        const size_t i = (size_t)g * planes + c;
        uint8_t *plane = (uint8_t *)e->kv + kv_at + i * (size_t)rows * kv_row;
        e->h_kv[((size_t)l * hp->n_head_kv + g) * 2 + c] =
            e->kv_type == ST_TYPE_Q8_0 /* quants and scales: registered as bytes */
                ? st_engine_reg(plane, (uint64_t)rows * kv_row, 1)
                : st_engine_reg(plane, (uint64_t)rows * hp->head_dim, e->kv_type == ST_TYPE_F16 ? 2 : 4);
      }
    kv_at += (size_t)st_engine_kv_layer_bytes(e, l);
  }
  /* The output head stays in the mapping (the arena copies experts only): its pages are mapped now,
   * at load, instead of faulting in one by one during the first prompt (on the development
   * machine's VM that was 0.85-1.1 s of a 121-token prompt; bench/RESULTS.md). */
  st_gguf_populate(m->gguf, m->output.data, weight_bytes(&m->output));
  st_memory_log("before the cache fill", m, NULL, NULL); /* STRATA_MEMORY_LOG=1 (tiers/arena.h) */
  st_engine_gpu_memory_log("before the cache fill");
  if (!rc) rc = setup_tiers(e, o);
  if (!rc) st_memory_log("after the cache fill", m, NULL, e->placement.tier);
  if (!rc) st_engine_gpu_memory_log("after the cache fill");
  if (!rc) rc = setup_host_arena(e, o, &arena_conf);
  if (!rc) register_expert_handles(e);
  if (!rc) st_memory_log("after registering the expert handles", m, &e->arena, e->placement.tier);
  if (!rc) rc = make_names(e);
  if (!rc && o->trace_dir) rc = st_recorder_open(o->trace_dir, &e->rec);
  if (!rc) {
    const char *why = NULL;
    if (st_decode_supported(e, &why)) rc = st_decode_init(e);
    else fprintf(stderr, "strata: decode steps: one task per expert and layer (%s)\n", why);
  }
  if (!rc && !e->dec && hp->arch != ST_ARCH_QWEN3MOE)
    rc = st_set_error(ST_EUNSUP, "architecture %s computes through the decode lanes only, which this configuration does "
                      "not take", st_arch_of(hp->arch)->name);
  if (!rc) rc = st_prompt_init(e);
  if (rc) {
    st_engine_destroy(e);
    return rc;
  }
  *out = e;
  return 0;
}

void st_engine_destroy(struct st_engine *e) {
  if (!e) return;
  if (e->started) {
    const struct st_hparams *hp = &e->hp;
    st_engine_pause(e, 0);
    st_decode_settle(e); /* a step submitted ahead waits for the host */
    starpu_task_wait_for_all();
#ifdef ST_HAVE_CUDA
    /* StarPU resets the devices at shutdown: drop the CUDA graphs cached for them first */
    if (starpu_cuda_worker_get_count() > 0) starpu_execute_on_each_worker(st_cuda_graph_release, NULL, STARPU_CUDA);
    if (e->cublas_rows > 0) starpu_cublas_shutdown();
#endif
    /* the recorder holds the tasks' name pointers: written out before their owners go */
    if (e->rec && st_recorder_close(e->rec, e->model->gguf->path))
      fprintf(stderr, "strata: %s\n", st_last_error());
    e->rec = NULL;
    st_prompt_free(e);
    st_decode_free(e);
    if (e->h_output_norm) starpu_data_unregister(e->h_output_norm);
    if (e->h_output) starpu_data_unregister(e->h_output);
    for (size_t i = 0; i < (size_t)hp->n_layer * W_COUNT; i++)
      if (e->h_layer[i]) starpu_data_unregister(e->h_layer[i]);
    for (size_t i = 0; i < (size_t)hp->n_layer * 3; i++)
      if (e->h_fixed[i]) starpu_data_unregister(e->h_fixed[i]);
    for (size_t i = 0; i < (size_t)hp->n_layer * ST_MLA_W; i++)
      if (e->h_mla[i]) starpu_data_unregister(e->h_mla[i]);
    for (size_t i = 0; i < (size_t)hp->n_layer * hp->n_expert * 3; i++)
      if (e->h_expert[i]) starpu_data_unregister(e->h_expert[i]);
    for (size_t i = 0; i < (size_t)hp->n_layer * hp->n_head_kv * 2; i++)
      if (e->h_kv[i]) starpu_data_unregister(e->h_kv[i]);
    st_placement_free(&e->placement);
    st_host_arena_free(&e->arena); /* unpinned while CUDA is up */
    starpu_shutdown();
  }
  free(e->kv);
  free(e->x);
  free(e->h);
  free(e->ffn_in);
  free(e->xo);
  free(e->attn);
  free(e->expert_out);
  free(e->logits);
  free(e->routing);
  free(e->h_layer);
  free(e->h_fixed);
  free(e->h_mla);
  free(e->h_expert);
  free(e->h_kv);
  free(e->names);
  free(e->expert_names);
  free(e->stream_names);
  free(e->layer_names);
  free(e->head_names);
  free(e->route_counts);
  free(e->live_counts);
  free(e);
}

void st_engine_reset(struct st_engine *e) {
  st_decode_settle(e);
  e->n_past = 0;
}

void st_engine_pause(struct st_engine *e, int paused) {
  if (!e->started || !paused == !e->paused) return;
  if (paused) {
    st_decode_settle(e);
    starpu_pause();
  } else {
    starpu_resume();
  }
  e->paused = paused;
}

int st_engine_set_prefill(struct st_engine *e, int prefill) {
  if (prefill < 1 || prefill > e->prefill_cap)
    return st_set_error(ST_EINVAL, "prompt chunk %d is outside 1..%d", prefill, e->prefill_cap);
  e->prefill = prefill;
  return 0;
}

uint64_t st_stats_gpu_entries(const struct st_engine_stats *s) {
  uint64_t n = 0;
  for (int t = ST_TIER_PRIMARY; t < ST_TIER_MAX; t++) n += s->expert_entries[t];
  return n;
}

int st_engine_chunk_fits(const struct st_engine *e, int T, int cap, int all_logits) {
  if (T <= cap && (!all_logits || T <= e->logits_rows)) return 0;
  return st_set_error(ST_EINVAL, "a prompt chunk of %d tokens is over its buffers' %d tokens (%d with every token's logits)",
                      T, cap, e->logits_rows);
}

uint64_t st_stats_routed_entries(const struct st_engine_stats *s) {
  return st_stats_gpu_entries(s) + s->expert_entries[ST_TIER_CPU_POOL] + s->stream_entries;
}

void st_engine_tier_report(const struct st_engine *e, const struct st_engine_stats *now,
                           const struct st_engine_stats *before, char *buf, size_t len) {
  const struct st_engine_stats zero = {0};
  const struct st_engine_stats *s = now ? now : &e->stats;
  const struct st_engine_stats *b = before ? before : &zero;
  const struct st_placement *pl = &e->placement;
  size_t n = (size_t)snprintf(buf, len, "expert entries");
  for (int t = 0; t <= pl->n_caches && n < len; t++)
    n += (size_t)snprintf(buf + n, len - n, "%s %s %llu", t ? "," : "", st_placement_tier_name(pl, t),
                          (unsigned long long)(s->expert_entries[t] - b->expert_entries[t]));
  if (s->stream_tasks > b->stream_tasks && n < len) /* uncached experts a prompt chunk streamed to CUDA0 */
    n += (size_t)snprintf(buf + n, len - n, ", streamed to CUDA0 %llu (%llu expert tasks, %.1f MiB of weights)",
                          (unsigned long long)(s->stream_entries - b->stream_entries),
                          (unsigned long long)(s->stream_tasks - b->stream_tasks),
                          (s->stream_bytes - b->stream_bytes) / 1048576.0);
  for (int t = 2; t <= pl->n_caches && n < len; t++)
    n += (size_t)snprintf(buf + n, len - n, "; %s %.2f MiB transferred (unpacked rows: %.2f MiB), %llu layer launches",
                          st_placement_tier_name(pl, t), (s->tier_bytes[t] - b->tier_bytes[t]) / 1048576.0,
                          (s->tier_bytes_unpacked[t] - b->tier_bytes_unpacked[t]) / 1048576.0,
                          (unsigned long long)(s->expert_tasks[t] - b->expert_tasks[t]));
}

int st_engine_set_cuda_graphs(struct st_engine *e, int on) {
#ifdef ST_HAVE_CUDA
  e->cuda_graphs = on && e->placement.cuda0_worker >= 0;
#else
  e->cuda_graphs = 0;
#endif
  return e->cuda_graphs;
}

/* Graph sites of a layer (cuda/graph.cu). On CUDA0 each is one task per step (the attention of
 * every group, attn_output and the head unsliced: st_engine_create), so a key names one task. */

int st_engine_graph_keys_used(const struct st_engine *e) { return 1 + ((int)e->hp.n_layer + 1) * GRAPH_SITES; }


int st_engine_n_cpu_workers(const struct st_engine *e) {
  (void)e;
  return (int)starpu_cpu_worker_get_count();
}

int st_engine_n_cuda_workers(const struct st_engine *e) {
  (void)e;
  return (int)starpu_cuda_worker_get_count();
}

/* Adds StarPU's main-RAM -> CUDA transfer counters to the stats (reading them resets them). */
static void collect_bus(struct st_engine *e) {
  for (int b = 0; b < starpu_bus_get_count(); b++) {
    struct starpu_profiling_bus_info info;
    if (starpu_bus_get_profiling_info(b, &info) == 0 && starpu_bus_get_src(b) == STARPU_MAIN_RAM &&
        starpu_node_get_kind((unsigned)starpu_bus_get_dst(b)) == STARPU_CUDA_RAM)
      e->stats.h2d_bytes += (uint64_t)info.transferred_bytes;
  }
}

struct pair_count {
  uint64_t count;
  int32_t pair;
};

static int by_count_asc(const void *a, const void *b) {
  const struct pair_count *x = a, *y = b;
  if (x->count != y->count) return x->count < y->count ? -1 : 1;
  return x->pair - y->pair;
}

/* One adaptive round of cache c: up to `swaps` of its coldest pairs give their slots to the
 * hottest CPU-pool pairs that were routed more often since the last round. A stage cache only
 * takes pairs of its own layers; a helper (--remote-expert-opt) only swaps within a layer, in the
 * slots it already has. */
static int adapt_cache(struct st_engine *e, int c, int swaps, struct pair_count *cold, struct pair_count *hot) {
  struct st_placement *pl = &e->placement;
  const int n_pairs = (int)(pl->n_layer * pl->n_expert);
  const uint32_t E = pl->n_expert;
  const struct st_expert_cache *C = &pl->cache[c];
  const int same_layer = C->role == ST_ROLE_HELPER;
  int nc = 0, nh = 0;
  for (int i = 0; i < n_pairs; i++) {
    const struct pair_count pc = {e->live_counts[i], i};
    if (pl->tier[i] == 1 + c) cold[nc++] = pc;
    else if (pl->tier[i] == ST_TIER_CPU_POOL && (pl->n_stages <= 1 || pl->layer_stage[i / (int)E] == c)) hot[nh++] = pc;
  }
  qsort(cold, (size_t)nc, sizeof *cold, by_count_asc); /* coldest first */
  qsort(hot, (size_t)nh, sizeof *hot, by_count_asc);   /* hottest last */
  int done = 0, rc = 0;
  for (int hi = nh - 1; hi >= 0 && done < swaps && !rc; hi--) {
    const struct pair_count h = hot[hi];
    int ci = -1;
    for (int j = 0; j < nc && ci < 0; j++)
      if (cold[j].pair >= 0 && (!same_layer || (uint32_t)cold[j].pair / E == (uint32_t)h.pair / E)) ci = j;
    if (ci < 0) {
      if (!same_layer) break;
      continue;
    }
    const struct pair_count cp = cold[ci];
    if (h.count <= cp.count) {
      if (!same_layer) break;
      continue;
    }
    const int slot = pl->slot[cp.pair];
    rc = st_expert_cache_swap(pl, c, e->model, slot, h.pair);
    fprintf(stderr, "strata: adapt: %s slot %d: (L%u, E%u, %llu routed) -> (L%u, E%u, %llu routed)\n", C->name, slot,
            (uint32_t)cp.pair / E, (uint32_t)cp.pair % E, (unsigned long long)cp.count, (uint32_t)h.pair / E,
            (uint32_t)h.pair % E, (unsigned long long)h.count);
    cold[ci].pair = -1;
    done++;
  }
  return rc ? rc : done;
}

int st_engine_adapt(struct st_engine *e) {
  st_decode_settle(e); /* the swaps change what a step submitted ahead would read */
  struct st_placement *pl = &e->placement;
  const int n_pairs = (int)(pl->n_layer * pl->n_expert);
  e->tokens_since_adapt = 0;
  int any = 0;
  for (int c = 0; c < pl->n_caches; c++) any |= pl->cache[c].n_slots > 0;
  if (!any) return 0;
  struct pair_count *cold = malloc(sizeof *cold * (size_t)n_pairs);
  struct pair_count *hot = malloc(sizeof *hot * (size_t)n_pairs);
  if (!cold || !hot) {
    free(cold);
    free(hot);
    return st_set_error(ST_ENOMEM, "out of memory for an adaptive round");
  }
  starpu_task_wait_for_all();
  int total = 0, rc = 0;
  for (int c = 0; c < pl->n_caches && rc >= 0; c++) {
    const enum st_cache_role role = pl->cache[c].role;
    const int swaps = role == ST_ROLE_PEER ? e->peer_adapt_swaps
                      : role == ST_ROLE_HELPER ? (e->remote_opt ? e->adapt_swaps : 0)
                                               : e->adapt_swaps;
    if (swaps <= 0 || pl->cache[c].n_slots == 0) continue;
    rc = adapt_cache(e, c, swaps, cold, hot);
    if (rc > 0) total += rc;
  }
  e->stats.swaps += (uint64_t)total;
  if (total > 0 && e->dec && rc >= 0) {
    const int trc = st_decode_tables_update(e);
    if (trc) rc = trc;
  }
  /* halve the live counts: recent routing weighs most, older rounds fade */
  for (int i = 0; i < n_pairs; i++) e->live_counts[i] /= 2;
  free(cold);
  free(hot);
  return rc < 0 ? rc : total;
}

/* The first row of weight w holding a non-finite value once decoded: 1 with *row set, else 0. */
static int weight_nonfinite(const struct st_weight *w, float *buf, uint64_t *row) {
  const uint64_t rows = w->ne[1] * (w->ne[2] ? w->ne[2] : 1);
  for (uint64_t r = 0; r < rows; r++) {
    st_dequantize_row(w->type, (const uint8_t *)w->data + r * w->row_bytes, buf, (int64_t)w->ne[0]);
    for (uint64_t i = 0; i < w->ne[0]; i++)
      if (!isfinite(buf[i])) {
        *row = r;
        return 1;
      }
  }
  return 0;
}

void st_engine_embed(const struct st_engine *e, const int32_t *ids, int T, float *x) {
  const struct st_weight *emb = &e->model->tok_embd;
  const size_t d = e->hp.n_embd;
  for (int t = 0; t < T; t++)
    st_dequantize_row(emb->type, (const uint8_t *)emb->data + (uint64_t)ids[t] * emb->row_bytes, x + (size_t)t * d,
                      (int64_t)d);
}

void st_engine_count_routes(struct st_engine *e, uint32_t l, const struct st_route *route, int T) {
  const int k = (int)e->hp.n_expert_used, E = (int)e->hp.n_expert;
  if (e->model->layers[l].dense) return; /* a leading dense layer routes nothing */
  for (int i = 0; i < T * k; i++) {
    const int x = route[i].expert;
    e->route_counts[(size_t)l * E + x]++;
    e->live_counts[(size_t)l * E + x]++;
    if (e->routing_trace) e->routing_trace[((size_t)l * e->n_ctx + e->n_past) * k + i] = x;
  }
}

int st_engine_nonfinite(struct st_engine *e, int l0, int l1, const char *what) {
  const struct st_model *m = e->model;
  const int L = (int)e->hp.n_layer;
  uint64_t most = m->tok_embd.ne[0];
  float *buf = malloc(sizeof(float) * (size_t)(most > m->output.ne[0] ? most : m->output.ne[0]) * 2);
  for (int l = l0 < 0 ? 0 : l0; buf && l <= l1 && l <= L; l++) {
    const struct st_weight *cand[16];
    int n = 0;
    if (l < L) {
      const struct st_layer *Ly = &m->layers[l];
      const struct st_weight *ws[] = {&Ly->attn_norm, &Ly->wq, &Ly->wk, &Ly->wv, &Ly->q_norm, &Ly->k_norm, &Ly->wo,
                                      &Ly->ffn_norm, &Ly->router, &Ly->gate_exps, &Ly->up_exps, &Ly->down_exps};
      if (l == 0) cand[n++] = &m->tok_embd;
      for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) cand[n++] = ws[i];
    } else {
      cand[n++] = &m->output_norm;
      cand[n++] = &m->output;
    }
    for (int i = 0; i < n; i++) {
      uint64_t row;
      if (cand[i]->ne[0] > 2 * most || !weight_nonfinite(cand[i], buf, &row)) continue;
      free(buf);
      const uint64_t per = cand[i]->ne[1];
      if (cand[i]->ne[2] > 1)
        return st_set_error(ST_ERUNTIME, "non-finite values in %s: %s (%s) holds non-finite weights (expert %llu, row %llu): "
                            "the model file is damaged", what, cand[i]->name, st_type_info(cand[i]->type)->name,
                            (unsigned long long)(row / per), (unsigned long long)(row % per));
      return st_set_error(ST_ERUNTIME, "non-finite values in %s: %s (%s) holds non-finite weights (row %llu): the model file "
                          "is damaged", what, cand[i]->name, st_type_info(cand[i]->type)->name, (unsigned long long)row);
    }
  }
  free(buf);
  return st_set_error(ST_ERUNTIME, "non-finite values in %s: the weights of layers %d..%d%s are finite, so the activations "
                      "overflowed (values wrong for their tensor types, or a damaged file)", what, l0 < 0 ? 0 : l0,
                      l1 >= L ? L - 1 : l1, l1 >= L ? " and the output head" : "");
}

/* st_engine_eval, or with next set (one token, logits NULL) st_engine_eval_next. */
static int eval(struct st_engine *e, const int32_t *ids, int n, float *logits, int all_logits, int32_t *next) {
  if (n <= 0) return st_set_error(ST_EINVAL, "nothing to evaluate (0 tokens)");
  if (!logits && (n != 1 || all_logits || !next))
    return st_set_error(ST_EINVAL, "no logits buffer (st_engine_eval_next evaluates one token)");
  if (e->n_past + n > e->n_ctx)
    return st_set_error(ST_EINVAL, "%d tokens after %d already in the context exceed the context of %d tokens (raise -c)",
                        n, e->n_past, e->n_ctx);
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || (uint32_t)ids[i] >= e->hp.n_vocab)
      return st_set_error(ST_EINVAL, "token id %d is out of range (vocabulary of %u)", ids[i], e->hp.n_vocab);
  const size_t V = e->hp.n_vocab;
  for (int done = 0; done < n;) {
    /* the per-task path computes qwen3moe only: without the prompt lanes another architecture
     * takes its prompt a token at a time (decode steps) */
    /* every token's logits: chunks of at most e->logits_rows tokens (the buffer's rows) */
    const int chunk = all_logits && e->logits_rows < e->prefill ? e->logits_rows : e->prefill;
    const int T = e->hp.arch != ST_ARCH_QWEN3MOE && !e->prompt ? 1 : n - done < chunk ? n - done : chunk;
    const int last = done + T == n;
    const double t_start = starpu_timing_now();
    /* a decode step writes its logits where they go (no copy through e->logits); without logits
     * (st_engine_eval_next) a GPU step leaves them in the mailbox, its head's argmax found */
    const int step = T == 1 && e->dec;
    float *out = step && all_logits ? logits + (size_t)done * V : step && last ? logits : e->logits;
    if (!logits) out = step && e->dec->gpu && e->gpu_argmax ? NULL : e->logits;
    if (!step) st_decode_settle(e); /* a prompt chunk after a step submitted ahead */
    int rc = step        ? st_decode_step(e, ids[done], out)
             : e->prompt ? st_prompt_eval(e, ids + done, T, all_logits || last, all_logits)
                         : st_batch_eval(e, ids + done, T, all_logits || last, all_logits);
    if (e->rec) st_recorder_step(e->rec, n == 1, t_start, starpu_timing_now());
    if (rc) return rc;
    /* garbage weights must not pass silently as NaN logits (a GPU step checked them as it copied) */
    if ((all_logits || last) && !(step && e->dec->logits_finite)) {
      const size_t rows = all_logits ? (size_t)T : 1;
      const float *chk = out ? out : e->logits; /* a GPU step's head found a non-finite logit: copied there */
      for (size_t r = 0; r < rows; r++)
        if (!st_all_finite(chk + r * V, V)) {
          char what[96];
          snprintf(what, sizeof what, "the logits of token %d", e->n_past + (int)(all_logits ? r : (size_t)T - 1));
          /* every router's input was finite: the last layer's experts or the head made it */
          return st_engine_nonfinite(e, (int)e->hp.n_layer - 1, (int)e->hp.n_layer, what);
        }
    }
    if (!logits) /* st_engine_eval_next: one token */
      *next = out ? st_argmax(out, (int32_t)V) : e->dec->next_id;
    else if (out == e->logits && all_logits)
      memcpy(logits + (size_t)done * V, e->logits, sizeof(float) * V * (size_t)T);
    else if (out == e->logits && last)
      memcpy(logits, e->logits, sizeof(float) * V);
    e->n_past += T;
    done += T;
    e->tokens_since_adapt += T;
  }
  collect_bus(e);
  static int prompt_logged; /* the memory log's line after the process's first prompt */
  if (n > 1 && !prompt_logged && st_memory_log_on()) {
    char stage[64];
    snprintf(stage, sizeof stage, "after the first prompt (%d tokens)", n);
    st_memory_log(stage, e->model, &e->arena, e->placement.tier);
    st_engine_gpu_memory_log(stage);
    prompt_logged = 1;
  }
  if ((e->adapt_swaps > 0 || e->peer_adapt_swaps > 0) && e->tokens_since_adapt >= e->adapt_interval) {
    int rc = st_engine_adapt(e);
    if (rc < 0) return rc;
  }
  return 0;
}

int st_engine_eval(struct st_engine *e, const int32_t *ids, int n, float *logits, int all_logits) {
  return eval(e, ids, n, logits, all_logits, NULL);
}

int st_engine_eval_next(struct st_engine *e, int32_t id, int32_t *next) { return eval(e, &id, 1, NULL, 0, next); }
