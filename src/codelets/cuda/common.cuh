// Shared device code of the CUDA variants: weight dequantisation (every type quant.h computes,
// the i-quants with device copies of iq_grids.h's tables), warp and block reductions, the float32 matrix products every codelet uses, RMSNorm,
// and stream-ordered scratch memory. All products accumulate in float32.
#pragma once

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <starpu.h>
#include <starpu_cuda.h>
#include <stdint.h>

#include "codelets/codelets.h"
#include "codelets/iq_grids.h"
#include "codelets/quant.h"

#define ST_CUDA_CHECK(call)                                   \
  do {                                                        \
    cudaError_t st_err_ = (call);                             \
    if (st_err_ != cudaSuccess) STARPU_CUDA_REPORT_ERROR(st_err_); \
  } while (0)

__device__ __forceinline__ float st_dev_half(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float st_dev_bf16(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

__device__ __forceinline__ uint32_t st_dev_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
__device__ __forceinline__ float st_dev_f16at(const uint8_t *p) { return st_dev_half((uint16_t)(p[0] | (p[1] << 8))); }

// Q4_K/Q5_K: the 6-bit scale and min of sub-block is (0..7) from the 12 packed bytes (ggml's
// get_scale_min_k4), for the generic decoder and the mat-vec kernels alike.
__host__ __device__ __forceinline__ void st_dev_k45_scale_min(const uint8_t *scales, int is, int *sc, int *m) {
  if (is < 4) {
    *sc = scales[is] & 63;
    *m = scales[is + 4] & 63;
  } else {
    *sc = (scales[is + 4] & 0xF) | ((scales[is - 4] >> 6) << 4);
    *m = (scales[is + 4] >> 4) | ((scales[is] >> 6) << 4);
  }
}

// The i-quants' lookup tables in device memory (one copy per translation unit, as ggml's CUDA
// backend keeps them), from the same initialiser lists as quant.c's.
static __device__ const int8_t st_dev_kvalues_iq4nl[16] = ST_KVALUES_IQ4NL_VALUES;
static __device__ const int8_t st_dev_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static __device__ const uint64_t st_dev_iq2xs_grid[512] = ST_IQ2XS_GRID_VALUES;
static __device__ const uint64_t st_dev_iq2s_grid[1024] = ST_IQ2S_GRID_VALUES;
static __device__ const uint32_t st_dev_iq3xxs_grid[256] = ST_IQ3XXS_GRID_VALUES;
static __device__ const uint32_t st_dev_iq3s_grid[512] = ST_IQ3S_GRID_VALUES;
static __device__ const uint64_t st_dev_iq2xxs_grid[256] = ST_IQ2XXS_GRID_VALUES;
static __device__ const uint64_t st_dev_iq1s_grid[2048] = ST_IQ1S_GRID_VALUES;

// Sign (+1 or -1) of weight j of a group of 8 under sign byte `signs` (bit j set: negative).
__device__ __forceinline__ float st_dev_sign(uint32_t signs, int j) { return (signs >> j) & 1 ? -1.0f : 1.0f; }
// The IQ2_XS/IQ3_XXS sign byte of a 7-bit field (quant.h st_iq_signs).
__device__ __forceinline__ uint32_t st_dev_iq_signs(uint32_t f) { return f | (uint32_t)(__popc(f & 127) & 1) << 7; }

// Element i of an i-quant row (quant.c's dequant_iq* one element at a time, same float operations).
__device__ __forceinline__ float st_dev_iq_weight(uint32_t type, const uint8_t *row, int64_t i) {
  const int r = (int)(i % 256), ib = r / 32;
  switch (type) {
  case ST_TYPE_IQ4_NL: {
    const int j = (int)(i % 32);
    const uint8_t *b = row + (i / 32) * 18;
    const int q = j < 16 ? b[2 + j] & 0xF : b[2 + j - 16] >> 4;
    return st_dev_f16at(b) * (float)st_dev_kvalues_iq4nl[q];
  }
  case ST_TYPE_IQ4_XS: {
    const int j = r % 32;
    const uint8_t *b = row + (i / 256) * 136;
    const int sh = b[2] | b[3] << 8;
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
    const uint8_t *qs = b + 8 + 16 * ib;
    const int q = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
    const float dl = st_dev_f16at(b) * (float)(ls - 32);
    return dl * (float)st_dev_kvalues_iq4nl[q];
  }
  case ST_TYPE_IQ2_XS:
  case ST_TYPE_IQ2_S: {
    const int g = r / 8, l = g % 4, j = r % 8;
    const uint8_t *b = row + (i / 256) * (type == ST_TYPE_IQ2_XS ? 74 : 82);
    const uint8_t sc = b[type == ST_TYPE_IQ2_XS ? 66 + ib : 74 + ib];
    const float dl = st_dev_f16at(b) * (0.5f + (float)((sc >> (4 * (l / 2))) & 0xF)) * 0.25f;
    uint64_t grid;
    uint32_t signs;
    if (type == ST_TYPE_IQ2_XS) {
      const uint32_t q = b[2 + 2 * g] | (uint32_t)b[3 + 2 * g] << 8;
      grid = st_dev_iq2xs_grid[q & 511];
      signs = st_dev_iq_signs(q >> 9);
    } else {
      grid = st_dev_iq2s_grid[b[2 + g] | ((b[66 + ib] >> (2 * l)) & 3) << 8];
      signs = b[34 + g];
    }
    return dl * (float)((grid >> (8 * j)) & 0xFF) * st_dev_sign(signs, j);
  }
  case ST_TYPE_IQ2_XXS: { // quant.h st_block_iq2_xxs
    const int l = (r % 32) / 8, j = r % 8;
    const uint8_t *b = row + (i / 256) * 66;
    const uint32_t aux = st_dev_u32(b + 2 + 8 * ib + 4);
    const float dl = st_dev_f16at(b) * (0.5f + (float)(aux >> 28)) * 0.25f;
    const uint64_t grid = st_dev_iq2xxs_grid[b[2 + 8 * ib + l]];
    return dl * (float)((grid >> (8 * j)) & 0xFF) * st_dev_sign(st_dev_iq_signs((aux >> (7 * l)) & 127), j);
  }
  case ST_TYPE_IQ1_S: { // st_block_iq1_s
    const int l = (r % 32) / 8, j = r % 8;
    const uint8_t *b = row + (i / 256) * 50;
    const unsigned qh = b[34 + 2 * ib] | (unsigned)b[35 + 2 * ib] << 8;
    const float dl = st_dev_f16at(b) * (float)(2 * ((qh >> 12) & 7) + 1), delta = qh & 0x8000 ? -0.125f : 0.125f;
    const uint64_t grid = st_dev_iq1s_grid[b[2 + 4 * ib + l] | ((qh >> (3 * l)) & 7) << 8];
    return dl * ((float)(int8_t)(grid >> (8 * j)) + delta);
  }
  case ST_TYPE_IQ1_M: { // st_block_iq1_m: d in the scale words' top nibbles
    const int l = (r % 32) / 8, j = r % 8;
    const uint8_t *b = row + (i / 256) * 56, *sb = b + 48;
    const unsigned s0 = sb[0] | sb[1] << 8, s1 = sb[2] | sb[3] << 8, s2 = sb[4] | sb[5] << 8, s3 = sb[6] | sb[7] << 8;
    const float d = st_dev_half((uint16_t)((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000)));
    const unsigned sc = sb[2 * (ib / 2)] | sb[2 * (ib / 2) + 1] << 8;
    const float dl = d * (float)(2 * ((sc >> (6 * (ib % 2) + (l < 2 ? 0 : 3))) & 7) + 1);
    const unsigned h = b[32 + 2 * ib + l / 2] >> (4 * (l % 2));
    const float delta = h & 8 ? -0.125f : 0.125f;
    const uint64_t grid = st_dev_iq1s_grid[b[4 * ib + l] | (h & 7) << 8];
    return dl * ((float)(int8_t)(grid >> (8 * j)) + delta);
  }
  case ST_TYPE_IQ3_XXS: {
    const int k = r / 4, l = (r % 32) / 8;
    const uint8_t *b = row + (i / 256) * 98;
    const uint32_t aux = st_dev_u32(b + 2 + 64 + 4 * ib);
    const float dl = st_dev_f16at(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
    const uint32_t grid = st_dev_iq3xxs_grid[b[2 + k]];
    return dl * (float)((grid >> (8 * (r % 4))) & 0xFF) * st_dev_sign(st_dev_iq_signs((aux >> (7 * l)) & 127), r % 8);
  }
  default: { // IQ3_S
    const int k = (r % 32) / 4;
    const uint8_t *b = row + (i / 256) * 110;
    const float dl = st_dev_f16at(b) * (float)(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 0xF));
    const uint32_t grid = st_dev_iq3s_grid[b[2 + 8 * ib + k] | ((b[66 + ib] >> k) & 1) << 8];
    return dl * (float)((grid >> (8 * (r % 4))) & 0xFF) * st_dev_sign(b[74 + r / 8], r % 8);
  }
  }
}

// Element i of a weight row of `type` (the block layouts of quant.h, as ggml's dequantize_row_*
// define them; one element at a time, for the kernels that are not specialised on the type).
__device__ __forceinline__ float st_dev_weight(uint32_t type, const uint8_t *row, int64_t i) {
  switch (type) {
  case ST_TYPE_F32: return ((const float *)row)[i];
  case ST_TYPE_F16: return st_dev_half(((const uint16_t *)row)[i]);
  case ST_TYPE_BF16: return st_dev_bf16(((const uint16_t *)row)[i]);
  case ST_TYPE_Q8_0: {
    const uint8_t *b = row + (i / 32) * 34;
    return st_dev_f16at(b) * (float)(int8_t)b[2 + i % 32];
  }
  case ST_TYPE_Q4_0:
  case ST_TYPE_Q4_1: {
    const int j = (int)(i % 32), size = type == ST_TYPE_Q4_0 ? 18 : 20, qoff = type == ST_TYPE_Q4_0 ? 2 : 4;
    const uint8_t *b = row + (i / 32) * size;
    const int q = j < 16 ? b[qoff + j] & 0xF : b[qoff + j - 16] >> 4;
    return type == ST_TYPE_Q4_0 ? (float)(q - 8) * st_dev_f16at(b) : (float)q * st_dev_f16at(b) + st_dev_f16at(b + 2);
  }
  case ST_TYPE_Q5_0:
  case ST_TYPE_Q5_1: {
    const int j = (int)(i % 32), size = type == ST_TYPE_Q5_0 ? 22 : 24, hoff = type == ST_TYPE_Q5_0 ? 2 : 4;
    const uint8_t *b = row + (i / 32) * size;
    const uint32_t qh = st_dev_u32(b + hoff);
    const int lo = j < 16 ? b[hoff + 4 + j] & 0xF : b[hoff + 4 + j - 16] >> 4;
    const int hi = j < 16 ? (int)(((qh >> j) << 4) & 0x10) : (int)((qh >> (j - 4)) & 0x10);
    return type == ST_TYPE_Q5_0 ? (float)((lo | hi) - 16) * st_dev_f16at(b)
                                : (float)(lo | hi) * st_dev_f16at(b) + st_dev_f16at(b + 2);
  }
  case ST_TYPE_Q2_K:
  case ST_TYPE_Q3_K: {
    const int r = (int)(i % 256), n = r / 128, s = (r % 128) / 32, half = (r % 32) / 16, l = r % 16;
    const int is = n * 8 + s * 2 + half, qi = n * 32 + l + 16 * half;
    if (type == ST_TYPE_Q2_K) {
      const uint8_t *b = row + (i / 256) * 84;
      const uint8_t sc = b[is];
      const int q = (b[16 + qi] >> (2 * s)) & 3;
      return st_dev_f16at(b + 80) * (float)(sc & 0xF) * (float)q - st_dev_f16at(b + 82) * (float)(sc >> 4);
    }
    const uint8_t *b = row + (i / 256) * 110, *sc = b + 96;
    const int g = is / 4, bb = is % 4;
    const int scale = (((sc[(g & 1) * 4 + bb] >> (4 * (g >> 1))) & 0xF) | (((sc[8 + bb] >> (2 * g)) & 3) << 4)) - 32;
    const int q = ((b[32 + qi] >> (2 * s)) & 3) - ((b[l + 16 * half] & (1 << (n * 4 + s))) ? 0 : 4);
    return st_dev_f16at(b + 108) * (float)scale * (float)q;
  }
  case ST_TYPE_Q4_K:
  case ST_TYPE_Q5_K: {
    const int r = (int)(i % 256), j64 = r / 64, sub = (r % 64) / 32, l = r % 32, is = 2 * j64 + sub;
    const uint8_t *b = row + (i / 256) * (type == ST_TYPE_Q4_K ? 144 : 176), *scales = b + 4;
    const uint8_t *qs = b + (type == ST_TYPE_Q4_K ? 16 : 48);
    int sc, m;
    st_dev_k45_scale_min(scales, is, &sc, &m);
    int q = sub ? qs[j64 * 32 + l] >> 4 : qs[j64 * 32 + l] & 0xF;
    if (type == ST_TYPE_Q5_K && (b[16 + l] & (1 << is))) q += 16;
    return st_dev_f16at(b) * (float)sc * (float)q - st_dev_f16at(b + 2) * (float)m;
  }
  case ST_TYPE_IQ4_NL:
  case ST_TYPE_IQ4_XS:
  case ST_TYPE_IQ2_XXS:
  case ST_TYPE_IQ2_XS:
  case ST_TYPE_IQ2_S:
  case ST_TYPE_IQ3_XXS:
  case ST_TYPE_IQ3_S:
  case ST_TYPE_IQ1_S:
  case ST_TYPE_IQ1_M: return st_dev_iq_weight(type, row, i);
  case ST_TYPE_MXFP4: { // quant.h st_block_mxfp4: the doubled E2M1 level times 2^(e - 128)
    const int j = (int)(i % 32);
    const uint8_t *b = row + (i / 32) * 17;
    const int q = j < 16 ? b[1 + j] & 0xF : b[1 + j - 16] >> 4;
    const uint32_t bits = b[0] < 2 ? 0x00200000u << b[0] : (uint32_t)(b[0] - 1) << 23;
    return (float)st_dev_kvalues_mxfp4[q] * __uint_as_float(bits);
  }
  case ST_TYPE_Q1_0: { // quant.h st_block_q1_0
    const int j = (int)(i % 128);
    const uint8_t *b = row + (i / 128) * 18;
    const float d = st_dev_f16at(b);
    return (b[2 + j / 8] >> (j % 8)) & 1 ? d : -d;
  }
  case ST_TYPE_Q2_0: {
    const int j = (int)(i % 64);
    const uint8_t *b = row + (i / 64) * 18;
    return (float)(((b[2 + j / 4] >> (2 * (j % 4))) & 3) - 1) * st_dev_f16at(b);
  }
  case ST_TYPE_TQ1_0: { // byte and trit of weight r (quant.h st_block_tq1_0)
    const int r = (int)(i % 256);
    const uint8_t *b = row + (i / 256) * 54;
    int byte, n;
    if (r < 160) byte = r % 32, n = r / 32;
    else if (r < 240) byte = 32 + (r - 160) % 16, n = (r - 160) / 16;
    else byte = 48 + (r - 240) % 4, n = (r - 240) / 4;
    const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const int trit = (int)(((unsigned)(uint8_t)(b[byte] * pow3[n]) * 3) >> 8);
    return (float)(trit - 1) * st_dev_f16at(b + 52);
  }
  case ST_TYPE_TQ2_0: {
    const int r = (int)(i % 256), g = r / 128, l = (r % 128) / 32, m = r % 32;
    const uint8_t *b = row + (i / 256) * 66;
    return (float)(((b[32 * g + m] >> (2 * l)) & 3) - 1) * st_dev_f16at(b + 64);
  }
  default: { // Q6_K
    const int r = (int)(i % 256), n = r / 128, quarter = (r % 128) / 32, l = r % 32;
    const uint8_t *b = row + (i / 256) * 210, *ql = b + n * 64, *qh = b + 128 + n * 32;
    const int8_t *sc = (const int8_t *)(b + 192) + n * 8;
    const uint8_t lo = quarter & 1 ? ql[l + 32] : ql[l];
    const int q = ((quarter < 2 ? lo & 0xF : lo >> 4) | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
    return st_dev_f16at(b + 208) * (float)sc[l / 16 + 2 * quarter] * (float)q;
  }
  }
}

__device__ __forceinline__ float st_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float st_block_sum(float v, float *shared32) {
  v = st_warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += shared32[w];
  return s;
}

// Asynchronous copies global -> shared (cp.async, sm_80+): 16 (or 8) bytes without registers (a plain copy
// before sm_80), the end of a group of them, and waits until every group but the newest, or every
// group, has landed (this thread's copies; no-ops before sm_80).
__device__ __forceinline__ void st_dev_cp16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
#else
  *(uint4 *)dst = __ldcs((const uint4 *)src);
#endif
}
// The same for 8 bytes (cp.async.ca: the .cg form takes 16 only), 8-byte aligned at both ends.
__device__ __forceinline__ void st_dev_cp8(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(src) : "memory");
#else
  *(uint2 *)dst = __ldg((const uint2 *)src);
#endif
}
__device__ __forceinline__ void st_dev_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void st_dev_cp_wait_prev() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void st_dev_cp_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

// A hint that bytes [p, p + bytes) of global memory will be read soon: their 128-byte lines fetched
// into L1 (LEVEL 1) or L2 (LEVEL 2) (prefetch.global.L1 / .L2; PTX ISA, "Data Movement and Conversion
// Instructions: prefetch"), the lines shared out over threads t = 0 .. nt - 1 of those that call it.
// p NULL: nothing.
template <int LEVEL = 2> __device__ __forceinline__ void st_dev_prefetch(const void *p, size_t bytes, int t, int nt) {
  if (!p) return;
  const uintptr_t a = (uintptr_t)p & ~(uintptr_t)127, end = (uintptr_t)p + bytes;
  for (uintptr_t l = a + (uintptr_t)t * 128; l < end; l += (uintptr_t)nt * 128) {
    if (LEVEL == 1) asm volatile("prefetch.global.L1 [%0];" ::"l"(l));
    else asm volatile("prefetch.global.L2 [%0];" ::"l"(l));
  }
}

// Bulk copies global -> shared that complete on an mbarrier (sm_90: the copy engine of
// cp.async.bulk, one instruction for a whole range; PTX ISA, "Data Movement and Conversion
// Instructions: cp.async.bulk" and "mbarrier"). ST_DEV_BULK says whether this device code has
// them; without them the callers copy with st_dev_cp16 and wait at a block barrier.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ST_DEV_BULK 1
#else
#define ST_DEV_BULK 0
#endif
// An mbarrier in shared memory expecting one arrival a phase, made visible to the copy engine
// (one thread calls it; a block barrier must follow before any other thread uses it).
__device__ __forceinline__ void st_dev_mbar_init(uint64_t *bar) {
#if ST_DEV_BULK
  const unsigned a = (unsigned)__cvta_generic_to_shared(bar);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(a) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  (void)bar;
#endif
}
// The phase's one arrival, announcing `bytes` of bulk copies that complete it (release: this
// thread's earlier shared-memory writes are seen by the threads its completion wakes).
__device__ __forceinline__ void st_dev_mbar_arrive_tx(uint64_t *bar, unsigned bytes) {
#if ST_DEV_BULK
  const unsigned a = (unsigned)__cvta_generic_to_shared(bar);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(bytes) : "memory");
#else
  (void)bar, (void)bytes;
#endif
}
// bytes (a multiple of 16) from src to dst (both 16-byte aligned), counted on bar.
__device__ __forceinline__ void st_dev_bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
#if ST_DEV_BULK
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst), b = (unsigned)__cvta_generic_to_shared(bar);
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(d),
               "l"(src), "r"(bytes), "r"(b)
               : "memory");
#else
  (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}
// Waits until the phase of parity `parity` of bar has completed (acquire: the copies' bytes and
// the arriving thread's earlier writes are then seen).
__device__ __forceinline__ void st_dev_mbar_wait(uint64_t *bar, unsigned parity) {
#if ST_DEV_BULK
  const unsigned a = (unsigned)__cvta_generic_to_shared(bar);
  unsigned done = 0;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(a), "r"(parity)
                 : "memory");
  } while (!done);
#else
  (void)bar, (void)parity;
#endif
}

// Programmatic dependent launch (sm_90; no-ops before): a kernel launched with st_cuda_launch's
// pdl flag may start before the previous kernel of its stream has finished; it must call
// st_dev_griddep_wait() before it touches memory any earlier kernel writes or reads (only constant
// data, such as weights, before). st_dev_griddep_launch() lets the next such kernel start early.
__device__ __forceinline__ void st_dev_griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void st_dev_griddep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The GPU's global clock in ns (%globaltimer: its ticks are coarse, about a microsecond).
__device__ __forceinline__ uint64_t st_dev_globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- int8 activations (STRATA_INT8_DOT on a GPU) ------------------------------------------------
// An activation row of n floats (n a multiple of 32) quantised as the CPU's st_quantize_act does
// (dot.h: per block of 32, d = max|x| / 127 and q = round(x / d) by the same float operations, so
// the same quants and scales bit for bit), laid out for the GPU: the n int8 quants, then the n / 32
// float scales; rows st_q8_stride(n) bytes apart (a multiple of 16). mmv.cuh's kernels read it.
__host__ __device__ __forceinline__ int64_t st_q8_stride(int64_t n) { return (n + n / 8 + 15) / 16 * 16; }

// One block of 32 values, v this lane's: its quant to *q (each lane its own), the scale to *d
// (lane 0). One warp, every lane calls it.
__device__ __forceinline__ void st_dev_q8_quantize(float v, int8_t *q, float *d) {
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  // 1.5 * 2^23: the rounded integer lands in the low mantissa bits (no contraction: _rn)
  const int r = (__float_as_int(__fadd_rn(__fmul_rn(v, id), 12582912.0f)) & 0x007fffff) - 0x00400000;
  *q = (int8_t)min(max(r, -127), 127);
  if ((threadIdx.x & 31) == 0) *d = amax / 127.0f;
}

// Blocks b0, b0 + step, ... (< nb) of the 32-float blocks at x, quants to qs[32 b ..], scales to
// ds[b], one warp each; every lane of the calling warps calls it.
__device__ __forceinline__ void st_dev_q8_row(const float *x, int nb, int8_t *qs, float *ds, int b0, int step) {
  const int lane = threadIdx.x & 31;
  for (int b = b0; b < nb; b += step) st_dev_q8_quantize(x[32 * b + lane], qs + 32 * b + lane, ds + b);
}

// Elements [e0, e0 + n) of a row x of `total` floats into the int8 row xq as st_dev_q8_row lays one
// out (quants at xq[e], the 32-element blocks' scales as floats after all `total` quants): block b
// of the span by warp b % warps of the calling block (every thread calls it); e0, n and total
// multiples of 32. A block quantising what it has just written to x calls __syncthreads first.
__device__ __forceinline__ void st_dev_q8_span(const float *x, int64_t e0, int n, int64_t total, int8_t *xq) {
  st_dev_q8_row(x + e0, n / 32, xq + e0, (float *)(xq + total) + e0 / 32, (int)(threadIdx.x >> 5), (int)(blockDim.x >> 5));
}

// The softmax's max and double sum of E logits l by one warp (every lane calls it): lane-strided,
// then butterflies; mx is every lane's, the callers take lane 0's sum (the lanes' may differ in
// their last bit).
__device__ __forceinline__ void st_dev_softmax_stats_warp(const float *l, int E, float &mx, double &sum) {
  const int lane = threadIdx.x & 31;
  mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  sum = 0.0;
  for (int e = lane; e < E; e += 32) sum += expf(l[e] - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
}

// A router's softmax and top-k for one token, run by one warp (every lane calls it): softmax over
// the E logits l (sum in double, as the CPU variant), then k rounds of a warp-wide argmax (ties to
// the lower expert id) over the experts not yet taken, weights renormalised over the k; written to
// r[0..k). Each lane owns experts lane, lane + 32, ... (at most 32 of them: E <= 1024).
__device__ __forceinline__ void st_dev_softmax_topk(const float *l, int E, int k, st_route *r) {
  const int lane = threadIdx.x & 31;
  float mx;
  double sum;
  st_dev_softmax_stats_warp(l, E, mx, sum);
  uint32_t taken = 0;
  double wsum = 0.0;
  for (int j = 0; j < k; j++) {
    float best = -INFINITY;
    int best_e = -1;
    for (int e = lane, m = 0; e < E; e += 32, m++)
      if (!(taken >> m & 1u) && (best_e < 0 || l[e] > best)) best = l[e], best_e = e;
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (oe >= 0 && (best_e < 0 || ob > best || (ob == best && oe < best_e))) best = ob, best_e = oe;
    }
    if ((best_e & 31) == lane) taken |= 1u << (best_e >> 5);
    const float p = (float)(expf(best - mx) / sum);
    if (lane == 0) r[j] = st_route{best_e, p};
    wsum += p;
  }
  __syncwarp();
  if (lane < k) r[lane].weight = (float)(r[lane].weight / wsum);
}

// The selection of st_dev_softmax_topk's routing by a whole block (every thread calls it; l in
// shared or global memory; k <= 32): r[j].expert = the expert of rank j < k, where an expert ranks
// behind every one with a higher logit, or an equal one and a lower id, and a NaN behind every
// number. Each expert is ranked against all E by one thread or (a block of 2E threads or more, E
// <= 256) by several threads' shares added in shared memory. Ends with a barrier.
__device__ __forceinline__ void st_dev_topk_select_block(const float *l, int E, int k, st_route *r) {
  __shared__ int s_rk[256];
  const int P = E <= 256 && (int)blockDim.x >= 2 * E ? (int)blockDim.x / E : 1;
  if (P > 1) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) s_rk[e] = 0;
    __syncthreads();
  }
  for (int t = threadIdx.x; t < P * E; t += blockDim.x) {
    const int e = t % E, part = t / E, o0 = part * E / P, o1 = (part + 1) * E / P;
    const float v = l[e];
    int rank = 0;
    if (isnan(v)) {
      for (int o = o0; o < o1; o++) rank += !isnan(l[o]) || o < e;
    } else { // a NaN u is neither above nor equal to v
#pragma unroll 8
      for (int o = o0; o < o1; o++) {
        const float u = l[o];
        rank += (u > v) | ((u == v) & (o < e));
      }
    }
    if (P > 1) atomicAdd(&s_rk[e], rank);
    else if (rank < k) r[rank].expert = e;
  }
  if (P > 1) {
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (s_rk[e] < k) r[s_rk[e]].expert = e;
  }
  __syncthreads();
}

// The weights of a selection (st_dev_topk_select_block's r[0..k), k <= 32), by one warp (its 32
// lanes call it): the max and the double sum of the softmax as st_dev_softmax_topk takes them (the
// sum lane 0's), each chosen expert's probability, their double sum in rank order, and r[j].weight
// = its share: the bits of st_dev_softmax_topk's weights.
__device__ __forceinline__ void st_dev_topk_weights_warp(const float *l, int E, int k, st_route *r) {
  const int lane = threadIdx.x & 31;
  float mx;
  double sum;
  st_dev_softmax_stats_warp(l, E, mx, sum);
  sum = __shfl_sync(0xffffffffu, sum, 0);
  const float p = lane < k ? (float)(expf(l[r[lane].expert] - mx) / sum) : 0.0f;
  double w = 0.0;
  for (int j = 0; j < k; j++) w += __shfl_sync(0xffffffffu, p, j);
  if (lane < k) r[lane].weight = (float)(p / w);
  __syncwarp();
}

// st_dev_softmax_topk's routing computed by a whole block (every thread calls it; l in shared or
// global memory): st_dev_topk_select_block, then st_dev_topk_weights_warp in warp 0. Without NaN
// logits, the selection, the weights and their bits are st_dev_softmax_topk's, which rounds k
// warp-wide argmaxes one after another; this takes a few hundred cycles instead. k <= 32 (else it
// calls st_dev_softmax_topk). r: shared or global memory; complete after the closing barrier.
__device__ __forceinline__ void st_dev_softmax_topk_block(const float *l, int E, int k, st_route *r) {
  if (k > 32) {
    if (threadIdx.x < 32) st_dev_softmax_topk(l, E, k, r);
    __syncthreads();
    return;
  }
  __shared__ st_route s_r[32];
  st_dev_topk_select_block(l, E, k, s_r);
  if (threadIdx.x < 32) {
    st_dev_topk_weights_warp(l, E, k, s_r);
    if ((int)threadIdx.x < k) r[threadIdx.x] = s_r[threadIdx.x];
  }
  __syncthreads();
}

__device__ __forceinline__ float st_block_max(float v, float *shared32) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < (int)(blockDim.x >> 5); w++) m = fmaxf(m, shared32[w]);
  return m;
}

// out[t * ldo + (r - r0)] = dot(W[r], x[t * ldx .. + n]) for r in [r0, r1), t in [0, T): the CUDA
// counterpart of st_matmul (dot.h), queued on `stream`. int8 (STRATA_INT8_DOT): Q8_0 weights take
// the token rows quantised as st_quantize_act does (stream-ordered scratch) and integer block sums
// (mmv.cuh, mmv_chunk_q8), the CPU's st_matmul_q8 product up to the order of its float additions;
// other types ignore it.
void st_cuda_matmul(uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1,
                    const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo,
                    cudaStream_t stream, int int8);

// One matrix product per group g (an expert): rows [0, n_out) of W_g times the group's
// activation rows x[row0_g .. row0_g + n_rows_g) into the same rows of out; `scale` (per
// activation row, may be NULL) multiplies each result. The descriptors live in device memory.
// q8_rows > 0 (STRATA_INT8_DOT): x's first q8_rows rows (every group's) are quantised and Q8_0
// weights take the int8 kernels, as for st_cuda_matmul; 0: float32 activations.
struct st_cuda_group {
  const uint8_t *W;
  int32_t row0, n_rows;
};
void st_cuda_grouped_matmul(uint32_t type, uint64_t row_bytes, const st_cuda_group *groups_dev,
                            int n_groups, int max_rows, int64_t n_out, const float *x, int64_t n,
                            const float *scale, float *out, cudaStream_t stream, int64_t q8_rows);
// T token rows of n floats (x, ldx floats apart; n a multiple of 32) quantised as st_quantize_act
// does into xq (rows st_q8_stride(n) bytes apart: the n quants, then the n / 32 float scales).
void st_cuda_quantize_rows(const float *x, int64_t ldx, int64_t T, int64_t n, int8_t *xq, cudaStream_t stream);
// Rows from which an expert of Q8_0 weights on int8 activations leaves the grouped decode kernels
// for the tensor-core ones on the prompt path (expert_rows.cu): the grouped kernels read a
// weight row once per 8 token rows (mmv.cuh MMV_TT), the tensor-core kernels once per 32.
#define ST_MMQ_MIN_ROWS 9
// Whether st_cuda_mmq_grouped takes rows of n weights of this type (Q8_0, n a multiple of 128).
bool st_cuda_mmq_takes(uint32_t type, int64_t n);
// st_cuda_grouped_matmul's product on the tensor cores (mmq.cuh): Q8_0 weights times the groups'
// activation rows already quantised in xq (st_cuda_quantize_rows), one launch for every group.
void st_cuda_mmq_grouped(uint64_t row_bytes, const st_cuda_group *groups_dev, int n_groups, int max_rows,
                         int64_t n_out, const int8_t *xq, int64_t n, const float *scale, float *out,
                         cudaStream_t stream);

// ---- gemm.cu: prompt-chunk products through cuBLAS (see the file's notes on exactness) ----
// The calling StarPU CUDA worker's cuBLAS handle when a batch of T token rows should use cuBLAS:
// min_rows > 0 (0: STRATA_CUBLAS=0) and T >= min_rows, and starpu_cublas_init was called; else
// NULL (the float32 kernels).
// The current CUDA device's compute capability as major * 10 + minor (90 for sm_90), asked once
// per device (devices.cu); 0 when it cannot be asked. Thread-safe.
int st_cuda_compute_capability();
cublasHandle_t st_cuda_cublas_handle(int64_t T, int32_t min_rows);
// st_cuda_matmul's product through cuBLAS on handle h, queued on `stream` (h is bound to it):
// weights other than F32 are dequantised to float32 scratch (chunks of at most 64 MiB), then one
// GEMM per chunk (TF32 or float32 math: st_cuda_gemm_set_tf32; CUBLAS_GEMM_DEFAULT).
void st_cuda_gemm(cublasHandle_t h, uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1,
                  const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo, cudaStream_t stream);
// The pieces of st_cuda_gemm, for a codelet that runs several GEMMs with one scratch: bind h to
// `stream` (host pointer mode, pedantic math) once, then rows [0, rows) of W times x with `ws`
// (rows * n floats of device memory; unused for F32 weights) holding their float32 copy.
void st_cuda_gemm_bind(cublasHandle_t h, cudaStream_t stream);
void st_cuda_gemm_with(cublasHandle_t h, uint32_t type, const void *W, uint64_t row_bytes, int64_t rows,
                       const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo,
                       cudaStream_t stream, float *ws);
// st_cuda_gemm when h is not NULL, else st_cuda_matmul (same arguments; int8 for the latter).
void st_cuda_product(cublasHandle_t h, uint32_t type, const void *W, uint64_t row_bytes, int64_t r0, int64_t r1,
                     const float *x, int64_t ldx, int64_t T, int64_t n, float *out, int64_t ldo, cudaStream_t stream,
                     int int8);

// y[t] = RMSNorm(x[t]) * w for T rows of n (w may be NULL); y may alias x.
void st_cuda_rmsnorm(const float *x, const float *w, float *y, int T, int n, float eps, cudaStream_t stream);

// ---- the decode step's pieces (attention.cu, router.cu), for decode.cu ----------------------
#define ST_CUDA_MAX_KV_HEADS 32 /* KV heads the decode step's KV append takes (engine.c refuses more) */
// What an architecture adds to a decode step's attention (io/arch.h; zero and NULL everywhere: qwen3moe's,
// the bits of the launch without it). Device pointers.
struct st_cuda_attn_ext {
  const float *bq, *bk, *bv; // biases of the queries [Hq][hd], the new K and V rows [G][hd] (added first)
  const float *sinks;        // [Hq] one sink logit per query head: one more term of the softmax's denominator
  float scale;               // the q.k scale (0: 1 / sqrt(hd))
  int window;                // sliding window: position p sees keys p - window + 1 .. p (0: none; at most
                             // the short contexts' keys, st_cuda_attn_short_keys)
  int ring;                  // rows of the caches: position p at row p % ring (0: row p)
  int n_rot;                 // dims RoPE rotates (0: hd; fewer: a partial NEOX RoPE, the table's rows
                             // still hd / 2 pairs apart)
};
// The q/k norms, RoPE and KV append of a decode step in one launch: the Hq query heads at q ([Hq][hd])
// normed (qw) and rotated in place at position *pos_dev; for each KV head g < G <= ST_CUDA_MAX_KV_HEADS
// the K row kvnew[g hd ..] normed (kw) and rotated, and the V row kvnew[(G + g) hd ..], written at
// position *pos_dev (x: its ring row) of the caches k[g], v[g]; qw, kw NULL: no norm; x (may be NULL):
// biases, sinks, the scale, a sliding window ([n_ctx][hd] each of kv_type: ST_TYPE_F32, ST_TYPE_F16
// rounded to nearest even, or ST_TYPE_Q8_0 rows of ggml's blocks quantised as the CPU does). The per-task kernels' arithmetic, with the cosines and
// sines read from tab (st_cuda_rope_table's, the same floats). out (may be NULL): at positions whose
// keys are few (up to 128; 64 for head_dim 256 in float32) the launch also writes the token's
// attention there ([Hq][hd], the attention codelet's T = 1 bits), leaving q as it was; then
// st_cuda_attend_decode_all with after_short leaves those positions alone. outq (may be NULL; with
// out, hd a multiple of 32): that attention also quantised into outq, st_q8_stride(Hq hd) bytes laid
// out as st_dev_q8_row's row (the bits mmv_quantize makes of out), each head by the block that wrote it.
void st_cuda_rope_append(float *q, int Hq, const float *kvnew, int G, int hd, const float *qw, const float *kw,
                         float eps, const int *pos_dev, int kv_type, void *const *k, void *const *v, const float *tab,
                         float *out, int pdl, cudaStream_t st, const st_cuda_attn_ext *x = NULL, int8_t *outq = NULL);
// RoPE's cosine and sine for every position < n_ctx and pair i < hd / 2 into t ([n_ctx][hd / 2]
// (cos, sin) pairs: n_ctx hd floats), as the attention kernels compute them (double precision,
// rounded to float), queued on st.
void st_cuda_rope_table(float *t, int n_ctx, int hd, float theta, cudaStream_t st);
// Lets the split-K attention kernels take the dynamic shared memory the current device allows
// (st_cuda_worker_init calls it: outside any stream capture, after any device reset); without
// it they stay within the default 48 KiB (fewer staged tiles, the same bits).
void st_cuda_attention_allow_smem();
// One token's causal attention for all Hq query heads at q ([Hq][hd]; head h reads KV head h / (Hq / G))
// over keys 0..*pos_dev of k[g], v[g] (of kv_type, as st_cuda_rope_append's; the attention codelet's split-K kernels: the chunks depend on
// the position only), out [Hq][hd]. part: st_cuda_decode_part_floats(n_ctx, Hq, hd) floats;
// counters: Hq ints, zero before the launch and zero again after it. The attention codelet's T = 1
// kernels, bit for bit, in one launch; the grid does not depend on the position.
// after_short: positions whose attention st_cuda_rope_append wrote (given out) are left alone.
// pdl (both): launched as st_cuda_launch's programmatic dependents of the previous kernel.
// regime: ST_ATT_REGIME_ANY, a launch (a CUDA graph) that serves every position; or the regime
// (st_cuda_attend_regime) of every position the launch will see, so that it launches only the
// kernel that computes them: nothing for SHORT with after_short (rope_append's launch attends),
// of a half cache's pair (the tensor-core kernel from ATT_MMA_CHUNK keys a chunk) the plain kernel
// for SPLIT and the tensor-core one for WIDE. The bits do not depend on it. outq (may be NULL; hd a
// multiple of 32): out quantised there too, as st_cuda_rope_append's.
enum { ST_ATT_REGIME_ANY = -1, ST_ATT_REGIME_SHORT = 0, ST_ATT_REGIME_SPLIT = 1, ST_ATT_REGIME_WIDE = 2 };
void st_cuda_attend_decode_all(const float *q, int Hq, int G, int hd, int kv_type, void *const *k, void *const *v,
                               const int *pos_dev, float *part, int *counters, float *out, int after_short, int pdl,
                               cudaStream_t st, const st_cuda_attn_ext *x = NULL, int regime = ST_ATT_REGIME_ANY,
                               int8_t *outq = NULL);
// The regime of a decode token's attention at position pos (window: a sliding window's keys, or
// 0) of head_dim hd in a cache of kv_type: SHORT up to rope_append's short-context keys, WIDE where
// the split-K chunks reach ATT_MMA_CHUNK keys, else SPLIT.
int st_cuda_attend_regime(int hd, int kv_type, int pos, int window);
// The router's softmax and top-k (router.cu) over T rows of E logits into routing [T][k].
void st_cuda_softmax_topk(const float *logits, int T, int E, int k, st_route *routing, cudaStream_t st);

// Launches kernel<<<grid, block, smem, st>>>(args...), with programmatic stream serialisation when
// pdl (the kernel then calls st_dev_griddep_wait first; see above). Errors are reported as the
// other launches' are.
template <typename... KArgs, typename... Args>
static inline void st_cuda_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, int pdl,
                                  Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  ST_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...));
}

// Once per CUDA worker (engine start): keeps freed stream-ordered memory in the device's pool
// instead of returning it at every synchronisation, so per-task scratch costs no cudaMalloc.
extern "C" void st_cuda_worker_init(void *unused);

// Stream-ordered device scratch (cudaMallocAsync); freed with st_cuda_free on the same stream.
void *st_cuda_alloc(size_t bytes, cudaStream_t stream);
void st_cuda_free(void *p, cudaStream_t stream);
