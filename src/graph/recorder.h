/* Recording a run for `strata trace` (--trace DIR): every task's worker, start and end (StarPU's
 * profiling info, read in the task's callback) and bytes, and each prompt chunk and decode step,
 * written at the end as DIR/events.tsv in the format doc/traces.md describes (parsed by
 * io/trace.h). StarPU's own FxT files go to the same directory (STARPU_FXT_PREFIX). */
#ifndef ST_RECORDER_H
#define ST_RECORDER_H

struct st_recorder;

/* Creates DIR (and its parents) and an empty recording whose clock starts now (µs of
 * starpu_timing_now, so StarPU must be initialised). *out is owned: st_recorder_close(). */
/* Creates `dir` when missing and checks it is a directory the process can write; ST_EIO naming it
 * otherwise. st_recorder_open() calls it; the engine calls it before StarPU starts. */
int st_recorder_check_dir(const char *dir);
/* Removes an earlier recording's files from `dir` (events.tsv, StarPU's prof_file_*, and the
 * timeline.svg, trace.json, summary.txt and paje.trace made from them), so that none is read as
 * the new one's: the engine calls it once, after st_recorder_check_dir and before StarPU starts
 * (StarPU writes this run's FxT file into `dir` when it shuts down). */
void st_recorder_clear_dir(const char *dir);

int st_recorder_open(const char *dir, struct st_recorder **out);

/* The task-completion callback (struct st_target.done); arg is a struct st_task_done whose arg is
 * the recorder. Thread-safe. */
void st_recorder_task_done(void *arg);

/* A prompt chunk (is_decode 0) or decode step (1), with starpu_timing_now() times in µs. */
void st_recorder_step(struct st_recorder *r, int is_decode, double start_us, double end_us);

/* Writes DIR/events.tsv (model path, StarPU's workers, steps, tasks) and frees the recording.
 * Returns 0 or ST_EIO. */
int st_recorder_close(struct st_recorder *r, const char *model_path);

#endif
