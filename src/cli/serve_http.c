/* `strata serve`'s HTTP side (serve.h): libmicrohttpd's per-connection callbacks: connection limits
 * per server and per client address, request bodies, the OpenAI-style endpoints (health, models,
 * metrics, chat and text completions, streamed or not) and their validation and error answers. */
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

#include "cli/serve.h"

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
  const uint64_t routed = st_stats_routed_entries(&st);
#define METRIC(name, type, help, fmt, ...)                                                              \
  do {                                                                                                  \
    snprintf(line, sizeof line, "# HELP " name " " help "\n# TYPE " name " " type "\n" name fmt "\n", \
             __VA_ARGS__);                                                                              \
    st_serve_buf_add(&b, line, strlen(line));                                                                    \
  } while (0)
  METRIC("strata_requests_total", "counter", "Completion requests run.", " %llu", (unsigned long long)req);
  METRIC("strata_requests_failed_total", "counter", "Completion requests the engine failed.", " %llu",
         (unsigned long long)failed);
  METRIC("strata_http_errors_total", "counter", "HTTP requests answered with an error status.", " %llu",
         (unsigned long long)herr);
  METRIC("strata_prompt_tokens_total", "counter", "Prompt tokens evaluated.", " %llu", (unsigned long long)pt);
  METRIC("strata_generated_tokens_total", "counter", "Tokens generated.", " %llu", (unsigned long long)gt);
  METRIC("strata_last_request_tokens_per_second", "gauge", "Decode speed of the last request: decode steps a second (its first token comes from the prompt).", " %.3f",
         tps);
  {
    const struct st_placement *pl = &s->engine->placement;
    const char *hdr = "# HELP strata_expert_entries_total (token, expert) rows computed per tier.\n"
                      "# TYPE strata_expert_entries_total counter\n";
    st_serve_buf_add(&b, hdr, strlen(hdr));
    for (int t = 0; t <= pl->n_caches; t++) {
      snprintf(line, sizeof line, "strata_expert_entries_total{tier=\"%s\"} %llu\n", st_placement_tier_name(pl, t),
               (unsigned long long)st.expert_entries[t]);
      st_serve_buf_add(&b, line, strlen(line));
    }
    /* a prompt chunk's uncached experts that ran on CUDA0 (--prompt-stream) */
    snprintf(line, sizeof line, "strata_expert_entries_total{tier=\"stream\"} %llu\n", (unsigned long long)st.stream_entries);
    st_serve_buf_add(&b, line, strlen(line));
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
/* Whether the JSON text b[0..n) has a \u0000 escape (an odd run of backslashes before the u). */
static int has_nul_escape(const char *b, size_t n) {
  for (size_t i = 0; i + 6 <= n; i++) {
    if (b[i] != '\\' || b[i + 1] != 'u' || memcmp(b + i + 2, "0000", 4)) continue;
    size_t k = 0; /* backslashes ending at i */
    while (k <= i && b[i - k] == '\\') k++;
    if (k % 2) return 1;
  }
  return 0;
}

static const char *content_text(const cJSON *v, char **owned, char *err, size_t errcap, size_t i) {
  *owned = NULL;
  if (!v || cJSON_IsNull(v)) return "";
  if (cJSON_IsString(v)) return v->valuestring;
  if (!cJSON_IsArray(v)) {
    snprintf(err, errcap, "messages[%zu].content must be a string or an array of text parts", i);
    return NULL;
  }
  struct buf b = {0};
  st_serve_buf_add(&b, "", 0);
  for (const cJSON *p = v->child; p; p = p->next) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (!cJSON_IsObject(p) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(t)) {
      snprintf(err, errcap, "messages[%zu].content: only parts of type \"text\" with a string \"text\" are supported", i);
      free(b.s);
      return NULL;
    }
    st_serve_buf_add(&b, t->valuestring, strlen(t->valuestring));
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
  if (x->j->state != JOB_DONE) st_serve_job_cancel_locked(x->s, x->j);
  st_serve_job_unref_locked(x->j);
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
        ret = send_error(s, c, 400, cJSON_IsNumber(v_) ? "invalid_value" : "invalid_type",                    \
                         "'%s' must be a %s between %.15g and %.15g", field,                                 \
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
  if (has_nul_escape(cn->body.s, cn->body.n)) { /* cJSON's strings end at it: the text after would be lost */
    cJSON_Delete(req);
    return send_error(s, c, 400, NULL, "a string holds a NUL character (\\u0000), which strata does not take");
  }
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
      const cJSON *content = cJSON_GetObjectItemCaseSensitive(v, "content");
      /* only an assistant turn may come without content (OpenAI's tool-call turns) */
      if ((!content || cJSON_IsNull(content)) && strcmp(role->valuestring, "assistant")) {
        snprintf(err, sizeof err, "messages[%zu] (role '%s') must have a 'content'", i, role->valuestring);
        bad = 1;
        break;
      }
      m[i].content = content_text(content, &owned[i], err, sizeof err, i);
      bad = !m[i].content;
    }
    int think = 1;
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(req, "enable_thinking");
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs");
    if (!et && cJSON_IsObject(kw)) et = cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking");
    if (et && cJSON_IsBool(et)) think = cJSON_IsTrue(et);
    if (!bad && st_chat_render(s->chat_kind, m, nm, 1, think, &prompt_owned)) {
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
  if (text && st_tokenizer_encode(s->model->tok, text, strlen(text), ST_TOK_PROMPT, &j->ids, &j->n_ids)) {
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
      st_serve_job_cancel_locked(s, j);
      st_serve_job_unref_locked(j);
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
      st_serve_job_cancel_locked(s, j);
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
  cJSON_AddItemToObject(o, "usage", st_serve_usage_json(j));
  ret = send_json(c, MHD_HTTP_OK, o);

done:
  if (j) {
    pthread_mutex_lock(&s->mu);
    st_serve_job_unref_locked(j);
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
void st_serve_on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
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

enum MHD_Result st_serve_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
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
      st_serve_buf_add(&cn->body, upload_data, *upload_size);
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

void st_serve_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  struct conn *cn = *con_cls;
  if (!cn) return;
  free(cn->body.s);
  free(cn);
  *con_cls = NULL;
}
