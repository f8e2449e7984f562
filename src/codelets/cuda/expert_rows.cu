// CUDA variant of the expert-row codelet (codelets.h): every expert of the task in one grouped
// launch per matrix (gate, up, then down), the rows of all experts gathered into one activation
// block; SwiGLU between; the routing weight applied as the down product is written.
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

extern "C" void st_expert_rows_cuda(void *buffers[], void *cl_arg) {
  const st_expert_rows_args *a = (const st_expert_rows_args *)cl_arg;
  cudaStream_t st = starpu_cuda_get_local_stream();
  const st_expert_group *groups = st_expert_groups(a);
  const int G = a->n_experts, R = a->n_rows, d = a->n_embd, ff = a->ff1 - a->ff0;
  const float *ffn_in = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
  float *dst = (float *)STARPU_VECTOR_GET_PTR(buffers[1 + 3 * G]);
  const int O = a->n_out_rows;

  // One scratch block: three descriptor tables, the rows and weights, X [R][d], gate and up [R][ff].
  const size_t desc_bytes = sizeof(st_cuda_group) * (size_t)G * 3, rows_bytes = sizeof(st_expert_row) * (size_t)R;
  const size_t red_bytes = O > 0 ? sizeof(int32_t) * ((size_t)O + 1 + (size_t)R) : 0;
  const size_t head = (desc_bytes + rows_bytes + red_bytes + 255) & ~(size_t)255;
  // with partial sums (O > 0) the rows go to a scratch block Y [R][d] first
  const size_t y_floats = O > 0 ? (size_t)R * d : 0;
  uint8_t *scratch = (uint8_t *)st_cuda_alloc(head + sizeof(float) * ((size_t)R + (size_t)R * d + 2 * (size_t)R * ff + y_floats), st);
  int32_t *red_dev = (int32_t *)(scratch + desc_bytes + rows_bytes);
  st_cuda_group *desc_dev = (st_cuda_group *)scratch;
  st_expert_row *rows_dev = (st_expert_row *)(scratch + desc_bytes);
  float *wts = (float *)(scratch + head), *x = wts + R, *g = x + (size_t)R * d, *u = g + (size_t)R * ff;
  float *out = O > 0 ? u + (size_t)R * ff : dst;

  st_cuda_group *desc = (st_cuda_group *)malloc(desc_bytes);
  int max_rows = 0;
  for (int i = 0; i < G; i++) {
    // gate and up: rows [ff0, ff1); down: columns [ff0, ff1) of every row
    const uint64_t off[3] = {a->gate.row_bytes * (uint64_t)a->ff0, a->up.row_bytes * (uint64_t)a->ff0,
                             st_row_bytes(a->down.type, (uint64_t)a->ff0)};
    for (int m = 0; m < 3; m++)
      desc[m * G + i] = st_cuda_group{(const uint8_t *)STARPU_VECTOR_GET_PTR(buffers[1 + 3 * i + m]) + off[m],
                                      groups[i].row0, groups[i].n_rows};
    max_rows = groups[i].n_rows > max_rows ? groups[i].n_rows : max_rows;
  }
  ST_CUDA_CHECK(cudaMemcpyAsync(desc_dev, desc, desc_bytes, cudaMemcpyHostToDevice, st));
  ST_CUDA_CHECK(cudaMemcpyAsync(rows_dev, st_expert_rows(a), rows_bytes, cudaMemcpyHostToDevice, st));
  if (O > 0) ST_CUDA_CHECK(cudaMemcpyAsync(red_dev, st_expert_reduce(a), red_bytes, cudaMemcpyHostToDevice, st));
  free(desc); // a copy from pageable memory is staged before cudaMemcpyAsync returns

  gather_rows<<<R, 128, 0, st>>>(ffn_in, rows_dev, R, d, x, wts);
  st_cuda_grouped_matmul(a->gate.type, a->gate.row_bytes, desc_dev, G, max_rows, ff, x, d, NULL, g, st);
  st_cuda_grouped_matmul(a->up.type, a->up.row_bytes, desc_dev + G, G, max_rows, ff, x, d, NULL, u, st);
  swiglu<<<(unsigned)(((int64_t)R * ff + 255) / 256), 256, 0, st>>>(g, u, (int64_t)R * ff);
  st_cuda_grouped_matmul(a->down.type, a->down.row_bytes, desc_dev + 2 * G, G, max_rows, d, g, ff, wts, out, st);
  if (O > 0) reduce_rows<<<O, 256, 0, st>>>(out, red_dev, red_dev + O + 1, d, dst);
  ST_CUDA_CHECK(cudaGetLastError());
  st_cuda_free(scratch, st);
}
