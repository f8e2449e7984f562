// CUDA variant of the attention codelet (codelets.h): RMSNorm, the group's Q/K/V projections
// (K and V written straight into the KV cache kept on the device; through cuBLAS for prompt
// chunks of at least cublas_rows tokens, gemm.cu), q/k RMSNorm and NEOX RoPE per
// head, then causal attention: one query at a time split over the keys for decode (T = 1, see
// attend_partial), a tiled flash-attention kernel for prompt chunks (T > 1, see attend_flash).
#include <math.h>

#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"


// q/k RMSNorm over head_dim and NEOX RoPE at position pos of one head, in (hd floats) to out (may
// alias in); a block of threads shares the head.
__device__ __forceinline__ static void norm_rope_head(const float *in, float *out, int hd, const float *w, float eps,
                                                      int pos, float theta, float *red) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hd; i += blockDim.x)
    ss += in[i] * in[i];
  ss = st_block_sum(ss, red);
  const float scale = rsqrtf(ss / (float)hd + eps);
  __syncthreads();
  const int half = hd / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double ang = (double)pos * pow((double)theta, -2.0 * i / hd);
    const float c = (float)cos(ang), s = (float)sin(ang);
    const float x0 = in[i] * scale * w[i], x1 = in[i + half] * scale * w[i + half];
    out[i] = x0 * c - x1 * s;
    out[i + half] = x0 * s + x1 * c;
  }
}

// q/k RMSNorm and RoPE in place at position pos0 + t; one block per (t, head).
__global__ static void qk_norm_rope(float *v, int64_t ld, int hd, const float *w, float eps, int pos0, float theta) {
  __shared__ float red[32];
  float *h = v + (int64_t)blockIdx.x * ld + (int64_t)blockIdx.y * hd;
  norm_rope_head(h, h, hd, w, eps, pos0 + blockIdx.x, theta, red);
}

// The decode step's q/k norm, RoPE and KV append in one launch: block h < Hq takes query head h in
// place (as qk_norm_rope); block Hq + g takes KV head g's new K row (kvnew[g hd ..], before its
// norm) and V row (kvnew[(G + g) hd ..]), writes K normed and rotated at position *pos of its cache
// and V there as it is.
struct kv_ptrs {
  float *k[ST_CUDA_MAX_KV_HEADS], *v[ST_CUDA_MAX_KV_HEADS];
};
__global__ static void rope_append(float *q, int Hq, const float *kvnew, int G, int hd, const float *qw,
                                   const float *kw, float eps, const int *pos_dev, float theta,
                                   const __grid_constant__ kv_ptrs kv) {
  __shared__ float red[32];
  st_dev_griddep_launch();
  st_dev_griddep_wait();
  const int b = blockIdx.x, pos = *pos_dev;
  if (b < Hq) {
    float *h = q + (int64_t)b * hd;
    norm_rope_head(h, h, hd, qw, eps, pos, theta, red);
    return;
  }
  const int g = b - Hq;
  norm_rope_head(kvnew + (int64_t)g * hd, kv.k[g] + (int64_t)pos * hd, hd, kw, eps, pos, theta, red);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) kv.v[g][(int64_t)pos * hd + i] = kvnew[(int64_t)(G + g) * hd + i];
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

// One block's partial of attend_partial: the query qh over keys [c KEY_CHUNK, (c + 1) KEY_CHUNK) ∩
// [0, n_keys) of kc, vc, written to out ((max, sum, hd weighted values); (-inf, 0) for no key).
__device__ __forceinline__ static void attend_partial_block(const float *qh, const float *kc, const float *vc, int hd,
                                                            int n_keys, int c, float scale, float *out) {
  __shared__ float wm[WARPS], wl[WARPS], wacc[WARPS][256];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int start = c * KEY_CHUNK, end = min(start + KEY_CHUNK, n_keys);
  if (start >= n_keys) {
    if (threadIdx.x == 0) out[0] = -INFINITY, out[1] = 0.0f;
    return;
  }
  const int nd = (hd + 31) / 32;
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

__global__ static void attend_partial(const float *q, int64_t ldq, const float *kc, const float *vc, int hd,
                                      int pos0, float scale, int n_chunks, float *part) {
  const int t = blockIdx.x, h = blockIdx.y, c = blockIdx.z;
  attend_partial_block(q + (int64_t)t * ldq + (int64_t)h * hd, kc, vc, hd, pos0 + t + 1, c, scale,
                       part + (((int64_t)t * gridDim.y + h) * n_chunks + c) * (hd + 2));
}

// Merges `used` chunk partials p (attend_partial's layout) of one query row in chunk order into o:
// out = sum_c A_c e^(M_c - M) / sum_c L_c e^(M_c - M). Loads bypass L1 (another block of the same
// kernel may have written p).
__device__ __forceinline__ static void attend_merge(const float *p, int used, int hd, float *o) {
  float M = -INFINITY;
  for (int c = 0; c < used; c++) M = fmaxf(M, __ldcg(p + (int64_t)c * (hd + 2)));
  for (int dd = threadIdx.x; dd < hd; dd += blockDim.x) {
    float a = 0.0f, L = 0.0f;
    for (int c = 0; c < used; c++) {
      const float *pc = p + (int64_t)c * (hd + 2), f = expf(__ldcg(pc) - M);
      a += __ldcg(pc + 2 + dd) * f;
      L += __ldcg(pc + 1) * f;
    }
    o[dd] = a / L;
  }
}

// Merges the chunks of (t, h) in chunk order (attend_merge).
// Chunks of `chunk` keys: KEY_CHUNK from attend_partial, flash_chunk's from attend_flash.
__global__ static void attend_combine(const float *part, int n_chunks, int chunk, int hd, int pos0, float *out,
                                      int64_t ldo) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int used = (pos0 + t + 1 + chunk - 1) / chunk;
  attend_merge(part + ((int64_t)t * gridDim.y + h) * n_chunks * (hd + 2), used, hd,
               out + (int64_t)t * ldo + (int64_t)h * hd);
}

// The decode step's attention of one token over every query head in one launch: block (h, c) is
// attend_partial's block for query head h (KV head h / nq) and chunk c; the last block of a head to
// finish (counters[h], reset by it) merges the head's chunks as attend_combine does.
__global__ static void attend_decode_all(const float *q, int nq, int hd, const __grid_constant__ kv_ptrs kv,
                                         const int *pos_dev, float scale, float *part, int *counters, float *out) {
  __shared__ int last;
  st_dev_griddep_launch();
  st_dev_griddep_wait();
  const int h = blockIdx.y, c = blockIdx.z, n_chunks = gridDim.z, n_keys = *pos_dev + 1, g = h / nq;
  float *ph = part + (int64_t)h * n_chunks * (hd + 2);
  attend_partial_block(q + (int64_t)h * hd, kv.k[g], kv.v[g], hd, n_keys, c, scale, ph + (int64_t)c * (hd + 2));
  __threadfence(); // each writer's partial is visible device-wide before the block counts itself done
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(&counters[h], 1) == n_chunks - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  attend_merge(ph, (n_keys + KEY_CHUNK - 1) / KEY_CHUNK, hd, out + (int64_t)h * hd);
  if (threadIdx.x == 0) counters[h] = 0;
}

// Causal attention of a prompt chunk (T > 1), tiled as in FlashAttention-2 (Dao, 2023), in
// float32 on the CUDA cores. The group's T x n_q queries are rows r = t * n_q + h (q's layout);
// block (b, c) takes rows [b * FA_ROWS, (b + 1) * FA_ROWS) over the keys [c * chunk, (c + 1) * chunk)
// that its last token sees. Each tile of FA_KEYS keys is read once into shared memory and serves
// all the block's rows (attend_partial reads every key once per query and pays a warp reduction
// per key): S = Q K^T over slices of FA_DK head dimensions, each row's online softmax, then
// O += P V over slices of the tile's values. Warp w owns rows 8w..8w+7; lane l owns keys l and
// l + 32 of S and head dimensions 4g..4g+3 (g = l + 32n) of O, so a row's max and sum are
// reductions inside one warp. With one chunk the block writes the output itself; otherwise its
// partials (attend_partial's layout) go to attend_combine. Fixed summation order, no atomics.
#define FA_ROWS 64                    /* query rows of a block */
#define FA_KEYS 64                    /* keys of a tile */
#define FA_DK 32                      /* head dimensions of a Q and K slice */
#define FA_LD (FA_DK + 4)             /* padded slice row: a float4 phase's 8 lanes hit distinct banks */
#define FA_THREADS 256                /* 8 warps */
#define FA_RW (FA_ROWS / (FA_THREADS / 32)) /* rows of a warp */
#define FA_BUF (2 * FA_ROWS * FA_LD)  /* floats of the Q and K slices, reused for the V slices */
#define FA_MAX_BLOCKS 2048            /* split the keys no further than this many blocks */
static_assert(FA_KEYS == 64 && FA_RW == 8, "attend_flash: a lane owns 2 keys of a tile, a warp 8 rows");
static_assert(sizeof(float) * (FA_BUF + FA_ROWS * FA_KEYS) <= 48 * 1024, "attend_flash: static shared memory");

__device__ __forceinline__ float fa_at(const float4 &v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// NV: float4 groups of head dimensions per lane (1: head_dim <= 128, 2: <= 256).
template <int NV>
__global__ static void __launch_bounds__(FA_THREADS, 2)
    attend_flash(const float *q, int64_t ldq, const float *kc, const float *vc, int hd, int nq, int T, int pos0,
                 float scale, int chunk, float *part, float *out, int64_t ldo) {
  __shared__ __align__(16) float buf[FA_BUF];           // Q and K slices, then V slices
  __shared__ __align__(16) float ps[FA_ROWS * FA_KEYS]; // P of the tile; a warp reads only its own rows
  __shared__ float rm[FA_ROWS], rl[FA_ROWS]; // each row's running max and sum (registers are short)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = T * nq, row0 = blockIdx.x * FA_ROWS, c = blockIdx.y, n_split = gridDim.y;
  const int kbeg = c * chunk, kend = min(kbeg + chunk, pos0 + (min(row0 + FA_ROWS, rows) - 1) / nq + 1);
  if (kbeg >= kend) return; // the chunk starts after the block's last token: no partial is read
  float *qs = buf, *ks = buf + FA_ROWS * FA_LD, *vs = buf;
  int vk = FA_KEYS; // keys of a V slice: as many as buf holds, a power of two so slices tile the tile
  while (vk * hd > FA_BUF) vk >>= 1;
  const int hd4 = hd / 4;
  constexpr int d_unroll = NV == 1 ? FA_DK / 4 : 1; // NV = 2: 128 registers leave no room for unrolled loads
  const int wrow0 = row0 + warp * FA_RW; // the warp's first row
  float acc[FA_RW][NV][4];
#pragma unroll
  for (int i = 0; i < FA_RW; i++) {
    if (lane == 0) rm[warp * FA_RW + i] = -INFINITY, rl[warp * FA_RW + i] = 0.0f;
#pragma unroll
    for (int n = 0; n < NV; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][n][e] = 0.0f;
  }
  for (int k0 = kbeg; k0 < kend; k0 += FA_KEYS) {
    float s[FA_RW][2];
#pragma unroll
    for (int i = 0; i < FA_RW; i++) s[i][0] = s[i][1] = 0.0f;
    for (int d0 = 0; d0 < hd; d0 += FA_DK) {
      __syncthreads(); // every warp is done with buf (the previous slice, or the previous tile's V)
      for (int e = threadIdx.x; e < FA_ROWS * FA_DK / 4; e += FA_THREADS) {
        const int r = e / (FA_DK / 4), d = d0 + 4 * (e % (FA_DK / 4)), row = row0 + r, key = k0 + r;
        float4 qv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), kv = qv; // zeros past hd, T x n_q or the keys
        if (row < rows && d < hd) qv = *(const float4 *)(q + (int64_t)(row / nq) * ldq + (int64_t)(row % nq) * hd + d);
        if (key < kend && d < hd) kv = *(const float4 *)(kc + (int64_t)key * hd + d);
        *(float4 *)(qs + r * FA_LD + d - d0) = qv;
        *(float4 *)(ks + r * FA_LD + d - d0) = kv;
      }
      __syncthreads();
      float sd[FA_RW][2]; // the slice's own sums: chains of FA_DK terms, not head_dim (float32 rounding)
#pragma unroll
      for (int i = 0; i < FA_RW; i++) sd[i][0] = sd[i][1] = 0.0f;
#pragma unroll d_unroll
      for (int d = 0; d < FA_DK; d += 4) {
        const float4 ka = *(const float4 *)(ks + lane * FA_LD + d);
        const float4 kb = *(const float4 *)(ks + (lane + 32) * FA_LD + d);
#pragma unroll
        for (int i = 0; i < FA_RW; i++) {
          const float4 qv = *(const float4 *)(qs + (warp * FA_RW + i) * FA_LD + d); // one address: a broadcast
          sd[i][0] = fmaf(qv.w, ka.w, fmaf(qv.z, ka.z, fmaf(qv.y, ka.y, fmaf(qv.x, ka.x, sd[i][0]))));
          sd[i][1] = fmaf(qv.w, kb.w, fmaf(qv.z, kb.z, fmaf(qv.y, kb.y, fmaf(qv.x, kb.x, sd[i][1]))));
        }
      }
#pragma unroll
      for (int i = 0; i < FA_RW; i++) s[i][0] += sd[i][0], s[i][1] += sd[i][1];
    }
    // Online softmax: rescale what the row has so far to the new max, then P of this tile.
#pragma unroll
    for (int i = 0; i < FA_RW; i++) {
      const int last = wrow0 + i < rows ? pos0 + (wrow0 + i) / nq : -1; // the row's last key (-1: past T x n_q)
      const float s0 = k0 + lane <= last ? s[i][0] * scale : -INFINITY;
      const float s1 = k0 + 32 + lane <= last ? s[i][1] * scale : -INFINITY;
      float mx = fmaxf(s0, s1);
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = rm[warp * FA_RW + i], l_old = rl[warp * FA_RW + i];
      const float m_new = fmaxf(m_old, mx), base = m_new == -INFINITY ? 0.0f : m_new; // no -inf - -inf
      const float corr = expf(m_old - base), p0 = expf(s0 - base), p1 = expf(s1 - base);
      float sum = p0 + p1;
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      __syncwarp(); // every lane has read the old max and sum
      if (lane == 0) rm[warp * FA_RW + i] = m_new, rl[warp * FA_RW + i] = l_old * corr + sum;
#pragma unroll
      for (int n = 0; n < NV; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][n][e] *= corr;
      ps[(warp * FA_RW + i) * FA_KEYS + lane] = p0;
      ps[(warp * FA_RW + i) * FA_KEYS + lane + 32] = p1;
    }
    for (int v0 = 0; v0 < FA_KEYS; v0 += vk) {
      __syncthreads(); // every warp is done with the Q and K slices (or the previous V slice)
      for (int e = threadIdx.x; e < vk * hd4; e += FA_THREADS) {
        const int j = e / hd4, d = 4 * (e % hd4), key = k0 + v0 + j;
        float4 vv = make_float4(0.0f, 0.0f, 0.0f, 0.0f); // past the keys: the cache may hold NaN there
        if (key < kend) vv = *(const float4 *)(vc + (int64_t)key * hd + d);
        *(float4 *)(vs + j * hd + d) = vv;
      }
      __syncthreads();
      for (int j = 0; j < vk; j += 4) {
        float4 vv[4][NV];
#pragma unroll
        for (int jj = 0; jj < 4; jj++)
#pragma unroll
          for (int n = 0; n < NV; n++) {
            const int g = lane + 32 * n;
            vv[jj][n] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (4 * g < hd) vv[jj][n] = *(const float4 *)(vs + (j + jj) * hd + 4 * g);
          }
#pragma unroll
        for (int i = 0; i < FA_RW; i++) {
          const float4 p = *(const float4 *)(ps + (warp * FA_RW + i) * FA_KEYS + v0 + j); // a broadcast
#pragma unroll
          for (int jj = 0; jj < 4; jj++)
#pragma unroll
            for (int n = 0; n < NV; n++) {
              const float pj = fa_at(p, jj);
              acc[i][n][0] = fmaf(pj, vv[jj][n].x, acc[i][n][0]);
              acc[i][n][1] = fmaf(pj, vv[jj][n].y, acc[i][n][1]);
              acc[i][n][2] = fmaf(pj, vv[jj][n].z, acc[i][n][2]);
              acc[i][n][3] = fmaf(pj, vv[jj][n].w, acc[i][n][3]);
            }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < FA_RW; i++) {
    __syncwarp(); // lane 0's last max and sum are visible
    const float M = rm[warp * FA_RW + i], L = rl[warp * FA_RW + i];
    const int r = wrow0 + i;
    if (r >= rows) continue;
    const int t = r / nq, h = r % nq;
    if (n_split == 1) { // every key of the rows: L >= 1 (the max's own term)
      float *o = out + (int64_t)t * ldo + (int64_t)h * hd;
#pragma unroll
      for (int n = 0; n < NV; n++) {
        const int g = lane + 32 * n;
        if (4 * g < hd)
          *(float4 *)(o + 4 * g) =
              make_float4(acc[i][n][0] / L, acc[i][n][1] / L, acc[i][n][2] / L, acc[i][n][3] / L);
      }
    } else { // a row whose keys end before the chunk writes (-inf, 0); attend_combine skips it
      float *o = part + ((int64_t)r * n_split + c) * (hd + 2);
      if (lane == 0) o[0] = M, o[1] = L;
#pragma unroll
      for (int n = 0; n < NV; n++) {
        const int g = lane + 32 * n;
        if (4 * g < hd)
#pragma unroll
          for (int e = 0; e < 4; e++) o[2 + 4 * g + e] = acc[i][n][e];
      }
    }
  }
}

// Keys per block of attend_flash: one tile, doubled while the grid would exceed FA_MAX_BLOCKS
// (several waves of an H200's 132 SMs), so that long contexts spread over the SMs even for a few
// tokens, with no more partials than that needs. A function of the shape only: deterministic.
static int flash_chunk(int T, int nq, int pos0) {
  const int64_t tiles = (T * nq + FA_ROWS - 1) / FA_ROWS;
  const int keys = pos0 + T;
  int chunk = FA_KEYS;
  while (chunk < keys && tiles * ((keys + chunk - 1) / chunk) > FA_MAX_BLOCKS) chunk *= 2;
  return chunk;
}

// Whether attend_flash takes these buffers: float4 rows (head_dim a multiple of 4, 16-byte
// aligned pointers and row strides) of at most 256 dimensions (the engine refuses more).
static int flash_fits(const float *q, int64_t ldq, const float *kc, const float *vc, int hd, const float *out,
                      int64_t ldo) {
  const uintptr_t ptrs = (uintptr_t)q | (uintptr_t)kc | (uintptr_t)vc | (uintptr_t)out;
  return hd % 4 == 0 && hd <= 256 && ptrs % 16 == 0 && ldq % 4 == 0 && ldo % 4 == 0;
}

// Floats of the partials either kernel writes: T x n_q rows of (max, sum, head_dim values) per chunk
// (decode's stay as they were: its graphs keep their scratch).
static size_t attention_part_floats(int T, int pos0, int nq, int hd) {
  const int keys = pos0 + T, n_chunks = (keys + KEY_CHUNK - 1) / KEY_CHUNK, chunk = flash_chunk(T, nq, pos0);
  const int n_split = T > 1 ? (keys + chunk - 1) / chunk : 0;
  return (size_t)T * nq * (size_t)(n_chunks > n_split ? n_chunks : n_split) * (size_t)(hd + 2);
}

// Causal attention of T tokens' nq query heads (q [T][ldq], head h at h * hd) over the keys and
// values kc, vc [pos0 + T][hd], into out [T][ldo]; part holds attention_part_floats. flash != 0
// (the caller checked flash_fits) takes attend_flash, else attend_partial and attend_combine.
static void attend(const float *q, int64_t ldq, const float *kc, const float *vc, int T, int pos0, int nq, int hd,
                   float *part, float *out, int64_t ldo, int flash, cudaStream_t st) {
  const float scale = 1.0f / sqrtf((float)hd);
  if (!flash) {
    const int n_chunks = (pos0 + T + KEY_CHUNK - 1) / KEY_CHUNK;
    attend_partial<<<dim3(T, nq, n_chunks), 32 * WARPS, 0, st>>>(q, ldq, kc, vc, hd, pos0, scale, n_chunks, part);
    attend_combine<<<dim3(T, nq), 128, 0, st>>>(part, n_chunks, KEY_CHUNK, hd, pos0, out, ldo);
    return;
  }
  const int chunk = flash_chunk(T, nq, pos0), n_split = (pos0 + T + chunk - 1) / chunk;
  const dim3 grid((T * nq + FA_ROWS - 1) / FA_ROWS, n_split);
  if (hd <= 128)
    attend_flash<1><<<grid, FA_THREADS, 0, st>>>(q, ldq, kc, vc, hd, nq, T, pos0, scale, chunk, part, out, ldo);
  else
    attend_flash<2><<<grid, FA_THREADS, 0, st>>>(q, ldq, kc, vc, hd, nq, T, pos0, scale, chunk, part, out, ldo);
  if (n_split > 1) attend_combine<<<dim3(T, nq), 128, 0, st>>>(part, n_split, chunk, hd, pos0, out, ldo);
}

// Scratch floats of one call: the normed input, one group's queries and the attention partials.
static size_t attention_scratch_bytes(const st_attention_args *a) {
  return sizeof(float) * ((size_t)a->T * a->n_embd + (size_t)a->T * a->n_q * a->head_dim +
                          attention_part_floats(a->T, a->pos0, a->n_q, a->head_dim));
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
    // Decode (T = 1) keeps the split-K kernels: its CUDA graphs replay them bit for bit.
    attend(q, qw, kc, vc, T, a->pos0, nq, hd, part, out, qw, T > 1 && flash_fits(q, qw, kc, vc, hd, out, qw), st);
  }
  ST_CUDA_CHECK(cudaGetLastError());
}

extern "C" void st_attention_cuda(void *buffers[], void *cl_arg) {
  const st_attention_args *a = (const st_attention_args *)cl_arg;
  const int decode = a->T == 1;
  st_cuda_dense_run(buffers, a, decode ? a->graph_key : 0, attention_scratch_bytes(a), decode, attention_body);
}

// ---- the decode step's attention (decode.cu), the position in device memory --------------------

int st_cuda_attn_chunks(int n_keys) { return (n_keys + KEY_CHUNK - 1) / KEY_CHUNK; }

extern "C" size_t st_cuda_decode_part_floats(int n_ctx, int n_heads, int hd) {
  return (size_t)n_heads * (size_t)st_cuda_attn_chunks(n_ctx) * (size_t)(hd + 2);
}

void st_cuda_rope_append(float *q, int Hq, const float *kvnew, int G, int hd, const float *qw, const float *kw,
                         float eps, const int *pos_dev, float theta, float *const *k, float *const *v, int pdl,
                         cudaStream_t st) {
  kv_ptrs p;
  for (int g = 0; g < G; g++) p.k[g] = k[g], p.v[g] = v[g];
  st_cuda_launch(rope_append, dim3(Hq + G), dim3(64), 0, st, pdl, q, Hq, kvnew, G, hd, qw, kw, eps, pos_dev, theta, p);
}

void st_cuda_attend_decode_all(const float *q, int Hq, int G, int hd, float *const *k, float *const *v,
                               const int *pos_dev, int n_chunks, float *part, int *counters, float *out, int pdl,
                               cudaStream_t st) {
  kv_ptrs p;
  for (int g = 0; g < G; g++) p.k[g] = k[g], p.v[g] = v[g];
  st_cuda_launch(attend_decode_all, dim3(1, Hq, n_chunks), dim3(32 * WARPS), 0, st, pdl, q, Hq / G, hd, p, pos_dev,
                 1.0f / sqrtf((float)hd), part, counters, out);
}

// For tests (cuda_codelets.h): attend on host data, on the legacy default stream.
extern "C" int st_cuda_attention_rows(const float *q, const float *k, const float *v, int T, int pos0, int nq, int hd,
                                      int flash, int reps, float *out, double *ms) {
  const size_t qn = (size_t)T * nq * hd, kn = (size_t)(pos0 + T) * hd;
  const size_t pn = attention_part_floats(T, pos0, nq, hd);
  float *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dpart = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  int ok = cudaMalloc(&dq, sizeof(float) * qn) == cudaSuccess && cudaMalloc(&dk, sizeof(float) * kn) == cudaSuccess &&
           cudaMalloc(&dv, sizeof(float) * kn) == cudaSuccess &&
           cudaMalloc(&dout, sizeof(float) * qn) == cudaSuccess &&
           cudaMalloc(&dpart, sizeof(float) * pn) == cudaSuccess &&
           cudaMemcpy(dq, q, sizeof(float) * qn, cudaMemcpyHostToDevice) == cudaSuccess &&
           cudaMemcpy(dk, k, sizeof(float) * kn, cudaMemcpyHostToDevice) == cudaSuccess &&
           cudaMemcpy(dv, v, sizeof(float) * kn, cudaMemcpyHostToDevice) == cudaSuccess;
  const int64_t ld = (int64_t)nq * hd;
  if (ok) {
    const int use_flash = flash && T > 1 && flash_fits(dq, ld, dk, dv, hd, dout, ld);
    attend(dq, ld, dk, dv, T, pos0, nq, hd, dpart, dout, ld, use_flash, 0);
    ok = cudaGetLastError() == cudaSuccess &&
         cudaMemcpy(out, dout, sizeof(float) * qn, cudaMemcpyDeviceToHost) == cudaSuccess;
    if (ok && reps > 0 && ms) {
      float elapsed = 0.0f;
      ok = cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess &&
           cudaEventRecord(e0, 0) == cudaSuccess;
      for (int r = 0; ok && r < reps; r++) attend(dq, ld, dk, dv, T, pos0, nq, hd, dpart, dout, ld, use_flash, 0);
      ok = ok && cudaEventRecord(e1, 0) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
           cudaGetLastError() == cudaSuccess && cudaEventElapsedTime(&elapsed, e0, e1) == cudaSuccess;
      *ms = (double)elapsed / reps;
    }
  }
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dout);
  cudaFree(dpart);
  return ok ? 0 : -1;
}
