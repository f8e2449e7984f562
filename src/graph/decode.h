/* The decode step (DESIGN.md, "The decode critical path"), as the engine builds it: one token's
 * whole task graph submitted before its first task runs, with no wait on the submitting thread
 * until the logits.
 *
 *   decode_bufs.c    the persistent buffers (host, the primary GPU's, and their StarPU handles),
 *                    registered once per engine, and the codelets' context (codelets/decode.h)
 *   device_tables.c  the tiers' device tables: each pair's slot in the primary cache
 *   layer.c          a span of layers' task (the GPU's dense work and cached experts), the CPU pool's lanes
 *   token.c          the token's graph: every layer and the head, then the host's bookkeeping
 *
 * With a CUDA worker the dense work, the KV cache and attention run on the primary GPU, the
 * primary cache's experts there too, one task per span of layers (STRATA_LAYER_SPAN), and the CPU pool's experts of every layer
 * run in one lane task per CPU worker per token, fed through the mailbox (codelets/decode.h);
 * without a GPU every layer is one lane task per CPU worker. Configurations the step does
 * not cover (helper caches, the peer tier, a layer split; STRATA_DECODE_GRAPH=0) keep the per-task
 * path of engine.c. */
#ifndef ST_GRAPH_DECODE_H
#define ST_GRAPH_DECODE_H

#include <starpu.h>

#include "codelets/decode.h"

struct st_engine;

struct st_decode {
  struct st_decode_ctx ctx;
  struct st_decode_layer *layers;   /* [n_layer] */
  const void **expert_src;          /* [n_layer][n_expert][3] */
  void *host_block;                 /* the host buffers, one allocation */
  size_t host_bytes;
  int steps_logged;                 /* decode steps counted for the memory log, up to 2 (STRATA_MEMORY_LOG) */
  int gpu;                          /* dense work on the primary GPU */
  int primary_worker;               /* its StarPU worker */
  unsigned primary_node;
  uintptr_t dev_block;              /* ctx.dev's allocation on that node */
  uintptr_t extra_block;            /* ctx.dlayers' vectors on that node (another architecture's), or 0 */
  size_t extra_bytes;
  struct st_decode_dev_layer *dlayers; /* ctx.dlayers' home */
  void *mail_block;                 /* GPU mode: the mailbox (pinned, mapped), one allocation */
  size_t mail_bytes;
  uint8_t *layer_cpu;               /* [n_layer]: the CPU pool owns a pair of the layer */
  int n_lanes;                      /* one per CPU worker */
  int *lane_worker;                 /* [n_lanes] StarPU worker ids */
  unsigned order;                   /* the primary worker's last starpu_task::workerorder */
  int span;                         /* GPU mode: layers a decode_layer task runs (STRATA_LAYER_SPAN; 1..n_layer) */
  starpu_data_handle_t *span_bufs;  /* GPU mode: one task's handles, [span * per-layer most + 2] */
  enum starpu_data_access_mode *span_modes; /* and their modes */
  char *names;                      /* task names (StarPU keeps the pointers) */
  const char **layer_names, **lane_names; /* [n_layer + 1] (GPU mode: a span's at its first layer), [(n_layer + 1) * n_lanes] */
  uint64_t tasks_last;              /* tasks of the last step submitted */
  int pool_lanes;                   /* GPU mode: the last step submitted the CPU pool's lanes */
  uint64_t last_end_ns;             /* GPU mode: the last step's head end (GPU clock), 0 before one */
  double last_return_s;             /* host clock (st_now) as the last step returned, 0 before one */
  int pending;                      /* STRATA_PRESUBMIT: a step is submitted whose token the host has not written
                                       (its position, number and tasks: ctx.pos, ctx.seq, tasks_last) */
  int pending_broken;               /* its submission failed part way (settle it, then report) */
  int smem_set;                     /* ctx.smem_set's home */
  int logits_finite;                /* the last st_decode_step checked its logits finite as it copied them (GPU mode),
                                       or the head's kernel found them finite (logits NULL) */
  int32_t next_id;                  /* GPU mode, logits NULL: the head's argmax of the last step's logits */
};

/* Whether the engine's configuration runs decode steps through this path, and why not (`why`:
 * a static string, for the start-up log). */
int st_decode_supported(const struct st_engine *e, const char **why);

/* Whether the decode step's GPU kernels compute the model's architecture (qwen3moe; gpt-oss with full
 * NEOX RoPE, its routing and a sliding window the short-context attention takes), and why not. */
int st_decode_gpu_arch(const struct st_engine *e, const char **why);

/* Builds e->dec: buffers, handles, device tables, names. ST_ENOMEM / ST_ERUNTIME on failure. */
int st_decode_init(struct st_engine *e);

/* STRATA_LANE_ROWS (doc/tuning.md): "name=rows,..." overriding the decode lanes' rows per work item,
 * rows[] in the order qkv, o, router, gateup, down, combine, head (0: the default). Rows are
 * computed whole by one item each, so the bits do not depend on these. 0, or ST_EINVAL naming the
 * variable on a malformed list (read once, at engine start, before any loading: e->lane_rows). */
int st_decode_lane_rows_env(int *rows); /* rows[ST_LANE_ROW_KINDS] (graph/engine.h) */
void st_decode_free(struct st_engine *e);

/* Rewrites the primary GPU's pair -> slot table and the layers' CPU-pool flags from the placement
 * (at start and after adaptive swaps; no task may be running). 0 or ST_ERUNTIME. */
int st_decode_tables_update(struct st_engine *e);

/* Submits layer l's tasks of a decode step (layer.c); l == n_layer: the output head. */
/* The most handles a GPU decode task of n_layers layers takes (layer.c's order; the head's 2). */
size_t st_decode_task_bufs_max(const struct st_engine *e, int n_layers);
int st_decode_submit_layer(struct st_engine *e, int l);
/* GPU mode: submits the step's CPU-pool lanes (one per CPU worker; none when the CPU pool owns no
 * pair), before the layers (layer.c). 0 or the submission's error. */
int st_decode_submit_lanes(struct st_engine *e);

/* One decode step (token.c): token `id` at position e->n_past through every layer and the head;
 * the logits (n_vocab floats) into `logits`; the routing counted as the per-task path counts it.
 * GPU mode only, logits NULL: the logits stay in the mailbox and d->next_id is the head's argmax of
 * them (ties to the lower id), d->logits_finite whether they were all finite (if not, they are copied
 * to e->logits for the caller's report).
 * Does not advance n_past. d->logits_finite: 1 when the copy out of the mailbox found the logits
 * finite (st_engine_eval then skips its own check), else 0 (not checked). Errors: ST_ERUNTIME when a router's input is not finite or a
 * submission fails. With STRATA_PRESUBMIT (a GPU step without CPU-pool lanes, not recording, room
 * in the context) it submits the step at e->n_past + 1 before it waits for this one's logits: that
 * step's first kernel waits for the mailbox, which the next call fills with its token. */
int st_decode_step(struct st_engine *e, int32_t id, float *logits);

/* Ends a step st_decode_step submitted ahead (if any) before anything else uses the engine: it runs
 * for a zero embedding at its position (its KV row is rewritten before any step reads it, since
 * n_past does not advance) and every task is waited for. Every engine entry point but
 * st_decode_step calls it (engine.c). */
void st_decode_settle(struct st_engine *e);

#endif
