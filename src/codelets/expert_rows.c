/* Expert-row tasks: the SwiGLU FFN of one expert pair over the tokens routed to it, each output
 * row scaled by its routing weight (see codelets.h). The CPU variant is the CPU pool's kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/codelets.h"
#include "codelets/dot.h"

static void expert_rows_cpu(void *buffers[], void *cl_arg) {
  const struct st_expert_rows_args *a = cl_arg;
  const float *ffn_in = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
  const void *gate = (const void *)STARPU_VECTOR_GET_PTR(buffers[1]);
  const void *up = (const void *)STARPU_VECTOR_GET_PTR(buffers[2]);
  const void *down = (const void *)STARPU_VECTOR_GET_PTR(buffers[3]);
  float *out = (float *)STARPU_VECTOR_GET_PTR(buffers[4]);
  const int R = a->n_rows, d = a->n_embd, ff = a->n_ff;

  float *x = malloc(sizeof(float) * ((size_t)R * d + 2 * (size_t)R * ff));
  float *g = x + (size_t)R * d, *u = g + (size_t)R * ff;
  for (int i = 0; i < R; i++)
    memcpy(x + (size_t)i * d, ffn_in + (size_t)a->rows[i].token * d, sizeof(float) * (size_t)d);
  st_matmul(a->gate.type, gate, a->gate.row_bytes, 0, ff, x, d, R, d, g, ff);
  st_matmul(a->up.type, up, a->up.row_bytes, 0, ff, x, d, R, d, u, ff);
  for (size_t i = 0; i < (size_t)R * ff; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
  st_matmul(a->down.type, down, a->down.row_bytes, 0, d, g, ff, R, ff, out, d);
  for (int i = 0; i < R; i++)
    for (int j = 0; j < d; j++) out[(size_t)i * d + j] *= a->rows[i].weight;
  free(x);
}

static struct starpu_perfmodel expert_rows_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "st_expert_rows",
};

static struct starpu_codelet expert_rows_cl = {
    .cpu_funcs = {expert_rows_cpu},
    .cpu_funcs_name = {"expert_rows_cpu"},
    .nbuffers = 5,
    .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W},
    .model = &expert_rows_model,
    .name = "expert_rows",
};

int st_submit_expert_rows(const struct st_expert_rows_args *a, starpu_data_handle_t bufs[5],
                          int worker, const char *name) {
  return st_submit_task(&expert_rows_cl, bufs, expert_rows_cl.modes, 5, a,
                        sizeof *a + sizeof a->rows[0] * (size_t)a->n_rows, worker, name);
}
