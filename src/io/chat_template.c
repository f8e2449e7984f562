/* Qwen3's chat template written out in C (chat_template.h): the ChatML turns, the reasoning strip
 * of history messages and the tool-response grouping follow the Jinja template shipped in
 * Qwen3's tokenizer_config.json (and copied into its GGUFs as tokenizer.chat_template). */
#include "io/chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

enum st_chat_kind st_chat_template_detect(const char *tmpl) {
  return tmpl && strstr(tmpl, "<|im_start|>") ? ST_CHAT_QWEN3 : ST_CHAT_FALLBACK;
}

const char *st_chat_strip_think(const char *content) {
  const char *p = content, *q;
  while ((q = strstr(p, "</think>"))) p = q + strlen("</think>");
  if (p == content) return content;
  while (*p == '\n') p++;
  return p;
}

struct buf {
  char *s;
  size_t n, cap;
  int oom;
};

static void put(struct buf *b, const char *s) {
  size_t l = strlen(s);
  if (b->oom) return;
  if (b->n + l + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (b->n + l + 1 > cap) cap *= 2;
    char *ns = realloc(b->s, cap);
    if (!ns) {
      b->oom = 1;
      return;
    }
    b->s = ns;
    b->cap = cap;
  }
  memcpy(b->s + b->n, s, l + 1);
  b->n += l;
}

int st_chat_render(const struct st_chat_msg *msgs, size_t n, int add_generation_prompt, int enable_thinking,
                   char **out) {
  *out = NULL;
  size_t last_user = (size_t)-1;
  for (size_t i = 0; i < n; i++) {
    const char *r = msgs[i].role ? msgs[i].role : "";
    if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))
      return st_set_error(ST_EINVAL, "message %zu: unknown role '%s' (system, user, assistant or tool)", i, r);
    if (!strcmp(r, "user")) last_user = i;
  }
  struct buf b = {0};
  put(&b, "");
  for (size_t i = 0; i < n; i++) {
    const char *r = msgs[i].role, *c = msgs[i].content ? msgs[i].content : "";
    if (!strcmp(r, "tool")) {
      /* consecutive tool results share one user turn */
      if (i == 0 || strcmp(msgs[i - 1].role, "tool")) put(&b, "<|im_start|>user");
      put(&b, "\n<tool_response>\n");
      put(&b, c);
      put(&b, "\n</tool_response>");
      if (i + 1 == n || strcmp(msgs[i + 1].role, "tool")) put(&b, "<|im_end|>\n");
      continue;
    }
    if (!strcmp(r, "assistant") && (last_user == (size_t)-1 || i < last_user)) c = st_chat_strip_think(c);
    put(&b, "<|im_start|>");
    put(&b, r);
    put(&b, "\n");
    put(&b, c);
    put(&b, "<|im_end|>\n");
  }
  if (add_generation_prompt) {
    put(&b, "<|im_start|>assistant\n");
    if (!enable_thinking) put(&b, "<think>\n\n</think>\n\n");
  }
  if (b.oom) {
    free(b.s);
    return st_set_error(ST_ENOMEM, "out of memory rendering the chat");
  }
  *out = b.s;
  return 0;
}
