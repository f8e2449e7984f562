/* The run recorder behind --trace (see recorder.h). Tasks are told apart by their names, which
 * carry kind, layer, expert and tier ("expert_rows L12 E87 CPU", "attention L3 G1", ...). */
#include "graph/recorder.h"

#include <errno.h>
#include <glob.h>
#include <pthread.h>
#include <starpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "codelets/codelets.h"
#include "common.h"
#include "io/trace.h"

struct rec_task {
  const char *name; /* the engine's task-name arena: lives as long as the engine */
  int worker;
  double start_us, end_us;
  uint64_t bytes;
};

struct rec_step {
  int is_decode;
  double start_us, end_us;
};

struct st_recorder {
  char *dir;
  double t0_us;
  pthread_mutex_t lock;
  struct rec_task *tasks;
  size_t n_tasks, cap_tasks;
  struct rec_step *steps;
  size_t n_steps, cap_steps;
};

int st_recorder_check_dir(const char *dir) {
  if (st_mkdir_p(dir, 0755))
    return errno == ENOTDIR ? st_set_error(ST_EIO, "--trace %s: not a directory", dir)
                            : st_set_error(ST_EIO, "--trace %s: cannot create the directory: %s", dir, strerror(errno));
  if (access(dir, W_OK)) return st_set_error(ST_EIO, "--trace %s: cannot write there: %s", dir, strerror(errno));
  return 0;
}

void st_recorder_clear_dir(const char *dir) {
  /* what strata trace made of an earlier recording goes with it: its files in DIR, and what
   * starpu_fxt_tool wrote in DIR/fxt (io/trace.h) */
  static const char *const old[] = {"events.tsv", "timeline.svg", "trace.json", "summary.txt", "paje.trace"};
  char path[4200];
  for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, old[i]);
    unlink(path);
  }
  st_trace_remove_fxt_outputs(dir);
  snprintf(path, sizeof path, "%s/prof_file_*", dir);
  glob_t g;
  if (!glob(path, 0, NULL, &g))
    for (size_t i = 0; i < g.gl_pathc; i++) unlink(g.gl_pathv[i]);
  globfree(&g);
}

int st_recorder_open(const char *dir, struct st_recorder **out) {
  *out = NULL;
  int rc = st_recorder_check_dir(dir);
  if (rc) return rc;
  struct st_recorder *r = calloc(1, sizeof *r);
  if (!r || !(r->dir = strdup(dir))) {
    free(r);
    return st_set_error(ST_ENOMEM, "out of memory");
  }
  pthread_mutex_init(&r->lock, NULL);
  r->t0_us = starpu_timing_now();
  *out = r;
  return 0;
}

void st_recorder_task_done(void *arg) {
  const struct st_task_done *done = arg;
  struct st_recorder *r = done->arg;
  struct starpu_task *task = starpu_task_get_current();
  const struct starpu_profiling_task_info *info = task ? task->profiling_info : NULL;
  if (!info) return;
  struct rec_task t = {task->name, info->workerid, starpu_timing_timespec_to_us((struct timespec *)&info->start_time) - r->t0_us,
                       starpu_timing_timespec_to_us((struct timespec *)&info->end_time) - r->t0_us, done->bytes};
  pthread_mutex_lock(&r->lock);
  if (r->n_tasks == r->cap_tasks) {
    size_t cap = r->cap_tasks ? 2 * r->cap_tasks : 4096;
    struct rec_task *n = realloc(r->tasks, sizeof *n * cap);
    if (n) r->tasks = n, r->cap_tasks = cap;
  }
  if (r->n_tasks < r->cap_tasks) r->tasks[r->n_tasks++] = t;
  pthread_mutex_unlock(&r->lock);
}

void st_recorder_step(struct st_recorder *r, int is_decode, double start_us, double end_us) {
  if (r->n_steps == r->cap_steps) {
    size_t cap = r->cap_steps ? 2 * r->cap_steps : 256;
    struct rec_step *n = realloc(r->steps, sizeof *n * cap);
    if (!n) return;
    r->steps = n, r->cap_steps = cap;
  }
  r->steps[r->n_steps++] = (struct rec_step){is_decode, start_us - r->t0_us, end_us - r->t0_us};
}

/* kind, layer, expert and tier from a task name. */
static void describe(const char *name, char *kind, size_t kind_cap, int *layer, int *expert, const char **tier) {
  unsigned l = 0, x = 0;
  char k[32] = "", rest[32] = "";
  *layer = -1;
  *expert = -1;
  *tier = "-";
  sscanf(name, "%31s", k);
  snprintf(kind, kind_cap, "%s", k);
  if (sscanf(name, "%*s L%u", &l) == 1) *layer = (int)l;
  if (!strcmp(k, "expert_rows")) {
    if (sscanf(name, "%*s L%*u E%u %31s", &x, rest) == 2) {
      *expert = (int)x;
      *tier = strstr(name, " CPU") ? "CPU" : strstr(name, " CUDA0") ? "CUDA0" : "-"; /* CUDA0: --prompt-stream */
    } else if (strstr(name, " CUDA0")) {
      *tier = "CUDA0";
    } else if (strstr(name, " CPU")) { /* the decode step's CPU-pool lanes, "expert_rows L12 CPU lane 3" */
      *tier = "CPU";
    }
  }
}

int st_recorder_close(struct st_recorder *r, const char *model_path) {
  if (!r) return 0;
  char path[4200];
  snprintf(path, sizeof path, "%s/events.tsv", r->dir);
  FILE *f = fopen(path, "w");
  int rc = f ? 0 : st_set_error(ST_EIO, "%s: cannot create", path);
  if (f) {
    /* the path as one field: a tab, newline or carriage return in it written as a space (as the
     * worker names below) */
    fputs("# strata trace v1\nmodel\t", f);
    for (const char *c = model_path ? model_path : "-"; *c; c++) fputc(*c == '\t' || *c == '\n' || *c == '\r' ? ' ' : *c, f);
    fputc('\n', f);
    for (unsigned w = 0; w < starpu_worker_get_count(); w++) {
      char name[128];
      starpu_worker_get_name((int)w, name, sizeof name);
      for (char *c = name; *c; c++)
        if (*c == '\t' || *c == '\n') *c = ' ';
      fprintf(f, "worker\t%u\t%s\t%s\n", w, starpu_worker_get_type((int)w) == STARPU_CUDA_WORKER ? "CUDA" : "CPU", name);
    }
    int idx[2] = {0, 0};
    for (size_t i = 0; i < r->n_steps; i++) {
      const struct rec_step *s = &r->steps[i];
      fprintf(f, "step\t%s\t%d\t%.1f\t%.1f\n", s->is_decode ? "decode" : "prompt", idx[s->is_decode]++, s->start_us,
              s->end_us > s->start_us ? s->end_us : s->start_us);
    }
    for (size_t i = 0; i < r->n_tasks; i++) {
      const struct rec_task *t = &r->tasks[i];
      char kind[32];
      int layer, expert;
      const char *tier;
      describe(t->name ? t->name : "task", kind, sizeof kind, &layer, &expert, &tier);
      fprintf(f, "task\t%s\t%d\t%d\t%s\t%d\t%.1f\t%.1f\t%llu\t%s\n", kind, layer, expert, tier, t->worker, t->start_us,
              t->end_us > t->start_us ? t->end_us : t->start_us, (unsigned long long)t->bytes, t->name ? t->name : "task");
    }
    if (fclose(f)) rc = st_set_error(ST_EIO, "%s: write failed", path);
  }
  pthread_mutex_destroy(&r->lock);
  free(r->tasks);
  free(r->steps);
  free(r->dir);
  free(r);
  return rc;
}
