/* The events.tsv parser and the exporters of `strata trace` declared in io/trace.h: the SVG
 * timeline (libxml2's xmlTextWriter), the Chrome trace-event JSON, the text summary with the
 * critical path of a decode step, and the call of starpu_fxt_tool for StarPU's paje.trace. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* posix_spawn_file_actions_addchdir_np */
#endif
#include "io/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libxml/xmlwriter.h>

#include "common.h"

extern char **environ;

static const char *const kind_names[ST_TRACE_NKINDS] = {
    "attention", "attn_output", "router", "expert_rows", "combine", "output_head", "decode_layer", "decode_lane",
    "prompt_lane", "transfer"};

const char *st_trace_kind_name(int kind) {
  return kind >= 0 && kind < ST_TRACE_NKINDS ? kind_names[kind] : NULL;
}

/* ---- parsing ---- */

/* 1 when s[0..n) is valid UTF-8 without control characters other than tab. */
static int text_ok(const unsigned char *s, size_t n, const char **why) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t') || c == 0x7f) {
        *why = "control character";
        return 0;
      }
      i++;
      continue;
    }
    size_t len;
    unsigned min;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) len = 2, min = 0x80, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0) len = 3, min = 0x800, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0) len = 4, min = 0x10000, cp = c & 0x07;
    else {
      *why = "invalid UTF-8";
      return 0;
    }
    if (i + len > n) {
      *why = "invalid UTF-8";
      return 0;
    }
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xc0) != 0x80) {
        *why = "invalid UTF-8";
        return 0;
      }
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || cp == 0xfffe || cp == 0xffff) {
      *why = "invalid UTF-8";
      return 0;
    }
    i += len;
  }
  return 1;
}

struct lineinfo {
  const char *path;
  size_t line;
};

static int bad(const struct lineinfo *li, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const struct lineinfo *li, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return st_set_error(ST_EFORMAT, "%s:%zu: %s", li->path, li->line, what);
}

static int field_long(const struct lineinfo *li, const char *what, const char *s, long lo, long hi,
                      long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end) return bad(li, "%s: expected a whole number, got '%.40s'", what, s);
  if (v < lo || v > hi) return bad(li, "%s: %ld is out of range [%ld, %ld]", what, v, lo, hi);
  *out = v;
  return 0;
}

static int field_us(const struct lineinfo *li, const char *what, const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v))
    return bad(li, "%s: expected a time in microseconds, got '%.40s'", what, s);
  if (v < 0 || v > 1e15) return bad(li, "%s: %g µs is out of range", what, v);
  *out = v;
  return 0;
}

static int field_u64(const struct lineinfo *li, const char *what, const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  if (*s < '0' || *s > '9') return bad(li, "%s: expected a byte count, got '%.40s'", what, s);
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return bad(li, "%s: expected a byte count, got '%.40s'", what, s);
  *out = v;
  return 0;
}

/* Grows *arr (of *cap elements of `size` bytes) to hold n+1 elements. */
static int grow(void **arr, size_t *cap, size_t n, size_t size) {
  if (n < *cap) return 0;
  size_t nc = *cap ? *cap * 2 : 64;
  if (nc > SIZE_MAX / size) return st_set_error(ST_ENOMEM, "trace too large");
  void *p = realloc(*arr, nc * size);
  if (!p) return st_set_error(ST_ENOMEM, "out of memory reading the trace");
  *arr = p;
  *cap = nc;
  return 0;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

static int tier_ok(const char *s) {
  if (!strcmp(s, "-")) return 1;
  size_t n = strlen(s);
  if (n == 0 || n >= sizeof ((struct st_trace_task *)0)->tier) return 0;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
          s[i] == '_' || s[i] == '-'))
      return 0;
  return 1;
}

#define MAX_FIELDS 11

static int parse_record(struct st_trace *tr, const struct lineinfo *li, char **f, int nf, size_t *cap_w,
                        size_t *cap_s, size_t *cap_t) {
  int rc;
  long v;
  if (!strcmp(f[0], "model")) {
    if (nf != 2) return bad(li, "model: expected 2 fields, got %d", nf);
    if (tr->model) return bad(li, "a second model line");
    if (!(tr->model = dup_str(f[1]))) return st_set_error(ST_ENOMEM, "out of memory");
    return 0;
  }
  if (!strcmp(f[0], "worker")) {
    if (nf != 4) return bad(li, "worker: expected 4 fields, got %d", nf);
    struct st_trace_worker w = {0};
    if ((rc = field_long(li, "worker id", f[1], 0, INT_MAX, &v))) return rc;
    w.id = (int)v;
    if (!strcmp(f[2], "CPU")) w.is_cuda = 0;
    else if (!strcmp(f[2], "CUDA")) w.is_cuda = 1;
    else return bad(li, "worker kind must be CPU or CUDA, got '%.40s'", f[2]);
    if (!*f[3]) return bad(li, "worker %d has an empty name", w.id);
    for (size_t i = 0; i < tr->n_workers; i++)
      if (tr->workers[i].id == w.id) return bad(li, "worker %d declared twice", w.id);
    if ((rc = grow((void **)&tr->workers, cap_w, tr->n_workers, sizeof w))) return rc;
    if (!(w.name = dup_str(f[3]))) return st_set_error(ST_ENOMEM, "out of memory");
    tr->workers[tr->n_workers++] = w;
    return 0;
  }
  if (!strcmp(f[0], "step")) {
    if (nf != 5) return bad(li, "step: expected 5 fields, got %d", nf);
    struct st_trace_step s = {0};
    if (!strcmp(f[1], "prompt")) s.is_decode = 0;
    else if (!strcmp(f[1], "decode")) s.is_decode = 1;
    else return bad(li, "step kind must be prompt or decode, got '%.40s'", f[1]);
    if ((rc = field_long(li, "step index", f[2], 0, INT_MAX, &v))) return rc;
    s.index = (int)v;
    if ((rc = field_us(li, "step start", f[3], &s.start_us)) || (rc = field_us(li, "step end", f[4], &s.end_us)))
      return rc;
    if (s.end_us < s.start_us) return bad(li, "step ends (%.3f µs) before it starts (%.3f µs)", s.end_us, s.start_us);
    if ((rc = grow((void **)&tr->steps, cap_s, tr->n_steps, sizeof s))) return rc;
    tr->steps[tr->n_steps++] = s;
    return 0;
  }
  if (!strcmp(f[0], "task")) {
    if (nf != 10) return bad(li, "task: expected 10 fields, got %d", nf);
    struct st_trace_task t = {0};
    t.kind = -1;
    for (int k = 0; k < ST_TRACE_NKINDS; k++)
      if (!strcmp(f[1], kind_names[k])) t.kind = k;
    if (t.kind < 0) return bad(li, "unknown task kind '%.40s'", f[1]);
    if ((rc = field_long(li, "layer", f[2], -1, INT_MAX, &v))) return rc;
    t.layer = (int)v;
    if ((rc = field_long(li, "expert", f[3], -1, INT_MAX, &v))) return rc;
    t.expert = (int)v;
    if (!tier_ok(f[4])) return bad(li, "tier must be CPU, CUDA<n> or -, got '%.40s'", f[4]);
    snprintf(t.tier, sizeof t.tier, "%s", f[4]);
    if ((rc = field_long(li, "worker id", f[5], 0, INT_MAX, &v))) return rc;
    t.worker = -1;
    for (size_t i = 0; i < tr->n_workers; i++)
      if (tr->workers[i].id == v) t.worker = (int)i;
    if (t.worker < 0) return bad(li, "task on worker %ld, which no worker line before it declares", v);
    if ((rc = field_us(li, "task start", f[6], &t.start_us)) || (rc = field_us(li, "task end", f[7], &t.end_us)))
      return rc;
    if (t.end_us < t.start_us) return bad(li, "task ends (%.3f µs) before it starts (%.3f µs)", t.end_us, t.start_us);
    if ((rc = field_u64(li, "bytes", f[8], &t.bytes))) return rc;
    if (!*f[9]) return bad(li, "task with an empty name");
    if ((rc = grow((void **)&tr->tasks, cap_t, tr->n_tasks, sizeof t))) return rc;
    if (!(t.name = dup_str(f[9]))) return st_set_error(ST_ENOMEM, "out of memory");
    tr->tasks[tr->n_tasks++] = t;
    return 0;
  }
  return bad(li, "unknown record '%.40s' (expected model, worker, step or task)", f[0]);
}

static void set_span(struct st_trace *tr);

int st_trace_load(const char *path, struct st_trace *tr) {
  memset(tr, 0, sizeof *tr);
  FILE *fp = st_fopen_regular(path);
  if (!fp) return ST_EIO;
  struct lineinfo li = {path, 0};
  char *line = NULL;
  size_t lcap = 0, cap_w = 0, cap_s = 0, cap_t = 0;
  ssize_t len;
  int rc = 0;
  while ((len = getline(&line, &lcap, fp)) >= 0) {
    li.line++;
    if (len > 0 && line[len - 1] == '\n') line[--len] = 0;
    if (len > 0 && line[len - 1] == '\r') line[--len] = 0;
    const char *why;
    if (memchr(line, 0, (size_t)len)) {
      rc = bad(&li, "NUL byte");
      break;
    }
    if (!text_ok((const unsigned char *)line, (size_t)len, &why)) {
      rc = bad(&li, "%s", why);
      break;
    }
    if (li.line == 1) {
      if (strcmp(line, "# strata trace v1")) {
        rc = bad(&li, "not a strata event log (the first line must be '# strata trace v1')");
        break;
      }
      continue;
    }
    if (len == 0 || line[0] == '#') continue;
    char *f[MAX_FIELDS];
    int nf = 0;
    for (char *p = line;;) {
      if (nf == MAX_FIELDS) {
        nf++;
        break;
      }
      f[nf++] = p;
      char *tab = strchr(p, '\t');
      if (!tab) break;
      *tab = 0;
      p = tab + 1;
    }
    if (nf > MAX_FIELDS) {
      rc = bad(&li, "%s: too many fields", f[0]);
      break;
    }
    if ((rc = parse_record(tr, &li, f, nf, &cap_w, &cap_s, &cap_t))) break;
  }
  if (!rc && ferror(fp)) rc = st_set_error(ST_EIO, "%s: read error", path);
  if (!rc && li.line == 0) rc = st_set_error(ST_EFORMAT, "%s: empty file", path);
  if (!rc && tr->n_workers == 0) rc = st_set_error(ST_EFORMAT, "%s: no worker line", path);
  if (!rc && tr->n_tasks == 0) rc = st_set_error(ST_EFORMAT, "%s: no task line", path);
  free(line);
  fclose(fp);
  if (rc) return rc;
  set_span(tr);
  return 0;
}

int st_trace_keep_step(struct st_trace *tr, int is_decode, int index) {
  const struct st_trace_step *step = NULL;
  for (size_t i = 0; i < tr->n_steps; i++)
    if (tr->steps[i].is_decode == is_decode && tr->steps[i].index == index) step = &tr->steps[i];
  if (!step) {
    size_t n_kind = 0; /* the steps of the asked kind: indices 0 .. n_kind - 1 */
    for (size_t i = 0; i < tr->n_steps; i++) n_kind += tr->steps[i].is_decode == is_decode;
    return st_set_error(ST_EINVAL, "the trace has no %s step %d (%zu %s steps recorded, %zu in all)",
                        is_decode ? "decode" : "prompt", index, n_kind, is_decode ? "decode" : "prompt", tr->n_steps);
  }
  const struct st_trace_step keep = *step;
  size_t n = 0;
  for (size_t i = 0; i < tr->n_tasks; i++) {
    if (tr->tasks[i].start_us >= keep.start_us && tr->tasks[i].start_us <= keep.end_us) {
      const struct st_trace_task t = tr->tasks[i];
      tr->tasks[i] = tr->tasks[n];
      tr->tasks[n++] = t;
    }
  }
  for (size_t i = n; i < tr->n_tasks; i++) {
    free(tr->tasks[i].name);
    tr->tasks[i].name = NULL;
  }
  tr->n_tasks = n;
  tr->steps[0] = keep;
  tr->n_steps = 1;
  if (n == 0) return st_set_error(ST_EINVAL, "%s step %d has no task", is_decode ? "decode" : "prompt", index);
  set_span(tr);
  return 0;
}

static void set_span(struct st_trace *tr) {
  tr->t0_us = INFINITY;
  tr->t1_us = 0;
  for (size_t i = 0; i < tr->n_tasks; i++) {
    tr->t0_us = fmin(tr->t0_us, tr->tasks[i].start_us);
    tr->t1_us = fmax(tr->t1_us, tr->tasks[i].end_us);
  }
  for (size_t i = 0; i < tr->n_steps; i++) {
    tr->t0_us = fmin(tr->t0_us, tr->steps[i].start_us);
    tr->t1_us = fmax(tr->t1_us, tr->steps[i].end_us);
  }
}

void st_trace_free(struct st_trace *tr) {
  free(tr->model);
  for (size_t i = 0; i < tr->n_workers; i++) free(tr->workers[i].name);
  for (size_t i = 0; i < tr->n_tasks; i++) free(tr->tasks[i].name);
  free(tr->workers);
  free(tr->steps);
  free(tr->tasks);
  memset(tr, 0, sizeof *tr);
}

/* ---- shared helpers ---- */

static const struct st_trace *sort_tr;
static int by_start(const void *a, const void *b) {
  const struct st_trace_task *x = &sort_tr->tasks[*(const size_t *)a], *y = &sort_tr->tasks[*(const size_t *)b];
  if (x->start_us != y->start_us) return x->start_us < y->start_us ? -1 : 1;
  if (x->end_us != y->end_us) return x->end_us < y->end_us ? -1 : 1;
  return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}
static int by_end(const void *a, const void *b) {
  const struct st_trace_task *x = &sort_tr->tasks[*(const size_t *)a], *y = &sort_tr->tasks[*(const size_t *)b];
  if (x->end_us != y->end_us) return x->end_us < y->end_us ? -1 : 1;
  if (x->start_us != y->start_us) return x->start_us < y->start_us ? -1 : 1;
  return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/* Task indices sorted by start (malloc'd), or NULL. qsort has no context argument, hence the
 * file-local pointer; the exporters run on one thread. */
static size_t *sorted_tasks(const struct st_trace *tr, int (*cmp)(const void *, const void *), const size_t *sel,
                            size_t n) {
  size_t *ix = malloc(sizeof *ix * (n ? n : 1));
  if (!ix) return NULL;
  for (size_t i = 0; i < n; i++) ix[i] = sel ? sel[i] : i;
  sort_tr = tr;
  qsort(ix, n, sizeof *ix, cmp);
  return ix;
}

static int by_step_start(const void *a, const void *b) {
  const struct st_trace_step *x = a, *y = b;
  if (x->start_us != y->start_us) return x->start_us < y->start_us ? -1 : 1;
  return 0;
}

/* Distinct expert_rows tiers, CPU first, then CUDA0, then by name; at most `max`. */
#define MAX_TIERS 16
static size_t expert_tiers(const struct st_trace *tr, const char *tiers[MAX_TIERS]) {
  size_t n = 0;
  for (size_t i = 0; i < tr->n_tasks && n < MAX_TIERS; i++) {
    const struct st_trace_task *t = &tr->tasks[i];
    if (t->kind != ST_TRACE_EXPERT_ROWS) continue;
    size_t k = 0;
    while (k < n && strcmp(tiers[k], t->tier)) k++;
    if (k == n) tiers[n++] = t->tier;
  }
  for (size_t i = 1; i < n; i++)
    for (size_t j = i; j > 0; j--) {
      const char *a = tiers[j - 1], *b = tiers[j];
      int ra = !strcmp(a, "CPU") ? 0 : !strcmp(a, "CUDA0") ? 1 : 2;
      int rb = !strcmp(b, "CPU") ? 0 : !strcmp(b, "CUDA0") ? 1 : 2;
      if (ra < rb || (ra == rb && strcmp(a, b) <= 0)) break;
      tiers[j - 1] = b;
      tiers[j] = a;
    }
  return n;
}

/* ---- SVG timeline ---- */

static const char *const kind_colour[ST_TRACE_NKINDS] = {
    "#4e79a7", /* attention: blue */
    "#76b7b2", /* attn_output: teal */
    "#f28e2b", /* router: orange */
    "#59a14f", /* expert_rows (CPU pool; other tiers below) */
    "#edc948", /* combine: yellow */
    "#9c755f", /* output_head: brown */
    "#4e79a7", /* decode_layer: blue, as attention (most of it) */
    "#76b7b2", /* decode_lane: teal */
    "#59a14f", /* prompt_lane: green, as the CPU pool's experts (most of it) */
    "#bab0ac", /* transfer: grey */
};
/* expert_rows by tier: CPU pool green, CUDA0 (primary cache) red, helpers and peer after. */
static const char *const tier_palette[] = {"#b07aa1", "#ff9da7", "#17becf", "#9467bd", "#8c564b", "#bcbd22"};

static const char *tier_colour(const char *tier, const char *const *tiers, size_t n_tiers) {
  if (!strcmp(tier, "CPU")) return "#59a14f";
  if (!strcmp(tier, "CUDA0")) return "#e15759";
  size_t k = 0, other = 0;
  for (; k < n_tiers; k++) {
    if (!strcmp(tiers[k], tier)) break;
    if (strcmp(tiers[k], "CPU") && strcmp(tiers[k], "CUDA0")) other++;
  }
  return tier_palette[other % (sizeof tier_palette / sizeof tier_palette[0])];
}

static const char *task_colour(const struct st_trace_task *t, const char *const *tiers, size_t n_tiers) {
  return t->kind == ST_TRACE_EXPERT_ROWS ? tier_colour(t->tier, tiers, n_tiers) : kind_colour[t->kind];
}

#define CK(x)               \
  do {                      \
    if ((x) < 0) goto fail; \
  } while (0)

static int svg_text(xmlTextWriterPtr w, double x, double y, const char *anchor, int size, const char *fill,
                    const char *text) {
  if (xmlTextWriterStartElement(w, BAD_CAST "text") < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "x", "%.1f", x) < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "y", "%.1f", y) < 0) return -1;
  if (anchor && xmlTextWriterWriteAttribute(w, BAD_CAST "text-anchor", BAD_CAST anchor) < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "font-size", "%d", size) < 0) return -1;
  if (fill && xmlTextWriterWriteAttribute(w, BAD_CAST "fill", BAD_CAST fill) < 0) return -1;
  if (xmlTextWriterWriteString(w, BAD_CAST text) < 0) return -1;
  return xmlTextWriterEndElement(w);
}

static int svg_line(xmlTextWriterPtr w, const char *cls, double x1, double y1, double x2, double y2,
                    const char *stroke, double width, const char *dash) {
  if (xmlTextWriterStartElement(w, BAD_CAST "line") < 0) return -1;
  if (cls && xmlTextWriterWriteAttribute(w, BAD_CAST "class", BAD_CAST cls) < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "x1", "%.2f", x1) < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "y1", "%.1f", y1) < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "x2", "%.2f", x2) < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "y2", "%.1f", y2) < 0) return -1;
  if (xmlTextWriterWriteAttribute(w, BAD_CAST "stroke", BAD_CAST stroke) < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "stroke-width", "%.2f", width) < 0) return -1;
  if (dash && xmlTextWriterWriteAttribute(w, BAD_CAST "stroke-dasharray", BAD_CAST dash) < 0) return -1;
  return xmlTextWriterEndElement(w);
}

static int svg_rect(xmlTextWriterPtr w, const char *cls, double x, double y, double wd, double h,
                    const char *fill, int close) {
  if (xmlTextWriterStartElement(w, BAD_CAST "rect") < 0) return -1;
  if (cls && xmlTextWriterWriteAttribute(w, BAD_CAST "class", BAD_CAST cls) < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "x", "%.2f", x) < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "y", "%.1f", y) < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "width", "%.2f", wd) < 0) return -1;
  if (xmlTextWriterWriteFormatAttribute(w, BAD_CAST "height", "%.1f", h) < 0) return -1;
  if (xmlTextWriterWriteAttribute(w, BAD_CAST "fill", BAD_CAST fill) < 0) return -1;
  return close ? xmlTextWriterEndElement(w) : 0;
}

/* Layout, in px. */
enum { LABEL_W = 220, RIGHT_M = 30, TOP = 70, LANE_H = 22, LANE_PITCH = 26, LEGEND_COL = 210 };

/* A tick step of 1, 2 or 5 times a power of ten, giving at least `min_px` between ticks. */
static double tick_step(double span_ms, double plot_w, double min_px) {
  double raw = span_ms * min_px / plot_w;
  if (!(raw > 0)) return 1;
  double mag = pow(10, floor(log10(raw)));
  const double m[] = {1, 2, 5, 10};
  for (int i = 0; i < 4; i++)
    if (m[i] * mag >= raw) return m[i] * mag;
  return 10 * mag;
}

int st_trace_write_svg(const struct st_trace *tr, const char *path) {
  const char *tiers[MAX_TIERS];
  size_t n_tiers = expert_tiers(tr, tiers);
  size_t *ix = sorted_tasks(tr, by_start, NULL, tr->n_tasks);
  struct st_trace_step *steps = malloc(sizeof *steps * (tr->n_steps + 1));
  int max_layer = -1;
  for (size_t i = 0; i < tr->n_tasks; i++)
    if (tr->tasks[i].layer > max_layer) max_layer = tr->tasks[i].layer;
  double *layer_start = malloc(sizeof *layer_start * (size_t)(max_layer + 2));
  if (!ix || !steps || !layer_start) {
    free(ix), free(steps), free(layer_start);
    return st_set_error(ST_ENOMEM, "out of memory writing %s", path);
  }
  /* Layer boundaries are found within each step (the whole trace when it has none). */
  size_t n_windows = tr->n_steps;
  if (n_windows) {
    memcpy(steps, tr->steps, sizeof *steps * n_windows);
    qsort(steps, n_windows, sizeof *steps, by_step_start);
  } else {
    steps[0] = (struct st_trace_step){.is_decode = 1, .index = 0, .start_us = tr->t0_us, .end_us = tr->t1_us};
    n_windows = 1;
  }

  double span_us = tr->t1_us - tr->t0_us;
  if (!(span_us > 0)) span_us = 1;
  double plot_w = 360.0 * (double)n_windows;
  plot_w = plot_w < 1400 ? 1400 : plot_w > 24000 ? 24000 : plot_w;
  double scale = plot_w / span_us; /* px per µs */
  double width = LABEL_W + plot_w + RIGHT_M;
  double lanes_bottom = TOP + (double)tr->n_workers * LANE_PITCH;
  double axis_y = lanes_bottom + 6;
  double legend_y = axis_y + 50;
  size_t n_legend = ST_TRACE_NKINDS - 1 + (n_tiers ? n_tiers : 1) + 2;
  size_t per_row = (size_t)((width - 20) / LEGEND_COL);
  if (per_row < 1) per_row = 1;
  double height = legend_y + (double)((n_legend + per_row - 1) / per_row) * 22 + 16;
  char buf[1024];
  int rc = 0;

  /* the file opened here (one error line of ours where it cannot be, not libxml2's I/O messages) and
   * handed to the writer, which flushes it and leaves it to us to close */
  FILE *f = fopen(path, "w");
  xmlOutputBufferPtr ob = f ? xmlOutputBufferCreateFile(f, NULL) : NULL;
  xmlTextWriterPtr w = ob ? xmlNewTextWriter(ob) : NULL;
  if (!w) {
    const int e = errno;
    if (ob && !w) xmlOutputBufferClose(ob);
    if (f) fclose(f);
    free(ix), free(steps), free(layer_start);
    return st_set_error(ST_EIO, "%s: cannot write: %s", path, strerror(e));
  }
  CK(xmlTextWriterSetIndent(w, 1));
  CK(xmlTextWriterStartDocument(w, NULL, "UTF-8", NULL));
  CK(xmlTextWriterStartElement(w, BAD_CAST "svg"));
  CK(xmlTextWriterWriteAttribute(w, BAD_CAST "xmlns", BAD_CAST "http://www.w3.org/2000/svg"));
  CK(xmlTextWriterWriteFormatAttribute(w, BAD_CAST "width", "%.0f", width));
  CK(xmlTextWriterWriteFormatAttribute(w, BAD_CAST "height", "%.0f", height));
  CK(xmlTextWriterWriteFormatAttribute(w, BAD_CAST "viewBox", "0 0 %.0f %.0f", width, height));
  CK(xmlTextWriterWriteAttribute(w, BAD_CAST "font-family", BAD_CAST "DejaVu Sans, Arial, sans-serif"));
  CK(svg_rect(w, "background", 0, 0, width, height, "#ffffff", 1));

  size_t n_dec = 0, n_pro = 0;
  for (size_t i = 0; i < tr->n_steps; i++) tr->steps[i].is_decode ? n_dec++ : n_pro++;
  snprintf(buf, sizeof buf, "strata trace%s%s: %zu tasks on %zu workers, %zu prompt chunk(s), %zu decode step(s), %.3f ms",
           tr->model ? " of " : "", tr->model ? tr->model : "", tr->n_tasks, tr->n_workers, n_pro, n_dec,
           span_us / 1000);
  CK(svg_text(w, 10, 20, NULL, 14, "#000000", buf));

  /* Lanes, labelled with StarPU's worker names. */
  CK(xmlTextWriterStartElement(w, BAD_CAST "g"));
  CK(xmlTextWriterWriteAttribute(w, BAD_CAST "id", BAD_CAST "lanes"));
  for (size_t i = 0; i < tr->n_workers; i++) {
    double y = TOP + (double)i * LANE_PITCH;
    CK(svg_rect(w, "lane", LABEL_W, y, plot_w, LANE_H, i % 2 ? "#f7f7f7" : "#eeeeee", 0));
    snprintf(buf, sizeof buf, "worker %d (%s): %s", tr->workers[i].id, tr->workers[i].is_cuda ? "CUDA" : "CPU",
             tr->workers[i].name);
    CK(xmlTextWriterWriteElement(w, BAD_CAST "title", BAD_CAST buf));
    CK(xmlTextWriterEndElement(w));
    /* the lane label: StarPU's name without its parenthesised details ("CUDA 0.0 (NVIDIA ...)");
     * the full name is in the lane's tooltip */
    char label[40];
    snprintf(label, sizeof label, "%.*s", (int)strcspn(tr->workers[i].name, "("), tr->workers[i].name);
    CK(svg_text(w, LABEL_W - 8, y + LANE_H / 2.0 + 4, "end", 12, "#000000", label));
  }
  CK(xmlTextWriterEndElement(w));

  /* Time axis: ms since the first recorded event, gridlines at each tick. */
  double step_ms = tick_step(span_us / 1000, plot_w, 90);
  CK(xmlTextWriterStartElement(w, BAD_CAST "g"));
  CK(xmlTextWriterWriteAttribute(w, BAD_CAST "id", BAD_CAST "axis"));
  CK(svg_line(w, NULL, LABEL_W, axis_y, LABEL_W + plot_w, axis_y, "#000000", 1, NULL));
  int decimals = step_ms >= 1 ? 0 : (int)ceil(-log10(step_ms) - 1e-9);
  for (long k = 0;; k++) {
    double ms = (double)k * step_ms;
    if (ms * 1000 > span_us * (1 + 1e-9)) break;
    double x = LABEL_W + ms * 1000 * scale;
    CK(svg_line(w, NULL, x, TOP - 2, x, lanes_bottom, "#d0d0d0", 0.5, NULL));
    CK(svg_line(w, NULL, x, axis_y, x, axis_y + 5, "#000000", 1, NULL));
    snprintf(buf, sizeof buf, "%.*f", decimals, ms);
    CK(svg_text(w, x, axis_y + 18, "middle", 11, "#000000", buf));
  }
  snprintf(buf, sizeof buf, "time (ms) since the first recorded event, at %.3f ms of engine time", tr->t0_us / 1000);
  CK(svg_text(w, LABEL_W + plot_w / 2, axis_y + 36, "middle", 12, "#000000", buf));
  CK(xmlTextWriterEndElement(w));

  /* Tasks. */
  CK(xmlTextWriterStartElement(w, BAD_CAST "g"));
  CK(xmlTextWriterWriteAttribute(w, BAD_CAST "id", BAD_CAST "tasks"));
  for (size_t k = 0; k < tr->n_tasks; k++) {
    const struct st_trace_task *t = &tr->tasks[ix[k]];
    double x = LABEL_W + (t->start_us - tr->t0_us) * scale;
    double wd = (t->end_us - t->start_us) * scale;
    double y = TOP + (double)t->worker * LANE_PITCH + 2;
    char cls[96];
    if (t->kind == ST_TRACE_EXPERT_ROWS) snprintf(cls, sizeof cls, "task expert_rows tier-%s", t->tier);
    else snprintf(cls, sizeof cls, "task %s", kind_names[t->kind]);
    CK(svg_rect(w, cls, x, y, wd < 0.5 ? 0.5 : wd, LANE_H - 4, task_colour(t, tiers, n_tiers), 0));
    /* A faint outline tells apart back-to-back tasks of one colour. */
    CK(xmlTextWriterWriteAttribute(w, BAD_CAST "stroke", BAD_CAST "#000000"));
    CK(xmlTextWriterWriteAttribute(w, BAD_CAST "stroke-opacity", BAD_CAST "0.35"));
    CK(xmlTextWriterWriteAttribute(w, BAD_CAST "stroke-width", BAD_CAST "0.3"));
    snprintf(buf, sizeof buf, "%s: %.1f µs (worker %s, layer %d, expert %d, tier %s, %llu bytes, %.3f–%.3f ms)",
             t->name, t->end_us - t->start_us, tr->workers[t->worker].name, t->layer, t->expert, t->tier,
             (unsigned long long)t->bytes, t->start_us / 1000, t->end_us / 1000);
    CK(xmlTextWriterWriteElement(w, BAD_CAST "title", BAD_CAST buf));
    CK(xmlTextWriterEndElement(w));
  }
  CK(xmlTextWriterEndElement(w));

  /* Boundaries: a solid line at each step's start (labelled P<i>/D<i>) and at the last step's
   * end; a dashed line where each layer starts inside a step (its first task, labelled L<n>). */
  CK(xmlTextWriterStartElement(w, BAD_CAST "g"));
  CK(xmlTextWriterWriteAttribute(w, BAD_CAST "id", BAD_CAST "boundaries"));
  double last_step_label = -1e9, last_layer_label = -1e9;
  size_t first = 0;
  for (size_t s = 0; s < n_windows; s++) {
    const struct st_trace_step *st = &steps[s];
    if (tr->n_steps) {
      double x = LABEL_W + (st->start_us - tr->t0_us) * scale;
      CK(svg_line(w, "step", x, TOP - 24, x, lanes_bottom, "#222222", 1.2, NULL));
      if (x - last_step_label >= 28) {
        snprintf(buf, sizeof buf, "%c%d", st->is_decode ? 'D' : 'P', st->index);
        CK(svg_text(w, x + 2, TOP - 26, NULL, 11, "#222222", buf));
        last_step_label = x;
      }
      if (s + 1 == n_windows) {
        double xe = LABEL_W + (st->end_us - tr->t0_us) * scale;
        CK(svg_line(w, "step", xe, TOP - 24, xe, lanes_bottom, "#222222", 1.2, NULL));
      }
    }
    for (int l = 0; l <= max_layer; l++) layer_start[l] = INFINITY;
    while (first < tr->n_tasks && tr->tasks[ix[first]].start_us < st->start_us) first++;
    for (size_t k = first; k < tr->n_tasks; k++) {
      const struct st_trace_task *t = &tr->tasks[ix[k]];
      if (t->start_us > st->end_us || (s + 1 < n_windows && t->start_us >= steps[s + 1].start_us)) break;
      if (t->layer >= 0 && t->start_us < layer_start[t->layer]) layer_start[t->layer] = t->start_us;
    }
    for (int l = 0; l <= max_layer; l++) {
      if (!isfinite(layer_start[l])) continue;
      double x = LABEL_W + (layer_start[l] - tr->t0_us) * scale;
      CK(svg_line(w, "layer", x, TOP - 12, x, lanes_bottom, "#555555", 0.7, "3,2"));
      if (x - last_layer_label >= 22) {
        snprintf(buf, sizeof buf, "L%d", l);
        CK(svg_text(w, x + 2, TOP - 4, NULL, 9, "#555555", buf));
        last_layer_label = x;
      }
    }
  }
  CK(xmlTextWriterEndElement(w));

  /* Legend. */
  CK(xmlTextWriterStartElement(w, BAD_CAST "g"));
  CK(xmlTextWriterWriteAttribute(w, BAD_CAST "id", BAD_CAST "legend"));
  size_t item = 0;
  for (int k = 0; k < ST_TRACE_NKINDS + 2; k++) {
    size_t n_sub = k == ST_TRACE_EXPERT_ROWS ? (n_tiers ? n_tiers : 1) : 1;
    for (size_t j = 0; j < n_sub; j++, item++) {
      double x = 10 + (double)(item % per_row) * LEGEND_COL, y = legend_y + (double)(item / per_row) * 22;
      if (k == ST_TRACE_NKINDS) {
        CK(svg_line(w, NULL, x + 8, y, x + 8, y + 14, "#222222", 1.2, NULL));
        snprintf(buf, sizeof buf, "step start (P prompt, D decode)");
      } else if (k == ST_TRACE_NKINDS + 1) {
        CK(svg_line(w, NULL, x + 8, y, x + 8, y + 14, "#555555", 0.7, "3,2"));
        snprintf(buf, sizeof buf, "layer start (first task)");
      } else {
        const char *fill = kind_colour[k];
        if (k == ST_TRACE_EXPERT_ROWS && n_tiers) {
          fill = tier_colour(tiers[j], tiers, n_tiers);
          snprintf(buf, sizeof buf, "expert_rows %s%s", tiers[j],
                   !strcmp(tiers[j], "CPU") ? " pool" : !strcmp(tiers[j], "CUDA0") ? " (primary)" : "");
        } else {
          snprintf(buf, sizeof buf, "%s", kind_names[k]);
        }
        CK(svg_rect(w, "legend", x, y, 16, 14, fill, 1));
      }
      CK(svg_text(w, x + 22, y + 12, NULL, 12, "#000000", buf));
    }
  }
  CK(xmlTextWriterEndElement(w));

  CK(xmlTextWriterEndElement(w)); /* svg */
  CK(xmlTextWriterEndDocument(w));
  xmlFreeTextWriter(w);
  w = NULL;
  if (ferror(f) | fclose(f)) rc = st_set_error(ST_EIO, "%s: error writing the SVG: %s", path, strerror(errno));
  goto done;
fail:
  rc = st_set_error(ST_EIO, "%s: error writing the SVG", path);
  xmlFreeTextWriter(w);
  fclose(f);
done:
  free(ix);
  free(steps);
  free(layer_start);
  return rc;
}

/* ---- Chrome trace-event JSON ---- */

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

int st_trace_write_json(const struct st_trace *tr, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return st_set_error(ST_EIO, "%s: %s", path, strerror(errno));
  fputs("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"strata trace\",\"model\":", f);
  json_str(f, tr->model ? tr->model : "");
  fputs("},\"traceEvents\":[\n", f);
  fputs("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"strata workers\"}}", f);
  if (tr->n_steps)
    fputs(",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":2,\"tid\":0,\"args\":{\"name\":\"strata steps\"}}", f);
  for (size_t i = 0; i < tr->n_workers; i++) {
    fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":", tr->workers[i].id);
    json_str(f, tr->workers[i].name);
    fprintf(f, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"sort_index\":%zu}}",
            tr->workers[i].id, i);
  }
  for (size_t i = 0; i < tr->n_steps; i++) {
    const struct st_trace_step *s = &tr->steps[i];
    fprintf(f,
            ",\n{\"name\":\"%s %d\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":2,\"tid\":0}",
            s->is_decode ? "decode" : "prompt", s->index, s->start_us, s->end_us - s->start_us);
  }
  for (size_t i = 0; i < tr->n_tasks; i++) {
    const struct st_trace_task *t = &tr->tasks[i];
    fputs(",\n{\"name\":", f);
    json_str(f, t->name);
    fprintf(f,
            ",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d,"
            "\"args\":{\"layer\":%d,\"expert\":%d,\"tier\":\"%s\",\"bytes\":%llu}}",
            kind_names[t->kind], t->start_us, t->end_us - t->start_us, tr->workers[t->worker].id, t->layer,
            t->expert, t->tier, (unsigned long long)t->bytes);
  }
  fputs("\n]}\n", f);
  int err = ferror(f);
  if (fclose(f) || err) return st_set_error(ST_EIO, "%s: write error", path);
  return 0;
}

/* ---- summary and critical path ---- */

int st_trace_critical_path(const struct st_trace *tr, const struct st_trace_step *step,
                           struct st_trace_path_elem **path, size_t *n) {
  *path = NULL;
  *n = 0;
  size_t m = 0;
  size_t *sel = malloc(sizeof *sel * (tr->n_tasks + 1));
  if (!sel) return st_set_error(ST_ENOMEM, "out of memory");
  for (size_t i = 0; i < tr->n_tasks; i++)
    if (tr->tasks[i].start_us >= step->start_us && tr->tasks[i].start_us <= step->end_us) sel[m++] = i;
  if (m == 0) {
    free(sel);
    return 0;
  }
  /* In end order, best[i] = dur(i) + the best chain among the tasks ending by i's start; those
   * come before i in that order, so a running prefix maximum answers each query. */
  size_t *ix = sorted_tasks(tr, by_end, sel, m);
  double *best = malloc(sizeof *best * m), *pmv = malloc(sizeof *pmv * m);
  size_t *prev = malloc(sizeof *prev * m), *pmi = malloc(sizeof *pmi * m);
  struct st_trace_path_elem *out = malloc(sizeof *out * m);
  if (!ix || !best || !pmv || !prev || !pmi || !out) {
    free(sel), free(ix), free(best), free(pmv), free(prev), free(pmi), free(out);
    return st_set_error(ST_ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < m; i++) {
    const struct st_trace_task *t = &tr->tasks[ix[i]];
    size_t lo = 0, hi = i; /* number of tasks before i in end order that end by t's start */
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (tr->tasks[ix[mid]].end_us <= t->start_us) lo = mid + 1;
      else hi = mid;
    }
    best[i] = t->end_us - t->start_us + (lo ? pmv[lo - 1] : 0);
    prev[i] = lo ? pmi[lo - 1] : SIZE_MAX;
    pmv[i] = best[i];
    pmi[i] = i;
    if (i && pmv[i - 1] > pmv[i]) pmv[i] = pmv[i - 1], pmi[i] = pmi[i - 1];
  }
  /* The step's last task: the latest end; among equal ends the longest chain. */
  size_t last = m - 1;
  for (size_t i = m - 1; i-- > 0 && tr->tasks[ix[i]].end_us == tr->tasks[ix[m - 1]].end_us;)
    if (best[i] > best[last]) last = i;
  size_t k = 0;
  for (size_t i = last; i != SIZE_MAX; i = prev[i]) out[k++].task = ix[i];
  for (size_t a = 0, b = k - 1; a < b; a++, b--) {
    size_t tmp = out[a].task;
    out[a].task = out[b].task;
    out[b].task = tmp;
  }
  for (size_t i = 0; i < k; i++)
    out[i].gap_us = tr->tasks[out[i].task].start_us - (i ? tr->tasks[out[i - 1].task].end_us : step->start_us);
  free(sel), free(ix), free(best), free(pmv), free(prev), free(pmi);
  *path = out;
  *n = k;
  return 0;
}

void st_trace_write_summary(const struct st_trace *tr, FILE *f) {
  double span = tr->t1_us - tr->t0_us;
  size_t n_dec = 0, n_pro = 0;
  for (size_t i = 0; i < tr->n_steps; i++) tr->steps[i].is_decode ? n_dec++ : n_pro++;
  fprintf(f, "strata trace summary%s%s\n", tr->model ? " of " : "", tr->model ? tr->model : "");
  fprintf(f, "span: %.3f ms (engine time %.3f to %.3f ms); %zu tasks on %zu workers; %zu prompt chunk(s), %zu decode step(s)\n",
          span / 1000, tr->t0_us / 1000, tr->t1_us / 1000, tr->n_tasks, tr->n_workers, n_pro, n_dec);

  /* Busy time per worker: the union of its tasks' intervals, so overlapping records (an
   * asynchronous transfer beside a kernel) are not counted twice. */
  size_t *ix = sorted_tasks(tr, by_start, NULL, tr->n_tasks);
  double *busy = calloc(tr->n_workers, sizeof *busy), *cur = calloc(tr->n_workers, sizeof *cur);
  size_t *count = calloc(tr->n_workers, sizeof *count);
  if (!ix || !busy || !cur || !count) {
    fprintf(f, "(out of memory computing the summary)\n");
    free(ix), free(busy), free(cur), free(count);
    return;
  }
  for (size_t k = 0; k < tr->n_tasks; k++) {
    const struct st_trace_task *t = &tr->tasks[ix[k]];
    size_t w = (size_t)t->worker;
    count[w]++;
    if (t->start_us >= cur[w]) busy[w] += t->end_us - t->start_us, cur[w] = t->end_us;
    else if (t->end_us > cur[w]) busy[w] += t->end_us - cur[w], cur[w] = t->end_us;
  }
  fprintf(f, "\nworker busy over the span:\n  %4s  %-28s %8s %10s %7s\n", "id", "name", "tasks", "busy ms", "busy");
  for (size_t i = 0; i < tr->n_workers; i++)
    fprintf(f, "  %4d  %-28s %8zu %10.3f %6.1f%%\n", tr->workers[i].id, tr->workers[i].name, count[i], busy[i] / 1000,
            span > 0 ? 100 * busy[i] / span : 0.0);

  fprintf(f, "\ntask kinds:\n  %-24s %8s %10s %10s %10s\n", "kind", "count", "total ms", "mean us", "MiB");
  const char *tiers[MAX_TIERS];
  size_t n_tiers = expert_tiers(tr, tiers);
  for (int k = 0; k < ST_TRACE_NKINDS; k++) {
    for (size_t j = 0; j <= (k == ST_TRACE_EXPERT_ROWS && n_tiers > 1 ? n_tiers : 0); j++) {
      const char *tier = j ? tiers[j - 1] : "";
      size_t n = 0;
      double tot = 0, bytes = 0;
      for (size_t i = 0; i < tr->n_tasks; i++) {
        const struct st_trace_task *t = &tr->tasks[i];
        if (t->kind != k || (j && strcmp(t->tier, tier))) continue;
        n++;
        tot += t->end_us - t->start_us;
        bytes += (double)t->bytes;
      }
      if (!n && j) continue;
      char label[64];
      snprintf(label, sizeof label, "%s%s%s", j ? "  " : "", j ? "tier " : kind_names[k], tier);
      fprintf(f, "  %-24s %8zu %10.3f %10.1f %10.2f\n", label, n, tot / 1000, n ? tot / (double)n : 0.0,
              bytes / 1048576.0);
    }
  }

  /* The critical path of the last decode step (the last step when none is a decode step). */
  const struct st_trace_step *step = NULL;
  for (size_t i = 0; i < tr->n_steps; i++) {
    const struct st_trace_step *s = &tr->steps[i];
    if (!step || (s->is_decode > step->is_decode) ||
        (s->is_decode == step->is_decode && s->start_us > step->start_us))
      step = s;
  }
  struct st_trace_step whole = {.is_decode = 0, .index = -1, .start_us = tr->t0_us, .end_us = tr->t1_us};
  if (!step) step = &whole;
  struct st_trace_path_elem *cp = NULL;
  size_t n_cp = 0;
  if (st_trace_critical_path(tr, step, &cp, &n_cp)) {
    fprintf(f, "\ncritical path: %s\n", st_last_error());
  } else if (n_cp == 0) {
    fprintf(f, "\ncritical path: %s step %d has no task\n", step->is_decode ? "decode" : "prompt", step->index);
  } else {
    double dur = step->end_us - step->start_us, sum = 0;
    for (size_t i = 0; i < n_cp; i++) sum += tr->tasks[cp[i].task].end_us - tr->tasks[cp[i].task].start_us;
    if (step == &whole)
      fprintf(f, "\ncritical path of the whole trace (no step lines; %.3f ms):\n", dur / 1000);
    else
      fprintf(f, "\ncritical path of %s step %d (engine time %.3f to %.3f ms, %.3f ms):\n",
              step->is_decode ? "decode" : "prompt", step->index, step->start_us / 1000, step->end_us / 1000,
              dur / 1000);
    fprintf(f,
            "  %zu tasks, busy %.3f ms (%.1f%% of the step), waiting %.3f ms before or between them\n"
            "  (the longest chain of tasks, each starting after the previous one ends, that ends with the\n"
            "  step's last task; see doc/traces.md)\n",
            n_cp, sum / 1000, dur > 0 ? 100 * sum / dur : 100.0, (tr->tasks[cp[n_cp - 1].task].end_us - step->start_us - sum) / 1000);
    fprintf(f, "  %9s %9s %9s  %s\n", "start ms", "gap us", "dur us", "task (worker)");
    for (size_t i = 0; i < n_cp; i++) {
      const struct st_trace_task *t = &tr->tasks[cp[i].task];
      fprintf(f, "  %+9.3f %9.1f %9.1f  %s (%s)\n", (t->start_us - step->start_us) / 1000, cp[i].gap_us,
              t->end_us - t->start_us, t->name, tr->workers[t->worker].name);
    }
  }
  free(cp);
  free(ix), free(busy), free(cur), free(count);
}

/* ---- starpu_fxt_tool ---- */

static int find_tool(char *out, size_t n) {
  const char *path = getenv("PATH");
  if (path) {
    const char *p = path;
    while (*p) {
      const char *colon = strchr(p, ':');
      size_t len = colon ? (size_t)(colon - p) : strlen(p);
      if (len) {
        snprintf(out, n, "%.*s/starpu_fxt_tool", (int)len, p);
        if (!access(out, X_OK)) return 0;
      }
      p += len + (colon ? 1 : 0);
    }
  }
  snprintf(out, n, "/opt/strata-deps/bin/starpu_fxt_tool");
  return access(out, X_OK) ? -1 : 0;
}

void st_trace_remove_fxt_outputs(const char *outdir) {
  static const char *const made[] = {"fxt_tool.log", "paje.trace", "dag.dot", "tasks.rec", "trace.rec", "data.rec",
                                     "comms.rec", "sched_tasks.rec", "papi.rec", "activity.data", "distrib.data",
                                     "trace.html", "starpu_idle_microsec.log"};
  char path[PATH_MAX + 64];
  for (size_t i = 0; i < sizeof made / sizeof made[0]; i++) {
    snprintf(path, sizeof path, "%s/fxt/%s", outdir, made[i]);
    unlink(path);
  }
  snprintf(path, sizeof path, "%s/fxt", outdir);
  rmdir(path);
}

int st_trace_run_fxt_tool(const char *dir, const char *outdir, char *msg, size_t msg_size) {
  char pat[PATH_MAX + 16], tool[PATH_MAX], abs_out[PATH_MAX], side[PATH_MAX + 8], log[PATH_MAX + 24], paje[PATH_MAX + 16];
  snprintf(pat, sizeof pat, "%s/prof_file_*", dir);
  glob_t g;
  int grc = glob(pat, 0, NULL, &g);
  if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
    if (grc == 0) globfree(&g);
    snprintf(msg, msg_size, "paje.trace: not written, no FxT files (%s)", pat);
    return 0;
  }
  if (grc) {
    snprintf(msg, msg_size, "paje.trace: not written, cannot list %s", pat);
    return ST_EIO;
  }
  int rc = 0;
  char **argv = NULL;
  if (find_tool(tool, sizeof tool)) {
    snprintf(msg, msg_size, "paje.trace: not written, starpu_fxt_tool is neither in $PATH nor in /opt/strata-deps/bin");
    rc = ST_EUNSUP;
    goto out;
  }
  if (!realpath(outdir, abs_out)) {
    snprintf(msg, msg_size, "paje.trace: not written, %s: %s", outdir, strerror(errno));
    rc = ST_EIO;
    goto out;
  }
  /* starpu_fxt_tool writes its other outputs (dag.dot, tasks.rec, ...) in its working
   * directory: give it OUTDIR/fxt so they do not crowd OUTDIR. */
  snprintf(side, sizeof side, "%s/fxt", abs_out);
  snprintf(log, sizeof log, "%s/fxt/fxt_tool.log", abs_out);
  snprintf(paje, sizeof paje, "%s/paje.trace", abs_out);
  if (mkdir(side, 0777) && errno != EEXIST) {
    snprintf(msg, msg_size, "paje.trace: not written, cannot create %s: %s", side, strerror(errno));
    rc = ST_EIO;
    goto out;
  }
  argv = calloc(2 * g.gl_pathc + 4, sizeof *argv);
  char (*abs_in)[PATH_MAX] = calloc(g.gl_pathc, PATH_MAX);
  if (!argv || !abs_in) {
    free(abs_in);
    snprintf(msg, msg_size, "paje.trace: not written, out of memory");
    rc = ST_ENOMEM;
    goto out;
  }
  size_t a = 0;
  argv[a++] = tool;
  for (size_t i = 0; i < g.gl_pathc; i++) {
    if (!realpath(g.gl_pathv[i], abs_in[i])) snprintf(abs_in[i], PATH_MAX, "%s", g.gl_pathv[i]);
    argv[a++] = "-i";
    argv[a++] = abs_in[i];
  }
  /* No -o: starpu_fxt_tool 1.3.10 frees a string literal when given -o (abort in parse_args),
   * so it writes its default ./paje.trace in OUTDIR/fxt and we move that up. */
  argv[a] = NULL;
  char made[PATH_MAX + 32];
  snprintf(made, sizeof made, "%s/paje.trace", side);
  unlink(paje);
  unlink(made);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0666);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addchdir_np(&fa, side);
  pid_t pid;
  int err = posix_spawn(&pid, tool, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  if (!err)
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  free(abs_in);
  struct stat sb;
  if (err) {
    snprintf(msg, msg_size, "paje.trace: not written, cannot run %s: %s", tool, strerror(err));
    rc = ST_ERUNTIME;
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) || stat(made, &sb) || sb.st_size == 0 ||
             rename(made, paje)) {
    /* The tool's last line says why. */
    char last[256] = "", line[256];
    FILE *lf = fopen(log, "r");
    if (lf) {
      while (fgets(line, sizeof line, lf))
        if (line[0] != '\n') snprintf(last, sizeof last, "%s", line);
      fclose(lf);
    }
    last[strcspn(last, "\n")] = 0;
    if (WIFSIGNALED(status))
      snprintf(msg, msg_size, "paje.trace: not written, %s died of signal %d (log: %s)", tool, WTERMSIG(status), log);
    else
      snprintf(msg, msg_size, "paje.trace: not written, %s failed (exit %d%s%s; log: %s)", tool,
               WIFEXITED(status) ? WEXITSTATUS(status) : -1, *last ? ": " : "", last, log);
    rc = ST_ERUNTIME;
  } else {
    snprintf(msg, msg_size, "%s (from %zu FxT file%s by %s; its other outputs and log in %s)", paje, g.gl_pathc,
             g.gl_pathc > 1 ? "s" : "", tool, side);
    rc = 1;
  }
out:
  free(argv);
  globfree(&g);
  return rc;
}
