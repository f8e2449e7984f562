/* `strata serve`'s job queue and worker (serve.h): the MHD threads put validated jobs on a bounded
 * queue; one worker thread owns the engine and runs them one after another, appending text and
 * server-sent events to each job, and stops a job whose client went away. */
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

void st_serve_buf_add(struct buf *b, const char *s, size_t l) {
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

/* ---- jobs and the queue ---- */

void st_serve_job_unref_locked(struct job *j) {
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
void st_serve_job_cancel_locked(struct server *s, struct job *j) {
  j->cancelled = 1;
  if (j->state != JOB_QUEUED) return;
  struct job **p = &s->head, *prev = NULL;
  while (*p && *p != j) prev = *p, p = &(*p)->next;
  if (*p) {
    *p = j->next;
    if (s->tail == j) s->tail = prev;
    s->n_queued--;
    j->state = JOB_DONE;
    st_serve_job_unref_locked(j); /* the queue's reference */
  }
}

/* Appends one server-sent event `data: <json>\n\n` (json is freed). */
static void job_event(struct server *s, struct job *j, char *json) {
  pthread_mutex_lock(&s->mu);
  if (json) {
    st_serve_buf_add(&j->events, "data: ", 6);
    st_serve_buf_add(&j->events, json, strlen(json));
    st_serve_buf_add(&j->events, "\n\n", 2);
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

cJSON *st_serve_usage_json(const struct job *j) {
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
  int steps = 0; /* decode steps run: the first token comes from the prompt's logits */
  const int greedy = smp.temp <= 0.0f; /* each step's next id from st_engine_eval_next */
  int32_t next = -1;
  while (!rc && j->n_gen < j->max_tokens) {
    pthread_mutex_lock(&s->mu);
    cancelled = j->cancelled;
    const int stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    if (stopping && !cancelled) rc = st_set_error(ST_ERUNTIME, "the server is shutting down");
    if (cancelled || stopping) break;
    int32_t id = next >= 0 ? next : st_sampler_sample(&smp, s->logits, n_vocab);
    if (id < 0) {
      rc = st_set_error(ST_ENOMEM, "out of memory sampling");
      break;
    }
    if (!j->ignore_eos && st_tokenizer_is_eog(tok, id)) {
      j->finish = "stop";
      break;
    }
    j->n_gen++;
    size_t l = 0;
    if (st_tokenizer_is_special(tok, id)) {
      /* control tokens are not text, but for those llama.cpp shows (reasoning and harmony markers) */
      int b = st_tokenizer_is_shown(tok, id) ? st_tokenizer_token_bytes(tok, id, piece, piece_cap - 1) : 0;
      if (b > 0) l = (size_t)b;
    } else {
      l = st_detok_push(&dt, id, piece, piece_cap);
    }
    const int last = j->n_gen == j->max_tokens || e->n_past >= e->n_ctx;
    if (last) l += st_detok_flush(&dt, piece + l, piece_cap - l);
    if (l) {
      const size_t from = j->text.n > max_stop ? j->text.n - max_stop : 0;
      st_serve_buf_add(&j->text, piece, l);
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
    rc = greedy ? st_engine_eval_next(e, id, &next) : st_engine_eval(e, &id, 1, s->logits, 0);
    steps++;
  }
  if (!rc && !stopped && !cancelled) {
    size_t l = piece ? st_detok_flush(&dt, piece, piece_cap) : 0;
    if (l) st_serve_buf_add(&j->text, piece, l);
    if (j->stream && j->text.n > sent) stream_chunk(s, j, j->text.s + sent, 0, NULL);
  }
  const double t_gen = st_now() - t0;
  const double tps = t_gen > 0 && steps ? steps / t_gen : 0.0; /* decode steps a second (llama.cpp's eval rate) */
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
        cJSON_AddItemToObject(o, "usage", st_serve_usage_json(j));
        job_event(s, j, cJSON_PrintUnformatted(o));
        cJSON_Delete(o);
      }
    }
    pthread_mutex_lock(&s->mu);
    st_serve_buf_add(&j->events, "data: [DONE]\n\n", 14);
    pthread_mutex_unlock(&s->mu);
  }
  free(piece);

  const struct st_engine_stats *st = &e->stats;
  char tiers[1024];
  st_engine_tier_report(e, NULL, &before, tiers, sizeof tiers);
  fprintf(stderr,
          "strata serve: request %llu (%s%s): prompt %zu tokens in %.3f s, generated %d tokens, %d decode steps in "
          "%.3f s (%.2f tok/s), %s; %s; host->device %.1f MiB\n",
          (unsigned long long)j->seq, j->kind == JOB_CHAT ? "chat" : "completion", j->stream ? ", stream" : "",
          j->n_ids, t_prompt, j->n_gen, steps, t_gen, tps,
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
  if (st_now() - s->learned_saved_at >= LEARN_SAVE_S) { /* the worker owns the engine's counts */
    st_cli_learn_save(&s->learned, e);
    s->learned_saved_at = st_now();
  }
}

void *st_serve_worker_main(void *arg) {
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
    st_serve_job_unref_locked(j);
  }
  /* shutting down: whatever still waits is answered with an error */
  while (s->head) {
    struct job *j = s->head;
    s->head = j->next;
    s->n_queued--;
    if (!j->error) j->error = strdup("the server is shutting down");
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    st_serve_job_unref_locked(j);
  }
  s->tail = NULL;
  pthread_mutex_unlock(&s->mu);
  return NULL;
}
