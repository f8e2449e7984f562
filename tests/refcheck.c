/* Loading the fixtures' reference files (see refcheck.h), with cJSON. */
#include "refcheck.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

char *ref_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf) buf[n] = 0;
  if (len) *len = (size_t)n;
  return buf;
}

static double num(const cJSON *o, const char *key, double dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

int ref_load(const char *dir, const char *json_name, struct ref_file *r) {
  memset(r, 0, sizeof *r);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, json_name);
  char *text = ref_slurp(path, NULL);
  if (!text) {
    fprintf(stderr, "cannot read %s\n", path);
    return -1;
  }
  cJSON *root = cJSON_Parse(text);
  free(text);
  if (!root) {
    fprintf(stderr, "%s: not valid JSON\n", path);
    return -1;
  }
  const cJSON *cfg = cJSON_GetObjectItem(root, "config"), *tol = cJSON_GetObjectItem(root, "tolerance");
  r->model_file = strdup(cJSON_GetStringValue(cJSON_GetObjectItem(root, "model_file")));
  r->n_vocab = (int)num(cfg, "vocab_size", 0);
  r->n_layer = (int)num(cfg, "num_hidden_layers", 0);
  r->k = (int)num(cfg, "num_experts_per_tok", 0);
  r->tol_mean_over_sigma = num(tol, "mean_abs_logit_diff_over_sigma", 0.15);
  r->tol_top1_01 = num(tol, "top1_agreement_where_margin_gt_0.1_sigma", 0.99);
  r->tol_top1_025 = num(tol, "top1_agreement_where_margin_gt_0.25_sigma", 1.0);
  r->tol_f32_max_abs = num(tol, "float32_activation_path_max_abs_logit_diff", -1.0);
  r->tol_routing = num(tol, "routing_set_agreement", 0.99);
  const cJSON *prompts = cJSON_GetObjectItem(root, "prompts");
  r->n_prompts = cJSON_GetArraySize(prompts);
  r->p = calloc((size_t)r->n_prompts, sizeof *r->p);
  int rc = 0;
  for (int i = 0; i < r->n_prompts && !rc; i++) {
    const cJSON *pj = cJSON_GetArrayItem(prompts, i);
    struct ref_prompt *p = &r->p[i];
    p->name = strdup(cJSON_GetStringValue(cJSON_GetObjectItem(pj, "name")));
    const cJSON *ids = cJSON_GetObjectItem(pj, "ids"), *t8 = cJSON_GetObjectItem(pj, "top8_ids"),
                *l8 = cJSON_GetObjectItem(pj, "top8_logits");
    p->n_ids = cJSON_GetArraySize(ids);
    p->ids = malloc(sizeof(int32_t) * (size_t)p->n_ids);
    p->top8_ids = malloc(sizeof(int32_t) * 8 * (size_t)p->n_ids);
    p->top8_logits = malloc(sizeof(float) * 8 * (size_t)p->n_ids);
    for (int t = 0; t < p->n_ids; t++) {
      p->ids[t] = cJSON_GetArrayItem(ids, t)->valueint;
      for (int j = 0; j < 8; j++) {
        p->top8_ids[t * 8 + j] = cJSON_GetArrayItem(cJSON_GetArrayItem(t8, t), j)->valueint;
        p->top8_logits[t * 8 + j] = (float)cJSON_GetArrayItem(cJSON_GetArrayItem(l8, t), j)->valuedouble;
      }
    }
    const cJSON *gi = cJSON_GetObjectItem(pj, "greedy_ids"), *gm = cJSON_GetObjectItem(pj, "greedy_margins");
    p->n_greedy = cJSON_GetArraySize(gi) < 16 ? cJSON_GetArraySize(gi) : 16;
    for (int j = 0; j < p->n_greedy; j++) {
      p->greedy_ids[j] = cJSON_GetArrayItem(gi, j)->valueint;
      p->greedy_margins[j] = (float)cJSON_GetArrayItem(gm, j)->valuedouble;
    }
    const cJSON *rt = cJSON_GetObjectItem(pj, "routing");
    if (rt) {
      const size_t n = (size_t)r->n_layer * p->n_ids * r->k;
      p->routing_experts = calloc(n, sizeof(int32_t));
      p->routing_weights = calloc(n, sizeof(float));
      p->routing_layer = calloc((size_t)r->n_layer, 1);
      /* one entry per layer, or (archs/) per MoE layer with its `layer` index: dense layers have none */
      for (int i = 0; i < cJSON_GetArraySize(rt); i++) {
        const cJSON *lj = cJSON_GetArrayItem(rt, i), *ex = cJSON_GetObjectItem(lj, "experts"),
                    *wt = cJSON_GetObjectItem(lj, "weights"), *lk = cJSON_GetObjectItem(lj, "layer");
        const int l = lk ? lk->valueint : i;
        if (l < 0 || l >= r->n_layer) continue;
        p->routing_layer[l] = 1;
        for (int t = 0; t < p->n_ids; t++)
          for (int j = 0; j < r->k; j++) {
            const size_t at = ((size_t)l * p->n_ids + t) * r->k + j;
            p->routing_experts[at] = cJSON_GetArrayItem(cJSON_GetArrayItem(ex, t), j)->valueint;
            p->routing_weights[at] = (float)cJSON_GetArrayItem(cJSON_GetArrayItem(wt, t), j)->valuedouble;
          }
      }
    }
    snprintf(path, sizeof path, "%s/%s", dir, cJSON_GetStringValue(cJSON_GetObjectItem(pj, "last_logits_file")));
    size_t len = 0;
    char *raw = ref_slurp(path, &len);
    if (raw && len == sizeof(float) * (size_t)r->n_vocab) {
      p->last_logits = malloc((size_t)len);
      memcpy(p->last_logits, raw, (size_t)len);
    }
    free(raw);
    if (!p->last_logits) {
      fprintf(stderr, "%s: missing or not %d float32 values\n", path, r->n_vocab);
      rc = -1;
    }
  }
  cJSON_Delete(root);
  return rc;
}

void ref_free(struct ref_file *r) {
  for (int i = 0; i < r->n_prompts; i++) {
    struct ref_prompt *p = &r->p[i];
    free(p->name);
    free(p->ids);
    free(p->top8_ids);
    free(p->top8_logits);
    free(p->last_logits);
    free(p->routing_experts);
    free(p->routing_weights);
    free(p->routing_layer);
  }
  free(r->p);
  free(r->model_file);
}

double ref_sigma(const float *v, int n) {
  double m = 0, s = 0;
  for (int i = 0; i < n; i++) m += v[i];
  m /= n;
  for (int i = 0; i < n; i++) s += (v[i] - m) * (v[i] - m);
  return sqrt(s / n);
}

const char *ref_fixtures(const char *what) {
  const char *f = getenv("STRATA_FIXTURES");
  if (!f || !*f) f = "../shared/fixtures";
  char models[4096];
  struct stat st;
  snprintf(models, sizeof models, "%s/models", f);
  if (stat(models, &st) == 0 && S_ISDIR(st.st_mode)) return f;
  printf("SKIP %s: no %s (set STRATA_FIXTURES)\n", what, models);
  return NULL;
}
