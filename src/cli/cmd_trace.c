/* `strata trace DIR`: turns a run recorded with `strata generate --trace DIR` into a timeline
 * (timeline.svg), a Chrome trace-event file (trace.json, for Perfetto), a text summary
 * (summary.txt, also printed) and StarPU's paje.trace (for ViTE) when FxT files are there.
 * The formats are in src/io/trace.h and doc/traces.md. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "common.h"
#include "io/trace.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: strata trace DIR [options]\n"
          "Turns a run recorded with `strata generate --trace DIR` (DIR/events.tsv and StarPU's\n"
          "FxT files DIR/prof_file_*) into:\n"
          "  timeline.svg  one lane per worker, tasks coloured by kind, layer and step boundaries\n"
          "                (open in a browser; hover a task for its name and duration)\n"
          "  trace.json    Chrome trace-event format (open in https://ui.perfetto.dev)\n"
          "  summary.txt   busy %% per worker, time per task kind, critical path of the last\n"
          "                decode step (also printed)\n"
          "  paje.trace    StarPU's Paje trace from starpu_fxt_tool (open in ViTE), when FxT\n"
          "                files are there; the tool's other outputs go to OUTDIR/fxt/\n"
          "DIR may also be the events.tsv file itself. See doc/traces.md.\n"
          "\n"
          "  -o, --output OUTDIR   where to write the files (default: DIR; created if missing)\n"
          "      --no-paje         do not run starpu_fxt_tool\n"
          "      --step KIND:N     keep one step only (decode:2, prompt:0): a close-up of that step\n"
          "  -q, --quiet           do not print the summary (still written to summary.txt)\n"
          "  -h, --help            this help\n");
}

static int fail(const char *msg) {
  fprintf(stderr, "strata trace: %s\n", msg);
  return 1;
}

int st_cmd_trace(int argc, char **argv) {
  enum { OPT_NO_PAJE = 256, OPT_STEP };
  static const struct option longopts[] = {{"output", required_argument, 0, 'o'},
                                           {"no-paje", no_argument, 0, OPT_NO_PAJE},
                                           {"step", required_argument, 0, OPT_STEP},
                                           {"quiet", no_argument, 0, 'q'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  const char *outdir = NULL, *step = NULL;
  int no_paje = 0, quiet = 0, c;
  char msg[PATH_MAX + 512];
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":o:qh", longopts, NULL)) != -1) {
    switch (c) {
    case 'o': outdir = optarg; break;
    case OPT_NO_PAJE: no_paje = 1; break;
    case OPT_STEP: step = optarg; break;
    case 'q': quiet = 1; break;
    case 'h': usage(stdout); return 0;
    case ':':
      snprintf(msg, sizeof msg, "option '%s' needs a value", argv[optind - 1]);
      return fail(msg);
    default:
      snprintf(msg, sizeof msg, "unknown option '%s' (see strata trace --help)", st_cli_bad_option(argv));
      return fail(msg);
    }
  }
  if (argc - optind != 1) return fail(argc - optind ? "expected one DIR (see strata trace --help)" : "missing DIR (see strata trace --help)");

  /* DIR, or DIR/events.tsv given directly. */
  char dir[PATH_MAX], events[PATH_MAX + 16];
  struct stat sb;
  const char *arg = argv[optind];
  if (stat(arg, &sb)) {
    snprintf(msg, sizeof msg, "%s: %s", arg, strerror(errno));
    return fail(msg);
  }
  if (S_ISDIR(sb.st_mode)) {
    snprintf(dir, sizeof dir, "%s", arg);
    snprintf(events, sizeof events, "%s/events.tsv", arg);
  } else {
    snprintf(events, sizeof events, "%s", arg);
    const char *slash = strrchr(arg, '/');
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - arg ? slash - arg : 1), arg);
    else snprintf(dir, sizeof dir, ".");
  }
  if (!outdir) outdir = dir;
  if (mkdir(outdir, 0777) && errno != EEXIST) {
    snprintf(msg, sizeof msg, "cannot create %s: %s", outdir, strerror(errno));
    return fail(msg);
  }

  struct st_trace tr;
  if (st_trace_load(events, &tr)) {
    st_trace_free(&tr);
    return fail(st_last_error());
  }
  if (step) {
    char kind[16] = "";
    int index = -1;
    if (sscanf(step, "%15[a-z]:%d", kind, &index) != 2 || index < 0 || (strcmp(kind, "decode") && strcmp(kind, "prompt"))) {
      st_trace_free(&tr);
      return fail("--step expects decode:N or prompt:N");
    }
    if (st_trace_keep_step(&tr, !strcmp(kind, "decode"), index)) {
      st_trace_free(&tr);
      return fail(st_last_error());
    }
  }
  char svg[PATH_MAX + 32], json[PATH_MAX + 32], sum[PATH_MAX + 32];
  snprintf(svg, sizeof svg, "%s/timeline.svg", outdir);
  snprintf(json, sizeof json, "%s/trace.json", outdir);
  snprintf(sum, sizeof sum, "%s/summary.txt", outdir);
  int rc = st_trace_write_svg(&tr, svg);
  if (!rc) rc = st_trace_write_json(&tr, json);
  if (!rc) {
    FILE *f = fopen(sum, "w");
    if (!f) {
      rc = st_set_error(ST_EIO, "%s: %s", sum, strerror(errno));
    } else {
      st_trace_write_summary(&tr, f);
      int err = ferror(f);
      if (fclose(f) || err) rc = st_set_error(ST_EIO, "%s: write error", sum);
    }
  }
  if (rc) {
    st_trace_free(&tr);
    return fail(st_last_error());
  }
  if (!quiet) {
    st_trace_write_summary(&tr, stdout);
    putchar('\n');
  }
  size_t n_expert = 0;
  for (size_t i = 0; i < tr.n_tasks; i++) n_expert += tr.tasks[i].kind == ST_TRACE_EXPERT_ROWS;
  printf("wrote %s (%zu lanes, %zu task boxes of which %zu expert_rows)\n", svg, tr.n_workers, tr.n_tasks, n_expert);
  printf("wrote %s (%zu complete events, %zu lanes)\n", json, tr.n_tasks + tr.n_steps, tr.n_workers);
  printf("wrote %s\n", sum);
  if (no_paje) {
    printf("paje.trace: not written (--no-paje)\n");
  } else {
    int prc = st_trace_run_fxt_tool(dir, outdir, msg, sizeof msg);
    printf("%s%s\n", prc == 1 ? "wrote " : "", msg);
  }
  st_trace_free(&tr);
  return 0;
}
