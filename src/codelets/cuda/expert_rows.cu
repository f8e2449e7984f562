// CUDA variant of the expert-row codelet (codelets.h): every expert of the task in one grouped
// launch per matrix (gate, up, then down), the rows of all experts gathered into one activation
// block; SwiGLU between; the routing weight applied as the down product is written. On the
// prompt path the experts with many rows leave the grouped launches: with Q8_0 weights and int8
// activations (STRATA_INT8_DOT, the default) an expert of at least ST_MMQ_MIN_ROWS rows goes to
// the tensor-core kernels (mmq.cuh: one launch per matrix for all of them, straight from the
// blocks, on the rows quantised once); otherwise an expert with at least cublas_rows rows has its
// three matrices dequantised to float32 and multiplied with cuBLAS (gemm.cu), one GEMM per matrix.
// Bitwise: a row of the grouped and of the tensor-core kernels depends on its token and expert
// only; a row of a cuBLAS expert also on that expert's row count and FFN slice (the GEMM's shape),
// never on the other experts of the task, so CUDA0 and a helper card of the same kind give the
// same bits for the same expert set. Rows of the three routes are not bitwise equal to each other
// (summation order).
#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"

__global__ static void gather_rows(const float *src, const st_expert_row *rows, int n_rows, int d, float *dst, float *weights) {
  const int i = blockIdx.x;
  if (i >= n_rows) return;
  const st_expert_row r = rows[i];
  for (int j = threadIdx.x; j < d; j += blockDim.x) dst[(int64_t)i * d + j] = src[(int64_t)r.token * d + j];
  if (threadIdx.x == 0) weights[i] = r.weight;
}

// out[o] = sum of rows idx[off[o] .. off[o + 1]) of y, in that order (plain adds, no FMA).
__global__ static void reduce_rows(const float *y, const int32_t *off, const int32_t *idx, int d, float *out) {
  const int o = blockIdx.x;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    float acc = 0.0f;
    for (int r = off[o]; r < off[o + 1]; r++) acc = __fadd_rn(acc, y[(int64_t)idx[r] * d + j]);
    out[(int64_t)o * d + j] = acc;
  }
}

__global__ static void swiglu(float *g, const float *u, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// y[i][j] *= w[i]: the routing weight of a cuBLAS expert's rows (the grouped kernel applies it as
// it writes, the same single rounding).
__global__ static void scale_rows(float *y, const float *w, int d) {
  const float s = w[blockIdx.x];
  for (int j = threadIdx.x; j < d; j += blockDim.x) y[(int64_t)blockIdx.x * d + j] *= s;
}

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

extern "C" void st_expert_rows_cuda(void *buffers[], void *cl_arg) {
  const st_expert_rows_args *a = (const st_expert_rows_args *)cl_arg;
  cudaStream_t st = starpu_cuda_get_local_stream();
  const st_expert_group *groups = st_expert_groups(a);
  const int G = a->n_experts, R = a->n_rows, d = a->n_embd, ff = a->ff1 - a->ff0;
  const float *ffn_in = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
  float *dst = (float *)STARPU_VECTOR_GET_PTR(buffers[1 + 3 * G]);
  const int O = a->n_out_rows;

  // The tensor-core route (STRATA_MMQ): Q8_0 gate, up and down on int8 activations, with the prompt
  // path's large-expert route on (cublas_rows > 0; STRATA_CUBLAS=0 keeps every expert on the grouped
  // kernels)
  const uint8_t **wptr = (const uint8_t **)malloc(sizeof(uint8_t *) * (size_t)G * 3);
  int aligned = 1; // the tensor-core kernels read 8-byte words of the matrices
  for (int i = 0; i < G; i++) {
    // gate and up: rows [ff0, ff1); down: columns [ff0, ff1) of every row
    const uint64_t off[3] = {a->gate.row_bytes * (uint64_t)a->ff0, a->up.row_bytes * (uint64_t)a->ff0,
                             st_row_bytes(a->down.type, (uint64_t)a->ff0)};
    for (int m = 0; m < 3; m++) {
      wptr[m * G + i] = (const uint8_t *)STARPU_VECTOR_GET_PTR(buffers[1 + 3 * i + m]) + off[m];
      aligned &= ((uintptr_t)wptr[m * G + i] & 7) == 0;
    }
  }
  const int mmq = a->mmq && a->int8_dot && a->cublas_rows > 0 && aligned && st_cuda_mmq_takes(a->gate.type, d) &&
                  st_cuda_mmq_takes(a->up.type, d) && st_cuda_mmq_takes(a->down.type, ff);
  // One scratch block: three descriptor tables (six on the tensor-core route: the second three for
  // its experts), the rows and the reduction table, then the weights, X [R][d], gate and up [R][ff],
  // with partial sums (O > 0) the rows Y [R][d] before their reduction, and on the tensor-core route
  // X and the SwiGLU rows quantised. Each array starts on a 256-byte boundary, so a cuBLAS expert's
  // pointers have the same alignment (and cuBLAS the same algorithm) whatever the other experts.
  const size_t desc_bytes = sizeof(st_cuda_group) * (size_t)G * (mmq ? 6 : 3), rows_bytes = sizeof(st_expert_row) * (size_t)R;
  const size_t red_bytes = O > 0 ? sizeof(int32_t) * ((size_t)O + 1 + (size_t)R) : 0;
  const size_t off_w = align256(desc_bytes + rows_bytes + red_bytes), off_x = off_w + align256(sizeof(float) * R);
  const size_t off_g = off_x + align256(sizeof(float) * (size_t)R * d);
  const size_t off_u = off_g + align256(sizeof(float) * (size_t)R * ff);
  const size_t off_y = off_u + align256(sizeof(float) * (size_t)R * ff);
  const size_t off_xq = off_y + align256(O > 0 ? sizeof(float) * (size_t)R * d : 0);
  const size_t off_gq = off_xq + (mmq ? align256((size_t)(R * st_q8_stride(d))) : 0);
  uint8_t *scratch = (uint8_t *)st_cuda_alloc(off_gq + (mmq ? (size_t)(R * st_q8_stride(ff)) : 0), st);
  int32_t *red_dev = (int32_t *)(scratch + desc_bytes + rows_bytes);
  st_cuda_group *desc_dev = (st_cuda_group *)scratch;
  st_expert_row *rows_dev = (st_expert_row *)(scratch + desc_bytes);
  float *wts = (float *)(scratch + off_w), *x = (float *)(scratch + off_x), *g = (float *)(scratch + off_g);
  float *u = (float *)(scratch + off_u);
  float *out = O > 0 ? (float *)(scratch + off_y) : dst;
  int8_t *xq = (int8_t *)(scratch + off_xq), *gq = (int8_t *)(scratch + off_gq);

  // An expert with at least ST_MMQ_MIN_ROWS rows on the tensor-core route, else at least
  // cublas_rows, is computed apart from the grouped kernels (its row count alone decides, so the
  // same expert takes the same path and shapes on any card and in any group); the others share
  // the grouped kernels, where the big ones' descriptors say 0 rows.
  cublasHandle_t cb = NULL;
  for (int i = 0; i < G && !cb && !mmq; i++) cb = st_cuda_cublas_handle(groups[i].n_rows, a->cublas_rows);
  st_cuda_group *desc = (st_cuda_group *)malloc(desc_bytes);
  int max_rows = 0, max_big = 0;
  for (int i = 0; i < G; i++) {
    const int big = mmq ? groups[i].n_rows >= ST_MMQ_MIN_ROWS : cb && groups[i].n_rows >= a->cublas_rows;
    for (int m = 0; m < 3; m++) {
      desc[m * G + i] = st_cuda_group{wptr[m * G + i], groups[i].row0, big ? 0 : groups[i].n_rows};
      if (mmq) desc[(3 + m) * G + i] = st_cuda_group{wptr[m * G + i], groups[i].row0, big ? groups[i].n_rows : 0};
    }
    if (!big) max_rows = groups[i].n_rows > max_rows ? groups[i].n_rows : max_rows;
    if (big) max_big = groups[i].n_rows > max_big ? groups[i].n_rows : max_big;
  }
  ST_CUDA_CHECK(cudaMemcpyAsync(desc_dev, desc, desc_bytes, cudaMemcpyHostToDevice, st));
  ST_CUDA_CHECK(cudaMemcpyAsync(rows_dev, st_expert_rows(a), rows_bytes, cudaMemcpyHostToDevice, st));
  if (O > 0) ST_CUDA_CHECK(cudaMemcpyAsync(red_dev, st_expert_reduce(a), red_bytes, cudaMemcpyHostToDevice, st));
  free(desc); // a copy from pageable memory is staged before cudaMemcpyAsync returns

  gather_rows<<<R, 128, 0, st>>>(ffn_in, rows_dev, R, d, x, wts);
  const int64_t q8_rows = a->int8_dot ? R : 0; // STRATA_INT8_DOT: Q8_0 experts on quantised rows
  if (mmq && max_big > 0) {
    st_cuda_quantize_rows(x, d, R, d, xq, st);
    st_cuda_mmq_grouped(a->gate.row_bytes, desc_dev + 3 * G, G, max_big, ff, xq, d, NULL, g, st);
    st_cuda_mmq_grouped(a->up.row_bytes, desc_dev + 4 * G, G, max_big, ff, xq, d, NULL, u, st);
  }
  st_cuda_grouped_matmul(a->gate.type, a->gate.row_bytes, desc_dev, G, max_rows, ff, x, d, NULL, g, st, q8_rows);
  st_cuda_grouped_matmul(a->up.type, a->up.row_bytes, desc_dev + G, G, max_rows, ff, x, d, NULL, u, st, q8_rows);
  // the cuBLAS experts' weights, dequantised one matrix at a time into ws ([ff][d] or [d][ff])
  const int all_f32 = a->gate.type == ST_TYPE_F32 && a->up.type == ST_TYPE_F32 && a->down.type == ST_TYPE_F32;
  float *ws = cb && !all_f32 ? (float *)st_cuda_alloc(sizeof(float) * (size_t)ff * d, st) : NULL;
  if (cb) st_cuda_gemm_bind(cb, st);
  for (int i = 0; cb && i < G; i++) {
    const int64_t r0 = groups[i].row0, n = groups[i].n_rows;
    if (n < a->cublas_rows) continue;
    st_cuda_gemm_with(cb, a->gate.type, wptr[i], a->gate.row_bytes, ff, x + r0 * d, d, n, d, g + r0 * ff, ff, st, ws);
    st_cuda_gemm_with(cb, a->up.type, wptr[G + i], a->up.row_bytes, ff, x + r0 * d, d, n, d, u + r0 * ff, ff, st, ws);
  }
  swiglu<<<(unsigned)(((int64_t)R * ff + 255) / 256), 256, 0, st>>>(g, u, (int64_t)R * ff);
  if (mmq && max_big > 0) {
    st_cuda_quantize_rows(g, ff, R, ff, gq, st);
    st_cuda_mmq_grouped(a->down.row_bytes, desc_dev + 5 * G, G, max_big, d, gq, ff, wts, out, st);
  }
  st_cuda_grouped_matmul(a->down.type, a->down.row_bytes, desc_dev + 2 * G, G, max_rows, d, g, ff, wts, out, st, q8_rows);
  for (int i = 0; cb && i < G; i++) {
    const int64_t r0 = groups[i].row0, n = groups[i].n_rows;
    if (n < a->cublas_rows) continue;
    // down's columns [ff0, ff1) of each of its d rows: row_bytes apart, starting at wptr
    st_cuda_gemm_with(cb, a->down.type, wptr[2 * G + i], a->down.row_bytes, d, g + r0 * ff, ff, n, ff, out + r0 * d,
                      d, st, ws);
    scale_rows<<<(unsigned)n, 256, 0, st>>>(out + r0 * d, wts + r0, d);
  }
  if (ws) st_cuda_free(ws, st);
  free(wptr);
  if (O > 0) reduce_rows<<<O, 256, 0, st>>>(out, red_dev, red_dev + O + 1, d, dst);
  ST_CUDA_CHECK(cudaGetLastError());
  st_cuda_free(scratch, st);
}
