/* The prompt lanes as the engine runs them (codelets/prompt.h): with no GPU, each prompt chunk
 * of two or more tokens is one group of lane tasks per layer (one per CPU worker) over buffers
 * made once per engine, in place of the per-task path's attention, output, router, expert-row and
 * combine tasks (graph/batch.c) and its host wait on every layer's routing table. The same bits
 * as the per-task path (STRATA_PROMPT_LANES=0, doc/tuning.md). */
#ifndef ST_GRAPH_PROMPT_H
#define ST_GRAPH_PROMPT_H

#include <stdint.h>

struct st_engine;

/* Builds e->prompt when the engine runs its prompt chunks through the lanes: no GPU worker, the
 * decode step's CPU-only context built (e->dec), no FFN split (STRATA_FF_SLICE) and
 * STRATA_PROMPT_LANES not 0; otherwise leaves it NULL. 0, ST_ENOMEM or ST_EINVAL (a malformed
 * STRATA_PROMPT_LANES). */
int st_prompt_init(struct st_engine *e);
void st_prompt_free(struct st_engine *e);

/* One prompt chunk of T (2 .. prefill) tokens at position e->n_past through every layer and, when
 * want_logits, the head: the last token's logits (all_logits: every token's) into e->logits
 * ([T][n_vocab]), as st_batch_eval. Counts the chunk's routing as the per-task path does. Errors:
 * ST_ERUNTIME when a router's input is not finite (naming the layer and token) or a submission
 * fails. Does not advance n_past. */
int st_prompt_eval(struct st_engine *e, const int32_t *ids, int T, int want_logits, int all_logits);

#endif
