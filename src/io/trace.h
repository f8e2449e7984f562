/* Recorded runs (`strata generate --trace DIR`): the parser of strata's event log
 * `DIR/events.tsv` and the exporters behind `strata trace` (an SVG timeline, a Chrome
 * trace-event JSON for Perfetto, a text summary with one decode step's critical path, and
 * StarPU's paje.trace through starpu_fxt_tool). The format and the meaning of every field are
 * in doc/traces.md; in short, after the line "# strata trace v1", one tab-separated record per
 * line:
 *   model  <path>
 *   worker <id> <CPU|CUDA> <StarPU worker name>
 *   step   <prompt|decode> <index> <start_us> <end_us>
 *   task   <kind> <layer> <expert|-1> <tier|-> <worker id> <start_us> <end_us> <bytes> <name>
 * Times are microseconds since the engine started (StarPU's profiling clock). */
#ifndef ST_TRACE_H
#define ST_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Task kinds, in the order the legend and the summary list them. */
enum st_trace_kind {
  ST_TRACE_ATTENTION,
  ST_TRACE_ATTN_OUTPUT,
  ST_TRACE_ROUTER,
  ST_TRACE_EXPERT_ROWS,
  ST_TRACE_COMBINE,
  ST_TRACE_OUTPUT_HEAD,
  ST_TRACE_DECODE_LAYER, /* a decode step's dense work of one layer on a GPU (graph/decode.h) */
  ST_TRACE_DECODE_LANE,  /* a decode step's CPU lane without a GPU: attention, router, experts, combine */
  ST_TRACE_PROMPT_LANE,  /* a prompt chunk's CPU lane without a GPU (graph/prompt.h): the same for T tokens */
  ST_TRACE_TRANSFER,
  ST_TRACE_NKINDS
};

/* The word events.tsv uses for a kind ("expert_rows"); NULL when out of range. */
const char *st_trace_kind_name(int kind);

struct st_trace_worker {
  int id;      /* StarPU worker id */
  int is_cuda; /* 0: CPU worker, 1: CUDA worker */
  char *name;  /* StarPU's worker name, e.g. "CPU 0", "CUDA 0.0 (NVIDIA H200)" */
};

struct st_trace_step {
  int is_decode;          /* 0: prompt chunk, 1: decode step (or verify window) */
  int index;              /* chunk or step number, from 0 */
  double start_us, end_us;
};

struct st_trace_task {
  int kind;               /* enum st_trace_kind */
  int layer;              /* transformer block, -1 for output_head */
  int expert;             /* expert id, -1 when the task is not one expert pair's */
  char tier[24];          /* "CPU", "CUDA0", "CUDA1", ... or "-" */
  int worker;             /* index into st_trace.workers (not the StarPU id) */
  double start_us, end_us;
  uint64_t bytes;         /* bytes the task read plus wrote */
  char *name;             /* StarPU task name, e.g. "expert_rows L12 E87 CPU" */
};

struct st_trace {
  char *model; /* NULL when the log has no model line */
  struct st_trace_worker *workers;
  size_t n_workers;
  struct st_trace_step *steps;
  size_t n_steps;
  struct st_trace_task *tasks;
  size_t n_tasks;
  double t0_us, t1_us; /* the traced span: earliest start and latest end of tasks and steps */
};

/* Reads an events.tsv file into `tr` (zeroed first; free with st_trace_free, also after an
 * error). Every line is checked: a wrong header, an unknown record, a missing or extra field,
 * a number out of range, end before start, a task on an undeclared worker, a duplicate worker
 * id, invalid UTF-8 or a control character gives ST_EFORMAT with the message
 * "<path>:<line>: <what>"; an unreadable file ST_EIO; no worker or no task ST_EFORMAT. */
int st_trace_load(const char *path, struct st_trace *tr);
void st_trace_free(struct st_trace *tr);

/* Keeps one step (a prompt chunk when is_decode is 0, else a decode step; `index` counts from 0)
 * and the tasks that start within it, for a close-up. ST_EINVAL when there is no such step or
 * it has no task. */
int st_trace_keep_step(struct st_trace *tr, int is_decode, int index);

/* timeline.svg, written with libxml2's xmlTextWriter: one lane per worker (a rect of class
 * "lane" each), one rect of class "task <kind>" per task (expert_rows also carry a class
 * naming the tier) with a <title> tooltip, step and layer boundaries as vertical lines, a
 * legend and a time axis in ms. 0, or ST_EIO when the file cannot be written. */
int st_trace_write_svg(const struct st_trace *tr, const char *path);

/* trace.json in the Chrome trace-event format: one "X" event per task (ts and dur in µs,
 * pid 1, tid = StarPU worker id, args: layer, expert, tier, bytes), "M" thread_name events
 * naming each lane, and the steps as "X" events of pid 2 ("steps"). 0 or ST_EIO. */
int st_trace_write_json(const struct st_trace *tr, const char *path);

/* One element of a critical path: a task index, and the idle time before it in µs (the gap
 * from the previous element's end, or from the step's start for the first). */
struct st_trace_path_elem {
  size_t task;
  double gap_us;
};

/* The critical path of a step: among the tasks that start inside [step start, step end], the
 * chain t1 -> t2 -> ... -> tk in which every task starts at or after the previous one ends,
 * tk is the step's last task (the one that ends last), and the sum of the task durations is
 * the largest. The log does not record dependencies, so this is the longest run of work that
 * provably did not overlap: a lower bound of the step time set by these tasks alone, and the
 * step time minus its busy sum is the time the chain spent waiting (scheduling, the host
 * reading the routing table, transfers not recorded). Computed in O(n log n).
 * Writes a malloc'd array to *path (caller frees) and its length to *n (0 when the step has
 * no task). 0 or ST_ENOMEM. */
int st_trace_critical_path(const struct st_trace *tr, const struct st_trace_step *step,
                           struct st_trace_path_elem **path, size_t *n);

/* The text summary: the traced span, per worker busy % over it, per task kind (and per tier
 * of expert_rows) count, total ms and mean µs, and the critical path of the last decode step
 * (of the last step when there is no decode step). Written to `f`. */
void st_trace_write_summary(const struct st_trace *tr, FILE *f);

/* Runs starpu_fxt_tool (from $PATH, else /opt/strata-deps/bin) on DIR/prof_file_* to write
 * OUTDIR/paje.trace; the tool's other outputs (dag.dot, tasks.rec, ...) and its log fxt_tool.log go
 * to OUTDIR/fxt/.
 * Returns 1 when it wrote paje.trace, 0 when there was nothing to convert (no prof files),
 * a negative ST_E* code when the tool is missing or failed; `msg` always says what happened. */
int st_trace_run_fxt_tool(const char *dir, const char *outdir, char *msg, size_t msg_size);

/* Removes from OUTDIR/fxt/ the files st_trace_run_fxt_tool's run of starpu_fxt_tool writes there
 * (its log, dag.dot, tasks.rec, trace.rec, data.rec, activity.data, distrib.data, trace.html, ...),
 * then the folder itself when that leaves it empty; any other file stays. Errors are ignored
 * (a file or folder that is not there is the usual case). */
void st_trace_remove_fxt_outputs(const char *outdir);

#endif
