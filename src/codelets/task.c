/* Task creation shared by the codelet wrappers: dynamic handle arrays (a layer's combine takes
 * one buffer per expert task), a copied argument block and an optional fixed worker. */
#include <stdlib.h>
#include <string.h>

#include "codelets/codelets.h"
#include "common.h"

int st_submit_task(struct starpu_codelet *cl, starpu_data_handle_t *bufs,
                   const enum starpu_data_access_mode *modes, int nbufs, const void *args,
                   size_t args_size, struct st_target tgt, const char *name) {
  struct starpu_task *task = starpu_task_create();
  task->cl = cl;
  task->name = name;
  task->nbuffers = nbufs;
  task->dyn_handles = nbufs ? malloc(sizeof(starpu_data_handle_t) * (size_t)nbufs) : NULL;
  task->dyn_modes = nbufs ? malloc(sizeof(enum starpu_data_access_mode) * (size_t)nbufs) : NULL;
  task->cl_arg = malloc(args_size);
  if ((nbufs && (!task->dyn_handles || !task->dyn_modes)) || !task->cl_arg) {
    free(task->dyn_handles);
    free(task->dyn_modes);
    free(task->cl_arg);
    task->dyn_handles = NULL;
    task->dyn_modes = NULL;
    task->cl_arg = NULL;
    starpu_task_destroy(task);
    return st_set_error(ST_ENOMEM, "out of memory submitting %s", name);
  }
  if (nbufs) {
    memcpy(task->dyn_handles, bufs, sizeof(starpu_data_handle_t) * (size_t)nbufs);
    memcpy(task->dyn_modes, modes, sizeof(enum starpu_data_access_mode) * (size_t)nbufs);
  }
  memcpy(task->cl_arg, args, args_size);
  task->cl_arg_size = args_size;
  task->cl_arg_free = 1;
  if (tgt.done) {
    struct st_task_done *d = malloc(sizeof *d);
    if (d) {
      *d = (struct st_task_done){tgt.done_arg, 0};
      for (int i = 0; i < nbufs; i++) d->bytes += starpu_data_get_size(bufs[i]);
      task->callback_func = tgt.done;
      task->callback_arg = d;
      task->callback_arg_free = 1;
    }
  }
  if (tgt.worker >= 0) {
    task->execute_on_a_specific_worker = 1;
    task->workerid = (unsigned)tgt.worker;
    task->workerorder = tgt.order;
  } else {
    task->where = tgt.where;
  }
  int rc = starpu_task_submit(task);
  if (rc) return st_set_error(ST_ERUNTIME, "starpu_task_submit(%s) failed: %d", name, rc);
  return 0;
}
