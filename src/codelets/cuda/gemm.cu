// Matrix products of prompt chunks through cuBLAS (issue #9). The float32 kernels of matmul.cu
// read each weight row once per 8 tokens and reduce with warp shuffles: right for decode (one
// token), far from the GPU's arithmetic rate for a chunk of hundreds of tokens. Here a block of
// weight rows is dequantised to float32 in device scratch with the kernels' own element decoder
// (common.cuh st_dev_weight; F32 weights are used in place) and multiplied with one
// cublasGemmEx: float32 in, float32 out, by default (STRATA_CUBLAS_TF32=1, st_cuda_gemm_set_tf32)
// CUBLAS_COMPUTE_32F_FAST_TF32: tensor cores on both inputs rounded to TF32, float32 accumulation
// (every fixture tolerance block passes on CUDA0); with STRATA_CUBLAS_TF32=0
// CUBLAS_COMPUTE_32F_PEDANTIC, no reduced-precision shortcut: the float32 path that the fixtures'
// tight float32 bound holds.
//
// Why float32 scratch, also for F16/BF16 weights: cublasGemmEx wants both inputs of one type, so
// a half-precision GEMM would round the activations to F16/BF16, which the fixtures' max |Δlogit|
// rule for BF16 with float32 activations does not allow. Decoding to float32 is exact for
// F16/BF16/Q8_0 and for every block format (the same float operations as the kernels).
//
// Reproducibility (cuBLAS guide, "Results reproducibility"): a cuBLAS routine of one toolkit
// version gives bitwise the same result at every run on GPUs of the same architecture and number
// of SMs, when one stream uses the handle. Each StarPU CUDA worker has its own handle bound to
// its own stream (starpu_cublas_init), GemmEx runs with CUBLAS_GEMM_DEFAULT and the handle's
// default atomics mode (not allowed), so results repeat run to run and a chunk computed on CUDA0
// or on a helper H200 gives the same bits for the same shapes. What is NOT bitwise identical:
// cuBLAS vs the float32 kernels (another summation order; decode always uses the kernels, so
// decode results are unchanged), and one output element of cuBLAS across different shapes (the
// algorithm cuBLAS picks depends on m, n, k and pointer alignment): a token's row may differ by
// rounding between two chunkings of the same prompt, or between cards with different SM counts
// (a MIG slice, another GPU model).
#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"

#include <starpu_cublas_v2.h> /* after starpu.h: needs STARPU_USE_CUDA from starpu_config.h */

// Weight rows dequantised per GEMM at most (the output head is chunked).
#define SCRATCH_BYTES_MAX ((size_t)64 << 20)

#define ST_CUBLAS_CHECK(call)                                                                                \
  do {                                                                                                       \
    cublasStatus_t st_status_ = (call);                                                                      \
    if (st_status_ != CUBLAS_STATUS_SUCCESS) STARPU_CUBLAS_REPORT_ERROR(st_status_);                         \
  } while (0)

// dst[r * n + j] = element j of row r of W (rows row_bytes apart), j < n.
__global__ static void dequantize_rows(uint32_t type, const uint8_t *W, uint64_t row_bytes, int64_t rows,
                                       int64_t n, float *dst) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const uint8_t *row = W + (uint64_t)r * row_bytes;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (int64_t)gridDim.x * blockDim.x)
      dst[r * n + j] = st_dev_weight(type, row, j);
  }
}

cublasHandle_t st_cuda_cublas_handle(int64_t T, int32_t min_rows) {
  if (min_rows <= 0 || T < min_rows) return NULL;
  return starpu_cublas_get_local_handle(); // NULL when starpu_cublas_init was not called
}

static int gemm_tf32; // st_cuda_gemm_set_tf32

extern "C" void st_cuda_gemm_set_tf32(int on) { gemm_tf32 = on != 0; }

// One GEMM: out[t * ldo + i] = sum_j A[i * lda + j] * x[t * ldx + j], i < m, t < T, j < n. In
// cuBLAS's column-major terms out (m x T, ld ldo) = A^T (A: n x m, ld lda) * x (n x T, ld ldx).
static void gemm_f32(cublasHandle_t h, const float *A, int64_t lda, int64_t m, const float *x, int64_t ldx,
                     int64_t T, int64_t n, float *out, int64_t ldo) {
  const float one = 1.0f, zero = 0.0f;
  ST_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)T, (int)n, &one, A, CUDA_R_32F,
                               (int)lda, x, CUDA_R_32F, (int)ldx, &zero, out, CUDA_R_32F, (int)ldo,
                               gemm_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC,
                               CUBLAS_GEMM_DEFAULT));
}

void st_cuda_gemm_bind(cublasHandle_t h, cudaStream_t stream) {
  ST_CUBLAS_CHECK(cublasSetStream(h, stream));
  ST_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
  ST_CUBLAS_CHECK(cublasSetMathMode(h, gemm_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
}

void st_cuda_gemm_with(cublasHandle_t h, uint32_t type, const void *W, uint64_t row_bytes, int64_t rows,
                       const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo,
                       cudaStream_t stream, float *ws) {
  if (rows <= 0 || T <= 0) return;
  if (type == ST_TYPE_F32) { // used in place (row_bytes is a whole number of floats)
    gemm_f32(h, (const float *)W, (int64_t)(row_bytes / sizeof(float)), rows, x, ldx, T, n, out, ldo);
    return;
  }
  const int64_t bx = (n + 255) / 256 < 64 ? (n + 255) / 256 : 64;
  const dim3 grid((unsigned)bx, (unsigned)(rows < 65535 ? rows : 65535));
  dequantize_rows<<<grid, 256, 0, stream>>>(type, (const uint8_t *)W, row_bytes, rows, n, ws);
  ST_CUDA_CHECK(cudaGetLastError());
  gemm_f32(h, ws, n, rows, x, ldx, T, n, out, ldo); // stream order: a later decode into ws waits for it
}

void st_cuda_gemm(cublasHandle_t h, uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1,
                  const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo,
                  cudaStream_t stream) {
  const int64_t rows = r1 - r0;
  if (rows <= 0 || T <= 0) return;
  st_cuda_gemm_bind(h, stream);
  const uint8_t *w = (const uint8_t *)W + (uint64_t)r0 * row_bytes;
  // Chunks of rows whose float32 copy fits SCRATCH_BYTES_MAX: a function of n only, so the shapes
  // (and the bits) do not depend on the device or the pool.
  int64_t chunk = (int64_t)(SCRATCH_BYTES_MAX / (sizeof(float) * (size_t)n));
  if (chunk < 1) chunk = 1;
  if (chunk > rows || type == ST_TYPE_F32) chunk = rows;
  float *ws =
      type == ST_TYPE_F32 ? NULL : (float *)st_cuda_alloc(sizeof(float) * (size_t)chunk * (size_t)n, stream);
  for (int64_t c = 0; c < rows; c += chunk)
    st_cuda_gemm_with(h, type, w + (uint64_t)c * row_bytes, row_bytes, rows - c < chunk ? rows - c : chunk, x,
                      ldx, T, n, out + c, ldo, stream, ws);
  if (ws) st_cuda_free(ws, stream);
}

void st_cuda_product(cublasHandle_t h, uint32_t type, const void *W, uint64_t row_bytes, int64_t r0,
                     int64_t r1, const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo,
                     cudaStream_t stream, int int8) {
  if (h)
    st_cuda_gemm(h, type, W, row_bytes, r0, r1, x, ldx, T, n, out, ldo, stream);
  else
    st_cuda_matmul(type, W, row_bytes, r0, r1, x, ldx, T, n, out, ldo, stream, int8);
}

extern "C" int st_cuda_gemm_rows(uint32_t type, const void *W, uint64_t row_bytes, int64_t rows,
                                 const float *x, int64_t T, int64_t n, float *out) {
  cublasHandle_t h = NULL;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return -1;
  uint8_t *dw = NULL;
  float *dx = NULL, *dout = NULL;
  const size_t wb = row_bytes * (size_t)rows;
  int rc = -1;
  if (cudaMalloc(&dw, wb) == cudaSuccess && cudaMalloc(&dx, sizeof(float) * (size_t)(T * n)) == cudaSuccess &&
      cudaMalloc(&dout, sizeof(float) * (size_t)(T * rows)) == cudaSuccess) {
    cudaMemcpy(dw, W, wb, cudaMemcpyHostToDevice);
    cudaMemcpy(dx, x, sizeof(float) * (size_t)(T * n), cudaMemcpyHostToDevice);
    st_cuda_gemm(h, type, dw, row_bytes, 0, rows, dx, n, T, n, dout, rows, 0);
    rc = cudaMemcpy(out, dout, sizeof(float) * (size_t)(T * rows), cudaMemcpyDeviceToHost) == cudaSuccess
             ? 0
             : -1;
  }
  cudaGetLastError();
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dout);
  cublasDestroy(h);
  return rc;
}
