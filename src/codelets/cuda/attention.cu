// CUDA variant of the attention codelet (codelets.h): RMSNorm, the group's Q/K/V projections
// (K and V written straight into the KV cache kept on the device; through cuBLAS for prompt
// chunks of at least cublas_rows tokens, gemm.cu), q/k RMSNorm and NEOX RoPE per
// head, then causal attention split over the keys (see attend_partial).
#include <math.h>

#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"


// q/k RMSNorm over head_dim and NEOX RoPE at position pos0 + t; one block per (t, head).
__global__ static void qk_norm_rope(float *v, int64_t ld, int hd, const float *w, float eps, int pos0,
                                    float theta) {
  __shared__ float red[32];
  float *h = v + (int64_t)blockIdx.x * ld + (int64_t)blockIdx.y * hd;
  const int pos = pos0 + blockIdx.x;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hd; i += blockDim.x)
    ss += h[i] * h[i];
  ss = st_block_sum(ss, red);
  const float scale = rsqrtf(ss / (float)hd + eps);
  __syncthreads();
  const int half = hd / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double ang = (double)pos * pow((double)theta, -2.0 * i / hd);
    const float c = (float)cos(ang), s = (float)sin(ang);
    const float x0 = h[i] * scale * w[i], x1 = h[i + half] * scale * w[i + half];
    h[i] = x0 * c - x1 * s;
    h[i + half] = x0 * s + x1 * c;
  }
}

// Causal attention, split over the keys (split-K): block (t, h, c) handles token t's query head h
// over keys [c * KEY_CHUNK, (c + 1) * KEY_CHUNK) ∩ [0, pos0 + t]. Each warp takes every 8th key of
// the chunk, its lanes sharing the head's dimensions (a coalesced read of each key and value
// row), with an online softmax (the flash-attention recurrence); the warps then merge, and the
// block writes its partial (max, sum, weighted values). attend_combine merges the chunks. Long
// contexts thus spread over many blocks even at decode (T = 1).
#define KEY_CHUNK 256
#define WARPS 8
#define MAX_DIMS_PER_LANE 8 /* head_dim <= 256 */

__global__ static void attend_partial(const float *q, int64_t ldq, const float *kc, const float *vc, int hd,
                                      int pos0, float scale, int n_chunks, float *part) {
  __shared__ float wm[WARPS], wl[WARPS], wacc[WARPS][256];
  const int t = blockIdx.x, h = blockIdx.y, c = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n_keys = pos0 + t + 1, start = c * KEY_CHUNK, end = min(start + KEY_CHUNK, n_keys);
  float *out = part + (((int64_t)t * gridDim.y + h) * n_chunks + c) * (hd + 2);
  if (start >= n_keys) {
    if (threadIdx.x == 0) out[0] = -INFINITY, out[1] = 0.0f;
    return;
  }
  const int nd = (hd + 31) / 32;
  const float *qh = q + (int64_t)t * ldq + (int64_t)h * hd;
  float qd[MAX_DIMS_PER_LANE], acc[MAX_DIMS_PER_LANE];
#pragma unroll
  for (int i = 0; i < MAX_DIMS_PER_LANE; i++) {
    const int dd = lane + 32 * i;
    qd[i] = i < nd && dd < hd ? qh[dd] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = start + warp; j < end; j += WARPS) {
    const float *k = kc + (int64_t)j * hd, *v = vc + (int64_t)j * hd;
    float sdot = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_DIMS_PER_LANE; i++)
      if (i < nd && lane + 32 * i < hd) sdot = fmaf(qd[i], k[lane + 32 * i], sdot);
    const float s = st_warp_sum(sdot) * scale;
    const float m_new = fmaxf(m, s), corr = expf(m - m_new), p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < MAX_DIMS_PER_LANE; i++)
      if (i < nd && lane + 32 * i < hd) acc[i] = acc[i] * corr + p * v[lane + 32 * i];
    m = m_new;
  }
  if (lane == 0) wm[warp] = m, wl[warp] = l;
#pragma unroll
  for (int i = 0; i < MAX_DIMS_PER_LANE; i++)
    if (i < nd && lane + 32 * i < hd) wacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < WARPS; w++) M = fmaxf(M, wm[w]);
  for (int dd = threadIdx.x; dd < hd; dd += blockDim.x) {
    float a = 0.0f;
    for (int w = 0; w < WARPS; w++)
      if (wl[w] > 0.0f) a += wacc[w][dd] * expf(wm[w] - M);
    out[2 + dd] = a;
  }
  if (threadIdx.x == 0) {
    float L = 0.0f;
    for (int w = 0; w < WARPS; w++)
      if (wl[w] > 0.0f) L += wl[w] * expf(wm[w] - M);
    out[0] = M;
    out[1] = L;
  }
}

// Merges the chunks of (t, h) in chunk order: out = sum_c A_c e^(M_c - M) / sum_c L_c e^(M_c - M).
__global__ static void attend_combine(const float *part, int n_chunks, int hd, int pos0, float *out, int64_t ldo) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int used = (pos0 + t + 1 + KEY_CHUNK - 1) / KEY_CHUNK;
  const float *p = part + ((int64_t)t * gridDim.y + h) * n_chunks * (hd + 2);
  float M = -INFINITY;
  for (int c = 0; c < used; c++) M = fmaxf(M, p[(int64_t)c * (hd + 2)]);
  for (int dd = threadIdx.x; dd < hd; dd += blockDim.x) {
    float a = 0.0f, L = 0.0f;
    for (int c = 0; c < used; c++) {
      const float *pc = p + (int64_t)c * (hd + 2), f = expf(pc[0] - M);
      a += pc[2 + dd] * f;
      L += pc[1] * f;
    }
    out[(int64_t)t * ldo + (int64_t)h * hd + dd] = a / L;
  }
}

// Scratch floats of one call: the normed input, one group's queries and the split-K partials.
static size_t attention_scratch_bytes(const st_attention_args *a) {
  const int n_chunks = (a->pos0 + a->T + KEY_CHUNK - 1) / KEY_CHUNK;
  return sizeof(float) * ((size_t)a->T * a->n_embd + (size_t)a->T * a->n_q * a->head_dim +
                          (size_t)a->T * a->n_q * n_chunks * (a->head_dim + 2));
}

static void attention_body(void *buffers[], const void *args, void *scratch, cudaStream_t st) {
  const st_attention_args *a = (const st_attention_args *)args;
  const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
  const float *attn_norm = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
  const void *wq = (const void *)STARPU_VECTOR_GET_PTR(buffers[2]);
  const void *wk = (const void *)STARPU_VECTOR_GET_PTR(buffers[3]);
  const void *wv = (const void *)STARPU_VECTOR_GET_PTR(buffers[4]);
  const float *q_norm = (const float *)STARPU_VECTOR_GET_PTR(buffers[5]);
  const float *k_norm = (const float *)STARPU_VECTOR_GET_PTR(buffers[6]);
  const int T = a->T, d = a->n_embd, hd = a->head_dim, nq = a->n_q, qw = nq * hd;

  const int n_chunks = (a->pos0 + T + KEY_CHUNK - 1) / KEY_CHUNK;
  float *xn = (float *)scratch;
  float *q = xn + (size_t)T * d, *part = q + (size_t)T * qw;
  st_cuda_rmsnorm(x, attn_norm, xn, T, d, a->eps, st);
  cublasHandle_t cb = st_cuda_cublas_handle(T, a->cublas_rows); // NULL: the float32 kernels
  for (int i = 0; i < a->n_groups; i++) {
    const int group = a->group0 + i;
    float *kc = (float *)STARPU_VECTOR_GET_PTR(buffers[7 + 2 * i]);
    float *vc = (float *)STARPU_VECTOR_GET_PTR(buffers[8 + 2 * i]);
    float *out = (float *)STARPU_VECTOR_GET_PTR(buffers[7 + 2 * a->n_groups + i]);
    float *kdst = kc + (size_t)a->pos0 * hd, *vdst = vc + (size_t)a->pos0 * hd;
    st_cuda_product(cb, a->wq.type, wq, a->wq.row_bytes, (int64_t)group * qw, (int64_t)(group + 1) * qw, xn, d, T,
                   d, q, qw, st);
    st_cuda_product(cb, a->wk.type, wk, a->wk.row_bytes, (int64_t)group * hd, (int64_t)(group + 1) * hd, xn, d, T,
                   d, kdst, hd, st);
    st_cuda_product(cb, a->wv.type, wv, a->wv.row_bytes, (int64_t)group * hd, (int64_t)(group + 1) * hd, xn, d, T,
                   d, vdst, hd, st);
    qk_norm_rope<<<dim3(T, nq), 64, 0, st>>>(q, qw, hd, q_norm, a->eps, a->pos0, a->rope_theta);
    qk_norm_rope<<<dim3(T, 1), 64, 0, st>>>(kdst, hd, hd, k_norm, a->eps, a->pos0, a->rope_theta);
    attend_partial<<<dim3(T, nq, n_chunks), 32 * WARPS, 0, st>>>(q, qw, kc, vc, hd, a->pos0, 1.0f / sqrtf((float)hd),
                                                              n_chunks, part);
    attend_combine<<<dim3(T, nq), 128, 0, st>>>(part, n_chunks, hd, a->pos0, out, qw);
  }
  ST_CUDA_CHECK(cudaGetLastError());
}

extern "C" void st_attention_cuda(void *buffers[], void *cl_arg) {
  const st_attention_args *a = (const st_attention_args *)cl_arg;
  const int decode = a->T == 1;
  st_cuda_dense_run(buffers, a, decode ? a->graph_key : 0, attention_scratch_bytes(a), decode, attention_body);
}
