// CUDA variant of the linear codelet (codelets.h): gather the concatenated inputs, RMSNorm when
// asked, then the row slice of the product (through cuBLAS for batches of at least cublas_rows
// tokens, gemm.cu).
#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"

// dst[t][i * piece + j] = src_i[(row0 + t) * piece + j]
__global__ static void gather_piece(const float *src, int64_t row0, int64_t piece, int64_t n, int i, float *dst) {
  const int64_t t = blockIdx.y;
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < piece; j += (int64_t)gridDim.x * blockDim.x)
    dst[t * n + i * piece + j] = src[(row0 + t) * piece + j];
}

static void linear_body(void *buffers[], const void *args, void *scratch, cudaStream_t st) {
  const st_linear_args *a = (const st_linear_args *)args;
  const void *w = (const void *)STARPU_VECTOR_GET_PTR(buffers[0]);
  const float *norm = a->has_norm ? (const float *)STARPU_VECTOR_GET_PTR(buffers[1]) : NULL;
  const int first_in = 1 + (a->has_norm ? 1 : 0);
  float *out = (float *)STARPU_VECTOR_GET_PTR(buffers[first_in + a->n_in]);
  const int64_t n = a->w.n, piece = n / a->n_in;
  float *x = (float *)scratch;
  for (int i = 0; i < a->n_in; i++) {
    const float *in = (const float *)STARPU_VECTOR_GET_PTR(buffers[first_in + i]);
    gather_piece<<<dim3((unsigned)((piece + 255) / 256), (unsigned)a->T), 256, 0, st>>>(in, a->in_row0, piece, n, i, x);
  }
  ST_CUDA_CHECK(cudaGetLastError());
  if (norm) st_cuda_rmsnorm(x, norm, x, a->T, (int)n, a->eps, st);
  // a one-token output projection or output head takes its input quantised (STRATA_INT8_DOT, Q8_0 weights),
  // as the decode step's do (decode.cu dense_q8); longer batches keep float32 activations
  st_cuda_product(st_cuda_cublas_handle(a->T, a->cublas_rows), a->w.type, w, a->w.row_bytes, a->r0, a->r1, x, n,
                  a->T, n, out, a->r1 - a->r0, st, a->T == 1 && a->int8_dot);
}

extern "C" void st_linear_cuda(void *buffers[], void *cl_arg) {
  const st_linear_args *a = (const st_linear_args *)cl_arg;
  const int decode = a->T == 1;
  st_cuda_dense_run(buffers, a, decode ? a->graph_key : 0, sizeof(float) * (size_t)(a->T * a->w.n), decode,
                    linear_body);
}
