// The decode step's kernels (decode.cu launches them; bench/mmv-bench.cu times them alone): dk_pre,
// the streaming mat-vec kernels of mmv.cuh's core with their jobs (dk_mv, dk_router, dk_gateup,
// dk_down) and the mailbox's flag helpers. See decode.cu's top for what a layer runs.
#pragma once

#include "codelets/cuda/common.cuh"
#include "codelets/cuda/mmv.cuh"
#include "codelets/decode.h" // st_argmax_key

namespace {

// dk_down takes its experts from dk_gateup's block 0's selection tags (one L2 read each) instead of
// loading the router's logits and selecting for itself, which the twenty-ninth session's knockout put
// at about 2.2 us a layer on an H100: every-expert decode of qwen3-30b-a3b Q8_0 359.1 -> 370.7 tok/s
// there, the same greedy bits (bench/RESULTS.md, 2026-12-07). Variant knob for A/B builds
// (scripts/build-decode-variants -DDK_DOWN_TAGS=0: dk_down's own selection, as before).
#ifndef DK_DOWN_TAGS
#define DK_DOWN_TAGS 1
#endif

#define PRE_THREADS 1024
#define NORM_THREADS 256 /* rmsnorm_kernel's block: its sums' order */

// The mailbox's flags (codelets/decode.h): system-scope acquire loads and release stores on
// mapped host memory.
__device__ __forceinline__ uint32_t dk_flag_load(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void dk_flag_store(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Once every thread of the block has written its part of the mailbox: fence (system scope), then
// *flag = *seq (every thread of the block calls it).
__device__ __forceinline__ void dk_raise(uint32_t *flag, const uint32_t *seq) {
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) dk_flag_store(flag, *seq);
}

// x = h + the k slots' rows added in slot order (combine != 0: a slot whose pair is in this card's
// cache, slot_ptr != NULL, from gpu_out, the others from the mailbox's rows cpu_out, once the CPU
// pool has raised *cpu_flag to the step number *seq when a slot is the CPU pool's and cpu_flag is
// set; plain adds, as combine_token), else (layer 0) x = the mailbox's embedding row `emb`, with
// the step's position and number copied from the mailbox to pos[0..1] (wait_mail: once the
// mailbox's step number pos_seq[1] has moved past the last step's, *seq: a step submitted before
// the host knew its token, STRATA_PRESUBMIT) and the n_counters fused
// kernels' counters zeroed and the GPU's clock written to *stamp (when set); then xn = RMSNorm(x) * w as rmsnorm_kernel computes it,
// and quantised into xq when set (st_q8_stride(d) bytes, as st_cuda_quantize_rows quantises it). One block;
// dynamic shared memory: d floats. Its loads that do not depend on one another are issued together
// (the route, the layer's slot table, h and w, the first PRE_ELEMS / 2 pairs of elements of each
// thread held in registers): one block's chain of dependent loads is the kernel's time.
#define PRE_ELEMS 4   /* elements of h and w a thread loads up front (d <= PRE_ELEMS PRE_THREADS) */
#define PRE_SLOTS 256 /* experts whose slot pointers the block loads up front (n_expert <= PRE_SLOTS) */
__global__ void __launch_bounds__(PRE_THREADS)
    dk_pre(const st_route *route, const uint8_t *const *slot_ptr, int n_expert, const float *gpu_out,
           const float *cpu_out, const uint32_t *cpu_flag, const uint32_t *seq, const float *h, int k, int d,
           int combine, const float *emb, const int32_t *pos_seq, int32_t *pos, int32_t *counters, int n_counters,
           float *x, const float *w, float eps, float *xn, int8_t *xq, const float *fixed, uint64_t *stamp, int wait_mail) {
  extern __shared__ float xs[];
  __shared__ const float *src[64];
  __shared__ const uint8_t *slots[PRE_SLOTS];
  __shared__ int any_cpu;
  __shared__ float red[32];
  const int t = threadIdx.x, bd = blockDim.x;
  float wv[PRE_ELEMS], hv[PRE_ELEMS];
#pragma unroll
  for (int m = 0; m < PRE_ELEMS; m++) wv[m] = t + m * bd < d ? __ldg(w + t + m * bd) : 0.0f; // weights: no kernel writes them
  st_dev_griddep_launch();
  st_dev_griddep_wait(); // every read below is of an earlier kernel's writes
  if (combine) {
    const bool pre_slots = n_expert <= PRE_SLOTS;
    st_route rt = {};
    if (t < k) rt = route[t];
    if (pre_slots && t < n_expert) slots[t] = slot_ptr[t];
#pragma unroll
    for (int m = 0; m < PRE_ELEMS; m++) hv[m] = t + m * bd < d ? h[t + m * bd] : 0.0f;
    if (t == 0) any_cpu = 0;
    __syncthreads();
    if (t < k) {
      const int e = min(max(rt.expert, 0), n_expert - 1);
      const uint8_t *sp = pre_slots ? slots[e] : slot_ptr[e];
      src[t] = (sp ? gpu_out : cpu_out) + (size_t)t * d;
      if (!sp) atomicOr(&any_cpu, 1);
    }
    __syncthreads();
    if (t == 0 && cpu_flag && any_cpu)
      for (const uint32_t want = *seq; dk_flag_load(cpu_flag) != want;) __nanosleep(128);
    __syncthreads();
    // two of the thread's elements at a time, every load of a row group in flight (the mailbox's
    // rows cross the bus; volatile loads, which see the CPU pool's writes, for the card's rows too);
    // each element's sum in slot order. The loads are unconditional (past k: slot k - 1's row again,
    // past d: element i0 again, both dropped): guarded volatile loads may be issued one at a time,
    // each next to its use (as attention.cu's merge found)
    auto pair = [&](int i0, float h0, float h1) {
      const int i1 = i0 + bd, two = i1 < d, i1r = two ? i1 : i0;
      float acc0 = 0.0f, acc1 = 0.0f;
      for (int j0 = 0; j0 < k; j0 += 8) { // (k 0: a dense layer, its fixed FFN's row only)
        float v0[8], v1[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
          const float *r = src[min(j0 + u, k - 1)];
          v0[u] = __ldcv(r + i0); // one kind of load for both sources: no branch between them
          v1[u] = __ldcv(r + i1r);
        }
#pragma unroll
        for (int u = 0; u < 8; u++)
          if (j0 + u < k) acc0 = __fadd_rn(acc0, v0[u]), acc1 = __fadd_rn(acc1, v1[u]);
      }
      if (fixed) { // the fixed FFN's row (shared expert, dense FFN) after the routed ones, as item_combine
        acc0 = k ? __fadd_rn(acc0, fixed[i0]) : fixed[i0];
        if (two) acc1 = k ? __fadd_rn(acc1, fixed[i1]) : fixed[i1];
      }
      x[i0] = xs[i0] = __fadd_rn(acc0, h0);
      if (two) x[i1] = xs[i1] = __fadd_rn(acc1, h1);
    };
#pragma unroll
    for (int m = 0; m < PRE_ELEMS; m += 2)
      if (t + m * bd < d) pair(t + m * bd, hv[m], hv[m + 1]);
    for (int i0 = t + PRE_ELEMS * bd; i0 < d; i0 += 2 * bd) pair(i0, h[i0], i0 + bd < d ? h[i0 + bd] : 0.0f);
  } else {
    if (wait_mail) { // the host writes the embedding row and the position, then the step number (release)
      if (t == 0)
        for (const uint32_t last = *seq; dk_flag_load((const uint32_t *)(pos_seq + 1)) == last;) __nanosleep(256);
      __syncthreads();
    }
    if (t < 2) pos[t] = __ldcv(pos_seq + t);
    if (t == 0 && stamp) *(volatile uint64_t *)stamp = st_dev_globaltimer();
    for (int i = t; i < n_counters; i += bd) counters[i] = 0;
    for (int i = t; i < d; i += bd) {
      const float v = __ldcv(emb + i);
      x[i] = v;
      xs[i] = v;
    }
  }
  __syncthreads();
  float ss = 0.0f;
  if (t < NORM_THREADS)
    for (int i = t; i < d; i += NORM_THREADS) ss = fmaf(xs[i], xs[i], ss);
  ss = st_warp_sum(ss);
  if ((t & 31) == 0 && t < NORM_THREADS) red[t >> 5] = ss;
  __syncthreads();
  float tot = 0.0f;
  for (int i = 0; i < NORM_THREADS / 32; i++) tot += red[i];
  const float scale = rsqrtf(tot / (float)d + eps);
  // each thread rewrites its own elements of xs with xn's (read by the quantisation after a barrier)
#pragma unroll
  for (int m = 0; m < PRE_ELEMS; m++)
    if (t + m * bd < d) xn[t + m * bd] = xs[t + m * bd] = xs[t + m * bd] * scale * wv[m];
  for (int i = t + PRE_ELEMS * bd; i < d; i += bd) xn[i] = xs[i] = xs[i] * scale * w[i];
  if (xq) {
    __syncthreads();
    st_dev_q8_row(xs, d / 32, xq, (float *)(xq + d), t >> 5, bd >> 5);
  }
}

// Up to three matrices of one type times the same vector in one launch: the row groups of segment
// 0, then those of segment 1, ... (mmv_stream_rows(n) rows each).
struct dk_seg {
  const uint8_t *W;
  uint64_t row_bytes;
  int64_t rows;
  float *out;
  int64_t groups;
  int q8; // the segment takes the quantised input row (Q8_0 weights; dk_mv's Q8S kernels), else the float32 one
};
struct dk_segs {
  dk_seg s[3];
  int n;
  unsigned long long *amax; // the head (one segment): its rows' largest st_argmax_key into amax[0], a
                            // non-finite row into amax[1] (st_decode_dev::amax); else NULL
};

// Q8S (Q8_0 weights): the segments marked q8 take xq, the input row quantised (dk_pre's), the others
// xv (mmv_stream's x_q8_some).
template <bool Q8S> struct mv_job {
  static constexpr bool static_rows = true, x_shared = false, x_q8 = false, x_q8_some = Q8S;
#ifdef DK_KNOCKOUT
  static constexpr int ko_compute = 0, ko_rows = 0; // STRATA_KNOCKOUT has no bit for it
#endif
  const dk_segs *g;
  const float *xv;
  const int8_t *xq;
  int R;
  __device__ int seg(int &grp) const {
    int i = 0;
    while (i + 1 < g->n && grp >= g->s[i].groups) grp -= (int)g->s[i].groups, i++;
    return i;
  }
  __device__ int count(int grp) const {
    const int i = seg(grp);
    return (int)min((int64_t)R, g->s[i].rows - (int64_t)grp * R);
  }
  __device__ const uint8_t *row(int grp, int r) const {
    const int i = seg(grp);
    return g->s[i].W + (uint64_t)(grp * R + r) * g->s[i].row_bytes;
  }
  __device__ bool q8(int grp) const { return Q8S && g->s[seg(grp)].q8; }
  __device__ const void *x(int grp) const { return q8(grp) ? (const void *)xq : (const void *)xv; }
  struct pre_t {};
  __device__ pre_t pre(int, int) const { return {}; }
  template <typename Sum> __device__ void put(int grp, Sum sum, int nr, int t, const pre_t &) const {
    const int i = seg(grp);
    const float v = t < nr ? sum(t) : 0.0f;
    if (t < nr) g->s[i].out[(int64_t)grp * R + t] = v;
    if (g->amax) { // the group's largest key by the warp, one atomic; a non-finite logit marked
      const bool fin = isfinite(v);
      unsigned long long key = t < nr && fin ? st_argmax_key(v, (uint32_t)(grp * R + t)) : 0ull;
      if (t < nr && !fin) atomicOr(g->amax + 1, 1ull);
      for (int o = 16; o > 0; o >>= 1) key = max(key, __shfl_xor_sync(0xffffffffu, key, o));
      if (t == 0 && key) atomicMax(g->amax, key);
    }
  }
};

#ifdef DK_KNOCKOUT
template <bool Q8S> struct mv_job_ko : mv_job<Q8S> {
  static constexpr int ko_compute = 4096, ko_rows = 8192; // STRATA_KNOCKOUT's bits
};
#endif

// xq: the input row x quantised (st_q8_stride(n) bytes) for the segments marked q8 (Q8S), else NULL.
template <uint32_t TYPE, bool Q8S>
__global__ void MMV_BOUNDS(1) dk_mv(const __grid_constant__ dk_segs g, int n_groups, const float *x, const int8_t *xq,
                                    int64_t n) {
  extern __shared__ uint4 dyn_smem[];
  __shared__ mmv_pipe<TYPE> sm;
  st_dev_griddep_launch();
  mmv_table<TYPE>(sm.kv);
  const mv_job<Q8S> job = {&g, x, xq, mmv_stream_rows<TYPE>(n)};
#ifdef DK_KNOCKOUT
  if (!g.amax) { // Q/K/V and the output projection, not the head: STRATA_KNOCKOUT's 4096 and 8192 bits
    const mv_job_ko<Q8S> jk{job};
    mmv_stream(sm, dyn_smem, jk, n_groups, n, [] { st_dev_griddep_wait(); }, [] {});
    return;
  }
#endif
  mmv_stream(sm, dyn_smem, job, n_groups, n, [] { st_dev_griddep_wait(); }, [] {});
}

// h = x + xo (residual_piece), ffn_in = RMSNorm(h) * w (rmsnorm_kernel), both computed by every
// block into shared memory and written by block 0 (ffn_in quantised into ffn_q when set, a share by
// each block); then the router logits of the block's rows. The softmax and top-k are dk_gateup's
// (dk_route_select, dk_route_finish): a last block here to finish them (a fence, a counter and one
// block's work after the others) cost about 8.7 us a layer on an H200 (bench/mmv-bench). Dynamic
// shared memory: the staging buffers, then d floats.
struct router_job {
  static constexpr bool static_rows = true, x_shared = true, x_q8 = false, x_q8_some = false;
#ifdef DK_KNOCKOUT
  static constexpr int ko_compute = 16384, ko_rows = 0; // STRATA_KNOCKOUT's bit
#endif
  const uint8_t *W;
  uint64_t row_bytes;
  int E, R;
  const float *xs;
  float *logits;
  const float *bias; // the router's bias [E] (gpt-oss), or NULL
  __device__ int count(int g) const { return min(R, E - g * R); }
  __device__ const uint8_t *row(int g, int r) const { return W + (uint64_t)(g * R + r) * row_bytes; }
  __device__ const void *x(int) const { return xs; }
  struct pre_t {
    float b; // this thread's row's bias
  };
  __device__ pre_t pre(int g, int t) const {
    const int r = g * R + t;
    return {bias && t < R && r < E ? bias[r] : 0.0f};
  }
  template <typename Sum> __device__ void put(int g, Sum sum, int nr, int t, const pre_t &p) const {
    if (t < nr) logits[g * R + t] = bias ? sum(t) + p.b : sum(t);
  }
};

// Router rows a dk_router block computes: at most DK_ROUTER_ROWS (0: a streaming group's,
// mmv_stream_rows, 4 float32 rows of 2,048 weights). One row a block spreads qwen3-30b-a3b's 128 rows
// over 128 blocks instead of 32, and its logits come 1.6 us a layer sooner on an H100 (an 8-layer
// cut's step 552.5 -> 540.0 us, gpt-oss-20b's 775.1 -> 769.2; two a block 543.6; bench/RESULTS.md
// 2026-12-07, thirty-eighth session). A row's sum is the same whichever block computes it. Variant
// knob for A/B builds (scripts/build-decode-variants -DDK_ROUTER_ROWS=0: as before).
#ifndef DK_ROUTER_ROWS
#define DK_ROUTER_ROWS 1
#endif
template <uint32_t TYPE> __host__ __device__ __forceinline__ int dk_router_rows(int64_t d) {
  const int r = mmv_stream_rows<TYPE>(d);
  return DK_ROUTER_ROWS > 0 && DK_ROUTER_ROWS < r ? DK_ROUTER_ROWS : r;
}

template <uint32_t TYPE>
__global__ void MMV_BOUNDS(1) dk_router(const float *x, const float *xo, const float *w, float eps, int d, const uint8_t *W,
                                        uint64_t row_bytes, int E, float *h, float *ffn_in, float *logits, int8_t *ffn_q,
                                        const float *bo, const float *rb) {
  extern __shared__ uint4 dyn_smem[];
  float *xs = (float *)((uint8_t *)dyn_smem + mmv_pipe_bytes<TYPE>());
  __shared__ mmv_pipe<TYPE> sm;
  __shared__ float red[32];
  st_dev_griddep_launch();
  mmv_table<TYPE>(sm.kv);
  const int R = dk_router_rows<TYPE>(d);
  const router_job job = {W, row_bytes, E, R, xs, logits, rb};
  mmv_stream(sm, dyn_smem, job, (E + R - 1) / R, d, [&] {
    st_dev_griddep_wait();
    // every load of the thread first (d <= 4096, gpu_layouts_ok), then the sums in element order
    constexpr int PER = 4096 / MMV_THREADS;
    float xv[PER], wv[PER];
#pragma unroll
    for (int u = 0; u < PER; u++) {
      const int i = threadIdx.x + u * MMV_THREADS;
      xv[u] = i < d ? x[i] + (bo ? xo[i] + bo[i] : xo[i]) : 0.0f; // the output projection's bias first
      wv[u] = i < d ? w[i] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < PER; u++) {
      const int i = threadIdx.x + u * MMV_THREADS;
      if (i >= d) break;
      ss = fmaf(xv[u], xv[u], ss);
      if (blockIdx.x == 0) h[i] = xv[u];
    }
    ss = st_block_sum(ss, red);
    const float scale = rsqrtf(ss / (float)d + eps);
#pragma unroll
    for (int u = 0; u < PER; u++) {
      const int i = threadIdx.x + u * MMV_THREADS;
      if (i >= d) break;
      const float v = xv[u] * scale * wv[u];
      xs[i] = v;
      if (blockIdx.x == 0) ffn_in[i] = v;
    }
    if (ffn_q) { // the blocks share the quantisation of ffn_in: warp 0 of block b takes blocks b, b + grid, ...
      __syncthreads();
      if (threadIdx.x < 32) st_dev_q8_row(xs, d / 32, ffn_q, (float *)(ffn_q + d), blockIdx.x, gridDim.x);
    }
  }, [] {}); // the stream's barriers order the writes to xs before the first group's reads
}

// The layer's routing from dk_router's logits, as st_dev_softmax_topk_block computes it, in two
// halves. dk_route_select, by every block of dk_gateup after st_dev_griddep_wait: the logits into
// E floats of the block's dynamic shared memory (sl) and the chosen experts into sr[0..k) (their
// weights too when k > 32), ending with a barrier, so that the block can start its weights' copies.
// dk_route_finish, by block 0 once its first copies are in flight: the weights, the layer's table
// `route` (which dk_down, dk_pre, the head and the host read) and, when pub_flag is set, the
// routing and ffn_in (d floats) in the mailbox (pub_route, pub_x) for the CPU pool, a fence (system
// scope) and *pub_flag raised to the step number *seq.
struct route_src {
  const float *logits;
  int E, k, d;
  int softmax_weight; // ST_GATING_SOFTMAX_WEIGHT (gpt-oss): the weights a softmax over the chosen logits
  // ST_GATING_SIGMOID (glm4moe): scores sigmoid(logit), chosen by score + sel_bias (may be NULL),
  // weights the chosen scores, renormalised when w_norm, times w_scale (router.c st_route_gated)
  int sigmoid, w_norm;
  float w_scale;
  const float *sel_bias;
  // a group limit (sigmoid routing; n_group > 1 and n_group_used < n_group, else 0, 0): the experts
  // in n_group equal groups, only the n_group_used groups with the best scores chosen from
  int n_group, n_group_used;
  st_route *route;
  const float *ffn_in;
  st_route *pub_route;
  float *pub_x;
  uint32_t *pub_flag;
  const uint32_t *seq;
  // the layer's selection tags (st_decode_dev::sel_tag; DK_DOWN_TAGS, the default), or NULL: dk_gateup's
  // block 0 writes (step << 32) | expert for each slot once it has selected, and dk_down takes its
  // rows' experts from them instead of selecting for itself
  uint64_t *sel_tag;
};
// The weights of a selection r[0..k) (k <= 32) as a softmax over the chosen logits l[r[j].expert]
// (router.c st_route_gated, ST_GATING_SOFTMAX_WEIGHT): their max, each e^(l - max) as a float, the
// double sum in rank order, each weight its share; by one warp (its 32 lanes call it).
__device__ __forceinline__ void dk_chosen_softmax_warp(const float *l, int k, st_route *r) {
  const int lane = threadIdx.x & 31;
  float mx = lane < k ? l[r[lane].expert] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const float p = lane < k ? expf(l[r[lane].expert] - mx) : 0.0f;
  double sum = 0.0;
  for (int j = 0; j < k; j++) sum += (double)__shfl_sync(0xffffffffu, p, j);
  if (lane < k) r[lane].weight = (float)((double)p / sum);
  __syncwarp();
}

// The group limit of router.c's st_route_gated on the selection values v[0..E) (shared memory):
// a group's score the sum of its two best values, found in expert order (one lane a group); the
// n_group_used best groups, ties to the lower group, chosen in order by thread 0 as the CPU does;
// every expert outside them set to -infinity, which st_dev_topk_select_block ranks last. Every
// thread of the block calls it (n_group <= 32).
__device__ __forceinline__ void dk_group_limit(float *v, int E, int n_group, int n_group_used) {
  __shared__ float gscore[32];
  __shared__ uint32_t allow;
  const int per = E / n_group;
  if ((int)threadIdx.x < n_group) {
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int e = threadIdx.x * per; e < ((int)threadIdx.x + 1) * per; e++) {
      const float x = v[e];
      if (x > b1) b2 = b1, b1 = x;
      else if (x > b2) b2 = x;
    }
    gscore[threadIdx.x] = b1 + b2;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t a = 0;
    for (int j = 0; j < n_group_used; j++) {
      int best = -1;
      for (int g = 0; g < n_group; g++)
        if (!(a >> g & 1) && (best < 0 || gscore[g] > gscore[best])) best = g;
      if (best >= 0) a |= 1u << best;
    }
    allow = a;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    if (!(allow >> (e / per) & 1)) v[e] = -INFINITY;
  __syncthreads();
}

__device__ __forceinline__ void dk_route_select(const route_src &rs, float *sl, st_route *sr) {
  if (rs.sigmoid) { // sl: the scores, then (sl + E) the selection values
    for (int e = threadIdx.x; e < rs.E; e += blockDim.x) {
      const float z = __ldcg(rs.logits + e), p = 1.0f / (1.0f + expf(-z));
      sl[e] = p;
      sl[rs.E + e] = rs.sel_bias ? p + rs.sel_bias[e] : p;
    }
    __syncthreads();
    if (rs.n_group > 1) dk_group_limit(sl + rs.E, rs.E, rs.n_group, rs.n_group_used);
    st_dev_topk_select_block(sl + rs.E, rs.E, rs.k, sr);
    return;
  }
  for (int e = threadIdx.x; e < rs.E; e += blockDim.x) sl[e] = __ldcg(rs.logits + e);
#ifdef DK_KNOCKOUT
  // timing only, the selection replaced (dk_gateup's and, through its tags, dk_down's): 32768 the
  // experts 0..k-1 at every step; 65536 k experts E / k apart (16 for qwen3's 128 and 8), the set
  // moving with the step number: {11 step + (E / k) j}
  if (dk_ko & (32768 | 65536)) {
    const int step = (int)*rs.seq, gap = max(rs.E / rs.k, 1);
    for (int e = threadIdx.x; e < rs.E; e += blockDim.x) {
      const int r = ((e - step * 11) % rs.E + rs.E) % rs.E;
      const bool on = dk_ko & 65536 ? r % gap == 0 && r / gap < rs.k : e < rs.k;
      sl[e] = on ? 1.0f : 0.0f;
    }
  }
#endif
  __syncthreads();
  if (rs.k > 32) st_dev_softmax_topk_block(sl, rs.E, rs.k, sr);
  else st_dev_topk_select_block(sl, rs.E, rs.k, sr);
}

// The weights of a sigmoid selection (k <= 32): each chosen score, their double sum in rank order
// (at least 2^-14) dividing them when w_norm, times w_scale; by one warp.
__device__ __forceinline__ void dk_sigmoid_weights_warp(const float *sl, int k, int w_norm, float w_scale, st_route *r) {
  const int lane = threadIdx.x & 31;
  float p = lane < k ? sl[r[lane].expert] : 0.0f;
  if (w_norm) {
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += (double)__shfl_sync(0xffffffffu, p, j);
    if (sum < 6.103515625e-5) sum = 6.103515625e-5;
    p = (float)((double)p / sum);
  }
  if (w_scale != 1.0f) p *= w_scale;
  if (lane < k) r[lane].weight = p;
  __syncwarp();
}
// dk_gateup's block 0, after dk_route_select: the selection's tags for dk_down (rs.sel_tag set).
__device__ __forceinline__ void dk_route_tag(const route_src &rs, const st_route *sr) {
  if (rs.sel_tag && blockIdx.x == 0 && (int)threadIdx.x < rs.k)
    rs.sel_tag[threadIdx.x] = (uint64_t)*rs.seq << 32 | (uint32_t)sr[threadIdx.x].expert;
}
// dk_down, instead of dk_route_select: each slot's expert from its tag once the tag carries this
// step's number (dk_gateup's block 0 has selected; it is resident by then, since dk_down starts only
// after every dk_gateup block has passed its wait), into sr[0..k); ends with a barrier. The same
// experts as dk_route_select would give: the same function of the same logits.
__device__ __forceinline__ void dk_route_from_tags(const route_src &rs, st_route *sr) {
  if ((int)threadIdx.x < rs.k) {
    const uint32_t want = __ldcg(rs.seq);
    const uint64_t *p = rs.sel_tag + threadIdx.x;
    uint64_t v;
    for (v = __ldcv(p); (uint32_t)(v >> 32) != want; v = __ldcv(p)) __nanosleep(64);
    sr[threadIdx.x].expert = (int)(uint32_t)v;
  }
  __syncthreads();
}
__device__ __forceinline__ void dk_route_finish(const route_src &rs, const float *sl, st_route *sr) {
  if (blockIdx.x != 0) return; // block-uniform: the barriers below see every thread of block 0
  if (rs.k <= 32 && threadIdx.x < 32) {
    if (rs.sigmoid) dk_sigmoid_weights_warp(sl, rs.k, rs.w_norm, rs.w_scale, sr);
    else if (rs.softmax_weight) dk_chosen_softmax_warp(sl, rs.k, sr);
    else st_dev_topk_weights_warp(sl, rs.E, rs.k, sr);
  }
  __syncthreads();
  if ((int)threadIdx.x < rs.k) rs.route[threadIdx.x] = sr[threadIdx.x];
  if (!rs.pub_flag) return;
  for (int i = threadIdx.x; i < rs.d; i += blockDim.x) rs.pub_x[i] = __ldcg(rs.ffn_in + i);
  if ((int)threadIdx.x < rs.k) rs.pub_route[threadIdx.x] = sr[threadIdx.x];
  dk_raise(rs.pub_flag, rs.seq);
}

// The cached pair of routing slot j (NULL: another tier computes it).
__device__ __forceinline__ const uint8_t *dk_slot(const st_route *route, const uint8_t *const *slot_ptr, int n_expert,
                                                  int j) {
  return slot_ptr[min(max(route[j].expert, 0), n_expert - 1)];
}

// act[j][r] = silu(gate_r x) * up_r x for the ff rows of every routing slot j whose pair is in this
// card's cache (swiglu's float operations; route: the block's selection, dk_route_select). A group is (slot j, H rows): its first H rows from
// gate, its last H from up (H = mmv_stream_rows(n) / 2; rows past ff repeat the last one). Q8: x is
// ffn_in quantised (dk_router's ffn_q).
template <bool Q8> struct gateup_job {
  static constexpr bool static_rows = false, x_shared = false, x_q8 = Q8, x_q8_some = false;
#ifdef DK_KNOCKOUT
  static constexpr int ko_compute = 128, ko_rows = 256; // STRATA_KNOCKOUT's bits
#endif
  const st_route *route;
  const uint8_t *const *slot_ptr;
  int n_expert, ff, H, per; // per: groups per slot
  uint64_t up_off, row_bytes;
  const void *xv;
  float *act;
  const float *gate_b, *up_b; // the experts' biases [n_expert][ff] (gpt-oss), or NULL
  int oai;                    // ST_ACT_SWIGLU_OAI: the clamped SwiGLU (router.c st_swiglu_oai)
  __device__ int count(int g) const { return dk_slot(route, slot_ptr, n_expert, g / per) ? 2 * H : 0; }
  __device__ const uint8_t *row(int g, int r) const {
    const uint8_t *p = dk_slot(route, slot_ptr, n_expert, g / per);
    const int rr = min((g % per) * H + r % H, ff - 1);
    return p + (r < H ? 0 : up_off) + (uint64_t)rr * row_bytes;
  }
  __device__ const void *x(int) const { return xv; }
  struct pre_t {
    float gb, ub; // this thread's output's gate and up biases
  };
  __device__ pre_t pre(int g, int t) const {
    pre_t p = {0.0f, 0.0f};
    if (!(gate_b || up_b) || t >= H) return p;
    const int j = g / per, r = (g - j * per) * H + t;
    if (r < ff) {
      const int64_t eb = (int64_t)min(max(route[j].expert, 0), n_expert - 1) * ff + r;
      if (gate_b) p.gb = gate_b[eb];
      if (up_b) p.ub = up_b[eb];
    }
    return p;
  }
  template <typename Sum> __device__ void put(int g, Sum sum, int nr, int t, const pre_t &p) const {
    if (!nr || t >= H) return;
    const int j = g / per, r = (g - j * per) * H + t;
    if (r < ff) {
      float gv = sum(t), uv = sum(H + t);
      if (gate_b) gv += p.gb;
      if (up_b) uv += p.ub;
      if (oai) { // x sigma(1.702 x) (y + 1), x clamped above at 7, y to [-7, 7]
        const float xg = fminf(gv, 7.0f), yu = fmaxf(fminf(uv, 7.0f), -7.0f);
        act[j * ff + r] = xg / (1.0f + expf(-1.702f * xg)) * (yu + 1.0f);
      } else {
        act[j * ff + r] = gv / (1.0f + expf(-gv)) * uv;
      }
    }
  }
};

// Dynamic shared memory: the staging buffers, then E floats (dk_route_select's logits); the job's
// route is the block's own (dk_route_select into shared memory), rs where it comes from. Its
// dependents (dk_down) are signalled after its wait, once the router's logits are complete.
template <uint32_t TYPE, bool Q8>
__global__ void MMV_BOUNDS(1) dk_gateup(const __grid_constant__ gateup_job<Q8> job_in, const __grid_constant__ route_src rs,
                                        int n_groups, int64_t n) {
  extern __shared__ uint4 dyn_smem[];
  __shared__ mmv_pipe<TYPE> sm;
  __shared__ st_route sr[64];
  mmv_table<TYPE>(sm.kv);
  gateup_job<Q8> job = job_in;
  job.route = sr;
  float *sl = (float *)((uint8_t *)dyn_smem + mmv_pipe_bytes<TYPE>());
  mmv_stream(sm, dyn_smem, job, n_groups, n, [&] {
    st_dev_griddep_wait();
    // dk_down may start once every block is here: the router's logits, which it selects from
    // before its own wait, are then complete
    st_dev_griddep_launch();
    dk_route_select(rs, sl, sr);
#if DK_DOWN_TAGS
    dk_route_tag(rs, sr);
#endif
  }, [&] { dk_route_finish(rs, sl, sr); });
}

// out[j][r] = weight_j * down_r act[j] for the d rows of every routing slot j whose pair is in this
// card's cache (the grouped kernel's scaling). Its rows come from the block's own selection (sel:
// dk_route_select, as dk_gateup's, from the router's logits, which are complete when dk_down
// starts), so that their copies start before st_dev_griddep_wait, while dk_gateup finishes; the
// weights (and the bias's expert) from the layer's table `route`, after the wait. A group is
// (slot j, R rows): float32 act, groups (slot j, rows part) in part-major order (Q8: slot-minor, g = part k + j, the grid a multiple of
// k, so that a block's groups share one slot, whose act row the block quantises once into shared
// memory, xq, after it has started its first group's copies).
template <bool Q8> struct down_job {
  static constexpr bool static_rows = true, x_shared = Q8, x_q8 = Q8, x_q8_some = false;
#ifdef DK_KNOCKOUT
  static constexpr int ko_compute = 512, ko_rows = 1024; // STRATA_KNOCKOUT's bits
#endif
  const st_route *route; // the layer's table (dk_gateup's block 0 writes it): the weights
  const st_route *sel;   // the block's selection (shared memory): the rows
  const uint8_t *const *slot_ptr;
  int n_expert, d, R, per, ff, k;
  uint64_t down_off, row_bytes;
  const float *act;
  float *out;
  int8_t *xq; // Q8: the block's quantised act row (shared memory)
  const float *down_b; // the experts' down biases [n_expert][d] (gpt-oss), or NULL: added before the weight
  __device__ int slot(int g) const { return Q8 ? g % k : g / per; }
  __device__ int part(int g) const { return Q8 ? g / k : g % per; }
  __device__ int count(int g) const {
    return dk_slot(sel, slot_ptr, n_expert, slot(g)) ? min(R, d - part(g) * R) : 0;
  }
  __device__ const uint8_t *row(int g, int r) const {
    return dk_slot(sel, slot_ptr, n_expert, slot(g)) + down_off + (uint64_t)(part(g) * R + r) * row_bytes;
  }
  __device__ const void *x(int g) const { return Q8 ? (const void *)xq : (const void *)(act + (int64_t)slot(g) * ff); }
  struct pre_t {
    float b, w; // this thread's row's bias, and the slot's weight
  };
  __device__ pre_t pre(int g, int t) const {
    pre_t p = {0.0f, 0.0f};
    if (t >= R) return p;
    const int j = slot(g), r = part(g) * R + t;
    if (r < d) {
      const st_route rt = route[j];
      p.w = rt.weight;
      if (down_b) p.b = down_b[(int64_t)min(max(rt.expert, 0), n_expert - 1) * d + r];
    }
    return p;
  }
  template <typename Sum> __device__ void put(int g, Sum sum, int nr, int t, const pre_t &p) const {
    if (t >= nr) return;
    out[(int64_t)slot(g) * d + part(g) * R + t] = (down_b ? sum(t) + p.b : sum(t)) * p.w;
  }
};

// Dynamic shared memory: the staging buffers, then (Q8) the quantised act row, then E floats
// (dk_route_select's logits; twice that for sigmoid routing).
template <uint32_t TYPE, bool Q8>
__global__ void MMV_BOUNDS(1) dk_down(__grid_constant__ const down_job<Q8> job_in, const __grid_constant__ route_src rs,
                                      int n_groups, int64_t n) {
  extern __shared__ uint4 dyn_smem[];
  __shared__ mmv_pipe<TYPE> sm;
  __shared__ st_route sr[64];
  st_dev_griddep_launch();
  mmv_table<TYPE>(sm.kv);
  down_job<Q8> job = job_in;
  job.xq = (int8_t *)((uint8_t *)dyn_smem + mmv_pipe_bytes<TYPE>());
  job.sel = sr;
  const int j = blockIdx.x % job.k, ff = job.ff;
#ifdef DK_KNOCKOUT
  if (dk_ko & 2048) { // the experts 0..k-1 instead of the block's top-k (timing only)
    if ((int)threadIdx.x < rs.k) sr[threadIdx.x].expert = (int)threadIdx.x;
    __syncthreads();
  } else
#endif
#if DK_DOWN_TAGS
  if (rs.sel_tag) dk_route_from_tags(rs, sr);
  else
#endif
  dk_route_select(rs, (float *)((uint8_t *)dyn_smem + mmv_pipe_bytes<TYPE>() + (Q8 ? st_q8_stride(ff) : 0)), sr);
  mmv_stream(sm, dyn_smem, job, n_groups, n, [] { st_dev_griddep_wait(); }, [&] {
    if (Q8 && (int)blockIdx.x < n_groups)
      st_dev_q8_row(job.act + (int64_t)j * ff, ff / 32, job.xq, (float *)(job.xq + ff), threadIdx.x >> 5, MMV_THREADS / 32);
  });
}

// The fixed FFN's activation (shared expert, dense FFN): act[i] = silu(g[i]) u[i] for i < n, g and u
// n floats apart in gu (swiglu's float operations).
__global__ void dk_fixed_act(const float *gu, int n, float *act) {
  st_dev_griddep_launch();
  st_dev_griddep_wait();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float g = gu[i], u = gu[n + i];
    act[i] = g / (1.0f + expf(-g)) * u;
  }
}

} // namespace
