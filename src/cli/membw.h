/* The CPU side of the bench's bandwidth measurements (membw.c): a thread team created once, the
 * host's read bandwidth on it, a median, and a buffer for them. No engine types, so that benchmark
 * programs outside the strata binary (bench/ggml-matvec.c) measure the same way. */
#ifndef ST_CLI_MEMBW_H
#define ST_CLI_MEMBW_H

#include <stddef.h>
#include <stdint.h>

/* Host read bandwidth with `threads` threads over a `bytes` buffer (2 MiB aligned, huge pages
 * asked for, as the host expert arena), bytes/s (best of 5 on one thread team, of a read loop
 * with and one without software prefetch; 0 when the buffer cannot be allocated). membw.c */
double st_host_read_bandwidth(int threads, size_t bytes);
/* The same over a buffer the caller owns (written beforehand, so its pages exist), best of `reps`
 * (>= 1) per loop, bytes/s; 0 when buf is NULL or threads is outside 1..256. membw.c */
double st_host_read_bandwidth_of(const void *buf, size_t bytes, int threads, int reps);
/* Runs fn(args + i * arg_size) on `threads` (1..256) threads created once, `reps` times, each
 * repetition started on all threads at once (a barrier) and timed until the last returns: the best
 * repetition's seconds, or -1 when a thread or barrier cannot be made. membw.c */
double st_team_best_seconds(int threads, void *(*fn)(void *), void *args, size_t arg_size, int reps);
/* The median of v[0..n) (n >= 1; the lower middle one for an even n), sorting v in place. membw.c */
double st_median(double *v, int n);
/* The kernel benches' inputs: the token x[i] = (i % 17) / 17 (n floats) and `distinct` rows of n
 * floats (rows[r * n + i]) from a fixed LCG, each value a sum of four uniforms in [-0.5, 0.5)
 * (roughly Gaussian), so that grid indices and scales vary from row to row as in a real expert's
 * matrix; the same numbers on every run and machine. membw.c */
void st_bench_inputs(float *x, float *rows, int64_t n, int distinct);
/* Bytes of weights per format in the kernel benches, and of their reference read: at least 1 GiB and
 * four times the last-level cache, so that neither is served from it (the GPU host's Xeon has a
 * 300 MiB L3, and 256 MiB of weights read partly from it, up to 124 % of the memory bandwidth).
 * membw.c */
uint64_t st_bench_bytes(void);
/* A buffer of `bytes` for bandwidth measurements: 2 MiB aligned, MADV_HUGEPAGE asked for (a hint).
 * Freed with free(); NULL when out of memory. membw.c */
void *st_bench_buffer(size_t bytes);

#endif
