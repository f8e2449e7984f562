// CUDA variant of the combine codelet: one block per token, threads over the hidden dimension,
// expert outputs added in top-k slot order exactly as combine_cpu does (plain float adds, no
// fused multiply-add), so the result is bitwise identical to the CPU variant.
#include <cuda_runtime.h>
#include <starpu.h>
#include <starpu_cuda.h>

#include <stdint.h>
#include <stdlib.h>

#include "codelets/codelets.h"
#include "codelets/cuda/cuda_codelets.h"

__global__ static void combine_kernel(const float *h, const float *const *outs,
                                      const st_combine_src *src, int k, int d, float *x) {
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
      const st_combine_src s = src[t * k + j];
      for (int p = 0; p < s.parts; p++) acc = __fadd_rn(acc, outs[s.buf + p][(size_t)s.row * d + i]);
    }
    x[(size_t)t * d + i] = __fadd_rn(acc, h[(size_t)t * d + i]);
  }
}

extern "C" void st_combine_cuda(void *buffers[], void *cl_arg) {
  const st_combine_args *a = (const st_combine_args *)cl_arg;
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
