/* The token's graph of a decode step (graph/decode.h): the CPU pool's lanes, every layer's task
 * and the head submitted at once, then one wait for the logits; afterwards the host counts the step's routing (profiles,
 * the adaptive cache, the tiers' counters) as the per-task path does when it reads each layer's
 * routing table. */
#include <string.h>

#include "codelets/quant.h"
#include "common.h"
#include "graph/decode.h"
#include "graph/engine.h"
#include "graph/sampler.h"

/* Counts the step's routing (route: [n_layer][k]); ST_ERUNTIME at the first non-finite choice. */
static int count_routing(struct st_engine *e, const struct st_route *route, int bad_layer) {
  const struct st_hparams *hp = &e->hp;
  const int k = (int)hp->n_expert_used, E = (int)hp->n_expert;
  for (uint32_t l = 0; l < hp->n_layer; l++)
    for (int j = 0; j < k; j++) {
      const struct st_route r = route[(size_t)l * k + j];
      if ((bad_layer >= 0 && (int)l >= bad_layer) || r.expert < 0 || r.expert >= E || !(r.weight == r.weight)) {
        const uint32_t at = bad_layer >= 0 ? (uint32_t)bad_layer : l;
        char what[96];
        snprintf(what, sizeof what, "the router input of layer %u (token %d)", at, e->n_past);
        return st_engine_nonfinite(e, (int)at - 1, (int)at, what);
      }
    }
  for (uint32_t l = 0; l < hp->n_layer; l++) {
    if (e->model->layers[l].dense) continue; /* no routing */
    st_engine_count_routes(e, l, route + (size_t)l * k, 1);
    int tiers_seen = 0;
    for (int j = 0; j < k; j++) {
      const int t = e->placement.tier[(size_t)l * E + route[(size_t)l * k + j].expert];
      e->stats.expert_entries[t]++;
      tiers_seen |= 1 << t;
    }
    for (int t = 0; t < ST_TIER_MAX; t++)
      if (tiers_seen >> t & 1) e->stats.expert_tasks[t]++;
  }
  return 0;
}

/* The next step number (never 0: the mailbox's flags start at 0). */
static uint32_t next_seq(uint32_t seq) { return seq + 1 ? seq + 1 : 1; }

/* Submits the step at position pos, number seq: the CPU pool's lanes (GPU mode, when it owns a
 * pair), every layer and the head. The tasks submitted go into d->tasks_last. */
static int submit_step(struct st_engine *e, int32_t pos, uint32_t seq) {
  struct st_decode *d = e->dec;
  struct st_decode_ctx *c = &d->ctx;
  c->pos = pos;
  c->seq = seq;
  memset(c->sync, 0, sizeof *c->sync * (e->hp.n_layer + 1));
  d->tasks_last = 0;
  int rc = d->gpu ? st_decode_submit_lanes(e) : 0;
  for (int l = 0; l <= (int)e->hp.n_layer && !rc; l++) rc = st_decode_submit_layer(e, l);
  return rc;
}

/* GPU mode: the mailbox's input of step seq at position pos (the embedding row is written first),
 * the step number last, with release order: layer 0's first kernel reads them (and, for a step
 * submitted ahead, waits for the number). */
static void post_step(struct st_decode_ctx *c, int32_t pos, uint32_t seq) {
  c->mail.pos_seq[0] = pos;
  __atomic_store_n(&c->mail.pos_seq[1], (int32_t)seq, __ATOMIC_RELEASE);
}

/* Whether step `pos` may be submitted before its token is known (STRATA_PRESUBMIT): a GPU step
 * whose layers hand nothing to the CPU pool (a lane would wait on a step the host cannot finish),
 * not recorded, inside the context. */
static int may_presubmit(const struct st_engine *e, int32_t pos) {
  const struct st_decode *d = e->dec;
  return e->presubmit && d->gpu && !d->pool_lanes && !e->rec && pos < e->n_ctx;
}

void st_decode_settle(struct st_engine *e) {
  struct st_decode *d = e->dec;
  if (!d || !d->pending) return;
  struct st_decode_ctx *c = &d->ctx;
  memset(c->mail.emb, 0, sizeof(float) * e->hp.n_embd);
  post_step(c, c->pos, c->seq);
  starpu_task_wait_for_all();
  d->pending = d->pending_broken = 0;
}

int st_decode_step(struct st_engine *e, int32_t id, float *logits) {
  struct st_decode *d = e->dec;
  struct st_decode_ctx *c = &d->ctx;
  const struct st_hparams *hp = &e->hp;
  d->logits_finite = 0;
  if (d->pending && (d->pending_broken || c->pos != e->n_past)) st_decode_settle(e); /* not this step */
  const double t_in = st_now();
  const int back_to_back = d->last_return_s > 0 && t_in - d->last_return_s < 0.01; /* a decode loop */
  st_engine_embed(e, &id, 1, d->gpu ? c->mail.emb : c->x);
  const double t_step = st_now();
  uint32_t seq;
  int rc = 0;
  if (d->pending) { /* submitted ahead: its first kernel waits for this */
    seq = c->seq;
    post_step(c, c->pos, seq);
    d->pending = 0;
  } else {
    seq = next_seq(c->seq);
    if (d->gpu) post_step(c, e->n_past, seq);
    rc = submit_step(e, e->n_past, seq);
  }
  e->stats.tasks += d->tasks_last;
  if (rc && d->gpu) { /* release whatever was submitted: lanes leave, the GPU's waits end */
    __atomic_store_n(c->mail.abort_seq, seq, __ATOMIC_RELEASE);
    for (uint32_t l = 0; l < hp->n_layer; l++)
      __atomic_store_n(&c->mail.cpu_seq[(size_t)l * ST_MAIL_FLAG_STRIDE], seq, __ATOMIC_RELEASE);
  }
  if (!rc && may_presubmit(e, e->n_past + 1)) { /* the next step's tasks while this one computes */
    d->pending = 1;
    d->pending_broken = submit_step(e, e->n_past + 1, next_seq(seq)) != 0; /* settled below, after this step's head */
  }
  const double t_wait = st_now();
  e->stats.submit_s += t_wait - t_step;
  const struct st_route *route = c->route;
  double t_head = t_wait;
  if (d->gpu && !rc) { /* the head raises head_seq once the logits and the routing are in the mailbox */
    st_mail_wait(c->mail.head_seq, seq, c->mail.abort_seq);
    t_head = st_now();
    if (logits) {
      d->logits_finite = st_copy_finite(logits, c->mail.logits, hp->n_vocab);
    } else { /* the head's argmax (dk_head_done), written before the flag; without one (a logit not
              * finite, or no key at all) the logits go to e->logits, where st_engine_eval checks them */
      d->next_id = c->mail.argmax[0];
      d->logits_finite = !c->mail.argmax[1];
      if (!d->logits_finite) {
        memcpy(e->logits, c->mail.logits, sizeof(float) * hp->n_vocab);
        d->next_id = st_argmax(e->logits, (int32_t)hp->n_vocab);
      }
    }
    memcpy(c->route, c->mail.route, sizeof(struct st_route) * hp->n_layer * hp->n_expert_used);
  }
  if (d->pending_broken) { /* its lanes and kernels run out on a zero embedding; then the error */
    st_decode_settle(e);
    if (!rc) rc = st_set_error(ST_ERUNTIME, "submitting the decode step of position %d ahead failed", e->n_past + 1);
  }
  /* every lane has left its loop: the counters may be reset. A GPU step without lanes may leave
   * StarPU retiring its tasks (STRATA_STEP_WAIT=0; with a step submitted ahead it must, that step
   * waiting for the host): the GPU's work is done at the head's flag (the last kernel on CUDA0's
   * stream), the next step's tasks depend on these through their handles, and the prompt paths,
   * the adaptive swaps and shutdown wait for every task themselves (st_decode_settle first) */
  if (!d->pending && (!d->gpu || d->pool_lanes || rc || e->step_wait || e->rec)) starpu_task_wait_for_all();
  e->stats.wait_end_s += st_now() - t_wait;
  if (d->gpu && !rc) {
    const uint64_t t0 = __atomic_load_n(&c->mail.stamps[0], __ATOMIC_ACQUIRE), t1 = __atomic_load_n(&c->mail.stamps[1], __ATOMIC_ACQUIRE);
    e->stats.gpu_steps++;
    e->stats.gpu_span_s += t1 > t0 ? (double)(t1 - t0) * 1e-9 : 0.0;
    if (back_to_back && d->last_end_ns && t0 > d->last_end_ns) e->stats.gpu_gap_s += (double)(t0 - d->last_end_ns) * 1e-9;
    if (back_to_back) e->stats.host_between_s += t_step - d->last_return_s; /* with the embedding row */
    d->last_end_ns = t1;
  }
  if (rc) return rc;
  if (!d->gpu) memcpy(logits, c->logits, sizeof(float) * hp->n_vocab);
  e->stats.step_s += st_now() - t_step;
  if (c->walls) c->walls->steps++;
  if (d->gpu && d->steps_logged < 2 && ++d->steps_logged == 2) st_engine_gpu_memory_log("after the second decode step"); /* graphs instantiated */
  if (d->gpu) e->stats.host_tail_s += st_now() - t_head;
  d->last_return_s = st_now();
  const int bad = c->sync[0].error ? c->sync[0].error_layer : -1;
  return count_routing(e, route, d->gpu ? -1 : bad);
}
