/* C interface of the CUDA variants of the codelets (one .cu file per kernel family). Each has
 * the buffers and arguments of its CPU variant (codelets.h) and queues its work on the worker's
 * local stream; the codelets are flagged STARPU_CUDA_ASYNC. */
#ifndef ST_CUDA_CODELETS_H
#define ST_CUDA_CODELETS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* a cudaStream_t, without the CUDA headers in C files */
struct st_route;    /* codelets.h */

void st_attention_cuda(void *buffers[], void *cl_arg);
void st_linear_cuda(void *buffers[], void *cl_arg);
void st_router_cuda(void *buffers[], void *cl_arg);
void st_expert_rows_cuda(void *buffers[], void *cl_arg);
void st_combine_cuda(void *buffers[], void *cl_arg);

/* Keys the decode step's short-context attention block takes for head_dim hd and es-byte KV-cache
 * elements (attention.cu rope_short): a sliding window at most this long is computed there. */
int st_cuda_attn_short_keys(int hd, int es);

/* Dequantises one row (`bytes` bytes, n elements of `type`) on the current CUDA device with the
 * kernels' own element decoder, into host memory `out` (for tests). 0, or -1 on a CUDA error. */
int st_cuda_dequantize_row(uint32_t type, const void *row, uint64_t bytes, float *out, int64_t n);

/* out[t][r] = dot(W[r], x[t]) for `rows` rows of n weights and T activation rows, all in host
 * memory, with the CUDA matrix-product kernel (for tests); int8: st_cuda_matmul's int8 (Q8_0
 * weights on quantised activations). 0, or -1 on a CUDA error. */
int st_cuda_matmul_rows(uint32_t type, const void *W, uint64_t row_bytes, int64_t rows, const float *x, int64_t T,
                        int64_t n, float *out, int int8);

/* The router's softmax and top-k (router.cu, the kernels' block-wide selection) over T rows of E
 * logits in host memory into routing [T][k], by blocks of `threads` threads (0: the router
 * codelet's 128; 256 with E <= 128: the decode step's dk_gateup, whose ranks are counted in two
 * parts) (for tests). 0, or -1 on a CUDA error. */
int st_cuda_softmax_topk_rows(const float *logits, int T, int E, int k, int threads, struct st_route *routing);

/* The same product through the prompt path's cuBLAS GEMM (gemm.cu: weights dequantised to float32,
 * CUBLAS_COMPUTE_32F_PEDANTIC, or TF32 after st_cuda_gemm_set_tf32(1)), on a cuBLAS handle of its
 * own (for tests). 0, or -1 on an error. */
int st_cuda_gemm_rows(uint32_t type, const void *W, uint64_t row_bytes, int64_t rows, const float *x, int64_t T,
                      int64_t n, float *out);

/* The prompt path's GEMMs from now on (STRATA_CUBLAS_TF32, doc/tuning.md): on = 0, float32
 * products (CUBLAS_COMPUTE_32F_PEDANTIC: the fixtures' tight float32 bound); on = 1, tensor cores
 * with both inputs rounded to TF32 (10 mantissa bits) and float32 accumulation
 * (CUBLAS_COMPUTE_32F_FAST_TF32). Process-wide; set it before the engine runs a task. */
void st_cuda_gemm_set_tf32(int on);

/* Causal attention of T tokens at positions pos0..pos0+T-1 for the nq query heads of one KV head
 * (a GQA group), in host memory: q [T][nq * hd], k and v [pos0 + T][hd], out [T][nq * hd]; token t
 * sees keys 0..pos0 + t, scores scaled by 1/sqrt(hd). kv_type: the device cache's element,
 * ST_TYPE_F32 or ST_TYPE_F16 (k and v rounded to nearest even on the way in). flash != 0: the
 * prompt path's tiled kernel (attention.cu attend_flash; only for T > 1), 0: the decode path's
 * split-K kernels. With reps > 0, then runs it reps more times and stores the mean milliseconds
 * per call in *ms (for tests). 0, or -1 on a CUDA error. */
int st_cuda_attention_rows(const float *q, const float *k, const float *v, int T, int pos0, int nq, int hd,
                           int kv_type, int flash, int reps, float *out, double *ms);

/* For tests: one decode token at position pos (Hq query heads in G KV groups of hd, a cache of kv_type
 * holding pos keys of random values) through the decode step's attention (st_cuda_rope_append with
 * its output, then st_cuda_attend_decode_all after_short, the launches of the position's regime) and
 * through the attention codelet's T = 1 kernels (st_cuda_rope_append without, then the split-K or
 * short-context kernels per KV group), each on its own copy of the caches, from the same random q,
 * K and V rows and norm weights (seed). A q8_0 cache (kv_type ST_TYPE_Q8_0; hd a multiple of 32): its
 * new rows must also equal the float32 cache's rows of the same launch, quantised on the device. hd a
 * multiple of 32: the decode step's launches also quantise their output (the output projection's
 * int8 input), which must equal the codelet's output quantised in one launch (st_cuda_matmul's bits).
 * *same: 1 when the outputs, the quantised outputs and both caches (every row) agree bit for bit. 0,
 * or -1 on a CUDA error. */
int st_cuda_decode_attention_check(int Hq, int G, int hd, int kv_type, int pos, uint32_t seed, int *same);

/* For tests: rows x hd floats x quantised on the device into q8_0 KV rows (out: rows x hd / 32 x 34
 * bytes), as the CUDA codelets store new K and V rows; hd a multiple of 32. 0, or -1 on a CUDA error. */
int st_cuda_kv_q8_store_rows(const float *x, int64_t rows, int hd, uint8_t *out);

/* Seconds per mat-vec (one token) over `rows` rows of n weights of `type` on the current device,
 * averaged over `reps` launches after a warm-up (for strata bench --kernels); < 0 on a CUDA error. */
double st_cuda_matvec_seconds(uint32_t type, uint64_t row_bytes, int64_t rows, int64_t n, int reps);

/* CUDA devices the runtime sees (0 without a driver or a device); callable before StarPU starts. */
int st_cuda_device_count(void);

/* MiB in use on CUDA device `device` as the driver counts it (total - free, every process's;
 * what nvidia-smi shows), or -1 on an error. */
double st_cuda_device_used_mib(int device);

/* Whether CUDA devices a and b really exchange data over P2P: peer access both ways, and a test
 * copy each way that arrives intact (devices.cu; the seeds' peer tier, #2666). Returns 1, or 0
 * with the reason in why[len]. Call before StarPU starts; leaves peer access disabled. */
int st_cuda_p2p_check(int a, int b, char *why, size_t len);

/* Registers (pins) the host range [p, p + n) with CUDA for every device (cudaHostRegister,
 * portable): 1, or 0 with CUDA's reason in why[len]. st_cuda_host_unregister undoes it. Used by
 * the host expert arena (tiers/arena.c) after StarPU has started. */
int st_cuda_host_register(void *p, size_t n, char *why, size_t len);
void st_cuda_host_unregister(void *p);

/* Allocates n bytes of pinned host memory mapped into the address space of CUDA device `device`
 * (cudaHostAlloc, portable and mapped), its device address in *dev_addr: the decode step's mailbox
 * (graph/decode_bufs.c). Returns the host address, or NULL with CUDA's reason in why[len]. Freed
 * by st_cuda_host_free_mapped. */
void *st_cuda_host_alloc_mapped(size_t n, int device, uintptr_t *dev_addr, char *why, size_t len);
void st_cuda_host_free_mapped(void *p);

/* ---- graph.cu: CUDA Graphs for the dense codelets on the decode path ----------------------
 * A graph key (> 0) names one task site of a step (a layer's attention, attention output,
 * router or combine; the output head), st_*_args.graph_key. The executable graphs are cached per
 * CUDA device and key; each call captures its kernels again (pointers and pos0 change from step
 * to step), updates the cached graph in place (cudaGraphExecUpdate), or re-instantiates it when
 * the update is refused, and launches it. Replay runs the same kernels with the same arguments
 * as plain launches, so results are bitwise identical with graphs on and off. */

/* Starts a capture of `stream` (cudaStreamCaptureModeThreadLocal). 0, or -1 after a CUDA error
 * (reported once on stderr; the caller then launches plainly). */
int st_cuda_graph_begin(struct CUstream_st *stream, int key);
/* Ends the capture, updates or instantiates the executable graph of `key` on the current device
 * and launches it on `stream`. 0 when the work is queued; -1 after a CUDA error, when nothing of
 * the capture ran and the caller must launch the same work plainly. */
int st_cuda_graph_end(struct CUstream_st *stream, int key);
/* At least `bytes` of device scratch owned by `key` on the current device, kept across calls
 * (graphs then see the same pointer); grown stream-ordered on `stream`. Call it before
 * st_cuda_graph_begin. NULL after a CUDA error. */
void *st_cuda_graph_scratch(struct CUstream_st *stream, int key, size_t bytes);

/* The decode step's graphs (decode.cu), captured once and replayed: when the executable graph of
 * `key` on the current device was captured with signature `sig` (a hash of everything its kernels'
 * arguments were made of: buffer addresses, grid sizes), launches it on `stream`; else captures
 * body(args, stream), updates or instantiates the graph, records sig and launches it. 0, or -1 when
 * the work ran as plain launches after a CUDA error (reported once). */
int st_cuda_graph_replay(struct CUstream_st *stream, int key, uint64_t sig, void (*body)(const void *, struct CUstream_st *),
                         const void *args);

/* The decode step's codelets count their calls and host time with the dense codelets'
 * (st_cuda_graph_stats dense_calls, dense_host_s): a call that started at st_cuda_now_ns() t0. */
void st_cuda_decode_host_time(double t0_ns);
double st_cuda_now_ns(void);

/* Per CUDA worker, through starpu_execute_on_each_worker before StarPU shuts down: destroys the
 * graphs and frees the scratch cached for the worker's device (StarPU resets the devices at
 * shutdown, and a later engine in the same process must not find stale handles). */
void st_cuda_graph_release(void *unused);

/* The kernels of one dense codelet call, queued on `stream`, using `scratch` (device memory of
 * the size the codelet asked for; NULL when it asked for none). */
typedef void (*st_cuda_dense_body)(void *buffers[], const void *args, void *scratch, struct CUstream_st *stream);
/* Runs `body` on the worker's local stream: captured and replayed as graph `key` when key > 0,
 * plain launches when key == 0 or the graph path fails. `decode` != 0 counts the call and its
 * host time in st_cuda_graph_stats (decode-path calls, with or without graphs). */
void st_cuda_dense_run(void *buffers[], const void *args, int key, size_t scratch_bytes, int decode,
                       st_cuda_dense_body body);

/* Counters since the process started, over every CUDA device. */
struct st_cuda_graph_stats {
  uint64_t captures;         /* stream captures that ended with a graph */
  uint64_t updates;          /* cached executable graphs updated in place */
  uint64_t instantiations;   /* first executable graph of a (device, key) */
  uint64_t reinstantiations; /* update refused: destroyed and instantiated again */
  uint64_t launches;         /* cudaGraphLaunch */
  uint64_t fallbacks;        /* calls that fell back to plain launches after a CUDA error */
  uint64_t dense_calls;      /* decode-path calls of the dense CUDA codelets (graphs on or off) */
  double dense_host_s;       /* host time inside those calls, s */
};
void st_cuda_graph_stats(struct st_cuda_graph_stats *out);

/* Floats of the decode attention's partials for contexts of up to n_ctx keys and n_heads query
 * heads of hd dimensions (the decode step's device buffers, graph/decode_bufs.c). */
size_t st_cuda_decode_part_floats(int n_ctx, int n_heads, int hd);

/* Floats of the MLA decode attention's partials (cuda/mla.cuh) for n_ctx keys, n_heads heads and a
 * latent of kv_lora values. */
size_t st_cuda_mla_part_floats(int n_ctx, int n_heads, int kv_lora);

/* For tests: MLA's decode attention (cuda/mla.cuh) on the current device for one token at position
 * pos, float32 in and out: q [n_head][qk_nope + n_rot] (q_b's output), kvnew [kv_lora + n_rot]
 * (kv_a_mqa's), kv_norm [kv_lora], eps, rows [pos][kv_lora + n_rot] (the earlier cache rows, stored as
 * kv_type, ST_TYPE_F32 or ST_TYPE_F16), cs [n_rot] (the position's RoPE (cos, sin) pairs), k_b
 * [n_head kv_lora][qk_nope], v_b [n_head hv][kv_lora] (as F32 weights), the scores' scale. Out: attn
 * [n_head][hv] and row [kv_lora + n_rot] (the token's cache row as stored, read back as floats).
 * Returns 0, or -1 on a CUDA error. */
int st_cuda_mla_check(int n_head, int qk_nope, int n_rot, int kv_lora, int hv, int pos, int kv_type, const float *q,
                      const float *kvnew, const float *kv_norm, float eps, const float *rows, const float *cs,
                      const float *k_b, const float *v_b, float scale, float *attn, float *row);

/* Whether the mat-vec kernels of mmv.cuh (and so the decode step's GPU kernels) take rows of n
 * weights of `type`, row_bytes apart: a type they specialise on, whole blocks, aligned rows, and
 * staging buffers that fit the current device's shared memory. */
int st_cuda_mmv_takes(uint32_t type, uint64_t row_bytes, int64_t n);

/* Per CUDA worker set-up, run once through starpu_execute_on_each_worker (matmul.cu): the memory
 * pool keeps what it frees, and the split-K attention kernels may take the device's shared memory. */
void st_cuda_worker_init(void *unused);

#ifdef __cplusplus
}
#endif

#endif
