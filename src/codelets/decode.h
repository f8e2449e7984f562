/* The decode step's codelets (DESIGN.md, "The decode critical path"): one token through every
 * layer and the output head with few, fat tasks on buffers that keep their addresses from step
 * to step. Two families:
 *
 * - decode lanes (decode_lane.c, CPU): a layer's CPU work cut into work items, taken in a fixed
 *   order by a group of lane tasks (one per CPU worker) through two counters (st_lane_sync): a
 *   lane claims the next item, waits until every item of the previous phase is done, runs it,
 *   counts it done. Every output element is computed by exactly one item with the same
 *   arithmetic whichever lane runs it, so results do not depend on STARPU_NCPU or the scheduler.
 *   With no GPU the lanes run the whole token (attention, router, experts, combine, head); with
 *   a GPU one lane task per CPU worker runs the CPU-pool experts of every layer of the token, in
 *   layer order, through the mailbox (st_decode_mail).
 * - decode GPU tasks (cuda/decode.cu): a layer's dense work (the previous layer's combine,
 *   attention with the KV append, the output projection, the FFN norm, router and top-k) and its
 *   cached experts (two kernels that read the routing and the pair -> slot table on the device) as
 *   one CUDA graph of eight fused kernels instantiated once per attention regime of the token's
 *   position and replayed, the position and the step number read from device memory; the output
 *   head.
 *
 * The mailbox: host memory the GPU maps (pinned, cudaHostAllocMapped), through which a layer's
 * routing and FFN input go to the CPU pool and its rows come back, each half announced by a flag
 * that carries the step number (st_decode_ctx::seq; flags are never reset). The layer's router
 * kernel writes the routing and FFN input, fences (system scope) and stores xin_seq[l]; the lanes
 * spin on it, compute, and the lane that finishes the layer's last item stores cpu_seq[l]
 * (release); the next layer's first kernel spins on that flag (acquire, system scope) when one of
 * the token's slots is the CPU pool's, then reads the rows. No StarPU transfer, dependency or host
 * wait sits between the GPU and the CPU pool inside a step. The head writes the logits and the
 * step's routing there too and raises head_seq, which the submitting thread waits for.
 *
 * Codelets know nothing of caches or tiers: the lanes compute the pairs whose `tier` entry is 0
 * (the CPU pool's, tiers/placement.h), a GPU task the pairs its slot table points at.
 * The decode step takes one token (T = 1). */
#ifndef ST_DECODE_H
#define ST_DECODE_H

#include <sched.h>
#include <stdint.h>
#include <stdio.h>

#include "codelets/codelets.h"
#include "codelets/dot.h"
#include "codelets/layer_cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One layer's weights for the decode lanes (host pointers into the mapping; norms are F32). */
/* MLA's matrices and norms in the decode step's GPU task, after its other buffers (graph/layer.c;
 * engine.h's h_mla), in this order; an absent one (wq_a, wq_b and q_a_norm without a q LoRA) is
 * passed as the attention norm and not read. */
enum { MLA_Q_A, MLA_Q_B, MLA_KV_A, MLA_K_B, MLA_V_B, MLA_Q_A_NORM, MLA_KV_A_NORM, ST_MLA_W };

struct st_decode_layer {
  const float *attn_norm, *q_norm, *k_norm, *ffn_norm;
  const void *wq, *wk, *wv, *wo, *router;
  struct st_wdesc wq_d, wk_d, wv_d, wo_d, router_d;
  struct st_wdesc gate_d, up_d, down_d; /* the layout of one expert's matrices */
  uint64_t gate_bytes, up_bytes;        /* one expert's gate and up matrices: offsets in a cache slot */
  void *kv; /* the layer's host KV cache [n_head_kv][kv_planes][kv_rows][head_dim] of st_decode_ctx.kv_type */
  int kv_rows; /* n_ctx, or a sliding layer's ring (position p in row p % kv_rows; st_engine_kv_rows) */
  /* what other architectures add (io/arch.h; NULL / 0 when the layer has none) */
  const float *bq, *bk, *bv, *bo, *sinks;   /* attention biases, one sink logit per head */
  const float *router_b, *probs_b;         /* router bias, selection bias [n_expert] */
  const float *gate_b, *up_b, *down_b;     /* expert biases [n_expert][n_ff] / [n_expert][n_embd] */
  int dense, swa;                          /* no experts (the dense FFN only); sliding window */
  /* the FFN every token computes besides its routed experts, at slot k: the shared expert of a
   * MoE layer, or a dense layer's FFN (fixed_ff 0: none); float32 activations */
  const void *fgate, *fup, *fdown;
  struct st_wdesc fgate_d, fup_d, fdown_d;
  int fixed_ff;
  /* its int8 activations (st_fixed_q8; 0: float32): bytes of a quantised row for gate and up
   * (they share a layout or both stay float32), and for down (32-weight blocks only: each gate/up
   * item quantises its own rows, as qa_in_gateup) */
  uint64_t fq_x, fq_a;
  /* MLA (st_decode_ctx.mla): q_a (or wq without a q LoRA), kv_a_mqa, k_b and v_b per head */
  const void *wq_a, *wq_b, *wkv_a, *wk_b, *wv_b;
  const float *q_a_norm, *kv_a_norm;
  struct st_wdesc wq_a_d, wq_b_d, wkv_a_d, wk_b_d, wv_b_d;
};

/* The work counters of one group of lanes, each on its own cache line (accessed with __atomic
 * builtins). `error` is set (1) by an item that found a non-finite router output. */
struct st_lane_sync {
  int64_t next;
  char pad0[56];
  int64_t done;
  char pad1[56];
  int32_t error;
  int32_t error_layer;
  char pad2[56];
};

#ifndef __CUDACC__
/* Spins until *p >= want (acquire), pausing, then yielding after a while: a lane's wait for
 * the items of the phases before its item. */
static inline void st_lane_wait_at_least(const int64_t *p, int64_t want) {
  for (unsigned spins = 0; __atomic_load_n(p, __ATOMIC_ACQUIRE) < want; spins++) {
    if (spins < (1u << 14)) __builtin_ia32_pause();
    else sched_yield();
  }
}

/* Claims the next item of s below `bound`: its index, or -1 when none is left. */
static inline int64_t st_lane_claim(struct st_lane_sync *s, int64_t bound) {
  int64_t i = __atomic_load_n(&s->next, __ATOMIC_RELAXED);
  do {
    if (i >= bound) return -1;
  } while (!__atomic_compare_exchange_n(&s->next, &i, i + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
  return i;
}
#endif

/* Bytes of one quantised activation row of n floats on a GPU (cuda/common.cuh st_q8_stride). */
static inline size_t st_decode_q8_bytes(size_t n) { return (n + n / 8 + 15) / 16 * 16; }

/* Device buffers of the decode step on the primary GPU, one allocation made once per engine
 * (graph/decode_bufs.c); NULL without a GPU. Rows are float32 unless said. */
struct st_decode_dev {
  float *x, *h, *xn, *q, *kvnew, *attn, *xo, *ffn_in, *rlogits; /* [d], [d], [d], [Hq hd], [2 G hd], [Hq hd], [d], [d], [E] */
  float *act, *gpu_out;                                         /* [k][ff] silu(gate) * up, [k + 1][d] (slot k: the fixed FFN's) */
  float *fgu, *fact;                                            /* the fixed FFN's gate and up [2][n_ff_max], act [n_ff_max] */
  float *part;                                                  /* attention partials */
  struct st_route *route;                                       /* [n_layer][k] */
  uint64_t *sel_tag; /* [n_layer][k]: dk_gateup's block 0's selection for dk_down, (step << 32) | expert, zero at
                        first (DK_DOWN_TAGS, decode_kernels.cuh's default; unused in -DDK_DOWN_TAGS=0 builds) */
  int32_t *pos;                                                 /* [2]: the token's position, the step number (seq) */
  int32_t *counters; /* [n_head]: the decode attention's last-block counters, zero between launches */
  uint64_t *amax;    /* [2]: the head's largest st_argmax_key over the step's logits, and 1 when one was not
                        finite (the head's kernel raises both; dk_head_done publishes them and zeroes them) */
  int8_t *ffn_q;     /* STRATA_INT8_DOT, Q8_0 gate and up: ffn_in quantised (st_decode_q8_bytes(d)) */
  int8_t *xnq;       /* STRATA_INT8_DOT, Q8_0 Q or output head: xn quantised by dk_pre (st_decode_q8_bytes(d)) */
  int8_t *attnq;     /* STRATA_INT8_DOT, Q8_0 output projection: attn quantised by the attention's kernels
                        (st_decode_q8_bytes(Hq hd)) */
  float *rope;       /* [n_ctx][hd / 2] RoPE's (cos, sin), filled once (cuda/attention.cu st_cuda_rope_table) */
  const uint8_t **slot_ptr; /* [n_layer][n_expert] the pair's slot (gate, up, down) in this card's cache, or NULL */
  /* MLA (cuda/mla.cuh; one float elsewhere): the q LoRA's output [q_lora], the absorbed queries
   * [n_head][hd], the attention's latent outputs [n_head][kv_lora] */
  float *qa, *qm, *olat;
  uint64_t bytes;
};

/* What another architecture's layer adds on the primary GPU (device addresses, NULL where the layer
 * has none), uploaded once per engine (graph/decode_bufs.c): gpt-oss's q/k/v/o biases, sinks, the
 * router's bias and the experts' biases ([n_expert][n_ff] for gate and up, [n_expert][n_embd] for
 * down). */
struct st_decode_dev_layer {
  const float *bq, *bk, *bv, *bo, *sinks, *router_b, *gate_b, *up_b, *down_b;
  const float *probs_b; /* glm4moe, deepseek2: the selection bias [n_expert] */
};

/* The mailbox between the primary GPU and the CPU pool (see the top of the file), one allocation of
 * pinned host memory mapped into the GPU's address space; st_decode_ctx holds its host addresses
 * (`mail`) and the same memory's device addresses (`dmail`). Flags are 64 bytes apart. */
#define ST_MAIL_FLAG_STRIDE 16 /* uint32 words between two layers' flags */
/* An order-preserving key of logit v of id i: a larger key is a larger v, and of equal v the lower
 * id (st_argmax's ties), -0 taken as +0; the largest key over the logits names their argmax
 * (st_argmax_key_id). v must be finite. A function of (v, i) alone, so a maximum taken in any
 * order (the head's atomics) gives the same id as st_argmax. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline uint64_t st_argmax_key(float v, uint32_t i) {
  union {
    float f;
    uint32_t u;
  } b = {v == 0.0f ? 0.0f : v};
  const uint32_t o = b.u >> 31 ? ~b.u : b.u | 0x80000000u;
  return (uint64_t)o << 32 | (0xFFFFFFFFu - i);
}
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int32_t st_argmax_key_id(uint64_t key) { return (int32_t)(0xFFFFFFFFu - (uint32_t)key); }

struct st_decode_mail {
  uint32_t *xin_seq;       /* [n_layer] (strided): the layer's routing and FFN input are written */
  uint32_t *cpu_seq;       /* [n_layer] (strided): the CPU pool's rows of the layer are written */
  uint32_t *abort_seq;     /* [1]: the host gave up the step (a failed submission): lanes leave */
  struct st_route *xroute; /* [n_layer][k] the layer's routing */
  float *xffn;             /* [n_layer][n_embd] the layer's FFN input */
  float *cpu_out;          /* [n_layer][k][n_embd] the CPU pool's weighted expert row of each slot */
  int32_t *pos_seq;        /* [2]: the step's position and number, written by the host before submission */
  float *emb;              /* [n_embd] the token's embedding row, likewise (layer 0's input) */
  uint32_t *head_seq;      /* [1]: the head's logits and the step's routing are written */
  float *logits;           /* [n_vocab] the head's logits */
  int32_t *argmax;         /* [2]: the id of the largest logit (ties to the lower id, as st_argmax) and 1 when
                              a logit is not finite (then [0] means nothing) */
  struct st_route *route;  /* [n_layer][k] the step's routing */
  uint64_t *stamps;        /* [2]: the GPU's clock (%globaltimer, ns) as the step's first kernel starts and as
                              the head ends (st_decode_step's GPU span and the idle time between steps) */
};

/* Everything the decode codelets read, built once per engine and owned by it (graph/decode_bufs.c). */
struct st_decode_ctx {
  int n_layer, n_embd, n_head, n_head_kv, head_dim, n_expert, k, n_ff, n_vocab, n_ctx;
  float eps, rope_theta;
  /* the architecture (io/arch.h, model.h's st_hparams; qwen3moe: plain NEOX RoPE over head_dim,
   * softmax routing renormalised, silu, no window) */
  struct st_rope_conf rope;
  struct st_attn_conf attn_conf;   /* scale, value rows, window (sinks per layer) */
  int gating, n_group, n_group_used, w_norm, ffn_act;
  float w_scale;
  int kv_planes;                   /* 2: K and V cached; 1 (MLA): one row, K and V */
  int mla, q_lora, kv_lora, qk_nope, head_dim_v;
  int n_ff_max;                    /* act's row: the largest of n_ff and every layer's fixed_ff */
  float *qa;                       /* MLA: [q_lora] the q LoRA's output */
  uint8_t *qaq;                    /* MLA: qa normed and quantised for q_b (st_dense_q8's rule) */
  float *qm;                       /* MLA: [n_head][head_dim] the absorbed queries */
  uint8_t *xfq, *afq;              /* the fixed FFN's quantised input and act rows (st_fixed_q8) */
  int kv_type;                         /* the KV cache's element: ST_TYPE_F32, ST_TYPE_F16 or ST_TYPE_Q8_0 */
  int int8_dot;                        /* STRATA_INT8_DOT: quantised activations for the CPU experts */
  int pdl;                             /* STRATA_PDL: a graph's kernels launched as programmatic dependents */
  int mxfp4_int8;                      /* STRATA_MXFP4_INT8: cached MXFP4 experts on int8 activations (GPU) */
  int presubmit;                       /* STRATA_PRESUBMIT: layer 0's first kernel waits for the mailbox's
                                          step number to move past the last step's (graph/token.c) */
  const struct st_decode_layer *layers; /* [n_layer] */
  const void *const *expert_src;       /* [n_layer][n_expert][3] host gate/up/down of each pair */
  const uint8_t *tier;                 /* [n_layer][n_expert]: 0 = the CPU pool computes the pair */
  const void *output;                  /* the output head [n_vocab][n_embd] and its norm */
  const float *output_norm;
  struct st_wdesc output_d;
  /* host buffers */
  float *x, *h, *xn, *q, *attn, *xo, *ffn_in, *rlogits; /* as on the device */
  float *kvnew;                        /* [2][n_head_kv][head_dim]: the new K rows, then V rows (CPU-only) */
  float *act;                          /* [k + 1][n_ff_max]: silu(gate) * up of each slot (slot k: the layer's fixed FFN) */
  float *eout;                         /* [k + 1][n_embd]: each slot's weighted expert row (CPU-only) */
  float *logits;                       /* [n_vocab] (CPU-only: the head's output) */
  struct st_route *route;              /* [n_layer][k]: the step's routing (CPU-only) */
  uint8_t *xq;                         /* quantised FFN input: [2][q8 row of n_embd] (gate's, up's layout) */
  uint8_t *aq;                         /* [k][q8 row of n_ff]: quantised act rows (down's layout) */
  uint8_t *xnq, *attnq;                /* int8 rows of xn (st_lane_xn_act's layout) and of attn (wo's) for
                                          the CPU's dense products (CPU-only, st_dense_terms) */
  uint8_t *xnr;                        /* xn's second term (st_lane_xn_act, st_matmul_q8_2) */
  uint8_t *attnr;                      /* attn's second term for a two-term wo (st_dense_terms) */
  float *rope_cs;                      /* CPU-only: the step position's RoPE table (st_rope_conf_table,
                                          n_rot floats), made once a token by the EMBNORM item */
  float *scratch;                      /* per StarPU worker: scratch_floats each */
  int64_t scratch_floats;
  int rows_qkv, rows_o, rows_router, rows_gateup, rows_down, rows_combine, rows_head; /* rows per work item */
  /* the CPU-only token plan: phases of items, a prefix of starts (st_lane_token_plan) */
  int n_phases;
  int64_t *phase_start;                /* [n_phases + 1] */
  int16_t *phase_kind, *phase_layer;   /* [n_phases] */
  int64_t *layer_end;                  /* [n_layer + 1]: first item after layer l (n_layer: the head) */
  struct st_lane_sync *sync;           /* [n_layer + 1]: the token's (CPU-only: sync[0]) or each layer's */
  int pos;                             /* the step's position (set before submission) */
  uint32_t seq;                        /* the step's number, never 0 (set before submission) */
  const uint8_t *layer_cpu;            /* [n_layer]: the CPU pool owns a pair of the layer */
  struct st_decode_mail mail, dmail;   /* GPU mode: the mailbox's host and device addresses */
  struct st_decode_dev dev;
  const struct st_decode_dev_layer *dlayers; /* [n_layer] (GPU mode, architectures but qwen3moe; else NULL) */
  int rope_uploaded;                   /* the host filled dev.rope (st_rope_conf_table: YaRN, mscale) */
  int graph_key0;                      /* first CUDA graph key of the decode tasks */
  struct st_lane_stats *stats;         /* STRATA_LANE_STATS=1: [StarPU workers] per-lane counters; else NULL */
  struct st_lane_walls *walls;         /* STRATA_LANE_STATS=1: the phases' wall times; else NULL */
  int *smem_set;                       /* per engine, 0 at start: the CUDA side has set its kernels'
                                          shared-memory attributes and filled the RoPE table (StarPU
                                          resets the devices at shutdown) */
};

/* The matrix that takes a layer's normed input for the queries: wq, or MLA's q LoRA (q_a) when
 * the layer has one; its st_dense_q8 rule decides whether xn is quantised for it (as wq's). */
static inline const struct st_wdesc *st_q_in(const struct st_decode_layer *L) { return L->wq_a ? &L->wq_a_d : &L->wq_d; }

/* The activation layout of layer l's quantised xn (l == n_layer: the output head's input), the CPU
 * lanes' rule (decode_lane.c, prompt_lane.c; attention.c and st_dense_matmul apply the same): GQA
 * the type of the first of wq, wk, wv that takes int8 activations (st_dense_terms), the head its
 * own, MLA Q8_0 when q (wq or q_a) takes them (st_dense_q8); ST_TYPE_COUNT when none does. *two:
 * whether a product of that layout takes two terms (then xn's second term is made too). */
uint32_t st_lane_xn_act(const struct st_decode_ctx *c, int l, int *two);
/* Terms (st_dense_terms) of layer l's GQA product of w (kind ST_DENSE_QO or ST_DENSE_KV; the head
 * at l == n_layer: ST_DENSE_HEAD) on xn quantised as st_lane_xn_act says; 0: float32. */
int st_lane_xn_terms(const struct st_decode_ctx *c, int l, const struct st_wdesc *w, int kind);
/* Terms (st_dense_terms, ST_DENSE_QO) of layer l's output projection, its input attn quantised in
 * wo's own layout. */
int st_lane_o_terms(const struct st_decode_ctx *c, int l);

/* The fixed FFN's int8 rule (both lanes, so that a token's bits do not depend on the path): gate
 * and up take int8 activations when st_matmul_q8 takes both types in one layout of n_embd, down
 * when its type takes 32-weight blocks of fixed_ff (items of rows_gateup, a multiple of 32, then
 * quantise their own act rows). Sets L->fq_x and L->fq_a. */
static inline void st_fixed_q8(struct st_decode_layer *L, int n_embd, int int8) {
  const uint64_t qg = int8 && L->fixed_ff ? st_q8_row_bytes(L->fgate_d.type, n_embd) : 0;
  const uint64_t qu = int8 && L->fixed_ff ? st_q8_row_bytes(L->fup_d.type, n_embd) : 0;
  L->fq_x = qg && qg == qu ? qg : 0;
  L->fq_a = int8 && L->fixed_ff && st_q8_row_bytes(L->fdown_d.type, 32) ? st_q8_row_bytes(L->fdown_d.type, L->fixed_ff) : 0;
}

/* Phases of lane work items, in the order a layer runs them. */
enum st_lane_kind {
  ST_LP_EMBNORM, /* 1 item: xn = RMSNorm(x) with layer 0's attn_norm; the position's RoPE table */
  ST_LP_QKV,     /* rows of wq, wk, wv (and their biases): q, and the new K, V rows (MLA: rows of q_a
                    or wq, then kv_a_mqa) */
  ST_LP_MLANORM, /* MLA, 1 item: the q LoRA's norm; the latent's norm and the key part's RoPE, cached */
  ST_LP_QB,      /* MLA with a q LoRA: rows of q_b */
  ST_LP_ROPE,    /* per query head, then per KV head: q/k RMSNorm and RoPE, K and V into the cache
                    (MLA: per head, the query's RoPE and its absorption by k_b) */
  ST_LP_ATTN,    /* per query head: softmax attention over positions 0..pos (MLA: then v_b) */
  ST_LP_QATTN,   /* 1 item (int8 and Q8_0 wo only): attn quantised for wo (st_dense_matmul's rule) */
  ST_LP_OPROJ,   /* rows of wo, and h = x + xo for them */
  ST_LP_RESNORM, /* 1 item: ffn_in = RMSNorm(h) */
  ST_LP_RLOGITS, /* rows of the router */
  ST_LP_TOPK,    /* 1 item: softmax, top-k; then, as QX's item, ffn_in quantised (int8 only) */
  ST_LP_QX,      /* 1 item (int8 only): ffn_in quantised for gate and up (GPU mode's lanes, and a layer
                    without a router's fixed FFN) */
  ST_LP_GATEUP,  /* (slot, rows of gate and up): act = silu(gate x) * up x */
  ST_LP_QA,      /* per slot (int8 only, down's activations in super-blocks of 256): act quantised for
                    down; with blocks of 32 each GATEUP item quantises its own rows */
  ST_LP_DOWN,    /* (slot, rows of down): eout = weight * down act */
  ST_LP_COMBINE, /* rows of x = h + the slots' rows in slot order, the fixed FFN's last */
  ST_LP_NORM,    /* 1 item: xn = the next norm of x (quantised as st_lane_xn_act says) */
  ST_LP_HEAD,    /* rows of the output head: logits */
  ST_LP_KINDS
};

/* STRATA_LANE_STATS=1 (doc/tuning.md): where the lanes' time goes, per phase kind, summed over the
 * decode steps. Each lane adds its own row (busy: running items; wait: spinning before an item for
 * the previous phase to finish; index ST_LP_KINDS: GPU mode's wait for a layer's input from the
 * mailbox), so the counters are not shared; the lane that finishes a phase's last item adds the
 * time since the previous phase ended to walls (phases of one plan never overlap). Nanoseconds
 * (CLOCK_MONOTONIC). Off, the lanes read no clock. */
struct st_lane_stats {
  uint64_t busy_ns[ST_LP_KINDS + 1], wait_ns[ST_LP_KINDS + 1], items[ST_LP_KINDS + 1];
  char pad[64];
};
struct st_lane_walls {
  uint64_t wall_ns[ST_LP_KINDS], phases[ST_LP_KINDS];
  uint64_t last_ns; /* the end of the previous phase (or the plan's first claim) */
  uint64_t steps;   /* decode steps counted (graph/token.c) */
};
/* Prints the lanes' table (per decode step: wall ms, lane-ms busy and waiting, lanes busy on
 * average) to f; nothing when c->stats is NULL or no step ran. */
void st_lane_stats_print(const struct st_decode_ctx *c, int n_lanes, FILE *f);

/* Spins (pausing, then yielding) until the mailbox flag at p holds `want` (acquire) or *abort_seq
 * does: the lanes' wait for a layer's input, the submitting thread's for the head. */
void st_mail_wait(const uint32_t *p, uint32_t want, const uint32_t *abort_seq);

/* Lane task arguments. kind: ST_LANE_TOKEN (CPU-only: items of sync[0] before layer_end[layer]),
 * ST_LANE_EXPERTS (GPU mode: the CPU-pool experts of every layer with layer_cpu set, in layer
 * order, each once its xin flag carries ctx->seq, counters sync[layer]; layer is unused). No
 * buffers: the mailbox carries what crosses. */
enum { ST_LANE_TOKEN, ST_LANE_EXPERTS };
struct st_lane_args {
  const struct st_decode_ctx *ctx;
  int32_t kind, layer;
};
int st_submit_decode_lane(const struct st_lane_args *a, starpu_data_handle_t *bufs, int nbufs, struct st_target tgt,
                          const char *name);

/* Items of the CPU-only token plan: fills c->n_phases, phase_* and layer_end for a token at
 * any position (the counts do not depend on it). Returns 0 or ST_ENOMEM. */
int st_lane_token_plan(struct st_decode_ctx *c);

/* GPU task arguments (cuda/decode.cu). The task of layers layer .. layer + n_layers - 1 (< n_layer;
 * one CUDA graph) has, per layer in order, buffers attn_norm, wq, wk, wv, wo, q_norm, k_norm,
 * ffn_norm, router (R), the layer's K and V caches per KV head (RW; MLA: its one latent plane), a
 * fixed FFN's gate, up and down (R, when the layer has one) and MLA's matrices (R, ST_MLA_W); the
 * head (layer == n_layer, n_layers 1) has output_norm and output (R) and writes the logits and the
 * step's routing to the mailbox, then raises head_seq. Layer 0 reads the token's embedding row,
 * position and step number from the mailbox (st_decode_mail emb, pos_seq). Each layer l but 0, and
 * the head, adds layer l - 1's expert rows to x first, waiting for the CPU pool's in the mailbox
 * when ctx->layer_cpu[l - 1]; a layer with ctx->layer_cpu[l] publishes its routing and FFN input
 * there (the flags do not change while a step's tasks are submitted: st_decode_tables_update runs
 * with none pending). */
struct st_decode_gpu_args {
  const struct st_decode_ctx *ctx;
  int32_t layer, n_layers, pos;
};
/* Submits a GPU decode task of `a` with its nbufs handles and their modes (copied). */
int st_submit_decode_gpu(const struct st_decode_gpu_args *a, size_t args_size, starpu_data_handle_t *bufs,
                         const enum starpu_data_access_mode *modes, int nbufs, struct st_target tgt, const char *name);

#ifdef __cplusplus
}
#endif

#endif
