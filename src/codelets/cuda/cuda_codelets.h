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

void st_attention_cuda(void *buffers[], void *cl_arg);
void st_linear_cuda(void *buffers[], void *cl_arg);
void st_router_cuda(void *buffers[], void *cl_arg);
void st_expert_rows_cuda(void *buffers[], void *cl_arg);
void st_combine_cuda(void *buffers[], void *cl_arg);

/* Dequantises one row (`bytes` bytes, n elements of `type`) on the current CUDA device with the
 * kernels' own element decoder, into host memory `out` (for tests). 0, or -1 on a CUDA error. */
int st_cuda_dequantize_row(uint32_t type, const void *row, uint64_t bytes, float *out, int64_t n);

/* out[t][r] = dot(W[r], x[t]) for `rows` rows of n weights and T activation rows, all in host
 * memory, with the CUDA matrix-product kernel (for tests). 0, or -1 on a CUDA error. */
int st_cuda_matmul_rows(uint32_t type, const void *W, uint64_t row_bytes, int64_t rows, const float *x, int64_t T,
                        int64_t n, float *out);

/* Seconds per mat-vec (one token) over `rows` rows of n weights of `type` on the current device,
 * averaged over `reps` launches after a warm-up (for strata bench --kernels); < 0 on a CUDA error. */
double st_cuda_matvec_seconds(uint32_t type, uint64_t row_bytes, int64_t rows, int64_t n, int reps);

/* CUDA devices the runtime sees (0 without a driver or a device); callable before StarPU starts. */
int st_cuda_device_count(void);

/* Whether CUDA devices a and b really exchange data over P2P: peer access both ways, and a test
 * copy each way that arrives intact (devices.cu; the seeds' peer tier, #2666). Returns 1, or 0
 * with the reason in why[len]. Call before StarPU starts; leaves peer access disabled. */
int st_cuda_p2p_check(int a, int b, char *why, size_t len);

/* Per CUDA worker set-up, run once through starpu_execute_on_each_worker (matmul.cu). */
void st_cuda_worker_init(void *unused);

#ifdef __cplusplus
}
#endif

#endif
