/* Random-weight MoE GGUF writer (mkmodel.h). Every row of every tensor is generated from
 * its own counter-based RNG stream (splitmix64 of seed, tensor number, row), so the bytes do not
 * depend on how rows are split between threads. Worker threads fill chunk buffers of about
 * 4 MiB in a ring; the calling thread writes them to the file in order.
 *
 * Scales: matrices ~ N(0, 1/fan_in) (fan_in = ne[0], the dot-product length); the two
 * projections that add into the residual stream (attn_output, ffn_down_exps) are further scaled
 * by 1/sqrt(2 * layers) (GPT-2's residual scaling) so the stream stays O(1) over 48 layers;
 * norms 1 +- 0.02; embeddings N(0, 1).
 * Routing skew: every token embedding gets a shared component a*sqrt(hidden)*u along a fixed
 * random unit vector u (a = 0.5), and router row e of layer L gets an extra beta_e * u, where
 * beta_e gives expert e a logit bias skew * 2 / (rank + 1) (Zipf-like) in a random per-layer
 * expert ranking, against router noise of standard deviation about 1. */
#include "io/mkmodel.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "codelets/quant.h"
#include "common.h"
#include "io/arch.h"
#include "io/gguf.h"
#include "io/model.h"

#define CHUNK_BYTES (4u << 20)
#define SHARED_A 0.5f /* share of the embedding along u (when skew > 0) */
#define NORM_NOISE 0.02f

int st_mkmodel_preset(const char *name, struct st_mkmodel_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->type = ST_TYPE_Q8_0;
  cfg->seed = 1;
  cfg->skew = 1.5f;
  cfg->rms_eps = 1e-6f;
  cfg->rope_theta = 1e6f;
  cfg->arch = ST_ARCH_QWEN3MOE;
  if (!strcmp(name, "tiny")) {
    cfg->n_layer = 4, cfg->n_expert = 16, cfg->n_expert_used = 4, cfg->n_embd = 64;
    cfg->n_ff_exp = 64, cfg->n_ff = 256, cfg->n_head = 4, cfg->n_head_kv = 2, cfg->head_dim = 16;
    cfg->n_ctx = 4096;
  } else if (!strcmp(name, "qwen3-30b-a3b")) {
    cfg->n_layer = 48, cfg->n_expert = 128, cfg->n_expert_used = 8, cfg->n_embd = 2048;
    cfg->n_ff_exp = 768, cfg->n_ff = 6144, cfg->n_head = 32, cfg->n_head_kv = 4;
    cfg->head_dim = 128, cfg->n_ctx = 40960;
  } else if (!strcmp(name, "tiny-deepseek2") || !strcmp(name, "deepseek2-lite")) {
    const int tiny = name[0] == 't';
    cfg->arch = ST_ARCH_DEEPSEEK2;
    cfg->n_layer = tiny ? 4 : 27, cfg->n_layer_dense = 1, cfg->n_expert = tiny ? 16 : 64;
    cfg->n_expert_used = tiny ? 4 : 6, cfg->n_embd = tiny ? 64 : 2048, cfg->n_ff_exp = tiny ? 32 : 1408;
    cfg->n_ff = tiny ? 128 : 10944, cfg->n_shared = tiny ? 1 : 2, cfg->n_head = tiny ? 4 : 16, cfg->n_head_kv = 1;
    cfg->q_lora = tiny ? 32 : 0, cfg->kv_lora = tiny ? 32 : 512, cfg->qk_nope = tiny ? 32 : 128;
    cfg->n_rot = tiny ? 16 : 64, cfg->v_head = tiny ? 32 : 128, cfg->head_dim = cfg->kv_lora + cfg->n_rot;
    cfg->n_ctx = tiny ? 4096 : 163840, cfg->rope_theta = 10000.0f;
    if (!tiny) /* V2-Lite's YaRN: factor 40 over 4096, mscale = mscale_all_dim = 0.707 */
      cfg->yarn_factor = 40.0f, cfg->yarn_orig_ctx = 4096, cfg->yarn_log_mul = 0.0707f;
    /* V3's routing on the tiny one (sigmoid, groups, scale 2.5); V2-Lite's softmax without renormalising */
    cfg->gating = tiny ? ST_GATING_SIGMOID : ST_GATING_SOFTMAX, cfg->n_group = tiny ? 4 : 0, cfg->n_group_used = tiny ? 2 : 0;
    cfg->w_scale = tiny ? 2.5f : 1.0f, cfg->w_norm = tiny;
  } else if (!strcmp(name, "tiny-gpt-oss") || !strcmp(name, "gpt-oss-20b")) {
    const int tiny = name[0] == 't';
    cfg->arch = ST_ARCH_GPT_OSS, cfg->gating = ST_GATING_SOFTMAX_WEIGHT;
    cfg->n_layer = tiny ? 4 : 24, cfg->n_expert = tiny ? 16 : 32, cfg->n_expert_used = 4;
    cfg->n_embd = tiny ? 64 : 2880, cfg->n_ff_exp = tiny ? 64 : 2880, cfg->n_ff = cfg->n_ff_exp;
    cfg->n_head = tiny ? 4 : 64, cfg->n_head_kv = tiny ? 2 : 8, cfg->head_dim = tiny ? 16 : 64;
    cfg->n_swa = tiny ? 8 : 128, cfg->yarn_factor = 32.0f, cfg->yarn_orig_ctx = 4096, cfg->n_ctx = 131072;
    cfg->rope_theta = 150000.0f, cfg->rms_eps = 1e-5f;
    if (!tiny) cfg->expert_type = ST_TYPE_MXFP4, cfg->has_expert_type = 1;
  } else if (!strcmp(name, "tiny-glm4moe") || !strcmp(name, "glm4.5-air")) {
    const int tiny = name[0] == 't';
    cfg->arch = ST_ARCH_GLM4MOE, cfg->gating = ST_GATING_SIGMOID;
    cfg->n_layer = tiny ? 4 : 16, cfg->n_layer_dense = 1, cfg->n_expert = tiny ? 16 : 128;
    cfg->n_expert_used = tiny ? 4 : 8, cfg->n_embd = tiny ? 64 : 4096, cfg->n_ff_exp = tiny ? 32 : 1408;
    cfg->n_ff = tiny ? 128 : 10944, cfg->n_shared = 1, cfg->n_head = tiny ? 4 : 96, cfg->n_head_kv = tiny ? 2 : 8;
    cfg->head_dim = tiny ? 32 : 128, cfg->n_rot = cfg->head_dim / 2, cfg->n_ctx = tiny ? 4096 : 131072;
    cfg->n_group = tiny ? 2 : 0, cfg->n_group_used = tiny ? 1 : 0, cfg->w_scale = tiny ? 2.5f : 1.0f, cfg->w_norm = 1;
    cfg->rms_eps = 1e-5f;
  } else {
    return st_set_error(ST_EINVAL, "unknown preset '%s' (tiny, qwen3-30b-a3b, tiny-deepseek2, deepseek2-lite, tiny-gpt-oss, "
                        "gpt-oss-20b, tiny-glm4moe, glm4.5-air)", name);
  }
  snprintf(cfg->name, sizeof cfg->name, "strata-mkmodel-%s", name);
  return 0;
}

int st_mkmodel_check(const struct st_mkmodel_config *c) {
  struct {
    const char *flag;
    uint32_t v;
  } f[] = {{"--layers", c->n_layer},   {"--experts", c->n_expert}, {"--top-k", c->n_expert_used},
           {"--hidden", c->n_embd},    {"--expert-ffn", c->n_ff_exp}, {"--heads", c->n_head},
           {"--kv-heads", c->n_head_kv}, {"--head-dim", c->head_dim}, {"--context", c->n_ctx}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (!f[i].v) return st_set_error(ST_EINVAL, "%s must be positive", f[i].flag);
  if (c->n_expert_used > c->n_expert)
    return st_set_error(ST_EINVAL, "--top-k %u exceeds --experts %u", c->n_expert_used, c->n_expert);
  if (c->n_layer_dense >= c->n_layer)
    return st_set_error(ST_EINVAL, "--layers %u leaves no MoE layer after %u dense ones", c->n_layer, c->n_layer_dense);
  if (c->n_group > 1 && (c->n_expert % c->n_group || c->n_expert_used > c->n_expert / c->n_group * c->n_group_used))
    return st_set_error(ST_EINVAL, "%u experts, top-%u do not fit %u expert groups with %u of them used per token", c->n_expert,
                        c->n_expert_used, c->n_group, c->n_group_used);
  if (c->arch == ST_ARCH_DEEPSEEK2 && c->head_dim != c->kv_lora + c->n_rot)
    return st_set_error(ST_EINVAL, "--head-dim of a deepseek2 model is its cached row, kv_lora_rank + rope dims = %u",
                        c->kv_lora + c->n_rot);
  if (c->arch == ST_ARCH_DEEPSEEK2 && c->n_head_kv != 1)
    return st_set_error(ST_EINVAL, "--kv-heads %u: a deepseek2 model's latent cache is one KV head (multi-head latent "
                        "attention)", c->n_head_kv);
  if (c->arch != ST_ARCH_DEEPSEEK2 && c->q_lora)
    return st_set_error(ST_EINVAL, "--q-lora applies to deepseek2 presets only");
  if (c->n_head % c->n_head_kv)
    return st_set_error(ST_EINVAL, "--heads %u is not a multiple of --kv-heads %u", c->n_head, c->n_head_kv);
  const uint32_t rot = c->n_rot ? c->n_rot : c->head_dim; /* what RoPE rotates of each head (llama.cpp: rope.dimension_count) */
  if (c->arch != ST_ARCH_DEEPSEEK2 && (rot % 2 || rot > c->head_dim))
    return st_set_error(ST_EINVAL, "--head-dim %u: RoPE rotates %u dimensions of each head, which must be an even count "
                        "up to --head-dim (an even --head-dim)", c->head_dim, rot);
  if (c->has_expert_type && st_mkmodel_file_type(c->expert_type) < 0)
    return st_set_error(ST_EINVAL, "expert type %s cannot be written", st_type_info(c->expert_type)->name);
  const struct st_type_info *ti = st_type_info(c->type);
  if (st_mkmodel_file_type(c->type) < 0)
    return st_set_error(ST_EINVAL, "weight type %s cannot be written (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                                   "q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, iq3_xxs, iq3_s, iq2_xs, iq2_s, iq2_xxs, iq1_s, iq1_m, q2_0, q1_0, tq2_0, tq1_0, mxfp4)",
                          ti->name);
  /* the experts' type (--expert-type, else --type) decides their rows' blocks */
  const struct st_type_info *ei = st_type_info(c->has_expert_type ? c->expert_type : c->type);
  if (ei->blck_size > 1 && c->n_ff_exp % 32)
    return st_set_error(ST_EINVAL, "--expert-ffn %u must be a multiple of 32 for %s experts", c->n_ff_exp, ei->name);
  if (ti->blck_size > 1) {
    const unsigned bs = 32; /* K-quant rows that are not a multiple of 256 fall back to q8_0 */
    if (c->n_embd % bs) return st_set_error(ST_EINVAL, "--hidden %u must be a multiple of %u for %s", c->n_embd, bs, ti->name);
    if ((uint64_t)c->n_head * c->head_dim % bs)
      return st_set_error(ST_EINVAL, "--heads x --head-dim must be a multiple of %u for %s", bs, ti->name);
  }
  if (!(c->skew >= 0) || !isfinite(c->skew)) return st_set_error(ST_EINVAL, "--skew must be >= 0");
  if (!(c->rope_theta > 0)) return st_set_error(ST_EINVAL, "--rope-theta must be positive");
  if ((uint64_t)c->n_head * c->head_dim > 1u << 20 || c->n_embd > 1u << 20 || c->n_ff_exp > 1u << 20)
    return st_set_error(ST_EINVAL, "a row length exceeds 2^20 elements");
  return 0;
}

/* ---- vocabulary ------------------------------------------------------------------------------ */

void st_mkmodel_vocab_free(struct st_mkmodel_vocab *v) {
  if (!v) return;
  for (uint64_t i = 0; i < v->n_tokens && v->tokens; i++) free(v->tokens[i]);
  for (uint64_t i = 0; i < v->n_merges && v->merges; i++) free(v->merges[i]);
  free(v->tokens);
  free(v->types);
  free(v->merges);
  free(v->model);
  free(v->pre);
  free(v->chat_template);
  memset(v, 0, sizeof *v);
}


static int64_t find_token(const struct st_mkmodel_vocab *v, const char *s) {
  for (uint64_t i = v->n_tokens; i-- > 0;)
    if (v->tokens[i] && !strcmp(v->tokens[i], s)) return (int64_t)i;
  return -1;
}

/* Pads to a multiple of 64 with [PAD<id>] (type 5) and sets the special ids. */
static int vocab_finish(struct st_mkmodel_vocab *v, uint64_t n_used, const char *path) {
  uint64_t n = (n_used + 63) / 64 * 64;
  char **nt = realloc(v->tokens, n * sizeof *nt);
  int32_t *ty = nt ? realloc(v->types, n * sizeof *ty) : NULL;
  if (nt) v->tokens = nt;
  if (ty) v->types = ty;
  if (!nt || !ty) return st_set_error(ST_ENOMEM, "%s: out of memory", path);
  for (uint64_t i = v->n_tokens; i < n; i++) v->tokens[i] = NULL;
  v->n_tokens = n;
  for (uint64_t i = 0; i < n; i++) {
    if (v->tokens[i]) continue;
    char pad[32];
    snprintf(pad, sizeof pad, "[PAD%llu]", (unsigned long long)i);
    if (!(v->tokens[i] = strdup(pad))) return st_set_error(ST_ENOMEM, "%s: out of memory", path);
    v->types[i] = 5;
  }
  return 0;
}

static int vocab_from_json(const char *path, struct st_mkmodel_vocab *v) {
  size_t len;
  char *text = st_read_file(path, &len);
  if (!text) return ST_EIO; /* st_read_file named the file and the reason */
  cJSON *root = cJSON_ParseWithLength(text, len);
  free(text);
  if (!root) return st_set_error(ST_EFORMAT, "%s: not valid JSON", path);
  int rc = 0;
  cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  cJSON *vocab = model ? cJSON_GetObjectItemCaseSensitive(model, "vocab") : NULL;
  cJSON *merges = model ? cJSON_GetObjectItemCaseSensitive(model, "merges") : NULL;
  cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
  if (!cJSON_IsObject(vocab)) {
    rc = st_set_error(ST_EFORMAT, "%s: no model.vocab object (not a BPE tokenizer.json?)", path);
    goto out;
  }
  /* the GGUF says gpt2 (byte-level BPE): a tokenizer of another kind, or one without merges, would
   * write a file no loader reads */
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
  const char *kind = cJSON_IsString(type) ? type->valuestring : type ? "(not a string)" : "BPE";
  const int has_merges = cJSON_IsArray(merges) && cJSON_GetArraySize(merges) > 0;
  if (strcmp(kind, "BPE") || !has_merges) {
    rc = st_set_error(ST_EFORMAT, "%s: model.type %s with %s: mkmodel takes a BPE tokenizer.json with merges", path, kind,
                      has_merges ? "merges" : "no merges");
    goto out;
  }
  /* Highest id, bounded so a hostile file cannot make us allocate without limit. */
  int64_t max_id = -1;
  const int64_t id_limit = 1 << 24;
  cJSON *it;
  cJSON_ArrayForEach(it, vocab) {
    if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= id_limit) {
      rc = st_set_error(ST_EFORMAT, "%s: model.vocab[\"%.40s\"] is not an id in [0, 2^24)", path, it->string);
      goto out;
    }
    if (it->valueint > max_id) max_id = it->valueint;
  }
  cJSON_ArrayForEach(it, added) {
    cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
    cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= id_limit || !cJSON_IsString(content)) {
      rc = st_set_error(ST_EFORMAT, "%s: added_tokens entry without a valid id and content", path);
      goto out;
    }
    if (id->valueint > max_id) max_id = id->valueint;
  }
  if (max_id < 0) {
    rc = st_set_error(ST_EFORMAT, "%s: empty vocabulary", path);
    goto out;
  }
  v->n_tokens = (uint64_t)max_id + 1;
  v->tokens = calloc(v->n_tokens, sizeof *v->tokens);
  v->types = calloc(v->n_tokens, sizeof *v->types);
  if (!v->tokens || !v->types) {
    rc = st_set_error(ST_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  cJSON_ArrayForEach(it, vocab) {
    int id = it->valueint;
    if (v->tokens[id]) {
      rc = st_set_error(ST_EFORMAT, "%s: id %d appears twice in model.vocab", path, id);
      goto out;
    }
    if (!(v->tokens[id] = strdup(it->string))) {
      rc = st_set_error(ST_ENOMEM, "%s: out of memory", path);
      goto out;
    }
    v->types[id] = 1;
  }
  cJSON_ArrayForEach(it, added) {
    int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
    const char *content = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
    free(v->tokens[id]);
    if (!(v->tokens[id] = strdup(content))) {
      rc = st_set_error(ST_ENOMEM, "%s: out of memory", path);
      goto out;
    }
    v->types[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special")) ? 3 : 4;
  }
  if (cJSON_IsArray(merges)) {
    int nm = cJSON_GetArraySize(merges);
    v->merges = calloc((size_t)nm + 1, sizeof *v->merges);
    if (!v->merges) {
      rc = st_set_error(ST_ENOMEM, "%s: out of memory", path);
      goto out;
    }
    cJSON_ArrayForEach(it, merges) {
      char *m = NULL;
      if (cJSON_IsString(it)) {
        m = strdup(it->valuestring);
      } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                 cJSON_IsString(cJSON_GetArrayItem(it, 0)) && cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
        const char *a = cJSON_GetArrayItem(it, 0)->valuestring, *b = cJSON_GetArrayItem(it, 1)->valuestring;
        size_t la = strlen(a), lb = strlen(b);
        if ((m = malloc(la + lb + 2))) {
          memcpy(m, a, la);
          m[la] = ' ';
          memcpy(m + la + 1, b, lb + 1);
        }
      } else {
        rc = st_set_error(ST_EFORMAT, "%s: model.merges[%llu] is neither \"a b\" nor [a, b]", path,
                          (unsigned long long)v->n_merges);
        goto out;
      }
      if (!m) {
        rc = st_set_error(ST_ENOMEM, "%s: out of memory", path);
        goto out;
      }
      v->merges[v->n_merges++] = m;
    }
  }
  if ((rc = vocab_finish(v, v->n_tokens, path))) goto out;
  v->model = strdup("gpt2");
  v->pre = strdup("qwen2");
  /* chat_template from tokenizer_config.json beside tokenizer.json, when there is one */
  {
    char cfgpath[4096];
    const char *slash = strrchr(path, '/');
    int dirlen = slash ? (int)(slash - path) : 1;
    snprintf(cfgpath, sizeof cfgpath, "%.*s/tokenizer_config.json", dirlen, slash ? path : ".");
    char *ctext = st_read_file(cfgpath, NULL);
    cJSON *cfg = ctext ? cJSON_Parse(ctext) : NULL;
    cJSON *tmpl = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    if (cJSON_IsString(tmpl)) v->chat_template = strdup(tmpl->valuestring);
    cJSON_Delete(cfg);
    free(ctext);
  }
out:
  cJSON_Delete(root);
  return rc;
}

static char *dup_gstr(struct st_gguf_str s) {
  char *p = malloc((size_t)s.len + 1);
  if (p) {
    memcpy(p, s.ptr, (size_t)s.len);
    p[s.len] = 0;
  }
  return p;
}

static int vocab_from_gguf(const char *path, struct st_mkmodel_vocab *v) {
  struct st_gguf *g;
  int rc = st_gguf_open(path, &g);
  if (rc) return rc;
  const struct st_gguf_kv *tok = st_gguf_find_kv(g, "tokenizer.ggml.tokens");
  const struct st_gguf_kv *typ = st_gguf_find_kv(g, "tokenizer.ggml.token_type");
  const struct st_gguf_kv *mer = st_gguf_find_kv(g, "tokenizer.ggml.merges");
  if (!tok || tok->type != ST_GGUF_ARRAY || tok->v.arr.type != ST_GGUF_STRING || !tok->v.arr.n) {
    rc = st_set_error(ST_EFORMAT, "%s: no tokenizer.ggml.tokens array of strings", path);
    goto out;
  }
  if (typ && (typ->type != ST_GGUF_ARRAY || typ->v.arr.n != tok->v.arr.n || typ->v.arr.type == ST_GGUF_STRING)) {
    rc = st_set_error(ST_EFORMAT, "%s: tokenizer.ggml.token_type does not match the tokens", path);
    goto out;
  }
  uint64_t n = tok->v.arr.n;
  v->n_tokens = n;
  v->tokens = calloc(n, sizeof *v->tokens);
  v->types = calloc(n, sizeof *v->types);
  if (!v->tokens || !v->types) {
    rc = st_set_error(ST_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  for (uint64_t i = 0; i < n; i++) {
    if (!(v->tokens[i] = dup_gstr(st_gguf_arr_str(tok, i)))) {
      rc = st_set_error(ST_ENOMEM, "%s: out of memory", path);
      goto out;
    }
    v->types[i] = typ ? (int32_t)st_gguf_arr_int(typ, i) : 1;
  }
  if (mer && mer->type == ST_GGUF_ARRAY && mer->v.arr.type == ST_GGUF_STRING) {
    v->merges = calloc(mer->v.arr.n + 1, sizeof *v->merges);
    if (!v->merges) {
      rc = st_set_error(ST_ENOMEM, "%s: out of memory", path);
      goto out;
    }
    for (uint64_t i = 0; i < mer->v.arr.n; i++) {
      if (!(v->merges[i] = dup_gstr(st_gguf_arr_str(mer, i)))) {
        rc = st_set_error(ST_ENOMEM, "%s: out of memory", path);
        goto out;
      }
      v->n_merges++;
    }
  }
  if ((rc = vocab_finish(v, n, path))) goto out;
  if (st_gguf_get_str(g, "tokenizer.ggml.model", &v->model)) v->model = strdup("gpt2");
  if (st_gguf_get_str(g, "tokenizer.ggml.pre", &v->pre)) v->pre = strdup("qwen2");
  if (st_gguf_get_str(g, "tokenizer.chat_template", &v->chat_template)) v->chat_template = NULL;
  uint64_t id;
  v->eos_id = !st_gguf_get_u64(g, "tokenizer.ggml.eos_token_id", &id) && id < v->n_tokens ? (int64_t)id : -1;
  v->bos_id = !st_gguf_get_u64(g, "tokenizer.ggml.bos_token_id", &id) && id < v->n_tokens ? (int64_t)id : -1;
  v->pad_id = !st_gguf_get_u64(g, "tokenizer.ggml.padding_token_id", &id) && id < v->n_tokens ? (int64_t)id : -1;
  int b;
  v->add_bos = !st_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) && b;
out:
  st_gguf_close(g);
  return rc;
}

int st_mkmodel_vocab_load(const char *path, struct st_mkmodel_vocab *v) {
  memset(v, 0, sizeof *v);
  v->eos_id = v->bos_id = v->pad_id = -1;
  FILE *f = st_fopen_regular(path);
  if (!f) return ST_EIO;
  char magic[4] = {0};
  size_t got = fread(magic, 1, 4, f);
  fclose(f);
  int gguf = got == 4 && !memcmp(magic, "GGUF", 4);
  int rc = gguf ? vocab_from_gguf(path, v) : vocab_from_json(path, v);
  if (rc) {
    st_mkmodel_vocab_free(v);
    return rc;
  }
  if (!gguf) {
    int64_t im_end = find_token(v, "<|im_end|>"), eot = find_token(v, "<|endoftext|>");
    v->eos_id = im_end >= 0 ? im_end : eot;
    v->bos_id = v->pad_id = eot;
  }
  if (!v->model || !v->pre) {
    st_mkmodel_vocab_free(v);
    return st_set_error(ST_ENOMEM, "%s: out of memory", path);
  }
  return 0;
}

/* ---- weights ----------------------------------------------------------------------------------- */

enum tkind { K_NORM, K_MATRIX, K_EMBD, K_ROUTER, K_BIAS };

struct tdesc {
  char name[96];
  enum tkind kind;
  uint32_t type, n_dims, layer;
  uint32_t asked; /* the type asked for (add_desc may write a fallback type instead) */
  uint64_t ne[4];
  float std; /* K_MATRIX / K_ROUTER noise */
  uint64_t rows, row_bytes;
};

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t stream_seed(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t s = seed ^ 0x5851f42d4c957f2dull;
  uint64_t x = splitmix64(&s) ^ (a * 0xd1342543de82ef95ull);
  s = x;
  x = splitmix64(&s) ^ (b * 0x2545f4914f6cdd1dull);
  s = x;
  return splitmix64(&s);
}

/* Approximately standard normal: sum of four 16-bit uniforms (Irwin-Hall), rescaled to unit
 * variance; bounded at +-3.46, which is what a weight initialiser wants anyway. */
static inline float gauss(uint64_t *s) {
  uint64_t r = splitmix64(s);
  uint32_t sum = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) +
                 (uint32_t)((r >> 32) & 0xffff) + (uint32_t)(r >> 48);
  return ((float)sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

struct gen {
  const struct st_mkmodel_config *cfg;
  struct tdesc *t;
  uint32_t n_t;
  float *u;      /* shared unit direction, n_embd */
  float *bias;   /* n_layer x n_expert router bias coefficients beta_e (along u) */
  float shared_a;
};

/* Generates row `r` of tensor `ti` into out[ne0]. */
static void gen_row(const struct gen *G, uint32_t ti, uint64_t r, float *out) {
  const struct tdesc *t = &G->t[ti];
  uint64_t s = stream_seed(G->cfg->seed, ti, r);
  uint64_t n = t->ne[0];
  switch (t->kind) {
  case K_NORM:
    for (uint64_t i = 0; i < n; i++) out[i] = 1.0f + NORM_NOISE * gauss(&s);
    break;
  case K_MATRIX:
  case K_BIAS:
    for (uint64_t i = 0; i < n; i++) out[i] = t->std * gauss(&s);
    break;
  case K_EMBD: {
    float a = G->shared_a, b = sqrtf(1.0f - a * a), c = a * sqrtf((float)n);
    for (uint64_t i = 0; i < n; i++) out[i] = b * gauss(&s) + c * G->u[i];
    break;
  }
  case K_ROUTER: {
    float beta = G->bias[(uint64_t)t->layer * G->cfg->n_expert + r];
    for (uint64_t i = 0; i < n; i++) out[i] = t->std * gauss(&s) + beta * G->u[i];
    break;
  }
  }
}

/* Converts one row of floats to the tensor's type. */
static void encode_row(uint32_t type, const float *x, uint64_t n, uint8_t *dst) {
  if (type == ST_TYPE_F32) {
    memcpy(dst, x, n * 4);
  } else if (type == ST_TYPE_BF16) {
    for (uint64_t i = 0; i < n; i++) {
      uint16_t h = st_f32_to_bf16(x[i]);
      memcpy(dst + 2 * i, &h, 2);
    }
  } else {
    int rc = st_quantize_row(type, x, dst, (int64_t)n);
    ST_ASSERT(rc == 0); /* st_mkmodel_check admitted only types with a quantiser */
  }
}

int st_mkmodel_file_type(uint32_t type) {
  /* llama.cpp's llama_ftype for a file whose matrices are all of one type */
  switch (type) {
  case ST_TYPE_F32: return 0;
  case ST_TYPE_F16: return 1;
  case ST_TYPE_Q4_0: return 2;
  case ST_TYPE_Q4_1: return 3;
  case ST_TYPE_Q8_0: return 7;
  case ST_TYPE_Q5_0: return 8;
  case ST_TYPE_Q5_1: return 9;
  case ST_TYPE_Q2_K: return 10;
  case ST_TYPE_Q3_K: return 11;
  case ST_TYPE_Q4_K: return 14;
  case ST_TYPE_Q5_K: return 16;
  case ST_TYPE_Q6_K: return 18;
  case ST_TYPE_IQ2_XXS: return 19;
  case ST_TYPE_IQ1_S: return 24;
  case ST_TYPE_IQ1_M: return 31;
  case ST_TYPE_IQ2_XS: return 20;
  case ST_TYPE_IQ3_XXS: return 23;
  case ST_TYPE_IQ4_NL: return 25;
  case ST_TYPE_IQ3_S: return 26;
  case ST_TYPE_IQ2_S: return 28;
  case ST_TYPE_IQ4_XS: return 30;
  case ST_TYPE_BF16: return 32;
  case ST_TYPE_TQ1_0: return 36;
  case ST_TYPE_TQ2_0: return 37;
  case ST_TYPE_Q1_0: return 40;
  case ST_TYPE_MXFP4: return 38; /* MXFP4_MOE: llama.cpp's only MXFP4 file type */
  case ST_TYPE_Q2_0: return 41;
  default: return -1;
  }
}

static int add_desc(struct tdesc *t, uint32_t *n, const char *name, enum tkind kind, uint32_t type,
                    uint32_t layer, uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2, float std) {
  struct tdesc *d = &t[(*n)++];
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->asked = type;
  /* as llama.cpp's quantiser does: a row the type's blocks do not divide (a 256-weight K-quant
   * block on a 64-wide row) is written in a fallback type */
  if (ne0 % st_type_info(type)->blck_size) type = ne0 % ST_QK8_0 ? ST_TYPE_F32 : ST_TYPE_Q8_0;
  d->kind = kind, d->type = type, d->layer = layer, d->n_dims = n_dims, d->std = std;
  d->ne[0] = ne0, d->ne[1] = ne1, d->ne[2] = ne2, d->ne[3] = 1;
  d->rows = ne1 * ne2;
  d->row_bytes = st_row_bytes(type, ne0);
  return 0;
}

/* The hyper-parameters of cfg as the loader would read them from the file. */
static void config_hparams(const struct st_mkmodel_config *c, struct st_hparams *hp) {
  memset(hp, 0, sizeof *hp);
  const struct st_arch *A = st_arch_of(c->arch);
  hp->arch = c->arch, hp->attn_kind = A->attn_kind, hp->gating = c->arch == ST_ARCH_QWEN3MOE ? A->gating : c->gating;
  hp->n_layer = c->n_layer, hp->n_embd = c->n_embd, hp->n_head = c->n_head, hp->n_head_kv = c->n_head_kv;
  hp->head_dim = c->head_dim, hp->n_expert = c->n_expert, hp->n_expert_used = c->n_expert_used;
  hp->n_ff_exp = c->n_ff_exp, hp->n_ff = c->n_ff, hp->n_layer_dense = c->n_layer_dense;
  hp->n_ff_shexp = A->shared ? c->n_shared * c->n_ff_exp : 0;
  hp->n_rot = c->n_rot ? c->n_rot : c->head_dim;
  hp->head_dim_v = A->attn_kind == ST_ATTN_MLA ? c->v_head : c->head_dim;
  hp->q_lora = c->q_lora, hp->kv_lora = c->kv_lora, hp->qk_nope = c->qk_nope;
}

static uint32_t build_tensors(const struct st_mkmodel_config *c, uint64_t n_vocab, struct tdesc *t) {
  uint32_t n = 0, wt = c->type;
  const uint64_t H = c->n_embd;
  const float resid = 1.0f / sqrtf(2.0f * (float)c->n_layer);
  const struct st_arch *A = st_arch_of(c->arch);
  struct st_hparams hp;
  config_hparams(c, &hp);
  char nm[96];
  add_desc(t, &n, "token_embd.weight", K_EMBD, wt, 0, 2, H, n_vocab, 1, 1.0f);
  add_desc(t, &n, "output_norm.weight", K_NORM, ST_TYPE_F32, 0, 1, H, 1, 1, 0);
  add_desc(t, &n, "output.weight", K_MATRIX, wt, 0, 2, H, n_vocab, 1, 1.0f / sqrtf((float)H));
  for (uint32_t L = 0; L < c->n_layer; L++) {
    struct st_layer_tensor spec[ST_LAYER_MAX_TENSORS];
    const int ns = st_arch_layer_tensors(A, &hp, L, spec);
    for (int i = 0; i < ns; i++) {
      const struct st_layer_tensor *s = &spec[i];
      snprintf(nm, sizeof nm, "blk.%u.%.39s", L, s->suffix);
      const float fan = 1.0f / sqrtf((float)s->ne[0]);
      /* the routed experts may take their own type (MXFP4 experts, Q8_0 elsewhere, as gpt-oss's files) */
      const uint32_t mt = s->nd == 3 && strstr(s->suffix, "_exps") && c->has_expert_type ? c->expert_type : wt;
      const uint64_t ne1 = s->nd > 1 ? s->ne[1] : 1, ne2 = s->nd > 2 ? s->ne[2] : 1;
      switch (s->kind) {
      case ST_TK_NORM: add_desc(t, &n, nm, K_NORM, ST_TYPE_F32, L, (uint32_t)s->nd, s->ne[0], ne1, ne2, 0); break;
      case ST_TK_BIAS: add_desc(t, &n, nm, K_BIAS, ST_TYPE_F32, L, (uint32_t)s->nd, s->ne[0], ne1, ne2, 0.05f); break;
      case ST_TK_ROUTER: add_desc(t, &n, nm, K_ROUTER, ST_TYPE_F32, L, 2, s->ne[0], ne1, 1, fan); break;
      case ST_TK_OUT: add_desc(t, &n, nm, K_MATRIX, mt, L, (uint32_t)s->nd, s->ne[0], ne1, ne2, resid * fan); break;
      default: add_desc(t, &n, nm, K_MATRIX, mt, L, (uint32_t)s->nd, s->ne[0], ne1, ne2, fan); break;
      }
    }
  }
  return n;
}

int st_mkmodel_fallbacks(const struct st_mkmodel_config *c, uint64_t n_vocab, uint32_t *n_fallback, uint32_t *n_matrices,
                         uint32_t *fallback_type) {
  struct tdesc *t = calloc(3 + (size_t)ST_LAYER_MAX_TENSORS * c->n_layer, sizeof *t);
  if (!t) return st_set_error(ST_ENOMEM, "out of memory");
  const uint32_t n = build_tensors(c, n_vocab, t);
  *n_fallback = *n_matrices = 0;
  *fallback_type = c->type;
  for (uint32_t i = 0; i < n; i++) {
    if (t[i].kind != K_MATRIX && t[i].kind != K_EMBD) continue;
    (*n_matrices)++;
    if (t[i].type != t[i].asked) (*n_fallback)++, *fallback_type = t[i].type;
  }
  free(t);
  return 0;
}

/* u and the per-layer router bias coefficients (see the file comment). */
static int make_skew(struct gen *G) {
  const struct st_mkmodel_config *c = G->cfg;
  uint32_t H = c->n_embd, E = c->n_expert;
  G->u = calloc(H, sizeof *G->u);
  G->bias = calloc((size_t)c->n_layer * E, sizeof *G->bias);
  uint32_t *perm = malloc(E * sizeof *perm);
  if (!G->u || !G->bias || !perm) {
    free(perm);
    return st_set_error(ST_ENOMEM, "out of memory");
  }
  uint64_t s = stream_seed(c->seed, 0xffffffffull, 0);
  double norm = 0;
  for (uint32_t i = 0; i < H; i++) {
    G->u[i] = gauss(&s);
    norm += (double)G->u[i] * G->u[i];
  }
  for (uint32_t i = 0; i < H; i++) G->u[i] = (float)(G->u[i] / sqrt(norm));
  G->shared_a = c->skew > 0 ? SHARED_A : 0.0f;
  if (c->skew > 0) {
    /* Router logit bias of the rank-r expert: skew * 2 / (r + 1), minus the mean so the
     * average logit is unchanged; beta = bias / (a * sqrt(H)) since the normed hidden state has
     * about a * sqrt(H) along u. */
    double mean = 0;
    for (uint32_t r = 0; r < E; r++) mean += 2.0 / (r + 1);
    mean /= E;
    for (uint32_t L = 0; L < c->n_layer; L++) {
      for (uint32_t e = 0; e < E; e++) perm[e] = e;
      uint64_t ps = stream_seed(c->seed, 0xfffffffeull, L);
      for (uint32_t e = E; e > 1; e--) { /* Fisher-Yates */
        uint32_t j = (uint32_t)(splitmix64(&ps) % e);
        uint32_t tmp = perm[e - 1];
        perm[e - 1] = perm[j];
        perm[j] = tmp;
      }
      for (uint32_t r = 0; r < E; r++)
        G->bias[(size_t)L * E + perm[r]] =
            (float)(c->skew * (2.0 / (r + 1) - mean) / (SHARED_A * sqrt((double)H)));
    }
  }
  free(perm);
  return 0;
}

/* ---- parallel generation, in-order writing ---------------------------------------------------- */

struct job {
  uint32_t tensor;
  uint64_t row0, nrows;
};

struct pool {
  const struct gen *G;
  const struct job *jobs;
  uint64_t n_jobs;
  uint32_t n_slots;
  uint8_t **slot;
  uint64_t *slot_job; /* job held in a slot, UINT64_MAX when none */
  size_t *slot_bytes;
  uint64_t next;      /* next job to claim */
  uint64_t written;   /* jobs written so far */
  int stop, failed; /* failed: a worker could not allocate its row buffer */
  pthread_mutex_t mu;
  pthread_cond_t ready, freed;
  size_t max_row;
};

static void *worker(void *arg) {
  struct pool *P = arg;
  float *row = malloc(P->max_row * sizeof *row);
  for (;;) {
    pthread_mutex_lock(&P->mu);
    uint64_t j = P->next;
    if (!row) {
      P->failed = 1;
      pthread_cond_broadcast(&P->ready);
    }
    if (P->stop || j >= P->n_jobs || !row) {
      pthread_mutex_unlock(&P->mu);
      break;
    }
    P->next++;
    /* The slot is free once the job n_slots earlier has been written. */
    while (!P->stop && j >= P->written + P->n_slots) pthread_cond_wait(&P->freed, &P->mu);
    pthread_mutex_unlock(&P->mu);
    if (P->stop) break;
    const struct job *jb = &P->jobs[j];
    const struct tdesc *t = &P->G->t[jb->tensor];
    uint8_t *dst = P->slot[j % P->n_slots];
    for (uint64_t r = 0; r < jb->nrows; r++) {
      gen_row(P->G, jb->tensor, jb->row0 + r, row);
      encode_row(t->type, row, t->ne[0], dst + r * t->row_bytes);
    }
    pthread_mutex_lock(&P->mu);
    P->slot_job[j % P->n_slots] = j;
    P->slot_bytes[j % P->n_slots] = (size_t)(jb->nrows * t->row_bytes);
    pthread_cond_broadcast(&P->ready);
    pthread_mutex_unlock(&P->mu);
  }
  free(row);
  return NULL;
}

static int write_metadata(struct st_gguf_writer *w, const struct st_mkmodel_config *c,
                          const struct st_mkmodel_vocab *v) {
  int rc = 0;
  const struct st_arch *A = st_arch_of(c->arch);
  const int mla = A->attn_kind == ST_ATTN_MLA;
  /* MXFP4 experts with other matrices in another type: llama.cpp's MXFP4_MOE */
  uint32_t ftype = (uint32_t)st_mkmodel_file_type(c->has_expert_type && c->expert_type == ST_TYPE_MXFP4 ? ST_TYPE_MXFP4 : c->type);
  char k[128];
#define KEY(s) (snprintf(k, sizeof k, "%s.%s", A->name, s), k)
  rc = rc ? rc : st_gguf_writer_add_str(w, "general.architecture", A->name);
  rc = rc ? rc : st_gguf_writer_add_str(w, "general.name", c->name);
  rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("context_length"), c->n_ctx);
  rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("embedding_length"), c->n_embd);
  rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("block_count"), c->n_layer);
  rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("feed_forward_length"), c->n_ff ? c->n_ff : 4 * c->n_embd);
  rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("attention.head_count"), c->n_head);
  rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), c->n_head_kv);
  rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("attention.key_length"), c->head_dim);
  rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("attention.value_length"), mla ? c->kv_lora : c->head_dim);
  rc = rc ? rc : st_gguf_writer_add_f32(w, KEY("rope.freq_base"), c->rope_theta);
  rc = rc ? rc : st_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->rms_eps);
  rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("expert_count"), c->n_expert);
  rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("expert_used_count"), c->n_expert_used);
  rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), c->n_ff_exp);
  if (c->n_rot) rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("rope.dimension_count"), c->n_rot);
  if (c->n_layer_dense) rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("leading_dense_block_count"), c->n_layer_dense);
  if (A->shared && c->n_shared) rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("expert_shared_count"), c->n_shared);
  if (c->arch == ST_ARCH_DEEPSEEK2 || c->arch == ST_ARCH_GLM4MOE) {
    rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("expert_gating_func"), c->gating == ST_GATING_SIGMOID ? 2 : 1);
    rc = rc ? rc : st_gguf_writer_add_f32(w, KEY("expert_weights_scale"), c->w_scale > 0 ? c->w_scale : 1.0f);
    rc = rc ? rc : st_gguf_writer_add_bool(w, KEY("expert_weights_norm"), c->w_norm);
    rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("expert_group_count"), c->n_group ? c->n_group : 1);
    rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("expert_group_used_count"), c->n_group_used ? c->n_group_used : 1);
  }
  if (c->n_swa) rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("attention.sliding_window"), c->n_swa);
  if (c->yarn_factor > 0) {
    rc = rc ? rc : st_gguf_writer_add_str(w, KEY("rope.scaling.type"), "yarn");
    rc = rc ? rc : st_gguf_writer_add_f32(w, KEY("rope.scaling.factor"), c->yarn_factor);
    rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), c->yarn_orig_ctx);
    if (c->yarn_log_mul != 0.0f)
      rc = rc ? rc : st_gguf_writer_add_f32(w, KEY("rope.scaling.yarn_log_multiplier"), c->yarn_log_mul);
  }
  if (mla) {
    if (c->q_lora) rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("attention.q_lora_rank"), c->q_lora);
    rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("attention.kv_lora_rank"), c->kv_lora);
    rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("attention.key_length_mla"), c->qk_nope + c->n_rot);
    rc = rc ? rc : st_gguf_writer_add_u32(w, KEY("attention.value_length_mla"), c->v_head);
  }
#undef KEY
  rc = rc ? rc : st_gguf_writer_add_str(w, "tokenizer.ggml.model", v->model);
  rc = rc ? rc : st_gguf_writer_add_str(w, "tokenizer.ggml.pre", v->pre);
  rc = rc ? rc : st_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, v->n_tokens);
  rc = rc ? rc : st_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", v->types, v->n_tokens);
  if (v->n_merges)
    rc = rc ? rc : st_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, v->n_merges);
  if (v->eos_id >= 0) rc = rc ? rc : st_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos_id);
  if (v->pad_id >= 0) rc = rc ? rc : st_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad_id);
  if (v->bos_id >= 0) rc = rc ? rc : st_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos_id);
  rc = rc ? rc : st_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
  if (v->chat_template) rc = rc ? rc : st_gguf_writer_add_str(w, "tokenizer.chat_template", v->chat_template);
  rc = rc ? rc : st_gguf_writer_add_u32(w, "general.file_type", ftype);
  return rc;
}

int st_mkmodel_write(const struct st_mkmodel_config *c, const struct st_mkmodel_vocab *v,
                     const char *path, uint64_t *bytes_out) {
  int rc = st_mkmodel_check(c);
  if (rc) return rc;
  uint32_t n_alloc = 3 + ST_LAYER_MAX_TENSORS * c->n_layer;
  struct tdesc *t = calloc(n_alloc, sizeof *t);
  struct gen G = {.cfg = c, .t = t};
  struct pool P;
  memset(&P, 0, sizeof P);
  struct job *jobs = NULL;
  pthread_t *th = NULL;
  int n_threads = c->n_threads > 0 ? c->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (n_threads < 1) n_threads = 1;
  if (n_threads > 256) n_threads = 256;
  int started = 0, mu_init = 0;
  struct st_gguf_writer *w = st_gguf_writer_new();
  if (!t || !w) {
    rc = st_set_error(ST_ENOMEM, "out of memory");
    goto out;
  }
  G.n_t = build_tensors(c, v->n_tokens, t);
  if ((rc = make_skew(&G))) goto out;
  if ((rc = write_metadata(w, c, v))) goto out;
  uint64_t n_jobs = 0, total = 0;
  size_t max_chunk = 0, max_row = 0;
  for (uint32_t i = 0; i < G.n_t; i++) {
    if ((rc = st_gguf_writer_add_tensor(w, t[i].name, t[i].type, t[i].n_dims, t[i].ne))) goto out;
    uint64_t per = t[i].row_bytes >= CHUNK_BYTES ? 1 : CHUNK_BYTES / t[i].row_bytes;
    n_jobs += (t[i].rows + per - 1) / per;
    total += t[i].rows * t[i].row_bytes;
    size_t chunk = (size_t)((per < t[i].rows ? per : t[i].rows) * t[i].row_bytes);
    if (chunk > max_chunk) max_chunk = chunk;
    if (t[i].ne[0] > max_row) max_row = (size_t)t[i].ne[0];
  }
  jobs = malloc(n_jobs * sizeof *jobs);
  if (!jobs) {
    rc = st_set_error(ST_ENOMEM, "out of memory");
    goto out;
  }
  uint64_t k = 0;
  for (uint32_t i = 0; i < G.n_t; i++) {
    uint64_t per = t[i].row_bytes >= CHUNK_BYTES ? 1 : CHUNK_BYTES / t[i].row_bytes;
    for (uint64_t r = 0; r < t[i].rows; r += per)
      jobs[k++] = (struct job){i, r, t[i].rows - r < per ? t[i].rows - r : per};
  }
  P.G = &G, P.jobs = jobs, P.n_jobs = n_jobs, P.max_row = max_row;
  P.n_slots = (uint32_t)(2 * n_threads + 2);
  P.slot = calloc(P.n_slots, sizeof *P.slot);
  P.slot_job = malloc(P.n_slots * sizeof *P.slot_job);
  P.slot_bytes = calloc(P.n_slots, sizeof *P.slot_bytes);
  th = calloc((size_t)n_threads, sizeof *th);
  if (!P.slot || !P.slot_job || !P.slot_bytes || !th) {
    rc = st_set_error(ST_ENOMEM, "out of memory");
    goto out;
  }
  for (uint32_t s = 0; s < P.n_slots; s++) {
    P.slot_job[s] = UINT64_MAX;
    if (!(P.slot[s] = malloc(max_chunk ? max_chunk : 1))) {
      rc = st_set_error(ST_ENOMEM, "out of memory (%u chunk buffers of %zu bytes)", P.n_slots, max_chunk);
      goto out;
    }
  }
  { /* refuse up front when the file (metadata, tokenizer and tensors) would not fit on the file system */
    const uint64_t file_bytes = st_gguf_writer_file_bytes(w);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = 0;
    else snprintf(dir, sizeof dir, ".");
    struct statvfs fs;
    if (!statvfs(dir, &fs) && (uint64_t)fs.f_bavail * fs.f_frsize < file_bytes) {
      rc = st_set_error(ST_EIO, "%s: the model needs %.2f GiB and %s has %.2f GiB free", path, file_bytes / 1073741824.0, dir,
                        (double)fs.f_bavail * fs.f_frsize / 1073741824.0);
      goto out;
    }
  }
  if ((rc = st_gguf_writer_begin(w, path))) goto out;
  pthread_mutex_init(&P.mu, NULL);
  pthread_cond_init(&P.ready, NULL);
  pthread_cond_init(&P.freed, NULL);
  mu_init = 1;
  for (; started < n_threads; started++)
    if (pthread_create(&th[started], NULL, worker, &P)) {
      rc = st_set_error(ST_ERUNTIME, "cannot start generator thread %d", started);
      break;
    }
  double t0 = st_now(), last = t0;
  uint64_t done_bytes = 0;
  for (uint64_t j = 0; j < n_jobs && !rc && started; j++) {
    uint32_t s = (uint32_t)(j % P.n_slots);
    pthread_mutex_lock(&P.mu);
    while (P.slot_job[s] != j && !P.failed) pthread_cond_wait(&P.ready, &P.mu);
    size_t nb = P.slot_bytes[s];
    int failed = P.failed;
    pthread_mutex_unlock(&P.mu);
    if (failed) {
      rc = st_set_error(ST_ENOMEM, "out of memory in a generator thread");
      break;
    }
    rc = st_gguf_writer_write_data(w, P.slot[s], nb);
    done_bytes += nb;
    pthread_mutex_lock(&P.mu);
    P.slot_job[s] = UINT64_MAX;
    P.written = j + 1;
    pthread_cond_broadcast(&P.freed);
    pthread_mutex_unlock(&P.mu);
    double now = st_now();
    if (c->progress && (now - last > 0.5 || j + 1 == n_jobs)) {
      last = now;
      fprintf(stderr, "\rstrata mkmodel: %u/%u tensors, %.2f/%.2f GiB, %.0f MB/s   ",
              jobs[j].tensor + (jobs[j].row0 + jobs[j].nrows == t[jobs[j].tensor].rows), G.n_t,
              done_bytes / 1073741824.0, total / 1073741824.0, done_bytes / 1e6 / (now - t0 + 1e-9));
    }
  }
  if (c->progress) fprintf(stderr, "\n");
  pthread_mutex_lock(&P.mu);
  P.stop = 1;
  pthread_cond_broadcast(&P.freed);
  pthread_mutex_unlock(&P.mu);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  if (!rc) rc = st_gguf_writer_finish(w);
  if (!rc && bytes_out) {
    FILE *f = fopen(path, "rb");
    if (f && !fseek(f, 0, SEEK_END)) *bytes_out = (uint64_t)ftell(f);
    if (f) fclose(f);
  }
out:
  if (mu_init) {
    pthread_mutex_destroy(&P.mu);
    pthread_cond_destroy(&P.ready);
    pthread_cond_destroy(&P.freed);
  }
  for (uint32_t s = 0; P.slot && s < P.n_slots; s++) free(P.slot[s]);
  free(P.slot);
  free(P.slot_job);
  free(P.slot_bytes);
  free(th);
  free(jobs);
  free(G.u);
  free(G.bias);
  free(t);
  st_gguf_writer_free(w);
  return rc;
}
