// Shared device code of the CUDA variants: weight dequantisation (F32, F16, BF16, Q8_0 as in
// quant.h), warp and block reductions, the float32 matrix products every codelet uses, RMSNorm,
// and stream-ordered scratch memory. All products accumulate in float32.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <starpu.h>
#include <starpu_cuda.h>
#include <stdint.h>

#include "codelets/codelets.h"
#include "codelets/quant.h"

#define ST_CUDA_CHECK(call)                                   \
  do {                                                        \
    cudaError_t st_err_ = (call);                             \
    if (st_err_ != cudaSuccess) STARPU_CUDA_REPORT_ERROR(st_err_); \
  } while (0)

__device__ __forceinline__ float st_dev_half(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float st_dev_bf16(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

// Element i of a weight row of `type`.
__device__ __forceinline__ float st_dev_weight(uint32_t type, const uint8_t *row, int64_t i) {
  switch (type) {
  case ST_TYPE_F32: return ((const float *)row)[i];
  case ST_TYPE_F16: return st_dev_half(((const uint16_t *)row)[i]);
  case ST_TYPE_BF16: return st_dev_bf16(((const uint16_t *)row)[i]);
  default: {
    const uint8_t *b = row + (i / 32) * 34;
    const uint16_t d = (uint16_t)(b[0] | (b[1] << 8));
    return st_dev_half(d) * (float)(int8_t)b[2 + i % 32];
  }
  }
}

__device__ __forceinline__ float st_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float st_block_sum(float v, float *shared32) {
  v = st_warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += shared32[w];
  return s;
}

__device__ __forceinline__ float st_block_max(float v, float *shared32) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < (int)(blockDim.x >> 5); w++) m = fmaxf(m, shared32[w]);
  return m;
}

// out[t * ldo + (r - r0)] = dot(W[r], x[t * ldx .. + n]) for r in [r0, r1), t in [0, T): the CUDA
// counterpart of st_matmul (dot.h), queued on `stream`.
void st_cuda_matmul(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1,
                    const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo,
                    cudaStream_t stream);

// One matrix product per group g (an expert): rows [0, n_out) of W_g times the group's
// activation rows x[row0_g .. row0_g + n_rows_g) into the same rows of out; `scale` (per
// activation row, may be NULL) multiplies each result. The descriptors live in device memory.
struct st_cuda_group {
  const uint8_t *W;
  int32_t row0, n_rows;
};
void st_cuda_grouped_matmul(uint32_t type, uint64_t row_bytes, const st_cuda_group *groups_dev,
                            int n_groups, int max_rows, int64_t n_out, const float *x, int64_t n,
                            const float *scale, float *out, cudaStream_t stream);

// y[t] = RMSNorm(x[t]) * w for T rows of n (w may be NULL); y may alias x.
void st_cuda_rmsnorm(const float *x, const float *w, float *y, int T, int n, float eps, cudaStream_t stream);

// Once per CUDA worker (engine start): keeps freed stream-ordered memory in the device's pool
// instead of returning it at every synchronisation, so per-task scratch costs no cudaMalloc.
extern "C" void st_cuda_worker_init(void *unused);

// Stream-ordered device scratch (cudaMallocAsync); freed with st_cuda_free on the same stream.
void *st_cuda_alloc(size_t bytes, cudaStream_t stream);
void st_cuda_free(void *p, cudaStream_t stream);
