/* `strata serve`'s pieces (cmd_serve.c the command, serve_worker.c the job queue and the worker that
 * owns the engine, serve_http.c the request handlers libmicrohttpd calls): the request, server and
 * connection state they share, and the functions one calls in another. See cmd_serve.c for how
 * the server works. */
#ifndef ST_CLI_SERVE_H
#define ST_CLI_SERVE_H

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/engine.h"
#include "io/chat_template.h"
#include "io/learned.h"
#define MAX_BODY_BYTES (16u << 20) /* a request body larger than this gets 413 */
#define MAX_STOPS 16
#define LEARN_SAVE_S 60.0 /* seconds between saves of the learned expert profile while requests run */

struct buf {
  char *s;
  size_t n, cap;
  int oom;
};


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

  /* the learned expert profile (io/learned.h): saved by the worker every LEARN_SAVE_S seconds of
   * requests and once at shutdown */
  struct st_learned learned;
  double learned_saved_at;
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

/* Appends l bytes of s (and a NUL) to b; on an allocation failure sets b->oom and drops the rest. */
void st_serve_buf_add(struct buf *b, const char *s, size_t l);

/* serve_worker.c. With server.mu held: drops a reference to j (freeing it at the last), and
 * cancels j (out of the queue if it waits there, stopped at the next token if it runs). */
void st_serve_job_unref_locked(struct job *j);
void st_serve_job_cancel_locked(struct server *s, struct job *j);
/* The OpenAI "usage" object of a finished job (the caller owns it). */
cJSON *st_serve_usage_json(const struct job *j);
/* The worker thread (arg: the struct server): runs queued jobs one after another until stopping. */
void *st_serve_worker_main(void *arg);

/* serve_http.c: libmicrohttpd's callbacks (cls: the struct server). */
void st_serve_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                            enum MHD_ConnectionNotificationCode code);
enum MHD_Result st_serve_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                    const char *version, const char *upload_data, size_t *upload_data_size,
                                    void **con_cls);
void st_serve_on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                           enum MHD_RequestTerminationCode toe);

#endif
