/* Reference files of ../shared/fixtures/models and archs/ (<model>-<type>-reference.json and the
 * last-position logits files) and the comparisons their `tolerance` block defines
 * (fixtures/README.md). */
#ifndef ST_REFCHECK_H
#define ST_REFCHECK_H

#include <stddef.h>
#include <stdint.h>

struct ref_prompt {
  char *name;
  int32_t *ids;
  int n_ids;
  int32_t *top8_ids; /* [n_ids][8] */
  float *top8_logits;
  float *last_logits; /* [n_vocab], from last_logits_file */
  int32_t greedy_ids[16];
  float greedy_margins[16];
  int n_greedy;
  int32_t *routing_experts; /* [n_layer][n_ids][k] or NULL */
  float *routing_weights;
  uint8_t *routing_layer; /* [n_layer]: 1 where the reference has the layer's routing (not a dense layer) */
};

struct ref_file {
  char *model_file;
  int n_prompts, n_vocab, n_layer, k;
  struct ref_prompt *p;
  double tol_mean_over_sigma, tol_top1_01, tol_top1_025, tol_f32_max_abs, tol_routing;
};

/* The external references' folder: $STRATA_FIXTURES, else ../shared/fixtures (relative to the
 * directory the tests run in); NULL when it has no models/ folder, after printing one line
 * "SKIP <what>: no <folder> (set STRATA_FIXTURES)". */
const char *ref_fixtures(const char *what);

/* Loads dir/json_name and the logits files it names. 0 or -1 with a message on stderr. */
int ref_load(const char *dir, const char *json_name, struct ref_file *r);
void ref_free(struct ref_file *r);

/* The whole file as a malloc'd, NUL-terminated buffer (caller frees); *len = its bytes.
 * NULL when it cannot be read. */
char *ref_slurp(const char *path, size_t *len);

/* σ of a logits vector (population standard deviation). */
double ref_sigma(const float *v, int n);

#endif
