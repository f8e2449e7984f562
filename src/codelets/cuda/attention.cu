// CUDA variant of the attention codelet (codelets.h): RMSNorm, the group's Q/K/V projections
// (K and V written straight into the KV cache kept on the device), q/k RMSNorm and NEOX RoPE per
// head, then causal attention with an online softmax (one pass over the keys in tiles, the
// flash-attention recurrence), one block per (token, query head).
#include <math.h>

#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"

#define KEY_TILE 256

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

// Causal attention of token t (position pos0 + t) and query head h over keys 0..pos0+t.
__global__ static void attend(const float *q, int64_t ldq, const float *kc, const float *vc, int hd, int pos0,
                              float scale, float *out, int64_t ldo) {
  __shared__ float red[32];
  __shared__ float qs[256];
  __shared__ float p[KEY_TILE];
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const float *qh = q + (int64_t)t * ldq + (int64_t)h * hd;
  for (int i = tid; i < hd; i += blockDim.x)
    qs[i] = qh[i];
  __syncthreads();
  const int n_keys = pos0 + t + 1;
  float m = -INFINITY, l = 0.0f, acc = 0.0f; // acc: output element `tid` (tid < hd)
  for (int base = 0; base < n_keys; base += KEY_TILE) {
    const int j = base + tid;
    float s = -INFINITY;
    if (j < n_keys) {
      const float *k = kc + (int64_t)j * hd;
      float d = 0.0f;
      for (int i = 0; i < hd; i++)
        d = fmaf(qs[i], k[i], d);
      s = d * scale;
    }
    const float m_new = fmaxf(m, st_block_max(s, red));
    const float pj = j < n_keys ? expf(s - m_new) : 0.0f;
    const float corr = expf(m - m_new);
    l = l * corr + st_block_sum(pj, red);
    p[tid] = pj;
    __syncthreads();
    if (tid < hd) {
      float a = 0.0f;
      const int lim = min(KEY_TILE, n_keys - base);
      for (int jj = 0; jj < lim; jj++)
        a = fmaf(p[jj], vc[(int64_t)(base + jj) * hd + tid], a);
      acc = acc * corr + a;
    }
    m = m_new;
    __syncthreads();
  }
  if (tid < hd) out[(int64_t)t * ldo + (int64_t)h * hd + tid] = acc / l;
}

extern "C" void st_attention_cuda(void *buffers[], void *cl_arg) {
  const st_attention_args *a = (const st_attention_args *)cl_arg;
  cudaStream_t st = starpu_cuda_get_local_stream();
  const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
  const float *attn_norm = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
  const void *wq = (const void *)STARPU_VECTOR_GET_PTR(buffers[2]);
  const void *wk = (const void *)STARPU_VECTOR_GET_PTR(buffers[3]);
  const void *wv = (const void *)STARPU_VECTOR_GET_PTR(buffers[4]);
  const float *q_norm = (const float *)STARPU_VECTOR_GET_PTR(buffers[5]);
  const float *k_norm = (const float *)STARPU_VECTOR_GET_PTR(buffers[6]);
  const int T = a->T, d = a->n_embd, hd = a->head_dim, nq = a->n_q, qw = nq * hd;

  float *xn = (float *)st_cuda_alloc(sizeof(float) * ((size_t)T * d + (size_t)T * qw), st);
  float *q = xn + (size_t)T * d;
  st_cuda_rmsnorm(x, attn_norm, xn, T, d, a->eps, st);
  for (int i = 0; i < a->n_groups; i++) {
    const int group = a->group0 + i;
    float *kc = (float *)STARPU_VECTOR_GET_PTR(buffers[7 + 2 * i]);
    float *vc = (float *)STARPU_VECTOR_GET_PTR(buffers[8 + 2 * i]);
    float *out = (float *)STARPU_VECTOR_GET_PTR(buffers[7 + 2 * a->n_groups + i]);
    float *kdst = kc + (size_t)a->pos0 * hd, *vdst = vc + (size_t)a->pos0 * hd;
    st_cuda_matmul(a->wq.type, wq, a->wq.row_bytes, (int64_t)group * qw, (int64_t)(group + 1) * qw, xn, d, T,
                   d, q, qw, st);
    st_cuda_matmul(a->wk.type, wk, a->wk.row_bytes, (int64_t)group * hd, (int64_t)(group + 1) * hd, xn, d, T,
                   d, kdst, hd, st);
    st_cuda_matmul(a->wv.type, wv, a->wv.row_bytes, (int64_t)group * hd, (int64_t)(group + 1) * hd, xn, d, T,
                   d, vdst, hd, st);
    qk_norm_rope<<<dim3(T, nq), 64, 0, st>>>(q, qw, hd, q_norm, a->eps, a->pos0, a->rope_theta);
    qk_norm_rope<<<dim3(T, 1), 64, 0, st>>>(kdst, hd, hd, k_norm, a->eps, a->pos0, a->rope_theta);
    attend<<<dim3(T, nq), KEY_TILE, 0, st>>>(q, qw, kc, vc, hd, a->pos0, 1.0f / sqrtf((float)hd), out, qw);
  }
  ST_CUDA_CHECK(cudaGetLastError());
  st_cuda_free(xn, st);
}
