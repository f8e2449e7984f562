/* Subcommands of the `strata` binary. Each takes argv with argv[0] = the subcommand name,
 * prints its own errors as one line `strata <cmd>: <message>` and returns the exit status. */
#ifndef ST_CLI_H
#define ST_CLI_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "cli/membw.h"
#include "graph/engine.h"

int st_cmd_generate(int argc, char **argv);
int st_cmd_eval(int argc, char **argv);
int st_cmd_tokenize(int argc, char **argv);
int st_cmd_mkmodel(int argc, char **argv);
int st_cmd_profile(int argc, char **argv);
int st_cmd_bench(int argc, char **argv);
int st_cmd_trace(int argc, char **argv); /* strata trace DIR: timeline.svg, trace.json, summary, paje.trace */
int st_cmd_tune(int argc, char **argv);  /* strata tune -m FILE: rank StarPU schedulers by tok/s */
int st_cmd_serve(int argc, char **argv); /* strata serve: OpenAI-compatible HTTP server (cmd_serve.c) */

/* Parses "1,2,3" or "[1, 2, 3]" into a malloc'd array (caller frees). 0 or ST_EINVAL. */
int st_parse_ids(const char *s, int32_t **ids, size_t *n);

/* Parses a whole decimal number in [lo, hi]; 0 or ST_EINVAL naming `flag`. */
int st_parse_int(const char *flag, const char *s, long lo, long hi, long *out);
int st_parse_float(const char *flag, const char *s, double lo, double hi, double *out);

/* Engine flags shared by the model-running commands (engine_opts.c). Long-option codes from
 * ST_ENGINE_OPT_BASE on belong to them; -c is --ctx-size. */
#define ST_ENGINE_OPT_BASE 1000
struct option;
/* `own` followed by the engine flags, terminated; malloc'd (caller frees), NULL when out of memory. */
struct option *st_engine_longopts_with(const struct option *own);
/* Rewrites llama.cpp's multi-letter short forms of the engine flags in argv[1..argc) (up to a
 * `--`) to their long names, in place, before getopt_long: -ctk (--cache-type-k), -ctv
 * (--cache-type-v). The replaced entries point to static strings. A llama.cpp flag strata has no
 * counterpart of (-ngl, -fa, -ncmoe, -ot, -b, -ub, -t, ... and their long forms; getopt would read
 * -ngl as -n gl) is refused, naming what strata has instead: 0, or ST_EINVAL. cmd: the subcommand,
 * for the message (bench keeps its own --threads). */
int st_engine_argv_aliases(int argc, char **argv, const char *cmd);
/* The option getopt_long just refused: "-X" for a short one (optopt, also inside a cluster such as
 * -xyz), else the argument it stopped at (argv[optind - 1]); a static buffer, valid until the next call. */
const char *st_cli_bad_option(char **argv);
/* 1 when `c` is an engine flag (stored in eo), 0 when it is not, a negative ST_E* on a bad value. */
int st_engine_opt(int c, const char *arg, struct st_engine_opts *eo);
/* Refuses impossible combinations (a cache without a profile, swaps without a cache,
 * --cuda-graphs both outside strata bench, which turns it into on before checking). */
int st_engine_opts_check(const struct st_engine_opts *eo);
/* The engine flags' lines for --help. */
void st_engine_opts_help(FILE *f);

/* Device-to-device copy bandwidth of the current CUDA device, bytes read + written per second
 * (best of 3 after a warm-up); 0 without CUDA or memory. */
double st_cuda_copy_bandwidth(size_t bytes);

/* strata bench --kernels (kernel_bench.c): a table (or JSON) of mat-vec GB/s per weight format on
 * `threads` CPU threads and, when there is a GPU, on CUDA, against bandwidths measured in the run.
 * formats: comma-separated type names to run (NULL: every format); n: weights per row (a multiple
 * of 256, 256..65536). Returns 0, ST_EINVAL for an unknown format name or a bad n, ST_ENOMEM /
 * ST_ERUNTIME when buffers or threads cannot be had. */
int st_kernel_bench(int threads, int json, const char *formats, int64_t n);

/* The process's peak resident memory so far (getrusage ru_maxrss), GiB; 0 when unknown. */
double st_peak_rss_gib(void);
/* Anonymous resident memory now (RssAnon of /proc/self/status: the heap and private buffers, not
 * the pages of the mapped model file), MiB; -1 where the kernel does not say. */
double st_anon_rss_mib(void);

/* Learned expert profiles (learn.c, io/learned.h), for the commands that run a model. Before the
 * engine starts: unless --no-learn, opens the model's learned profile and, when it is there and no
 * --expert-profile was given, points eo->expert_profile at it (a corrupt file: one warning).
 * writes: whether the command saves the run's routing afterwards (st_cli_learn_save; bench does
 * not), for the note st_cli_learn_say prints. */
struct st_learned;
void st_cli_learn_begin(struct st_learned *l, const struct st_model *m, struct st_engine_opts *eo, int writes);
/* Prints the line saying which expert profile the run uses (after the engine has started). */
void st_cli_learn_say(const struct st_learned *l);
/* After a run (and, in strata serve, now and then): adds the engine's routing counts to the learned
 * profile and saves it (a failure is a warning). */
void st_cli_learn_save(struct st_learned *l, const struct st_engine *e);

/* Prints ids as a JSON array and a newline. */
void st_print_ids(FILE *f, const int32_t *ids, size_t n);

/* Decimals to print a size of `mib` MiB with (the KV cache of a tiny model's short context is a
 * few KiB: "0.0625 MiB", not "0.0 MiB"). */
static inline int st_mib_digits(double mib) { return mib >= 10 ? 1 : 4; }

#endif
