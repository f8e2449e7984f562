// Multi-head Latent Attention on the decode step's GPU layer (issue #24: deepseek2), in the absorbed
// form the CPU's lanes compute (decode_lane.c item_mla_norm, mla_query, item_attn):
//   - the cache holds one row a token of hd = kv_lora + n_rot values: the latent c (kv_a_mqa's
//     first kv_lora outputs, RMS-normed by kv_a_norm) and the key's rope part k_pe (its last n_rot,
//     roped); every head attends to the same rows;
//   - head h's query against those rows is qm[h] = [k_b[h] q_nope[h], rope(q_pe[h])] (k_b[h]: kv_lora
//     rows of qk_nope weights), so a score is scale * qm[h] . row;
//   - the output olat[h] = sum_j p_j c_j (the rows' first kv_lora values), then attn[h] = v_b[h]
//     olat[h] (v_b[h]: hv rows of kv_lora weights), the output projection's input.
// RoPE is the normal (adjacent-pair) rotation with the host's table (st_rope_conf_table: row pos of
// hd floats, (cos, sin) of pair i at 2i, 2i + 1). The attention is split over chunks of MLA_CHUNK
// keys (a block each: its max, its sum of e^(s - max) and its weighted rows), merged per head by one
// block in chunk order: the bits depend on the position and the shapes only. k_b and v_b are read
// one element at a time (st_dev_weight: any block format); float32 activations throughout.
#pragma once

#include <type_traits>

#include "codelets/cuda/common.cuh"

#define MLA_CHUNK 128   /* keys of an attention block */
#define MLA_THREADS 256 /* threads of every MLA kernel's block (8 warps) */

// Floats of the attention's partials for n_head heads over a context of n_ctx rows (kv_lora
// values each): per (head, chunk) the max, the sum and kv_lora weighted values.
static inline size_t mla_part_floats(int n_ctx, int n_head, int kv_lora) {
  return (size_t)n_head * (size_t)((n_ctx + MLA_CHUNK - 1) / MLA_CHUNK) * (size_t)(kv_lora + 2);
}

template <typename KT> __device__ __forceinline__ float mla_load(const KT *p) {
  if constexpr (std::is_same<KT, float>::value) return *p;
  else return __half2float(*p);
}
template <typename KT> __device__ __forceinline__ KT mla_store(float v) {
  if constexpr (std::is_same<KT, float>::value) return v;
  else return __float2half_rn(v);
}

// x[0..n) = RMSNorm(x) * w in place, as st_rmsnorm: the mean of squares, 1 / sqrt(mean + eps).
// One block (its threads call it).
__device__ __forceinline__ void mla_rmsnorm_block(float *x, const float *w, int n, float eps, float *red) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
  const float sum = st_block_sum(ss, red);
  const float scale = 1.0f / sqrtf(sum / (float)n + eps);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = x[i] * scale * w[i];
  __syncthreads();
}

// The q LoRA's output qa[0..n) RMS-normed by w in place. One block.
static __global__ void __launch_bounds__(MLA_THREADS) dk_mla_qnorm(float *qa, const float *w, int n, float eps) {
  __shared__ float red[32];
  mla_rmsnorm_block(qa, w, n, eps, red);
}

// Blocks 0..n_head-1: head h's query qm[h] (hd floats) from q[h] (qk_nope + n_rot floats): the rope
// part roped, the no-rope part through k_b[h] (one warp a row). Block n_head: the token's cache row
// from kvnew (hd floats): the latent RMS-normed by kv_norm, the rope part roped, stored as KT at row
// pos % kv_rows of `cache`. pos: the step's position in device memory.
template <typename KT>
__global__ void __launch_bounds__(MLA_THREADS)
    dk_mla_prep(const float *q, int n_head, int qk_nope, int n_rot, int kv_lora, int hd, const float *rope,
                const int32_t *pos_p, uint32_t kb_type, const uint8_t *kb, uint64_t kb_row_bytes, float *qm,
                float *kvnew, const float *kv_norm, float eps, KT *cache, int kv_rows) {
  __shared__ float red[32];
  const int pos = *pos_p;
  const float *cs = rope + (size_t)pos * hd;
  if ((int)blockIdx.x == n_head) {
    mla_rmsnorm_block(kvnew, kv_norm, kv_lora, eps, red);
    KT *row = cache + (size_t)(pos % kv_rows) * hd;
    for (int i = threadIdx.x; i < kv_lora; i += blockDim.x) row[i] = mla_store<KT>(kvnew[i]);
    for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
      const float c = cs[2 * i], s = cs[2 * i + 1], x0 = kvnew[kv_lora + 2 * i], x1 = kvnew[kv_lora + 2 * i + 1];
      row[kv_lora + 2 * i] = mla_store<KT>(x0 * c - x1 * s);
      row[kv_lora + 2 * i + 1] = mla_store<KT>(x0 * s + x1 * c);
    }
    return;
  }
  const int h = blockIdx.x, qk = qk_nope + n_rot;
  const float *qh = q + (size_t)h * qk;
  float *out = qm + (size_t)h * hd;
  for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
    const float c = cs[2 * i], s = cs[2 * i + 1], x0 = qh[qk_nope + 2 * i], x1 = qh[qk_nope + 2 * i + 1];
    out[kv_lora + 2 * i] = x0 * c - x1 * s;
    out[kv_lora + 2 * i + 1] = x0 * s + x1 * c;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int r = warp; r < kv_lora; r += warps) {
    const uint8_t *w = kb + (size_t)((int64_t)h * kv_lora + r) * kb_row_bytes;
    float acc = 0.0f;
    for (int j = lane; j < qk_nope; j += 32) acc = fmaf(st_dev_weight(kb_type, w, j), qh[j], acc);
    acc = st_warp_sum(acc);
    if (lane == 0) out[r] = acc;
  }
}

// Block (h, c): keys c MLA_CHUNK .. of the pos + 1 cached rows against qm[h]: scores (one warp a
// key), their max m, p_j = e^(s_j - m), l = sum p_j, and O = sum p_j c_j (one thread a latent
// value), to part[(h n_chunks + c) (kv_lora + 2) ..]: m, l, O. A chunk past the keys writes nothing.
// Dynamic shared memory: hd + MLA_CHUNK floats.
template <typename KT>
__global__ void __launch_bounds__(MLA_THREADS)
    dk_mla_attend(const float *qm, int hd, int kv_lora, const KT *cache, const int32_t *pos_p, float scale, float *part,
                  int n_chunks) {
  extern __shared__ float sm[];
  __shared__ float red[32];
  float *qs = sm, *p = sm + hd;
  const int h = blockIdx.x, c = blockIdx.y, n_keys = *pos_p + 1, j0 = c * MLA_CHUNK;
  if (j0 >= n_keys) return;
  const int nj = min(MLA_CHUNK, n_keys - j0);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qm[(size_t)h * hd + i];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int jj = warp; jj < nj; jj += warps) {
    const KT *row = cache + (size_t)(j0 + jj) * hd;
    float acc = 0.0f;
    for (int i = lane; i < hd; i += 32) acc = fmaf(qs[i], mla_load<KT>(row + i), acc);
    acc = st_warp_sum(acc);
    if (lane == 0) p[jj] = acc * scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int jj = threadIdx.x; jj < nj; jj += blockDim.x) mx = fmaxf(mx, p[jj]);
  mx = st_block_max(mx, red);
  __syncthreads();
  float ls = 0.0f;
  for (int jj = threadIdx.x; jj < nj; jj += blockDim.x) {
    const float e = expf(p[jj] - mx);
    p[jj] = e;
    ls += e;
  }
  ls = st_block_sum(ls, red);
  __syncthreads();
  float *out = part + ((size_t)h * n_chunks + c) * (size_t)(kv_lora + 2);
  if (threadIdx.x == 0) out[0] = mx, out[1] = ls;
  for (int i = threadIdx.x; i < kv_lora; i += blockDim.x) {
    float acc = 0.0f;
    for (int jj = 0; jj < nj; jj++) acc = fmaf(p[jj], mla_load<KT>(cache + (size_t)(j0 + jj) * hd + i), acc);
    out[2 + i] = acc;
  }
}

// Block h: head h's chunks merged in chunk order: M = max m_c, L = sum l_c e^(m_c - M), olat[h][i] =
// sum O_c[i] e^(m_c - M) / L.
static __global__ void __launch_bounds__(MLA_THREADS)
    dk_mla_merge(const float *part, int n_chunks, int kv_lora, const int32_t *pos_p, float *olat) {
  const int h = blockIdx.x, used = (*pos_p + MLA_CHUNK) / MLA_CHUNK; // chunks holding a key
  const float *base = part + (size_t)h * n_chunks * (size_t)(kv_lora + 2);
  float M = -INFINITY;
  for (int c = 0; c < used; c++) M = fmaxf(M, base[(size_t)c * (kv_lora + 2)]);
  float L = 0.0f;
  for (int c = 0; c < used; c++) L += base[(size_t)c * (kv_lora + 2) + 1] * expf(base[(size_t)c * (kv_lora + 2)] - M);
  for (int i = threadIdx.x; i < kv_lora; i += blockDim.x) {
    float acc = 0.0f;
    for (int c = 0; c < used; c++) {
      const float *pc = base + (size_t)c * (kv_lora + 2);
      acc = fmaf(pc[2 + i], expf(pc[0] - M), acc);
    }
    olat[(size_t)h * kv_lora + i] = acc / L;
  }
}

// Block h: attn[h][r] = v_b[h] row r . olat[h] for r < hv (one warp a row); outq (hv a multiple of
// 32): head h quantised there too (st_dev_q8_span, a row of gridDim.x hv floats).
static __global__ void __launch_bounds__(MLA_THREADS)
    dk_mla_vb(const float *olat, int kv_lora, uint32_t vb_type, const uint8_t *vb, uint64_t vb_row_bytes, int hv,
              float *attn, int8_t *outq) {
  const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const float *x = olat + (size_t)h * kv_lora;
  for (int r = warp; r < hv; r += warps) {
    const uint8_t *w = vb + (size_t)((int64_t)h * hv + r) * vb_row_bytes;
    float acc = 0.0f;
    for (int j = lane; j < kv_lora; j += 32) acc = fmaf(st_dev_weight(vb_type, w, j), x[j], acc);
    acc = st_warp_sum(acc);
    if (lane == 0) attn[(size_t)h * hv + r] = acc;
  }
  if (!outq) return;
  __syncthreads(); // the head's rows are in attn
  st_dev_q8_span(attn, (int64_t)h * hv, hv, (int64_t)gridDim.x * hv, outq);
}

// For tests (st_cuda_mla_check): n floats into a cache of KT, and back.
template <typename KT> __global__ void dk_mla_store(const float *x, int64_t n, KT *out) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = mla_store<KT>(x[i]);
}
template <typename KT> __global__ void dk_mla_load(const KT *x, int64_t n, float *out) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = mla_load<KT>(x + i);
}
