// CUDA variant of the attention codelet (codelets.h): RMSNorm, the group's Q/K/V projections
// (K and V written straight into the KV cache kept on the device; through cuBLAS for prompt
// chunks of at least cublas_rows tokens, gemm.cu), q/k RMSNorm and NEOX RoPE per
// head, then causal attention: for decode (T = 1) one block per (KV group, two heads) over every key
// up to 128 keys (attend_short_block), else split over the keys, one block per (chunk, KV group)
// (see attend_split); a tiled flash-attention kernel for prompt chunks (T > 1, see attend_flash).
#include <math.h>

#include <type_traits>
#include <vector>

#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"
#include "common.h" // ST_ASSERT

#ifndef ATT_Q8_LOAD
#define ATT_Q8_LOAD __ldcs /* a q8_0 cache's rows are read once a step: streaming loads */
#endif

// The KV cache's element (KT): float (ST_TYPE_F32) or __half (ST_TYPE_F16, rounded to nearest
// even on the way in). Loads of one element and of four consecutive ones (a float row's 16 bytes,
// a half row's 8) return float32; every kernel below computes in float32 either way.
__device__ __forceinline__ static float kv_ld(const float *p) { return *p; }
__device__ __forceinline__ static float kv_ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ static void kv_st(float *p, float v) { *p = v; }
__device__ __forceinline__ static void kv_st(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ static float4 kv_ld4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ static float4 kv_ld4(const __half *p) {
  const uint2 u = *(const uint2 *)p;
  const float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
  return make_float4(a.x, a.y, b.x, b.y);
}
template <typename KT> struct kv_tag {
  using type = KT;
};
// Calls f(kv_tag<KT>()) for a cache of kv_type (ST_TYPE_F16, else float32).
template <typename F> static void kv_dispatch(int kv_type, F &&f) {
  if (kv_type == ST_TYPE_F16) f(kv_tag<__half>());
  else f(kv_tag<float>());
}


// ---- the q8_0 KV cache (--cache-type-k q8_0) ----------------------------------------------------
// A row of hd values (a multiple of 32) is hd int8 quants q, then hd / 32 fp16 scales d (value i =
// d[i / 32] q[i]), as the CPU stores it (st_kv_store, layer_cpu.h): each 32 quantised as ggml's Q8_0,
// d = max|x| / 127 in float32, q = round(x / d) by the float reciprocal, d rounded to half. (Read as
// halves, a block's values are finite up to |d q| < 65520, a half cache's range; the CPU reads d q
// in float32.) kv_q8 is the third KT of the kernels' templates (pointers to it are byte addresses).
// Every kernel reads its values as the halves d q (q exact, the product rounded to nearest even: a
// rounding of 2^-11 relative on top of the cache's own), 8 consecutive values of a row at a time
// (kv_q8_ld8): the tensor-core blocks straight from the rows, the other blocks from tiles of such
// halves in shared memory (as a half cache's tiles), the prompt's flash kernels from a half copy of
// the keys' values (kv_q8_to_half).
struct kv_q8 {
  uint8_t raw;
};
template <typename KT> constexpr bool kv_is_q8 = std::is_same<KT, kv_q8>::value;
// What a block's tiles in shared memory hold for a cache of KT, and its bytes.
template <typename KT> using kv_smem_t = typename std::conditional<kv_is_q8<KT>, __half, KT>::type;
template <typename KT> constexpr size_t kv_es = sizeof(kv_smem_t<KT>);
// Calls f(kv_tag<KT>()) for a cache of kv_type: kv_dispatch's, or kv_q8 for ST_TYPE_Q8_0.
template <typename F> static void kv_dispatch_q8(int kv_type, F &&f) {
  if (kv_type == ST_TYPE_Q8_0) f(kv_tag<kv_q8>());
  else kv_dispatch(kv_type, f);
}
__host__ __device__ __forceinline__ constexpr static int64_t kv_q8_row_bytes(int hd) { return (int64_t)hd + (int64_t)(hd / 32) * 2; }
// The byte offset of row `row`'s quants in a q8_0 cache with rows of hd values. (Other layouts were
// timed and not kept, bench/RESULTS.md 2026-12-07: quants and scales in planes, 16-row tiles whose
// rows are 128-byte aligned, and rows padded to 144 bytes read with 16-byte loads.)
__host__ __device__ __forceinline__ constexpr static int64_t kv_q8_at(int64_t row, int hd) { return row * kv_q8_row_bytes(hd); }
// Row `row` of a cache of KT with rows of hd values.
template <typename KT> __device__ __forceinline__ static const KT *kv_row(const KT *c, int64_t row, int hd) {
  if constexpr (kv_is_q8<KT>) return (const KT *)((const uint8_t *)c + kv_q8_at(row, hd));
  else return c + row * hd;
}

// The 32 values x (x = value 32 b + lane of the row) of block b of a q8_0 row, quantised by the warp
// into the row: the CPU's st_quantize_row_q8_0 bit for bit (the max of |x| in any order, IEEE
// division and reciprocal, roundf, the scale rounded to half).
__device__ __forceinline__ static void kv_q8_block(float x, uint8_t *row, int hd, int b, int lane) {
  float amax = fabsf(x);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = __fdiv_rn(amax, 127.0f), id = d != 0.0f ? __frcp_rn(d) : 0.0f;
  row[32 * b + lane] = (uint8_t)(int8_t)roundf(__fmul_rn(x, id));
  if (lane == 0) *(__half *)(row + hd + 2 * b) = __float2half_rn(d);
}

// rows x hd floats (src, rows hd apart) into q8_0 rows at dst: one warp a block.
__global__ static void kv_store_q8(const float *src, uint8_t *dst, int64_t rows, int hd) {
  const int lane = threadIdx.x & 31, nb = hd / 32;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < rows * nb; w += warps) {
    const int64_t r = w / nb;
    const int b = (int)(w - r * nb);
    kv_q8_block(src[r * hd + 32 * b + lane], dst + r * kv_q8_row_bytes(hd), hd, b, lane);
  }
}

// Eight quants (little-endian in w0, w1) times the scale d as halves in memory order (the four
// words of a 16-byte load of a half row).
__device__ __forceinline__ static uint4 kv_q8_halves8(uint32_t w0, uint32_t w1, __half d) {
  const __half2 d2 = __halves2half2(d, d), off = __float2half2_rn(1152.0f);
  uint32_t h[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    // bytes q + 128 under the exponent byte 0x64: the halves 1024 + q + 128, exactly; less 1152: q
    const uint32_t u = (i < 2 ? w0 : w1) ^ 0x80808080u;
    const uint32_t e = __byte_perm(u, 0x64646464u, (i & 1) ? 0x4342u : 0x4140u);
    const __half2 q = __hsub2(*(const __half2 *)&e, off), v = __hmul2(q, d2);
    h[i] = *(const uint32_t *)&v;
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

// Eight quants at p, a multiple of 8 bytes into a row of a q8_0 cache with rows of hd values (the
// cache's base 8-byte aligned): one 8-byte load where the rows are 8-byte aligned (hd a multiple of
// 128), two 4-byte loads where they are 4-byte aligned (a multiple of 64), else four 2-byte loads.
__device__ __forceinline__ static uint2 kv_q8_quants8(const uint8_t *p, int hd) {
  if (hd % 128 == 0) return ATT_Q8_LOAD((const uint2 *)p);
  if (hd % 64 == 0) return make_uint2(ATT_Q8_LOAD((const unsigned *)p), ATT_Q8_LOAD((const unsigned *)p + 1));
  const unsigned short *s = (const unsigned short *)p;
  return make_uint2((uint32_t)ATT_Q8_LOAD(s) | (uint32_t)ATT_Q8_LOAD(s + 1) << 16,
                    (uint32_t)ATT_Q8_LOAD(s + 2) | (uint32_t)ATT_Q8_LOAD(s + 3) << 16);
}

// Values d0 .. d0 + 7 (d0 a multiple of 8) of row `key` of a q8_0 cache with rows of hd values:
// their quants (kv_q8_quants8) and their scale.
__device__ __forceinline__ static uint4 kv_q8_ld8(const kv_q8 *c, int64_t key, int hd, int d0) {
  const uint8_t *row = (const uint8_t *)c + key * kv_q8_row_bytes(hd);
  const __half d = __ushort_as_half(ATT_Q8_LOAD((const unsigned short *)(row + hd) + d0 / 32));
  const uint2 q = kv_q8_quants8(row + d0, hd);
  return kv_q8_halves8(q.x, q.y, d);
}

// The same values, one half each, for rows x hd values of a q8_0 cache into dst ([rows][hd]): the
// prompt path's flash kernels read the copy.
__global__ static void kv_q8_to_half(const kv_q8 *src, __half *dst, int64_t rows, int hd) {
  const int64_t n8 = rows * hd / 8;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n8; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = e / (hd / 8);
    *(uint4 *)(dst + 8 * e) = kv_q8_ld8(src, r, hd, (int)(8 * (e - r * (hd / 8))));
  }
}

// Keys j0 <= j < n of a q8_0 cache (key j at row lo + j, modulo ring when ring > 0) as tiles of
// halves ks, vs ([n][hd]; key j at row j) in shared memory, 8 values a thread at a time; then the end
// of a copy group (none was started: the callers' waits stay balanced).
__device__ __forceinline__ static void att_stage_q8(__half *ks, __half *vs, const kv_q8 *kc, const kv_q8 *vc, int n, int hd,
                                                    int lo = 0, int ring = 0, int j0 = 0) {
  const int per = hd / 8;
  for (int e = j0 * per + threadIdx.x; e < n * per; e += blockDim.x) {
    const int j = e / per, r = ring ? (lo + j) % ring : lo + j, c = 8 * (e - j * per);
    *(uint4 *)(ks + 8 * e) = kv_q8_ld8(kc, r, hd, c);
    *(uint4 *)(vs + 8 * e) = kv_q8_ld8(vc, r, hd, c);
  }
  st_dev_cp_commit();
}

// q/k RMSNorm over head_dim and NEOX RoPE at position pos of one head, in (hd floats) to out (a
// float row, which may alias in, or a KV-cache row of OT), by the nt threads t = 0 .. nt - 1 (whole
// warps) that call it, sync() their barrier (red: nt / 32 floats of shared memory): a per-thread sum
// over i = t + nt j, warp sums, the warps' sums in order. cs (may be NULL): the position's row of
// st_cuda_rope_table, the same cosines and sines as computed here. The same nt gives the same bits
// wherever the threads sit (qk_norm_rope: a block of 64; rope_short: two warps of its block). TAB:
// cs is never NULL (no double-precision trigonometry compiled in).
template <bool TAB = false, typename OT, typename Sync>
__device__ __forceinline__ static void norm_rope_threads(const float *in, OT *out, int hd, const float *w, float eps,
                                                         int pos, float theta, float *red, const float2 *cs, int t,
                                                         int nt, Sync sync, const float *b = NULL, int n_rot = 0) {
  // b (may be NULL): a bias added to the input first; w NULL: no norm (the input rotated as it is);
  // n_rot (0: hd): the pairs (i, i + n_rot / 2) of the first n_rot dims rotate, the rest pass normed
  // (a partial NEOX RoPE, as llama.cpp's); cs then holds n_rot / 2 pairs
  float scale = 1.0f;
  if (w) {
    float ss = 0.0f;
    for (int i = t; i < hd; i += nt) {
      const float v = b ? in[i] + b[i] : in[i];
      ss += v * v;
    }
    ss = st_warp_sum(ss);
    sync();
    if ((t & 31) == 0) red[t >> 5] = ss;
    sync();
    float tot = 0.0f;
    for (int wi = 0; wi < nt >> 5; wi++) tot += red[wi];
    scale = rsqrtf(tot / (float)hd + eps);
    sync();
  }
  const int half = (n_rot ? n_rot : hd) / 2;
  for (int i = 2 * half + t; i < hd; i += nt) {
    const float v = b ? in[i] + b[i] : in[i];
    kv_st(out + i, w ? v * scale * w[i] : v);
  }
  for (int i = t; i < half; i += nt) {
    float c, s;
    if (TAB || cs) {
      c = cs[i].x, s = cs[i].y;
    } else {
      const double ang = (double)pos * pow((double)theta, -2.0 * i / hd);
      c = (float)cos(ang), s = (float)sin(ang);
    }
    const float v0 = b ? in[i] + b[i] : in[i], v1 = b ? in[i + half] + b[i + half] : in[i + half];
    const float x0 = w ? v0 * scale * w[i] : v0, x1 = w ? v1 * scale * w[i + half] : v1;
    kv_st(out + i, x0 * c - x1 * s);
    kv_st(out + i + half, x0 * s + x1 * c);
  }
}

// norm_rope_threads by the whole block (blockDim.x threads).
template <typename OT>
__device__ __forceinline__ static void norm_rope_head(const float *in, OT *out, int hd, const float *w, float eps,
                                                      int pos, float theta, float *red, const float2 *cs = NULL) {
  norm_rope_threads(in, out, hd, w, eps, pos, theta, red, cs, (int)threadIdx.x, (int)blockDim.x, [] { __syncthreads(); });
}

// norm_rope_head's cosine and sine of pair i at position pos, for pos < n_ctx: t[pos hd / 2 + i].
__global__ static void rope_table(float2 *t, int hd, float theta) {
  const int pos = blockIdx.x, half = hd / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double ang = (double)pos * pow((double)theta, -2.0 * i / hd);
    t[(int64_t)pos * half + i] = make_float2((float)cos(ang), (float)sin(ang));
  }
}

void st_cuda_rope_table(float *t, int n_ctx, int hd, float theta, cudaStream_t st) {
  if (n_ctx > 0) rope_table<<<n_ctx, 64, 0, st>>>((float2 *)t, hd, theta);
  ST_CUDA_CHECK(cudaGetLastError());
}

// q/k RMSNorm and RoPE in place at position pos0 + t; one block per (t, head).
__global__ static void qk_norm_rope(float *v, int64_t ld, int hd, const float *w, float eps, int pos0, float theta) {
  __shared__ float red[32];
  float *h = v + (int64_t)blockIdx.x * ld + (int64_t)blockIdx.y * hd;
  norm_rope_head(h, h, hd, w, eps, pos0 + blockIdx.x, theta, red);
}

// The decode step's KV cache pointers, one K and one V cache per KV head (rope_short, attend_decode_all).
struct kv_ptrs {
  void *k[ST_CUDA_MAX_KV_HEADS], *v[ST_CUDA_MAX_KV_HEADS];
};

// Causal attention split over the keys (split-K), one block per (chunk of keys, query heads of one
// KV group): block (c, t, b) takes token t's query heads b NQ .. b NQ + NQ - 1 of a group (those
// that share one KV head) over keys [c chunk, (c + 1) chunk) ∩ [0, pos0 + t], so every K and V row
// the block reads serves all of its heads (GQA: one read per group, not one per query head). The
// chunk's keys go in tiles of ATT_TILE, copied into shared memory (cp.async) one tile ahead where
// the device's shared memory allows two tiles, so that the next tile's copy overlaps this tile's
// arithmetic (att_stages). Each warp scores every 8th key of the tile for
// all NQ heads (lanes share the head dimensions; the NQ dot products are reduced over the warp by a
// transposing butterfly, log2 NQ halving exchanges, then a plain one), the tile's softmax is taken
// per head against the block's running max, and each warp adds its keys' P V into its own
// accumulators, rescaled per tile (the flash-attention recurrence at tile granularity). The warps'
// accumulators are then summed in warp order and the block writes per head its partial (max, sum, hd
// weighted values); attend_merge_heads merges the chunks in chunk order. Fixed order throughout, no
// atomics on values: the same bits every run, and the same kernels serve the attention codelet's
// T = 1 path and the decode step (decode.cu), so the two agree bit for bit.
#define ATT_WARPS 8
#define ATT_TILE 32   /* keys of a tile: 4 per warp, one per lane in the softmax */
#ifndef ATT_SPLIT
#define ATT_SPLIT 32 /* chunks of keys at most: 4 KV groups x 32 blocks, one wave on an H200 at a block per SM */
#endif
#ifndef ATT_MIN_BLOCKS
#define ATT_MIN_BLOCKS 1 /* the split-K kernels' resident blocks an SM at least (__launch_bounds__; bench variants) */
#endif
#ifndef ATT_MIN_CHUNK
#define ATT_MIN_CHUNK 32 /* keys of a chunk at least (bench/attn-bench builds variants with -D) */
#endif
static_assert(ATT_TILE == 32 && ATT_SPLIT <= 64 && ATT_MIN_CHUNK % ATT_TILE == 0, "attend_group_chunk: a key a lane; the merge: at most two chunks a lane");

// Keys of a chunk for n_keys keys: one chunk up to 2 ATT_MIN_CHUNK keys (on an H200 a second tile
// costs a block about 2 us, the merge of two chunks about 4.7: bench/attn-bench), else the fewest
// whole tiles that ATT_SPLIT chunks cover them with, at least ATT_MIN_CHUNK keys, so that from
// ATT_SPLIT x ATT_MIN_CHUNK keys on every position uses ATT_SPLIT or nearly as many chunks (a chunk
// of a power of two keys would leave half the blocks idle just past one: at 32,769 keys 17 chunks
// of 2,048, and the deep row's decode 0.71x as fast). A function of n_keys only, on host and device.
__host__ __device__ __forceinline__ static int att_chunk_keys(int n_keys) {
  if (n_keys <= 2 * ATT_MIN_CHUNK) return 2 * ATT_MIN_CHUNK;
  const int tiles = (n_keys + ATT_TILE - 1) / ATT_TILE, per_chunk = (tiles + ATT_SPLIT - 1) / ATT_SPLIT;
  return per_chunk * ATT_TILE > ATT_MIN_CHUNK ? per_chunk * ATT_TILE : ATT_MIN_CHUNK;
}

// log2 of a block's heads NQ (1, 2, 4 or 8).
__host__ __device__ constexpr int att_log2(int nq) { return nq <= 1 ? 0 : 1 + att_log2(nq / 2); }

// Heads a block takes for nq query heads a group of head_dim hd (NQ), and floats per lane of a row
// (ND): NQ ND <= 32 keeps a lane's queries and accumulators in registers.
static int att_nd(int hd) { return hd <= 128 ? 4 : 8; }
static int att_nq(int nq, int hd) {
  const int most = 32 / att_nd(hd);
  int b = 1;
  while (b < nq && b < most) b *= 2;
  return b;
}
// Dynamic shared memory of the split-K kernels: nst stages of a tile's K and V rows (es bytes an
// element), reused for the warps' float accumulators at the end.
static size_t att_smem_bytes(int hd, int nd, int nqb, int nst, size_t es) {
  const size_t tiles = 2 * (size_t)nst * ATT_TILE * hd * es, accs = sizeof(float) * ATT_WARPS * nqb * nd * 32;
  return tiles > accs ? tiles : accs;
}
// Stages a block keeps for head_dim hd when `room` bytes of dynamic shared memory are allowed (2:
// the next tile's copy overlaps this tile's arithmetic; 1: one tile at a time; 0: the rows read
// from global memory): the same values, so the same bits, whatever the choice.
static int att_stages(int hd, int nd, int nqb, size_t es, size_t room) {
  for (int nst = 2; nst > 0; nst--)
    if (att_smem_bytes(hd, nd, nqb, nst, es) <= room) return nst;
  return 0;
}

// v[0] of every lane becomes the warp's sum of v[h] for head h = lane >> (5 - log2 NQ).
template <int NQ> __device__ __forceinline__ static void att_transpose_sum(float (&v)[NQ], int lane) {
  int off = 16;
#pragma unroll
  for (int half = NQ / 2; half >= 1; half /= 2, off >>= 1) {
    const bool up = lane & off;
#pragma unroll
    for (int i = 0; i < half; i++) {
      const float send = up ? v[i] : v[i + half], keep = up ? v[i + half] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
    }
  }
  for (; off > 0; off >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
}

// Lane `lane`'s queries: q[h][i] = dimension lane + 32 i of head h of qg (head h at qg + h hd), 0
// past the nh heads or hd dimensions.
template <int ND, int NQ>
__device__ __forceinline__ static void att_load_q(float (&q)[NQ][ND], const float *qg, int nh, int hd, int lane) {
#pragma unroll
  for (int h = 0; h < NQ; h++)
#pragma unroll
    for (int i = 0; i < ND; i++) {
      const int dd = lane + 32 * i;
      q[h][i] = h < nh && dd < hd ? qg[h * hd + dd] : 0.0f;
    }
}

// The block's warps' accumulators acc[h][i] (head h, dimension lane + 32 i) added in warp order
// through wacc (ATT_WARPS NQ ND 32 floats of shared memory): put(h, d, sum) for dimension d < hd of
// head h < nh. Every thread of the block calls it.
template <int ND, int NQ, typename Put>
__device__ __forceinline__ static void att_warps_sum(const float (&acc)[NQ][ND], float *wacc, int nh, int hd, Put put) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 0; h < NQ; h++)
#pragma unroll
    for (int i = 0; i < ND; i++) wacc[(warp * NQ * ND + h * ND + i) * 32 + lane] = acc[h][i];
  __syncthreads();
  for (int e = threadIdx.x; e < nh * hd; e += blockDim.x) {
    const int h = e / hd, dd = e - h * hd, slot = (h * ND + dd / 32) * 32 + dd % 32;
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) a += wacc[w * NQ * ND * 32 + slot];
    put(h, dd, a);
  }
}

// Keys [k0, k0 + nk) of kc and vc ([keys][hd]) into ks, vs ([ATT_TILE][hd]): 16-byte asynchronous
// copies where the rows allow them (vec), else plain ones; then the end of a copy group.
template <typename KT>
__device__ __forceinline__ static void att_stage(KT *ks, KT *vs, const KT *kc, const KT *vc, int k0, int nk, int hd,
                                                 bool vec) {
  constexpr int PER = 16 / sizeof(KT); // elements of a 16-byte copy
  const KT *kb = kc + (int64_t)k0 * hd, *vb = vc + (int64_t)k0 * hd;
  if (vec) {
    for (int e = threadIdx.x; e < nk * hd / PER; e += blockDim.x) {
      st_dev_cp16(ks + PER * e, kb + PER * e);
      st_dev_cp16(vs + PER * e, vb + PER * e);
    }
  } else {
    for (int e = threadIdx.x; e < nk * hd; e += blockDim.x) ks[e] = kb[e], vs[e] = vb[e];
  }
  st_dev_cp_commit();
}

// One block's partials: the nh <= NQ query heads at qg (head i at qg + i hd) over keys [start, end)
// of kc, vc ([keys][hd] of KT); head i's partial (max, sum, hd weighted values) at out + i ostride,
// (-inf, 0) when the range is empty. 8 warps; stage: att_smem_bytes(.., nst) of dynamic shared
// memory, nst from att_stages.
// direct (the range is all the keys): head i's output A / L at direct + i hd instead, the bits
// attend_merge_heads gives for one chunk (f = e^0 = 1, A a sum from +0, so never -0).
template <int ND, int NQ, typename KT>
__device__ __forceinline__ static void attend_group_chunk(const float *qg, int nh, const KT *kc, const KT *vc,
                                                          int hd, int start, int end, float scale, float *out,
                                                          int64_t ostride, float *stage, int nst,
                                                          float *direct = NULL) {
  __shared__ float ss[NQ][ATT_TILE];
  __shared__ float m_run[NQ], l_run[NQ], corr[NQ];
  constexpr int B = att_log2(NQ);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tf = ATT_TILE * hd;
  if (start >= end) {
    if ((int)threadIdx.x < nh) out[threadIdx.x * ostride] = -INFINITY, out[threadIdx.x * ostride + 1] = 0.0f;
    return;
  }
  using ST = kv_smem_t<KT>; // a q8_0 cache's tiles hold halves (kv_q8 never takes nst 0: att_plan_kt)
  const bool vec = hd % (16 / sizeof(KT)) == 0 && (((uintptr_t)kc | (uintptr_t)vc) & 15) == 0;
  ST *const kst = (ST *)stage; // the tiles' stages
  // tile of keys [k0, k0 + nk) into stage (ks, vs)
  const auto stage_tile = [&](ST *ks, ST *vs, int k0, int nk) {
    if constexpr (kv_is_q8<KT>) att_stage_q8(ks, vs, kv_row(kc, k0, hd), kv_row(vc, k0, hd), nk, hd);
    else att_stage(ks, vs, kc, vc, k0, nk, hd, vec);
  };
  if (nst) stage_tile(kst, kst + tf, start, min(ATT_TILE, end - start));
  float q[NQ][ND], acc[NQ][ND];
  att_load_q<ND, NQ>(q, qg, nh, hd, lane);
#pragma unroll
  for (int h = 0; h < NQ; h++)
#pragma unroll
    for (int i = 0; i < ND; i++) acc[h][i] = 0.0f;
  if ((int)threadIdx.x < NQ) m_run[threadIdx.x] = -INFINITY, l_run[threadIdx.x] = 0.0f;
  for (int k0 = start, it = 0; k0 < end; k0 += ATT_TILE, it++) {
    const ST *ks = kst, *vs = kst + tf;
    if constexpr (!kv_is_q8<KT>)
      if (!nst) ks = kc + (int64_t)k0 * hd, vs = vc + (int64_t)k0 * hd; // nst 0: global memory
    if (nst == 2) {
      ks = kst + (size_t)(it & 1) * 2 * tf, vs = ks + tf;
      if (k0 + ATT_TILE < end) {
        ST *nk = kst + (size_t)((it & 1) ^ 1) * 2 * tf;
        stage_tile(nk, nk + tf, k0 + ATT_TILE, min(ATT_TILE, end - k0 - ATT_TILE));
      } else {
        st_dev_cp_commit(); // an empty group: the wait below still leaves only the newest
      }
      st_dev_cp_wait_prev();
    } else if (nst == 1) {
      ks = kst, vs = kst + tf;
      st_dev_cp_wait_all();
    }
    __syncthreads(); // the tile is in shared memory
    // scores of the tile: warp w takes keys w + 8 u (rows past the keys are zero)
    float kr[ATT_TILE / ATT_WARPS][ND];
#pragma unroll
    for (int u = 0; u < ATT_TILE / ATT_WARPS; u++) {
      const int jj = warp + ATT_WARPS * u;
#pragma unroll
      for (int i = 0; i < ND; i++) kr[u][i] = k0 + jj < end && lane + 32 * i < hd ? kv_ld(ks + jj * hd + lane + 32 * i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < ATT_TILE / ATT_WARPS; u++) {
      const int jj = warp + ATT_WARPS * u;
      float v[NQ];
#pragma unroll
      for (int h = 0; h < NQ; h++) {
        v[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < ND; i++) v[h] = fmaf(q[h][i], kr[u][i], v[h]);
      }
      att_transpose_sum<NQ>(v, lane);
      if ((lane & ((32 >> B) - 1)) == 0) ss[lane >> (5 - B)][jj] = k0 + jj < end ? v[0] * scale : -INFINITY;
    }
    __syncthreads();
    // the tile's softmax against the running max: warp h takes head h, lane j key j
    if (warp < NQ) {
      const float s0 = ss[warp][lane];
      float mx = s0;
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = m_run[warp], m_new = fmaxf(m_old, mx); // the tile has a key: finite
      const float c = expf(m_old - m_new), p0 = expf(s0 - m_new);
      float sum = p0;
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      ss[warp][lane] = p0;
      __syncwarp();
      if (lane == 0) m_run[warp] = m_new, l_run[warp] = fmaf(l_run[warp], c, sum), corr[warp] = c;
    }
    __syncthreads();
    // P V of the warp's keys (rows past the keys are zero: the cache may hold NaN there)
#pragma unroll
    for (int h = 0; h < NQ; h++) {
      const float c = corr[h];
#pragma unroll
      for (int i = 0; i < ND; i++) acc[h][i] *= c;
    }
#pragma unroll
    for (int u = 0; u < ATT_TILE / ATT_WARPS; u++) {
      const int jj = warp + ATT_WARPS * u;
      float vr[ND];
#pragma unroll
      for (int i = 0; i < ND; i++) vr[i] = k0 + jj < end && lane + 32 * i < hd ? kv_ld(vs + jj * hd + lane + 32 * i) : 0.0f;
#pragma unroll
      for (int h = 0; h < NQ; h++) {
        const float p = ss[h][jj];
#pragma unroll
        for (int i = 0; i < ND; i++) acc[h][i] = fmaf(p, vr[i], acc[h][i]);
      }
    }
    __syncthreads(); // every warp is done with the tile and its P before they are overwritten
    if (nst == 1 && k0 + ATT_TILE < end) stage_tile(kst, kst + tf, k0 + ATT_TILE, min(ATT_TILE, end - k0 - ATT_TILE));
  }
  att_warps_sum<ND, NQ>(acc, stage, nh, hd, [&](int h, int dd, float a) { // the tiles are no longer needed
    if (direct) direct[h * hd + dd] = a / l_run[h]; // what attend_merge_heads makes of one chunk
    else out[h * ostride + 2 + dd] = a;
  });
  if (!direct && (int)threadIdx.x < nh)
    out[threadIdx.x * ostride] = m_run[threadIdx.x], out[threadIdx.x * ostride + 1] = l_run[threadIdx.x];
}

// ---- the half cache's block on the tensor cores (sm_80 and later) ------------------------------
// d = a b + c with mma.sync m16n8k16 (f16 inputs, f32 accumulators): a the 16 x 16 A fragment
// (a[1], a[3]: rows 8..15), b0 b1 the 16 x 8 B fragment (PTX ISA, "Matrix fragments for
// mma.m16n8k16 with floating point type"). Traps on an older target (never launched there:
// att_mma_ok keeps the tensor-core kernels off older targets).
__device__ __forceinline__ static void fm_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}
// The same with rows 8..15 of A zero (a0, a2: rows 0..7; the decode blocks' heads).
__device__ __forceinline__ static void att_mma(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, 0u, a2, 0u};
  fm_mma(d, a, b0, b1);
}
__device__ __forceinline__ static uint32_t att_h2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *(const uint32_t *)&h;
}
__device__ __forceinline__ static uint32_t att_word(const uint4 &u, int i) { return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w; }

// attend_group_chunk's partials for a half cache of head_dim HD (64 or 128; 16-byte aligned rows
// and queries) on the tensor cores: each warp takes every 8th step of 16 keys of the range and
// keeps its own online softmax; the warps are merged in warp order at the end. Per step, with
// lane = 4 g + t: S = Q K^T as two m16n8k16 tiles of 8 keys (A: the block's heads as rows 0..7 of
// Q in half precision, rows 8..15 zero; B: lane g's key, the head dimensions permuted so that a
// lane's 16-byte load of dimensions 32 s + 8 t .. + 8 gives two k-steps' B registers, with the same
// permutation in A), so lane (g, t) holds head g's scores of keys 2t, 2t+1, 8+2t, 9+2t, which
// are exactly its A registers of P V (P rounded to half); V's B registers come from 16-byte loads
// of rows 2t, 2t+1, 8+2t, 9+2t at dimensions 64 h + 8 g .. + 8, paired by byte permutes, so output
// tile (h, j)'s column n is dimension 64 h + 8 n + j. Scores in log2 units (exp2); the partial's
// max is given back in natural units, as the float kernel's. Q and P in half precision: a
// rounding of 2^-11 relative that the float kernel does not have (the f16 cache's route only).
// Fixed order throughout: the same bits every run, for the decode step and the per-task path alike.
#ifndef ATT_MMA_LOAD
#define ATT_MMA_LOAD __ldcs /* K and V rows are read once: streaming loads (bench variants: __ldg) */
#endif
// *p += 1 at GPU scope with acquire and release semantics (PTX atom.acq_rel.gpu); the old value.
__device__ __forceinline__ static int att_count_acq_rel(int *p) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(old) : "l"(p) : "memory");
  return old;
}
#ifdef ATT_PROBE /* bench variant: the decode kernel's blocks' clock at points 0..5 (bench/attn-bench) */
__device__ unsigned long long att_probe[ATT_SPLIT * 64][6];
#define ATT_PROBE_AT(i) \
  do { \
    if (threadIdx.x == 0) att_probe[blockIdx.y * gridDim.x + blockIdx.x][i] = st_dev_globaltimer(); \
  } while (0)
#else
#define ATT_PROBE_AT(i) \
  do { \
  } while (0)
#endif
// One warp step's K and V (16 keys from k0, keys >= end zero) as a lane of attend_group_chunk_mma
// loads them: K rows k0 + 8 r + g at dimensions 32 si + 8 t .. + 8, V rows k0 + 2 t + (r & 1) + 8 (r >> 1)
// at 64 h + 8 g .. + 8. kh and vh give them as 8 halves (att_word order). A half cache's: 16-byte
// loads. A q8_0 cache's: the quants (8 a load) and each row's scales (4 in one 8-byte load at
// head_dim 128, 2 in a 4-byte one at 64), half a half cache's bytes in registers. (Loading a step
// ahead into a second set took 255 registers and was slower on an H100, and so were L2 hints a step or
// two ahead with the half cache: bench/RESULTS.md 2026-12-06; a q8_0 cache's step, half the bytes,
// gains from a prefetch one step ahead: ATT_PF_Q8.)
#ifndef ATT_KO
#define ATT_KO 0 /* bench variants: 1 the tensor-core block's loads alone, 2 its arithmetic alone (timing only) */
#endif
// Each warp of the tensor-core block prefetches the K and V rows of its next step (ATT_PF_AHEAD
// steps on) into L1 (1) or L2 (2), or not (0): ATT_PF for a half cache, ATT_PF_Q8 for a q8_0 one.
// H100, bench/attn-bench at 32,768 keys (bench/RESULTS.md 2026-12-06, thirty-second session): the
// q8_0 cache 22.7 -> 20.8 us a launch with L1 or L2 alike, 21.9 two steps on; the half cache 30.2 ->
// 30.6 (it already has twice the bytes in flight: the loads alone take 28.9).
#ifndef ATT_PF
#define ATT_PF 0
#endif
#ifndef ATT_PF_Q8
#define ATT_PF_Q8 2
#endif
#ifndef ATT_PF_AHEAD
#define ATT_PF_AHEAD 1
#endif
// The 128-byte lines of K and V rows k0 .. k0 + 15 (those below end) prefetched by the warp's lanes
// into L1 (LEVEL 1) or L2 (LEVEL 2).
template <int LEVEL, typename KT>
__device__ __forceinline__ static void att_prefetch_rows(const KT *kc, const KT *vc, int hd, int k0, int end, int lane) {
  if (k0 >= end) return;
  const int rows = min(16, end - k0);
  const size_t bytes = (const uint8_t *)kv_row(kc, k0 + rows, hd) - (const uint8_t *)kv_row(kc, k0, hd);
  st_dev_prefetch<LEVEL>(kv_row(kc, k0, hd), bytes, lane, 32);
  st_dev_prefetch<LEVEL>(kv_row(vc, k0, hd), bytes, lane, 32);
}
template <int HD, typename KT> struct mma_raw;
template <int HD> struct mma_raw<HD, __half> {
  static constexpr int NS = HD / 32, NH = HD / 64;
  uint4 k[2][NS], v[4][NH];
  __device__ __forceinline__ void load(const __half *kc, const __half *vc, int k0, int end, int g, int t) {
    const uint4 z = make_uint4(0, 0, 0, 0); // rows past the range: zero (the cache may hold NaN there)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int key = k0 + 8 * r + g;
#pragma unroll
      for (int si = 0; si < NS; si++) k[r][si] = key < end ? ATT_MMA_LOAD((const uint4 *)(kc + (int64_t)key * HD + 32 * si + 8 * t)) : z;
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int key = k0 + 2 * t + (r & 1) + 8 * (r >> 1);
#pragma unroll
      for (int h = 0; h < NH; h++) v[r][h] = key < end ? ATT_MMA_LOAD((const uint4 *)(vc + (int64_t)key * HD + 64 * h + 8 * g)) : z;
    }
  }
  __device__ __forceinline__ void fake(int k0, int lane) { // ATT_KO 2: values made up from the key and the lane
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int si = 0; si < NS; si++) k[r][si] = make_uint4(0x3c003c00u ^ (k0 + lane), 0x3c00u, 0x3c00u + r, 0x3c00u + si);
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
      for (int h = 0; h < NH; h++) v[r][h] = make_uint4(0x3c003c00u ^ (k0 + lane), 0x3c00u, 0x3c00u + r, 0x3c00u + h);
  }
  __device__ __forceinline__ uint32_t fold() const { // ATT_KO 1: every loaded word in one
    uint32_t x = 0;
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int si = 0; si < NS; si++) x ^= k[r][si].x ^ k[r][si].y ^ k[r][si].z ^ k[r][si].w;
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
      for (int h = 0; h < NH; h++) x ^= v[r][h].x ^ v[r][h].y ^ v[r][h].z ^ v[r][h].w;
    return x;
  }
  __device__ __forceinline__ uint4 kh(int r, int si) const { return k[r][si]; }
  __device__ __forceinline__ uint4 vh(int r, int h, int) const { return v[r][h]; }
};
template <int HD> struct mma_raw<HD, kv_q8> {
  static constexpr int NS = HD / 32, NH = HD / 64;
  uint2 k[2][NS], v[4][NH], ks[2], vs[4]; // quants; a row's scales (.x holds 2, .y 2 more at HD 128)
  __device__ __forceinline__ static uint2 q8(const uint8_t *p) { return kv_q8_quants8(p, HD); }
  // the scales of the row at `row`
  __device__ __forceinline__ static uint2 sc(const uint8_t *row) {
    if constexpr (HD % 128 == 0) return ATT_Q8_LOAD((const uint2 *)(row + HD));
    else return make_uint2(ATT_Q8_LOAD((const unsigned *)(row + HD)), 0u);
  }
  __device__ __forceinline__ void load(const kv_q8 *kc, const kv_q8 *vc, int k0, int end, int g, int t) {
    const uint2 z = make_uint2(0, 0); // rows past the range: zero quants, zero scales
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int key = k0 + 8 * r + g;
      const uint8_t *row = (const uint8_t *)kc + kv_q8_at(key, HD);
      ks[r] = key < end ? sc(row) : z;
#pragma unroll
      for (int si = 0; si < NS; si++) k[r][si] = key < end ? q8(row + 32 * si + 8 * t) : z;
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int key = k0 + 2 * t + (r & 1) + 8 * (r >> 1);
      const uint8_t *row = (const uint8_t *)vc + kv_q8_at(key, HD);
      vs[r] = key < end ? sc(row) : z;
#pragma unroll
      for (int h = 0; h < NH; h++) v[r][h] = key < end ? q8(row + 64 * h + 8 * g) : z;
    }
  }
  __device__ __forceinline__ void fake(int k0, int lane) { // ATT_KO 2: values made up from the key and the lane
#pragma unroll
    for (int r = 0; r < 2; r++) {
      ks[r] = make_uint2(0x1c001c00u + r, 0x1c001c00u);
#pragma unroll
      for (int si = 0; si < NS; si++) k[r][si] = make_uint2(0x01020304u ^ (k0 + lane), 0x05060708u + si);
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
      vs[r] = make_uint2(0x1c001c00u + r, 0x1c001c00u);
#pragma unroll
      for (int h = 0; h < NH; h++) v[r][h] = make_uint2(0x01020304u ^ (k0 + lane), 0x05060708u + h);
    }
  }
  __device__ __forceinline__ uint32_t fold() const { // ATT_KO 1: every loaded word in one
    uint32_t x = 0;
#pragma unroll
    for (int r = 0; r < 2; r++) {
      x ^= ks[r].x ^ ks[r].y;
#pragma unroll
      for (int si = 0; si < NS; si++) x ^= k[r][si].x ^ k[r][si].y;
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
      x ^= vs[r].x ^ vs[r].y;
#pragma unroll
      for (int h = 0; h < NH; h++) x ^= v[r][h].x ^ v[r][h].y;
    }
    return x;
  }
  // scale i (< 4) of a row's scales
  __device__ __forceinline__ static __half scale(uint2 s, int i) {
    const uint32_t w = i < 2 ? s.x : s.y;
    return __ushort_as_half((unsigned short)(i & 1 ? w >> 16 : w & 0xffffu));
  }
  __device__ __forceinline__ uint4 kh(int r, int si) const { return kv_q8_halves8(k[r][si].x, k[r][si].y, scale(ks[r], si)); }
  __device__ __forceinline__ uint4 vh(int r, int h, int g) const {
    return kv_q8_halves8(v[r][h].x, v[r][h].y, scale(vs[r], 2 * h + (g >> 2)));
  }
};
// KT: __half, or kv_q8 (its values as halves d q).
template <int HD, int NQ, typename KT>
__device__ __forceinline__ static void attend_group_chunk_mma(const float *qg, int nh, const KT *kc, const KT *vc,
                                                              int start, int end, float scale, float *out,
                                                              int64_t ostride, float *stage, float *direct) {
  static_assert(HD % 64 == 0 && HD <= 128 && NQ <= 8, "attend_group_chunk_mma: 64 or 128 dimensions, 8 heads at most");
  constexpr int NS = HD / 32, NH = HD / 64, NT = HD / 8; // K loads a row, V loads a row, output tiles
  __shared__ float mw[ATT_WARPS][NQ], lw[ATT_WARPS][NQ];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float sl2 = scale * 1.4426950408889634f; // log2(e): scores in log2 units
  uint32_t qa[NS][4];                            // head g's queries at dimensions 32 s + 8 t .. + 8, as half pairs
#pragma unroll
  for (int si = 0; si < NS; si++) {
    float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
    if (g < nh) x0 = *(const float4 *)(qg + g * HD + 32 * si + 8 * t), x1 = *(const float4 *)(qg + g * HD + 32 * si + 8 * t + 4);
    qa[si][0] = att_h2(x0.x, x0.y), qa[si][1] = att_h2(x0.z, x0.w), qa[si][2] = att_h2(x1.x, x1.y), qa[si][3] = att_h2(x1.z, x1.w);
  }
  float acc[NT][2];
#pragma unroll
  for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = 0.0f;
  float m = -INFINITY, l = 0.0f; // head g's running max (the same in its 4 lanes) and this lane's share of the sum
#ifdef ATT_MMA_SKIP /* bench variant: the block's fixed costs alone */
  end = start;
#endif
  // one step of 16 keys from k0 (at least one below end) loaded into rw: scores, online softmax, P V
  auto step = [&](const mma_raw<HD, KT> &rw, int k0) {
    float sc[2][4];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      sc[r][0] = sc[r][1] = sc[r][2] = sc[r][3] = 0.0f;
#pragma unroll
      for (int si = 0; si < NS; si++) {
        const uint4 kq = rw.kh(r, si);
        att_mma(sc[r], qa[si][0], qa[si][1], kq.x, kq.y);
        att_mma(sc[r], qa[si][2], qa[si][3], kq.z, kq.w);
      }
    }
    // lane (g, t): head g's scores of keys k0 + 2t, 2t + 1, 8 + 2t, 9 + 2t
    float p[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int key = k0 + 2 * t + (i & 1) + 8 * (i >> 1);
      p[i] = key < end ? sc[i >> 1][i & 1] * sl2 : -INFINITY;
    }
    float mx = fmaxf(fmaxf(p[0], p[1]), fmaxf(p[2], p[3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m, mx), corr = exp2f(m - m_new); // the step has a key: m_new is finite
#pragma unroll
    for (int i = 0; i < 4; i++) p[i] = exp2f(p[i] - m_new);
    l = fmaf(l, corr, (p[0] + p[1]) + (p[2] + p[3]));
    m = m_new;
    const uint32_t pa0 = att_h2(p[0], p[1]), pa2 = att_h2(p[2], p[3]);
#pragma unroll
    for (int h = 0; h < NH; h++) {
      uint4 vr[4];
#pragma unroll
      for (int r = 0; r < 4; r++) vr[r] = rw.vh(r, h, g);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const unsigned sel = j & 1 ? 0x7632u : 0x5410u;
        const uint32_t b0 = __byte_perm(att_word(vr[0], j >> 1), att_word(vr[1], j >> 1), sel);
        const uint32_t b1 = __byte_perm(att_word(vr[2], j >> 1), att_word(vr[3], j >> 1), sel);
        float d[4] = {acc[8 * h + j][0] * corr, acc[8 * h + j][1] * corr, 0.0f, 0.0f};
        att_mma(d, pa0, pa2, b0, b1);
        acc[8 * h + j][0] = d[0], acc[8 * h + j][1] = d[1];
      }
    }
  };
  for (int k0 = start + 16 * warp; k0 < end; k0 += 16 * ATT_WARPS) {
    mma_raw<HD, KT> rw;
#if ATT_KO == 2 /* bench variant: no loads (made-up values), the arithmetic alone */
    rw.fake(k0, lane);
#else
    rw.load(kc, vc, k0, end, g, t);
#endif
    // the warp's next step's rows on their way to L2 while this one computes (a q8_0 cache's: see ATT_PF)
    if constexpr ((kv_is_q8<KT> ? ATT_PF_Q8 : ATT_PF) != 0)
      att_prefetch_rows<kv_is_q8<KT> ? ATT_PF_Q8 : ATT_PF>(kc, vc, HD, k0 + ATT_PF_AHEAD * 16 * ATT_WARPS, end, lane);
#if ATT_KO == 1 /* bench variant: the loads alone (their words folded into one accumulator) */
    acc[0][0] += (float)(rw.fold() & 1u);
#else
    step(rw, k0);
#endif
  }
  ATT_PROBE_AT(2);
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  // [ATT_WARPS][NQ][HD + 1]: each warp's unnormalised output (a row a float longer than HD, so that a
  // warp's 32 stores of one accumulator fall in 16 banks, not 2)
  constexpr int OW = HD + 1;
  float *ow = stage;
  if (g < NQ) {
    if (t == 0) mw[warp][g] = m, lw[warp][g] = l;
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
      for (int j = 0; j < 8; j++) {
        ow[(warp * NQ + g) * OW + 64 * h + 16 * t + j] = acc[8 * h + j][0];
        ow[(warp * NQ + g) * OW + 64 * h + 16 * t + 8 + j] = acc[8 * h + j][1];
      }
  }
  __syncthreads();
  // each warp's factor for each head, e^(its max - the block's), and the head's sum, once (thread
  // w NQ + h: warp w's factor of head h; thread h also the sum L in warp order); then every value
  // of the block's heads as the warps' outputs times their factors, added in warp order
  __shared__ float fw[ATT_WARPS][NQ], ml[2][NQ];
  if ((int)threadIdx.x < ATT_WARPS * NQ) {
    const int w = threadIdx.x / NQ, h = threadIdx.x - w * NQ;
    float M = -INFINITY;
#pragma unroll
    for (int u = 0; u < ATT_WARPS; u++) M = fmaxf(M, mw[u][h]);
    fw[w][h] = exp2f(mw[w][h] - M); // a warp without keys: 0
    if (w == 0) {
      float L = 0.0f;
#pragma unroll
      for (int u = 0; u < ATT_WARPS; u++) L = fmaf(lw[u][h], exp2f(mw[u][h] - M), L);
      ml[0][h] = M, ml[1][h] = L;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < nh * HD; e += blockDim.x) {
    const int h = e / HD, dd = e - h * HD;
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) a = fmaf(ow[(w * NQ + h) * OW + dd], fw[w][h], a);
    if (direct) direct[h * HD + dd] = a / ml[1][h];
    else {
      out[h * ostride + 2 + dd] = a;
      if (dd == 0) out[h * ostride] = ml[0][h] * 0.6931471805599453f, out[h * ostride + 1] = ml[1][h];
    }
  }
}

// The tensor-core block (attend_group_chunk's contract) for a half cache of head_dim 64 or 128,
// 16-byte aligned rows and queries, on sm_80 and later (att_mma_ok checks it on the host). It has
// kernels of its own (attend_split and attend_decode_all with MMA): in one kernel with the tiles'
// block, the tiles' block itself ran 2.6x slower at 1,024 keys (bench/attn-bench). On an H200 (4
// KV groups, half cache, bench/RESULTS.md 2026-12-03) the pair takes 42 us at 32,768 keys and 33
// at 16,384 where the tiles alone take 75 and 43; but (measured while both blocks shared a kernel)
// the tensor-core block took 33 us at 4,096 keys where the tiles take 19. Most of that was the last
// block's merge, whose loads ptxas issued one at a time in this kernel (attend_merge_heads); with
// that mended (2026-12-06, H100) the q8_0 cache's tensor-core block is the faster one at every
// chunk (4,096 keys: 10.4 us against 21.8), so it serves chunks of ATT_MMA_CHUNK_Q8 keys or more;
// and so is the half cache's (twenty-fourth session, H100, 48 caches: 1,024 keys 13.18 -> 9.80 us,
// 4,096 keys 18.49 -> 11.48, 32,768 keys 32.35 -> 31.65), which serves chunks of ATT_MMA_CHUNK or more.
#ifndef ATT_MMA_CHUNK
#define ATT_MMA_CHUNK 32 /* keys of a chunk from which the half cache's blocks take the tensor cores: every chunk */
#endif
#ifndef ATT_MMA_CHUNK_Q8
#define ATT_MMA_CHUNK_Q8 32 /* the same for a q8_0 cache: every chunk */
#endif
// Keys of a chunk from which a cache of KT (kv_type) takes the tensor-core blocks.
template <typename KT> constexpr int att_mma_chunk = kv_is_q8<KT> ? ATT_MMA_CHUNK_Q8 : ATT_MMA_CHUNK;
static int att_mma_chunk_of(int kv_type) { return kv_type == ST_TYPE_Q8_0 ? ATT_MMA_CHUNK_Q8 : ATT_MMA_CHUNK; }
template <int NQ, typename KT>
__device__ __forceinline__ static void attend_chunk_mma(const float *qg, int nh, const KT *kc, const KT *vc, int hd,
                                                        int start, int end, float scale, float *out, int64_t ostride,
                                                        float *stage, float *direct = NULL) {
  if (start >= end) {
    if ((int)threadIdx.x < nh) out[threadIdx.x * ostride] = -INFINITY, out[threadIdx.x * ostride + 1] = 0.0f;
    return;
  }
  if (hd == 128) attend_group_chunk_mma<128, NQ, KT>(qg, nh, kc, vc, start, end, scale, out, ostride, stage, direct);
  else attend_group_chunk_mma<64, NQ, KT>(qg, nh, kc, vc, start, end, scale, out, ostride, stage, direct);
}

// Dynamic shared memory of the tensor-core kernels: the warps' outputs.
static size_t att_mma_smem_bytes(int hd, int nqb) { return sizeof(float) * ATT_WARPS * nqb * (hd + 1); }

// Whether the tensor-core kernels take this attention (see attend_chunk_mma): a half cache, head_dim
// 64 or 128, 16-byte aligned pointers (q, and each of the n cache rows' bases in kv), sm_80 or later.
static bool att_mma_ok(int kv_type, int hd, const void *q, int64_t ldq, const void *const *kv, int n) {
  if ((kv_type != ST_TYPE_F16 && kv_type != ST_TYPE_Q8_0) || (hd != 64 && hd != 128) || ((uintptr_t)q & 15) || (ldq % 4)) return false;
  for (int i = 0; i < n; i++)
    if ((uintptr_t)kv[i] & 15) return false;
  return st_cuda_compute_capability() >= 80;
}

// Merges the first `used` (<= ATT_SPLIT) chunk partials of nh heads (head h's chunk c at p + h
// hstride + c (hd + 2), hd <= 256) in chunk order into o + h ostride: out = sum_c A_c f_c / L, f_c =
// e^(M_c - M), M = max_c M_c, L = sum_c L_c f_c (a butterfly over the warp's lanes, lane c holding
// chunks c and c + 32). A warp a head (warps take every nw-th head), no block barrier: a lane loads
// its two chunks' (M, L), then its dimensions lane + 32 j of CB chunks at a time, all in flight
// together (the merge waits on a few L2 round trips, not one a chunk, nor on a block barrier and a
// serial sum: on an H100 0.3-1.6 us less a launch than the block-wide merge from 128 keys to 32,768,
// bench/RESULTS.md 2026-12-06, thirty-first session). Per output value the
// arithmetic depends on nothing but the partials, so every caller (any block size, any heads per
// block) gets the same bits; with one chunk they are the block's own A / L (attend_group_chunk's
// direct). Loads bypass L1 (another block of the same kernel may have written p).
template <int JM, int CB>
__device__ __forceinline__ static void attend_merge_head(const float *ph, int used, int hd, float *oh, const float *sink) {
  const int lane = threadIdx.x & 31, c0 = lane, c1 = lane + 32;
  // every load unconditional (a chunk past `used` reads chunk used - 1 and is dropped): guarded ones were
  // issued one at a time by ptxas in the kernels with the most registers live (bench/RESULTS.md,
  // twenty-third session); first the lane's two maxima and sums
  const float *p0 = ph + (int64_t)min(c0, used - 1) * (hd + 2), *p1 = ph + (int64_t)min(c1, used - 1) * (hd + 2);
  const float m0r = __ldcg(p0), m1r = __ldcg(p1), l0 = __ldcg(p0 + 1), l1 = __ldcg(p1 + 1);
  const float m0 = c0 < used ? m0r : -INFINITY, m1 = c1 < used ? m1r : -INFINITY;
  float M = fmaxf(m0, m1);
  for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
  if (sink) M = fmaxf(M, *sink); // the head's sink: one more logit in the denominator
  const float f0 = c0 < used ? expf(m0 - M) : 0.0f, f1 = c1 < used ? expf(m1 - M) : 0.0f;
  float L = c1 < used ? fmaf(l1, f1, l0 * f0) : c0 < used ? l0 * f0 : 0.0f;
  for (int off = 16; off > 0; off >>= 1) L += __shfl_xor_sync(0xffffffffu, L, off); // the same bits in every lane
  if (sink) L += expf(*sink - M);
  float a[JM];
#pragma unroll
  for (int j = 0; j < JM; j++) a[j] = 0.0f;
  for (int cb = 0; cb < used; cb += CB) {
    float v[CB][JM];
#pragma unroll
    for (int u = 0; u < CB; u++) {
      const float *pc = ph + (int64_t)min(cb + u, used - 1) * (hd + 2) + 2 + lane;
#pragma unroll
      for (int j = 0; j < JM; j++) v[u][j] = __ldcg(pc + min(32 * j, hd - 1 - lane)); // past hd: a value of the row, dropped
    }
#pragma unroll
    for (int u = 0; u < CB; u++) {
      const int c = cb + u;
      const float f = __shfl_sync(0xffffffffu, c < 32 ? f0 : f1, c & 31);
      if (c < used)
#pragma unroll
        for (int j = 0; j < JM; j++) a[j] = fmaf(v[u][j], f, a[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < JM; j++)
    if (lane + 32 * j < hd) oh[lane + 32 * j] = a[j] / L;
}
__device__ __forceinline__ static void attend_merge_heads(const float *p, int64_t hstride, int nh, int used, int hd,
                                                          float *o, int64_t ostride, const float *sinks = NULL) {
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int h = warp; h < nh; h += nw) {
    const float *sink = sinks ? sinks + h : NULL;
    if (hd <= 128) attend_merge_head<4, 16>(p + h * hstride, used, hd, o + h * ostride, sink);
    else attend_merge_head<8, 8>(p + h * hstride, used, hd, o + h * ostride, sink);
  }
}

// ---- short contexts: one block a (KV group, heads) over every key ------------------------------
// Up to ATT_SHORT_MAX keys, a token's attention is one block per (KV group, NQ heads) that copies
// every K and V row into shared memory at once, where the split-K kernels pay a tile loop (about
// 2 us a tile of 32 keys) and, past 64 keys, a merge by the last block (about 4.7 us): the decode
// step's short contexts (rope_short, which also does the q/k norms, RoPE and KV append) and the
// attention codelet's T = 1 path (attend_short) run the same block, so they agree bit for bit.
#define ATT_SHORT_MAX 128

// Keys of a short context for head_dim hd and es-byte elements: ATT_SHORT_MAX, or half of it where
// their K and V rows would pass 128 KiB of shared memory (head_dim 256 in float32).
__host__ __device__ __forceinline__ static int att_short_max(int hd, size_t es) {
  return 2 * (size_t)ATT_SHORT_MAX * hd * es <= 128 * 1024 ? ATT_SHORT_MAX : ATT_SHORT_MAX / 2;
}
// Dynamic shared memory of attend_short_block: every key's K and V rows (es-byte elements), then
// the warps' accumulators.
static size_t att_short_smem(int hd, int nd, int nqb, size_t es) {
  return 2 * (size_t)att_short_max(hd, es) * hd * es + sizeof(float) * ATT_WARPS * nqb * nd * 32;
}

// Keys j0 <= j < n of a float or half cache (key j at row lo + j, modulo ring when ring > 0) into
// the rows ks, vs ([n][hd]; key j at row j) of attend_short_block's shared memory: att_stage's copies
// of the one or two runs of contiguous rows (a ring's rows wrap once at most), each its own group.
template <typename KT>
__device__ __forceinline__ static void att_short_copy(KT *ks, KT *vs, const KT *kc, const KT *vc, int hd, int j0, int n,
                                                      int lo, int ring) {
  constexpr int PER = 16 / sizeof(KT);
  const bool vec = hd % PER == 0 && (((uintptr_t)kc | (uintptr_t)vc) & 15) == 0;
  while (j0 < n) {
    const int r = ring ? (lo + j0) % ring : lo + j0, len = ring ? min(n - j0, ring - r) : n - j0;
    att_stage(ks + (int64_t)j0 * hd, vs + (int64_t)j0 * hd, kc, vc, r, len, hd, vec);
    j0 += len;
  }
}

// Keys j0 <= j < n (as att_short_copy numbers them) into attend_short_block's K and V rows at smem:
// a float or half cache's by asynchronous copies still in flight on return (the caller waits), a
// q8_0 cache's as halves.
template <typename KT>
__device__ __forceinline__ static void att_short_stage(uint8_t *smem, const KT *kc, const KT *vc, int hd, int j0, int n,
                                                       int lo, int ring) {
  using ST = kv_smem_t<KT>;
  ST *ks = (ST *)smem, *vs = ks + (size_t)att_short_max(hd, sizeof(ST)) * hd;
  if constexpr (kv_is_q8<KT>) att_stage_q8(ks, vs, kc, vc, n, hd, lo, ring, j0);
  else att_short_copy(ks, vs, kc, vc, hd, j0, n, lo, ring);
}

// Causal attention of nh <= NQ query heads (qs: shared memory, head i at qs + i hd) over keys
// [0, n) of kc, vc ([keys][hd] of KT; 1 <= n <= att_short_max) into out (head i at out + i hd), by a
// block of ATT_WARPS warps: the rows copied into `smem` (att_short_smem bytes; att_short_stage, the
// first `staged` keys' copies already issued by the caller); the scores of key j by warp j % 8 (lanes share the head
// dimensions, the NQ dot products reduced by att_transpose_sum, as attend_group_chunk's); each
// head's softmax over all n keys by one warp (its max, then e^(s - max) and their sum: per lane in
// key order, then a butterfly); P V by warp j % 8 for its keys; the warps' sums added in warp order,
// divided by the head's sum. Fixed order throughout: the same bits every run.
template <int ND, int NQ, typename KT>
__device__ __forceinline__ static void attend_short_block(const float *qs, int nh, const KT *kc, const KT *vc, int hd,
                                                          int n, float scale, float *out, uint8_t *smem, int lo = 0,
                                                          int ring = 0, const float *sinks = NULL, int staged = 0) {
  __shared__ float ps[NQ][ATT_SHORT_MAX], lsum[NQ];
  using ST = kv_smem_t<KT>; // a q8_0 cache's rows as halves
  constexpr int B = att_log2(NQ);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const size_t rows = (size_t)att_short_max(hd, sizeof(ST)) * hd;
  ST *ks = (ST *)smem, *vs = ks + rows;
  float *wacc = (float *)(smem + 2 * rows * sizeof(ST));
  att_short_stage(smem, kc, vc, hd, staged, n, lo, ring);
  st_dev_cp_wait_all();
  __syncthreads(); // the rows (and the caller's qs) are in shared memory
  float q[NQ][ND];
  att_load_q<ND, NQ>(q, qs, nh, hd, lane);
  for (int j = warp; j < n; j += ATT_WARPS) {
    float kr[ND], v[NQ];
#pragma unroll
    for (int i = 0; i < ND; i++) kr[i] = lane + 32 * i < hd ? kv_ld(ks + j * hd + lane + 32 * i) : 0.0f;
#pragma unroll
    for (int h = 0; h < NQ; h++) {
      v[h] = 0.0f;
#pragma unroll
      for (int i = 0; i < ND; i++) v[h] = fmaf(q[h][i], kr[i], v[h]);
    }
    att_transpose_sum<NQ>(v, lane);
    if ((lane & ((32 >> B) - 1)) == 0) ps[lane >> (5 - B)][j] = v[0] * scale;
  }
  __syncthreads();
  if (warp < nh) { // warp h: head h's softmax, lane l over keys l, l + 32, ...
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, ps[warp][j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (sinks) mx = fmaxf(mx, sinks[warp]);
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float p = expf(ps[warp][j] - mx);
      ps[warp][j] = p;
      sum += p;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) lsum[warp] = sinks ? sum + expf(sinks[warp] - mx) : sum; // the sink: in the denominator only
  }
  __syncthreads();
  float acc[NQ][ND];
#pragma unroll
  for (int h = 0; h < NQ; h++)
#pragma unroll
    for (int i = 0; i < ND; i++) acc[h][i] = 0.0f;
  for (int j = warp; j < n; j += ATT_WARPS) {
    float vr[ND];
#pragma unroll
    for (int i = 0; i < ND; i++) vr[i] = lane + 32 * i < hd ? kv_ld(vs + j * hd + lane + 32 * i) : 0.0f;
#pragma unroll
    for (int h = 0; h < NQ; h++) {
      const float p = ps[h][j];
#pragma unroll
      for (int i = 0; i < ND; i++) acc[h][i] = fmaf(p, vr[i], acc[h][i]);
    }
  }
  att_warps_sum<ND, NQ>(acc, wacc, nh, hd, [&](int h, int dd, float a) { out[h * hd + dd] = a / lsum[h]; });
}

// The attention codelet's T = 1 path up to ATT_SHORT_MAX keys: block b takes heads b NQ .. of one
// KV group's nq query heads (q [nq][hd], already normed and rotated) over keys [0, n).
template <int ND, int NQ, typename KT>
__global__ static void __launch_bounds__(32 * ATT_WARPS)
    attend_short(const float *q, const KT *kc, const KT *vc, int hd, int nq, int n, float scale, float *out) {
  __shared__ __align__(16) float qs[32 * 32]; // NQ hd <= 1024 (att_nq)
  extern __shared__ float4 att_dyn[];
  const int h0 = blockIdx.x * NQ, nh = min(NQ, nq - h0);
  for (int e = threadIdx.x; e < nh * hd; e += blockDim.x) qs[e] = q[(int64_t)h0 * hd + e];
  attend_short_block<ND, NQ, KT>(qs, nh, kc, vc, hd, n, scale, out + (int64_t)h0 * hd, (uint8_t *)att_dyn);
}

// Heads a short-context block takes (attend_short_block's NQ, which its sums' order depends on): at
// most ATT_SHORT_NQ, one, so that the decode step's few keys are read by a block a query head (bench
// variant: -DATT_SHORT_NQ=2, two heads a block). On an H100 (bench/RESULTS.md 2026-12-07, thirty-sixth
// session) one head a block took an 8-layer cut's GPU span a step from 556 to 553 us (qwen3, 32 heads)
// and from 799 to 772 us (gpt-oss, 64 heads).
#ifndef ATT_SHORT_NQ
#define ATT_SHORT_NQ 1
#endif
static_assert(ATT_SHORT_NQ == 1 || ATT_SHORT_NQ == 2, "att_short_dispatch: one or two heads a block");
// rope_short's work before its wait for Q/K/V (a programmatic dependent's start): the old keys' rows
// into shared memory, the norms' weights, biases and RoPE row into L2, so that none of the block's
// dependent loads after the wait goes to DRAM. On an H100 (bench/RESULTS.md 2026-12-08, forty-second
// session) the full qwen3-30b-a3b Q8_0 model's every-expert decode went 385.0 / 383.7 -> 395.1 / 393.9
// tok/s against the same build without it. (The thirty-seventh session's copies started after the
// wait, before the norms, and gained nothing: the DRAM latency of the norms' weights and the RoPE
// row, loaded after the norm's sum, stayed on the path.) Bench variant: -DATT_SHORT_EARLY=0, as before.
#ifndef ATT_SHORT_EARLY
#define ATT_SHORT_EARLY 1
#endif
static int att_short_nq(int nq, int hd) { return att_nq(nq, hd) < ATT_SHORT_NQ ? att_nq(nq, hd) : ATT_SHORT_NQ; }

// The decode step's q/k norms, RoPE and KV append in one launch, and with at most ATT_SHORT_MAX keys
// (and out set) its attention too: block g n_hb + b takes KV group g's query heads b NQ .. (nq a
// group, n_hb blocks a group). Each head is normed (qw) and rotated at position *pos_dev by two warps
// (norm_rope_threads: the bits of qk_norm_rope's 64-thread blocks) into shared memory when the block
// computes the attention, else in place in q for attend_decode_all; the group's new K row (kvnew[g
// hd ..], normed with kw and rotated) and V row (kvnew[(G + g) hd ..]) are written at the position
// of its caches as KT (every block of the group writes the same values, before it reads them); then
// attend_short_block into out, and with outq its heads quantised there too (st_dev_q8_span; hd a
// multiple of 32). Before its wait (ATT_SHORT_EARLY) the block stages every key but the new one for
// the position it reads then and prefetches its small operands; after the wait a different position
// (layer 0's dk_pre writes it) stages them again. Dynamic shared memory: att_short_smem.
template <int ND, int NQ, typename KT>
__global__ static void __launch_bounds__(32 * ATT_WARPS)
    rope_short(float *q, int nq, const float *kvnew, int G, int hd, const float *qw, const float *kw, float eps,
               const int *pos_dev, const __grid_constant__ kv_ptrs kv, const float2 *tab, float scale, float *out,
               int8_t *outq, const __grid_constant__ st_cuda_attn_ext x) {
  __shared__ __align__(16) float qs[32 * 32]; // NQ hd <= 1024 (att_nq)
  __shared__ float red[ATT_WARPS / 2][2];
  __shared__ float krow[kv_is_q8<KT> ? 256 : 1]; // a q8_0 cache's new K row in float32, then quantised
  extern __shared__ float4 att_dyn[];
  st_dev_griddep_launch();
  const int n_hb = (nq + NQ - 1) / NQ, g = blockIdx.x / n_hb, h0 = g * nq + (int)(blockIdx.x % n_hb) * NQ;
  const int nh = min(NQ, (g + 1) * nq - h0);
  const auto first_key = [&x](int n) { return x.window && n > x.window ? n - x.window : 0; }; // the window's
  int staged = 0, pos_early = -1;
#if ATT_SHORT_EARLY
  // before the wait, what no kernel of this step writes: the rows of every key but the new one at
  // the position the step had when the block started (layer 0's dk_pre may still be writing it; the
  // wait's position decides), and the norms' weights, the biases and the position's RoPE row to L2
  pos_early = __ldcv(pos_dev);
  if (out) {
    const int n = pos_early + 1, lo = first_key(n);
    if (n - lo <= att_short_max(hd, kv_es<KT>)) {
      staged = n - lo - 1;
      att_short_stage((uint8_t *)att_dyn, (const KT *)kv.k[g], (const KT *)kv.v[g], hd, 0, staged, lo, x.ring);
    }
  }
  const int t0 = threadIdx.x, nt = blockDim.x;
  const size_t hb = sizeof(float) * (size_t)hd;
  st_dev_prefetch(qw, hb, t0, nt);
  st_dev_prefetch(kw, hb, t0, nt);
  st_dev_prefetch(tab + (int64_t)max(pos_early, 0) * (hd / 2), hb, t0, nt);
  st_dev_prefetch(x.bq ? x.bq + (int64_t)h0 * hd : NULL, hb * nh, t0, nt);
  st_dev_prefetch(x.bk ? x.bk + (int64_t)g * hd : NULL, hb, t0, nt);
  st_dev_prefetch(x.bv ? x.bv + (int64_t)g * hd : NULL, hb, t0, nt);
#endif
  st_dev_griddep_wait();
  const int pos = *pos_dev, n = pos + 1, row = x.ring ? pos % x.ring : pos;
  const int lo = first_key(n);
  const bool attend_here = out && n - lo <= att_short_max(hd, kv_es<KT>);
  if (pos != pos_early && staged) { // block-uniform: the rows staged are another position's
    st_dev_cp_wait_all();
    __syncthreads();
    staged = 0;
  }
  const float2 *cs = tab + (int64_t)pos * (hd / 2);
  const int grp = threadIdx.x >> 6, t = threadIdx.x & 63;
  for (int it = grp; it <= nh; it += ATT_WARPS / 2) { // the heads, then the K row; a group's 64 threads alike
    const auto sync = [grp] { asm volatile("bar.sync %0, 64;" ::"r"(1 + grp) : "memory"); };
    if (it < nh) {
      float *qh = q + (int64_t)(h0 + it) * hd;
      norm_rope_threads<true>(qh, attend_here ? qs + it * hd : qh, hd, qw, eps, pos, 0.0f, red[grp], cs, t, 64, sync,
                              x.bq ? x.bq + (int64_t)(h0 + it) * hd : NULL, x.n_rot);
    } else if constexpr (kv_is_q8<KT>) {
      norm_rope_threads<true>(kvnew + (int64_t)g * hd, krow, hd, kw, eps, pos, 0.0f, red[grp], cs, t, 64, sync,
                              x.bk ? x.bk + (int64_t)g * hd : NULL, x.n_rot);
    } else {
      norm_rope_threads<true>(kvnew + (int64_t)g * hd, (KT *)kv.k[g] + (int64_t)row * hd, hd, kw, eps, pos, 0.0f,
                              red[grp], cs, t, 64, sync, x.bk ? x.bk + (int64_t)g * hd : NULL, x.n_rot);
    }
  }
  const float *vn = kvnew + (int64_t)(G + g) * hd, *vb = x.bv ? x.bv + (int64_t)g * hd : NULL;
  if constexpr (kv_is_q8<KT>) {
    __syncthreads(); // the K row is in krow
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nb = hd / 32;
    uint8_t *kr = (uint8_t *)kv.k[g] + (int64_t)row * kv_q8_row_bytes(hd), *vr = (uint8_t *)kv.v[g] + (int64_t)row * kv_q8_row_bytes(hd);
    for (int b = warp; b < 2 * nb; b += ATT_WARPS) { // the K row's blocks, then the V row's
      const int i = 32 * (b % nb) + lane;
      const float xv = b < nb ? krow[i] : vb ? vn[i] + vb[i] : vn[i];
      kv_q8_block(xv, b < nb ? kr : vr, hd, b % nb, lane);
    }
  } else {
    KT *vr = (KT *)kv.v[g] + (int64_t)row * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) kv_st(vr + i, vb ? vn[i] + vb[i] : vn[i]);
  }
  if (!attend_here) return; // block-uniform
  __syncthreads(); // (attend_short_block's copies start after another barrier: qs and the new rows are written)
  attend_short_block<ND, NQ, KT>(qs, nh, (const KT *)kv.k[g], (const KT *)kv.v[g], hd, n - lo, scale,
                                 out + (int64_t)h0 * hd, (uint8_t *)att_dyn, lo, x.ring, x.sinks ? x.sinks + h0 : NULL,
                                 staged);
  if (!outq) return;
  __syncthreads(); // the block's heads are in out
  st_dev_q8_span(out, (int64_t)h0 * hd, nh * hd, (int64_t)G * nq * hd, outq);
}

// The codelet's split-K kernels (any T): block (c, t n_hb + b) of attend_group_chunk for one KV
// group's nq query heads of token t ([T][ldq], head h at h hd); partials of (t, h) at part + ((t nq +
// h) n_chunks + c) (hd + 2), chunks of `chunk` keys.
// MMA: the tensor-core block (KT __half or kv_q8, ND 4; att_mma_ok) instead of attend_group_chunk.
template <int ND, int NQ, typename KT, bool MMA>
__global__ static void __launch_bounds__(32 * ATT_WARPS, ATT_MIN_BLOCKS)
    attend_split(const float *q, int64_t ldq, const KT *kc, const KT *vc, int hd, int nq, int pos0, int chunk,
                 float scale, float *part, int nst) {
  const int n_hb = (nq + NQ - 1) / NQ, t = blockIdx.y / n_hb, h0 = (blockIdx.y % n_hb) * NQ, c = blockIdx.x;
  const int start = c * chunk, end = min(start + chunk, pos0 + t + 1);
  const int64_t hs = (int64_t)gridDim.x * (hd + 2);
  extern __shared__ float4 att_dyn[];
  const float *qg = q + (int64_t)t * ldq + (int64_t)h0 * hd;
  float *pp = part + ((int64_t)t * nq + h0) * hs + (int64_t)c * (hd + 2);
  if constexpr (MMA) attend_chunk_mma<NQ, KT>(qg, min(NQ, nq - h0), kc, vc, hd, start, end, scale, pp, hs, (float *)att_dyn);
  else attend_group_chunk<ND, NQ, KT>(qg, min(NQ, nq - h0), kc, vc, hd, start, end, scale, pp, hs, (float *)att_dyn, nst);
}

// Block (t, b) merges attend_split's chunks of token t's heads b NQ .. (attend_merge_heads).
__global__ static void attend_split_combine(const float *part, int n_chunks, int chunk, int hd, int nq, int NQ,
                                            int pos0, float *out, int64_t ldo) {
  const int t = blockIdx.x, h0 = blockIdx.y * NQ, used = (pos0 + t + 1 + chunk - 1) / chunk;
  const int64_t hs = (int64_t)n_chunks * (hd + 2);
  attend_merge_heads(part + ((int64_t)t * nq + h0) * hs, hs, min(NQ, nq - h0), used, hd,
                     out + (int64_t)t * ldo + (int64_t)h0 * hd, hd);
}

// The decode step's attention of one token over every query head in one launch: block (c, g n_hb +
// b) is attend_split's block for KV group g's heads b NQ .. and chunk c of att_chunk_keys(*pos_dev +
// 1) keys (gridDim.x = ATT_SPLIT: the grid does not change with the position, so neither does the
// CUDA graph; blocks past the keys leave at once); the last block of a (group, heads) to finish
// (counters[blockIdx.y], reset by it) merges their chunks as attend_split_combine does, and with a
// single chunk its block writes the output itself. MMA: the tensor-core block (as attend_split's);
// paired (a half cache that att_mma_ok takes): launched twice, without and then with MMA, each
// leaving at once where the chunks are the other's (ATT_MMA_CHUNK), so one CUDA graph serves every
// position. after_short: with at most att_short_max keys rope_short has written the output; leave.
// outq: the block that writes a (group, heads)'s output quantises it there too (st_dev_q8_span).
template <int ND, int NQ, typename KT, bool MMA>
__global__ static void __launch_bounds__(32 * ATT_WARPS, ATT_MIN_BLOCKS)
    attend_decode_all(const float *q, int nq, int hd, const __grid_constant__ kv_ptrs kv, const int *pos_dev,
                      float scale, float *part, int *counters, float *out, int8_t *outq, int nst, int paired,
                      int after_short, const __grid_constant__ st_cuda_attn_ext x) {
  __shared__ int last;
  ATT_PROBE_AT(0);
  st_dev_griddep_launch();
#ifdef ATT_MMA_WARM /* bench variant: the tensor cores' first instructions before the wait for the previous kernel */
  if constexpr (MMA) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < 4; i++) att_mma(d, (uint32_t)i, 0u, 0u, 0u);
    if (d[0] != 0.0f) out[0] = d[0]; // never: zero B operands
  }
#endif
  st_dev_griddep_wait();
  ATT_PROBE_AT(1);
  const int n_hb = (nq + NQ - 1) / NQ, g = blockIdx.y / n_hb, h0 = g * nq + (blockIdx.y % n_hb) * NQ;
  // a sliding window's keys start at lo (a window is never longer than the short contexts' keys, so
  // a ring's layers are rope_short's: rows lo.. are contiguous here)
  const int n_all = *pos_dev + 1, lo = x.window && n_all > x.window ? n_all - x.window : 0;
  const int nh = min(NQ, (g + 1) * nq - h0), c = blockIdx.x, n_keys = n_all - lo, chunk = att_chunk_keys(n_keys);
  const int used = (n_keys + chunk - 1) / chunk;
  if (after_short && n_keys <= att_short_max(hd, kv_es<KT>)) return; // rope_short's
  if (c >= used) return; // past the keys: the chunks that count are the first `used`
  if (paired && (chunk >= att_mma_chunk<KT>) != MMA) return; // the pair's other kernel takes this position
  const int64_t hs = (int64_t)ATT_SPLIT * (hd + 2);
  float *ph = part + (int64_t)h0 * hs;
  extern __shared__ float4 att_dyn[];
  const KT *kc = kv_row((const KT *)kv.k[g], lo, hd), *vc = kv_row((const KT *)kv.v[g], lo, hd);
  const int start = c * chunk, end = min(c * chunk + chunk, n_keys);
  const float *sinks = x.sinks ? x.sinks + h0 : NULL;
  float *direct = used == 1 && !sinks ? out + (int64_t)h0 * hd : NULL; // with sinks one chunk is merged too
  if constexpr (MMA)
    attend_chunk_mma<NQ, KT>(q + (int64_t)h0 * hd, nh, kc, vc, hd, start, end, scale, ph + (int64_t)c * (hd + 2), hs,
                             (float *)att_dyn, direct);
  else
    attend_group_chunk<ND, NQ, KT>(q + (int64_t)h0 * hd, nh, kc, vc, hd, start, end, scale, ph + (int64_t)c * (hd + 2),
                                   hs, (float *)att_dyn, nst, direct);
  ATT_PROBE_AT(3);
  const int64_t total = (int64_t)gridDim.y / n_hb * nq * hd; // the output row's floats
  if (direct) { // one chunk wrote the output
    if (outq) {
      __syncthreads();
      st_dev_q8_span(out, (int64_t)h0 * hd, nh * hd, total, outq);
    }
    return;
  }
  // the block's partial (every thread's stores, before the barrier) released by thread 0's count, and
  // every count acquired by the last block's thread 0, then its threads (the barrier): the PTX memory
  // model's release and acquire at GPU scope, without __threadfence's sequentially consistent fences
  // (which cost no more on an H100: bench/RESULTS.md 2026-12-06)
  __syncthreads();
  if (threadIdx.x == 0) last = att_count_acq_rel(&counters[blockIdx.y]) == used - 1;
  __syncthreads();
  if (!last) return;
  ATT_PROBE_AT(4);
  attend_merge_heads(ph, hs, nh, used, hd, out + (int64_t)h0 * hd, hd, sinks);
  if (outq) {
    __syncthreads(); // the merged heads are in out
    st_dev_q8_span(out, (int64_t)h0 * hd, nh * hd, total, outq);
  }
  ATT_PROBE_AT(5);
  if (threadIdx.x == 0) counters[blockIdx.y] = 0;
}

// Calls f(std::integral_constant ND, NQ) for the split-K kernels' instance of (nq, hd).
template <typename F> static void att_dispatch(int nq, int hd, F &&f) {
  const int nd = att_nd(hd), b = att_nq(nq, hd);
  if (nd == 4) {
    if (b == 1) f(std::integral_constant<int, 4>(), std::integral_constant<int, 1>());
    else if (b == 2) f(std::integral_constant<int, 4>(), std::integral_constant<int, 2>());
    else if (b == 4) f(std::integral_constant<int, 4>(), std::integral_constant<int, 4>());
    else f(std::integral_constant<int, 4>(), std::integral_constant<int, 8>());
  } else {
    if (b == 1) f(std::integral_constant<int, 8>(), std::integral_constant<int, 1>());
    else if (b == 2) f(std::integral_constant<int, 8>(), std::integral_constant<int, 2>());
    else f(std::integral_constant<int, 8>(), std::integral_constant<int, 4>());
  }
}

// Calls f(std::integral_constant ND, NQ) for the short-context kernels' instance of (nq, hd)
// (att_short_nq heads a block).
template <typename F> static void att_short_dispatch(int nq, int hd, F &&f) {
  const bool two = att_short_nq(nq, hd) == 2;
  if (att_nd(hd) == 4) {
    if (two) f(std::integral_constant<int, 4>(), std::integral_constant<int, 2>());
    else f(std::integral_constant<int, 4>(), std::integral_constant<int, 1>());
  } else {
    if (two) f(std::integral_constant<int, 8>(), std::integral_constant<int, 2>());
    else f(std::integral_constant<int, 8>(), std::integral_constant<int, 1>());
  }
}

// Dynamic shared memory each split-K kernel may take on a device (att_allow_smem), by device,
// kernel (0 attend_split, 1 attend_decode_all), KV element (0 float, 1 half), ND / 4 - 1 and log2
// NQ; 0: not asked yet, when the default 48 KiB less its static memory is all it may take.
#define ATT_MAX_DEVICES 64
#define ATT_DEFAULT_ROOM (40 * 1024) /* the default 48 KiB less the kernels' static memory (at most 5.3 KiB) */
static size_t att_room[ATT_MAX_DEVICES][2][2][2][4];

template <typename K> static size_t att_room_of(K kernel) {
  int dev = 0, optin = 48 * 1024;
  cudaFuncAttributes fa = {};
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
    cudaGetLastError();
    return ATT_DEFAULT_ROOM;
  }
  return (size_t)optin > fa.sharedSizeBytes ? (size_t)optin - fa.sharedSizeBytes : 0;
}

// Lets every split-K kernel take all the dynamic shared memory the current device allows and notes
// how much that is: at each CUDA worker's start (st_cuda_worker_init, after any device reset and
// outside any stream capture) and for the tests' own launches.
static void att_allow_smem() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= ATT_MAX_DEVICES) {
    cudaGetLastError();
    return;
  }
  for (int nd = 4; nd <= 8; nd += 4)
    for (int b = 1; b <= 32 / nd; b *= 2)
      att_dispatch(b, nd == 4 ? 128 : 256, [&](auto ndc, auto nqc) {
        constexpr int ND = decltype(ndc)::value, NQ = decltype(nqc)::value;
        constexpr int LQ = att_log2(NQ);
        for (int kt = 0; kt < 3; kt++) // float, half, then q8_0 (whose tiles are halves: the half's rooms)
          kv_dispatch_q8(kt == 2 ? ST_TYPE_Q8_0 : kt ? ST_TYPE_F16 : ST_TYPE_F32, [&](auto tag) {
            using KT = typename decltype(tag)::type;
            const size_t r0 = att_room_of(attend_split<ND, NQ, KT, false>),
                         r1 = att_room_of(attend_decode_all<ND, NQ, KT, false>);
            ST_CUDA_CHECK(cudaFuncSetAttribute(attend_split<ND, NQ, KT, false>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)r0));
            ST_CUDA_CHECK(cudaFuncSetAttribute(attend_decode_all<ND, NQ, KT, false>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)r1));
            const int slot = kv_es<KT> == 2;
            if (kt < 2 || r0 < att_room[dev][0][slot][ND / 4 - 1][LQ]) att_room[dev][0][slot][ND / 4 - 1][LQ] = r0;
            if (kt < 2 || r1 < att_room[dev][1][slot][ND / 4 - 1][LQ]) att_room[dev][1][slot][ND / 4 - 1][LQ] = r1;
          });
      });
  for (int nd = 4; nd <= 8; nd += 4)
    for (int b = 1; b <= 2; b *= 2)
      att_short_dispatch(b, nd == 4 ? 128 : 256, [&](auto ndc, auto nqc) {
        constexpr int ND = decltype(ndc)::value, NQ = decltype(nqc)::value;
        for (int kt = 0; kt < 3; kt++)
          kv_dispatch_q8(kt == 2 ? ST_TYPE_Q8_0 : kt ? ST_TYPE_F16 : ST_TYPE_F32, [&](auto tag) {
            using KT = typename decltype(tag)::type;
            const int bytes = (int)att_short_smem(ND == 4 ? 128 : 256, ND, NQ, kv_es<KT>);
            ST_CUDA_CHECK(cudaFuncSetAttribute(attend_short<ND, NQ, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
            ST_CUDA_CHECK(cudaFuncSetAttribute(rope_short<ND, NQ, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
          });
      });
}

// The stages (att_stages) and dynamic bytes of kernel `kind` for (hd, ND, NQ) and es-byte KV
// elements on the current device.
static int att_plan(int kind, int hd, int nd, int nqb, size_t es, size_t *bytes) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) cudaGetLastError(), dev = -1;
  const int lq = att_log2(nqb);
  size_t room = dev >= 0 && dev < ATT_MAX_DEVICES ? att_room[dev][kind][es == 2][nd / 4 - 1][lq] : 0;
  if (!room) room = ATT_DEFAULT_ROOM;
#ifdef ATT_PLAN_ES /* bench variant: plan the stages as for another element size */
  es = ATT_PLAN_ES;
#endif
  const int nst = att_stages(hd, nd, nqb, es, room);
  *bytes = att_smem_bytes(hd, nd, nqb, nst, es);
  return nst;
}

// att_plan for a cache of KT: a q8_0 cache's blocks read its rows from their shared tiles only, so it
// takes one stage at least (its 2-byte tiles fit the default room at every head_dim, 32 KiB at 256).
template <typename KT> static int att_plan_kt(int kind, int hd, int nd, int nqb, size_t *bytes) {
  int nst = att_plan(kind, hd, nd, nqb, kv_es<KT>, bytes);
  if (kv_is_q8<KT> && !nst) nst = 1, *bytes = att_smem_bytes(hd, nd, nqb, 1, kv_es<KT>);
  return nst;
}

// Merges `used` chunk partials p (attend_flash's layout) of one query row in chunk order into o:
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

// Merges attend_flash's chunks of (t, h) in chunk order (attend_merge).
__global__ static void attend_combine(const float *part, int n_chunks, int chunk, int hd, int pos0, float *out,
                                      int64_t ldo) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int used = (pos0 + t + 1 + chunk - 1) / chunk;
  attend_merge(part + ((int64_t)t * gridDim.y + h) * n_chunks * (hd + 2), used, hd,
               out + (int64_t)t * ldo + (int64_t)h * hd);
}

// Causal attention of a prompt chunk (T > 1), tiled as in FlashAttention-2 (Dao, 2023), in
// float32 on the CUDA cores. The group's T x n_q queries are rows r = t * n_q + h (q's layout);
// block (b, c) takes rows [b * FA_ROWS, (b + 1) * FA_ROWS) over the keys [c * chunk, (c + 1) * chunk)
// that its last token sees. Each tile of FA_KEYS keys is read once into shared memory and serves
// all the block's rows (the split-K kernels read every key once per block and pay a warp
// reduction per key): S = Q K^T over slices of FA_DK head dimensions, each row's online softmax, then
// O += P V over slices of the tile's values. Warp w owns rows 8w..8w+7; lane l owns keys l and
// l + 32 of S and head dimensions 4g..4g+3 (g = l + 32n) of O, so a row's max and sum are
// reductions inside one warp. With one chunk the block writes the output itself; otherwise its
// partials ((max, sum, hd weighted values) per chunk) go to attend_combine. Fixed summation order, no atomics.
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

// NV: float4 groups of head dimensions per lane (1: head_dim <= 128, 2: <= 256); KT: the cache's element.
template <int NV, typename KT>
__global__ static void __launch_bounds__(FA_THREADS, 2)
    attend_flash(const float *q, int64_t ldq, const KT *kc, const KT *vc, int hd, int nq, int T, int pos0,
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
        if (key < kend && d < hd) kv = kv_ld4(kc + (int64_t)key * hd + d);
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
        if (key < kend) vv = kv_ld4(vc + (int64_t)key * hd + d);
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

// ---- the prompt path's flash attention on the tensor cores (a half cache, sm_80 and later) ------
// attend_flash's tiling (64 query rows a block, tiles of 64 keys, the same chunks and partials, so
// attend_combine merges either), with both products as mma.sync m16n8k16 (f16 inputs, f32
// accumulators; PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type"), as in
// FlashAttention-2 (Dao, 2023). Warp w owns rows 16w..16w+15; lane 4g + t holds rows g and g + 8.
// Each tile's K and V rows are copied to shared memory (cp.async, two stages: the next tile lands
// while this one computes); S = Q K^T takes Q's A fragments from registers (the queries times
// scale x log2(e), rounded to half once) and K's B fragments by ldmatrix; the online softmax runs
// in log2 units (exp2) on S's accumulators, which are laid out as the A fragments of P V (P rounded
// to half); V's B fragments come by ldmatrix.trans. A row's sum is kept per lane and added over its
// four lanes at the end. The partial's max goes out in natural units, as attend_flash's. Q and P
// in half: a rounding of 2^-11 relative that attend_flash does not have (bounded in
// tests/test_cuda_kernels). Fixed order throughout: the same bits every run.
#define FM_THREADS 128 /* 4 warps of 16 query rows: FA_ROWS rows a block */
#define FM_PAD 8       /* halves after each shared row: ldmatrix's eight row addresses hit distinct banks */
static_assert(FA_ROWS == 16 * (FM_THREADS / 32) && FA_KEYS % 16 == 0, "attend_flash_mma: 16 rows a warp, 16 keys a step");

// Four 8 x 8 matrices of halves from shared memory (ldmatrix; lanes 8i..8i+7 give matrix i's row
// addresses), plain or (TRANS) transposed.
template <bool TRANS> __device__ __forceinline__ static void fm_ldsm4(uint32_t (&r)[4], const __half *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
#else
  __trap();
#endif
}

// Dynamic shared memory of attend_flash_mma: two stages of a tile's K and V rows.
static size_t fm_smem_bytes(int hd) { return sizeof(__half) * 2 * 2 * FA_KEYS * (size_t)(hd + FM_PAD); }

template <int HD>
__global__ static void __launch_bounds__(FM_THREADS)
    attend_flash_mma(const float *q, int64_t ldq, const __half *kc, const __half *vc, int nq, int T, int pos0,
                     float scale, int chunk, float *part, float *out, int64_t ldo) {
  static_assert(HD % 16 == 0 && HD <= 128, "attend_flash_mma: head_dim a multiple of 16, at most 128");
  constexpr int LD = HD + FM_PAD, KS = HD / 16, NT = HD / 8, NK = FA_KEYS / 8, CH = HD / 8;
  extern __shared__ __align__(16) unsigned char fm_smem[];
  __half *ks = (__half *)fm_smem, *vs = ks + 2 * FA_KEYS * LD; // [stage][key][LD]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rows = T * nq, row0 = blockIdx.x * FA_ROWS, c = blockIdx.y, n_split = gridDim.y;
  const int kbeg = c * chunk, kend = min(kbeg + chunk, pos0 + (min(row0 + FA_ROWS, rows) - 1) / nq + 1);
  if (kbeg >= kend) return; // the chunk starts after the block's last token: no partial is read
  const int ra = row0 + 16 * warp + g, rb = ra + 8; // this lane's two rows
  const int last_a = ra < rows ? pos0 + ra / nq : -1, last_b = rb < rows ? pos0 + rb / nq : -1;
  const int wr = min(row0 + 16 * warp + 15, rows - 1);
  const int w_last = wr >= row0 + 16 * warp ? pos0 + wr / nq : -1; // the warp's last key (-1: no rows)
  const float sl2 = scale * 1.4426950408889634f;                    // log2(e): scores in log2 units
  uint32_t qa[KS][4]; // A fragments of Q: rows g, g + 8; dimensions 16 s + 2t, + 1 and 16 s + 8 + 2t, + 1
  {
    const float *qa_row = ra < rows ? q + (int64_t)(ra / nq) * ldq + (int64_t)(ra % nq) * HD : NULL;
    const float *qb_row = rb < rows ? q + (int64_t)(rb / nq) * ldq + (int64_t)(rb % nq) * HD : NULL;
    const float2 z = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int s = 0; s < KS; s++) {
      const float2 a0 = qa_row ? *(const float2 *)(qa_row + 16 * s + 2 * t) : z;
      const float2 a1 = qb_row ? *(const float2 *)(qb_row + 16 * s + 2 * t) : z;
      const float2 a2 = qa_row ? *(const float2 *)(qa_row + 16 * s + 8 + 2 * t) : z;
      const float2 a3 = qb_row ? *(const float2 *)(qb_row + 16 * s + 8 + 2 * t) : z;
      qa[s][0] = att_h2(a0.x * sl2, a0.y * sl2), qa[s][1] = att_h2(a1.x * sl2, a1.y * sl2);
      qa[s][2] = att_h2(a2.x * sl2, a2.y * sl2), qa[s][3] = att_h2(a3.x * sl2, a3.y * sl2);
    }
  }
  float o[NT][4]; // output tile n: [0], [1] row g, dimensions 8n + 2t, + 1; [2], [3] row g + 8
#pragma unroll
  for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f; // running max (log2 units), this lane's sums
  // Copies keys [k0, k0 + FA_KEYS) to stage st; rows past kend are zeros (the cache may hold NaN there).
  auto load = [&](int k0, int st) {
    for (int e = threadIdx.x; e < FA_KEYS * CH; e += FM_THREADS) {
      const int j = e / CH, d = 8 * (e % CH), key = k0 + j;
      __half *kd = ks + (st * FA_KEYS + j) * LD + d, *vd = vs + (st * FA_KEYS + j) * LD + d;
      if (key < kend) {
        st_dev_cp16(kd, kc + (int64_t)key * HD + d);
        st_dev_cp16(vd, vc + (int64_t)key * HD + d);
      } else {
        *(uint4 *)kd = make_uint4(0u, 0u, 0u, 0u);
        *(uint4 *)vd = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    st_dev_cp_commit();
  };
  const int n_tiles = (kend - kbeg + FA_KEYS - 1) / FA_KEYS, mi = lane >> 3, ri = lane & 7;
  load(kbeg, 0);
  for (int it = 0; it < n_tiles; it++) {
    const int st = it & 1, k0 = kbeg + it * FA_KEYS;
    if (it + 1 < n_tiles) {
      load(k0 + FA_KEYS, st ^ 1);
      st_dev_cp_wait_prev();
    } else {
      st_dev_cp_wait_all();
    }
    __syncthreads(); // this stage's rows (every thread's copies and zeros) are in shared memory
    if (k0 <= w_last) {
      const __half *kt = ks + st * FA_KEYS * LD, *vt = vs + st * FA_KEYS * LD;
      float sc[NK][4]; // S tile n: [0], [1] row g, keys k0 + 8n + 2t, + 1; [2], [3] row g + 8
#pragma unroll
      for (int n = 0; n < NK; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
      for (int s = 0; s < KS; s++)
#pragma unroll
        for (int n2 = 0; n2 < NK / 2; n2++) { // keys 16 n2 .. + 16: matrices (keys +0, +8) x (dims +0, +8)
          uint32_t b[4];
          fm_ldsm4<false>(b, kt + (16 * n2 + (mi >> 1) * 8 + ri) * LD + 16 * s + (mi & 1) * 8);
          fm_mma(sc[2 * n2], qa[s], b[0], b[1]);
          fm_mma(sc[2 * n2 + 1], qa[s], b[2], b[3]);
        }
      float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
      for (int n = 0; n < NK; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int key = k0 + 8 * n + 2 * t + e;
          if (key > last_a || key >= kend) sc[n][e] = -INFINITY;
          if (key > last_b || key >= kend) sc[n][2 + e] = -INFINITY;
          xa = fmaxf(xa, sc[n][e]);
          xb = fmaxf(xb, sc[n][2 + e]);
        }
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) { // the four lanes of a row
        xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, off));
        xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, off));
      }
      const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
      const float ba = na == -INFINITY ? 0.0f : na, bb = nb == -INFINITY ? 0.0f : nb; // no -inf - -inf
      const float ca = exp2f(ma - ba), cb = exp2f(mb - bb);
      ma = na, mb = nb;
      la *= ca, lb *= cb;
#pragma unroll
      for (int n = 0; n < NT; n++) o[n][0] *= ca, o[n][1] *= ca, o[n][2] *= cb, o[n][3] *= cb;
      uint32_t pa[NK / 2][4]; // A fragments of P: keys 16 j + 2t, + 1 and 16 j + 8 + 2t, + 1
#pragma unroll
      for (int n = 0; n < NK; n++) {
        const float p0 = exp2f(sc[n][0] - ba), p1 = exp2f(sc[n][1] - ba);
        const float p2 = exp2f(sc[n][2] - bb), p3 = exp2f(sc[n][3] - bb);
        la += p0 + p1, lb += p2 + p3;
        pa[n >> 1][(n & 1) * 2] = att_h2(p0, p1);
        pa[n >> 1][(n & 1) * 2 + 1] = att_h2(p2, p3);
      }
#pragma unroll
      for (int j = 0; j < NK / 2; j++)
#pragma unroll
        for (int n2 = 0; n2 < NT / 2; n2++) { // dimensions 16 n2 .. + 16: matrices (keys +0, +8) x (dims +0, +8)
          uint32_t b[4];
          fm_ldsm4<true>(b, vt + (16 * j + (mi & 1) * 8 + ri) * LD + 16 * n2 + (mi >> 1) * 8);
          fm_mma(o[2 * n2], pa[j], b[0], b[1]);
          fm_mma(o[2 * n2 + 1], pa[j], b[2], b[3]);
        }
    }
    __syncthreads(); // every warp is done with this stage before the next iteration's copies reuse it
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    la += __shfl_xor_sync(0xffffffffu, la, off);
    lb += __shfl_xor_sync(0xffffffffu, lb, off);
  }
#pragma unroll
  for (int h2 = 0; h2 < 2; h2++) {
    const int r = h2 ? rb : ra;
    if (r >= rows) continue;
    const float m = h2 ? mb : ma, l = h2 ? lb : la;
    if (n_split == 1) { // every key of the row: l >= 1 (the max's own term)
      float *orow = out + (int64_t)(r / nq) * ldo + (int64_t)(r % nq) * HD;
#pragma unroll
      for (int n = 0; n < NT; n++)
        *(float2 *)(orow + 8 * n + 2 * t) = make_float2(o[n][2 * h2] / l, o[n][2 * h2 + 1] / l);
    } else { // a row whose keys end before the chunk writes (-inf, 0); attend_combine skips it
      float *pr = part + ((int64_t)r * n_split + c) * (HD + 2);
      if (t == 0) pr[0] = m == -INFINITY ? -INFINITY : m * 0.6931471805599453f, pr[1] = l;
#pragma unroll
      for (int n = 0; n < NT; n++) pr[2 + 8 * n + 2 * t] = o[n][2 * h2], pr[3 + 8 * n + 2 * t] = o[n][2 * h2 + 1];
    }
  }
}

// Whether attend_flash_mma takes this prompt attention: on (STRATA_FLASH_MMA), head_dim 64 or 128,
// 16-byte aligned cache rows, 8-byte aligned query and output rows, sm_80 or later (a half cache: the
// caller's KT).
static bool fm_ok(int on, int hd, const void *q, int64_t ldq, const void *kc, const void *vc, const void *out, int64_t ldo) {
  if (!on || (hd != 64 && hd != 128) || (((uintptr_t)kc | (uintptr_t)vc) & 15) || (((uintptr_t)q | (uintptr_t)out) & 7) ||
      (ldq & 1) || (ldo & 1))
    return false;
  return st_cuda_compute_capability() >= 80;
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

// Whether attend_flash takes these buffers: rows of four-element groups (head_dim a multiple of 4,
// pointers and row strides aligned to a group) of at most 256 dimensions (the engine refuses more).
template <typename KT>
static int flash_fits(const float *q, int64_t ldq, const KT *kc, const KT *vc, int hd, const float *out, int64_t ldo) {
  const uintptr_t ptrs = (uintptr_t)q | (uintptr_t)out, kvp = (uintptr_t)kc | (uintptr_t)vc;
  return hd % 4 == 0 && hd <= 256 && ptrs % 16 == 0 && kvp % (4 * sizeof(KT)) == 0 && ldq % 4 == 0 && ldo % 4 == 0;
}

// Floats of the partials the flash kernels (flash != 0, T > 1) or the split-K kernels write: T x n_q
// rows of (max, sum, head_dim values) per chunk. Sized for the path that runs: at T = 4096 with 8
// query heads of 128 the split-K path's 32 chunks would take 545 MB where the flash path's 4 take 68.
static size_t attention_part_floats(int T, int pos0, int nq, int hd, int flash) {
  const int keys = pos0 + T, ch = att_chunk_keys(keys), n_chunks = (keys + ch - 1) / ch, chunk = flash_chunk(T, nq, pos0);
  const int n = flash && T > 1 ? (keys + chunk - 1) / chunk : n_chunks;
  return (size_t)T * nq * (size_t)n * (size_t)(hd + 2);
}

// Whether the attention codelet's prompt chunk takes the flash kernels: what flash_fits asks of the
// buffers, from the shapes alone (the scratch and StarPU's device buffers are 256-byte aligned, the
// queries sit T x n_embd floats into the scratch), so that the scratch is sized before the buffers
// are known.
static int flash_planned(const st_attention_args *a) {
  return a->T > 1 && a->head_dim % 4 == 0 && a->head_dim <= 256 && ((int64_t)a->n_q * a->head_dim) % 4 == 0 &&
         ((int64_t)a->T * a->n_embd) % 4 == 0;
}

// Causal attention of T tokens' nq query heads (q [T][ldq], head h at h * hd) over the keys and
// values kc, vc [pos0 + T][hd] of KT, into out [T][ldo]; part holds attention_part_floats. flash 1
// (the caller checked flash_fits) takes attend_flash_mma where fm_ok says so (a half cache), else
// attend_flash; flash 2 attend_flash (STRATA_FLASH_MMA=0); 0 the split-K kernels (attend_split and
// attend_split_combine: the decode step's arithmetic).
template <typename KT>
static void attend(const float *q, int64_t ldq, const KT *kc, const KT *vc, int T, int pos0, int nq, int hd,
                   float *part, float *out, int64_t ldo, int flash, cudaStream_t st) {
  const float scale = 1.0f / sqrtf((float)hd);
  if constexpr (kv_is_q8<KT>) {
    if (flash) { // the flash kernels read a half copy of the values (the ones every q8_0 block reads)
      const int64_t rows = (int64_t)pos0 + T;
      __half *kh = (__half *)st_cuda_alloc(2 * sizeof(__half) * (size_t)(rows * hd), st), *vh = kh + rows * hd;
      const int blocks = (int)((rows * hd / 8 + 255) / 256 < 1024 ? (rows * hd / 8 + 255) / 256 : 1024);
      kv_q8_to_half<<<blocks, 256, 0, st>>>(kc, kh, rows, hd);
      kv_q8_to_half<<<blocks, 256, 0, st>>>(vc, vh, rows, hd);
      attend<__half>(q, ldq, kh, vh, T, pos0, nq, hd, part, out, ldo, flash, st);
      st_cuda_free(kh, st);
      return;
    }
  }
  if (!flash && T == 1 && pos0 + 1 <= att_short_max(hd, kv_es<KT>)) { // the decode step's block (rope_short's)
    att_short_dispatch(nq, hd, [&](auto nd, auto nqb) {
      constexpr int ND = decltype(nd)::value, NQ = decltype(nqb)::value;
      attend_short<ND, NQ, KT><<<(nq + NQ - 1) / NQ, 32 * ATT_WARPS, att_short_smem(hd, ND, NQ, kv_es<KT>), st>>>(
          q, kc, vc, hd, nq, pos0 + 1, scale, out);
    });
    return;
  }
  if (!flash) {
    const int chunk = att_chunk_keys(pos0 + T), n_chunks = (pos0 + T + chunk - 1) / chunk;
    att_dispatch(nq, hd, [&](auto nd, auto nqb) {
      constexpr int ND = decltype(nd)::value, NQ = decltype(nqb)::value;
      const int n_hb = (nq + NQ - 1) / NQ;
      size_t bytes = 0;
      const void *kv[2] = {kc, vc};
      if constexpr ((std::is_same<KT, __half>::value || kv_is_q8<KT>) && ND == 4) {
        if (chunk >= att_mma_chunk<KT> && att_mma_ok(ST_TYPE_F16, hd, q, ldq, kv, 2)) {
          attend_split<ND, NQ, KT, true><<<dim3(n_chunks, T * n_hb), 32 * ATT_WARPS, att_mma_smem_bytes(hd, NQ), st>>>(
              q, ldq, kc, vc, hd, nq, pos0, chunk, scale, part, 0);
          attend_split_combine<<<dim3(T, n_hb), 256, 0, st>>>(part, n_chunks, chunk, hd, nq, NQ, pos0, out, ldo);
          return;
        }
      }
      const int nst = att_plan_kt<KT>(0, hd, ND, NQ, &bytes);
      attend_split<ND, NQ, KT, false><<<dim3(n_chunks, T * n_hb), 32 * ATT_WARPS, bytes, st>>>(q, ldq, kc, vc, hd, nq,
                                                                                              pos0, chunk, scale, part, nst);
      attend_split_combine<<<dim3(T, n_hb), 256, 0, st>>>(part, n_chunks, chunk, hd, nq, NQ, pos0, out, ldo);
    });
    return;
  }
  const int chunk = flash_chunk(T, nq, pos0), n_split = (pos0 + T + chunk - 1) / chunk;
  const dim3 grid((T * nq + FA_ROWS - 1) / FA_ROWS, n_split);
  if constexpr (std::is_same<KT, __half>::value) {
    if (fm_ok(flash == 1, hd, q, ldq, kc, vc, out, ldo)) {
      const size_t bytes = fm_smem_bytes(hd);
      if (hd == 128) {
        cudaFuncSetAttribute(attend_flash_mma<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        attend_flash_mma<128><<<grid, FM_THREADS, bytes, st>>>(q, ldq, kc, vc, nq, T, pos0, scale, chunk, part, out, ldo);
      } else {
        cudaFuncSetAttribute(attend_flash_mma<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        attend_flash_mma<64><<<grid, FM_THREADS, bytes, st>>>(q, ldq, kc, vc, nq, T, pos0, scale, chunk, part, out, ldo);
      }
      if (n_split > 1) attend_combine<<<dim3(T, nq), 128, 0, st>>>(part, n_split, chunk, hd, pos0, out, ldo);
      return;
    }
  }
  if constexpr (!kv_is_q8<KT>) { // (a q8_0 cache's flash path went through its half copy above)
    if (hd <= 128)
      attend_flash<1, KT><<<grid, FA_THREADS, 0, st>>>(q, ldq, kc, vc, hd, nq, T, pos0, scale, chunk, part, out, ldo);
    else
      attend_flash<2, KT><<<grid, FA_THREADS, 0, st>>>(q, ldq, kc, vc, hd, nq, T, pos0, scale, chunk, part, out, ldo);
    if (n_split > 1) attend_combine<<<dim3(T, nq), 128, 0, st>>>(part, n_split, chunk, hd, pos0, out, ldo);
  }
}

// Scratch floats of one call: the normed input, one group's queries, the attention partials and,
// for a half or q8_0 cache, the new K and V rows in float32 before they are stored.
static size_t attention_scratch_bytes(const st_attention_args *a) {
  return sizeof(float) * ((size_t)a->T * a->n_embd + (size_t)a->T * a->n_q * a->head_dim +
                          attention_part_floats(a->T, a->pos0, a->n_q, a->head_dim, flash_planned(a)) +
                          (a->kv_type != ST_TYPE_F32 ? 2 * (size_t)a->T * a->head_dim : 0));
}

// dst[i] = src[i] as KT for n elements (the new K and V rows of a half cache).
template <typename KT> __global__ static void kv_store(const float *src, KT *dst, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    kv_st(dst + i, src[i]);
}

// Rows [pos0, pos0 + T) of a half or q8_0 cache c from the T rows x of hd floats.
template <typename KT> static void kv_store_rows(const float *x, KT *c, int pos0, int T, int hd, cudaStream_t st) {
  if constexpr (kv_is_q8<KT>) {
    const int64_t warps = (int64_t)T * (hd / 32);
    const int blocks = (int)((warps + 7) / 8 < 1024 ? (warps + 7) / 8 : 1024);
    kv_store_q8<<<blocks, 256, 0, st>>>(x, (uint8_t *)c + (size_t)pos0 * kv_q8_row_bytes(hd), T, hd);
  } else {
    const int64_t n = (int64_t)T * hd;
    const int blocks = (int)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
    kv_store<KT><<<blocks, 256, 0, st>>>(x, c + (size_t)pos0 * hd, n);
  }
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
  const int flash = flash_planned(a);
  float *knew = part + attention_part_floats(T, a->pos0, nq, hd, flash), *vnew = knew + (size_t)T * hd; // half and q8_0 caches only
  st_cuda_rmsnorm(x, attn_norm, xn, T, d, a->eps, st);
  cublasHandle_t cb = st_cuda_cublas_handle(T, a->cublas_rows); // NULL: the float32 kernels
  const int rounded = a->kv_type != ST_TYPE_F32; // the new rows go through knew, vnew
  for (int i = 0; i < a->n_groups; i++) {
    const int group = a->group0 + i;
    void *kc = (void *)STARPU_VECTOR_GET_PTR(buffers[7 + 2 * i]);
    void *vc = (void *)STARPU_VECTOR_GET_PTR(buffers[8 + 2 * i]);
    float *out = (float *)STARPU_VECTOR_GET_PTR(buffers[7 + 2 * a->n_groups + i]);
    // the new rows: straight into a float32 cache, through knew, vnew into a half or q8_0 one
    float *kdst = rounded ? knew : (float *)kc + (size_t)a->pos0 * hd, *vdst = rounded ? vnew : (float *)vc + (size_t)a->pos0 * hd;
    // a one-token task's Q takes xn quantised (STRATA_INT8_DOT, Q8_0 weights), as the decode step's Q does
    // (decode.cu dense_q8); K and V, and longer batches, keep float32 activations
    st_cuda_product(cb, a->wq.type, wq, a->wq.row_bytes, (int64_t)group * qw, (int64_t)(group + 1) * qw, xn, d, T,
                   d, q, qw, st, T == 1 && a->int8_dot);
    st_cuda_product(cb, a->wk.type, wk, a->wk.row_bytes, (int64_t)group * hd, (int64_t)(group + 1) * hd, xn, d, T,
                   d, kdst, hd, st, 0);
    st_cuda_product(cb, a->wv.type, wv, a->wv.row_bytes, (int64_t)group * hd, (int64_t)(group + 1) * hd, xn, d, T,
                   d, vdst, hd, st, 0);
    qk_norm_rope<<<dim3(T, nq), 64, 0, st>>>(q, qw, hd, q_norm, a->eps, a->pos0, a->rope_theta);
    qk_norm_rope<<<dim3(T, 1), 64, 0, st>>>(kdst, hd, hd, k_norm, a->eps, a->pos0, a->rope_theta);
    kv_dispatch_q8(a->kv_type, [&](auto tag) {
      using KT = typename decltype(tag)::type;
      KT *kk = (KT *)kc, *vv = (KT *)vc;
      if (rounded) {
        kv_store_rows(kdst, kk, a->pos0, T, hd, st);
        kv_store_rows(vdst, vv, a->pos0, T, hd, st);
      }
      // Decode (T = 1) keeps the split-K kernels: its CUDA graphs replay them bit for bit.
      if (flash && !flash_fits<KT>(q, qw, kk, vv, hd, out, qw)) { // not as planned: split-K, partials of their own
        float *p2 = (float *)st_cuda_alloc(sizeof(float) * attention_part_floats(T, a->pos0, nq, hd, 0), st);
        attend<KT>(q, qw, kk, vv, T, a->pos0, nq, hd, p2, out, qw, 0, st);
        st_cuda_free(p2, st);
      } else {
        attend<KT>(q, qw, kk, vv, T, a->pos0, nq, hd, part, out, qw, flash ? (a->flash_mma ? 1 : 2) : 0, st);
      }
    });
  }
  ST_CUDA_CHECK(cudaGetLastError());
}

extern "C" void st_attention_cuda(void *buffers[], void *cl_arg) {
  const st_attention_args *a = (const st_attention_args *)cl_arg;
  const int decode = a->T == 1;
  st_cuda_dense_run(buffers, a, decode ? a->graph_key : 0, attention_scratch_bytes(a), decode, attention_body);
}

// ---- the decode step's attention (decode.cu), the position in device memory --------------------

void st_cuda_attention_allow_smem() { att_allow_smem(); }

extern "C" int st_cuda_attn_short_keys(int hd, int es) { return att_short_max(hd, (size_t)es); }

extern "C" size_t st_cuda_decode_part_floats(int n_ctx, int n_heads, int hd) {
  (void)n_ctx; // the grid has ATT_SPLIT chunks at every position
  return (size_t)n_heads * ATT_SPLIT * (size_t)(hd + 2);
}

void st_cuda_rope_append(float *q, int Hq, const float *kvnew, int G, int hd, const float *qw, const float *kw,
                         float eps, const int *pos_dev, int kv_type, void *const *k, void *const *v, const float *tab,
                         float *out, int pdl, cudaStream_t st, const st_cuda_attn_ext *x, int8_t *outq) {
  ST_ASSERT(!outq || (out && hd % 32 == 0)); // whole 32-element blocks a head
  const st_cuda_attn_ext xe = x ? *x : st_cuda_attn_ext{};
  kv_ptrs p;
  for (int g = 0; g < G; g++) p.k[g] = k[g], p.v[g] = v[g];
  const int nq = Hq / G;
  att_short_dispatch(nq, hd, [&](auto nd, auto nqb) {
    constexpr int ND = decltype(nd)::value, NQ = decltype(nqb)::value;
    kv_dispatch_q8(kv_type, [&](auto tag) {
      using KT = typename decltype(tag)::type;
      st_cuda_launch(rope_short<ND, NQ, KT>, dim3((unsigned)(G * ((nq + NQ - 1) / NQ))), dim3(32 * ATT_WARPS),
                     att_short_smem(hd, ND, NQ, kv_es<KT>), st, pdl, q, nq, kvnew, G, hd, qw, kw, eps, pos_dev, p,
                     (const float2 *)tab, xe.scale > 0.0f ? xe.scale : 1.0f / sqrtf((float)hd), out, outq, xe);
    });
  });
}

int st_cuda_attend_regime(int hd, int kv_type, int pos, int window) {
  const int keys = window && pos + 1 > window ? window : pos + 1; // attend_decode_all's n_keys
  if (keys <= att_short_max(hd, kv_type == ST_TYPE_F32 ? 4 : 2)) return ST_ATT_REGIME_SHORT; // (q8_0: tiles of halves)
  return att_chunk_keys(keys) >= att_mma_chunk_of(kv_type) ? ST_ATT_REGIME_WIDE : ST_ATT_REGIME_SPLIT;
}

void st_cuda_attend_decode_all(const float *q, int Hq, int G, int hd, int kv_type, void *const *k, void *const *v,
                               const int *pos_dev, float *part, int *counters, float *out, int after_short, int pdl,
                               cudaStream_t st, const st_cuda_attn_ext *x, int regime, int8_t *outq) {
  if (after_short && regime == ST_ATT_REGIME_SHORT) return; // rope_append's launch attends
  ST_ASSERT(!outq || hd % 32 == 0); // whole 32-element blocks a head
  const st_cuda_attn_ext xe = x ? *x : st_cuda_attn_ext{};
  const float scale = xe.scale > 0.0f ? xe.scale : 1.0f / sqrtf((float)hd);
  kv_ptrs p;
  for (int g = 0; g < G; g++) p.k[g] = k[g], p.v[g] = v[g];
  const int nq = Hq / G;
  att_dispatch(nq, hd, [&](auto nd, auto nqb) {
    constexpr int ND = decltype(nd)::value, NQ = decltype(nqb)::value;
    kv_dispatch_q8(kv_type, [&](auto tag) {
      using KT = typename decltype(tag)::type;
      const int n_hb = (nq + NQ - 1) / NQ;
      size_t bytes = 0;
      const int nst = att_plan_kt<KT>(1, hd, ND, NQ, &bytes);
      bool paired = false;
      if constexpr ((std::is_same<KT, __half>::value || kv_is_q8<KT>) && ND == 4) {
        const void *kv[2 * ST_CUDA_MAX_KV_HEADS];
        for (int g = 0; g < G; g++) kv[2 * g] = k[g], kv[2 * g + 1] = v[g];
        paired = att_mma_ok(kv_type, hd, q, hd, kv, 2 * G);
      }
      // a regime's graph launches the one kernel of the pair that computes its positions
      if (!paired || regime != ST_ATT_REGIME_WIDE)
        st_cuda_launch(attend_decode_all<ND, NQ, KT, false>, dim3(ATT_SPLIT, G * n_hb), dim3(32 * ATT_WARPS), bytes, st,
                       pdl, q, nq, hd, p, pos_dev, scale, part, counters, out, outq, nst, (int)paired, after_short, xe);
      if constexpr ((std::is_same<KT, __half>::value || kv_is_q8<KT>) && ND == 4)
        if (paired && regime != ST_ATT_REGIME_SPLIT)
          st_cuda_launch(attend_decode_all<ND, NQ, KT, true>, dim3(ATT_SPLIT, G * n_hb), dim3(32 * ATT_WARPS),
                         att_mma_smem_bytes(hd, NQ), st, pdl, q, nq, hd, p, pos_dev, scale, part, counters, out, outq,
                         0, 1, after_short, xe);
    });
  });
}

// For tests (cuda_codelets.h): attend on host data, on the legacy default stream; a half cache
// (kv_type ST_TYPE_F16) holds k and v rounded to nearest even.
extern "C" int st_cuda_attention_rows(const float *q, const float *k, const float *v, int T, int pos0, int nq, int hd,
                                      int kv_type, int flash, int reps, float *out, double *ms) {
  const size_t qn = (size_t)T * nq * hd, kn = (size_t)(pos0 + T) * hd;
  const size_t pn_f = attention_part_floats(T, pos0, nq, hd, 1), pn_s = attention_part_floats(T, pos0, nq, hd, 0);
  const size_t pn = pn_f > pn_s ? pn_f : pn_s, es = kv_type == ST_TYPE_F16 ? 2 : 4;
  const size_t kb = kv_type == ST_TYPE_Q8_0 ? (size_t)(pos0 + T) * kv_q8_row_bytes(hd) : es * kn; // a cache's bytes
  float *dq = NULL, *dout = NULL, *dpart = NULL, *dtmp = NULL;
  void *dk = NULL, *dv = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  int ok = cudaMalloc(&dq, sizeof(float) * qn) == cudaSuccess && cudaMalloc(&dk, kb) == cudaSuccess &&
           cudaMalloc(&dv, kb) == cudaSuccess && cudaMalloc(&dout, sizeof(float) * qn) == cudaSuccess &&
           cudaMalloc(&dpart, sizeof(float) * pn) == cudaSuccess &&
           cudaMalloc(&dtmp, sizeof(float) * kn) == cudaSuccess &&
           cudaMemcpy(dq, q, sizeof(float) * qn, cudaMemcpyHostToDevice) == cudaSuccess;
  if (kv_type == ST_TYPE_Q8_0) { // k and v quantised on the device as the codelet stores new rows
    ok = ok && cudaMemcpy(dtmp, k, sizeof(float) * kn, cudaMemcpyHostToDevice) == cudaSuccess;
    if (ok) kv_store_q8<<<256, 256>>>(dtmp, (uint8_t *)dk, pos0 + T, hd);
    ok = ok && cudaMemcpy(dtmp, v, sizeof(float) * kn, cudaMemcpyHostToDevice) == cudaSuccess; // after the launch
    if (ok) kv_store_q8<<<256, 256>>>(dtmp, (uint8_t *)dv, pos0 + T, hd);
    ok = ok && cudaDeviceSynchronize() == cudaSuccess;
  } else {
    kv_dispatch(kv_type, [&](auto tag) { // k and v through kv_store: a half cache gets them rounded
      using KT = typename decltype(tag)::type;
      ok = ok && cudaMemcpy(dtmp, k, sizeof(float) * kn, cudaMemcpyHostToDevice) == cudaSuccess;
      if (ok) kv_store<KT><<<256, 256>>>(dtmp, (KT *)dk, (int64_t)kn);
      ok = ok && cudaMemcpy(dtmp, v, sizeof(float) * kn, cudaMemcpyHostToDevice) == cudaSuccess; // after the launch
      if (ok) kv_store<KT><<<256, 256>>>(dtmp, (KT *)dv, (int64_t)kn);
      ok = ok && cudaDeviceSynchronize() == cudaSuccess;
    });
  }
  const int64_t ld = (int64_t)nq * hd;
  if (ok) att_allow_smem();
  if (ok) kv_dispatch_q8(kv_type, [&](auto tag) {
      using KT = typename decltype(tag)::type;
      const KT *kk = (const KT *)dk, *vv = (const KT *)dv;
      const char *fm = getenv("STRATA_FLASH_MMA"); // the engine's switch, read here as the tests set it
      const int use_flash = flash && T > 1 && flash_fits<KT>(dq, ld, kk, vv, hd, dout, ld) ? (!fm || atoi(fm) ? 1 : 2) : 0;
      attend<KT>(dq, ld, kk, vv, T, pos0, nq, hd, dpart, dout, ld, use_flash, 0);
      ok = cudaGetLastError() == cudaSuccess &&
           cudaMemcpy(out, dout, sizeof(float) * qn, cudaMemcpyDeviceToHost) == cudaSuccess;
      if (ok && reps > 0 && ms) {
        float elapsed = 0.0f;
        ok = cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess &&
             cudaEventRecord(e0, 0) == cudaSuccess;
        for (int r = 0; ok && r < reps; r++) attend<KT>(dq, ld, kk, vv, T, pos0, nq, hd, dpart, dout, ld, use_flash, 0);
        ok = ok && cudaEventRecord(e1, 0) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
             cudaGetLastError() == cudaSuccess && cudaEventElapsedTime(&elapsed, e0, e1) == cudaSuccess;
        *ms = (double)elapsed / reps;
      }
    });
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dout);
  cudaFree(dpart);
  cudaFree(dtmp);
  return ok ? 0 : -1;
}

extern "C" int st_cuda_kv_q8_store_rows(const float *x, int64_t rows, int hd, uint8_t *out) {
  float *dx = NULL;
  uint8_t *dq = NULL;
  const size_t qb = (size_t)rows * (size_t)kv_q8_row_bytes(hd);
  bool ok = hd % 32 == 0 && cudaMalloc(&dx, sizeof(float) * (size_t)rows * hd) == cudaSuccess &&
            cudaMalloc(&dq, qb) == cudaSuccess &&
            cudaMemcpy(dx, x, sizeof(float) * (size_t)rows * hd, cudaMemcpyHostToDevice) == cudaSuccess;
  if (ok) kv_store_q8<<<64, 256>>>(dx, dq, rows, hd);
  ok = ok && cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess &&
       cudaMemcpy(out, dq, qb, cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(dx);
  cudaFree(dq);
  return ok ? 0 : -1;
}

// Random values in [-1, 1) from an index and a seed (st_cuda_decode_attention_check's data).
template <typename T> __global__ static void check_fill(T *p, int64_t n, uint32_t seed) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull + seed;
    x ^= x >> 31, x *= 0xbf58476d1ce4e5b9ull, x ^= x >> 29;
    kv_st(p + i, (float)((x >> 40) & 0xffffff) / (float)0x800000 - 1.0f);
  }
}

extern "C" int st_cuda_decode_attention_check(int Hq, int G, int hd, int kv_type, int pos, uint32_t seed, int *same) {
  *same = 0;
  if (G < 1 || G > ST_CUDA_MAX_KV_HEADS || Hq % G || pos < 0) return -1;
  const int nq = Hq / G;
  const size_t es = kv_type == ST_TYPE_F16 ? 2 : 4, rows = (size_t)pos + 1;
  const size_t cache = kv_type == ST_TYPE_Q8_0 ? rows * (size_t)kv_q8_row_bytes(hd) : rows * hd * es;
  const size_t pf = st_cuda_decode_part_floats((int)rows, Hq, hd) + attention_part_floats(1, pos, nq, hd, 0);
  float *q[2] = {NULL, NULL}, *out[2] = {NULL, NULL}, *kvnew = NULL, *nw = NULL, *tab = NULL, *part = NULL;
  int *counters = NULL, *pos_dev = NULL;
  void *kv[2][2 * ST_CUDA_MAX_KV_HEADS] = {};
  uint8_t *hbuf = NULL;
  int8_t *oq[2] = {NULL, NULL}; // the decode step's output quantised by its writers, and out[1] in one launch
  const int64_t on = (int64_t)Hq * hd, oqb = st_q8_stride(on);
  bool ok = true;
  for (int r = 0; ok && hd % 32 == 0 && r < 2; r++) ok = cudaMalloc(&oq[r], (size_t)oqb) == cudaSuccess;
  for (int r = 0; r < 2; r++) {
    ok = ok && cudaMalloc(&q[r], sizeof(float) * Hq * hd) == cudaSuccess &&
         cudaMalloc(&out[r], sizeof(float) * Hq * hd) == cudaSuccess;
    for (int i = 0; ok && i < 2 * G; i++) ok = cudaMalloc(&kv[r][i], cache) == cudaSuccess;
  }
  ok = ok && cudaMalloc(&kvnew, sizeof(float) * 2 * G * hd) == cudaSuccess &&
       cudaMalloc(&nw, sizeof(float) * 2 * hd) == cudaSuccess && cudaMalloc(&tab, sizeof(float) * rows * hd) == cudaSuccess &&
       cudaMalloc(&part, sizeof(float) * pf) == cudaSuccess && cudaMalloc(&counters, sizeof(int) * Hq) == cudaSuccess &&
       cudaMalloc(&pos_dev, sizeof(int)) == cudaSuccess && cudaMemset(counters, 0, sizeof(int) * Hq) == cudaSuccess &&
       cudaMemcpy(pos_dev, &pos, sizeof pos, cudaMemcpyHostToDevice) == cudaSuccess;
  if (ok) {
    att_allow_smem();
    check_fill<<<64, 256>>>(kvnew, 2 * G * hd, seed + 1);
    check_fill<<<8, 256>>>(nw, 2 * hd, seed + 2);
    for (int r = 0; r < 2; r++) check_fill<<<64, 256>>>(q[r], Hq * hd, seed + 3);
    if (kv_type == ST_TYPE_Q8_0) { // random floats through the codelet's quantiser
      float *tmp = NULL;
      ok = cudaMalloc(&tmp, sizeof(float) * rows * hd) == cudaSuccess;
      for (int r = 0; ok && r < 2; r++)
        for (int i = 0; i < 2 * G; i++) {
          check_fill<<<256, 256>>>(tmp, (int64_t)rows * hd, seed + 4 + i);
          kv_store_q8<<<256, 256>>>(tmp, (uint8_t *)kv[r][i], (int64_t)rows, hd);
        }
      ok = ok && cudaDeviceSynchronize() == cudaSuccess;
      cudaFree(tmp);
    } else {
      kv_dispatch(kv_type, [&](auto tag) {
        using KT = typename decltype(tag)::type;
        for (int r = 0; r < 2; r++)
          for (int i = 0; i < 2 * G; i++) check_fill<<<256, 256>>>((KT *)kv[r][i], (int64_t)rows * hd, seed + 4 + i);
      });
    }
    st_cuda_rope_table(tab, (int)rows, hd, 1e6f, 0);
    void *k0[ST_CUDA_MAX_KV_HEADS], *v0[ST_CUDA_MAX_KV_HEADS], *k1[ST_CUDA_MAX_KV_HEADS], *v1[ST_CUDA_MAX_KV_HEADS];
    for (int g = 0; g < G; g++) k0[g] = kv[0][2 * g], v0[g] = kv[0][2 * g + 1], k1[g] = kv[1][2 * g], v1[g] = kv[1][2 * g + 1];
    // the decode step's pair, as its graph of the position's regime launches them
    st_cuda_rope_append(q[0], Hq, kvnew, G, hd, nw, nw + hd, 1e-6f, pos_dev, kv_type, k0, v0, tab, out[0], 0, 0, NULL,
                        oq[0]);
    st_cuda_attend_decode_all(q[0], Hq, G, hd, kv_type, k0, v0, pos_dev, part, counters, out[0], 1, 0, 0, NULL,
                              st_cuda_attend_regime(hd, kv_type, pos, 0), oq[0]);
    // the per-task path's: q and the new rows first, then the attention of each KV group
    st_cuda_rope_append(q[1], Hq, kvnew, G, hd, nw, nw + hd, 1e-6f, pos_dev, kv_type, k1, v1, tab, NULL, 0, 0);
    kv_dispatch_q8(kv_type, [&](auto tag) {
      using KT = typename decltype(tag)::type;
      for (int g = 0; g < G; g++)
        attend<KT>(q[1] + (size_t)g * nq * hd, (int64_t)nq * hd, (const KT *)k1[g], (const KT *)v1[g], 1, pos, nq, hd, part,
                   out[1] + (size_t)g * nq * hd, (int64_t)nq * hd, 0, 0);
    });
    if (oq[1]) st_cuda_quantize_rows(out[1], on, 1, on, oq[1], 0); // as st_cuda_matmul's int8 path quantises it
    ok = ok && cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess;
  }
  // a q8_0 cache's new rows (rope_short's krow, V row, row offset) against the float32 cache's rows of
  // the same launch arguments, quantised by kv_store_q8 (itself bitwise the CPU's: test_cuda_kernels)
  bool rows_same = true;
  if (ok && kv_type == ST_TYPE_Q8_0) {
    float *qt = NULL;
    void *kf[ST_CUDA_MAX_KV_HEADS] = {}, *vf[ST_CUDA_MAX_KV_HEADS] = {};
    uint8_t *rq = NULL;
    const int64_t rb = kv_q8_row_bytes(hd);
    ok = cudaMalloc(&qt, sizeof(float) * Hq * hd) == cudaSuccess && cudaMalloc(&rq, 2 * rb) == cudaSuccess;
    for (int g = 0; ok && g < G; g++)
      ok = cudaMalloc(&kf[g], sizeof(float) * rows * hd) == cudaSuccess && cudaMalloc(&vf[g], sizeof(float) * rows * hd) == cudaSuccess;
    if (ok) {
      check_fill<<<64, 256>>>(qt, Hq * hd, seed + 3);
      st_cuda_rope_append(qt, Hq, kvnew, G, hd, nw, nw + hd, 1e-6f, pos_dev, ST_TYPE_F32, kf, vf, tab, NULL, 0, 0);
    }
    std::vector<uint8_t> want(2 * rb), got(2 * rb);
    for (int g = 0; ok && g < G; g++) {
      kv_store_q8<<<1, 256>>>((const float *)kf[g] + (size_t)pos * hd, rq, 1, hd);
      kv_store_q8<<<1, 256>>>((const float *)vf[g] + (size_t)pos * hd, rq + rb, 1, hd);
      ok = cudaDeviceSynchronize() == cudaSuccess && cudaMemcpy(want.data(), rq, 2 * rb, cudaMemcpyDeviceToHost) == cudaSuccess &&
           cudaMemcpy(got.data(), (const uint8_t *)kv[0][2 * g] + (size_t)pos * rb, rb, cudaMemcpyDeviceToHost) == cudaSuccess &&
           cudaMemcpy(got.data() + rb, (const uint8_t *)kv[0][2 * g + 1] + (size_t)pos * rb, rb, cudaMemcpyDeviceToHost) ==
               cudaSuccess;
      if (ok && want != got) rows_same = false;
    }
    cudaFree(qt);
    cudaFree(rq);
    for (int g = 0; g < G; g++) cudaFree(kf[g]), cudaFree(vf[g]);
  }
  const size_t hb = 2 * (cache > sizeof(float) * Hq * hd ? cache : sizeof(float) * Hq * hd);
  ok = ok && (hbuf = (uint8_t *)malloc(hb)) != NULL;
  *same = ok && rows_same;
  for (int i = -2; ok && i < 2 * G; i++) { // the quantised outputs, the outputs, then each cache
    if (i == -2 && !oq[0]) continue;
    const void *a = i == -2 ? (const void *)oq[0] : i < 0 ? (const void *)out[0] : kv[0][i];
    const void *b = i == -2 ? (const void *)oq[1] : i < 0 ? (const void *)out[1] : kv[1][i];
    const size_t n = i == -2 ? (size_t)oqb : i < 0 ? sizeof(float) * Hq * hd : cache;
    ok = cudaMemcpy(hbuf, a, n, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(hbuf + n, b, n, cudaMemcpyDeviceToHost) == cudaSuccess;
    if (ok && memcmp(hbuf, hbuf + n, n)) *same = 0;
  }
  free(hbuf);
  for (int r = 0; r < 2; r++) {
    cudaFree(oq[r]);
    cudaFree(q[r]);
    cudaFree(out[r]);
    for (int i = 0; i < 2 * G; i++) cudaFree(kv[r][i]);
  }
  cudaFree(kvnew);
  cudaFree(nw);
  cudaFree(tab);
  cudaFree(part);
  cudaFree(counters);
  cudaFree(pos_dev);
  return ok ? 0 : -1;
}
