// CUDA variant of the router codelet (codelets.h): residual, ffn_norm, router logits (through
// cuBLAS for batches of at least cublas_rows tokens, gemm.cu), softmax,
// top-k (ties to the lower expert id) and renormalised weights, a block per token for the
// selection.
#include <math.h>

#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"

// h[t][s * piece + j] = x[t][s * piece + j] + xo_s[t][j]
__global__ static void residual_piece(const float *x, const float *xo, int64_t d, int64_t piece, int s, int T, float *h) {
  const int64_t n = (int64_t)T * piece;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / piece, j = i % piece, at = t * d + s * piece + j;
    h[at] = x[at] + xo[i];
  }
}

// One block per token (st_dev_softmax_topk_block, common.cuh: the decode step's router runs it too).
__global__ static void softmax_topk(const float *logits, int E, int k, st_route *routing) {
  const int t = blockIdx.x;
  st_dev_softmax_topk_block(logits + (int64_t)t * E, E, k, routing + (int64_t)t * k);
}

void st_cuda_softmax_topk(const float *logits, int T, int E, int k, st_route *routing, cudaStream_t st) {
  if (T > 0) softmax_topk<<<T, 128, 0, st>>>(logits, E, k, routing);
}

// For tests (cuda_codelets.h): st_cuda_softmax_topk on host data.
extern "C" int st_cuda_softmax_topk_rows(const float *logits, int T, int E, int k, int threads, st_route *routing) {
  float *dl = NULL;
  st_route *dr = NULL;
  int rc = -1;
  if (cudaMalloc(&dl, sizeof(float) * (size_t)T * E) == cudaSuccess &&
      cudaMalloc(&dr, sizeof(st_route) * (size_t)T * k) == cudaSuccess) {
    cudaMemcpy(dl, logits, sizeof(float) * (size_t)T * E, cudaMemcpyHostToDevice);
    if (threads > 0) softmax_topk<<<T, threads>>>(dl, E, k, dr);
    else st_cuda_softmax_topk(dl, T, E, k, dr, 0);
    rc = cudaMemcpy(routing, dr, sizeof(st_route) * (size_t)T * k, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
  }
  cudaFree(dl);
  cudaFree(dr);
  return rc;
}

static void router_body(void *buffers[], const void *args, void *scratch, cudaStream_t st) {
  const st_router_args *a = (const st_router_args *)args;
  const int T = a->T, d = a->n_embd, E = a->n_expert, piece = d / a->n_xo;
  const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
  const float *ffn_norm = (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + a->n_xo]);
  const void *rw = (const void *)STARPU_VECTOR_GET_PTR(buffers[2 + a->n_xo]);
  float *h = (float *)STARPU_VECTOR_GET_PTR(buffers[3 + a->n_xo]);
  float *ffn_in = (float *)STARPU_VECTOR_GET_PTR(buffers[4 + a->n_xo]);
  st_route *routing = (st_route *)STARPU_VECTOR_GET_PTR(buffers[5 + a->n_xo]);
  for (int s = 0; s < a->n_xo; s++) {
    const float *xo = (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + s]);
    const int64_t n = (int64_t)T * piece;
    residual_piece<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(x, xo, d, piece, s, T, h);
  }
  st_cuda_rmsnorm(h, ffn_norm, ffn_in, T, d, a->eps, st);
  float *logits = (float *)scratch;
  st_cuda_product(st_cuda_cublas_handle(T, a->cublas_rows), a->w.type, rw, a->w.row_bytes, 0, E, ffn_in, d, T, d,
                  logits, E, st, 0);
  st_cuda_softmax_topk(logits, T, E, a->k, routing, st);
  ST_CUDA_CHECK(cudaGetLastError());
}

extern "C" void st_router_cuda(void *buffers[], void *cl_arg) {
  const st_router_args *a = (const st_router_args *)cl_arg;
  const int decode = a->T == 1;
  st_cuda_dense_run(buffers, a, decode ? a->graph_key : 0, sizeof(float) * (size_t)a->T * a->n_expert, decode,
                    router_body);
}
