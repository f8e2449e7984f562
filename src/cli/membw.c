/* Memory bandwidths for the bench's roofline figure, measured in the same run: the host's read
 * bandwidth with N threads (each sums its share of a buffer much larger than the caches), and a
 * GPU's device-to-device copy bandwidth (bytes read plus bytes written per second). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common.h"
#include "config.h"
#ifdef ST_HAVE_CUDA
#include <cuda_runtime.h>
#endif

struct reader {
  const uint64_t *p;
  size_t n;
  uint64_t sum;
};

static void *read_part(void *arg) {
  struct reader *r = arg;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i + 4 <= r->n; i += 4) s0 += r->p[i], s1 += r->p[i + 1], s2 += r->p[i + 2], s3 += r->p[i + 3];
  r->sum = s0 + s1 + s2 + s3;
  return NULL;
}

double st_host_read_bandwidth(int threads, size_t bytes) {
  if (threads < 1) threads = 1;
  uint64_t *buf = malloc(bytes);
  struct reader *r = calloc((size_t)threads, sizeof *r);
  pthread_t *tid = calloc((size_t)threads, sizeof *tid);
  double best = 0.0;
  if (buf && r && tid) {
    memset(buf, 1, bytes);
    const size_t n = bytes / sizeof(uint64_t), per = n / (size_t)threads;
    for (int rep = 0; rep < 3; rep++) {
      const double t0 = st_now();
      for (int i = 0; i < threads; i++) {
        r[i] = (struct reader){buf + (size_t)i * per, per, 0};
        pthread_create(&tid[i], NULL, read_part, &r[i]);
      }
      for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
      const double bw = (double)(per * (size_t)threads * sizeof(uint64_t)) / (st_now() - t0);
      best = bw > best ? bw : best;
    }
  }
  free(buf);
  free(r);
  free(tid);
  return best;
}

double st_cuda_copy_bandwidth(size_t bytes) {
#ifdef ST_HAVE_CUDA
  void *a = NULL, *b = NULL;
  cudaEvent_t e0, e1;
  double best = 0.0;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    return 0.0;
  }
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemset(a, 1, bytes);
  for (int rep = 0; rep < 4; rep++) {
    float ms = 0.0f;
    cudaEventRecord(e0, 0);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    const double bw = ms > 0 ? 2.0 * (double)bytes / (ms * 1e-3) : 0.0;
    best = rep > 0 && bw > best ? bw : best; /* the first copy warms up */
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return best;
#else
  (void)bytes;
  return 0.0;
#endif
}
