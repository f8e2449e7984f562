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

#include "cli/cli.h"
#include "common.h"
#include "graph/engine.h"
#include "graph/sampler.h"
#include "io/chat_template.h"
#include "io/config.h"
#include "io/gguf.h"
#include "io/model.h"
#include "io/tokenizer.h"

#define MAX_BODY_BYTES (16u << 20) /* a request body larger than this gets 413 */
#define MAX_STOPS 16

struct buf {
  char *s;
  size_t n, cap;
  int oom;
};

static void buf_add(struct buf *b, const char *s, size_t l) {
  if (b->oom) return;
  if (b->n + l + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (b->n + l + 1 > cap) cap *= 2;
    char *ns = realloc(b->s, cap);
    if (!ns) {
      b->oom = 1;
      return;
    }
    b->s = ns;
    b->cap = cap;
  }
  memcpy(b->s + b->n, s, l);
  b->n += l;
  b->s[b->n] = 0;
}

enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE };
enum job_kind { JOB_CHAT, JOB_COMPLETION };

/* One request. Shared by its connection and the worker (refs, under server.mu). */
struct job {
  struct job *next;
  int refs;
  enum job_state state;
  int cancelled;  /* the client went away: stop generating */
  enum job_kind kind;
  int stream, include_usage, ignore_eos;
  uint64_t seq;
  char id[48];
  long created;
  int32_t *ids;
  size_t n_ids;
  int max_tokens;
  float temp, top_p;
  int top_k;
  uint64_t seed;
  char *stops[MAX_STOPS];
  int n_stops;
  /* results, written by the worker */
  struct buf text;   /* generated text (after stop-string handling) */
  struct buf events; /* server-sent events for a streaming job */
  size_t events_read;
  int n_gen;
  const char *finish; /* "stop" or "length" */
  char *error;        /* engine failure, or NULL */
  pthread_cond_t cv;
};

struct server {
  struct st_model *model;
  struct st_engine *engine; /* used by the worker thread only */
  const char *name;
  int n_ctx, default_max_tokens, queue_cap;
  enum st_chat_kind chat_kind;
  float *logits;

  pthread_mutex_t mu;
  pthread_cond_t work_cv;
  struct job *head, *tail;
  int n_queued, stopping;
  uint64_t next_seq;
  pthread_t worker;

  /* open connections (under mu): in all, and per client address (a short list: most come from few) */
  int max_conns, max_per_addr;
  unsigned header_timeout_s, idle_timeout_s;
  int n_conns;
  struct addr_count *addrs;
  int n_addrs, cap_addrs;
  uint64_t refused_conns;

  /* metrics, under mu */
  uint64_t requests_total, requests_failed, prompt_tokens_total, generated_tokens_total;
  uint64_t http_errors;
  double last_tps;
  struct st_engine_stats stats; /* a copy of the engine's after the last request */
};

/* Open connections from one client address (the address bytes, IPv4 or IPv6). */
struct addr_count {
  unsigned char addr[16];
  int len, n;
};

/* Per-socket state (MHD's socket context): its address and whether it was over a limit when it
 * opened (its request then gets 503). */
struct sock {
  unsigned char addr[16];
  int len;
  int over; /* 0, 1: the server's limit, 2: the address's */
};

/* Per-connection request state: the body as it arrives. */
struct conn {
  struct buf body;
  int too_big;
};

/* ---- jobs and the queue ---- */

static void job_unref_locked(struct job *j) {
  if (--j->refs > 0) return;
  free(j->ids);
  for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
  free(j->text.s);
  free(j->events.s);
  free(j->error);
  pthread_cond_destroy(&j->cv);
  free(j);
}

/* The client is gone: a queued job leaves the queue at once (its slot is free), a running one
 * stops at the next token. */
static void job_cancel_locked(struct server *s, struct job *j) {
  j->cancelled = 1;
  if (j->state != JOB_QUEUED) return;
  struct job **p = &s->head, *prev = NULL;
  while (*p && *p != j) prev = *p, p = &(*p)->next;
  if (*p) {
    *p = j->next;
    if (s->tail == j) s->tail = prev;
    s->n_queued--;
    j->state = JOB_DONE;
    job_unref_locked(j); /* the queue's reference */
  }
}

/* Appends one server-sent event `data: <json>\n\n` (json is freed). */
static void job_event(struct server *s, struct job *j, char *json) {
  pthread_mutex_lock(&s->mu);
  if (json) {
    buf_add(&j->events, "data: ", 6);
    buf_add(&j->events, json, strlen(json));
    buf_add(&j->events, "\n\n", 2);
  }
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&s->mu);
  free(json);
}

static cJSON *chunk_base(const struct server *s, const struct job *j) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", j->id);
  cJSON_AddStringToObject(o, "object", j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion");
  cJSON_AddNumberToObject(o, "created", (double)j->created);
  cJSON_AddStringToObject(o, "model", s->name);
  return o;
}

static cJSON *usage_json(const struct job *j) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->n_ids);
  cJSON_AddNumberToObject(u, "completion_tokens", j->n_gen);
  cJSON_AddNumberToObject(u, "total_tokens", (double)j->n_ids + j->n_gen);
  return u;
}

/* A streaming chunk carrying `text` (or, for a chat, the role when role != 0), or the final
 * chunk with finish_reason when finish != NULL. */
static void stream_chunk(struct server *s, struct job *j, const char *text, int role, const char *finish) {
  cJSON *o = chunk_base(s, j);
  cJSON *choices = cJSON_AddArrayToObject(o, "choices");
  cJSON *c = cJSON_CreateObject();
  cJSON_AddItemToArray(choices, c);
  cJSON_AddNumberToObject(c, "index", 0);
  if (j->kind == JOB_CHAT) {
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (role) cJSON_AddStringToObject(d, "role", "assistant");
    if (text) cJSON_AddStringToObject(d, "content", text);
  } else {
    cJSON_AddStringToObject(c, "text", text ? text : "");
    cJSON_AddNullToObject(c, "logprobs");
  }
  if (finish)
    cJSON_AddStringToObject(c, "finish_reason", finish);
  else
    cJSON_AddNullToObject(c, "finish_reason");
  job_event(s, j, cJSON_PrintUnformatted(o));
  cJSON_Delete(o);
}

/* Length of the longest suffix of text[0..n) that starts one of the stop strings (held back from
 * streaming until it either completes a stop string or stops matching). */
static size_t stop_prefix_len(const struct job *j, const char *text, size_t n) {
  size_t best = 0;
  for (int k = 0; k < j->n_stops; k++) {
    const size_t ls = strlen(j->stops[k]);
    for (size_t l = ls - 1 < n ? ls - 1 : n; l > best; l--)
      if (!memcmp(text + n - l, j->stops[k], l)) {
        best = l;
        break;
      }
  }
  return best;
}

/* Runs one job on the engine (worker thread). */
static void run_job(struct server *s, struct job *j) {
  struct st_engine *e = s->engine;
  const struct st_tokenizer *tok = s->model->tok;
  const int32_t n_vocab = (int32_t)s->model->hp.n_vocab;
  const int32_t eos = st_tokenizer_eos(tok), eot = st_tokenizer_eot(tok);
  const struct st_engine_stats before = e->stats;
  const size_t piece_cap = 3 * (st_tokenizer_max_token_bytes(tok) + 4) + 1;
  char *piece = malloc(piece_cap);
  struct st_sampler smp;
  struct st_detok dt;
  st_sampler_init(&smp, j->temp, j->top_k, j->top_p, j->seed);
  st_detok_init(&dt, tok);
  size_t sent = 0; /* bytes of j->text already streamed */
  int cancelled = 0, stopped = 0;
  size_t max_stop = 0;
  for (int k = 0; k < j->n_stops; k++)
    if (strlen(j->stops[k]) > max_stop) max_stop = strlen(j->stops[k]);
  j->finish = "length";

  if (j->stream && j->kind == JOB_CHAT) stream_chunk(s, j, "", 1, NULL);
  st_engine_reset(e);
  double t0 = st_now();
  int rc = piece ? st_engine_eval(e, j->ids, (int)j->n_ids, s->logits, 0) : st_set_error(ST_ENOMEM, "out of memory");
  const double t_prompt = st_now() - t0;
  t0 = st_now();
  while (!rc && j->n_gen < j->max_tokens) {
    pthread_mutex_lock(&s->mu);
    cancelled = j->cancelled;
    const int stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    if (stopping && !cancelled) rc = st_set_error(ST_ERUNTIME, "the server is shutting down");
    if (cancelled || stopping) break;
    int32_t id = st_sampler_sample(&smp, s->logits, n_vocab);
    if (id < 0) {
      rc = st_set_error(ST_ENOMEM, "out of memory sampling");
      break;
    }
    if (!j->ignore_eos && (id == eos || id == eot)) {
      j->finish = "stop";
      break;
    }
    j->n_gen++;
    size_t l = 0;
    if (st_tokenizer_is_special(tok, id)) {
      /* control tokens are not text; Qwen3's reasoning markers are shown as llama.cpp shows them */
      int b = st_tokenizer_token_bytes(tok, id, piece, piece_cap - 1);
      if (b > 0 && ((b == 7 && !memcmp(piece, "<think>", 7)) || (b == 8 && !memcmp(piece, "</think>", 8))))
        l = (size_t)b;
    } else {
      l = st_detok_push(&dt, id, piece, piece_cap);
    }
    const int last = j->n_gen == j->max_tokens || e->n_past >= e->n_ctx;
    if (last) l += st_detok_flush(&dt, piece + l, piece_cap - l);
    if (l) {
      const size_t from = j->text.n > max_stop ? j->text.n - max_stop : 0;
      buf_add(&j->text, piece, l);
      /* a stop string ends the text before it; only one that ends in the new piece is new */
      for (int k = 0; k < j->n_stops && j->text.s; k++) {
        const char *hit = strstr(j->text.s + from, j->stops[k]);
        if (hit && (size_t)(hit - j->text.s) < j->text.n) {
          j->text.n = (size_t)(hit - j->text.s);
          j->text.s[j->text.n] = 0;
          stopped = 1;
        }
      }
    }
    if (j->stream) {
      const size_t hold = stopped || last ? 0 : stop_prefix_len(j, j->text.s ? j->text.s : "", j->text.n);
      if (j->text.n - hold > sent) {
        char save = j->text.s[j->text.n - hold];
        j->text.s[j->text.n - hold] = 0;
        stream_chunk(s, j, j->text.s + sent, 0, NULL);
        j->text.s[j->text.n - hold] = save;
        sent = j->text.n - hold;
      }
    }
    if (stopped) {
      j->finish = "stop";
      break;
    }
    if (last) break;
    rc = st_engine_eval(e, &id, 1, s->logits, 0);
  }
  if (!rc && !stopped && !cancelled) {
    size_t l = piece ? st_detok_flush(&dt, piece, piece_cap) : 0;
    if (l) buf_add(&j->text, piece, l);
    if (j->stream && j->text.n > sent) stream_chunk(s, j, j->text.s + sent, 0, NULL);
  }
  const double t_gen = st_now() - t0;
  const double tps = t_gen > 0 && j->n_gen ? j->n_gen / t_gen : 0.0;
  if (j->text.oom && !rc) rc = st_set_error(ST_ENOMEM, "out of memory for the generated text");
  if (rc && (j->error = strdup(st_last_error()))) st_utf8_sanitize(j->error, strlen(j->error) + 1);
  if (j->stream && !cancelled) {
    if (rc) {
      cJSON *o = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(o, "error");
      cJSON_AddStringToObject(err, "message", j->error ? j->error : "engine failure");
      cJSON_AddStringToObject(err, "type", "server_error");
      cJSON_AddNullToObject(err, "code");
      job_event(s, j, cJSON_PrintUnformatted(o));
      cJSON_Delete(o);
    } else {
      stream_chunk(s, j, NULL, 0, j->finish);
      if (j->include_usage) {
        cJSON *o = chunk_base(s, j);
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_json(j));
        job_event(s, j, cJSON_PrintUnformatted(o));
        cJSON_Delete(o);
      }
    }
    pthread_mutex_lock(&s->mu);
    buf_add(&j->events, "data: [DONE]\n\n", 14);
    pthread_mutex_unlock(&s->mu);
  }
  free(piece);

  const struct st_engine_stats *st = &e->stats;
  char tiers[1024];
  st_engine_tier_report(e, NULL, &before, tiers, sizeof tiers);
  fprintf(stderr,
          "strata serve: request %llu (%s%s): prompt %zu tokens in %.3f s, generated %d tokens in %.3f s "
          "(%.2f tok/s), %s; %s; host->device %.1f MiB\n",
          (unsigned long long)j->seq, j->kind == JOB_CHAT ? "chat" : "completion", j->stream ? ", stream" : "",
          j->n_ids, t_prompt, j->n_gen, t_gen, tps,
          rc ? "failed" : cancelled ? "client disconnected, stopped" : j->finish,
          tiers, (st->h2d_bytes - before.h2d_bytes) / 1048576.0);
  pthread_mutex_lock(&s->mu);
  s->requests_total++;
  s->requests_failed += rc != 0;
  s->prompt_tokens_total += j->n_ids;
  s->generated_tokens_total += (uint64_t)j->n_gen;
  s->last_tps = tps;
  s->stats = *st;
  pthread_mutex_unlock(&s->mu);
}

static void *worker_main(void *arg) {
  struct server *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    /* an idle server pauses StarPU's workers, which otherwise poll for tasks on every core */
    if (!s->stopping && !s->head) st_engine_pause(s->engine, 1);
    while (!s->stopping && !s->head) pthread_cond_wait(&s->work_cv, &s->mu);
    st_engine_pause(s->engine, 0);
    if (s->stopping) break;
    struct job *j = s->head;
    s->head = j->next;
    if (!s->head) s->tail = NULL;
    s->n_queued--;
    j->state = JOB_RUNNING;
    pthread_mutex_unlock(&s->mu);
    run_job(s, j);
    pthread_mutex_lock(&s->mu);
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    job_unref_locked(j);
  }
  /* shutting down: whatever still waits is answered with an error */
  while (s->head) {
    struct job *j = s->head;
    s->head = j->next;
    s->n_queued--;
    if (!j->error) j->error = strdup("the server is shutting down");
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    job_unref_locked(j);
  }
  s->tail = NULL;
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* ---- HTTP ---- */

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type, char *body) {
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  enum MHD_Result ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, cJSON *o) {
  char *body = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!body) return MHD_NO;
  return send_text(c, status, "application/json", body);
}

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}. */
__attribute__((format(printf, 5, 6))) static enum MHD_Result
send_error(struct server *s, struct MHD_Connection *c, unsigned status, const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  st_utf8_sanitize(msg, sizeof msg); /* it may quote the client's bytes (model, role, URL) */
  pthread_mutex_lock(&s->mu);
  s->http_errors++;
  pthread_mutex_unlock(&s->mu);
  cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
  cJSON_AddStringToObject(e, "message", msg);
  cJSON_AddStringToObject(e, "type", status >= 500 ? "server_error" : "invalid_request_error");
  cJSON_AddNullToObject(e, "param");
  if (code)
    cJSON_AddStringToObject(e, "code", code);
  else
    cJSON_AddNullToObject(e, "code");
  return send_json(c, status, o);
}

static enum MHD_Result handle_models(struct server *s, struct MHD_Connection *c) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON *d = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
  cJSON_AddItemToArray(d, m);
  cJSON_AddStringToObject(m, "id", s->name);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", 0);
  cJSON_AddStringToObject(m, "owned_by", "strata");
  cJSON_AddNumberToObject(m, "context_length", s->n_ctx);
  return send_json(c, MHD_HTTP_OK, o);
}

static enum MHD_Result handle_metrics(struct server *s, struct MHD_Connection *c) {
  struct buf b = {0};
  char line[512];
  pthread_mutex_lock(&s->mu);
  const struct st_engine_stats st = s->stats;
  const uint64_t req = s->requests_total, failed = s->requests_failed, pt = s->prompt_tokens_total,
                 gt = s->generated_tokens_total, herr = s->http_errors;
  const double tps = s->last_tps;
  const int queued = s->n_queued, open_conns = s->n_conns;
  const uint64_t refused = s->refused_conns;
  pthread_mutex_unlock(&s->mu);
  const uint64_t routed = st.expert_entries[ST_TIER_CPU_POOL] + st_stats_gpu_entries(&st);
#define METRIC(name, type, help, fmt, ...)                                                              \
  do {                                                                                                  \
    snprintf(line, sizeof line, "# HELP " name " " help "\n# TYPE " name " " type "\n" name fmt "\n", \
             __VA_ARGS__);                                                                              \
    buf_add(&b, line, strlen(line));                                                                    \
  } while (0)
  METRIC("strata_requests_total", "counter", "Completion requests run.", " %llu", (unsigned long long)req);
  METRIC("strata_requests_failed_total", "counter", "Completion requests the engine failed.", " %llu",
         (unsigned long long)failed);
  METRIC("strata_http_errors_total", "counter", "HTTP requests answered with an error status.", " %llu",
         (unsigned long long)herr);
  METRIC("strata_prompt_tokens_total", "counter", "Prompt tokens evaluated.", " %llu", (unsigned long long)pt);
  METRIC("strata_generated_tokens_total", "counter", "Tokens generated.", " %llu", (unsigned long long)gt);
  METRIC("strata_last_request_tokens_per_second", "gauge", "Decode speed of the last request, tokens/s.", " %.3f",
         tps);
  {
    const struct st_placement *pl = &s->engine->placement;
    const char *hdr = "# HELP strata_expert_entries_total (token, expert) rows computed per tier.\n"
                      "# TYPE strata_expert_entries_total counter\n";
    buf_add(&b, hdr, strlen(hdr));
    for (int t = 0; t <= pl->n_caches; t++) {
      snprintf(line, sizeof line, "strata_expert_entries_total{tier=\"%s\"} %llu\n", st_placement_tier_name(pl, t),
               (unsigned long long)st.expert_entries[t]);
      buf_add(&b, line, strlen(line));
    }
  }
  METRIC("strata_cache_routed_share", "gauge", "Share of routed expert entries served by the GPU expert caches.",
         " %.6f", routed ? (double)st_stats_gpu_entries(&st) / routed : 0.0);
  METRIC("strata_host_to_device_bytes_total", "counter", "Bytes moved from main RAM to CUDA devices.", " %llu",
         (unsigned long long)st.h2d_bytes);
  METRIC("strata_queue_length", "gauge", "Requests waiting for the engine.", " %d", queued);
  METRIC("strata_connections_open", "gauge", "Open HTTP connections.", " %d", open_conns);
  METRIC("strata_connections_over_limit_total", "counter",
         "Connections opened past --max-connections or --max-connections-per-address (their requests get 503).", " %llu",
         (unsigned long long)refused);
#undef METRIC
  if (b.oom) {
    free(b.s);
    return MHD_NO;
  }
  return send_text(c, MHD_HTTP_OK, "text/plain; version=0.0.4", b.s);
}

/* Text of a message's "content": a string, null, or an array of {"type": "text", "text"} parts
 * (concatenated into *owned). NULL with a message in err when the shape is wrong. */
static const char *content_text(const cJSON *v, char **owned, char *err, size_t errcap, size_t i) {
  *owned = NULL;
  if (!v || cJSON_IsNull(v)) return "";
  if (cJSON_IsString(v)) return v->valuestring;
  if (!cJSON_IsArray(v)) {
    snprintf(err, errcap, "messages[%zu].content must be a string or an array of text parts", i);
    return NULL;
  }
  struct buf b = {0};
  buf_add(&b, "", 0);
  for (const cJSON *p = v->child; p; p = p->next) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (!cJSON_IsObject(p) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(t)) {
      snprintf(err, errcap, "messages[%zu].content: only parts of type \"text\" with a string \"text\" are supported", i);
      free(b.s);
      return NULL;
    }
    buf_add(&b, t->valuestring, strlen(t->valuestring));
  }
  if (b.oom) {
    snprintf(err, errcap, "out of memory");
    free(b.s);
    return NULL;
  }
  return *owned = b.s;
}

/* 1 when the client of `c` has closed its end (a peek reads end-of-file). */
static int client_gone(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return 0;
  char b;
  ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max);
static void stream_free(void *cls);

struct stream_ctx {
  struct server *s;
  struct job *j;
};

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
  struct stream_ctx *x = cls;
  struct server *s = x->s;
  struct job *j = x->j;
  ssize_t n = 0;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (j->events_read < j->events.n) {
      size_t k = j->events.n - j->events_read;
      if (k > max) k = max;
      memcpy(out, j->events.s + j->events_read, k);
      j->events_read += k;
      n = (ssize_t)k;
      break;
    }
    if (j->state == JOB_DONE) {
      n = j->error && !j->events.n ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
      break;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    if (pthread_cond_timedwait(&j->cv, &s->mu, &ts) == ETIMEDOUT && j->events_read == j->events.n &&
        j->state != JOB_DONE && max >= 3) {
      /* an SSE comment while waiting: keeps proxies patient and finds a client that left */
      memcpy(out, ":\n\n", 3);
      n = 3;
      break;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return n;
}

static void stream_free(void *cls) {
  struct stream_ctx *x = cls;
  pthread_mutex_lock(&x->s->mu);
  if (x->j->state != JOB_DONE) job_cancel_locked(x->s, x->j);
  job_unref_locked(x->j);
  pthread_mutex_unlock(&x->s->mu);
  free(x);
}

/* Reads an optional number field into *out; 0, or -1 after sending a 400. */
#define GET_NUM(field, lo, hi, whole, out)                                                                  \
  do {                                                                                                      \
    const cJSON *v_ = cJSON_GetObjectItemCaseSensitive(req, field);                                         \
    if (v_ && !cJSON_IsNull(v_)) {                                                                          \
      if (!cJSON_IsNumber(v_) || v_->valuedouble < (lo) || v_->valuedouble > (hi) ||                        \
          ((whole) && v_->valuedouble != (double)(long long)v_->valuedouble)) {                             \
        ret = send_error(s, c, 400, "invalid_type", "'%s' must be a %s between %.15g and %.15g", field,           \
                         (whole) ? "whole number" : "number", (double)(lo), (double)(hi));                  \
        goto done;                                                                                          \
      }                                                                                                     \
      out = v_->valuedouble;                                                                                \
    }                                                                                                       \
  } while (0)

static enum MHD_Result handle_completion(struct server *s, struct MHD_Connection *c, struct conn *cn,
                                         enum job_kind kind) {
  enum MHD_Result ret = MHD_NO;
  char *prompt_owned = NULL, err[512];
  struct job *j = NULL;
  cJSON *req = cn->body.s ? cJSON_ParseWithLength(cn->body.s, cn->body.n) : NULL;
  if (!req) return send_error(s, c, 400, "invalid_json", "the request body is not valid JSON");
  if (!cJSON_IsObject(req)) {
    ret = send_error(s, c, 400, "invalid_json", "the request body must be a JSON object");
    goto done;
  }
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(req, "model");
  if (model && !cJSON_IsNull(model)) {
    if (!cJSON_IsString(model)) {
      ret = send_error(s, c, 400, "invalid_type", "'model' must be a string");
      goto done;
    }
    if (strcmp(model->valuestring, s->name)) {
      ret = send_error(s, c, 404, "model_not_found", "The model '%s' does not exist; this server serves '%s'",
                       model->valuestring, s->name);
      goto done;
    }
  }
  if (!(j = calloc(1, sizeof *j))) {
    ret = send_error(s, c, 500, NULL, "out of memory");
    goto done;
  }
  j->refs = 1;
  j->kind = kind;
  pthread_cond_init(&j->cv, NULL);
  double max_tokens = -1, temp = 0.8, top_p = 0.95, top_k = 40, seed = -1, n = 1; /* as strata generate */
  GET_NUM("max_tokens", 1, 1 << 30, 1, max_tokens);
  GET_NUM("max_completion_tokens", 1, 1 << 30, 1, max_tokens);
  GET_NUM("temperature", 0, 100, 0, temp);
  GET_NUM("top_p", 0, 1, 0, top_p);
  GET_NUM("top_k", 0, 1 << 30, 1, top_k);
  GET_NUM("seed", -9.2e18, 9.2e18, 1, seed);
  GET_NUM("n", 1, 1, 1, n);
  (void)n;
  const struct {
    const char *name;
    int *out;
  } bools[] = {{"stream", &j->stream}, {"ignore_eos", &j->ignore_eos}};
  for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, bools[i].name);
    if (v && !cJSON_IsNull(v)) {
      if (!cJSON_IsBool(v)) {
        ret = send_error(s, c, 400, "invalid_type", "'%s' must be true or false", bools[i].name);
        goto done;
      }
      *bools[i].out = cJSON_IsTrue(v);
    }
  }
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(req, "stream_options");
  if (so && cJSON_IsObject(so)) j->include_usage = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
  const cJSON *stop = cJSON_GetObjectItemCaseSensitive(req, "stop");
  if (stop && !cJSON_IsNull(stop)) {
    if (cJSON_IsString(stop)) {
      if (*stop->valuestring) j->stops[j->n_stops++] = strdup(stop->valuestring);
    } else if (cJSON_IsArray(stop) && cJSON_GetArraySize(stop) <= MAX_STOPS) {
      for (const cJSON *v = stop->child; v; v = v->next) {
        if (!cJSON_IsString(v)) {
          ret = send_error(s, c, 400, "invalid_type", "'stop' must be a string or an array of strings");
          goto done;
        }
        if (*v->valuestring) j->stops[j->n_stops++] = strdup(v->valuestring);
      }
    } else {
      ret = send_error(s, c, 400, "invalid_type", "'stop' must be a string or an array of at most %d strings",
                       MAX_STOPS);
      goto done;
    }
  }

  /* the prompt: a rendered chat, a text, or token ids */
  const char *text = NULL;
  if (kind == JOB_CHAT) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (!msgs) {
      ret = send_error(s, c, 400, "missing_field", "'messages' is required");
      goto done;
    }
    if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs)) {
      ret = send_error(s, c, 400, "invalid_type", "'messages' must be a non-empty array of messages");
      goto done;
    }
    const size_t nm = (size_t)cJSON_GetArraySize(msgs);
    struct st_chat_msg *m = calloc(nm, sizeof *m);
    char **owned = calloc(nm, sizeof *owned);
    size_t i = 0;
    int bad = !m || !owned;
    if (bad) snprintf(err, sizeof err, "out of memory");
    for (const cJSON *v = msgs->child; v && !bad; v = v->next, i++) {
      const cJSON *role = cJSON_GetObjectItemCaseSensitive(v, "role");
      if (!cJSON_IsObject(v) || !cJSON_IsString(role)) {
        snprintf(err, sizeof err, "messages[%zu] must be an object with a string 'role'", i);
        bad = 1;
        break;
      }
      m[i].role = role->valuestring;
      m[i].content = content_text(cJSON_GetObjectItemCaseSensitive(v, "content"), &owned[i], err, sizeof err, i);
      bad = !m[i].content;
    }
    int think = 1;
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(req, "enable_thinking");
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs");
    if (!et && cJSON_IsObject(kw)) et = cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking");
    if (et && cJSON_IsBool(et)) think = cJSON_IsTrue(et);
    if (!bad && st_chat_render(m, nm, 1, think, &prompt_owned)) {
      snprintf(err, sizeof err, "%s", st_last_error());
      bad = 1;
    }
    for (size_t k = 0; owned && k < nm; k++) free(owned[k]);
    free(owned);
    free(m);
    if (bad) {
      ret = send_error(s, c, 400, "invalid_value", "%s", err);
      goto done;
    }
    text = prompt_owned;
  } else {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    if (!p) {
      ret = send_error(s, c, 400, "missing_field", "'prompt' is required");
      goto done;
    }
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
    if (cJSON_IsString(p)) {
      text = p->valuestring;
    } else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && cJSON_IsNumber(p->child)) {
      j->n_ids = (size_t)cJSON_GetArraySize(p);
      if (!(j->ids = malloc(sizeof *j->ids * j->n_ids))) {
        ret = send_error(s, c, 500, NULL, "out of memory");
        goto done;
      }
      size_t i = 0;
      for (const cJSON *v = p->child; v; v = v->next, i++) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= s->model->hp.n_vocab ||
            v->valuedouble != (double)(int32_t)v->valuedouble) {
          ret = send_error(s, c, 400, "invalid_value", "prompt[%zu] is not a token id of this model (0..%u)", i,
                           s->model->hp.n_vocab - 1);
          goto done;
        }
        j->ids[i] = (int32_t)v->valuedouble;
      }
    } else {
      ret = send_error(s, c, 400, "invalid_type",
                       "'prompt' must be a string, an array of one string, or an array of token ids");
      goto done;
    }
  }
  if (text && st_tokenizer_encode(s->model->tok, text, strlen(text), 1, &j->ids, &j->n_ids)) {
    ret = send_error(s, c, 500, NULL, "tokenizer: %s", st_last_error());
    goto done;
  }
  if (j->n_ids == 0) {
    ret = send_error(s, c, 400, "invalid_value", "the prompt has no tokens");
    goto done;
  }
  if ((long long)j->n_ids >= s->n_ctx) {
    ret = send_error(s, c, 400, "context_length_exceeded",
                     "the prompt has %zu tokens; this model's context is %d tokens (prompt + max_tokens must fit)",
                     j->n_ids, s->n_ctx);
    goto done;
  }
  const long room = s->n_ctx - (long)j->n_ids;
  if (max_tokens > 0 && max_tokens > room) {
    ret = send_error(s, c, 400, "context_length_exceeded",
                     "prompt (%zu tokens) + max_tokens (%.0f) is more than this model's context of %d tokens",
                     j->n_ids, max_tokens, s->n_ctx);
    goto done;
  }
  j->max_tokens = max_tokens > 0 ? (int)max_tokens
                  : s->default_max_tokens > 0 && s->default_max_tokens < room ? s->default_max_tokens
                                                                               : (int)room;
  j->temp = (float)temp;
  j->top_p = (float)top_p;
  j->top_k = (int)top_k;
  j->created = (long)time(NULL);

  /* into the queue */
  pthread_mutex_lock(&s->mu);
  if (s->stopping || s->n_queued >= s->queue_cap) {
    const int stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    ret = send_error(s, c, 503, stopping ? "shutting_down" : "queue_full",
                     stopping ? "the server is shutting down" : "the server is busy: %d requests are queued; retry later",
                     s->queue_cap);
    goto done;
  }
  j->seq = ++s->next_seq;
  j->seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) * 6364136223846793005ull + j->seq;
  snprintf(j->id, sizeof j->id, "%s-%llu-%04x", kind == JOB_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)j->seq,
           (unsigned)(j->created & 0xffff));
  j->refs = 2; /* the connection's and the queue's */
  if (s->tail)
    s->tail->next = j;
  else
    s->head = j;
  s->tail = j;
  s->n_queued++;
  pthread_cond_signal(&s->work_cv);

  if (j->stream) {
    pthread_mutex_unlock(&s->mu);
    struct stream_ctx *x = malloc(sizeof *x);
    struct MHD_Response *r =
        x ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, x, stream_free) : NULL;
    if (!r) {
      pthread_mutex_lock(&s->mu);
      job_cancel_locked(s, j);
      job_unref_locked(j);
      pthread_mutex_unlock(&s->mu);
      free(x);
      j = NULL;
      ret = MHD_NO;
      goto done;
    }
    *x = (struct stream_ctx){s, j};
    j = NULL; /* the response owns the connection's reference now */
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    goto done;
  }

  /* not streaming: wait for the result, watching for a client that leaves */
  while (j->state != JOB_DONE) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    if (pthread_cond_timedwait(&j->cv, &s->mu, &ts) == ETIMEDOUT && !j->cancelled && client_gone(c))
      job_cancel_locked(s, j);
  }
  const int cancelled = j->cancelled;
  pthread_mutex_unlock(&s->mu);
  if (cancelled) {
    ret = MHD_NO; /* nobody to answer */
    goto done;
  }
  if (j->error) {
    ret = send_error(s, c, 500, NULL, "%s", j->error);
    goto done;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", j->id);
  cJSON_AddStringToObject(o, "object", kind == JOB_CHAT ? "chat.completion" : "text_completion");
  cJSON_AddNumberToObject(o, "created", (double)j->created);
  cJSON_AddStringToObject(o, "model", s->name);
  cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
  cJSON_AddItemToArray(choices, ch);
  cJSON_AddNumberToObject(ch, "index", 0);
  if (kind == JOB_CHAT) {
    cJSON *msg = cJSON_AddObjectToObject(ch, "message");
    cJSON_AddStringToObject(msg, "role", "assistant");
    cJSON_AddStringToObject(msg, "content", j->text.s ? j->text.s : "");
  } else {
    cJSON_AddStringToObject(ch, "text", j->text.s ? j->text.s : "");
  }
  cJSON_AddNullToObject(ch, "logprobs");
  cJSON_AddStringToObject(ch, "finish_reason", j->finish);
  cJSON_AddItemToObject(o, "usage", usage_json(j));
  ret = send_json(c, MHD_HTTP_OK, o);

done:
  if (j) {
    pthread_mutex_lock(&s->mu);
    job_unref_locked(j);
    pthread_mutex_unlock(&s->mu);
  }
  free(prompt_owned);
  cJSON_Delete(req);
  return ret;
}

/* The address bytes of a client (IPv4: 4, IPv6: 16), or 0. */
static int addr_key(const struct sockaddr *sa, unsigned char *out) {
  if (!sa) return 0;
  if (sa->sa_family == AF_INET) {
    memcpy(out, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    return 4;
  }
  if (sa->sa_family == AF_INET6) {
    memcpy(out, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
    return 16;
  }
  return 0;
}

/* Counts connections in and out (MHD_OPTION_NOTIFY_CONNECTION); a connection over the server's or
 * its address's limit is kept until its request arrives, which gets 503, or until the header
 * timeout closes it: a client that opens many connections and sends nothing blocks nobody else
 * for longer than that. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
  struct server *s = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    struct sock *k = calloc(1, sizeof *k);
    *socket_context = k;
    if (!k) return;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    k->len = addr_key(ci ? ci->client_addr : NULL, k->addr);
    pthread_mutex_lock(&s->mu);
    s->n_conns++;
    struct addr_count *a = NULL;
    for (int i = 0; i < s->n_addrs && !a; i++)
      if (s->addrs[i].len == k->len && !memcmp(s->addrs[i].addr, k->addr, (size_t)k->len)) a = &s->addrs[i];
    if (!a && s->n_addrs == s->cap_addrs) {
      const int cap = s->cap_addrs ? 2 * s->cap_addrs : 64;
      struct addr_count *g = realloc(s->addrs, sizeof *g * (size_t)cap);
      if (g) s->addrs = g, s->cap_addrs = cap;
    }
    if (!a && s->n_addrs < s->cap_addrs) {
      a = &s->addrs[s->n_addrs++];
      memcpy(a->addr, k->addr, sizeof a->addr);
      a->len = k->len;
      a->n = 0;
    }
    if (a) a->n++;
    k->over = s->n_conns > s->max_conns ? 1 : a && a->n > s->max_per_addr ? 2 : 0;
    if (k->over) s->refused_conns++;
    pthread_mutex_unlock(&s->mu);
    return;
  }
  struct sock *k = *socket_context;
  if (!k) return;
  pthread_mutex_lock(&s->mu);
  s->n_conns--;
  for (int i = 0; i < s->n_addrs; i++)
    if (s->addrs[i].len == k->len && !memcmp(s->addrs[i].addr, k->addr, (size_t)k->len)) {
      if (--s->addrs[i].n == 0) s->addrs[i] = s->addrs[--s->n_addrs];
      break;
    }
  pthread_mutex_unlock(&s->mu);
  free(k);
  *socket_context = NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size,
                                  void **con_cls) {
  struct server *s = cls;
  struct conn *cn = *con_cls;
  if (!cn) { /* the headers are in: the connection may now idle for the long timeout */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->idle_timeout_s);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    const struct sock *k = ci ? ci->socket_context : NULL;
    if (k && k->over)
      return k->over == 1 ? send_error(s, c, 503, "too_many_connections", "the server has %d connections open, its "
                                       "limit (--max-connections); retry later", s->max_conns)
                          : send_error(s, c, 503, "too_many_connections", "your address has more than %d connections "
                                       "open (--max-connections-per-address); close some and retry", s->max_per_addr);
    if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
    *con_cls = cn;
    return MHD_YES;
  }
  if (*upload_size) {
    if (cn->body.n + *upload_size > MAX_BODY_BYTES)
      cn->too_big = 1;
    else
      buf_add(&cn->body, upload_data, *upload_size);
    *upload_size = 0;
    return MHD_YES;
  }
  const int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
  static const struct {
    const char *path;
    int post;
  } routes[] = {{"/health", 0}, {"/v1/models", 0}, {"/metrics", 0}, {"/v1/chat/completions", 1},
                {"/v1/completions", 1}};
  size_t r = 0;
  while (r < sizeof routes / sizeof routes[0] && strcmp(url, routes[r].path)) r++;
  if (r == sizeof routes / sizeof routes[0])
    return send_error(s, c, 404, "not_found", "Invalid URL (%s %s)", method, url);
  if (routes[r].post ? !post : !get)
    return send_error(s, c, 405, "method_not_allowed", "%s %s is not allowed; use %s", method, url,
                      routes[r].post ? "POST" : "GET");
  if (cn->too_big) return send_error(s, c, 413, "request_too_large", "the request body is over %u bytes", MAX_BODY_BYTES);
  if (cn->body.oom) return send_error(s, c, 500, NULL, "out of memory");
  switch (r) {
  case 0: {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    return send_json(c, MHD_HTTP_OK, o);
  }
  case 1: return handle_models(s, c);
  case 2: return handle_metrics(s, c);
  case 3: return handle_completion(s, c, cn, JOB_CHAT);
  default: return handle_completion(s, c, cn, JOB_COMPLETION);
  }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  struct conn *cn = *con_cls;
  if (!cn) return;
  free(cn->body.s);
  free(cn);
  *con_cls = NULL;
}

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
          "  -m, --model FILE       qwen3moe GGUF file (instead of --config)\n"
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
    rc = st_engine_create(s.model, &eo, &s.engine);
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
    fprintf(stderr,
            "strata serve: loaded %s: qwen3moe, %u layers, %u experts (top-%u), vocab %u; context %d tokens, "
            "prompt chunk %d tokens; %d CPU and %d CUDA workers; %.2f s\n",
            o.model, hp->n_layer, hp->n_expert, hp->n_expert_used, hp->n_vocab, s.engine->n_ctx,
            s.engine->prefill, st_engine_n_cpu_workers(s.engine), st_engine_n_cuda_workers(s.engine),
            st_now() - t0);
    if (s.chat_kind == ST_CHAT_QWEN3)
      fprintf(stderr, "strata serve: chat template: Qwen (ChatML, <think> handling)\n");
    else
      fprintf(stderr,
              "strata serve: the model's tokenizer.chat_template is %s, not a Qwen/ChatML one: chats fall back "
              "to the ChatML rendering <|im_start|>{role}\\n{content}<|im_end|>\\n\n",
              tmpl ? "another family's" : "absent");
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.work_cv, NULL);
    mu_ready = 1;
    if (pthread_create(&s.worker, NULL, worker_main, &s))
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
                         (uint16_t)o.port, NULL, NULL, on_request, &s, MHD_OPTION_SOCK_ADDR,
                         v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4, MHD_OPTION_NOTIFY_COMPLETED,
                         on_completed, &s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, &s,
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
