/* StarPU codelets of one qwen3moe layer and the output head, and the wrappers that submit them.
 * One kernel family per file (STYLE.md): attention.c, linear.c, router.c, expert_rows.c,
 * combine.c; CUDA variants live in cuda/. Every buffer is a StarPU vector handle: activations
 * are float32 row-major [rows][width]; weights are the raw bytes of a GGUF tensor (or of one
 * expert's slice of it), read-only. Codelets know nothing of caches or tiers: the caller passes
 * a target (a fixed worker, or the kinds of worker allowed), which the tiers decide. Every
 * codelet has a CPU and a CUDA variant (in cuda/) computing the same float32 result; the two
 * differ only in summation order.
 *
 * graph_key (attention, linear, router, combine): 0, or a key > 0 naming the task's site in the
 * step (a layer's attention, ...; engine.c): a decode-path task (T == 1) that runs on a GPU is
 * then captured and replayed as a CUDA graph cached under that key (cuda/graph.cu). The CPU
 * variants ignore it; results are the same either way.
 *
 * cublas_rows (attention, linear, router, expert_rows): 0, or the number of token rows from which
 * a CUDA variant computes its matrix products through cuBLAS (dequantised weights, float32 GEMM;
 * cuda/gemm.cu) instead of the float32 kernels; for expert_rows the count is per expert. The
 * engine sets it from STRATA_CUBLAS (doc/tuning.md); decode batches stay below it. The CPU
 * variants ignore it; cuBLAS and the kernels differ only in summation order. */
#ifndef ST_CODELETS_H
#define ST_CODELETS_H

#include <starpu.h>
#include <stdint.h>

#ifdef __cplusplus
#define ST_ALIGNAS8 alignas(8)
extern "C" {
#else
#define ST_ALIGNAS8 _Alignas(8)
#endif

/* Where a task may run: on `worker` when >= 0, else on any worker of the kinds in `where`
 * (STARPU_CPU, STARPU_CUDA or both); `done`, when set, runs as the task's StarPU callback with a
 * struct st_task_done (the run recorder uses it). `order` (> 0, with a worker): the task's
 * starpu_task::workerorder, so that the worker runs its ordered tasks in that order, 1, 2, ...
 * (the decode step's GPU tasks, queued on one stream). */
struct st_target {
  int32_t where;
  int worker;
  void (*done)(void *arg);
  void *done_arg;
  unsigned order;
};

/* What a task's completion callback receives: the target's done_arg and the bytes of the
 * task's buffers, counted at submission (a callback must not touch the handles: StarPU has
 * released them, and an asynchronous unregistration may have freed them). Freed by StarPU. */
struct st_task_done {
  void *arg;
  uint64_t bytes;
};

/* How a weight buffer is laid out: rows of `n` elements of `type`, `row_bytes` apart. */
struct st_wdesc {
  uint32_t type;
  uint64_t row_bytes;
  int64_t n;
};

/* ---- attention.c: KV heads (GQA groups) group0 .. group0 + n_groups - 1 ----------------------
 * Buffers: x [T][n_embd] R, attn_norm f32 R, wq R, wk R, wv R, q_norm f32 R, k_norm f32 R, then
 * per group k_cache [n_ctx][head_dim] RW and v_cache [n_ctx][head_dim] RW, then per group
 * out [T][n_q * head_dim] W. The CPU pool takes one group per task (parallelism); a GPU takes
 * them all in one task. Computes, for each group's n_q query heads and its KV head: RMSNorm, Q/K/V projections,
 * q/k RMSNorm, NEOX RoPE at positions pos0..pos0+T-1, the KV-cache write and causal softmax
 * attention over positions 0..pos. */
struct st_attention_args {
  int32_t T, pos0, n_ctx, n_embd, head_dim, n_q, group0, n_groups, graph_key, cublas_rows;
  int32_t int8_dot; /* 1 (STRATA_INT8_DOT): the CPU variant's Q product on int8 activations
                     * (st_dense_matmul; K and V keep float32); CUDA's for a one-token task with
                     * Q8_0 weights (one int8 term, as the decode step's Q) */
  int32_t kv_type;  /* the KV cache's element: ST_TYPE_F32, ST_TYPE_F16 (the new rows computed in
                     * float32, rounded to nearest even into the cache; attention reads them back
                     * to float32) or ST_TYPE_Q8_0 (a row's int8 quants then its fp16 scales, each
                     * 32 quantised as st_quantize_row_q8_0; layer_cpu.h st_kv_row_bytes) */
  int32_t flash_mma; /* STRATA_FLASH_MMA: a prompt chunk's attention over a half cache on the tensor
                      * cores where the GPU and head_dim allow (attention.cu's fm_ok) */
  float eps, rope_theta;
  struct st_wdesc wq, wk, wv;
};
int st_submit_attention(const struct st_attention_args *a, starpu_data_handle_t *bufs,
                        struct st_target tgt, const char *name);

/* ---- linear.c: y = W[r0..r1) · concat(inputs), optionally RMS-normed first ------------------
 * Buffers: W R, [norm f32 R when has_norm], n_in inputs [T_in][n / n_in] R, out [T][r1 - r0] W.
 * Inputs are concatenated along the row (their widths are equal); rows in_row0..in_row0+T-1
 * of the inputs are used (the output head takes only the last position). Used for the
 * attention output projection (inputs: the per-group attention outputs) and the output head. */
struct st_linear_args {
  int32_t T, in_row0, n_in, has_norm, graph_key, cublas_rows;
  int32_t int8_dot;   /* STRATA_INT8_DOT: the CPU variant's product as st_dense_terms says */
  int32_t dense_kind; /* st_dense_terms's kind: ST_DENSE_QO (the attention output) or ST_DENSE_HEAD */
  int64_t r0, r1;
  float eps;
  struct st_wdesc w;
};
int st_submit_linear(const struct st_linear_args *a, starpu_data_handle_t *bufs, int nbufs,
                     struct st_target tgt, const char *name);

/* ---- router.c: residual, ffn_norm, routing -------------------------------------------------
 * Buffers: x [T][n_embd] R, n_xo attention-output slices [T][n_embd / n_xo] R, ffn_norm f32 R,
 * router W [n_expert][n_embd] R, h [T][n_embd] W, ffn_in [T][n_embd] W,
 * routing W (struct st_route [T][k], best expert first).
 * h = x + concat(xo); ffn_in = RMSNorm(h) * ffn_norm; softmax over the router logits, top-k
 * (ties to the lower expert id), weights renormalised to sum to 1 (qwen3moe always does). */
struct st_route {
  int32_t expert;
  float weight; /* renormalised over the token's k experts */
};
struct st_router_args {
  int32_t T, n_embd, n_expert, k, n_xo, graph_key, cublas_rows;
  float eps;
  struct st_wdesc w;
};
int st_submit_router(const struct st_router_args *a, starpu_data_handle_t *bufs, int nbufs,
                     struct st_target tgt, const char *name);

/* ---- expert_rows.c: the rows of a group of expert pairs of one layer -------------------------
 * Buffers: ffn_in [T][n_embd] R; for each of the n_experts experts: gate [n_ff][n_embd] R,
 * up [n_ff][n_embd] R, down [n_embd][n_ff] R; out W.
 * row_i = w_i * down(silu(gate(x_ti)) * up(x_ti)) for the listed (token, weight) rows, over the
 * FFN slice [ff0, ff1) of each expert (a partial sum when the slice is not the whole FFN: the
 * CPU pool splits a big expert this way so several workers share one token's expert); expert g
 * owns rows [group[g].row0, group[g].row0 + group[g].n_rows). The CPU pool submits one expert (or
 * a slice of its rows) per task; a GPU cache submits every cached expert of a layer in one task
 * (a grouped kernel per matrix: a kernel per expert would be far too small for a task).
 * out is [n_rows][n_embd] (out[i] = row_i, the packed rows) when n_out_rows == 0; otherwise it is
 * [n_out_rows][n_embd] and out[o] is the sum, in the listed order, of the rows
 * red_idx[red_off[o] .. red_off[o + 1]) (--remote-expert-opt: one weighted partial sum per token
 * on the helper's own GPU, the seeds' "helper decode optimization"). */
struct st_expert_row {
  int32_t token;
  float weight;
};
struct st_expert_group {
  int32_t expert, row0, n_rows;
};
struct st_expert_rows_args {
  int32_t n_experts, n_rows, n_embd, n_ff, layer;
  int32_t ff0, ff1; /* the FFN slice this task computes, 0 <= ff0 < ff1 <= n_ff */
  int32_t n_out_rows; /* 0: packed rows; > 0: partial sums (see above) */
  int32_t cublas_rows; /* an expert with at least this many rows goes through cuBLAS (0: never) */
  int32_t int8_dot;    /* 1 = quantised activations (STRATA_INT8_DOT): on the CPU the integer kernels
                        * (st_matmul_q8) for the matrices whose type has them, on a GPU the Q8_0
                        * kernels of st_cuda_grouped_matmul (outside cuBLAS); 0 = float32 */
  int32_t mmq;         /* 1 (STRATA_MMQ, with int8_dot and cublas_rows > 0): on a GPU, Q8_0 experts of
                        * at least ST_MMQ_MIN_ROWS rows on the tensor-core kernels (mmq.cuh) */
  struct st_wdesc gate, up, down;
  /* followed by n_experts struct st_expert_group, then n_rows struct st_expert_row, then, when
   * n_out_rows > 0, red_off [n_out_rows + 1] and red_idx [n_rows] (int32) */
  ST_ALIGNAS8 unsigned char tail[];
};
static inline size_t st_expert_rows_args_size(int n_experts, int n_rows, int n_out_rows) {
  return sizeof(struct st_expert_rows_args) + sizeof(struct st_expert_group) * (size_t)n_experts +
         sizeof(struct st_expert_row) * (size_t)n_rows +
         (n_out_rows > 0 ? sizeof(int32_t) * ((size_t)n_out_rows + 1 + (size_t)n_rows) : 0);
}
static inline struct st_expert_group *st_expert_groups(const struct st_expert_rows_args *a) {
  return (struct st_expert_group *)(void *)a->tail;
}
static inline struct st_expert_row *st_expert_rows(const struct st_expert_rows_args *a) {
  return (struct st_expert_row *)(void *)(a->tail + sizeof(struct st_expert_group) * (size_t)a->n_experts);
}
/* red_off [n_out_rows + 1], then red_idx [n_rows]; meaningful only when n_out_rows > 0. */
static inline int32_t *st_expert_reduce(const struct st_expert_rows_args *a) {
  return (int32_t *)(void *)(st_expert_rows(a) + a->n_rows);
}
/* `bufs` has 2 + 3 * n_experts handles in the order above; `a` is copied. */
int st_submit_expert_rows(const struct st_expert_rows_args *a, starpu_data_handle_t *bufs,
                          struct st_target tgt, const char *name);

/* ---- combine.c: fixed-order sum of the experts' weighted outputs, then the residual ---------
 * Buffers: h [T][n_embd] R, n_out expert outputs R, x [T][n_embd] W.
 * x[t] = h[t] + sum over slots j = 0..k-1, in that order, of the sum over its parts p (FFN
 * slices, in order) of out[src[t][j].buf + p][src[t][j].row]. */
struct st_combine_src {
  int32_t buf, row, parts;
};
struct st_combine_args {
  int32_t T, k, n_embd, n_out, graph_key;
  struct st_combine_src src[]; /* T * k entries */
};
int st_submit_combine(const struct st_combine_args *a, starpu_data_handle_t *bufs, int nbufs,
                      struct st_target tgt, const char *name);

/* Shared by the wrappers: creates and submits a task with `nbufs` handles and modes, a copy of
 * `args` (args_size bytes) as cl_arg, `name` (not copied: must outlive the task) and its
 * target. Returns 0 or ST_ERUNTIME. */
int st_submit_task(struct starpu_codelet *cl, starpu_data_handle_t *bufs,
                   const enum starpu_data_access_mode *modes, int nbufs, const void *args,
                   size_t args_size, struct st_target tgt, const char *name);

#ifdef __cplusplus
}
#endif

#endif
