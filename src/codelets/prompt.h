/* The prompt lanes (DESIGN.md, "The CPU pool in parallel"): with no GPU, a prompt chunk of T
 * tokens runs through every layer and the output head as one group of lane tasks per layer, one
 * per CPU worker, that take work items in a fixed order from two counters (st_lane_sync, as the
 * decode lanes of decode.h do for one token). A layer's phases and their items:
 *
 *   NORM      token tiles (layer 0): xn = RMSNorm(x), the chunk's RoPE table, xn quantised for wq
 *   QKV       row blocks of wq | wk | wv over all T tokens (and their biases): q, and the new K
 *             and V rows (MLA: of q_a or wq, and kv_a_mqa)
 *   MLANORM   MLA, token tiles: the q LoRA's norm; the latent's norm, the key part's RoPE, cached
 *   QB        MLA with a q LoRA: row blocks of q_b
 *   ROPE      per query head, then per KV head, over all T: q/k RMSNorm and RoPE; K and V stored
 *             into the cache at pos0.. (MLA: per head, RoPE and absorption of the query)
 *   ATTN      (KV group, token tile), the last tiles first: causal softmax attention
 *   QATTN     token tiles (int8 and Q8_0 wo only): attn quantised for wo
 *   OPROJ     row blocks of wo over all T
 *   ROUTE     token tiles: h = x + xo, ffn_in = RMSNorm(h), the router's logits, softmax,
 *             top-k, renormalised weights
 *   SORT      1 item: the chunk's (token, slot) entries sorted by expert, in token order, and
 *             the experts by their row count (the expert items take the largest first)
 *   QX        token tiles: each token's FFN input (quantised for gate and up, or float32) copied
 *             to its k sorted rows
 *   GATEUP    (expert, rows of gate and up): act = silu(gate x) * up x over the expert's rows (with
 *             the expert's biases, or gpt-oss's clamped SwiGLU); then row blocks of the fixed FFN
 *             (a shared expert or a leading dense layer's FFN) over all T
 *   QA        row tiles (int8 down in super-blocks of 256 only): act quantised for down
 *   DOWN      (expert, rows of down): eout = weight * down act; then the fixed FFN's down rows
 *   COMBINE   token tiles: x = h + the token's k rows added in slot order (then the fixed FFN's);
 *             xn = the next norm
 *   HEAD      row blocks of the output head over the tokens whose logits are wanted
 *
 * Every output element is computed by one item with the kernels the per-task path's codelets use
 * (dot.h, layer_cpu.h), and those give a (weight row, token) pair the same bits whatever rows and
 * tokens a call covers: a chunk through the lanes gives the per-task path's bits, whatever
 * STARPU_NCPU or the scheduler (tests/test_sched.sh). An expert's items cover all of its rows at
 * once: one matrix product per expert and row block, not per token. */
#ifndef ST_PROMPT_H
#define ST_PROMPT_H

#include <stdint.h>

#include "codelets/decode.h"

#ifdef __cplusplus
extern "C" {
#endif

enum st_prompt_kind {
  ST_PP_NORM,
  ST_PP_QKV,
  ST_PP_MLANORM, /* MLA, token tiles: the q LoRA's norm; the latent's norm and the key part's RoPE, cached */
  ST_PP_QB,      /* MLA with a q LoRA: row blocks of q_b over all T */
  ST_PP_ROPE,
  ST_PP_ATTN,
  ST_PP_QATTN,
  ST_PP_OPROJ,
  ST_PP_ROUTE,
  ST_PP_SORT,
  ST_PP_QX,
  ST_PP_GATEUP,
  ST_PP_QA,
  ST_PP_DOWN,
  ST_PP_COMBINE,
  ST_PP_HEAD,
  ST_PP_KINDS
};

/* Everything the prompt lanes read and write, built once per engine (graph/prompt.c) for chunks
 * of up to `cap` tokens. Rows are float32 unless said. The model's shape, weights, KV cache and
 * experts come from the decode step's context `dc` (the same engine's). */
struct st_prompt_ctx {
  const struct st_decode_ctx *dc;
  int cap;                 /* tokens a chunk may have */
  /* the chunk (set before submission) */
  int T, pos0;             /* tokens, position of the first */
  int out_row0, n_out;     /* the head's tokens: rows out_row0 .. + n_out of the chunk (n_out 0: no head) */
  /* buffers */
  float *x, *h, *xn, *xo, *ffn_in; /* [cap][n_embd] */
  uint8_t *xnq;                    /* [cap][int8 row of n_embd]: xn quantised (st_lane_xn_act's layout) */
  uint8_t *xnr;                    /* [cap][int8 row of n_embd]: xn's second term */
  float *q;                        /* [n_head_kv][cap][n_q * head_dim]: a group's heads, token after token */
  float *kvnew;                    /* [2][n_head_kv][cap][head_dim]: the new K rows, then V rows */
  float *attn;                     /* [cap][n_head * head_dim] */
  uint8_t *attnq, *attnr;          /* [cap][int8 row of n_head * head_dim] (wo's layout): attn's terms */
  float *rope;                     /* [cap][head_dim]: each token's RoPE (cos, sin) pairs (n_rot of them) */
  float *qa;                       /* MLA: [cap][q_lora] the q LoRA's output */
  uint8_t *qaq;                    /* MLA: [cap][q8_0 row of q_lora] qa normed, quantised for q_b */
  float *qm;                       /* MLA: [cap][n_head][head_dim] the absorbed queries */
  float *actf, *eoutf;             /* the fixed FFN (shared expert or dense FFN): [cap][its n_ff], [cap][n_embd] */
  uint8_t *xfq, *afq;              /* its quantised input and act rows ([cap][fq_x], [cap][fq_a]: st_fixed_q8) */
  float *rlogits;                  /* [cap][n_expert] */
  struct st_route *route;          /* [n_layer][cap][k]: the chunk's routing */
  int32_t *grp;                    /* [n_expert + 1]: expert e's sorted rows are grp[e] .. grp[e + 1] */
  int32_t *row_tok;                /* [cap * k]: each sorted row's token */
  float *row_w;                    /* [cap * k]: its routing weight */
  int32_t *row_of;                 /* [cap * k]: entry t * k + j -> its sorted row */
  int32_t *eorder;                 /* [n_expert]: the experts by rows, most first (ties by id) */
  /* the FFN input of each sorted row: quantised for gate (xsg), for up where its layout differs
   * (xsu), in float32 where a matrix takes float32 activations (xsf [cap * k][n_embd]); a layer's
   * rows are st_q8_row_bytes(type, n_embd) apart, as st_matmul_q8 reads them; NULL if no layer
   * needs them */
  uint8_t *xsg, *xsu;
  float *xsf;
  float *act;                      /* [cap * k][n_ff] */
  uint8_t *aq;                     /* [cap * k][st_q8_row_bytes(down, n_ff)]: act quantised for down */
  float *eout;                     /* [cap * k][n_embd]: each sorted row's weighted expert output */
  float *logits;                   /* [n_out][n_vocab] */
  float *scratch;                  /* per StarPU worker: scratch_floats each */
  int64_t scratch_floats;
  int tile, tile_attn;             /* tokens per token-tile item, per attention item */
  int rows_qkv, rows_o, rows_gateup, rows_down, rows_head, rows_qa; /* weight rows (QA: act rows) per item */
  /* the chunk's plan (st_prompt_plan) */
  int n_phases;
  int64_t *phase_start;            /* [n_phases + 1] */
  int16_t *phase_kind, *phase_layer;
  int64_t *layer_end;              /* [n_layer + 1]: first item after layer l (n_layer: the head) */
  struct st_lane_sync *sync;       /* [1] */
};

/* Builds the plan of a chunk of p->T tokens (p->n_out > 0: with the head) into the plan arrays,
 * which st_prompt_alloc_plan sized. The counts depend on T, never on the routing. */
void st_prompt_plan(struct st_prompt_ctx *p);

/* Allocates the plan arrays for any chunk (0 or ST_ENOMEM); st_prompt_free_plan frees them. */
int st_prompt_alloc_plan(struct st_prompt_ctx *p);
void st_prompt_free_plan(struct st_prompt_ctx *p);

/* One lane task of the chunk: runs items up to layer_end[layer] (no buffers: the context is the
 * engine's, and nothing else runs during a chunk). */
struct st_prompt_lane_args {
  const struct st_prompt_ctx *ctx;
  int32_t layer;
};
int st_submit_prompt_lane(const struct st_prompt_lane_args *a, struct st_target tgt, const char *name);

#ifdef __cplusplus
}
#endif

#endif
