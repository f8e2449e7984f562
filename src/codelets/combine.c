/* The combine task: each token's expert outputs (already scaled by their routing weights) are
 * added in top-k slot order, then the residual. A fixed order, never a reduction or atomics, so
 * the result does not depend on which worker or tier computed each expert (the exactness gate). */
#include <string.h>

#include "config.h"

#include "codelets/codelets.h"
#ifdef ST_HAVE_CUDA
#include "codelets/cuda/cuda_codelets.h"
#endif

static void combine_cpu(void *buffers[], void *cl_arg) {
  const struct st_combine_args *a = cl_arg;
  const int d = a->n_embd;
  const float *h = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
  float *x = (float *)STARPU_VECTOR_GET_PTR(buffers[1 + a->n_out]);
  for (int t = 0; t < a->T; t++) {
    float *xt = x + (size_t)t * d;
    memset(xt, 0, sizeof(float) * (size_t)d);
    for (int j = 0; j < a->k; j++) {
      const struct st_combine_src s = a->src[t * a->k + j];
      for (int p = 0; p < s.parts; p++) {
        const float *y = (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + s.buf + p]) + (size_t)s.row * d;
        for (int i = 0; i < d; i++) xt[i] += y[i];
      }
    }
    for (int i = 0; i < d; i++) xt[i] += h[(size_t)t * d + i];
  }
}

static struct starpu_perfmodel combine_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "st_combine",
};

static struct starpu_codelet combine_cl = {
    .cpu_funcs = {combine_cpu},
    .cpu_funcs_name = {"combine_cpu"},
#ifdef ST_HAVE_CUDA
    .cuda_funcs = {st_combine_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &combine_model,
    .name = "combine",
};

int st_submit_combine(const struct st_combine_args *a, starpu_data_handle_t *bufs, int nbufs,
                      struct st_target tgt, const char *name) {
  enum starpu_data_access_mode modes[nbufs];
  for (int i = 0; i < nbufs; i++) modes[i] = STARPU_R;
  modes[nbufs - 1] = STARPU_W;
  return st_submit_task(&combine_cl, bufs, modes, nbufs, a,
                        sizeof *a + sizeof a->src[0] * (size_t)a->T * a->k, tgt, name);
}
