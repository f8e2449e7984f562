/* Attention of GQA groups (each one KV head and its query heads) for a batch of T tokens: the
 * codelet, its CPU variant and the submit wrapper (see codelets.h). RoPE is the NEOX variant
 * (rotate the two halves of each head), as llama.cpp uses for qwen3moe; q/k RMSNorm per head
 * before RoPE as in Qwen3. */
#include <math.h>
#include <stdio.h>
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

void st_rope_table(float *cs, int hd, int pos, float theta) {
  for (int i = 0; i < hd / 2; i++) {
    const double freq = pow((double)theta, -2.0 * i / hd);
    const double ang = (double)pos * freq;
    cs[2 * i] = (float)cos(ang), cs[2 * i + 1] = (float)sin(ang);
  }
}

void st_rope_apply(float *v, int hd, const float *cs) {
  const int half = hd / 2;
  for (int i = 0; i < half; i++) {
    const float c = cs[2 * i], s = cs[2 * i + 1], x0 = v[i], x1 = v[i + half];
    v[i] = x0 * c - x1 * s;
    v[i + half] = x0 * s + x1 * c;
  }
}

void st_rope_neox(float *v, int hd, int pos, float theta) {
  float cs[hd];
  st_rope_table(cs, hd, pos, theta);
  st_rope_apply(v, hd, cs);
}

void st_rope_conf_init(struct st_rope_conf *rc, int n_rot, int neox, float theta, float yarn_factor, int orig_ctx,
                       float beta_fast, float beta_slow, float mscale) {
  *rc = (struct st_rope_conf){.n_rot = n_rot, .neox = neox, .theta = theta, .mscale = mscale, .freq_scale = 1.0f};
  rc->yarn = mscale != 1.0f; /* st_rope_conf_table's general loop scales */
  if (!(yarn_factor > 0.0f)) return;
  /* ggml_rope_yarn_corr_dims: the dims whose wavelength fits beta_fast / beta_slow rotations in
   * the original context, floored and ceiled ("truncate") */
  const double base = theta, nd = n_rot;
  const double c_fast = nd * log(orig_ctx / (beta_fast * 2 * M_PI)) / (2 * log(base));
  const double c_slow = nd * log(orig_ctx / (beta_slow * 2 * M_PI)) / (2 * log(base));
  rc->yarn = 1;
  rc->freq_scale = 1.0f / yarn_factor;
  rc->corr0 = (float)fmax(0.0, floor(c_fast));
  rc->corr1 = (float)fmin(nd - 1, ceil(c_slow));
}

void st_rope_conf_table(float *cs, const struct st_rope_conf *rc, int pos) {
  if (!rc->yarn) {
    st_rope_table(cs, rc->n_rot, pos, rc->theta);
    return;
  }
  for (int i = 0; i < rc->n_rot / 2; i++) {
    const double extrap = (double)pos * pow((double)rc->theta, -2.0 * i / rc->n_rot);
    const double interp = rc->freq_scale * extrap;
    const double y = (i - rc->corr0) / fmax(0.001, (double)rc->corr1 - rc->corr0);
    /* 1: extrapolate (high frequencies); no YaRN: freq_scale 1, both angles equal */
    const double mix = rc->freq_scale == 1.0f ? 1.0 : 1.0 - fmin(1.0, fmax(0.0, y));
    const double ang = interp * (1.0 - mix) + extrap * mix;
    cs[2 * i] = (float)(cos(ang) * rc->mscale), cs[2 * i + 1] = (float)(sin(ang) * rc->mscale);
  }
}

void st_rope_conf_apply(float *v, const struct st_rope_conf *rc, const float *cs) {
  if (rc->neox) {
    st_rope_apply(v, rc->n_rot, cs);
    return;
  }
  for (int i = 0; i < rc->n_rot / 2; i++) {
    const float c = cs[2 * i], s = cs[2 * i + 1], x0 = v[2 * i], x1 = v[2 * i + 1];
    v[2 * i] = x0 * c - x1 * s;
    v[2 * i + 1] = x0 * s + x1 * c;
  }
}

/* Softmax of n scores in place, scaled by `scale` first (sum in double); returns 1 / the sum:
 * p_j = s[j] * the returned factor. A sink (not NaN) is one more logit in the denominator only. */
static float softmax_row(float *s, int n, float scale, float sink) {
  float mx = -INFINITY;
  for (int j = 0; j < n; j++) {
    s[j] *= scale;
    mx = fmaxf(mx, s[j]);
  }
  if (sink == sink) mx = fmaxf(mx, sink);
  double sum = 0.0;
  for (int j = 0; j < n; j++) {
    s[j] = expf(s[j] - mx);
    sum += s[j];
  }
  if (sink == sink) sum += expf(sink - mx);
  return (float)(1.0 / sum);
}

uint64_t st_kv_row_bytes(int kv_type, int hd) {
  if (kv_type == ST_TYPE_Q8_0) return (uint64_t)hd + (uint64_t)(hd / 32) * 2;
  return (uint64_t)hd * (kv_type == ST_TYPE_F16 ? 2 : 4);
}

void st_kv_store(int kv_type, const float *x, void *row, int64_t n, int hd) {
  if (kv_type == ST_TYPE_Q8_0) { /* per row: the quants, then the scales (ggml's Q8_0 arithmetic per 32) */
    const uint64_t rb = st_kv_row_bytes(kv_type, hd);
    for (int64_t r = 0; r < n / hd; r++) {
      uint8_t *dst = (uint8_t *)row + (uint64_t)r * rb;
      for (int b = 0; b < hd / 32; b++) {
        st_block_q8_0 blk;
        st_quantize_row_q8_0(x + r * hd + 32 * b, &blk, 32);
        memcpy(dst + 32 * b, blk.qs, 32);
        memcpy(dst + hd + 2 * b, &blk.d, 2);
      }
    }
  } else if (kv_type == ST_TYPE_F16) {
    st_quantize_row(ST_TYPE_F16, x, row, n);
  } else if ((const void *)x != row) {
    memcpy(row, x, sizeof(float) * (size_t)n);
  }
}

void st_kv_load(int kv_type, const void *row, float *x, int64_t n, int hd) {
  if (kv_type == ST_TYPE_Q8_0) {
    const uint64_t rb = st_kv_row_bytes(kv_type, hd);
    for (int64_t r = 0; r < n / hd; r++) {
      const uint8_t *src = (const uint8_t *)row + (uint64_t)r * rb;
      for (int i = 0; i < hd; i++) {
        uint16_t d;
        memcpy(&d, src + hd + 2 * (i / 32), 2);
        x[r * hd + i] = st_fp16_to_f32(d) * (float)(int8_t)src[i];
      }
    }
  } else {
    st_dequantize_row((uint32_t)kv_type, row, x, n);
  }
}

/* o += p v for one V row of kv_type (its first hv values; a q8_0 row of v_row values keeps its
 * scales after them): every level's bits are the plain loop's. */
static void axpy_kv(int kv_type, float *o, float p, const void *v, int hv, int v_row) {
  if (kv_type == ST_TYPE_F16) st_axpy_f16(o, p, v, hv);
  else if (kv_type == ST_TYPE_Q8_0) st_axpy_kv_q8(o, p, v, (const uint16_t *)((const uint8_t *)v + v_row), hv);
  else st_axpy(o, p, v, hv);
}

/* Scores of `rows` query rows (q, hd apart) against n keys of the cache from kc (rows rb bytes apart)
 * into score (rows nks apart). */
static void kv_scores(int kv_type, const void *kc, uint64_t rb, int n, const float *q, int hd, int rows, float *score,
                      int nks) {
  if (kv_type == ST_TYPE_Q8_0) st_kv_q8_scores(kc, rb, n, q, hd, rows, hd, score, nks);
  else st_matmul((uint32_t)kv_type, kc, rb, 0, n, q, hd, rows, hd, score, nks);
}

void st_attend_tokens_conf(const float *q, int T, int nq, int hd, int pos0, int kv_type, const void *kc, const void *vc,
                           float *out, float *score, int64_t score_floats, const struct st_attn_conf *ac) {
  const float scale = ac->scale;
  const int hv = ac->hd_v, W = ac->window;
  const uint64_t rb = st_kv_row_bytes(kv_type, hd), vb = st_kv_row_bytes(kv_type, ac->v_row);
  for (int t0 = 0; t0 < T;) {
    int tt = T - t0; /* the tile's tokens: as many as their scores fit (at least one) */
    /* keys from j0 (the first the tile's first token sees) to nk (its last token's) */
    int j0 = W > 0 && pos0 + t0 - W + 1 > 0 ? pos0 + t0 - W + 1 : 0;
    while (tt > 1 && (int64_t)tt * nq * (pos0 + t0 + tt - j0) > score_floats) tt = (tt + 1) / 2;
    const int nk = pos0 + t0 + tt, rows = tt * nq, nks = nk - j0; /* keys of the tile's last token; (token, head) rows */
    /* every row's scores over keys j0 .. nk: a row's value per key does not depend on the call's
     * shape (st_matmul), the keys past a row's own are not read below */
    /* a ring buffer's keys may wrap: its rows j0 % ring .. ring, then 0 .. (the same per-key values) */
    const int ring = ac->ring > 0 ? ac->ring : nk, r0 = j0 % ring, first_part = r0 + nks > ring ? ring - r0 : nks;
    kv_scores(kv_type, (const uint8_t *)kc + (size_t)r0 * rb, rb, first_part, q + (size_t)t0 * nq * hd, hd, rows, score, nks);
    if (first_part < nks)
      kv_scores(kv_type, kc, rb, nks - first_part, q + (size_t)t0 * nq * hd, hd, rows, score + first_part, nks);
    float inv[rows];
    int first[rows]; /* each row's first visible key, from j0 */
    for (int r = 0; r < rows; r++) {
      const int pos = pos0 + t0 + r / nq;
      first[r] = W > 0 && pos - W + 1 > j0 ? pos - W + 1 - j0 : 0;
      inv[r] = softmax_row(score + (size_t)r * nks + first[r], pos + 1 - j0 - first[r], scale,
                           ac->sinks ? ac->sinks[r % nq] : NAN);
    }
    float *o = out + (size_t)t0 * nq * hv;
    memset(o, 0, sizeof(float) * (size_t)rows * hv);
    /* P V in key order for each row, every V row read once for the tile */
    for (int j = j0; j < nk; j++) {
      const void *vj = (const uint8_t *)vc + (size_t)(j % ring) * vb;
      for (int r = (j > pos0 + t0 ? j - pos0 - t0 : 0) * nq; r < rows; r++) {
        if (j - j0 < first[r]) continue;
        const float p = score[(size_t)r * nks + (j - j0)] * inv[r];
        axpy_kv(kv_type, o + (size_t)r * hv, p, vj, hv, ac->v_row);
      }
    }
    t0 += tt;
  }
}

void st_attend_tokens(const float *q, int T, int nq, int hd, int pos0, int kv_type, const void *kc, const void *vc,
                      float *out, float *score, int64_t score_floats) {
  const struct st_attn_conf ac = {1.0f / sqrtf((float)hd), hd, hd, NULL, 0, 0};
  st_attend_tokens_conf(q, T, nq, hd, pos0, kv_type, kc, vc, out, score, score_floats, &ac);
}

void st_attend_head(const float *qh, int kv_type, const void *kc, const void *vc, int n_keys, int hd, float *score,
                    float *o) {
  st_attend_tokens(qh, 1, 1, hd, n_keys - 1, kv_type, kc, vc, o, score, n_keys);
}

/* xn's int8 rows for a task's Q, K and V products: st_dense_act's layout `type` (ST_TYPE_COUNT: none),
 * T first-term rows, then, when a product takes two terms, T second-term rows (rb bytes each). */
struct xn_q8 {
  uint32_t type;
  uint64_t rb;
  uint8_t *q;
};

/* Quantises the T rows of xn [T][d] for the task's products. A CPU codelet has no error path: out
 * of memory aborts with a message. */
static struct xn_q8 xn_quantize(const struct st_attention_args *a, const float *xn, int T, int d) {
  const uint32_t types[3] = {a->wq.type, a->wk.type, a->wv.type};
  const int kinds[3] = {ST_DENSE_QO, ST_DENSE_KV, ST_DENSE_KV};
  int two;
  struct xn_q8 z = {st_dense_act(3, types, kinds, d, a->int8_dot, &two), 0, NULL};
  z.rb = st_q8_row_bytes(z.type, d);
  if (!z.rb) return z;
  z.q = malloc((size_t)z.rb * (size_t)T * (two ? 2 : 1));
  if (!z.q) {
    fprintf(stderr, "strata: out of memory in the attention task (%d tokens)\n", T);
    abort();
  }
  st_quantize_act(z.type, xn, d, T, d, z.q);
  if (two) st_quantize_act_residual(z.type, xn, d, T, d, z.q, z.q + z.rb * (uint64_t)T);
  return z;
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

  /* scores of a tile of (token, head) rows (st_attend_tokens): up to 4 MiB, at least one token's */
  const int64_t all_scores = (int64_t)T * nq * n_kv_total;
  /* st_attend_tokens tiles down to one token, whose nq rows of scores must fit */
  const int64_t one_token = (int64_t)nq * n_kv_total;
  const int64_t n_score = all_scores < ((int64_t)1 << 20) ? all_scores : one_token > ((int64_t)1 << 20) ? one_token : (int64_t)1 << 20;
  const int rounded = a->kv_type != ST_TYPE_F32; /* new rows computed in float32, then stored */
  float *xn = malloc(sizeof(float) * ((size_t)T * d + (size_t)T * qw + (size_t)n_score + (size_t)T * hd +
                                      (rounded ? 2 * (size_t)T * hd : 0)));
  if (!xn) { /* a CPU codelet has no error path: say what failed rather than crash on NULL */
    fprintf(stderr, "strata: out of memory in the attention task (%d tokens, %d keys)\n", T, n_kv_total);
    abort();
  }
  float *q = xn + (size_t)T * d, *score = q + (size_t)T * qw, *rope = score + n_score;
  float *knew = rope + (size_t)T * hd, *vnew = knew + (size_t)T * hd; /* a half or q8_0 cache's new rows in float32 */
  for (int t = 0; t < T; t++)
    st_rmsnorm(x + (size_t)t * d, attn_norm, xn + (size_t)t * d, d, a->eps);

  const struct xn_q8 z = xn_quantize(a, xn, T, d); /* shared by the groups' products */
  const uint8_t *zr = z.q ? z.q + z.rb * (uint64_t)T : NULL;
  for (int i = 0; i < a->n_groups; i++) {
    const int group = a->group0 + i;
    uint8_t *kc = (uint8_t *)STARPU_VECTOR_GET_PTR(buffers[7 + 2 * i]);
    uint8_t *vc = (uint8_t *)STARPU_VECTOR_GET_PTR(buffers[8 + 2 * i]);
    const uint64_t rb = st_kv_row_bytes(a->kv_type, hd);
    float *out = (float *)STARPU_VECTOR_GET_PTR(buffers[7 + 2 * a->n_groups + i]);
    /* Projections: this group's query rows, and its K and V rows written straight into the cache,
     * each on the activations st_dense_terms gives it. K and V take two terms where they take int8
     * ones: their rounding stays in the cache for every later token (with one-term int8 K and V the
     * small Q4_K_M fixture's short prompt changed 6 of its 56 expert sets, the test allows 2); a
     * half or q8_0 cache gets them rounded after the norm and RoPE. */
    st_dense_rows(st_dense_terms_on(z.type, a->wq.type, d, a->int8_dot, ST_DENSE_QO), a->wq.type, wq, a->wq.row_bytes,
                  (int64_t)group * qw, (int64_t)(group + 1) * qw, xn, d, z.q, zr, T, d, q, qw);
    float *kdst = rounded ? knew : (float *)(kc + (size_t)a->pos0 * rb), *vdst = rounded ? vnew : (float *)(vc + (size_t)a->pos0 * rb);
    const struct st_wdesc *kvd[2] = {&a->wk, &a->wv};
    const void *kvw[2] = {wk, wv};
    float *kvdst[2] = {kdst, vdst};
    for (int j = 0; j < 2; j++)
      st_dense_rows(st_dense_terms_on(z.type, kvd[j]->type, d, a->int8_dot, ST_DENSE_KV), kvd[j]->type, kvw[j], kvd[j]->row_bytes,
                    (int64_t)group * hd, (int64_t)group * hd + hd, xn, d, z.q, zr, T, d, kvdst[j], hd);
    for (int t = 0; t < T; t++) {
      float *cs = rope + (size_t)t * hd; /* token t's (cos, sin) pairs, shared by its heads */
      if (i == 0) st_rope_table(cs, hd, a->pos0 + t, a->rope_theta);
      for (int h = 0; h < nq; h++) {
        float *qh = q + (size_t)t * qw + (size_t)h * hd;
        st_rmsnorm(qh, q_norm, qh, hd, a->eps);
        st_rope_apply(qh, hd, cs);
      }
      float *kt = kdst + (size_t)t * hd;
      st_rmsnorm(kt, k_norm, kt, hd, a->eps);
      st_rope_apply(kt, hd, cs);
    }
    if (rounded) {
      st_kv_store(a->kv_type, kdst, kc + (size_t)a->pos0 * rb, (int64_t)T * hd, hd);
      st_kv_store(a->kv_type, vdst, vc + (size_t)a->pos0 * rb, (int64_t)T * hd, hd);
    }

    /* Causal softmax attention: token t sees cache positions 0..pos0+t. */
    st_attend_tokens(q, T, nq, hd, a->pos0, a->kv_type, kc, vc, out, score, n_score);
  }
  free(z.q);
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
