/* `strata serve`: an OpenAI-compatible HTTP server (libmicrohttpd) in front of one engine.
 * MHD runs a thread per connection; those threads parse and validate requests, render chats and
 * tokenize (the tokenizer is safe to share), then put a job on a bounded queue. One worker thread
 * owns the engine and runs the jobs one after another, because StarPU and the engine serve one
 * batch at a time; each job starts from an empty KV cache (no prefix reuse yet). Streaming
 * responses read server-sent events the worker appends to the job; a client that goes away
 * cancels its job, whether it still waits in the queue or is generating. The per-request log
 * line carries what the seeds' users compare (SECOND_GPU.md): tokens, tok/s, expert entries per
 * tier and MiB moved host->device. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "codelets/quant.h"
#include "common.h"
#include "graph/engine.h"
#include "graph/sampler.h"
#include "io/arch.h"
#include "io/chat_template.h"
#include "io/config.h"
#include "io/gguf.h"
#include "io/model.h"
#include "io/tokenizer.h"

#include "cli/serve.h"

/* ---- the command ---- */

struct serve_opts {
  const char *config, *model, *host, *name;
  long port, max_tokens, queue, max_conns, max_per_addr, header_timeout, idle_timeout;
  int have_port;
  struct st_engine_opts eo;
};

enum { OPT_CONFIG = 256, OPT_HOST, OPT_PORT, OPT_NAME, OPT_MAX_TOKENS, OPT_QUEUE, OPT_MAX_CONNS, OPT_MAX_PER_ADDR,
       OPT_HEADER_TIMEOUT, OPT_IDLE_TIMEOUT };

static void serve_help(FILE *f) {
  fprintf(f,
          "usage: strata serve --config FILE.json [options]\n"
          "       strata serve -m FILE [engine flags] [options]\n\n"
          "An OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions (both with\n"
          "\"stream\": true), GET /v1/models, GET /health, GET /metrics. Requests run one at a time.\n\n"
          "      --config FILE      model config (JSON: model, gpu, args, host, port, name, max_tokens,\n"
          "                         remote_expert_opt; see doc/serve.md); flags given here override it\n"
          "  -m, --model FILE       MoE GGUF file (instead of --config; strata generate --help lists them)\n"
          "      --host ADDR        address to listen on (default 127.0.0.1)\n"
          "      --port N           TCP port (default 8080; 0 = any free port, logged at start)\n"
          "      --name ID          model id in /v1/models and responses (default: the config's or model\n"
          "                         file's name without .json/.gguf)\n"
          "      --max-tokens N     tokens a request generates when it gives no max_tokens (default: the rest\n"
          "                         of the context)\n"
          "      --queue N          requests that may wait for the engine; more get 503 (default 64)\n"
          "      --max-connections N  open connections in all; a request on one past it gets 503 (default\n"
          "                         1024; past N + 64 the library refuses the connection)\n"
          "      --max-connections-per-address N  open connections from one client address; a request on\n"
          "                         one past it gets 503 (default 64)\n"
          "      --header-timeout S seconds a connection may take to send its request headers (default 10)\n"
          "      --idle-timeout S   seconds a connection may stay idle once its headers are in (default 600)\n");
  st_engine_opts_help(f);
  fprintf(f, "  -h, --help             this help\n\nSIGINT or SIGTERM stops the server.\n");
}

/* Parses argv[0..argc) (argv[0] = a name) with the engine flags and, when own_ok, serve's own.
 * `where` prefixes errors about flags from the config file. */
static int parse_args(int argc, char **argv, struct serve_opts *o, int own_ok, const char *where) {
  static const struct option own[] = {
      {"config", required_argument, 0, OPT_CONFIG}, {"model", required_argument, 0, 'm'},
      {"host", required_argument, 0, OPT_HOST},     {"port", required_argument, 0, OPT_PORT},
      {"name", required_argument, 0, OPT_NAME},     {"max-tokens", required_argument, 0, OPT_MAX_TOKENS},
      {"queue", required_argument, 0, OPT_QUEUE},   {"help", no_argument, 0, 'h'},
      {"max-connections", required_argument, 0, OPT_MAX_CONNS},
      {"max-connections-per-address", required_argument, 0, OPT_MAX_PER_ADDR},
      {"header-timeout", required_argument, 0, OPT_HEADER_TIMEOUT},
      {"idle-timeout", required_argument, 0, OPT_IDLE_TIMEOUT},
      {0, 0, 0, 0}};
  static const struct option none[] = {{0, 0, 0, 0}};
  const int arc = st_engine_argv_aliases(argc, argv, "serve");
  if (arc) return arc;
  struct option *longopts = st_engine_longopts_with(own_ok ? own : none);
  if (!longopts) return st_set_error(ST_ENOMEM, "out of memory");
  const char *sep = *where ? ": " : "";
  opterr = 0;
  optind = 0; /* glibc: start afresh (this parser runs twice) */
  int c, rc = 0;
  while (!rc && (c = getopt_long(argc, argv, own_ok ? ":m:c:h" : ":c:", longopts, NULL)) != -1) {
    const int handled = st_engine_opt(c, optarg, &o->eo);
    if (handled) {
      rc = handled < 0 ? (*where ? st_error_context(handled, where) : handled) : 0;
      continue;
    }
    switch (c) {
    case OPT_CONFIG: o->config = optarg; break;
    case 'm': o->model = optarg; break;
    case OPT_HOST: o->host = optarg; break;
    case OPT_PORT:
      rc = st_parse_int("--port", optarg, 0, 65535, &o->port);
      o->have_port = 1;
      break;
    case OPT_NAME: o->name = optarg; break;
    case OPT_MAX_TOKENS: rc = st_parse_int("--max-tokens", optarg, 1, 1 << 30, &o->max_tokens); break;
    case OPT_QUEUE: rc = st_parse_int("--queue", optarg, 1, 1 << 20, &o->queue); break;
    case OPT_MAX_CONNS: rc = st_parse_int("--max-connections", optarg, 1, 1 << 16, &o->max_conns); break;
    case OPT_MAX_PER_ADDR: rc = st_parse_int("--max-connections-per-address", optarg, 1, 1 << 16, &o->max_per_addr); break;
    case OPT_HEADER_TIMEOUT: rc = st_parse_int("--header-timeout", optarg, 1, 3600, &o->header_timeout); break;
    case OPT_IDLE_TIMEOUT: rc = st_parse_int("--idle-timeout", optarg, 1, 86400, &o->idle_timeout); break;
    case 'h':
      serve_help(stdout);
      free(longopts);
      return 1;
    case ':': rc = st_set_error(ST_EINVAL, "%s%soption '%s' needs a value", where, sep, argv[optind - 1]); break;
    default:
      rc = st_set_error(ST_EINVAL, "%s%sunknown %s '%s' (see strata serve --help)", where, sep,
                        own_ok ? "option" : "engine flag", argv[optind - 1]);
    }
  }
  free(longopts);
  if (!rc && optind < argc)
    rc = st_set_error(ST_EINVAL, "%s%sunexpected argument '%s' (see strata serve --help)", where, sep, argv[optind]);
  return rc;
}

static char *name_from_path(const char *path) {
  const char *b = strrchr(path, '/');
  char *n = strdup(b ? b + 1 : path);
  size_t l = n ? strlen(n) : 0;
  if (l > 5 && !strcmp(n + l - 5, ".gguf")) n[l - 5] = 0;
  return n;
}

/* libmicrohttpd's error log (MHD_USE_ERROR_LOG), named as such on strata's stderr. Its "Application
 * reported internal error" is left out: the handler answers MHD_NO only where the client has left
 * (its job's log line says "client disconnected, stopped") or no memory was left for a response. */
static void mhd_log(void *cls, const char *fm, va_list ap) {
  (void)cls;
  char line[512];
  vsnprintf(line, sizeof line, fm, ap);
  if (strstr(line, "Application reported internal error")) return;
  const size_t n = strlen(line);
  fprintf(stderr, "strata serve: libmicrohttpd: %s%s", line, n && line[n - 1] == '\n' ? "" : "\n");
}

int st_cmd_serve(int argc, char **argv) {
  struct serve_opts o = {.queue = 64, .max_conns = 1024, .max_per_addr = 64, .header_timeout = 10, .idle_timeout = 600};
  struct st_config cfg = {0};
  struct server s = {0};
  struct MHD_Daemon *d = NULL;
  char *name_owned = NULL, *tmpl = NULL, where[600] = "";
  int worker_started = 0, mu_ready = 0;
  st_engine_opts_init(&o.eo);
  int rc = parse_args(argc, argv, &o, 1, "");
  if (rc == 1) return 0;
  if (!rc && o.config && o.model) rc = st_set_error(ST_EINVAL, "give either --config FILE or -m FILE, not both");
  if (!rc && !o.config && !o.model) rc = st_set_error(ST_EINVAL, "no model given (--config FILE.json or -m FILE)");
  if (!rc && o.config) {
    /* the config first, then the command line again so that its flags win */
    rc = st_config_load(o.config, &cfg);
    if (!rc) rc = st_config_apply_gpus(&cfg); /* before the args: it sets the visible GPUs and may add --layer-split */
    if (!rc && cfg.n_gpu > 0 && st_engine_visible_cards() < cfg.n_gpu)
      rc = st_set_error(ST_EINVAL, "%s: \"gpu\" lists %d GPU%s, and this process can use %d of them (check the numbers "
                        "against nvidia-smi, the driver and STARPU_NCUDA; \"gpu\": [] runs on the CPU pool)",
                        o.config, cfg.n_gpu, cfg.n_gpu == 1 ? "" : "s", st_engine_visible_cards());
    if (!rc) {
      char **av = calloc((size_t)cfg.n_args + 2, sizeof *av);
      if (!av) rc = st_set_error(ST_ENOMEM, "out of memory");
      if (!rc) {
        av[0] = "serve";
        memcpy(av + 1, cfg.args, sizeof *av * (size_t)cfg.n_args);
        snprintf(where, sizeof where, "%s: \"args\"", o.config);
        st_engine_opts_init(&o.eo);
        rc = parse_args(cfg.n_args + 1, av, &o, 0, where);
        free(av);
      }
      if (!rc) rc = parse_args(argc, argv, &o, 1, "");
    }
    if (!rc) {
      o.model = cfg.model;
      if (!o.host) o.host = cfg.host;
      if (!o.have_port) o.port = cfg.port;
      if (!o.name) o.name = cfg.name;
      if (!o.max_tokens) o.max_tokens = cfg.max_tokens;
    }
  } else if (!rc) {
    if (!o.host) o.host = "127.0.0.1";
    if (!o.have_port) o.port = 8080;
    if (!o.name) o.name = name_owned = name_from_path(o.model);
  }
  if (!rc) rc = st_engine_opts_check(&o.eo);

  /* the listening address, checked before the model loads */
  struct sockaddr_in a4 = {0};
  struct sockaddr_in6 a6 = {0};
  int v6 = 0;
  if (!rc) {
    if (inet_pton(AF_INET, o.host, &a4.sin_addr) == 1) {
      a4.sin_family = AF_INET;
      a4.sin_port = htons((uint16_t)o.port);
    } else if (inet_pton(AF_INET6, o.host, &a6.sin6_addr) == 1) {
      a6.sin6_family = AF_INET6;
      a6.sin6_port = htons((uint16_t)o.port);
      v6 = 1;
    } else {
      rc = st_set_error(ST_EINVAL, "--host expects an IPv4 or IPv6 address, got '%s'", o.host);
    }
  }
  /* a port in use (or an address not this host's) is found now, not after the model has loaded:
   * a trial bind, released at once (another process may still take it before the server binds) */
  if (!rc && o.port > 0) {
    const int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd >= 0) {
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4, v6 ? sizeof a6 : sizeof a4))
        rc = st_set_error(ST_EIO, "cannot listen on %s port %ld: %s", o.host, o.port, strerror(errno));
      close(fd);
    }
  }

  /* SIGINT/SIGTERM are taken by sigwait below; every thread started from here on blocks them */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);

  double t0 = st_now();
  if (!rc) rc = st_model_load(o.model, &s.model);
  if (!rc) {
    const struct st_hparams *hp = &s.model->hp;
    struct st_engine_opts eo = o.eo;
    eo.n_ctx = st_engine_ctx_size(hp, eo.n_ctx);
    st_cli_learn_begin(&s.learned, s.model, &eo, 1);
    s.learned_saved_at = st_now();
    rc = st_engine_create(s.model, &eo, &s.engine);
    if (!rc) st_cli_learn_say(&s.learned);
    if (!rc && !(s.logits = malloc(sizeof(float) * hp->n_vocab))) rc = st_set_error(ST_ENOMEM, "out of memory");
  }
  if (!rc) {
    const struct st_hparams *hp = &s.model->hp;
    s.n_ctx = s.engine->n_ctx;
    s.name = o.name;
    s.default_max_tokens = (int)o.max_tokens;
    s.queue_cap = (int)o.queue;
    s.max_conns = (int)o.max_conns;
    s.max_per_addr = (int)o.max_per_addr;
    s.header_timeout_s = (unsigned)o.header_timeout;
    s.idle_timeout_s = (unsigned)o.idle_timeout;
    s.stats = s.engine->stats;
    if (st_gguf_get_str(s.model->gguf, "tokenizer.chat_template", &tmpl)) tmpl = NULL;
    s.chat_kind = st_chat_template_detect(tmpl);
    const double kv_mib = st_engine_kv_bytes(s.engine) / 1048576.0;
    fprintf(stderr,
            "strata serve: loaded %s: %s, %u layers, %u experts (top-%u), vocab %u; context %d tokens "
            "(KV cache %s, %.*f MiB), prompt chunk %d tokens; %d CPU and %d CUDA workers; %.2f s\n",
            o.model, st_arch_of(hp->arch)->name, hp->n_layer, hp->n_expert, hp->n_expert_used, hp->n_vocab, s.engine->n_ctx,
            st_type_info((uint32_t)s.engine->kv_type)->name, st_mib_digits(kv_mib), kv_mib,
            s.engine->prefill, st_engine_n_cpu_workers(s.engine), st_engine_n_cuda_workers(s.engine),
            st_now() - t0);
    if (s.chat_kind != ST_CHAT_FALLBACK)
      fprintf(stderr, "strata serve: chat template: %s\n", st_chat_kind_name(s.chat_kind));
    else
      fprintf(stderr,
              "strata serve: the model's tokenizer.chat_template is %s, not one of the families strata renders: chats fall back "
              "to the ChatML rendering <|im_start|>{role}\\n{content}<|im_end|>\\n\n",
              tmpl ? "another family's" : "absent");
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.work_cv, NULL);
    mu_ready = 1;
    if (pthread_create(&s.worker, NULL, st_serve_worker_main, &s))
      rc = st_set_error(ST_ERUNTIME, "cannot start the worker thread");
    else
      worker_started = 1;
  }
  if (!rc) {
    /* a descriptor per connection: room for the limits */
    struct rlimit nofile;
    if (!getrlimit(RLIMIT_NOFILE, &nofile) && nofile.rlim_cur < nofile.rlim_max &&
        nofile.rlim_cur < (rlim_t)(s.max_conns + 64 + 256)) {
      nofile.rlim_cur = nofile.rlim_max < (rlim_t)(s.max_conns + 64 + 256) ? nofile.rlim_max : (rlim_t)(s.max_conns + 64 + 256);
      setrlimit(RLIMIT_NOFILE, &nofile);
    }
    d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
                             MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0),
                         (uint16_t)o.port, NULL, NULL, st_serve_on_request, &s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                         NULL /* first: libmicrohttpd logs the options after it through it */, MHD_OPTION_SOCK_ADDR,
                         v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4, MHD_OPTION_NOTIFY_COMPLETED,
                         st_serve_on_completed, &s, MHD_OPTION_NOTIFY_CONNECTION, st_serve_on_connection, &s,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s.max_conns + 64),
                         MHD_OPTION_CONNECTION_TIMEOUT, s.header_timeout_s, MHD_OPTION_THREAD_STACK_SIZE,
                         (size_t)1 << 20, MHD_OPTION_END);
    if (!d) rc = st_set_error(ST_EIO, "cannot listen on %s port %ld (in use, or not an address of this host?)", o.host, o.port);
  }
  if (!rc) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "strata serve: listening on http://%s%s%s:%u (model id '%s', queue %d; connections: %d, %d per "
            "address, headers within %u s, idle %u s)\n", v6 ? "[" : "", o.host, v6 ? "]" : "",
            di ? di->port : (unsigned)o.port, s.name, s.queue_cap, s.max_conns, s.max_per_addr, s.header_timeout_s,
            s.idle_timeout_s);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "strata serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  }
  if (mu_ready) {
    pthread_mutex_lock(&s.mu);
    s.stopping = 1;
    for (struct job *j = s.head; j; j = j->next) pthread_cond_broadcast(&j->cv);
    pthread_cond_broadcast(&s.work_cv);
    pthread_mutex_unlock(&s.mu);
  }
  if (worker_started) pthread_join(s.worker, NULL);
  if (s.engine) st_cli_learn_save(&s.learned, s.engine); /* the worker has stopped: its counts are final */
  st_learned_close(&s.learned);
  if (d) MHD_stop_daemon(d);
  free(s.addrs);
  if (mu_ready) {
    pthread_cond_destroy(&s.work_cv);
    pthread_mutex_destroy(&s.mu);
  }
  if (rc) fprintf(stderr, "strata serve: %s\n", st_last_error());
  free(s.logits);
  st_engine_destroy(s.engine);
  st_model_free(s.model);
  free(tmpl);
  free(name_owned);
  st_config_free(&cfg);
  return rc ? 1 : 0;
}
