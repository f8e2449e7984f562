/* The model config file (config.h): a JSON object read with cJSON, every key checked by name and
 * type so that a typo is an error rather than a silently ignored setting. */
#include "io/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}


/* The default "name": the basename without a .json suffix. */
static char *default_name(const char *path) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  char *n = dup_str(b);
  if (!n) return NULL;
  size_t l = strlen(n);
  if (l > 5 && !strcmp(n + l - 5, ".json")) n[l - 5] = 0;
  return n;
}

static int whole_number(const cJSON *v, long lo, long hi, long *out) {
  if (!cJSON_IsNumber(v)) return 0;
  const double d = v->valuedouble;
  /* range first: converting a double outside long's range is undefined */
  if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) return 0;
  *out = (long)d;
  return 1;
}

/* Every key and string value is valid UTF-8 (they reach the server's JSON responses), and no
 * object repeats a key (cJSON would keep both; a later one must not win silently). */
static int check_strings(const char *path, const cJSON *v, const char *key) {
  if (v->string && !st_utf8_valid(v->string, strlen(v->string)))
    return st_set_error(ST_EFORMAT, "%s: a key is not valid UTF-8", path);
  if (cJSON_IsString(v) && !st_utf8_valid(v->valuestring, strlen(v->valuestring)))
    return st_set_error(ST_EFORMAT, "%s: the value of \"%s\" is not valid UTF-8", path, key);
  for (const cJSON *a = v->child; a; a = a->next) {
    if (cJSON_IsObject(v))
      for (const cJSON *b = v->child; b != a; b = b->next)
        if (a->string && b->string && !strcmp(a->string, b->string) && st_utf8_valid(a->string, strlen(a->string)))
          return st_set_error(ST_EFORMAT, "%s: key \"%s\" appears twice", path, a->string);
    const int rc = check_strings(path, a, a->string ? a->string : key);
    if (rc) return rc;
  }
  return 0;
}

static int parse(const char *path, const cJSON *root, struct st_config *c) {
  if (!cJSON_IsObject(root)) return st_set_error(ST_EFORMAT, "%s: the top level must be a JSON object", path);
  int rc = check_strings(path, root, "");
  if (rc) return rc;
  for (const cJSON *it = root->child; it; it = it->next) {
    const char *k = it->string;
    long v;
    if (!strcmp(k, "model")) {
      if (!cJSON_IsString(it)) return st_set_error(ST_EFORMAT, "%s: \"model\" must be a string (a GGUF path)", path);
      free(c->model);
      if (!(c->model = dup_str(it->valuestring))) return st_set_error(ST_ENOMEM, "out of memory");
    } else if (!strcmp(k, "gpu")) {
      if (!cJSON_IsArray(it))
        return st_set_error(ST_EFORMAT, "%s: \"gpu\" must be an array of device numbers (as nvidia-smi numbers them)", path);
      c->n_gpu = 0;
      c->gpu_listed = 1;
      for (const cJSON *g = it->child; g; g = g->next) {
        if (!whole_number(g, 0, 1023, &v))
          return st_set_error(ST_EFORMAT, "%s: \"gpu\" must hold whole device numbers 0..1023", path);
        if (c->n_gpu == ST_CONFIG_MAX_GPUS)
          return st_set_error(ST_EFORMAT, "%s: \"gpu\" lists more than %d devices", path, ST_CONFIG_MAX_GPUS);
        for (int i = 0; i < c->n_gpu; i++)
          if (c->gpu[i] == (int)v) return st_set_error(ST_EFORMAT, "%s: \"gpu\" lists device %ld twice", path, v);
        c->gpu[c->n_gpu++] = (int)v;
      }
    } else if (!strcmp(k, "args")) {
      if (!cJSON_IsArray(it)) return st_set_error(ST_EFORMAT, "%s: \"args\" must be an array of strings", path);
      int n = cJSON_GetArraySize(it);
      for (int i = 0; i < c->n_args; i++) free(c->args[i]);
      free(c->args);
      c->n_args = 0;
      if (!(c->args = calloc((size_t)n + 1, sizeof *c->args))) return st_set_error(ST_ENOMEM, "out of memory");
      for (const cJSON *a = it->child; a; a = a->next) {
        if (!cJSON_IsString(a)) return st_set_error(ST_EFORMAT, "%s: \"args\" must be an array of strings", path);
        if (!(c->args[c->n_args++] = dup_str(a->valuestring))) return st_set_error(ST_ENOMEM, "out of memory");
      }
    } else if (!strcmp(k, "host")) {
      if (!cJSON_IsString(it) || !*it->valuestring)
        return st_set_error(ST_EFORMAT, "%s: \"host\" must be a non-empty string (an IP address)", path);
      free(c->host);
      if (!(c->host = dup_str(it->valuestring))) return st_set_error(ST_ENOMEM, "out of memory");
    } else if (!strcmp(k, "port")) {
      if (!whole_number(it, 0, 65535, &v))
        return st_set_error(ST_EFORMAT, "%s: \"port\" must be a whole number 0..65535 (0: any free port)", path);
      c->port = (int)v;
    } else if (!strcmp(k, "name")) {
      if (!cJSON_IsString(it) || !*it->valuestring)
        return st_set_error(ST_EFORMAT, "%s: \"name\" must be a non-empty string", path);
      free(c->name);
      if (!(c->name = dup_str(it->valuestring))) return st_set_error(ST_ENOMEM, "out of memory");
    } else if (!strcmp(k, "max_tokens")) {
      if (!whole_number(it, 1, INT_MAX, &v))
        return st_set_error(ST_EFORMAT, "%s: \"max_tokens\" must be a whole number >= 1", path);
      c->max_tokens = (int)v;
    } else if (!strcmp(k, "remote_expert_opt")) {
      if (!cJSON_IsBool(it)) return st_set_error(ST_EFORMAT, "%s: \"remote_expert_opt\" must be true or false", path);
      c->remote_expert_opt = cJSON_IsTrue(it);
      c->has_remote_expert_opt = 1;
    } else {
      return st_set_error(ST_EFORMAT,
                          "%s: unknown key \"%s\" (known: model, gpu, args, host, port, name, max_tokens, "
                          "remote_expert_opt)",
                          path, k);
    }
  }
  if (!c->model) return st_set_error(ST_EFORMAT, "%s: missing key \"model\" (the GGUF path)", path);
  return 0;
}

int st_config_load(const char *path, struct st_config *c) {
  *c = (struct st_config){.port = 8080};
  size_t len = 0;
  char *text = st_read_file(path, &len);
  if (!text) return ST_EIO; /* st_read_file named the file and the reason */
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  int rc;
  if (!root) {
    const char *at = cJSON_GetErrorPtr();
    size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : len;
    rc = st_set_error(ST_EFORMAT, "%s: invalid JSON near byte %zu", path, off);
  } else {
    while (end && end < text + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (end && end < text + len)
      rc = st_set_error(ST_EFORMAT, "%s: text after the JSON object at byte %zu", path, (size_t)(end - text));
    else
      rc = parse(path, root, c);
  }
  cJSON_Delete(root);
  free(text);
  if (!rc && !c->host && !(c->host = dup_str("127.0.0.1"))) rc = st_set_error(ST_ENOMEM, "out of memory");
  if (!rc && !c->name && !(c->name = default_name(path))) rc = st_set_error(ST_ENOMEM, "out of memory");
  if (!rc && !st_utf8_valid(c->name, strlen(c->name)))
    rc = st_set_error(ST_EFORMAT, "%s: the file name is not valid UTF-8 and serves as the model name: give \"name\"", path);
  return rc;
}

void st_config_free(struct st_config *c) {
  if (!c) return;
  free(c->model);
  for (int i = 0; i < c->n_args; i++) free(c->args[i]);
  free(c->args);
  free(c->host);
  free(c->name);
  *c = (struct st_config){0};
}

/* The value of --peer-device among the args ("--peer-device N" or "--peer-device=N"):
 * 1 and *pos when present with a number, -1 when present without one, 0 when absent. */
static int find_peer_device(const struct st_config *c, long *pos) {
  for (int i = 0; i < c->n_args; i++) {
    const char *a = c->args[i], *val = NULL;
    if (!strcmp(a, "--peer-device"))
      val = i + 1 < c->n_args ? c->args[i + 1] : NULL;
    else if (!strncmp(a, "--peer-device=", 14))
      val = a + 14;
    else
      continue;
    char *end;
    if (!val) return -1;
    errno = 0;
    *pos = strtol(val, &end, 10);
    return errno || end == val || *end ? -1 : 1;
  }
  return 0;
}

static int has_arg(const struct st_config *c, const char *prefix) {
  for (int i = 0; i < c->n_args; i++)
    if (!strncmp(c->args[i], prefix, strlen(prefix))) return 1;
  return 0;
}

static int add_arg(struct st_config *c, const char *a) {
  char **grown = realloc(c->args, sizeof *grown * ((size_t)c->n_args + 1));
  if (!grown) return st_set_error(ST_ENOMEM, "out of memory");
  c->args = grown;
  if (!(c->args[c->n_args] = dup_str(a))) return st_set_error(ST_ENOMEM, "out of memory");
  c->n_args++;
  return 0;
}

int st_config_apply_gpus(struct st_config *c) {
  long pos = 0;
  const int peer = find_peer_device(c, &pos);
  const int helpers = has_arg(c, "--expert-cache-device");
  char list[ST_CONFIG_MAX_GPUS * 6 + 1] = "";
  for (int i = 0; i < c->n_gpu; i++)
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? "," : "", c->gpu[i]);
  if (peer && (c->n_gpu < 2 || peer < 0 || pos < 1 || pos >= c->n_gpu))
    return st_set_error(ST_EINVAL, "--peer-device N counts positions in \"gpu\": [%s], so it needs a second GPU there and N in 1..%d",
                        list, c->n_gpu > 1 ? c->n_gpu - 1 : 1);
  if (c->gpu_listed && c->n_gpu == 0) {
    if (setenv("CUDA_VISIBLE_DEVICES", "", 1) || setenv("STARPU_NCUDA", "0", 1))
      return st_set_error(ST_ERUNTIME, "cannot set CUDA_VISIBLE_DEVICES: %s", strerror(errno));
    fprintf(stderr, "strata serve: \"gpu\": []: no GPU, the CPU pool computes everything (STARPU_NCUDA=0)\n");
  }
  if (c->n_gpu > 0) {
    /* nvidia-smi numbers cards in PCI bus order; CUDA's default order is fastest first. */
    if (setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1) || setenv("CUDA_VISIBLE_DEVICES", list, 1))
      return st_set_error(ST_ERUNTIME, "cannot set CUDA_VISIBLE_DEVICES: %s", strerror(errno));
    fprintf(stderr, "strata serve: \"gpu\": [%s]: CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=%s (nvidia-smi's card %d is CUDA0)\n",
            list, list, c->gpu[0]);
  }
  if (c->n_gpu > 1) {
    if (peer)
      fprintf(stderr, "strata serve: --peer-device %ld: the peer tier on nvidia-smi's card %d\n", pos, c->gpu[pos]);
    else if (helpers)
      fprintf(stderr, "strata serve: %d GPUs with --expert-cache-device1..3: helper caches on the cards after the first\n", c->n_gpu);
    else if (!has_arg(c, "--layer-split")) {
      fprintf(stderr, "strata serve: %d GPUs without --peer-device: a layer split (--layer-split auto)\n", c->n_gpu);
      int rc = add_arg(c, "--layer-split");
      if (!rc) rc = add_arg(c, "auto");
      if (rc) return rc;
    }
  }
  if (c->has_remote_expert_opt && c->remote_expert_opt) {
    if (helpers && !has_arg(c, "--remote-expert-opt")) {
      int rc = add_arg(c, "--remote-expert-opt");
      if (rc) return rc;
    } else if (!helpers) {
      fprintf(stderr, "strata serve: \"remote_expert_opt\": true has no effect without a helper cache (--expert-cache-device1..3)\n");
    }
  }
  return 0;
}
