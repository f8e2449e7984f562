// Float32 matrix products over dequantised weights (common.cuh): a warp per output row, each
// lane striding over the row, TT activation rows per warp so a weight row is read once per TT
// tokens; warp-shuffle reductions in a fixed order, so results repeat run to run. The block
// formats of mmv.cuh's MMV_TYPES (Q4_K, Q6_K, Q8_0, Q5_K, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
// Q2_K, Q3_K, IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS) go to the kernels specialised on their blocks; the
// other block formats (and rows these kernels cannot take: mmv_fits) decode one weight at a time
// through st_dev_weight.
#include "codelets/cuda/common.cuh"
#define MMV_LAUNCHERS /* st_cuda_matmul and st_cuda_grouped_matmul are defined here */
#include "codelets/cuda/mmv.cuh"
#include "codelets/cuda/mmq.cuh"

#define TT 8
#define GENERIC 1000u /* any other block format: st_dev_weight's runtime switch */

template <uint32_t TYPE>
__device__ __forceinline__ float weight_at(const uint8_t *row, int64_t i, uint32_t rtype) {
  if (TYPE == GENERIC) return st_dev_weight(rtype, row, i);
  if (TYPE == ST_TYPE_F32) return ((const float *)row)[i];
  if (TYPE == ST_TYPE_F16) return st_dev_half(((const uint16_t *)row)[i]);
  if (TYPE == ST_TYPE_BF16) return st_dev_bf16(((const uint16_t *)row)[i]);
  const uint8_t *b = row + (i >> 5) * 34;
  return st_dev_half((uint16_t)(b[0] | (b[1] << 8))) * (float)(int8_t)b[2 + (i & 31)];
}

// Four consecutive weights starting at i (a multiple of 4).
template <uint32_t TYPE>
__device__ __forceinline__ float4 weight4_at(const uint8_t *row, int64_t i, uint32_t rtype) {
  if (TYPE == GENERIC)
    return make_float4(st_dev_weight(rtype, row, i), st_dev_weight(rtype, row, i + 1), st_dev_weight(rtype, row, i + 2),
                       st_dev_weight(rtype, row, i + 3));
  if (TYPE == ST_TYPE_F32) return *(const float4 *)(row + 4 * i);
  if (TYPE == ST_TYPE_F16 || TYPE == ST_TYPE_BF16) {
    const uint2 u = *(const uint2 *)(row + 2 * i);
    const uint16_t h[4] = {(uint16_t)(u.x & 0xffff), (uint16_t)(u.x >> 16), (uint16_t)(u.y & 0xffff), (uint16_t)(u.y >> 16)};
    if (TYPE == ST_TYPE_F16) return make_float4(st_dev_half(h[0]), st_dev_half(h[1]), st_dev_half(h[2]), st_dev_half(h[3]));
    return make_float4(st_dev_bf16(h[0]), st_dev_bf16(h[1]), st_dev_bf16(h[2]), st_dev_bf16(h[3]));
  }
  const uint8_t *b = row + (i >> 5) * 34;
  const uint16_t *q2 = (const uint16_t *)(b + 2 + (i & 31)); // 2-byte aligned
  const float d = st_dev_half(*(const uint16_t *)b);
  const uint16_t lo = q2[0], hi = q2[1];
  return make_float4(d * (float)(int8_t)(lo & 0xff), d * (float)(int8_t)(lo >> 8), d * (float)(int8_t)(hi & 0xff),
                     d * (float)(int8_t)(hi >> 8));
}

// A warp computes one output row for up to TT activation rows. With n a multiple of 4 and
// 16-byte aligned activation rows, each lane takes four consecutive elements per step.
template <uint32_t TYPE>
__device__ __forceinline__ void row_dot(const uint8_t *row, const float *x, int64_t ldx, int nt, int64_t n,
                                        float *acc, uint32_t rtype) {
#pragma unroll
  for (int t = 0; t < TT; t++) acc[t] = 0.0f;
  if ((n & 3) == 0 && (ldx & 3) == 0 && ((uintptr_t)x & 15) == 0) {
    for (int64_t i = 4 * threadIdx.x; i < n; i += 128) {
      const float4 w = weight4_at<TYPE>(row, i, rtype);
#pragma unroll
      for (int t = 0; t < TT; t++)
        if (t < nt) {
          const float4 v = *(const float4 *)(x + t * ldx + i);
          acc[t] = fmaf(w.x, v.x, fmaf(w.y, v.y, fmaf(w.z, v.z, fmaf(w.w, v.w, acc[t]))));
        }
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += 32) {
      const float w = weight_at<TYPE>(row, i, rtype);
#pragma unroll
      for (int t = 0; t < TT; t++)
        if (t < nt) acc[t] = fmaf(w, x[t * ldx + i], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < TT; t++) acc[t] = st_warp_sum(acc[t]);
}

template <uint32_t TYPE>
__global__ void matmul_kernel(const uint8_t *W, uint64_t row_bytes, int64_t r0, int64_t nrows,
                              const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo, uint32_t rtype) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  if (r >= nrows) return;
  const int64_t t0 = (int64_t)blockIdx.y * TT;
  const int nt = (int)min((int64_t)TT, T - t0);
  float acc[TT];
  row_dot<TYPE>(W + (uint64_t)(r0 + r) * row_bytes, x + t0 * ldx, ldx, nt, n, acc, rtype);
  if (threadIdx.x == 0)
    for (int t = 0; t < nt; t++) out[(t0 + t) * ldo + r] = acc[t];
}

template <uint32_t TYPE>
__global__ void grouped_kernel(uint64_t row_bytes, const st_cuda_group *groups, int64_t n_out,
                               const float *x, int64_t n, const float *scale, float *out, uint32_t rtype) {
  const st_cuda_group g = groups[blockIdx.z];
  const int64_t r = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  const int64_t t0 = (int64_t)blockIdx.y * TT;
  if (r >= n_out || t0 >= g.n_rows) return;
  const int nt = (int)min((int64_t)TT, (int64_t)g.n_rows - t0);
  const int64_t row0 = g.row0 + t0;
  float acc[TT];
  row_dot<TYPE>(g.W + (uint64_t)r * row_bytes, x + row0 * n, n, nt, n, acc, rtype);
  if (threadIdx.x == 0)
    for (int t = 0; t < nt; t++) out[(row0 + t) * n_out + r] = scale ? acc[t] * scale[row0 + t] : acc[t];
}

void st_cuda_matmul(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1,
                    const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo,
                    cudaStream_t stream, int int8) {
  const int64_t nrows = r1 - r0;
  if (nrows <= 0 || T <= 0) return;
  if (int8 && mmv_q8_takes(type, n) && mmv_fits_any(type, row_bytes, (const uint8_t *)W + r0 * row_bytes, x, ldx, n)) {
    int8_t *xq = (int8_t *)st_cuda_alloc((size_t)(T * st_q8_stride(n)), stream);
    mmv_quantize(x, ldx, T, n, xq, stream);
    mmv_matmul(type, (const uint8_t *)W, row_bytes, r0, nrows, x, ldx, T, n, out, ldo, stream, xq);
    st_cuda_free(xq, stream);
    ST_CUDA_CHECK(cudaGetLastError());
    return;
  }
  if (mmv_matmul(type, (const uint8_t *)W, row_bytes, r0, nrows, x, ldx, T, n, out, ldo, stream)) {
    ST_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const dim3 block(32, 8), grid((unsigned)((nrows + 7) / 8), (unsigned)((T + TT - 1) / TT));
  const uint8_t *w = (const uint8_t *)W;
  switch (type) {
  case ST_TYPE_F32: matmul_kernel<ST_TYPE_F32><<<grid, block, 0, stream>>>(w, row_bytes, r0, nrows, x, ldx, T, n, out, ldo, type); break;
  case ST_TYPE_F16: matmul_kernel<ST_TYPE_F16><<<grid, block, 0, stream>>>(w, row_bytes, r0, nrows, x, ldx, T, n, out, ldo, type); break;
  case ST_TYPE_BF16: matmul_kernel<ST_TYPE_BF16><<<grid, block, 0, stream>>>(w, row_bytes, r0, nrows, x, ldx, T, n, out, ldo, type); break;
  case ST_TYPE_Q8_0: matmul_kernel<ST_TYPE_Q8_0><<<grid, block, 0, stream>>>(w, row_bytes, r0, nrows, x, ldx, T, n, out, ldo, type); break;
  default: matmul_kernel<GENERIC><<<grid, block, 0, stream>>>(w, row_bytes, r0, nrows, x, ldx, T, n, out, ldo, type); break;
  }
  ST_CUDA_CHECK(cudaGetLastError());
}

void st_cuda_grouped_matmul(uint32_t type, uint64_t row_bytes, const st_cuda_group *groups_dev,
                            int n_groups, int max_rows, int64_t n_out, const float *x, int64_t n,
                            const float *scale, float *out, cudaStream_t stream, int64_t q8_rows) {
  if (n_groups <= 0 || max_rows <= 0) return;
  if (q8_rows > 0 && mmv_q8_takes(type, n) && mmv_fits_any(type, row_bytes, NULL, x, n, n)) {
    int8_t *xq = (int8_t *)st_cuda_alloc((size_t)(q8_rows * st_q8_stride(n)), stream);
    mmv_quantize(x, n, q8_rows, n, xq, stream);
    mmv_grouped(type, row_bytes, groups_dev, n_groups, max_rows, n_out, x, n, scale, out, stream, xq);
    st_cuda_free(xq, stream);
    ST_CUDA_CHECK(cudaGetLastError());
    return;
  }
  if (mmv_grouped(type, row_bytes, groups_dev, n_groups, max_rows, n_out, x, n, scale, out, stream)) {
    ST_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const dim3 block(32, 8), grid((unsigned)((n_out + 7) / 8), (unsigned)((max_rows + TT - 1) / TT), (unsigned)n_groups);
  switch (type) {
  case ST_TYPE_F32: grouped_kernel<ST_TYPE_F32><<<grid, block, 0, stream>>>(row_bytes, groups_dev, n_out, x, n, scale, out, type); break;
  case ST_TYPE_F16: grouped_kernel<ST_TYPE_F16><<<grid, block, 0, stream>>>(row_bytes, groups_dev, n_out, x, n, scale, out, type); break;
  case ST_TYPE_BF16: grouped_kernel<ST_TYPE_BF16><<<grid, block, 0, stream>>>(row_bytes, groups_dev, n_out, x, n, scale, out, type); break;
  case ST_TYPE_Q8_0: grouped_kernel<ST_TYPE_Q8_0><<<grid, block, 0, stream>>>(row_bytes, groups_dev, n_out, x, n, scale, out, type); break;
  default: grouped_kernel<GENERIC><<<grid, block, 0, stream>>>(row_bytes, groups_dev, n_out, x, n, scale, out, type); break;
  }
  ST_CUDA_CHECK(cudaGetLastError());
}

void st_cuda_quantize_rows(const float *x, int64_t ldx, int64_t T, int64_t n, int8_t *xq, cudaStream_t stream) {
  if (T > 0) mmv_quantize(x, ldx, T, n, xq, stream);
  ST_CUDA_CHECK(cudaGetLastError());
}

bool st_cuda_mmq_takes(uint32_t type, int64_t n) { return mmq_takes(type, n); }

void st_cuda_mmq_grouped(uint64_t row_bytes, const st_cuda_group *groups_dev, int n_groups, int max_rows,
                         int64_t n_out, const int8_t *xq, int64_t n, const float *scale, float *out,
                         cudaStream_t stream) {
  mmq_grouped(row_bytes, groups_dev, n_groups, max_rows, n_out, xq, n, scale, out, stream);
  ST_CUDA_CHECK(cudaGetLastError());
}

__global__ void rmsnorm_kernel(const float *x, const float *w, float *y, int n, float eps) {
  __shared__ float red[32];
  const float *xr = x + (int64_t)blockIdx.x * n;
  float *yr = y + (int64_t)blockIdx.x * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  ss = st_block_sum(ss, red);
  const float scale = rsqrtf(ss / (float)n + eps);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * (w ? w[i] : 1.0f);
}

void st_cuda_rmsnorm(const float *x, const float *w, float *y, int T, int n, float eps, cudaStream_t stream) {
  if (T <= 0) return;
  rmsnorm_kernel<<<T, 256, 0, stream>>>(x, w, y, n, eps);
  ST_CUDA_CHECK(cudaGetLastError());
}

extern "C" void st_cuda_worker_init(void *unused) {
  (void)unused;
  int dev = 0;
  cudaMemPool_t pool;
  ST_CUDA_CHECK(cudaGetDevice(&dev));
  ST_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  uint64_t keep = UINT64_MAX;
  ST_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  st_cuda_attention_allow_smem();
}

void *st_cuda_alloc(size_t bytes, cudaStream_t stream) {
  void *p = NULL;
  ST_CUDA_CHECK(cudaMallocAsync(&p, bytes ? bytes : 1, stream));
  return p;
}

void st_cuda_free(void *p, cudaStream_t stream) { ST_CUDA_CHECK(cudaFreeAsync(p, stream)); }

__global__ static void dequantize_kernel(uint32_t type, const uint8_t *row, float *out, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = st_dev_weight(type, row, i);
}

extern "C" int st_cuda_dequantize_row(uint32_t type, const void *row, uint64_t bytes, float *out, int64_t n) {
  uint8_t *drow = NULL;
  float *dout = NULL;
  if (cudaMalloc(&drow, bytes) != cudaSuccess || cudaMalloc(&dout, sizeof(float) * (size_t)n) != cudaSuccess) {
    cudaFree(drow);
    return -1;
  }
  cudaMemcpy(drow, row, bytes, cudaMemcpyHostToDevice);
  dequantize_kernel<<<(unsigned)((n + 255) / 256), 256>>>(type, drow, dout, n);
  const cudaError_t err = cudaMemcpy(out, dout, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost);
  cudaFree(drow);
  cudaFree(dout);
  return err == cudaSuccess ? 0 : -1;
}

extern "C" int st_cuda_matmul_rows(uint32_t type, const void *W, uint64_t row_bytes, int64_t rows, const float *x,
                                   int64_t T, int64_t n, float *out, int int8) {
  uint8_t *dw = NULL;
  float *dx = NULL, *dout = NULL;
  const size_t wb = row_bytes * (size_t)rows;
  if (cudaMalloc(&dw, wb) != cudaSuccess || cudaMalloc(&dx, sizeof(float) * (size_t)(T * n)) != cudaSuccess ||
      cudaMalloc(&dout, sizeof(float) * (size_t)(T * rows)) != cudaSuccess) {
    cudaFree(dw);
    cudaFree(dx);
    return -1;
  }
  cudaMemcpy(dw, W, wb, cudaMemcpyHostToDevice);
  cudaMemcpy(dx, x, sizeof(float) * (size_t)(T * n), cudaMemcpyHostToDevice);
  st_cuda_matmul(type, dw, row_bytes, 0, rows, dx, n, T, n, dout, rows, 0, int8);
  const cudaError_t err = cudaMemcpy(out, dout, sizeof(float) * (size_t)(T * rows), cudaMemcpyDeviceToHost);
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dout);
  return err == cudaSuccess ? 0 : -1;
}

// For tests (declared in tests/test_cuda_kernels.c): st_cuda_grouped_matmul on host data, expert g
// with weights W[g] (n_out rows) and n_rows[g] consecutive activation rows of x ([sum][n]), out
// [sum][n_out], scale per activation row (may be NULL); int8: 1, quantised activations where the
// type takes them; 2, the tensor-core kernel (st_cuda_mmq_grouped: Q8_0, n a multiple of 128, the
// rows quantised on the device first). 0, or -1 on a CUDA error.
extern "C" int st_cuda_grouped_rows(uint32_t type, const void *const *W, uint64_t row_bytes, int n_groups,
                                    const int32_t *n_rows, int64_t n_out, const float *x, int64_t n,
                                    const float *scale, float *out, int int8) {
  if (int8 == 2 && !mmq_takes(type, n)) return -1;
  st_cuda_group *desc = (st_cuda_group *)calloc((size_t)n_groups, sizeof *desc), *ddesc = NULL;
  float *dx = NULL, *dscale = NULL, *dout = NULL;
  int8_t *dq = NULL;
  int rows = 0, max_rows = 0, ok = desc != NULL;
  for (int g = 0; g < n_groups; g++) {
    max_rows = n_rows[g] > max_rows ? n_rows[g] : max_rows;
    rows += n_rows[g];
  }
  const size_t wb = row_bytes * (size_t)n_out;
  for (int g = 0, row0 = 0; ok && g < n_groups; row0 += n_rows[g], g++) {
    void *dw = NULL;
    ok = cudaMalloc(&dw, wb) == cudaSuccess && cudaMemcpy(dw, W[g], wb, cudaMemcpyHostToDevice) == cudaSuccess;
    desc[g] = st_cuda_group{(const uint8_t *)dw, row0, n_rows[g]};
  }
  ok = ok && cudaMalloc(&ddesc, sizeof *desc * (size_t)n_groups) == cudaSuccess &&
       cudaMalloc(&dx, sizeof(float) * (size_t)rows * (size_t)n) == cudaSuccess &&
       cudaMalloc(&dscale, sizeof(float) * (size_t)rows) == cudaSuccess &&
       cudaMalloc(&dout, sizeof(float) * (size_t)rows * (size_t)n_out) == cudaSuccess &&
       (int8 != 2 || cudaMalloc(&dq, (size_t)(rows * st_q8_stride(n))) == cudaSuccess);
  if (ok) {
    cudaMemcpy(ddesc, desc, sizeof *desc * (size_t)n_groups, cudaMemcpyHostToDevice);
    cudaMemcpy(dx, x, sizeof(float) * (size_t)rows * (size_t)n, cudaMemcpyHostToDevice);
    if (scale) cudaMemcpy(dscale, scale, sizeof(float) * (size_t)rows, cudaMemcpyHostToDevice);
    if (int8 == 2) {
      st_cuda_quantize_rows(dx, n, rows, n, dq, 0);
      st_cuda_mmq_grouped(row_bytes, ddesc, n_groups, max_rows, n_out, dq, n, scale ? dscale : NULL, dout, 0);
    } else {
      st_cuda_grouped_matmul(type, row_bytes, ddesc, n_groups, max_rows, n_out, dx, n, scale ? dscale : NULL, dout, 0,
                             int8 ? rows : 0);
    }
    ok = cudaMemcpy(out, dout, sizeof(float) * (size_t)rows * (size_t)n_out, cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  for (int g = 0; desc && g < n_groups; g++) cudaFree((void *)desc[g].W);
  free(desc);
  cudaFree(ddesc);
  cudaFree(dx);
  cudaFree(dscale);
  cudaFree(dout);
  cudaFree(dq);
  return ok ? 0 : -1;
}

// For tests: seconds of one st_cuda_mmq_grouped launch (mean of reps after a warm-up) over
// n_groups experts of n_out Q8_0 rows of n weights (zero blocks) with `rows` token rows each; -1 on
// a CUDA error.
extern "C" double st_cuda_mmq_seconds(int n_groups, int rows, int64_t n_out, int64_t n, int reps) {
  const uint64_t rb = (uint64_t)(n / 32) * 34;
  uint8_t *dw = NULL;
  int8_t *dq = NULL;
  float *dout = NULL;
  st_cuda_group *ddesc = NULL;
  const int64_t T = (int64_t)n_groups * rows;
  double sec = -1.0;
  if (cudaMalloc(&dw, rb * (size_t)n_out * (size_t)n_groups) == cudaSuccess &&
      cudaMalloc(&dq, (size_t)(T * st_q8_stride(n))) == cudaSuccess &&
      cudaMalloc(&dout, sizeof(float) * (size_t)(T * n_out)) == cudaSuccess &&
      cudaMalloc(&ddesc, sizeof(st_cuda_group) * (size_t)n_groups) == cudaSuccess) {
    cudaMemset(dw, 0, rb * (size_t)n_out * (size_t)n_groups);
    cudaMemset(dq, 0, (size_t)(T * st_q8_stride(n)));
    st_cuda_group *desc = (st_cuda_group *)malloc(sizeof(st_cuda_group) * (size_t)n_groups);
    for (int g = 0; g < n_groups; g++) desc[g] = st_cuda_group{dw + rb * (size_t)n_out * g, g * rows, rows};
    cudaMemcpy(ddesc, desc, sizeof(st_cuda_group) * (size_t)n_groups, cudaMemcpyHostToDevice);
    free(desc);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    mmq_grouped(rb, ddesc, n_groups, rows, n_out, dq, n, NULL, dout, 0);
    cudaEventRecord(e0, 0);
    for (int r = 0; r < reps; r++) mmq_grouped(rb, ddesc, n_groups, rows, n_out, dq, n, NULL, dout, 0);
    cudaEventRecord(e1, 0);
    float ms = 0.0f;
    if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess)
      sec = ms * 1e-3 / reps;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  cudaGetLastError();
  cudaFree(dw);
  cudaFree(dq);
  cudaFree(dout);
  cudaFree(ddesc);
  return sec;
}

extern "C" double st_cuda_matvec_seconds(uint32_t type, uint64_t row_bytes, int64_t rows, int64_t n, int reps) {
  uint8_t *dw = NULL;
  float *dx = NULL, *dout = NULL;
  if (cudaMalloc(&dw, row_bytes * (size_t)rows) != cudaSuccess || cudaMalloc(&dx, sizeof(float) * (size_t)n) != cudaSuccess ||
      cudaMalloc(&dout, sizeof(float) * (size_t)rows) != cudaSuccess) {
    cudaFree(dw);
    cudaFree(dx);
    return -1.0;
  }
  cudaMemset(dw, 0x11, row_bytes * (size_t)rows);
  cudaMemset(dx, 0, sizeof(float) * (size_t)n);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  st_cuda_matmul(type, dw, row_bytes, 0, rows, dx, n, 1, n, dout, rows, 0, 0); // warm-up
  cudaEventRecord(e0, 0);
  for (int r = 0; r < reps; r++) st_cuda_matmul(type, dw, row_bytes, 0, rows, dx, n, 1, n, dout, rows, 0, 0);
  cudaEventRecord(e1, 0);
  cudaEventSynchronize(e1);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dout);
  return ms * 1e-3 / reps;
}
