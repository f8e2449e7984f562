// CUDA Graphs for the dense codelets on the decode path (issue #9). A dense task launches
// several small kernels; capturing them into a graph and replaying it costs one launch and lets
// the GPU run the kernels back to back. StarPU registers each batch's activations anew, so the
// device pointers and scalars (pos0) change from step to step: every call captures its kernels
// again, updates the executable graph cached for its task site (cudaGraphExecUpdate keeps the
// topology and only rewrites parameters) and launches it. The cache is the one piece of global
// state: per CUDA device, an array indexed by graph key, grown on first use of a key; each
// StarPU CUDA worker is its own thread, and the lock of its device guards that device's array.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"

namespace {

struct graph_slot {
  cudaGraphExec_t exec;
  uint64_t sig; // st_cuda_graph_replay: what the captured kernels' arguments were made of
  void *scratch; // per-key device scratch: a stream-ordered allocation inside a capture would
  size_t scratch_bytes; // add memory nodes to the graph, which an update cannot rewrite
};

struct device_cache {
  pthread_mutex_t lock;
  graph_slot *slot;
  int n_slot;
};

struct graph_cache {
  pthread_once_t once;
  device_cache *dev;
  int n_dev;
  unsigned long long captures, updates, instantiations, reinstantiations, launches, fallbacks;
  unsigned long long dense_calls, dense_host_ns;
  int reported;
};

graph_cache cache = {PTHREAD_ONCE_INIT, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};

void count(unsigned long long *c, unsigned long long n = 1) { __atomic_fetch_add(c, n, __ATOMIC_RELAXED); }

void init_cache() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
    cudaGetLastError();
    n = 0;
  }
  cache.dev = n > 0 ? (device_cache *)calloc((size_t)n, sizeof(device_cache)) : NULL;
  cache.n_dev = cache.dev ? n : 0;
  for (int d = 0; d < cache.n_dev; d++) pthread_mutex_init(&cache.dev[d].lock, NULL);
}

// Reports the first CUDA error of the graph path on stderr (the call then runs without a graph)
// and clears it, so that the codelet's own cudaGetLastError checks do not see it.
void fall_back(const char *what, int key, cudaError_t err) {
  cudaGetLastError();
  count(&cache.fallbacks);
  if (!__atomic_exchange_n(&cache.reported, 1, __ATOMIC_RELAXED))
    fprintf(stderr, "strata: CUDA graphs: %s failed for graph key %d (%s); that call and any later failing "
                    "one run with plain launches\n", what, key, cudaGetErrorString(err));
}

// The slot of `key` on the current device, with its device's lock held; NULL (unlocked) when
// there is no such device or no memory.
graph_slot *lock_slot(int key, device_cache **dc) {
  pthread_once(&cache.once, init_cache);
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  if (d < 0 || d >= cache.n_dev || key <= 0) return NULL;
  *dc = &cache.dev[d];
  pthread_mutex_lock(&(*dc)->lock);
  if (key >= (*dc)->n_slot) {
    const int n = key + 1 > 2 * (*dc)->n_slot ? key + 1 : 2 * (*dc)->n_slot;
    graph_slot *s = (graph_slot *)realloc((*dc)->slot, sizeof(graph_slot) * (size_t)n);
    if (!s) {
      pthread_mutex_unlock(&(*dc)->lock);
      return NULL;
    }
    for (int i = (*dc)->n_slot; i < n; i++) s[i] = graph_slot{NULL, 0, NULL, 0};
    (*dc)->slot = s;
    (*dc)->n_slot = n;
  }
  return &(*dc)->slot[key];
}

double now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

} // namespace

extern "C" int st_cuda_graph_begin(cudaStream_t stream, int key) {
  const cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    fall_back("cudaStreamBeginCapture", key, err);
    return -1;
  }
  return 0;
}

extern "C" int st_cuda_graph_end(cudaStream_t stream, int key) {
  cudaGraph_t graph = NULL;
  cudaError_t err = cudaStreamEndCapture(stream, &graph);
  if (err != cudaSuccess || !graph) {
    if (graph) cudaGraphDestroy(graph);
    fall_back("cudaStreamEndCapture", key, err != cudaSuccess ? err : cudaErrorStreamCaptureInvalidated);
    return -1;
  }
  count(&cache.captures);
  device_cache *dc = NULL;
  graph_slot *s = lock_slot(key, &dc);
  if (!s) {
    cudaGraphDestroy(graph);
    fall_back("the graph cache", key, cudaErrorMemoryAllocation);
    return -1;
  }
  const char *what = "cudaGraphInstantiate";
  if (s->exec) {
    cudaGraphExecUpdateResultInfo info;
    if (cudaGraphExecUpdate(s->exec, graph, &info) == cudaSuccess) {
      count(&cache.updates);
    } else { // the kernels or their order changed: a new executable graph
      cudaGetLastError();
      cudaGraphExecDestroy(s->exec); // a launch in flight completes first
      s->exec = NULL;
      count(&cache.reinstantiations);
    }
  } else {
    count(&cache.instantiations);
  }
  err = cudaSuccess;
  if (!s->exec) err = cudaGraphInstantiate(&s->exec, graph, 0);
  if (err == cudaSuccess) {
    what = "cudaGraphLaunch";
    err = cudaGraphLaunch(s->exec, stream);
  }
  if (err != cudaSuccess && s->exec) { // keep nothing that failed
    cudaGraphExecDestroy(s->exec);
    s->exec = NULL;
  }
  pthread_mutex_unlock(&dc->lock);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) {
    fall_back(what, key, err);
    return -1;
  }
  count(&cache.launches);
  return 0;
}

extern "C" void *st_cuda_graph_scratch(cudaStream_t stream, int key, size_t bytes) {
  device_cache *dc = NULL;
  graph_slot *s = lock_slot(key, &dc);
  if (!s) return NULL;
  if (bytes > s->scratch_bytes || !s->scratch) {
    // Stream-ordered, so the graphs already queued with the old block finish before it is reused.
    const size_t want = bytes > 2 * s->scratch_bytes ? bytes : 2 * s->scratch_bytes;
    void *p = NULL;
    if (s->scratch) cudaFreeAsync(s->scratch, stream);
    s->scratch = NULL;
    s->scratch_bytes = 0;
    const cudaError_t err = cudaMallocAsync(&p, want ? want : 1, stream);
    if (err != cudaSuccess) {
      pthread_mutex_unlock(&dc->lock);
      fall_back("cudaMallocAsync (graph scratch)", key, err);
      return NULL;
    }
    s->scratch = p;
    s->scratch_bytes = want;
  }
  void *p = s->scratch;
  pthread_mutex_unlock(&dc->lock);
  return p;
}

extern "C" void st_cuda_dense_run(void *buffers[], const void *args, int key, size_t scratch_bytes, int decode,
                                  st_cuda_dense_body body) {
  const double t0 = decode ? now_ns() : 0.0;
  cudaStream_t st = starpu_cuda_get_local_stream();
  int done = 0;
  if (key > 0) {
    void *scratch = scratch_bytes ? st_cuda_graph_scratch(st, key, scratch_bytes) : NULL;
    if ((scratch || !scratch_bytes) && !st_cuda_graph_begin(st, key)) {
      body(buffers, args, scratch, st);
      done = !st_cuda_graph_end(st, key);
    }
  }
  if (!done) {
    void *scratch = scratch_bytes ? st_cuda_alloc(scratch_bytes, st) : NULL;
    body(buffers, args, scratch, st);
    if (scratch) st_cuda_free(scratch, st);
  }
  if (decode) {
    count(&cache.dense_calls);
    count(&cache.dense_host_ns, (unsigned long long)(now_ns() - t0));
  }
}

extern "C" void st_cuda_decode_host_time(double t0_ns) {
  count(&cache.dense_calls);
  count(&cache.dense_host_ns, (unsigned long long)(now_ns() - t0_ns));
}

extern "C" double st_cuda_now_ns(void) { return now_ns(); }

extern "C" int st_cuda_graph_replay(cudaStream_t stream, int key, uint64_t sig, void (*body)(const void *, cudaStream_t),
                                    const void *args) {
  device_cache *dc = NULL;
  graph_slot *s = lock_slot(key, &dc);
  if (s && s->exec && s->sig == sig) {
    const cudaError_t err = cudaGraphLaunch(s->exec, stream);
    pthread_mutex_unlock(&dc->lock);
    if (err == cudaSuccess) {
      count(&cache.launches);
      return 0;
    }
    fall_back("cudaGraphLaunch", key, err);
    body(args, stream);
    return -1;
  }
  if (s) pthread_mutex_unlock(&dc->lock);
  if (!s || st_cuda_graph_begin(stream, key)) {
    body(args, stream);
    return -1;
  }
  body(args, stream);
  if (st_cuda_graph_end(stream, key)) { // nothing of the capture ran
    body(args, stream);
    return -1;
  }
  s = lock_slot(key, &dc);
  if (s) {
    s->sig = sig;
    pthread_mutex_unlock(&dc->lock);
  }
  return 0;
}

extern "C" void st_cuda_graph_release(void *unused) {
  (void)unused;
  pthread_once(&cache.once, init_cache);
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= cache.n_dev) {
    cudaGetLastError();
    return;
  }
  device_cache *dc = &cache.dev[d];
  cudaStream_t st = starpu_cuda_get_local_stream();
  pthread_mutex_lock(&dc->lock);
  for (int i = 0; i < dc->n_slot; i++) {
    if (dc->slot[i].exec) cudaGraphExecDestroy(dc->slot[i].exec);
    if (dc->slot[i].scratch) cudaFreeAsync(dc->slot[i].scratch, st);
  }
  free(dc->slot);
  dc->slot = NULL;
  dc->n_slot = 0;
  pthread_mutex_unlock(&dc->lock);
  cudaStreamSynchronize(st);
  cudaGetLastError();
}

extern "C" void st_cuda_graph_stats(struct st_cuda_graph_stats *out) {
  const struct st_cuda_graph_stats zero = {};
  *out = zero;
  out->captures = __atomic_load_n(&cache.captures, __ATOMIC_RELAXED);
  out->updates = __atomic_load_n(&cache.updates, __ATOMIC_RELAXED);
  out->instantiations = __atomic_load_n(&cache.instantiations, __ATOMIC_RELAXED);
  out->reinstantiations = __atomic_load_n(&cache.reinstantiations, __ATOMIC_RELAXED);
  out->launches = __atomic_load_n(&cache.launches, __ATOMIC_RELAXED);
  out->fallbacks = __atomic_load_n(&cache.fallbacks, __ATOMIC_RELAXED);
  out->dense_calls = __atomic_load_n(&cache.dense_calls, __ATOMIC_RELAXED);
  out->dense_host_s = (double)__atomic_load_n(&cache.dense_host_ns, __ATOMIC_RELAXED) * 1e-9;
}
