/* The commands' side of learned expert profiles (cli.h, io/learned.h): which profile a run uses, and
 * saving what it routed. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common.h"
#include "graph/engine.h"
#include "io/learned.h"
#include "io/model.h"

void st_cli_learn_begin(struct st_learned *l, const struct st_model *m, struct st_engine_opts *eo, int writes) {
  memset(l, 0, sizeof *l);
  if (eo->no_learn) {
    snprintf(l->note, sizeof l->note, "strata: --no-learn: no learned expert profile is read or written");
    return;
  }
  if (st_learned_open(l, m)) {
    fprintf(stderr, "strata: warning: %s: no learned expert profile\n", st_last_error());
    l->path[0] = 0;
    return;
  }
  if (!l->path[0]) return;
  if (eo->expert_profile)
    snprintf(l->note, sizeof l->note, "strata: expert profile: %s (--expert-profile); this run's routing is added to %s",
             eo->expert_profile, l->path);
  else if (l->loaded) {
    eo->expert_profile = l->path;
    snprintf(l->note, sizeof l->note,
             "strata: expert profile: learned from %" PRIu64 " tokens of earlier runs on this model file (%s)",
             l->base_tokens, l->path);
  } else {
    snprintf(l->note, sizeof l->note, "strata: expert profile: none learned for this model file yet (%s %s)", l->path,
             writes ? "is written after the run" : "would be written by generate or serve; a benchmark only reads it");
  }
}

void st_cli_learn_say(const struct st_learned *l) {
  if (l->note[0]) fprintf(stderr, "%s\n", l->note);
}

void st_cli_learn_save(struct st_learned *l, const struct st_engine *e) {
  if (!l->path[0] || !l->base) return;
  const size_t n = (size_t)l->n_layer * l->n_expert;
  uint64_t entries = 0;
  for (size_t i = 0; i < n; i++) entries += e->route_counts[i];
  /* routed entries per token: the MoE layers' (leading dense layers route nothing) */
  const uint64_t per_token = (uint64_t)(l->n_layer - e->hp.n_layer_dense) * l->top_k;
  const uint64_t tokens = per_token ? entries / per_token : 0;
  if (!tokens) return;
  if (st_learned_save(l, e->route_counts, tokens))
    fprintf(stderr, "strata: warning: the learned expert profile was not saved: %s\n", st_last_error());
  else
    fprintf(stderr, "strata: learned expert profile: %s (%" PRIu64 " tokens)\n", l->path, l->file_tokens);
}
