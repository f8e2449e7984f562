/* Expert-row tasks: the SwiGLU FFN of a group of expert pairs of one layer over the tokens
 * routed to them, each output row scaled by its routing weight (see codelets.h). The CPU variant
 * is the CPU pool's kernel; the CUDA variant (cuda/expert_rows.cu) serves a GPU expert cache. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/codelets.h"
#include "codelets/dot.h"
#include "codelets/quant.h"
#include "config.h"
#ifdef ST_HAVE_CUDA
#include "codelets/cuda/cuda_codelets.h"
#endif

static void expert_rows_cpu(void *buffers[], void *cl_arg) {
  const struct st_expert_rows_args *a = cl_arg;
  const struct st_expert_group *groups = st_expert_groups(a);
  const struct st_expert_row *rows = st_expert_rows(a);
  const float *ffn_in = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
  float *dst = (float *)STARPU_VECTOR_GET_PTR(buffers[1 + 3 * a->n_experts]);
  const int d = a->n_embd, ff = a->ff1 - a->ff0;
  /* partial sums: the rows go to a scratch block first, then are summed in the listed order */
  float *out_all = a->n_out_rows > 0 ? malloc(sizeof(float) * (size_t)a->n_rows * d) : dst;
  int max_rows = 0;
  for (int g = 0; g < a->n_experts; g++) max_rows = groups[g].n_rows > max_rows ? groups[g].n_rows : max_rows;

  float *x = malloc(sizeof(float) * ((size_t)max_rows * d + 2 * (size_t)max_rows * ff));
  float *gt = x + (size_t)max_rows * d, *u = gt + (size_t)max_rows * ff;
  /* int8 activations (STRATA_INT8_DOT): a row for the largest of the three matrices' layouts */
  uint64_t qrow = 0;
  if (a->int8_dot) {
    const uint64_t qs[3] = {st_q8_row_bytes(a->gate.type, d), st_q8_row_bytes(a->up.type, d),
                            st_q8_row_bytes(a->down.type, ff)};
    for (int i = 0; i < 3; i++)
      qrow = qs[i] > qrow ? qs[i] : qrow;
  }
  void *xq = qrow ? malloc((size_t)max_rows * qrow) : NULL;
  for (int g = 0; g < a->n_experts; g++) {
    const void *gate = (const void *)STARPU_VECTOR_GET_PTR(buffers[1 + 3 * g]);
    const void *up = (const void *)STARPU_VECTOR_GET_PTR(buffers[2 + 3 * g]);
    const void *down = (const void *)STARPU_VECTOR_GET_PTR(buffers[3 + 3 * g]);
    const int R = groups[g].n_rows;
    const struct st_expert_row *gr = rows + groups[g].row0;
    float *out = out_all + (size_t)groups[g].row0 * d;
    for (int i = 0; i < R; i++)
      memcpy(x + (size_t)i * d, ffn_in + (size_t)gr[i].token * d, sizeof(float) * (size_t)d);
    /* STRATA_INT8_DOT: gate and up share one quantisation of x when their types share a layout */
    const uint64_t qg = a->int8_dot ? st_q8_row_bytes(a->gate.type, d) : 0;
    const uint64_t qu = a->int8_dot ? st_q8_row_bytes(a->up.type, d) : 0;
    if (qg) {
      st_quantize_act(a->gate.type, x, d, R, d, xq);
      st_matmul_q8(a->gate.type, gate, a->gate.row_bytes, a->ff0, a->ff1, xq, R, d, gt, ff);
    } else {
      st_matmul(a->gate.type, gate, a->gate.row_bytes, a->ff0, a->ff1, x, d, R, d, gt, ff);
    }
    if (qu) {
      if (qu != qg) st_quantize_act(a->up.type, x, d, R, d, xq);
      st_matmul_q8(a->up.type, up, a->up.row_bytes, a->ff0, a->ff1, xq, R, d, u, ff);
    } else {
      st_matmul(a->up.type, up, a->up.row_bytes, a->ff0, a->ff1, x, d, R, d, u, ff);
    }
    for (size_t i = 0; i < (size_t)R * ff; i++) gt[i] = gt[i] / (1.0f + expf(-gt[i])) * u[i];
    /* columns [ff0, ff1) of down's rows: ff0 is a multiple of the block size */
    const uint8_t *down_cols = (const uint8_t *)down + st_row_bytes(a->down.type, (uint64_t)a->ff0);
    if (a->int8_dot && st_q8_row_bytes(a->down.type, ff)) {
      st_quantize_act(a->down.type, gt, ff, R, ff, xq);
      st_matmul_q8(a->down.type, down_cols, a->down.row_bytes, 0, d, xq, R, ff, out, d);
    } else {
      st_matmul(a->down.type, down_cols, a->down.row_bytes, 0, d, gt, ff, R, ff, out, d);
    }
    for (int i = 0; i < R; i++)
      for (int j = 0; j < d; j++) out[(size_t)i * d + j] *= gr[i].weight;
  }
  free(x);
  free(xq);
  if (a->n_out_rows > 0) {
    const int32_t *off = st_expert_reduce(a), *idx = off + a->n_out_rows + 1;
    for (int o = 0; o < a->n_out_rows; o++) {
      float *y = dst + (size_t)o * d;
      memset(y, 0, sizeof(float) * (size_t)d);
      for (int r = off[o]; r < off[o + 1]; r++)
        for (int j = 0; j < d; j++) y[j] += out_all[(size_t)idx[r] * d + j];
    }
    free(out_all);
  }
}

static struct starpu_perfmodel expert_rows_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "st_expert_rows",
};

static struct starpu_codelet expert_rows_cl = {
    .cpu_funcs = {expert_rows_cpu},
    .cpu_funcs_name = {"expert_rows_cpu"},
#ifdef ST_HAVE_CUDA
    .cuda_funcs = {st_expert_rows_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &expert_rows_model,
    .name = "expert_rows",
};

int st_submit_expert_rows(const struct st_expert_rows_args *a, starpu_data_handle_t *bufs,
                          struct st_target tgt, const char *name) {
  const int nbufs = 2 + 3 * a->n_experts;
  enum starpu_data_access_mode modes[nbufs];
  for (int i = 0; i < nbufs; i++) modes[i] = STARPU_R;
  modes[nbufs - 1] = STARPU_W;
  return st_submit_task(&expert_rows_cl, bufs, modes, nbufs, a,
                        st_expert_rows_args_size(a->n_experts, a->n_rows, a->n_out_rows), tgt, name);
}
