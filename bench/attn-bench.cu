// The decode step's attention alone, timed on a GPU host (issue #20): st_cuda_attend_decode_all
// (attention.cu, included here so that a changed attention.cu can be timed without the engine
// build) on the qwen3-30b-a3b shape (32 query heads in 4 KV groups, head_dim 128,
// float32 K and V, or half with KV=f16, or q8_0 blocks with KV=q8_0) at several depths, 48 launches back to back as programmatic dependents in one
// CUDA graph over 8 copies of the KV cache (so that L2 holds as little as it can), µs per launch and
// the K and V bytes read per second. Then one launch at each CHECK_KEYS depth against a float64 reference of
// the same data on the host (max |Δ| over the 32 heads' outputs, and a hash of their bits), so that a
// variant that computes the wrong thing shows. Not a test: it prints, it asserts nothing.
// Build: `make bench/attn-bench` (ATT_FLAGS for -D flags: ATT_SPLIT, ATT_MIN_CHUNK, ATT_MIN_BLOCKS,
// ATT_MMA_CHUNK (keys of a chunk from which the half cache takes the tensor-core block), ATT_MMA_LOAD (its loads),
// ATT_MMA_SKIP (that block without its key loop), ATT_MMA_WARM (its tensor cores used once before
// the wait for the previous kernel), ATT_PLAN_ES, ATT_Q8_LOAD (the q8_0 blocks' loads), ATT_MMA_CHUNK_Q8 (ATT_MMA_CHUNK for a q8_0 cache), ATT_PROBE (block clocks),
// ATT_PF / ATT_PF_Q8 / ATT_PF_AHEAD (each warp's prefetch of its next rows, half / q8_0 cache), ATT_KO (timing only:
// 1 the tensor-core block's loads without its arithmetic, 2 its arithmetic on made-up values without loads);
// run: [KV=f16|q8_0] [MODE=0|1|2] [COPIES=N] [DEPTH=N] [REGIME=any]
// [CHECK_KEYS=N,N,..] attn-bench [replays].
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <xxhash.h>

#include "codelets/cuda/attention.cu"
#ifndef ATT_MAX_STAGES
#define ATT_MAX_STAGES 2 /* a kernel without the knob */
#endif

#include "bench-check.cuh"

namespace {

constexpr int HQ = 32, G = 4, HD = 128, N_CTX = 32832, LAUNCHES = 48; // N_CTX: the deep row's -c
static int COPIES = 8; // env COPIES (1..48): 1 so that L2 holds the cache, 48 a cache per layer as the engine has

// A value in [-1, 1) from an index and a seed (the same on host and device).
__host__ __device__ inline float hash_unit(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9e3779b97f4a7c15ull + seed;
  x ^= x >> 31, x *= 0xbf58476d1ce4e5b9ull, x ^= x >> 29;
  return (float)((x >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

template <typename T> __global__ void fill(T *p, int64_t n, uint32_t seed) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    kv_st(p + i, hash_unit(i, seed));
}

// What a KV cache of kv_type holds for x.
inline double kv_value(float x, int kv_type) { return kv_type == ST_TYPE_F16 ? (double)__half2float(__float2half_rn(x)) : x; }

// What a q8_0 cache holds for value i of row j filled with hash_unit(j HD + .., seed): the row's
// block of i quantised as the CPU and kv_store_q8 do, decoded exactly (the GPU's blocks then round d q
// to half: part of the error printed).
inline double q8_value(int64_t j, int i, uint32_t seed) {
  const int b0 = i / 32 * 32;
  float amax = 0.0f;
  for (int u = 0; u < 32; u++) amax = fmaxf(amax, fabsf(hash_unit(j * HD + b0 + u, seed)));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  return (double)__half2float(__float2half_rn(d)) * roundf(hash_unit(j * HD + i, seed) * id);
}

} // namespace

int main(int argc, char **argv) {
  const int replays = argc > 1 ? atoi(argv[1]) : 20;
  if (const char *c = getenv("COPIES")) COPIES = std::min(std::max(atoi(c), 1), LAUNCHES);
  const int64_t kv_floats = (int64_t)N_CTX * HD;
  const char *kv_env = getenv("KV");
  const int kv_type = kv_env && !strcmp(kv_env, "f16") ? ST_TYPE_F16 : kv_env && !strcmp(kv_env, "q8_0") ? ST_TYPE_Q8_0 : ST_TYPE_F32;
  // bytes a value (a q8_0 row: 34 bytes a block of 32)
  const double es = kv_type == ST_TYPE_Q8_0 ? (double)kv_q8_row_bytes(HD) / HD : kv_type == ST_TYPE_F16 ? 2 : 4;
  std::vector<void *> k(COPIES * G), v(COPIES * G);
  float *tmp = NULL;
  if (kv_type == ST_TYPE_Q8_0) CK(cudaMalloc(&tmp, sizeof(float) * kv_floats));
  for (int i = 0; i < COPIES * G; i++) {
    CK(cudaMalloc(&k[i], (size_t)(es * kv_floats)));
    CK(cudaMalloc(&v[i], (size_t)(es * kv_floats)));
    if (kv_type == ST_TYPE_Q8_0) { // the floats through the codelets' quantiser
      fill<<<1024, 256>>>(tmp, kv_floats, 2 * i + 1);
      kv_store_q8<<<1024, 256>>>(tmp, (uint8_t *)k[i], N_CTX, HD);
      fill<<<1024, 256>>>(tmp, kv_floats, 2 * i + 2);
      kv_store_q8<<<1024, 256>>>(tmp, (uint8_t *)v[i], N_CTX, HD);
      CK(cudaDeviceSynchronize());
      continue;
    }
    kv_dispatch(kv_type, [&](auto tag) {
      using KT = typename decltype(tag)::type;
      fill<<<1024, 256>>>((KT *)k[i], kv_floats, 2 * i + 1);
      fill<<<1024, 256>>>((KT *)v[i], kv_floats, 2 * i + 2);
    });
  }
  if (tmp) CK(cudaFree(tmp));
  float *q, *part, *out;
  int *counters, *pos;
  CK(cudaMalloc(&q, sizeof(float) * HQ * HD));
  fill<<<8, 256>>>(q, HQ * HD, 7777);
  printf("KV cache %s\n", kv_type == ST_TYPE_Q8_0 ? "q8_0" : kv_type == ST_TYPE_F16 ? "f16" : "f32");
  const size_t pf = st_cuda_decode_part_floats(N_CTX, HQ, HD);
  CK(cudaMalloc(&part, sizeof(float) * pf));
  CK(cudaMalloc(&out, sizeof(float) * HQ * HD));
  CK(cudaMalloc(&counters, sizeof(int) * HQ));
  CK(cudaMemset(counters, 0, sizeof(int) * HQ));
  CK(cudaMalloc(&pos, sizeof(int)));
  CK(cudaDeviceSynchronize());
  st_cuda_attention_allow_smem();
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  printf("variant: ATT_WARPS %d ATT_SPLIT %d ATT_MIN_CHUNK %d ATT_MAX_STAGES %d; %d launches x %d replays\n", ATT_WARPS,
         ATT_SPLIT, ATT_MIN_CHUNK, ATT_MAX_STAGES, LAUNCHES, replays);
  // MODE: 0 the decode step's kernel with programmatic dependent launches, 1 the same without, 2
  // the attention codelet's T = 1 kernels (attend_split, attend_split_combine) per KV group
  const char *mode_env = getenv("MODE");
  const int mode = mode_env ? atoi(mode_env) : 0;
  printf("mode %d (%s)\n", mode, mode == 0 ? "decode kernel, PDL" : mode == 1 ? "decode kernel, no PDL" : "split + combine per group");
  printf("%8s %8s %10s %8s %8s\n", "keys", "chunk", "us/launch", "MB", "GB/s");
  std::vector<int> depths = {32, 64, 128, 256, 512, 1024, 4096, 4097, 16384, 32768, 32769}; // 2^k + 1: just past a power of two
  if (getenv("DEPTH")) depths = {atoi(getenv("DEPTH"))}; // one depth (for Nsight Compute)
  for (int n_keys : depths) {
    const int p0 = n_keys - 1;
    // the engine's graphs launch the kernel of the position's regime; REGIME=any both of a pair
    const int regime = getenv("REGIME") && !strcmp(getenv("REGIME"), "any") ? ST_ATT_REGIME_ANY
                                                                             : st_cuda_attend_regime(HD, kv_type, p0, 0);
    CK(cudaMemcpy(pos, &p0, sizeof p0, cudaMemcpyHostToDevice));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < LAUNCHES; l++) {
      const int c = l % COPIES;
      if (mode < 2)
        st_cuda_attend_decode_all(q, HQ, G, HD, kv_type, &k[c * G], &v[c * G], pos, part, counters, out, 0, mode == 0, st,
                                  NULL, regime);
      else
        kv_dispatch_q8(kv_type, [&](auto tag) {
          using KT = typename decltype(tag)::type;
          for (int gr = 0; gr < G; gr++)
            attend<KT>(q + gr * (HQ / G) * HD, HD, (const KT *)k[c * G + gr], (const KT *)v[c * G + gr], 1, p0, HQ / G,
                       HD, part, out + gr * (HQ / G) * HD, HD, 0, st);
        });
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < replays; r++) CK(cudaGraphLaunch(ge, st)); // warm-up: clocks, TLB
    CK(cudaStreamSynchronize(st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, st));
    for (int r = 0; r < replays; r++) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double us = 1e3 * ms / replays / LAUNCHES, mb = 2.0 * G * n_keys * HD * es / 1e6;
    printf("%8d %8d %10.2f %8.2f %8.0f\n", n_keys, att_chunk_keys(n_keys), us, mb, mb / us * 1e3);
#ifdef ATT_PROBE
    { // one launch outside a graph: each block's clock at entry, after the wait, at its loop's end, its partial's end, the last block's count and merge's end
      static unsigned long long zero[ATT_SPLIT * 64][6], pr[ATT_SPLIT * 64][6];
      CK(cudaMemcpyToSymbol(att_probe, zero, sizeof zero));
      st_cuda_attend_decode_all(q, HQ, G, HD, kv_type, &k[0], &v[0], pos, part, counters, out, 0, 0, st, NULL, regime);
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpyFromSymbol(pr, att_probe, sizeof pr));
      const int nb = ATT_SPLIT * G;
      unsigned long long t0 = ~0ull;
      for (int b = 0; b < nb; b++) if (pr[b][0]) t0 = std::min(t0, pr[b][0]);
      std::vector<double> pt[6];
      for (int b = 0; b < nb; b++)
        for (int i = 0; i < 6; i++) if (pr[b][i]) pt[i].push_back((pr[b][i] - t0) * 1e-3);
      printf("  probe (us from the first block's entry; blocks: min/median/max):");
      const char *nm[6] = {"entry", "waited", "loop end", "partial", "counted", "merged"};
      for (int i = 0; i < 6; i++) {
        if (pt[i].empty()) continue;
        std::sort(pt[i].begin(), pt[i].end());
        printf(" %s %zu: %.2f/%.2f/%.2f;", nm[i], pt[i].size(), pt[i][0], pt[i][pt[i].size() / 2], pt[i].back());
      }
      printf("\n");
    }
#endif
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  // one launch at each depth of CHECK_KEYS (a comma list, default 4096,32769) on copy 0 against
  // float64 on the host, and an XXH64 hash of the output's bits (variants that should agree bit
  // for bit print the same)
  std::vector<int> checks;
  for (const char *c = getenv("CHECK_KEYS") ? getenv("CHECK_KEYS") : "4096,32769"; *c;) {
    checks.push_back(std::min(std::max(atoi(c), 1), N_CTX));
    while (*c && *c != ',') c++;
    if (*c) c++;
  }
  for (const int n_keys : checks) {
    const int p0 = n_keys - 1;
    CK(cudaMemcpy(pos, &p0, sizeof p0, cudaMemcpyHostToDevice));
    st_cuda_attend_decode_all(q, HQ, G, HD, kv_type, &k[0], &v[0], pos, part, counters, out, 0, 0, st);
    std::vector<float> ho(HQ * HD);
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(ho.data(), out, sizeof(float) * HQ * HD, cudaMemcpyDeviceToHost));
    double worst = 0;
    std::vector<double> s(n_keys);
    for (int h = 0; h < HQ; h++) {
      const int gr = h / (HQ / G);
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j < n_keys; j++) {
        double d = 0;
        for (int i = 0; i < HD; i++)
          d += (double)hash_unit(h * HD + i, 7777) * (kv_type == ST_TYPE_Q8_0 ? q8_value(j, i, 2 * gr + 1)
                                                      : kv_value(hash_unit((int64_t)j * HD + i, 2 * gr + 1), kv_type));
        s[j] = d / sqrt((double)HD);
        mx = fmax(mx, s[j]);
      }
      for (int j = 0; j < n_keys; j++) sum += s[j] = exp(s[j] - mx);
      for (int i = 0; i < HD; i++) {
        double a = 0;
        for (int j = 0; j < n_keys; j++)
          a += s[j] * (kv_type == ST_TYPE_Q8_0 ? q8_value(j, i, 2 * gr + 2) : kv_value(hash_unit((int64_t)j * HD + i, 2 * gr + 2), kv_type));
        worst = fmax(worst, fabs(a / sum - ho[h * HD + i]));
      }
    }
    printf("depth %d against float64: max |d| %.3g over %d values, bits %016llx\n", n_keys, worst, HQ * HD,
           (unsigned long long)XXH64(ho.data(), sizeof(float) * ho.size(), 0));
  }
  return 0;
}
