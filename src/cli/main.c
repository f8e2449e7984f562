/* The `strata` binary: dispatches to its subcommands and holds the small parsers they share. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/cli.h"
#include "common.h"
#include "config.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: strata <command> [options]\n"
          "\n"
          "Runs GGUF Mixture-of-Experts models (qwen3moe, gpt-oss, deepseek2, glm4moe) as StarPU task\n"
          "graphs, on the GPUs StarPU finds and the CPU worker pool.\n"
          "\n"
          "commands:\n"
          "  generate   generate text from a prompt, streaming it, then print speed and tier statistics\n"
          "  eval       run a prompt and write the logits of its last position (float32, little-endian)\n"
          "  tokenize   print the token ids of a text as a JSON array\n"
          "  mkmodel    write a random-weight MoE GGUF (any architecture strata runs) for demos and benchmarks\n"
          "  profile    rank the expert pairs by routed count over a text (for --expert-profile)\n"
          "  bench      prompt and decode speed table (tok/s per prompt size and context depth)\n"
          "  trace      turn a run recorded with --trace DIR into timeline.svg, trace.json, a summary, paje.trace\n"
          "  tune       run a short benchmark under each StarPU scheduler and recommend one\n"
          "  serve      an OpenAI-compatible HTTP server for one model (chat/completions, streaming, metrics)\n"
          "\n"
          "`strata <command> --help` (or `strata help <command>`) lists each command's options.\n"
          "StarPU reads its own environment variables (STARPU_SCHED, STARPU_NCPU, ...): see doc/tuning.md.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 1;
  }
  const char *cmd = argv[1];
  char *help_argv[] = {argv[0], NULL, "--help", NULL};
  if (!strcmp(cmd, "help") && argc == 3) { /* strata help COMMAND: that command's --help */
    cmd = help_argv[1] = argv[2];
    argv = help_argv;
  } else if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version")) {
    printf("strata %s\n", PACKAGE_VERSION);
    return 0;
  }
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } cmds[] = {{"generate", st_cmd_generate},
              {"eval", st_cmd_eval},
              {"tokenize", st_cmd_tokenize},
              {"mkmodel", st_cmd_mkmodel},
              {"profile", st_cmd_profile},
              {"bench", st_cmd_bench},
              {"trace", st_cmd_trace},
              {"tune", st_cmd_tune},
              {"serve", st_cmd_serve}};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(cmd, cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "strata: unknown command '%s' (see strata --help)\n", cmd);
  return 1;
}

int st_parse_int(const char *flag, const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end)
    return st_set_error(ST_EINVAL, "%s expects a whole number, got '%s'", flag, s);
  if (v < lo || v > hi)
    return st_set_error(ST_EINVAL, "%s must be between %ld and %ld, got %ld", flag, lo, hi, v);
  *out = v;
  return 0;
}

int st_parse_float(const char *flag, const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end) return st_set_error(ST_EINVAL, "%s expects a number, got '%s'", flag, s);
  if (!(v >= lo && v <= hi)) return st_set_error(ST_EINVAL, "%s must be between %g and %g, got %g", flag, lo, hi, v);
  *out = v;
  return 0;
}

static const char *skip_space(const char *p) {
  while (*p == ' ' || *p == '\n') p++;
  return p;
}

int st_parse_ids(const char *s, int32_t **ids, size_t *n) {
  size_t cap = 16, m = 0;
  const char *p = skip_space(s);
  const int bracket = *p == '[';
  p = skip_space(p + bracket);
  if (!*p || (bracket && *p == ']')) return st_set_error(ST_EINVAL, "--prompt-ids: no token ids in '%s'", s);
  int32_t *v = malloc(sizeof *v * cap);
  if (!v) return st_set_error(ST_ENOMEM, "out of memory");
  /* ids with one comma between them ("1,,3", "1 2" and "1,2," are refused), in one optional pair of
   * brackets, and nothing after them */
  for (;;) {
    char *end = NULL;
    errno = 0;
    const long x = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : -1;
    if (x < 0 || errno || x > INT32_MAX) break;
    if (m == cap) {
      int32_t *nv = realloc(v, sizeof *v * (cap *= 2));
      if (!nv) {
        free(v);
        return st_set_error(ST_ENOMEM, "out of memory");
      }
      v = nv;
    }
    v[m++] = (int32_t)x;
    p = skip_space(end);
    if (*p == ',') {
      p = skip_space(p + 1);
      continue;
    }
    const int closed = bracket && *p == ']';
    if (closed) p = skip_space(p + 1);
    if (!*p && closed == bracket) {
      *ids = v;
      *n = m;
      return 0;
    }
    break;
  }
  free(v);
  return st_set_error(ST_EINVAL, "--prompt-ids: expected comma-separated token ids, optionally in brackets, got '%s'", s);
}

double st_anon_rss_mib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  double kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "RssAnon: %lf kB", &kib) == 1) break;
  fclose(f);
  return kib < 0 ? -1 : kib / 1024.0;
}

double st_peak_rss_gib(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru)) return 0;
  return ru.ru_maxrss / 1048576.0; /* Linux: KiB */
}

void st_print_ids(FILE *f, const int32_t *ids, size_t n) {
  fputc('[', f);
  for (size_t i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", ids[i]);
  fputs("]\n", f);
}
