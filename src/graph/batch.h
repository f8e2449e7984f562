/* The per-task path (graph/batch.c): one batch of T tokens (a prompt chunk, or a decode token with
 * STRATA_DECODE_GRAPH=0 and the second-GPU tiers) through every layer as a StarPU task graph: per
 * layer the attention tasks (one per KV-head group), the attention-output slices, the router, the
 * expert-row tasks of every tier (the host reads the layer's routing table to submit them) and the
 * combine; then the output head. And the engine's pieces both paths share (engine.c). */
#ifndef ST_GRAPH_BATCH_H
#define ST_GRAPH_BATCH_H

#include <starpu.h>
#include <stdint.h>

#include "codelets/codelets.h"
#include "graph/engine.h"

/* engine.c's per-layer weight handles, in this order (e->h_layer[l * W_COUNT + i]). */
enum { W_ATTN_NORM, W_Q, W_K, W_V, W_O, W_Q_NORM, W_K_NORM, W_FFN_NORM, W_ROUTER, W_COUNT };

/* Layer L's weights in that order (ws[W_COUNT]), and MLA's in codelets/decode.h's order
 * (mw[ST_MLA_W]: wq_a, wq_b, wkv_a, wk_b, wv_b, q_a_norm, kv_a_norm); an absent one has data NULL. */
void st_engine_layer_weights(const struct st_layer *L, const struct st_weight **ws);
void st_engine_mla_weights(const struct st_layer *L, const struct st_weight **mw);

#define ROWS_PER_EXPERT_TASK 64 /* an expert with more rows in a batch is split into tasks */
/* Task names of one layer: router, combine, one expert group per GPU cache (ST_MAX_CACHES), one per
 * attention group, one per attn_output slice (e->layer_names[l * st_engine_names_per_layer(e) + i]). */
#define NAME_ATTN (2 + ST_MAX_CACHES)
/* CUDA graph sites of a layer's dense tasks on the per-task path (graph keys, engine.h). */
enum { GRAPH_ATTENTION, GRAPH_ATTN_OUTPUT, GRAPH_ROUTER, GRAPH_COMBINE, GRAPH_SITES = 8 };

static inline int st_div_up(int a, int b) { return (a + b - 1) / b; }

/* A StarPU vector handle over nx elements of elemsize bytes at ptr in main RAM (the caller
 * unregisters it). */
starpu_data_handle_t st_engine_reg(const void *ptr, uint64_t nx, uint64_t elemsize);
/* A weight's layout for the codelets. */
struct st_wdesc st_engine_wdesc(const struct st_weight *w);
/* Task names per layer (see NAME_ATTN). */
int st_engine_names_per_layer(const struct st_engine *e);
/* The three read-only handles (gate, up, down) of expert pair (l, x) in the host arena or the
 * mapping, registered on first use and kept until the engine ends. */
const starpu_data_handle_t *st_engine_expert_handles(struct st_engine *e, uint32_t l, uint32_t x);
/* Three handles over the same bytes for one task (a streamed expert's), into out: the caller
 * unregisters them with starpu_data_unregister_submit once the task is submitted, so StarPU frees
 * their GPU copies when it is done. Sequential consistency stays on (the unregistration waits
 * for the task); read-only. */
void st_engine_expert_handles_once(struct st_engine *e, uint32_t l, uint32_t x, starpu_data_handle_t out[3]);

/* Runs T tokens (ids) through the per-task path at positions e->n_past .. + T - 1, the embedding
 * rows read here; with want_logits the head's logits into e->logits (all_logits: every token's,
 * [T][n_vocab], else the last token's). Waits for every task. Does not advance n_past. 0 or the
 * first submission error (ST_ERUNTIME when a router's input is not finite). */
int st_batch_eval(struct st_engine *e, const int32_t *ids, int T, int want_logits, int all_logits);

#endif
