// CK(call) for the GPU benchmarks (bench/*.cu): a failed CUDA runtime call prints its file, line and
// error and exits 1 (a benchmark has nothing to clean up).
#pragma once
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CK(call)                                                                                          \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    if (e_ != cudaSuccess) {                                                                              \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                         \
      exit(1);                                                                                            \
    }                                                                                                     \
  } while (0)
