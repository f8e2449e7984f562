/* The host expert arena (DESIGN.md, "CPU pool"; the seeds' SECOND_GPU.md, "host expert arena"
 * and "The resident RAM mode"): one anonymous RAM allocation holding a copy of the expert pairs
 * the CPU pool may compute, so its workers (and any prompt-path streaming to a GPU) read RAM
 * instead of the mapped GGUF file.
 *
 * Layout: layer-major, each layer starting on a page, each pair's gate, up and down matrices at
 * 64-byte aligned offsets inside the pair. By default every pair is copied (adaptive swaps may
 * hand any cached pair back to the CPU pool); with --resident-experts the pairs a GPU cache owns
 * at start are left in the file. Layers are registered (pinned, cudaHostRegister) in order up to
 * STRATA_ARENA_PIN_GIB, so GPU refills and streaming copy by DMA; the prompt path streams only
 * pairs of pinned layers. Expert pages of the mapping are released (madvise) once copied, so the
 * process does not hold both copies. Nothing here launches a kernel or submits a task. */
#ifndef ST_ARENA_H
#define ST_ARENA_H

#include <stddef.h>
#include <stdint.h>

struct st_model;

#define ST_ARENA_NONE UINT64_MAX /* pair_off of a pair left in the file */

/* The arena's environment switches, read once (st_host_arena_conf_from_env; doc/tuning.md). */
struct st_host_arena_conf {
  int off;                 /* STRATA_HOST_ARENA=0: no RAM copy, the CPU pool reads the mapping */
  double pin_gib;          /* STRATA_ARENA_PIN_GIB: GiB registered at most; < 0 = all (the Linux default) */
  double memavailable_gib; /* STRATA_MEMAVAILABLE_GIB, for tests only: < 0 = read /proc/meminfo */
};

struct st_host_arena {
  const struct st_model *model; /* borrowed: source of the pairs left in the file */
  uint32_t n_layer, n_expert;
  int active;           /* st_host_arena_create ran: pairs not in base are left in the file */
  uint8_t *base;        /* anonymous mapping of `bytes` (NULL when no pair is kept) */
  uint64_t bytes;
  uint64_t *pair_off;   /* [n_layer][n_expert] byte offset of the pair in base, or ST_ARENA_NONE */
  uint64_t *mat_off;    /* [n_layer][3] offset of gate, up, down inside a pair of that layer */
  uint64_t *layer_off;  /* [n_layer + 1] each layer's span in base (page-aligned) */
  int n_pinned_layers;  /* layers 0 .. n_pinned_layers - 1 are registered with CUDA */
  uint64_t pinned_bytes;
  uint32_t n_copied, n_left; /* pairs in RAM, pairs left in the file */
};

/* Reads STRATA_HOST_ARENA (default on), STRATA_ARENA_PIN_GIB (GiB, default: all) and
 * STRATA_MEMAVAILABLE_GIB (tests only). ST_EINVAL naming the variable on a malformed value. */
int st_host_arena_conf_from_env(struct st_host_arena_conf *c);

/* Which pairs go into the RAM copy: keep[i] = 1 for every pair by default; with `resident`
 * (--resident-experts) only for the pairs of the CPU pool, tier[i] == 0 (placement.h: GPU caches
 * of every role, primary, helpers, peer and split stages, own tiers 1..). n_pairs = n_layer *
 * n_expert. Returns the number kept. */
uint32_t st_host_arena_plan(const uint8_t *tier, size_t n_pairs, int resident, uint8_t *keep);

/* Bytes the arena takes for the pairs `keep` marks (the layout above), for the RAM check. */
uint64_t st_host_arena_size(const struct st_model *m, const uint8_t *keep);

/* The RAM check at start: 0 when `need` bytes fit in MemAvailable (or memavailable_gib >= 0, the
 * tests' override); else ST_ENOMEM with one line naming the GiB needed and available and what
 * lowers it (--resident-experts, or in that mode a larger --expert-cache). ST_EIO when
 * /proc/meminfo cannot be read. */
int st_host_arena_check_ram(uint64_t need, uint32_t n_pairs, int resident, double memavailable_gib);

/* Builds the arena of the pairs `keep` marks: checks the RAM (st_host_arena_check_ram with
 * conf->memavailable_gib), allocates it, copies them from the mapping with a few threads,
 * releases the mapping's expert pages, then, when `can_pin` (a CUDA build with CUDA workers),
 * registers layers in order while the total stays within conf->pin_gib (< 0: all). A failed registration stops pinning there (logged), it is not
 * an error. Logs one line: pairs, GiB in RAM, GiB pinned and layers, pairs left in the file.
 * `resident` only words the refusal and the log. Returns 0 or ST_ENOMEM / ST_EIO; on error free
 * with st_host_arena_free. */
int st_host_arena_create(struct st_host_arena *a, const struct st_model *m, const uint8_t *keep, int resident,
                         const struct st_host_arena_conf *conf, int can_pin);

/* Unpins and unmaps; a zeroed arena is a no-op. Call before StarPU shuts CUDA down. */
void st_host_arena_free(struct st_host_arena *a);

/* Matrix `which` (0 gate, 1 up, 2 down) of pair (layer, expert) "through the source": the arena
 * copy when it holds the pair, the mapped file otherwise (also when a is NULL or has no base). */
const void *st_host_arena_src(const struct st_host_arena *a, const struct st_model *m, uint32_t layer,
                              uint32_t expert, int which);

/* Whether the prompt path may stream pair (layer, expert) to a GPU: its bytes are in a pinned
 * layer of the arena. Without an arena (STRATA_HOST_ARENA=0) always 1, the mmap-only behaviour. */
int st_host_arena_streamable(const struct st_host_arena *a, uint32_t layer, uint32_t expert);

/* Releases the mapping's pages of pair (layer, expert) (madvise; they are read again from the page
 * cache if needed) unless the arena holds the pair, in which case the mapping was not read. a may
 * be NULL (no arena yet: the GPU caches' first fill). */
void st_host_arena_release_pair(const struct st_host_arena *a, const struct st_model *m, uint32_t layer,
                                uint32_t expert);

/* STRATA_MEMORY_LOG=1 (doc/tuning.md): whether the memory log is on (read once). */
int st_memory_log_on(void);

/* The value of `key` ("VmRSS", "RssFile", ...) in /proc/self/status, GiB; -1 when absent. */
double st_memory_status_gib(const char *key);

/* The model file's pages mapped into the process (/proc/self/pagemap), GiB: gib[0] all of them,
 * gib[1] and gib[2] those of expert pairs, split as the memory log below does (with `tier`: tier 0
 * and the rest; else pairs the arena a holds and those it left in the file). 0, or -1 when
 * pagemap cannot be read (gib[] are then -1). */
int st_memory_file_pages(const struct st_model *m, const struct st_host_arena *a, const uint8_t *tier, double gib[3]);

/* When the memory log is on, prints one line on stderr, "strata: memory: <stage>: ...", with
 * VmRSS, VmHWM (the peak so far, what ru_maxrss reports), RssAnon, RssFile, RssShmem, VmLck and
 * VmPin of /proc/self/status; then, from /proc/self/pagemap, the model file's pages mapped into
 * the process split into dense weights and expert pairs: with `tier` (placement.h's table, may be
 * NULL) those of the CPU pool (tier 0) and those a GPU cache owns, else with an active arena those
 * it holds and those left in the file; from /proc/self/smaps the file mapping's copied-on-write
 * (anonymous) and locked pages, the arena's resident bytes and transparent huge pages, and the
 * largest other mappings by name; and the releases of file pages (madvise) that failed so far.
 * m and a may be NULL. A no-op when the log is off; parts that cannot be read are left out. */
void st_memory_log(const char *stage, const struct st_model *m, const struct st_host_arena *a, const uint8_t *tier);

#endif
