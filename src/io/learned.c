/* Learned expert profiles (see learned.h). */
#include "io/learned.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common.h"
#include "io/gguf.h"
#include "io/model.h"
#include "io/profile.h"

void st_learned_identity(const struct st_model *m, char out[17]) {
  const struct st_gguf *g = m->gguf;
  XXH64_state_t *st = XXH64_createState();
  uint64_t h = 0;
  if (st && XXH64_reset(st, 0) != XXH_ERROR) {
    uint8_t size[8];
    for (int i = 0; i < 8; i++) size[i] = (uint8_t)((uint64_t)g->size >> (8 * i));
    XXH64_update(st, size, sizeof size);
    const size_t head = g->data_offset < g->size ? (size_t)g->data_offset : g->size;
    if (g->map && head) XXH64_update(st, g->map, head);
    h = XXH64_digest(st);
  }
  XXH64_freeState(st);
  snprintf(out, 17, "%016llx", (unsigned long long)h);
}

/* The cache folder into dir[cap]: $XDG_CACHE_HOME/strata or $HOME/.cache/strata. 0, or -1 when
 * neither variable gives an absolute path. */
static int cache_dir(char *dir, size_t cap) {
  const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (x && x[0] == '/') snprintf(dir, cap, "%s/strata", x);
  else if (home && home[0] == '/') snprintf(dir, cap, "%s/.cache/strata", home);
  else return -1;
  return 0;
}

/* The file's counts into cur[n] and its tokens into *tokens: 0; 1 where there is no file (cur
 * zeroed); else st_profile_load's error (negative, cur zeroed), for a file that does not parse or fit. */
static int read_counts(const struct st_learned *l, uint64_t *cur, size_t n, uint64_t *tokens) {
  memset(cur, 0, sizeof *cur * n);
  *tokens = 0;
  if (access(l->path, F_OK)) return 1;
  struct st_profile prof;
  const int rc = st_profile_load(l->path, l->n_layer, l->n_expert, l->top_k, &prof);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++) cur[(size_t)prof.pairs[i].layer * l->n_expert + prof.pairs[i].expert] = prof.pairs[i].count;
  *tokens = prof.tokens;
  st_profile_free(&prof);
  return 0;
}

int st_learned_open(struct st_learned *l, const struct st_model *m) {
  memset(l, 0, sizeof *l);
  l->n_layer = m->hp.n_layer;
  l->n_expert = m->hp.n_expert;
  l->top_k = m->hp.n_expert_used;
  const size_t n = (size_t)l->n_layer * l->n_expert;
  l->base = calloc(n ? n : 1, sizeof *l->base);
  l->saved = calloc(n ? n : 1, sizeof *l->saved);
  if (!l->base || !l->saved) return st_set_error(ST_ENOMEM, "out of memory for the learned expert profile");
  char dir[3600];
  if (cache_dir(dir, sizeof dir)) {
    fprintf(stderr, "strata: warning: neither XDG_CACHE_HOME nor HOME is an absolute path: no learned expert profile\n");
    return 0;
  }
  if (st_mkdir_p(dir, 0700)) {
    fprintf(stderr, "strata: warning: cannot make %s (%s): no learned expert profile\n", dir, strerror(errno));
    return 0;
  }
  /* the model file's name without its folder and .gguf, in letters, digits, '.', '-' and '_' */
  const char *path = m->gguf->path, *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  char name[200];
  size_t k = 0;
  for (const char *p = base; *p && k + 1 < sizeof name; p++)
    name[k++] = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
                        *p == '-' || *p == '_'
                    ? *p
                    : '_';
  name[k] = 0;
  if (k > 5 && !strcmp(name + k - 5, ".gguf")) name[k - 5] = 0;
  char id[17];
  st_learned_identity(m, id);
  snprintf(l->path, sizeof l->path, "%s/%s-%s.profile", dir, name, id);
  const int rc = read_counts(l, l->base, n, &l->base_tokens);
  if (rc < 0)
    fprintf(stderr, "strata: warning: ignoring the learned expert profile %s: %s (the next save rewrites it)\n", l->path,
            st_last_error());
  l->loaded = !rc;
  return 0;
}

int st_learned_save(struct st_learned *l, const uint64_t *counts, uint64_t tokens) {
  if (!l->path[0]) return 0;
  const size_t n = (size_t)l->n_layer * l->n_expert;
  uint64_t *sum = malloc(sizeof *sum * (n ? n : 1));
  if (!sum) return st_set_error(ST_ENOMEM, "out of memory saving %s", l->path);
  /* one saver at a time (a lock that cannot be had only loses that guarantee, not the save) */
  char lock[4200];
  snprintf(lock, sizeof lock, "%s.lock", l->path);
  const int lfd = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lfd >= 0)
    while (flock(lfd, LOCK_EX) && errno == EINTR) continue;
  uint64_t file_tokens;
  read_counts(l, sum, n, &file_tokens); /* none, or one that does not fit: rewritten whole */
  for (size_t i = 0; i < n; i++) sum[i] += counts[i] - l->saved[i];
  const uint64_t total = file_tokens + tokens - l->saved_tokens;
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.XXXXXX", l->path);
  const int fd = mkstemp(tmp);
  int rc = 0;
  if (fd < 0) {
    rc = st_set_error(ST_EIO, "%s: cannot create a temporary file beside it: %s", l->path, strerror(errno));
  } else {
    fchmod(fd, 0644);
    close(fd);
    rc = st_profile_write(tmp, l->n_layer, l->n_expert, l->top_k, total, sum);
    if (!rc) { /* on disk before it replaces the old file */
      const int f = open(tmp, O_RDONLY);
      if (f < 0 || fsync(f)) rc = st_set_error(ST_EIO, "%s: cannot sync: %s", tmp, strerror(errno));
      if (f >= 0) close(f);
    }
    if (!rc && rename(tmp, l->path)) rc = st_set_error(ST_EIO, "%s: cannot rename %s over it: %s", l->path, tmp, strerror(errno));
    if (rc) unlink(tmp);
  }
  if (lfd >= 0) close(lfd); /* releases the lock */
  free(sum);
  if (!rc) {
    memcpy(l->saved, counts, sizeof *counts * n);
    l->saved_tokens = tokens;
    l->file_tokens = total;
  }
  return rc;
}

void st_learned_close(struct st_learned *l) {
  free(l->base);
  free(l->saved);
  l->base = l->saved = NULL;
}
