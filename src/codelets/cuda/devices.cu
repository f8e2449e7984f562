// Device queries the tiers need before StarPU starts: how many CUDA devices are visible, and
// whether two of them really exchange data over P2P (the seeds' peer tier: a bridge can report
// peer access, enable it, and then copy nothing, so a test copy each way decides).
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"

int st_cuda_compute_capability() {
  static int cc[64]; // per device: 0 not asked yet, else major * 10 + minor, or -1 when unknown
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return cudaGetLastError(), 0;
  if (!__atomic_load_n(&cc[dev], __ATOMIC_RELAXED)) {
    int major = 0, minor = 0;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
    if (!ok) cudaGetLastError();
    __atomic_store_n(&cc[dev], ok ? major * 10 + minor : -1, __ATOMIC_RELAXED);
  }
  const int v = __atomic_load_n(&cc[dev], __ATOMIC_RELAXED);
  return v > 0 ? v : 0;
}

extern "C" int st_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// Copies a 1 MiB pattern from `src` to `dst` with peer access enabled; 1 when it arrives intact.
static int copy_checks(int src, int dst, char *why, size_t len) {
  const size_t n = 1 << 18;
  unsigned *host = (unsigned *)malloc(n * sizeof(unsigned)), *back = (unsigned *)malloc(n * sizeof(unsigned));
  void *a = NULL, *b = NULL;
  int ok = 0;
  cudaError_t err = cudaSuccess;
  if (!host || !back) {
    snprintf(why, len, "out of host memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) host[i] = (unsigned)(i * 2654435761u) ^ (unsigned)(src * 31 + dst);
  memset(back, 0, n * sizeof(unsigned));
  if ((err = cudaSetDevice(src)) || (err = cudaMalloc(&a, n * 4)) || (err = cudaMemcpy(a, host, n * 4, cudaMemcpyHostToDevice)))
    goto out;
  if ((err = cudaSetDevice(dst)) || (err = cudaMalloc(&b, n * 4)) || (err = cudaMemset(b, 0, n * 4))) goto out;
  if ((err = cudaMemcpyPeer(b, dst, a, src, n * 4)) || (err = cudaDeviceSynchronize()) ||
      (err = cudaMemcpy(back, b, n * 4, cudaMemcpyDeviceToHost)))
    goto out;
  ok = memcmp(host, back, n * 4) == 0;
  if (!ok) snprintf(why, len, "a test copy CUDA%d -> CUDA%d arrived wrong", src, dst);
out:
  if (err != cudaSuccess) snprintf(why, len, "CUDA%d -> CUDA%d: %s", src, dst, cudaGetErrorString(err));
  (void)cudaGetLastError();
  if (a) cudaSetDevice(src), cudaFree(a);
  if (b) cudaSetDevice(dst), cudaFree(b);
  free(host);
  free(back);
  return ok;
}

extern "C" int st_cuda_p2p_check(int a, int b, char *why, size_t len) {
  snprintf(why, len, "ok");
  int can_ab = 0, can_ba = 0;
  if (cudaDeviceCanAccessPeer(&can_ab, a, b) != cudaSuccess || cudaDeviceCanAccessPeer(&can_ba, b, a) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(why, len, "cudaDeviceCanAccessPeer failed for CUDA%d and CUDA%d", a, b);
    return 0;
  }
  if (!can_ab || !can_ba) {
    snprintf(why, len, "CUDA%d and CUDA%d report no peer access", a, b);
    return 0;
  }
  // enable both ways for the test, as StarPU will, then leave the contexts as they were
  cudaSetDevice(a);
  const int en_a = cudaDeviceEnablePeerAccess(b, 0) == cudaSuccess;
  cudaSetDevice(b);
  const int en_b = cudaDeviceEnablePeerAccess(a, 0) == cudaSuccess;
  (void)cudaGetLastError();
  const int ok = copy_checks(a, b, why, len) && copy_checks(b, a, why, len);
  if (en_a) cudaSetDevice(a), cudaDeviceDisablePeerAccess(b);
  if (en_b) cudaSetDevice(b), cudaDeviceDisablePeerAccess(a);
  (void)cudaGetLastError();
  cudaSetDevice(0);
  return ok;
}

// The host expert arena's registration (tiers/arena.c): portable, so every device's copies of a
// pinned layer use DMA, not the driver's staging buffer.
extern "C" int st_cuda_host_register(void *p, size_t n, char *why, size_t len) {
  const cudaError_t err = cudaHostRegister(p, n, cudaHostRegisterPortable);
  if (err == cudaSuccess) return 1;
  snprintf(why, len, "%s", cudaGetErrorString(err));
  (void)cudaGetLastError();
  return 0;
}

extern "C" void st_cuda_host_unregister(void *p) {
  if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

extern "C" void *st_cuda_host_alloc_mapped(size_t n, int device, uintptr_t *dev_addr, char *why, size_t len) {
  int prev = 0;
  void *p = NULL, *dp = NULL;
  cudaError_t err = cudaGetDevice(&prev);
  if (err == cudaSuccess) err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaHostAlloc(&p, n, cudaHostAllocPortable | cudaHostAllocMapped);
  if (err == cudaSuccess) err = cudaHostGetDevicePointer(&dp, p, 0);
  if (err != cudaSuccess) {
    snprintf(why, len, "%s", cudaGetErrorString(err));
    (void)cudaGetLastError();
    if (p) cudaFreeHost(p);
    p = NULL;
  } else {
    *dev_addr = (uintptr_t)dp;
  }
  cudaSetDevice(prev);
  return p;
}

extern "C" void st_cuda_host_free_mapped(void *p) {
  if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

extern "C" double st_cuda_device_used_mib(int device) {
  int prev = 0;
  size_t free_b = 0, total_b = 0;
  if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device) != cudaSuccess ||
      cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1.0;
  }
  cudaSetDevice(prev);
  return (double)(total_b - free_b) / 1048576.0;
}
