/* A row slice of a matrix-vector or matrix-matrix product over concatenated inputs: the
 * attention output projection and the output head (see codelets.h). */
#include <stdlib.h>
#include <string.h>

#include "codelets/codelets.h"
#include "config.h"
#ifdef ST_HAVE_CUDA
#include "codelets/cuda/cuda_codelets.h"
#endif
#include "codelets/dot.h"

static void linear_cpu(void *buffers[], void *cl_arg) {
  const struct st_linear_args *a = cl_arg;
  const void *w = (const void *)STARPU_VECTOR_GET_PTR(buffers[0]);
  const float *norm = a->has_norm ? (const float *)STARPU_VECTOR_GET_PTR(buffers[1]) : NULL;
  const int first_in = 1 + (a->has_norm ? 1 : 0);
  float *out = (float *)STARPU_VECTOR_GET_PTR(buffers[first_in + a->n_in]);
  const int64_t n = a->w.n, piece = n / a->n_in;

  float *x = malloc(sizeof(float) * (size_t)(a->T * n));
  for (int i = 0; i < a->n_in; i++) {
    const float *in = (const float *)STARPU_VECTOR_GET_PTR(buffers[first_in + i]);
    for (int32_t t = 0; t < a->T; t++)
      memcpy(x + t * n + i * piece, in + (a->in_row0 + t) * piece, sizeof(float) * (size_t)piece);
  }
  if (norm)
    for (int32_t t = 0; t < a->T; t++) st_rmsnorm(x + t * n, norm, x + t * n, n, a->eps);
  void *xq = NULL;
  st_dense_matmul(a->w.type, w, a->w.row_bytes, a->r0, a->r1, x, n, a->T, n, out, a->r1 - a->r0,
                  st_dense_terms(a->w.type, n, a->int8_dot, a->dense_kind), &xq);
  free(xq);
  free(x);
}

static struct starpu_perfmodel linear_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "st_linear",
};

static struct starpu_codelet linear_cl = {
    .cpu_funcs = {linear_cpu},
    .cpu_funcs_name = {"linear_cpu"},
#ifdef ST_HAVE_CUDA
    .cuda_funcs = {st_linear_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &linear_model,
    .name = "linear",
};

int st_submit_linear(const struct st_linear_args *a, starpu_data_handle_t *bufs, int nbufs,
                     struct st_target tgt, const char *name) {
  enum starpu_data_access_mode modes[nbufs];
  for (int i = 0; i < nbufs; i++) modes[i] = STARPU_R;
  modes[nbufs - 1] = STARPU_W;
  return st_submit_task(&linear_cl, bufs, modes, nbufs, a, sizeof *a, tgt, name);
}
