/* The engine: a loaded model, StarPU, the weight and KV-cache handles, and the task graph that
 * runs a batch of tokens through every layer (DESIGN.md, "The task graph of one MoE layer").
 * All state lives in struct st_engine, passed explicitly. */
#ifndef ST_ENGINE_H
#define ST_ENGINE_H

#include <starpu.h>
#include <stdint.h>

#include "codelets/codelets.h"
#include "io/model.h"
#include "tiers/arena.h"
#include "tiers/placement.h"

struct st_recorder;

struct st_engine_opts {
  int n_ctx;                  /* KV-cache length in tokens; 0 = min(the model's context_length, 4096) */
  int kv_type;                /* --cache-type-k: the KV cache's element, ST_TYPE_F16 (what
                                 st_engine_opts_init sets) or ST_TYPE_F32 (0: a zeroed struct) */
  int kv_type_v;              /* --cache-type-v: must equal kv_type (st_engine_opts_check) */
  int prefill;                /* prompt chunk in tokens; 0 = ST_PREFILL_GPU with a GPU, else ST_PREFILL_CPU */
  const char *expert_profile; /* ranked expert pairs (io/profile.h) for the caches, or NULL */
  int expert_cache;           /* primary-cache slots on CUDA0; 0 = none, ST_CACHE_AUTO = what fits,
                                 ST_CACHE_DEFAULT (flag not given) = auto when StarPU has a CUDA worker
                                 and no other tier flag is given, else none */
  int adapt_swaps;            /* adaptive cache: swaps per round (0 = static cache) */
  int adapt_interval;         /* tokens between adaptive rounds; 0 = 32 */
  double reserve_mib;         /* CUDA0 memory `auto` leaves free, MiB; 0 = 1024 */
  const char *trace_dir;      /* record the run there (events.tsv + StarPU's FxT files), or NULL */
  int prompt_stream_rows;     /* --prompt-stream N: an uncached expert with N or more rows in a prompt
                                 chunk runs on CUDA0; 0 = auto (ST_STREAM_ROWS), -1 = off (never) */
  /* the second-GPU tiers (the seeds' SECOND_GPU.md; placement.h) */
  int helper_cache[3];        /* --expert-cache-device1..3: slots on the 1st..3rd visible device after
                                 the primary, ST_CACHE_AUTO, or 0 = off */
  int gpu_placement;          /* ST_PLACE_STRIPE (default) or ST_PLACE_LAYER (tiers/plan.h) */
  int remote_expert_opt;      /* --remote-expert-opt: helpers return one partial sum per token */
  int peer_device;            /* --peer-device N: the peer tier on CUDA device N >= 1; 0 = off */
  double peer_reserve_mib;    /* --peer-reserve-mib: MiB left free on the peer card (default 600) */
  int peer_slots;             /* --peer-slots: cap on the peer's pairs; 0 = as many as fit */
  int peer_adapt_swaps;       /* --peer-adapt-swaps: -1 = adapt_swaps */
  int peer_prefill_rows;      /* --peer-prefill-rows: rows of a prompt chunk the peer computes;
                                 -1 = half of chunk x top-k, 0 = prompt rows stay on the primary */
  int layer_split;            /* --layer-split auto: consecutive layers on consecutive GPUs */
  int cuda_graphs;            /* --cuda-graphs: ST_CUDA_GRAPHS_OFF (0, the default), _ON, or _BOTH
                                 (strata bench only: the engine starts with them on) */
  double gpu_mem_gib;         /* --gpu-mem: GiB strata takes on each GPU at most; 0 = the whole card */
  int resident_experts;       /* --resident-experts: the pairs GPU caches hold at start stay out of
                                 the host expert arena (tiers/arena.h) */
  int no_learn;               /* --no-learn (the commands, io/learned.h): no learned expert profile is
                                 read or written; the engine itself never reads it */
};
/* --prompt-stream auto's rows: an uncached expert with this many rows or more in a prompt chunk
 * runs on CUDA0 (its three matrices cross the bus once for the chunk's rows) rather than on the
 * CPU pool; measured on the qwen3-30b-a3b preset (bench/RESULTS.md, 2026-12-05) */
#define ST_STREAM_ROWS 32
/* --prefill's defaults, tokens: with a GPU (4096: on an H100, prompt 4096 of the qwen3-30b-a3b
 * preset ran at 3,702-4,017 tok/s in the 24 GB class with streamed experts against 1,910-1,980 with
 * 512-token chunks, and with every expert on the GPU at 5,631 against 2,798; bench/RESULTS.md,
 * 2026-12-05) and on CPU workers alone */
#define ST_PREFILL_GPU 4096
#define ST_PREFILL_CPU 512
/* rows of the logits buffer: a run that wants every token's logits takes chunks of at most this
 * many tokens (n_vocab floats a token: 0.6 GiB for Qwen3's 151,680 at 1,024) */
#define ST_LOGITS_ROWS 512
#define ST_CACHE_AUTO (-1)
#define ST_CACHE_DEFAULT (-2)
enum { ST_CUDA_GRAPHS_OFF = 0, ST_CUDA_GRAPHS_ON, ST_CUDA_GRAPHS_BOTH };

/* The defaults of the flags above (everything off, expert_cache ST_CACHE_DEFAULT, peer_reserve_mib
 * 600, the -1 defaults). */
void st_engine_opts_init(struct st_engine_opts *o);

struct st_engine_stats {
  uint64_t expert_tasks[ST_TIER_MAX];   /* expert-row tasks submitted per tier (for a GPU cache: its
                                           active layer launches) */
  uint64_t expert_entries[ST_TIER_MAX]; /* (token, expert) rows computed per tier */
  uint64_t tier_bytes[ST_TIER_MAX];     /* activations in and results out of a card other than the
                                           one running the layer, bytes (packed rows) */
  uint64_t tier_bytes_unpacked[ST_TIER_MAX]; /* the same with full rows: T x top-k rows back per launch */
  uint64_t tasks;                         /* all tasks submitted */
  uint64_t h2d_bytes;                     /* bytes StarPU moved from main RAM to CUDA devices */
  uint64_t stream_tasks;                  /* prompt-path expert tasks of uncached experts run on CUDA0 */
  uint64_t stream_entries;                /* their (token, expert) rows (neither a cache's nor the CPU pool's) */
  uint64_t stream_bytes;                  /* their experts' weight bytes (each crosses the bus once a task) */
  uint64_t swaps;                         /* adaptive-cache swaps so far */
  double wait_routing_s;                  /* host time blocked reading routing tables, s */
  double wait_end_s;                      /* host time waiting for a batch's last tasks, s */
  double submit_s;                        /* host time submitting decode steps' tasks, s */
  double step_s;                          /* host time inside decode steps (submission to logits), s */
  /* GPU decode steps, from the GPU's clock (st_decode_mail::stamps) and the host's: */
  uint64_t gpu_steps;                     /* steps measured */
  double gpu_span_s;                      /* the step's first kernel's start to the head's end, s */
  double gpu_gap_s;                       /* the head's end to the next step's first kernel (steps back to back), s */
  double host_tail_s;                     /* host time from the head's flag to the step's return, s */
  double host_between_s;                  /* host time from a step's return to the next step's start, s */
};

#define ST_LANE_ROW_KINDS 7 /* STRATA_LANE_ROWS's names: qkv, o, router, gateup, down, combine, head */

struct st_engine {
  struct st_model *model; /* borrowed */
  struct st_hparams hp;
  int n_ctx, prefill, n_past;
  int prefill_cap; /* batch buffers hold this many tokens */
  int logits_rows; /* e->logits holds this many tokens' logits: min(prefill_cap, ST_LOGITS_ROWS) */
  int started;     /* StarPU is initialised (and must be shut down) */
  int paused;      /* st_engine_pause */
  int n_slices_o, n_slices_head; /* row slices of attn_output and of the output head */
  int attn_groups_per_task;      /* GQA groups per attention task */
  int ff_parts;                  /* FFN slices per CPU-pool expert (STRATA_FF_SLICE) */
  struct st_placement placement;
  struct st_host_arena arena; /* the CPU pool's RAM copy of the experts (inactive: STRATA_HOST_ARENA=0) */
  struct st_engine_stats stats;

  /* weights, registered once read-only with their home in main RAM */
  starpu_data_handle_t h_output_norm, h_output;
  starpu_data_handle_t *h_layer;   /* [n_layer][9]: attn_norm wq wk wv wo q_norm k_norm ffn_norm router */
  starpu_data_handle_t *h_fixed;   /* [n_layer][3]: the fixed FFN's gate, up, down (a dense layer's FFN or the
                                      shared expert; NULL where the layer has none) */
  starpu_data_handle_t *h_mla;     /* MLA with a GPU: [n_layer][ST_MLA_W] (codelets/decode.h): wq_a, wq_b, wkv_a, wk_b, wv_b,
                                      q_a_norm, kv_a_norm (NULL where the layer has none); else NULL */
  starpu_data_handle_t *h_expert;  /* [n_layer][n_expert][3]: gate up down, over the host expert
                                      arena's copy of the pair, or over the mapping when it has none;
                                      NULL until the CPU pool first needs the pair (engine.c) */
  int kv_type;                     /* ST_TYPE_F32, ST_TYPE_F16 or ST_TYPE_Q8_0 (st_engine_opts.kv_type) */
  void *kv;                        /* [n_layer][n_head_kv][2][n_ctx][head_dim] of kv_type */
  starpu_data_handle_t *h_kv;      /* [n_layer][n_head_kv][2] */

  /* batch buffers, sized for prefill_cap tokens (logits: logits_rows); registered per batch */
  float *x, *h, *ffn_in, *attn, *xo, *expert_out, *logits;
  struct st_route *routing; /* [prefill][k] */

  char *names;                 /* task-name arena */
  const char **expert_names;   /* [n_layer][n_expert] "expert_rows L12 E87 CPU" */
  const char **stream_names;   /* [n_layer][n_expert] "expert_rows L12 E87 CUDA0 stream" (--prompt-stream) */
  const char **layer_names;    /* [n_layer][4 + n_head_kv + n_slices_o] */
  const char **head_names;     /* [n_slices_head] */

  int32_t *routing_trace; /* optional, [n_layer][n_ctx][k] expert ids, set by the caller */
  uint64_t *route_counts;  /* [n_layer][n_expert] routed entries since start (profiles) */
  uint64_t *live_counts;   /* [n_layer][n_expert] routed entries since the last adaptive round */
  int adapt_swaps, adapt_interval, tokens_since_adapt;
  double cache_mass_share; /* share of the profile's routed mass the primary cache holds at start */
  struct st_recorder *rec; /* --trace, or NULL */
  int prompt_stream;       /* rows from which an uncached expert of a prompt chunk runs on CUDA0, its
                              weights streamed there from the pinned host arena; 0 = never (engine.c) */
  int remote_opt;          /* --remote-expert-opt with a helper cache */
  int peer_adapt_swaps, peer_prefill_rows;
  double cache_mass[ST_MAX_CACHES]; /* share of the profile's routed mass each cache holds at start */
  int cuda_graphs;         /* decode-path dense tasks on CUDA0 carry graph keys (cuda/graph.cu) */
  int cublas_rows;         /* STRATA_CUBLAS: batches (experts) of >= this many rows use cuBLAS on a GPU; 0 off */
  int cublas_tf32;         /* STRATA_CUBLAS_TF32: those GEMMs on TF32 tensor cores (with cublas_rows > 0) */
  int mmq;                 /* STRATA_MMQ: the GPU's prompt-path Q8_0 experts on the tensor-core kernels */
  int flash_mma;           /* STRATA_FLASH_MMA: the GPU's prompt attention on the tensor cores (half cache) */
  int int8_dot;            /* STRATA_INT8_DOT: CPU expert-row tasks use int8 activations and integer kernels */
  int gpu_mem_capped;      /* --gpu-mem set STARPU_LIMIT_CUDA_MEM: auto sizing leaves no further reserve */
  int decode_graph;        /* STRATA_DECODE_GRAPH: decode steps through graph/decode.h (default 1) */
  int layer_span;          /* STRATA_LAYER_SPAN: layers a GPU decode task (one CUDA graph) runs (default 12), 0: every layer */
  int pdl;                 /* STRATA_PDL: the decode step's kernels as programmatic dependent launches (default 1) */
  int mxfp4_int8;          /* STRATA_MXFP4_INT8: the decode step's cached MXFP4 experts on int8 activations (default 1) */
  int step_wait;           /* STRATA_STEP_WAIT: a GPU decode step without CPU lanes waits for StarPU to retire its
                              tasks before it returns (1, the default), or returns at the head's flag (0) */
  int presubmit;           /* STRATA_PRESUBMIT: a GPU decode step without CPU lanes submits the next step's tasks
                              before it waits for its logits (graph/token.c; default 1) */
  int gpu_argmax;          /* STRATA_GPU_ARGMAX: st_engine_eval_next takes a GPU step's argmax from its head's
                              kernel and leaves the logits on the card's side (default 1) */
  int lane_token;          /* STRATA_LANE_TOKEN: CPU-only decode, one lane task per CPU worker for the whole token
                              (1, the default) or one per layer (0) */
  int lane_rows[ST_LANE_ROW_KINDS]; /* STRATA_LANE_ROWS: rows per decode lane item (0: the default; graph/decode.h) */
  int lane_stats;          /* STRATA_LANE_STATS: the decode lanes count their time; printed at shutdown (default 0) */
  int prompt_lanes;        /* STRATA_PROMPT_LANES: CPU-only prompt chunks through graph/prompt.h (default 1) */
  struct st_prompt *prompt; /* the prompt lanes' buffers (graph/prompt.h), or NULL: graph/batch.c runs prompt chunks */
  struct st_decode *dec;   /* the decode step's buffers and handles (graph/decode.h), or NULL: the
                              per-task path of this file decodes */
};

/* STRATA_MEMORY_LOG=1: one line per CUDA device at `stage`: the memory in use on the card
 * (cudaMemGetInfo: every process's, the CUDA context included), StarPU's allocations there and its
 * limit (--gpu-mem's STARPU_LIMIT_CUDA_MEM), in MiB, to stderr. Nothing without CUDA workers. */
void st_engine_gpu_memory_log(const char *stage);

/* The KV-cache length an engine created with `requested` tokens (0 = default) will have. */
int st_engine_ctx_size(const struct st_hparams *hp, int requested);

/* Starts StarPU (honouring STARPU_* environment variables), registers the model's weights and a
 * KV cache, fills the GPU expert caches, then copies the CPU pool's experts into the host expert
 * arena (tiers/arena.h) and registers their handles there. Errors: ST_ERUNTIME if StarPU cannot
 * start or has no worker; ST_ENOMEM, also when MemAvailable cannot hold the arena (the message
 * names the GiB and --resident-experts); ST_EINVAL on a bad STRATA_* value. *out is owned: st_engine_destroy() (which also shuts StarPU down). */
int st_engine_create(struct st_model *m, const struct st_engine_opts *o, struct st_engine **out);
void st_engine_destroy(struct st_engine *e);

/* Sets the prompt chunk (tokens) for later evals: 1..the `prefill` the engine was created with.
 * Returns 0 or ST_EINVAL. */
int st_engine_set_prefill(struct st_engine *e, int prefill);

/* Bytes of the engine's KV cache: the layers' st_engine_kv_layer_bytes (qwen3moe: n_layer x
 * n_head_kv x 2 x n_ctx rows of head_dim elements of its kv_type), held in main RAM and, with a
 * CUDA worker, once more on the GPU running the layer. */
uint64_t st_engine_kv_bytes(const struct st_engine *e);

/* Planes of a KV head's cache: 2 (K and V), or 1 for MLA (the latent row is K and V). */
int st_engine_kv_planes(const struct st_hparams *hp);

/* Rows of layer l's KV planes: the context, or for a sliding-window layer a ring of
 * sliding_window + prompt chunk rows when that is shorter (position p in row p % rows: a chunk's
 * tokens see at most the window's keys before them), and its bytes (n_head_kv x planes x rows rows
 * of head_dim elements of kv_type). Layer l's cache starts after the earlier layers'. */
int st_engine_kv_rows(const struct st_engine *e, uint32_t l);
uint64_t st_engine_kv_layer_bytes(const struct st_engine *e, uint32_t l);

/* Forgets the KV cache (next eval starts at position 0). */
void st_engine_reset(struct st_engine *e);

/* Runs `n` tokens at positions n_past.. in prompt chunks of at most `prefill` tokens (logits_rows
 * with all_logits) and advances
 * n_past. Writes the logits (float32, n_vocab each) of the last token to `logits`, or of every
 * token to `logits` ([n][n_vocab]) when all_logits != 0. Errors: ST_EINVAL when the tokens
 * would run past the context (nothing is computed then), or an id is out of range. */
int st_engine_eval(struct st_engine *e, const int32_t *ids, int n, float *logits, int all_logits);

/* Greedy decoding's step: evaluates token `id` at position n_past (advancing it, as st_engine_eval
 * with n = 1) and sets *next to the id of its largest logit, ties to the lower id: st_argmax of the
 * logits st_engine_eval would write, bit for bit the same choice. With a GPU decode step
 * (STRATA_GPU_ARGMAX=1, the default) the head's kernel finds it (graph/token.c) and the n_vocab
 * logits are not copied out of the mailbox; non-finite logits are refused as st_engine_eval
 * refuses them. Errors: st_engine_eval's. */
int st_engine_eval_next(struct st_engine *e, int32_t id, int32_t *next);

/* One adaptive round (--adapt-swaps): swaps up to adapt_swaps cold cached pairs for the pairs
 * routed most often to the CPU pool since the last round, when they were routed more often,
 * and logs each swap on stderr. Runs by itself every adapt_interval tokens; callers may also
 * run it between requests. Returns the number of swaps or a negative ST_E*. */
int st_engine_adapt(struct st_engine *e);

/* Pauses (paused != 0) or resumes StarPU's workers: paused workers sleep instead of polling for
 * tasks, so an idle server costs no CPU. Nothing may be submitted while paused; idempotent. */
void st_engine_pause(struct st_engine *e, int paused);

/* The tiers' counters between two snapshots (now NULL: e's current stats; before NULL: zero) as one line, into
 * buf[len]: expert entries per tier, then for each card other than the one running the layers, MiB
 * transferred with packed rows and what full rows would have moved, and its active layer launches
 * (the seeds' per-request log). */
void st_engine_tier_report(const struct st_engine *e, const struct st_engine_stats *now,
                           const struct st_engine_stats *before, char *buf, size_t len);

/* Expert entries computed on GPU caches (every tier but the CPU pool; not the streamed ones). */
uint64_t st_stats_gpu_entries(const struct st_engine_stats *s);
/* 0 when a prompt chunk of T tokens fits buffers of cap tokens and, with every token's logits
 * (all_logits), the logits buffer's e->logits_rows; else ST_EINVAL with a message. st_engine_eval's
 * chunking keeps to both; the prompt paths check. */
int st_engine_chunk_fits(const struct st_engine *e, int T, int cap, int all_logits);
/* Every routed expert entry computed: the GPU caches', the CPU pool's and the streamed ones. */
uint64_t st_stats_routed_entries(const struct st_engine_stats *s);
/* Turns CUDA graphs for the decode path's dense tasks on (on != 0) or off for later evals.
 * Returns whether they are on: never without a CUDA worker for the dense work. */
int st_engine_set_cuda_graphs(struct st_engine *e, int on);

/* After a non-finite router input or logit (`what`, e.g. "the logits of token 5"): looks for the
 * first tensor of layers l0..l1 (l1 = n_layer: also the output head; layer 0: also token_embd)
 * with a weight that decodes to a non-finite value, and records ST_ERUNTIME naming it (type,
 * expert, row), or, when they are all finite, saying the activations overflowed. Returns
 * ST_ERUNTIME. Reads the weights through the mapping (a few seconds for a large layer). */
int st_engine_nonfinite(struct st_engine *e, int l0, int l1, const char *what);

/* The token embedding rows of ids[0..T) as float32 into x ([T][n_embd]). */
void st_engine_embed(const struct st_engine *e, const int32_t *ids, int T, float *x);

/* Counts layer l's routing of T tokens at positions n_past.. (route: T * k entries, token after
 * token): the profile's and the adaptive cache's counts, and the routing trace when one is kept. */
void st_engine_count_routes(struct st_engine *e, uint32_t l, const struct st_route *route, int T);

/* The CUDA graph keys (cuda_codelets.h) the per-task path's dense tasks use are below this; the
 * decode step's start here. */
int st_engine_graph_keys_used(const struct st_engine *e);

/* `t` with the run recorder's completion callback when the run is traced (--trace). */
struct st_target st_engine_traced(const struct st_engine *e, struct st_target t);

/* StarPU worker counts by kind, for reports. */
int st_engine_n_cpu_workers(const struct st_engine *e);
int st_engine_n_cuda_workers(const struct st_engine *e);
/* The CUDA devices StarPU may start workers on (CUDA_VISIBLE_DEVICES applied): 0 with STARPU_NCUDA=0,
 * a build without CUDA or no driver. Callable before any engine exists. */
int st_engine_visible_cards(void);

#endif
