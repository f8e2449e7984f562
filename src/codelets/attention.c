/* Attention of GQA groups (each one KV head and its query heads) for a batch of T tokens: the
 * codelet, its CPU variant and the submit wrapper (see codelets.h). RoPE is the NEOX variant
 * (rotate the two halves of each head), as llama.cpp uses for qwen3moe; q/k RMSNorm per head
 * before RoPE as in Qwen3. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/codelets.h"
#include "config.h"
#ifdef ST_HAVE_CUDA
#include "codelets/cuda/cuda_codelets.h"
#endif
#include "codelets/dot.h"
#include "codelets/layer_cpu.h"
#include "codelets/quant.h"

void st_rope_neox(float *v, int hd, int pos, float theta) {
  const int half = hd / 2;
  for (int i = 0; i < half; i++) {
    const double freq = pow((double)theta, -2.0 * i / hd);
    const double ang = (double)pos * freq;
    const float c = (float)cos(ang), s = (float)sin(ang);
    const float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * c - x1 * s;
    v[i + half] = x0 * s + x1 * c;
  }
}

void st_attend_head(const float *qh, const float *kc, const float *vc, int n_keys, int hd, float *score, float *o) {
  const float scale = 1.0f / sqrtf((float)hd);
  st_matmul(ST_TYPE_F32, kc, sizeof(float) * (uint64_t)hd, 0, n_keys, qh, hd, 1, hd, score, n_keys);
  float mx = -INFINITY;
  for (int j = 0; j < n_keys; j++) {
    score[j] *= scale;
    mx = fmaxf(mx, score[j]);
  }
  double sum = 0.0;
  for (int j = 0; j < n_keys; j++) {
    score[j] = expf(score[j] - mx);
    sum += score[j];
  }
  const float inv = (float)(1.0 / sum);
  memset(o, 0, sizeof(float) * (size_t)hd);
  for (int j = 0; j < n_keys; j++) {
    const float p = score[j] * inv;
    const float *vj = vc + (size_t)j * hd;
    for (int c = 0; c < hd; c++)
      o[c] += p * vj[c];
  }
}

static void attention_cpu(void *buffers[], void *cl_arg) {
  const struct st_attention_args *a = cl_arg;
  const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
  const float *attn_norm = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
  const void *wq = (const void *)STARPU_VECTOR_GET_PTR(buffers[2]);
  const void *wk = (const void *)STARPU_VECTOR_GET_PTR(buffers[3]);
  const void *wv = (const void *)STARPU_VECTOR_GET_PTR(buffers[4]);
  const float *q_norm = (const float *)STARPU_VECTOR_GET_PTR(buffers[5]);
  const float *k_norm = (const float *)STARPU_VECTOR_GET_PTR(buffers[6]);
  const int T = a->T, d = a->n_embd, hd = a->head_dim, nq = a->n_q, qw = nq * hd;
  const int n_kv_total = a->pos0 + T;

  float *xn = malloc(sizeof(float) * ((size_t)T * d + (size_t)T * qw + (size_t)n_kv_total));
  float *q = xn + (size_t)T * d, *score = q + (size_t)T * qw;
  for (int t = 0; t < T; t++)
    st_rmsnorm(x + (size_t)t * d, attn_norm, xn + (size_t)t * d, d, a->eps);

  void *xq = NULL; /* xn quantised (st_dense_matmul), shared by the groups' Q, K and V products */
  uint32_t xq_type = 0;
  for (int i = 0; i < a->n_groups; i++) {
    const int group = a->group0 + i;
    float *kc = (float *)STARPU_VECTOR_GET_PTR(buffers[7 + 2 * i]);
    float *vc = (float *)STARPU_VECTOR_GET_PTR(buffers[8 + 2 * i]);
    float *out = (float *)STARPU_VECTOR_GET_PTR(buffers[7 + 2 * a->n_groups + i]);
    /* Projections: this group's query rows, and its K and V rows written straight into the cache.
     * Q of a prompt chunk may take int8 activations (st_dense_matmul); K and V keep float32: their
     * rounding stays in the cache for every later token (with int8 K and V the small Q4_K_M
     * fixture's short prompt changed 6 of its 56 expert sets, the test allows 2). */
    st_dense_matmul(a->wq.type, wq, a->wq.row_bytes, (int64_t)group * qw, (int64_t)(group + 1) * qw, xn, d, T, d,
                    q, qw, a->int8_dot, &xq, &xq_type);
    float *kdst = kc + (size_t)a->pos0 * hd, *vdst = vc + (size_t)a->pos0 * hd;
    st_dense_matmul(a->wk.type, wk, a->wk.row_bytes, (int64_t)group * hd, (int64_t)(group + 1) * hd, xn, d, T, d,
                    kdst, hd, 0, &xq, &xq_type);
    st_dense_matmul(a->wv.type, wv, a->wv.row_bytes, (int64_t)group * hd, (int64_t)(group + 1) * hd, xn, d, T, d,
                    vdst, hd, 0, &xq, &xq_type);
    for (int t = 0; t < T; t++) {
      const int pos = a->pos0 + t;
      for (int h = 0; h < nq; h++) {
        float *qh = q + (size_t)t * qw + (size_t)h * hd;
        st_rmsnorm(qh, q_norm, qh, hd, a->eps);
        st_rope_neox(qh, hd, pos, a->rope_theta);
      }
      float *kt = kdst + (size_t)t * hd;
      st_rmsnorm(kt, k_norm, kt, hd, a->eps);
      st_rope_neox(kt, hd, pos, a->rope_theta);
    }

    /* Causal softmax attention: token t sees cache positions 0..pos0+t. */
    for (int t = 0; t < T; t++)
      for (int h = 0; h < nq; h++)
        st_attend_head(q + (size_t)t * qw + (size_t)h * hd, kc, vc, a->pos0 + t + 1, hd, score,
                       out + (size_t)t * qw + (size_t)h * hd);
  }
  free(xq);
  free(xn);
}

static struct starpu_perfmodel attention_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "st_attention",
};

static struct starpu_codelet attention_cl = {
    .cpu_funcs = {attention_cpu},
    .cpu_funcs_name = {"attention_cpu"},
#ifdef ST_HAVE_CUDA
    .cuda_funcs = {st_attention_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &attention_model,
    .name = "attention",
};

int st_submit_attention(const struct st_attention_args *a, starpu_data_handle_t *bufs, struct st_target tgt,
                        const char *name) {
  const int nbufs = 7 + 3 * a->n_groups;
  enum starpu_data_access_mode modes[nbufs];
  for (int i = 0; i < nbufs; i++)
    modes[i] = i < 7 ? STARPU_R : i < 7 + 2 * a->n_groups ? STARPU_RW : STARPU_W;
  return st_submit_task(&attention_cl, bufs, modes, nbufs, a, sizeof *a, tgt, name);
}
