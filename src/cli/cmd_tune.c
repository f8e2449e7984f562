/* `strata tune`: runs the same short greedy generation under each StarPU scheduler
 * (STARPU_SCHED) and, when asked, each CPU worker count (STARPU_NCPU), by running this binary
 * as a child process (`generate ... --print-ids`), reads the speeds it reports on stderr
 * ("prompt: N tokens in X s (Y tok/s)", "decode: ..."), and prints a table ranked by decode
 * speed with the environment line of the best setting. See doc/traces.md. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common.h"
#include "io/gguf.h"

extern char **environ;

#define DEFAULT_POLICIES "eager,prio,lws,ws,dmda,dmdas,heteroprio"

static void usage(FILE *f) {
  fprintf(f,
          "usage: strata tune -m FILE [options] [-- GENERATE-OPTIONS...]\n"
          "Runs the same short benchmark (greedy generation of --decode tokens after a prompt of\n"
          "--prompt token ids) under each StarPU scheduler, and each CPU worker count when --ncpu\n"
          "is given, then prints a table ranked by decode tok/s (ties by prompt tok/s) and the\n"
          "environment line of the best one. Each run is `strata generate` in a child process with\n"
          "STARPU_SCHED (and STARPU_NCPU) set; options after `--` are passed to every run.\n"
          "\n"
          "  -m, --model FILE      GGUF model (required)\n"
          "      --policies LIST   comma-separated STARPU_SCHED values, each once\n"
          "                        (default: " DEFAULT_POLICIES ")\n"
          "      --ncpu LIST       comma-separated STARPU_NCPU values, each once, e.g. 1,2,4 (default:\n"
          "                        StarPU's own choice, STARPU_NCPU left as it is; a count above the\n"
          "                        online cores is run, with a warning)\n"
          "      --prompt N        prompt length, tokens (default: 64; at most 16384: the ids go on each\n"
          "                        run's command line)\n"
          "      --decode N        tokens generated, each a decode step (default: 32)\n"
          "      --repeat N        runs per setting; the table shows the median (default: 1)\n"
          "      --timeout S       seconds a run may take before it is stopped and counted as\n"
          "                        failed (default: 600)\n"
          "  -h, --help            this help\n"
          "Schedulers with performance models (dmda, dmdas) calibrate them during their first\n"
          "runs (stored in StarPU's .starpu/sampling under $XDG_CACHE_HOME, else $STARPU_HOME, else\n"
          "$HOME; STARPU_PERF_MODEL_DIR names the folder itself): use --repeat 3 or more to\n"
          "judge them.\n");
}

static int fail(const char *msg) {
  fprintf(stderr, "strata tune: %s\n", msg);
  return 1;
}

/* One setting and what its runs measured. */
struct run {
  char policy[64];
  long ncpu; /* -1: STARPU_NCPU not set by tune */
  int ok;
  double prompt_tps, decode_tps;
  char workers[96]; /* "2 CPU, 0 CUDA" as the child reported it */
  char error[256];
};

/* Splits a comma-separated list into malloc'd strings (caller frees both levels). */
static int split_list(const char *flag, const char *s, char ***out, size_t *n) {
  size_t cap = 8, m = 0;
  char **v = malloc(sizeof *v * cap);
  if (!v) return st_set_error(ST_ENOMEM, "out of memory");
  for (const char *p = s; *p;) {
    size_t len = strcspn(p, ",");
    if (len) {
      if (m == cap) {
        char **nv = realloc(v, sizeof *v * (cap *= 2));
        if (!nv) goto oom;
        v = nv;
      }
      if (!(v[m] = strndup(p, len))) goto oom;
      m++;
    }
    p += len + (p[len] == ',');
  }
  if (!m) {
    free(v);
    return st_set_error(ST_EINVAL, "%s: empty list", flag);
  }
  *out = v;
  *n = m;
  return 0;
oom:
  for (size_t i = 0; i < m; i++) free(v[i]);
  free(v);
  return st_set_error(ST_ENOMEM, "out of memory");
}

static void free_list(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v ? v[i] : NULL);
  free(v);
}

/* The model's vocabulary size: the tokenizer's token list, else token_embd's row count. */
static int vocab_size(const char *path, uint64_t *n_vocab) {
  struct st_gguf *g;
  int rc = st_gguf_open(path, &g);
  if (rc) return rc;
  const struct st_gguf_kv *kv = st_gguf_find_kv(g, "tokenizer.ggml.tokens");
  const struct st_gguf_tensor *t = st_gguf_find_tensor(g, "token_embd.weight");
  *n_vocab = kv && kv->type == ST_GGUF_ARRAY ? kv->v.arr.n : t && t->n_dims >= 2 ? t->ne[1] : 0;
  st_gguf_close(g);
  if (!*n_vocab) return st_set_error(ST_EFORMAT, "%s: no tokenizer.ggml.tokens nor token_embd.weight", path);
  return 0;
}

/* "prompt: 64 tokens in 0.123 s (520.33 tok/s)" -> 520.33 */
static int parse_speed(const char *out, const char *prefix, double *tps) {
  size_t plen = strlen(prefix);
  for (const char *p = out; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    if (strncmp(p, prefix, plen)) continue;
    const char *paren = strchr(p, '(');
    const char *nl = strchr(p, '\n');
    if (paren && (!nl || paren < nl) && sscanf(paren, "(%lf tok/s)", tps) == 1) return 0;
  }
  return -1;
}

/* The last non-empty line of `s` into `out`. */
static void last_line(const char *s, char *out, size_t n) {
  out[0] = 0;
  const char *best = NULL;
  size_t best_len = 0;
  for (const char *p = s; *p;) {
    size_t len = strcspn(p, "\n");
    if (len) best = p, best_len = len;
    p += len + (p[len] == '\n');
  }
  if (best) snprintf(out, n, "%.*s", (int)best_len, best);
}

/* One child run of `generate`; fills speeds or r->error. */
static void run_once(struct run *r, char **gen_argv, int timeout_s, double *prompt_tps, double *decode_tps) {
  char sched_env[96], ncpu_env[48];
  snprintf(sched_env, sizeof sched_env, "STARPU_SCHED=%s", r->policy);
  snprintf(ncpu_env, sizeof ncpu_env, "STARPU_NCPU=%ld", r->ncpu);
  size_t n_env = 0;
  while (environ[n_env]) n_env++;
  char **envp = malloc(sizeof *envp * (n_env + 4));
  char *out = NULL;
  if (!envp) {
    snprintf(r->error, sizeof r->error, "out of memory");
    return;
  }
  size_t e = 0;
  for (size_t i = 0; i < n_env; i++) {
    if (!strncmp(environ[i], "STARPU_SCHED=", 13) || !strncmp(environ[i], "STARPU_SILENT=", 14) ||
        (r->ncpu >= 0 && !strncmp(environ[i], "STARPU_NCPU=", 12)))
      continue;
    envp[e++] = environ[i];
  }
  envp[e++] = sched_env;
  if (r->ncpu >= 0) envp[e++] = ncpu_env;
  envp[e++] = "STARPU_SILENT=1";
  envp[e] = NULL;

  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) {
    snprintf(r->error, sizeof r->error, "pipe: %s", strerror(errno));
    free(envp);
    return;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  pid_t pid;
  int err = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, gen_argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  free(envp);
  if (err) {
    close(fds[0]);
    snprintf(r->error, sizeof r->error, "cannot run /proc/self/exe: %s", strerror(err));
    return;
  }
  /* Read its stderr until it closes, or until the time limit. */
  size_t len = 0, cap = 1 << 14;
  int timed_out = 0;
  out = malloc(cap);
  double t_end = st_now() + timeout_s;
  for (;;) {
    int left_ms = (int)((t_end - st_now()) * 1000);
    if (left_ms <= 0) {
      timed_out = 1;
      break;
    }
    struct pollfd pfd = {fds[0], POLLIN, 0};
    int pr = poll(&pfd, 1, left_ms);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    if (out && len + 4096 + 1 > cap) {
      char *no = realloc(out, cap *= 2);
      if (!no) free(out);
      out = no;
    }
    char sink[4096];
    ssize_t nr = out ? read(fds[0], out + len, cap - len - 1) : read(fds[0], sink, sizeof sink);
    if (nr < 0 && errno == EINTR) continue;
    if (nr <= 0) break;
    if (out) len += (size_t)nr;
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!out) {
    snprintf(r->error, sizeof r->error, "out of memory reading the run's output");
    return;
  }
  out[len] = 0;

  char line[200];
  last_line(out, line, sizeof line);
  char *nf = strstr(out, "scheduling policy '");
  const char *ws = strstr(out, "StarPU workers: ");
  if (ws) {
    ws += strlen("StarPU workers: ");
    size_t wl = strcspn(ws, ";\n");
    snprintf(r->workers, sizeof r->workers, "%.*s", (int)wl, ws);
  }
  if (timed_out) {
    snprintf(r->error, sizeof r->error, "stopped after %d s (--timeout)", timeout_s);
  } else if (WIFSIGNALED(status)) {
    snprintf(r->error, sizeof r->error, "killed by signal %d%s%s", WTERMSIG(status), *line ? "; last line: " : "", line);
  } else if (WEXITSTATUS(status)) {
    snprintf(r->error, sizeof r->error, "%s", *line ? line : "exit status non-zero, no message");
  } else if (nf && strstr(nf, "was not found")) {
    snprintf(r->error, sizeof r->error, "StarPU has no scheduling policy '%s' (it fell back to its default)", r->policy);
  } else if (parse_speed(out, "prompt: ", prompt_tps) || parse_speed(out, "decode: ", decode_tps)) {
    snprintf(r->error, sizeof r->error, "no 'prompt:'/'decode:' speed lines in its output%s%s",
             *line ? "; last line: " : "", line);
  }
  free(out);
}

static int by_rank(const void *a, const void *b) {
  const struct run *x = a, *y = b;
  if (x->ok != y->ok) return x->ok ? -1 : 1;
  if (!x->ok) return 0;
  if (x->decode_tps != y->decode_tps) return x->decode_tps > y->decode_tps ? -1 : 1;
  if (x->prompt_tps != y->prompt_tps) return x->prompt_tps > y->prompt_tps ? -1 : 1;
  return 0;
}

int st_cmd_tune(int argc, char **argv) {
  enum { OPT_POLICIES = 256, OPT_NCPU, OPT_PROMPT, OPT_DECODE, OPT_REPEAT, OPT_TIMEOUT };
  static const struct option longopts[] = {{"model", required_argument, 0, 'm'},
                                           {"policies", required_argument, 0, OPT_POLICIES},
                                           {"ncpu", required_argument, 0, OPT_NCPU},
                                           {"prompt", required_argument, 0, OPT_PROMPT},
                                           {"decode", required_argument, 0, OPT_DECODE},
                                           {"repeat", required_argument, 0, OPT_REPEAT},
                                           {"timeout", required_argument, 0, OPT_TIMEOUT},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  const char *model = NULL, *policies_s = DEFAULT_POLICIES, *ncpu_s = NULL;
  long n_prompt = 64, n_decode = 32, repeat = 1, timeout_s = 600;
  int c, rc = 0;
  char msg[1200];
  optind = 1;
  opterr = 0;
  while (!rc && (c = getopt_long(argc, argv, ":m:h", longopts, NULL)) != -1) {
    switch (c) {
    case 'm': model = optarg; break;
    case OPT_POLICIES: policies_s = optarg; break;
    case OPT_NCPU: ncpu_s = optarg; break;
    case OPT_PROMPT: rc = st_parse_int("--prompt", optarg, 1, 16384, &n_prompt); break; /* ids on a command line */
    case OPT_DECODE: rc = st_parse_int("--decode", optarg, 1, 1 << 20, &n_decode); break;
    case OPT_REPEAT: rc = st_parse_int("--repeat", optarg, 1, 1000, &repeat); break;
    case OPT_TIMEOUT: rc = st_parse_int("--timeout", optarg, 1, 86400, &timeout_s); break;
    case 'h': usage(stdout); return 0;
    case ':':
      snprintf(msg, sizeof msg, "option '%s' needs a value", argv[optind - 1]);
      return fail(msg);
    default:
      snprintf(msg, sizeof msg, "unknown option '%s' (see strata tune --help)", st_cli_bad_option(argv));
      return fail(msg);
    }
  }
  if (rc) return fail(st_last_error());
  if (!model) return fail("missing -m FILE (see strata tune --help)");
  /* Anything left must follow `--` (getopt_long stops there) and goes to every run. */
  if (optind < argc && strcmp(argv[optind - 1], "--")) {
    snprintf(msg, sizeof msg, "unexpected argument '%s' (options for generate go after --)", argv[optind]);
    return fail(msg);
  }
  /* what tune sets on each run's command line itself: a second value after -- would win there */
  static const char *const own[][2] = {{"-m", "--model"}, {"-p", "--prompt"}, {"--prompt-ids", "--prompt-ids"},
                                       {"-n", "--n-predict"}, {"--temp", "--temp"}};
  for (int i = optind; i < argc; i++)
    for (size_t k = 0; k < sizeof own / sizeof own[0]; k++) {
      const size_t ls = strlen(own[k][1]);
      if (!strcmp(argv[i], own[k][0]) || (!strncmp(argv[i], own[k][1], ls) && (!argv[i][ls] || argv[i][ls] == '='))) {
        snprintf(msg, sizeof msg, "'%s' after -- would override what tune gives every run (-m, the prompt ids, "
                 "-n from --decode, --temp 0): use tune's own -m, --prompt and --decode", argv[i]);
        return fail(msg);
      }
    }

  char **policies = NULL, **ncpus = NULL;
  size_t n_pol = 0, n_ncpu = 0;
  if (split_list("--policies", policies_s, &policies, &n_pol) ||
      (ncpu_s && split_list("--ncpu", ncpu_s, &ncpus, &n_ncpu))) {
    free_list(policies, n_pol);
    return fail(st_last_error());
  }
  long *ncpu_v = malloc(sizeof *ncpu_v * (n_ncpu ? n_ncpu : 1));
  size_t n_runs = n_pol * (n_ncpu ? n_ncpu : 1);
  struct run *runs = calloc(n_runs, sizeof *runs);
  int32_t *ids = malloc(sizeof *ids * (size_t)n_prompt);
  char *ids_s = malloc((size_t)n_prompt * 12 + 1);
  char **gen_argv = malloc(sizeof *gen_argv * (size_t)(argc + 16));
  if (!ncpu_v || !runs || !ids || !ids_s || !gen_argv) {
    rc = fail("out of memory");
    goto out;
  }
  ncpu_v[0] = -1;
  for (size_t i = 0; i < n_ncpu; i++)
    if (st_parse_int("--ncpu", ncpus[i], 0, 4096, &ncpu_v[i])) {
      rc = fail(st_last_error());
      goto out;
    }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  for (size_t i = 0; i < n_ncpu; i++) {
    for (size_t j = 0; j < i; j++)
      if (ncpu_v[j] == ncpu_v[i]) {
        snprintf(msg, sizeof msg, "--ncpu: %ld is listed twice", ncpu_v[i]);
        rc = fail(msg);
        goto out;
      }
    if (cores > 0 && ncpu_v[i] > cores)
      fprintf(stderr, "strata tune: warning: --ncpu %ld is more CPU workers than this machine's %ld online cores\n",
              ncpu_v[i], cores);
  }
  for (size_t i = 0; i < n_pol; i++) {
    if (strlen(policies[i]) >= sizeof runs[0].policy || strspn(policies[i], "abcdefghijklmnopqrstuvwxyz0123456789_-") !=
                                                             strlen(policies[i])) {
      snprintf(msg, sizeof msg, "--policies: '%.80s' is not a StarPU scheduler name", policies[i]);
      rc = fail(msg);
      goto out;
    }
    for (size_t j = 0; j < i; j++)
      if (!strcmp(policies[j], policies[i])) {
        snprintf(msg, sizeof msg, "--policies: '%.60s' is listed twice", policies[i]);
        rc = fail(msg);
        goto out;
      }
  }

  /* A prompt of ordinary word-piece ids from the model's vocabulary, as bench/generate.sh. */
  uint64_t n_vocab;
  if (vocab_size(model, &n_vocab)) {
    rc = fail(st_last_error());
    goto out;
  }
  size_t pos = 0;
  for (long i = 0; i < n_prompt; i++) {
    ids[i] = n_vocab >= 6000 ? 1000 + (int32_t)((i * 37) % 5000) : (int32_t)((uint64_t)(i * 37) % n_vocab);
    pos += (size_t)sprintf(ids_s + pos, "%s%d", i ? "," : "", ids[i]);
  }
  char n_s[24];
  snprintf(n_s, sizeof n_s, "%ld", n_decode);
  size_t a = 0;
  gen_argv[a++] = "strata";
  gen_argv[a++] = "generate";
  gen_argv[a++] = "-m";
  gen_argv[a++] = (char *)model;
  gen_argv[a++] = "--prompt-ids";
  gen_argv[a++] = ids_s;
  gen_argv[a++] = "-n";
  gen_argv[a++] = n_s;
  gen_argv[a++] = "--temp";
  gen_argv[a++] = "0";
  gen_argv[a++] = "--ignore-eos";
  gen_argv[a++] = "--print-ids";
  for (int i = optind; i < argc; i++) gen_argv[a++] = argv[i];
  gen_argv[a] = NULL;

  fprintf(stderr, "strata tune: %s, prompt %ld tokens, %ld decoded, %zu settings x %ld run%s\n", model, n_prompt,
          n_decode, n_runs, repeat, repeat > 1 ? "s" : "");
  double *pt = malloc(sizeof *pt * (size_t)repeat), *dt = malloc(sizeof *dt * (size_t)repeat);
  if (!pt || !dt) {
    free(pt), free(dt);
    rc = fail("out of memory");
    goto out;
  }
  for (size_t p = 0, k = 0; p < n_pol; p++)
    for (size_t q = 0; q < (n_ncpu ? n_ncpu : 1); q++, k++) {
      struct run *r = &runs[k];
      snprintf(r->policy, sizeof r->policy, "%s", policies[p]);
      r->ncpu = ncpu_v[q];
      long got = 0;
      for (long t = 0; t < repeat && !r->error[0]; t++) {
        run_once(r, gen_argv, (int)timeout_s, &pt[t], &dt[t]);
        if (r->error[0]) {
          fprintf(stderr, "  %s%s%s run %ld/%ld: failed: %s\n", r->policy, r->ncpu >= 0 ? " ncpu=" : "",
                  r->ncpu >= 0 ? ncpus[q] : "", t + 1, repeat, r->error);
        } else {
          fprintf(stderr, "  %s%s%s run %ld/%ld: prompt %.2f tok/s, decode %.2f tok/s (%s)\n", r->policy,
                  r->ncpu >= 0 ? " ncpu=" : "", r->ncpu >= 0 ? ncpus[q] : "", t + 1, repeat, pt[t], dt[t], r->workers);
          got++;
        }
      }
      if (!r->error[0] && got == repeat) {
        r->prompt_tps = st_median(pt, (int)repeat);
        r->decode_tps = st_median(dt, (int)repeat);
        r->ok = 1;
      }
    }
  free(pt);
  free(dt);

  qsort(runs, n_runs, sizeof *runs, by_rank);
  printf("%-4s  %-12s %5s  %-16s %13s %13s\n", "rank", "policy", "ncpu", "workers", "prompt tok/s", "decode tok/s");
  for (size_t k = 0; k < n_runs; k++) {
    const struct run *r = &runs[k];
    char ncpu[24], rank[24];
    snprintf(ncpu, sizeof ncpu, r->ncpu >= 0 ? "%ld" : "-", r->ncpu);
    snprintf(rank, sizeof rank, r->ok ? "%zu" : "-", k + 1);
    if (r->ok)
      printf("%-4s  %-12s %5s  %-16s %13.2f %13.2f\n", rank, r->policy, ncpu, r->workers, r->prompt_tps, r->decode_tps);
    else
      printf("%-4s  %-12s %5s  failed: %s\n", rank, r->policy, ncpu, r->error);
  }
  if (!n_runs || !runs[0].ok) {
    rc = fail("every run failed (see the table)");
    goto out;
  }
  printf("recommended: STARPU_SCHED=%s", runs[0].policy);
  if (runs[0].ncpu >= 0) printf(" with STARPU_NCPU=%ld", runs[0].ncpu);
  printf(" (decode %.2f tok/s, prompt %.2f tok/s, median of %ld)\n", runs[0].decode_tps, runs[0].prompt_tps, repeat);
  printf("export STARPU_SCHED=%s", runs[0].policy);
  if (runs[0].ncpu >= 0) printf(" STARPU_NCPU=%ld", runs[0].ncpu);
  printf("\n");
out:
  free_list(policies, n_pol);
  free_list(ncpus, n_ncpu);
  free(ncpu_v);
  free(runs);
  free(ids);
  free(ids_s);
  free(gen_argv);
  return rc;
}
