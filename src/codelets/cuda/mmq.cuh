// Grouped matrix products of Q8_0 weights and int8 activations on the tensor cores, for the
// prompt path's experts (issue #22): every expert of a task in one launch per matrix, straight
// from the GGUF blocks (no float copy of the weights). The activation rows are quantised as the
// CPU's st_quantize_act does (common.cuh st_q8_stride layout: per block of 32, d = max|x| / 127),
// so a weight block (d_w, 32 int8) and an activation block (d_x, 32 int8) give one exact integer
// sum, which mma.sync.m16n8k32.s8 computes for 16 rows x 8 tokens at once (one Q8_0 block is one
// k-step of the instruction); each block's sum then enters the float accumulator as
// acc = fma(d_w * d_x, (float)isum, acc), blocks in order 0, 1, ... n / 32 - 1. The same scheme
// as the int8 decode kernels (mmv.cuh mmv_chunk_q8) and the CPU's st_matmul_q8, in another order
// of the float additions (those sum blocks by chunk and lane).
//
// Bits: an output element depends on its weight row, its token's activation row and n only (no
// split over k, no atomics, no dependence on the tile it falls in or on the other experts of the
// launch), so it repeats run to run and across cards of any kind, and one expert computed alone
// gives the bits it has among others.
//
// Tiles: a block of 128 threads (4 warps) takes 128 weight rows x MMQ_TOKENS tokens of one expert;
// each warp 32 rows x MMQ_TOKENS tokens (2 x MMQ_TOKENS / 8 mma tiles). k goes by stages of 4 blocks
// (128 weights). While the block computes one stage, the next is in flight: its 128 weight rows'
// bytes (136 a row, 17 8-byte words) copied by cp.async into shared memory as they lie (`raw`),
// coalesced (16 threads take the first 16 words of a row, 128 contiguous bytes, and each thread
// the 17th of its own row, so that a warp's copy touches 2 rows' lines, not 32), and its token
// rows' quants and scales loaded into registers. Then each thread unpacks one row from raw (quants
// with 16 bytes of padding a row, so that the fragment loads hit 32 distinct banks; the scales as
// floats beside them). Before 2026-12-06 each thread loaded its own row's 17 words into registers
// (every load touched 32 cache lines) and the tiles had 32 tokens: 128 experts of 768 x 2048 at
// 256 token rows each took 1,239 us on an H100, 598 us now (test_cuda_kernels' TIME rows;
// bench/RESULTS.md, twenty-fourth session).
//
// The PTX ISA's fragment layouts for m16n8k32 with .s8 (groupID g = lane / 4, t = lane % 4): A
// (row-major 16 x 32) regs {row g, k 4t..4t+3}, {row g+8, k 4t..}, {row g, k 16+4t..}, {row g+8,
// k 16+4t..}; B (32 x 8, column-major) regs {k 4t.., column g}, {k 16+4t.., column g}; C (16 x 8
// int32) {row g, column 2t}, {g, 2t+1}, {g+8, 2t}, {g+8, 2t+1}.
#ifndef STRATA_MMQ_CUH
#define STRATA_MMQ_CUH

#include "codelets/cuda/common.cuh"

#define MMQ_ROWS 128   /* weight rows of a thread block */
#ifndef MMQ_TOKENS
#define MMQ_TOKENS 64  /* token rows of a thread block: 32 or 64 (the bits do not depend on it) */
#endif
#define MMQ_STAGE 4    /* Q8_0 blocks (of 32 weights) a stage */
#define MMQ_THREADS 128
#define MMQ_PITCH (MMQ_STAGE * 32 + 16) /* bytes of a row of quants in shared memory */
#define MMQ_WORDS (MMQ_STAGE * 34 / 8)  /* 8-byte words of a row's stage: 17 */
#define MMQ_PX (MMQ_TOKENS * MMQ_STAGE * 2 / MMQ_THREADS) /* 16-byte pieces of token quants a thread a stage */
#define MMQ_PD (MMQ_TOKENS * MMQ_STAGE / MMQ_THREADS)     /* token scales a thread a stage */
static_assert(MMQ_ROWS == MMQ_THREADS && MMQ_STAGE == 4 && (MMQ_TOKENS == 32 || MMQ_TOKENS == 64),
              "mmq: a weight row a thread to unpack, whole pieces of token quants and scales a thread a stage");

// Whether the calling thread's current CUDA device has the int8 m16n8k32 instruction (compute
// capability 8.0 or later).
static inline bool mmq_device_ok() { return st_cuda_compute_capability() >= 80; }

// Whether mmq_grouped takes rows of n weights of this type on the current device: Q8_0 rows of
// whole stages (their bytes then a multiple of 136, so a stage of a row is 8-byte aligned when the
// matrix is), on a card of compute capability 8.0 or later.
static inline bool mmq_takes(uint32_t type, int64_t n) {
  return type == ST_TYPE_Q8_0 && n > 0 && n % (32 * MMQ_STAGE) == 0 && mmq_device_ok();
}

// mma.sync with int8 m16n8k32 needs sm_80 or later: an older target compiles no instruction, and
// the host never launches the kernel on such a card (mmq_device_ok).
__device__ __forceinline__ void mmq_mma(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  (void)c, (void)a, (void)b0, (void)b1;
  __trap();
#else
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// (float)i for |i| < 2^22 (a block's integer sum is at most 32 x 127 x 127) by the float of 2^23 +
// 2^22 + i less that constant: exact, so the same float as the conversion instruction, which
// runs at an eighth of the float rate and bounded the kernel (one per output and block).
__device__ __forceinline__ float mmq_float(int i) {
  return __fsub_rn(__int_as_float(i + 0x4B400000), 12582912.0f);
}

// Group blockIdx.z's rows [blockIdx.x MMQ_ROWS, + MMQ_ROWS) of n_out times its token rows
// [blockIdx.y MMQ_TOKENS, + MMQ_TOKENS) of n_rows: out[(row0 + t) n_out + r] = (sum over the
// blocks) times scale[row0 + t] when scale is not NULL. xq: quantised rows, st_q8_stride(n)
// bytes apart (the n quants, then n / 32 float scales); row_bytes: a Q8_0 row (n / 32 x 34 bytes).
#ifndef MMQ_MIN_BLOCKS
#define MMQ_MIN_BLOCKS (MMQ_TOKENS == 64 ? 2 : 3) /* blocks an SM: 255 or 168 registers a thread, no spills */
#endif
__global__ void __launch_bounds__(MMQ_THREADS, MMQ_MIN_BLOCKS)
    mmq_q8_grouped_kernel(uint64_t row_bytes, const st_cuda_group *groups, int64_t n_out, const int8_t *xq,
                          int64_t n, const float *scale, float *out) {
  constexpr int NI = MMQ_TOKENS / 8; // a warp's mma tiles of 8 tokens
  __shared__ __align__(16) int8_t sw[MMQ_ROWS * MMQ_PITCH];
  __shared__ __align__(16) int8_t sx[MMQ_TOKENS * MMQ_PITCH];
  __shared__ float sdw[MMQ_ROWS * MMQ_STAGE], sdx[MMQ_TOKENS * MMQ_STAGE];
  __shared__ uint2 raw[MMQ_ROWS * MMQ_WORDS]; // the stage's weight words as loaded: row r's at r * MMQ_WORDS
  const st_cuda_group g = groups[blockIdx.z];
  const int64_t rb = (int64_t)blockIdx.x * MMQ_ROWS;
  const int tb = blockIdx.y * MMQ_TOKENS;
  if (tb >= g.n_rows || rb >= n_out) return; // the whole block
  const int nr = (int)min((int64_t)MMQ_ROWS, n_out - rb), nt = min(MMQ_TOKENS, g.n_rows - tb);
  const int64_t ldq = st_q8_stride(n), nb = n / 32;
  const int8_t *xt = xq + (int64_t)(g.row0 + tb) * ldq;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, ti = lane & 3;
  float acc[2][NI][4];
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int ni = 0; ni < NI; ni++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[mi][ni][i] = 0.0f;

  // The next stage's bytes are in flight while the current one is computed: 17 words of the weight
  // rows' stage (a row's stage of MMQ_STAGE blocks is 136 contiguous bytes, 8-byte aligned: mmq_takes;
  // rows past n_out read the last row, never written out) copied into raw by cp.async, a half-warp
  // a row's first 16 words, each thread word 16 of its own row; and, into registers, MMQ_PX 16-byte
  // pieces of the token rows' quants and MMQ_PD of their scales (tokens past n_rows read as zeros).
  const uint8_t *wst = g.W + (uint64_t)rb * row_bytes;
  int4 px[MMQ_PX];
  float pd[MMQ_PD];
  auto fetch = [&](int64_t s0) {
    const uint8_t *ws = wst + (uint64_t)(s0 / MMQ_STAGE) * (MMQ_WORDS * 8);
#pragma unroll
    for (int k = 0; k < MMQ_WORDS; k++) {
      // k < 16: word tid % 16 of row tid / 16 + 8 k (a half-warp copies 128 contiguous bytes of a
      // row); k = 16: word 16 of row tid
      const int r = k < 16 ? tid / 16 + 8 * k : tid, c = k < 16 ? tid % 16 : 16;
      st_dev_cp8(raw + r * MMQ_WORDS + c, (const uint2 *)(ws + (uint64_t)min(r, nr - 1) * row_bytes) + c);
    }
    st_dev_cp_commit();
#pragma unroll
    for (int k = 0; k < MMQ_PX; k++) {
      const int i = tid + MMQ_THREADS * k, t = i / (MMQ_STAGE * 2), c = i % (MMQ_STAGE * 2);
      px[k] = t < nt ? __ldg((const int4 *)(xt + (int64_t)t * ldq + s0 * 32 + c * 16)) : make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < MMQ_PD; k++) {
      const int i = tid + MMQ_THREADS * k, t = i / MMQ_STAGE;
      pd[k] = t < nt ? __ldg((const float *)(xt + (int64_t)t * ldq + n) + s0 + i % MMQ_STAGE) : 0.0f;
    }
  };
  fetch(0);
  for (int64_t s0 = 0; s0 < nb; s0 += MMQ_STAGE) {
    st_dev_cp_wait_all(); // this thread's copies into raw have landed
    __syncthreads(); // every warp is done with the previous stage (and raw holds every thread's copies)
    {
      // the 136 bytes as 34 little-endian words: block b's scale at byte 34 b, its quants from 34 b + 2
      // (for even b two bytes into a word: each quant word from two, by __byte_perm)
      uint32_t v[2 * MMQ_WORDS];
#pragma unroll
      for (int k = 0; k < MMQ_PX; k++) {
        const int i = tid + MMQ_THREADS * k, t = i / (MMQ_STAGE * 2), c = i % (MMQ_STAGE * 2);
        *(int4 *)(sx + t * MMQ_PITCH + c * 16) = px[k];
      }
#pragma unroll
      for (int k = 0; k < MMQ_PD; k++) sdx[tid + MMQ_THREADS * k] = pd[k];
#pragma unroll
      for (int w = 0; w < MMQ_WORDS; w++) {
        const uint2 u = raw[tid * MMQ_WORDS + w];
        v[2 * w] = u.x, v[2 * w + 1] = u.y;
      }
#pragma unroll
      for (int b = 0; b < MMQ_STAGE; b++) {
        uint32_t q[8];
        if (b % 2 == 0) {
#pragma unroll
          for (int m = 0; m < 8; m++) q[m] = __byte_perm(v[17 * b / 2 + m], v[17 * b / 2 + m + 1], 0x5432);
          sdw[tid * MMQ_STAGE + b] = st_dev_half((uint16_t)(v[17 * b / 2] & 0xffffu));
        } else {
#pragma unroll
          for (int m = 0; m < 8; m++) q[m] = v[(34 * b + 2) / 4 + m];
          sdw[tid * MMQ_STAGE + b] = st_dev_half((uint16_t)(v[34 * b / 4] >> 16));
        }
        uint4 *dst = (uint4 *)(sw + tid * MMQ_PITCH + b * 32);
        dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
        dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
      }
    }
    __syncthreads();
    if (s0 + MMQ_STAGE < nb) fetch(s0 + MMQ_STAGE);
#pragma unroll
    for (int b = 0; b < MMQ_STAGE; b++) {
      uint32_t a[2][4], bf[NI][2];
#pragma unroll
      for (int mi = 0; mi < 2; mi++) {
        const int8_t *p = sw + (warp * 32 + mi * 16 + gi) * MMQ_PITCH + b * 32 + 4 * ti;
        a[mi][0] = *(const uint32_t *)p;
        a[mi][1] = *(const uint32_t *)(p + 8 * MMQ_PITCH);
        a[mi][2] = *(const uint32_t *)(p + 16);
        a[mi][3] = *(const uint32_t *)(p + 8 * MMQ_PITCH + 16);
      }
#pragma unroll
      for (int ni = 0; ni < NI; ni++) {
        const int8_t *p = sx + (ni * 8 + gi) * MMQ_PITCH + b * 32 + 4 * ti;
        bf[ni][0] = *(const uint32_t *)p;
        bf[ni][1] = *(const uint32_t *)(p + 16);
      }
#pragma unroll
      for (int mi = 0; mi < 2; mi++) {
        const float dw0 = sdw[(warp * 32 + mi * 16 + gi) * MMQ_STAGE + b];
        const float dw1 = sdw[(warp * 32 + mi * 16 + gi + 8) * MMQ_STAGE + b];
#pragma unroll
        for (int ni = 0; ni < NI; ni++) {
          int c[4] = {0, 0, 0, 0};
          mmq_mma(c, a[mi], bf[ni][0], bf[ni][1]);
          const float dx0 = sdx[(ni * 8 + 2 * ti) * MMQ_STAGE + b], dx1 = sdx[(ni * 8 + 2 * ti + 1) * MMQ_STAGE + b];
          acc[mi][ni][0] = fmaf(__fmul_rn(dw0, dx0), mmq_float(c[0]), acc[mi][ni][0]);
          acc[mi][ni][1] = fmaf(__fmul_rn(dw0, dx1), mmq_float(c[1]), acc[mi][ni][1]);
          acc[mi][ni][2] = fmaf(__fmul_rn(dw1, dx0), mmq_float(c[2]), acc[mi][ni][2]);
          acc[mi][ni][3] = fmaf(__fmul_rn(dw1, dx1), mmq_float(c[3]), acc[mi][ni][3]);
        }
      }
    }
  }
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int ni = 0; ni < NI; ni++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int r = warp * 32 + mi * 16 + gi + (i >> 1) * 8, t = ni * 8 + 2 * ti + (i & 1);
        if (r >= nr || t >= nt) continue;
        const int64_t row = (int64_t)g.row0 + tb + t;
        out[row * n_out + rb + r] = scale ? __fmul_rn(acc[mi][ni][i], scale[row]) : acc[mi][ni][i];
      }
}

// Queues the grouped product (mmq_takes(type, n) must hold): groups_dev as for
// st_cuda_grouped_matmul (a group of 0 rows is skipped), max_rows the most rows of a group.
static inline void mmq_grouped(uint64_t row_bytes, const st_cuda_group *groups_dev, int n_groups, int max_rows,
                               int64_t n_out, const int8_t *xq, int64_t n, const float *scale, float *out,
                               cudaStream_t stream) {
  if (n_groups <= 0 || max_rows <= 0 || n_out <= 0) return;
  const dim3 grid((unsigned)((n_out + MMQ_ROWS - 1) / MMQ_ROWS), (unsigned)((max_rows + MMQ_TOKENS - 1) / MMQ_TOKENS),
                  (unsigned)n_groups);
  mmq_q8_grouped_kernel<<<grid, MMQ_THREADS, 0, stream>>>(row_bytes, groups_dev, n_out, xq, n, scale, out);
}
#endif
