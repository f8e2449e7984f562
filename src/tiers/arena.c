/* The host expert arena (see arena.h): a RAM copy of the CPU pool's expert pairs, layer-major,
 * registered with CUDA layer by layer up to STRATA_ARENA_PIN_GIB. */
#include "tiers/arena.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "io/gguf.h"
#include "io/model.h"
#ifdef ST_HAVE_CUDA
#include "codelets/cuda/cuda_codelets.h"
#endif

#define MAT_ALIGN 64       /* each matrix of a pair starts on a cache line (SIMD loads) */
#define MAX_COPY_THREADS 8 /* copying is bound by page faults on the mapping, not by cores */
#define GIB 1073741824.0

static int parse_gib(const char *name, double *out) {
  const char *v = getenv(name);
  if (!v || !*v) return 0;
  char *end;
  const double x = strtod(v, &end);
  if (*end || !(x >= 0) || x > 1e9)
    return st_set_error(ST_EINVAL, "%s=%s: expected a number of GiB >= 0", name, v);
  *out = x;
  return 0;
}

int st_host_arena_conf_from_env(struct st_host_arena_conf *c) {
  c->off = 0;
  c->pin_gib = -1;
  c->memavailable_gib = -1;
  const char *v = getenv("STRATA_HOST_ARENA");
  if (v && *v) {
    if (!strcmp(v, "0") || !strcmp(v, "off")) c->off = 1;
    else if (strcmp(v, "1") && strcmp(v, "on"))
      return st_set_error(ST_EINVAL, "STRATA_HOST_ARENA=%s: expected 1 (the default) or 0", v);
  }
  int rc = parse_gib("STRATA_ARENA_PIN_GIB", &c->pin_gib);
  return rc ? rc : parse_gib("STRATA_MEMAVAILABLE_GIB", &c->memavailable_gib);
}

uint32_t st_host_arena_plan(const uint8_t *tier, size_t n_pairs, int resident, uint8_t *keep) {
  uint32_t n = 0;
  for (size_t i = 0; i < n_pairs; i++) {
    keep[i] = !resident || tier[i] == 0;
    n += keep[i];
  }
  return n;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static const struct st_weight *matrix(const struct st_model *m, uint32_t layer, int which) {
  const struct st_layer *L = &m->layers[layer];
  return which == 0 ? &L->gate_exps : which == 1 ? &L->up_exps : &L->down_exps;
}

/* A pair's size in the arena for `layer`, and (mat != NULL) its matrices' offsets inside it. */
static uint64_t pair_stride(const struct st_model *m, uint32_t layer, uint64_t mat[3]) {
  uint64_t off = 0;
  for (int i = 0; i < 3; i++) {
    if (mat) mat[i] = off;
    off = align_up(off + st_expert_bytes(matrix(m, layer, i)), MAT_ALIGN);
  }
  return off;
}

uint64_t st_host_arena_size(const struct st_model *m, const uint8_t *keep) {
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  const uint32_t E = m->hp.n_expert;
  uint64_t total = 0;
  for (uint32_t l = 0; l < m->hp.n_layer; l++) {
    uint64_t n = 0;
    for (uint32_t x = 0; x < E; x++) n += keep[(size_t)l * E + x];
    total += align_up(n * pair_stride(m, l, NULL), page);
  }
  return total;
}

/* MemAvailable of /proc/meminfo in bytes, or -1. */
static int64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  int64_t kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %" SCNd64 " kB", &kib) == 1) break;
  fclose(f);
  return kib < 0 ? -1 : kib * 1024;
}

int st_host_arena_check_ram(uint64_t need, uint32_t n_pairs, int resident, double memavailable_gib) {
  const int64_t avail = memavailable_gib >= 0 ? (int64_t)(memavailable_gib * GIB) : mem_available();
  if (avail < 0) return st_set_error(ST_EIO, "the host expert arena: cannot read MemAvailable from /proc/meminfo");
  if ((int64_t)need <= avail) return 0;
  return st_set_error(ST_ENOMEM,
                      "the host expert arena needs %.*f GiB of RAM for %u expert pairs and %.2f GiB are available "
                      "(%s): %s",
                      need < GIB ? 3 : 2, need / GIB, n_pairs, avail / GIB, memavailable_gib >= 0 ? "STRATA_MEMAVAILABLE_GIB" : "MemAvailable",
                      resident ? "a larger --expert-cache (or helper caches) leaves more pairs in the file and lowers it; "
                                 "STRATA_HOST_ARENA=0 makes no RAM copy"
                               : "--resident-experts lowers it (the pairs the GPU caches hold stay in the file; with a "
                                 "larger --expert-cache, more of them); STRATA_HOST_ARENA=0 makes no RAM copy");
}

/* Releases of file pages that failed (madvise), for the memory log: how many, and the first errno. */
static unsigned release_failures;
static int release_errno;

static void release(const struct st_gguf *g, const void *p, size_t n) {
  const int err = st_gguf_release_pages(g, p, n);
  if (err && __atomic_fetch_add(&release_failures, 1, __ATOMIC_RELAXED) == 0)
    __atomic_store_n(&release_errno, err, __ATOMIC_RELAXED);
}

/* Copy workers: each takes the next layer, copies its kept pairs and releases the layer's expert
 * pages of the mapping (copied, or held by a GPU cache that was filled before). */
struct copy_job {
  struct st_host_arena *a;
  const uint8_t *keep;
  pthread_mutex_t lock;
  uint32_t next;
};

static void copy_layer(struct st_host_arena *a, const uint8_t *keep, uint32_t l) {
  const struct st_model *m = a->model;
  const uint32_t E = a->n_expert;
  for (uint32_t x = 0; x < E; x++)
    if (keep[(size_t)l * E + x] && a->pair_off[(size_t)l * E + x] != ST_ARENA_NONE) /* NONE: a dense layer's */
      for (int i = 0; i < 3; i++) {
        const struct st_weight *w = matrix(m, l, i);
        memcpy(a->base + a->pair_off[(size_t)l * E + x] + a->mat_off[(size_t)l * 3 + i], st_expert_ptr(w, x),
               st_expert_bytes(w));
        release(m->gguf, st_expert_ptr(w, x), st_expert_bytes(w)); /* no second copy meanwhile */
      }
  for (int i = 0; i < 3; i++) { /* the pages pairs share at their edges, and those of pairs left out */
    const struct st_weight *w = matrix(m, l, i);
    release(m->gguf, w->data, st_expert_bytes(w) * E);
  }
}

static void *copy_worker(void *arg) {
  struct copy_job *job = arg;
  for (;;) {
    pthread_mutex_lock(&job->lock);
    const uint32_t l = job->next++;
    pthread_mutex_unlock(&job->lock);
    if (l >= job->a->n_layer) return NULL;
    copy_layer(job->a, job->keep, l);
  }
}

/* Registers layers 0.. in order while the total stays within the cap (< 0: no cap). */
static void pin_layers(struct st_host_arena *a, double pin_gib) {
#ifdef ST_HAVE_CUDA
  const uint64_t cap = pin_gib < 0 ? UINT64_MAX : (uint64_t)(pin_gib * GIB);
  for (uint32_t l = 0; l < a->n_layer; l++) {
    const uint64_t span = a->layer_off[l + 1] - a->layer_off[l];
    if (a->pinned_bytes + span > cap) return;
    char why[160];
    if (span && !st_cuda_host_register(a->base + a->layer_off[l], span, why, sizeof why)) {
      fprintf(stderr, "strata: host expert arena: registering layer %u (%.2f GiB) failed (%s): layers %u.. stay "
              "unpinned, the CPU pool computes them and the prompt path does not stream them\n",
              l, span / GIB, why, l);
      return;
    }
    a->pinned_bytes += span;
    a->n_pinned_layers = (int)l + 1;
  }
#else
  (void)a;
  (void)pin_gib;
#endif
}

int st_host_arena_create(struct st_host_arena *a, const struct st_model *m, const uint8_t *keep, int resident,
                         const struct st_host_arena_conf *conf, int can_pin) {
  memset(a, 0, sizeof *a);
  const uint32_t L = m->hp.n_layer, E = m->hp.n_expert;
  const size_t n_pairs = (size_t)L * E;
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  a->model = m;
  a->n_layer = L;
  a->n_expert = E;
  a->pair_off = malloc(sizeof *a->pair_off * n_pairs);
  a->mat_off = malloc(sizeof *a->mat_off * 3 * L);
  a->layer_off = malloc(sizeof *a->layer_off * (L + 1));
  if (!a->pair_off || !a->mat_off || !a->layer_off) return st_set_error(ST_ENOMEM, "out of memory for the arena table");
  uint64_t off = 0;
  for (uint32_t l = 0; l < L; l++) {
    a->layer_off[l] = off;
    const uint64_t stride = pair_stride(m, l, a->mat_off + (size_t)l * 3);
    for (uint32_t x = 0; x < E; x++) {
      const size_t i = (size_t)l * E + x;
      if (!matrix(m, l, 0)->data) { /* a leading dense layer: no expert pairs to copy or count */
        a->pair_off[i] = ST_ARENA_NONE;
        continue;
      }
      a->pair_off[i] = keep[i] ? off : ST_ARENA_NONE;
      if (keep[i]) {
        off += stride;
        a->n_copied++;
      } else {
        a->n_left++;
      }
    }
    off = align_up(off, page);
  }
  a->layer_off[L] = off;
  a->bytes = off;
  a->active = 1;
  ST_ASSERT(a->bytes == st_host_arena_size(m, keep));
  int rc = st_host_arena_check_ram(a->bytes, a->n_copied, resident, conf->memavailable_gib);
  if (rc) return rc;
  const double t0 = st_now();
  if (a->bytes) {
    void *p = mmap(NULL, a->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return st_set_error(ST_ENOMEM, "the host expert arena: cannot allocate %.2f GiB of RAM%s", a->bytes / GIB,
                          resident ? "" : " (--resident-experts lowers it)");
    a->base = p;
#ifdef MADV_HUGEPAGE
    madvise(p, a->bytes, MADV_HUGEPAGE); /* fewer TLB misses for the CPU pool; a hint only */
#endif
  }
  struct copy_job job = {.a = a, .keep = keep, .next = 0};
  pthread_mutex_init(&job.lock, NULL);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int n_threads = ncpu < 1 ? 1 : ncpu > MAX_COPY_THREADS ? MAX_COPY_THREADS : (int)ncpu;
  if ((uint32_t)n_threads > L) n_threads = (int)L;
  pthread_t tid[MAX_COPY_THREADS];
  int started = 0;
  for (int t = 1; t < n_threads; t++)
    if (pthread_create(&tid[started], NULL, copy_worker, &job) == 0) started++;
  copy_worker(&job);
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
  pthread_mutex_destroy(&job.lock);
  const double t_copy = st_now() - t0;
  st_memory_log("after the arena copy", m, a, NULL);
  if (can_pin) pin_layers(a, conf->pin_gib);
  const double t_pin = st_now() - t0 - t_copy;
  if (can_pin) st_memory_log("after pinning", m, a, NULL);

  char pinned[96];
  if (!can_pin) snprintf(pinned, sizeof pinned, "none pinned: no CUDA worker");
  else if (a->n_pinned_layers == 0) snprintf(pinned, sizeof pinned, "0 GiB pinned");
  else
    snprintf(pinned, sizeof pinned, "%.*f GiB pinned, layers 0..%d", a->pinned_bytes < GIB ? 3 : 2,
             a->pinned_bytes / GIB, a->n_pinned_layers - 1);
  fprintf(stderr, "strata: host expert arena: %u pairs, %.*f GiB in RAM (%s), %u pairs left in the file%s; "
          "copied in %.1f s (%d threads)\n",
          a->n_copied, a->bytes < GIB ? 3 : 2, a->bytes / GIB, pinned, a->n_left,
          resident ? " (--resident-experts)" : "", t_copy, started + 1);
  if (can_pin && t_pin > 0.5) fprintf(stderr, "strata: host expert arena: pinned in %.1f s\n", t_pin);
  return 0;
}

void st_host_arena_free(struct st_host_arena *a) {
  if (!a) return;
  if (a->base) {
#ifdef ST_HAVE_CUDA
    for (int l = 0; l < a->n_pinned_layers; l++)
      if (a->layer_off[l + 1] > a->layer_off[l]) st_cuda_host_unregister(a->base + a->layer_off[l]);
#endif
    munmap(a->base, a->bytes);
  }
  free(a->pair_off);
  free(a->mat_off);
  free(a->layer_off);
  memset(a, 0, sizeof *a);
}

const void *st_host_arena_src(const struct st_host_arena *a, const struct st_model *m, uint32_t layer,
                              uint32_t expert, int which) {
  if (a && a->active) {
    const uint64_t off = a->pair_off[(size_t)layer * a->n_expert + expert];
    if (off != ST_ARENA_NONE) return a->base + off + a->mat_off[(size_t)layer * 3 + which];
  }
  return st_expert_ptr(matrix(m, layer, which), expert);
}

int st_host_arena_streamable(const struct st_host_arena *a, uint32_t layer, uint32_t expert) {
  if (!a || !a->active) return 1;
  return a->pair_off[(size_t)layer * a->n_expert + expert] != ST_ARENA_NONE && (int)layer < a->n_pinned_layers;
}

void st_host_arena_release_pair(const struct st_host_arena *a, const struct st_model *m, uint32_t layer,
                                uint32_t expert) {
  if (a && a->active && a->pair_off[(size_t)layer * a->n_expert + expert] != ST_ARENA_NONE) return;
  for (int i = 0; i < 3; i++) {
    const struct st_weight *w = matrix(m, layer, i);
    release(m->gguf, st_expert_ptr(w, expert), st_expert_bytes(w));
  }
}

/* ---- the memory log (STRATA_MEMORY_LOG=1) ---- */

int st_memory_log_on(void) {
  static int on = -1;
  if (on < 0) {
    const char *v = getenv("STRATA_MEMORY_LOG");
    on = v && !strcmp(v, "1");
  }
  return on;
}

/* kB sums over the mappings of one region of the address space */
struct vma_sum {
  uint64_t rss, anon, locked, huge;
};

#define MEM_NAMES 32 /* distinct other mappings summed by name */
#define MEM_TOP 3    /* of which the largest are shown */

struct mem_other {
  char name[48];
  uint64_t rss;
};

/* Walks /proc/self/smaps: sums the mappings inside [m0, m1) (the model file) and [a0, a1) (the
 * arena), and the others by path name. 0, or -1 when it cannot be read. */
static int read_smaps(uintptr_t m0, uintptr_t m1, uintptr_t a0, uintptr_t a1, struct vma_sum *map,
                      struct vma_sum *arena, struct mem_other *other, int *n_other) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  struct vma_sum *cur = NULL;
  int cur_other = -1;
  while (fgets(line, sizeof line, f)) {
    uintptr_t lo, hi;
    int pos = 0;
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %*s %*s %*s%n", &lo, &hi, &pos) == 2 && pos > 0) {
      cur = NULL;
      cur_other = -1;
      if (m1 > m0 && lo >= m0 && hi <= m1) cur = map;
      else if (a1 > a0 && lo >= a0 && hi <= a1) cur = arena;
      else {
        char *name = line + pos;
        while (*name == ' ' || *name == '\t') name++;
        name[strcspn(name, "\n")] = 0;
        if (!*name) name = "[anon]";
        for (int i = 0; i < *n_other; i++)
          if (!strncmp(other[i].name, name, sizeof other[i].name - 1)) cur_other = i;
        if (cur_other < 0 && *n_other < MEM_NAMES) {
          cur_other = (*n_other)++;
          snprintf(other[cur_other].name, sizeof other[cur_other].name, "%s", name);
          other[cur_other].rss = 0;
        }
      }
      continue;
    }
    uint64_t kb;
    char key[32];
    if (sscanf(line, "%31[A-Za-z_]: %" SCNu64 " kB", key, &kb) != 2) continue;
    if (cur) {
      if (!strcmp(key, "Rss")) cur->rss += kb;
      else if (!strcmp(key, "Anonymous")) cur->anon += kb;
      else if (!strcmp(key, "Locked")) cur->locked += kb;
      else if (!strcmp(key, "AnonHugePages") || !strcmp(key, "FilePmdMapped")) cur->huge += kb;
    } else if (cur_other >= 0 && !strcmp(key, "Rss")) {
      other[cur_other].rss += kb;
    }
  }
  fclose(f);
  return 0;
}

/* dense = gib[0] - gib[1] - gib[2] */
int st_memory_file_pages(const struct st_model *m, const struct st_host_arena *a, const uint8_t *tier, double out[3]) {
  out[0] = out[1] = out[2] = -1;
  if (!m || !m->gguf || !m->gguf->map) return -1;
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  enum { CHUNK = 8192 };
  uint64_t *ent = malloc(sizeof *ent * CHUNK);
  uint64_t n[3] = {0, 0, 0};
  int ok = ent != NULL;
  /* present pages of [lo, hi) (page-aligned), each passed to `count` with its address */
#define WALK(lo, hi, count)                                                                          \
  for (uint64_t pg = (lo) / page; ok && pg < (hi) / page;) {                                         \
    const uint64_t k = (hi) / page - pg < CHUNK ? (hi) / page - pg : CHUNK;                          \
    if (pread(fd, ent, k * sizeof *ent, (off_t)(pg * sizeof *ent)) != (ssize_t)(k * sizeof *ent)) { \
      ok = 0;                                                                                         \
      break;                                                                                          \
    }                                                                                                 \
    for (uint64_t j = 0; j < k; j++)                                                                  \
      if (ent[j] >> 63) {                                                                             \
        const uint64_t addr = (pg + j) * page;                                                        \
        count;                                                                                        \
      }                                                                                               \
    pg += k;                                                                                          \
  }
  const uint64_t m0 = (uintptr_t)m->gguf->map, m1 = align_up(m0 + m->gguf->size, page);
  WALK(m0, m1, (void)addr; n[0]++)
  const uint32_t E = m->hp.n_expert;
  for (uint32_t l = 0; ok && l < m->hp.n_layer; l++)
    for (int i = 0; i < 3; i++) {
      const struct st_weight *w = matrix(m, l, i);
      const uint64_t eb = st_expert_bytes(w), lo = (uintptr_t)w->data, hi = lo + eb * E;
      WALK(align_up(lo, page), hi / page * page, {
        uint32_t x = (uint32_t)((addr - lo) / eb);
        const size_t pi = (size_t)l * E + (x < E ? x : E - 1);
        const int second = tier ? tier[pi] != 0 : a && a->active && a->pair_off[pi] == ST_ARENA_NONE;
        n[1 + second]++;
      })
    }
#undef WALK
  free(ent);
  close(fd);
  if (!ok) return -1;
  for (int i = 0; i < 3; i++) out[i] = (double)(n[i] * page) / GIB;
  return 0;
}

double st_memory_status_gib(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  const size_t n = strlen(key);
  double v = -1;
  uint64_t kb;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, key, n) && line[n] == ':' && sscanf(line + n + 1, "%" SCNu64, &kb) == 1) {
      v = kb / 1048576.0;
      break;
    }
  fclose(f);
  return v;
}

void st_memory_log(const char *stage, const struct st_model *m, const struct st_host_arena *a, const uint8_t *tier) {
  if (!st_memory_log_on()) return;
  static const char *keys[] = {"VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "VmLck", "VmPin"};
  enum { RSS, HWM, ANON, FILE_, SHMEM, LCK, PIN, N_KEYS };
  double v[N_KEYS];
  for (int i = 0; i < N_KEYS; i++) v[i] = st_memory_status_gib(keys[i]);
  char out[1536];
  size_t len = (size_t)snprintf(out, sizeof out, "strata: memory: %s: VmRSS %.2f GiB (anon %.2f, file %.2f, shmem %.2f), "
                                "VmHWM %.2f GiB, VmLck %.2f GiB, VmPin %.2f GiB",
                                stage, v[RSS], v[ANON], v[FILE_], v[SHMEM], v[HWM], v[LCK], v[PIN]);
#define APPEND(...)                                                                 \
  do {                                                                              \
    if (len < sizeof out) len += (size_t)snprintf(out + len, sizeof out - len, __VA_ARGS__); \
  } while (0)
  const int mapped = m && m->gguf && m->gguf->map;
  if (mapped) {
    double g[3];
    st_memory_file_pages(m, a, tier, g);
    if (g[0] >= 0 && tier)
      APPEND("; file pages mapped %.2f GiB: dense %.2f, CPU-pool pairs %.2f, GPU-cached pairs %.2f", g[0],
             g[0] - g[1] - g[2], g[1], g[2]);
    else if (g[0] >= 0 && a && a->active)
      APPEND("; file pages mapped %.2f GiB: dense %.2f, pairs in the arena %.2f, pairs left in the file %.2f", g[0],
             g[0] - g[1] - g[2], g[1], g[2]);
    else if (g[0] >= 0)
      APPEND("; file pages mapped %.2f GiB: dense %.2f, expert pairs %.2f", g[0], g[0] - g[1] - g[2], g[1] + g[2]);
  }
  struct vma_sum map = {0}, arena = {0};
  struct mem_other other[MEM_NAMES];
  int n_other = 0;
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  const uintptr_t m0 = mapped ? (uintptr_t)m->gguf->map : 0;
  const uintptr_t m1 = m0 ? (uintptr_t)align_up(m0 + m->gguf->size, page) : 0;
  const uintptr_t a0 = a && a->base ? (uintptr_t)a->base : 0, a1 = a0 ? a0 + a->bytes : 0;
  if (read_smaps(m0, m1, a0, a1, &map, &arena, other, &n_other) == 0) {
    const double k = 1048576.0;
    if (m0)
      APPEND(" (mapping: %.2f GiB resident, %.2f anonymous, %.2f locked, %.2f huge)", map.rss / k, map.anon / k,
             map.locked / k, map.huge / k);
    if (a0)
      APPEND("; arena %.2f of %.2f GiB resident (%.2f huge pages, %.2f locked)", arena.rss / k, a->bytes / GIB,
             arena.huge / k, arena.locked / k);
    for (int t = 0; t < MEM_TOP; t++) { /* the largest other mappings, by name */
      int best = -1;
      for (int i = 0; i < n_other; i++)
        if (other[i].rss && (best < 0 || other[i].rss > other[best].rss)) best = i;
      if (best < 0) break;
      APPEND("%s %s %.2f", t ? "," : "; others:", other[best].name, other[best].rss / k);
      other[best].rss = 0;
    }
  }
  const unsigned fails = __atomic_load_n(&release_failures, __ATOMIC_RELAXED);
  if (fails) APPEND("; %u page releases failed (%s)", fails, strerror(__atomic_load_n(&release_errno, __ATOMIC_RELAXED)));
#undef APPEND
  fprintf(stderr, "%s\n", out);
}
