// CUDA variant of the combine codelet: one block per token, threads over the hidden dimension,
// expert outputs added in top-k slot order exactly as combine_cpu does (plain float adds, no
// fused multiply-add), so the result is bitwise identical to the CPU variant. A decode step (one
// token) passes its table of outputs and slots by value as a kernel parameter instead of copying
// it to the device: no allocation nor copy to queue, and a graph can capture it.
#include <cuda_runtime.h>
#include <starpu.h>
#include <starpu_cuda.h>

#include <stdint.h>
#include <stdlib.h>

#include "codelets/codelets.h"
#include "codelets/cuda/cuda_codelets.h"

// Token t of the batch: its k slots (src, k entries) in order, then the residual.
template <typename Outs>
__device__ __forceinline__ void combine_token(const float *h, const Outs &outs, const st_combine_src *src, int k,
                                              int d, float *x) {
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
      const st_combine_src s = src[j];
      for (int p = 0; p < s.parts; p++) acc = __fadd_rn(acc, outs[s.buf + p][(size_t)s.row * d + i]);
    }
    x[i] = __fadd_rn(acc, h[i]);
  }
}

__global__ static void combine_kernel(const float *h, const float *const *outs,
                                      const st_combine_src *src, int k, int d, float *x) {
  const int t = blockIdx.x;
  combine_token(h + (size_t)t * d, outs, src + t * k, k, d, x + (size_t)t * d);
}

// One token's table, a kernel parameter (at most 4 KiB: 192 outputs and 32 slots fit).
#define ONE_TOKEN_OUTS 192
#define ONE_TOKEN_SLOTS 32
struct one_token_table {
  const float *outs[ONE_TOKEN_OUTS];
  st_combine_src src[ONE_TOKEN_SLOTS];
};

__global__ static void combine_one_token(const float *h, const __grid_constant__ one_token_table tab, int k, int d,
                                         float *x) {
  combine_token(h, tab.outs, tab.src, k, d, x);
}

static void combine_one_token_body(void *buffers[], const void *args, void *scratch, cudaStream_t stream) {
  const st_combine_args *a = (const st_combine_args *)args;
  one_token_table tab;
  for (int i = 0; i < a->n_out; i++) tab.outs[i] = (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + i]);
  for (int j = 0; j < a->k; j++) tab.src[j] = a->src[j];
  combine_one_token<<<1, 256, 0, stream>>>((const float *)STARPU_VECTOR_GET_PTR(buffers[0]), tab, a->k, a->n_embd,
                                           (float *)STARPU_VECTOR_GET_PTR(buffers[1 + a->n_out]));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) STARPU_CUDA_REPORT_ERROR(err);
}

extern "C" void st_combine_cuda(void *buffers[], void *cl_arg) {
  const st_combine_args *a = (const st_combine_args *)cl_arg;
  if (a->T == 1 && a->n_out <= ONE_TOKEN_OUTS && a->k <= ONE_TOKEN_SLOTS) {
    st_cuda_dense_run(buffers, a, a->graph_key, 0, 1, combine_one_token_body);
    return;
  }
  cudaStream_t stream = starpu_cuda_get_local_stream();
  const size_t ptr_bytes = sizeof(float *) * (size_t)a->n_out;
  const size_t src_bytes = sizeof(st_combine_src) * (size_t)a->T * a->k;
  // One device block holds the output-pointer table and the slot map; stream-ordered
  // allocation keeps it alive exactly as long as the kernel needs it.
  const float **host_ptrs = (const float **)malloc(ptr_bytes);
  for (int i = 0; i < a->n_out; i++) host_ptrs[i] = (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + i]);
  uint8_t *dev = NULL;
  cudaError_t err = cudaMallocAsync((void **)&dev, ptr_bytes + src_bytes, stream);
  if (err != cudaSuccess) STARPU_CUDA_REPORT_ERROR(err);
  cudaMemcpyAsync(dev, host_ptrs, ptr_bytes, cudaMemcpyHostToDevice, stream);
  cudaMemcpyAsync(dev + ptr_bytes, a->src, src_bytes, cudaMemcpyHostToDevice, stream);
  free(host_ptrs); // a copy from pageable memory is staged before cudaMemcpyAsync returns
  combine_kernel<<<a->T, 256, 0, stream>>>((const float *)STARPU_VECTOR_GET_PTR(buffers[0]),
                                           (const float *const *)dev,
                                           (const st_combine_src *)(dev + ptr_bytes), a->k,
                                           a->n_embd,
                                           (float *)STARPU_VECTOR_GET_PTR(buffers[1 + a->n_out]));
  err = cudaGetLastError();
  if (err != cudaSuccess) STARPU_CUDA_REPORT_ERROR(err);
  cudaFreeAsync(dev, stream);
}
