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
  /* the rendering grows in a memory stream (POSIX open_memstream) */
  char *text = NULL;
  size_t len = 0;
  FILE *b = open_memstream(&text, &len);
  if (!b) return st_set_error(ST_ENOMEM, "out of memory rendering the chat");
  for (size_t i = 0; i < n; i++) {
    const char *r = msgs[i].role, *c = msgs[i].content ? msgs[i].content : "";
    if (!strcmp(r, "tool")) {
      /* consecutive tool results share one user turn */
      if (i == 0 || strcmp(msgs[i - 1].role, "tool")) fputs("<|im_start|>user", b);
      fputs("\n<tool_response>\n", b);
      fputs(c, b);
      fputs("\n</tool_response>", b);
      if (i + 1 == n || strcmp(msgs[i + 1].role, "tool")) fputs("<|im_end|>\n", b);
      continue;
    }
    if (!strcmp(r, "assistant") && (last_user == (size_t)-1 || i < last_user)) c = st_chat_strip_think(c);
    fputs("<|im_start|>", b);
    fputs(r, b);
    fputs("\n", b);
    fputs(c, b);
    fputs("<|im_end|>\n", b);
  }
  if (add_generation_prompt) {
    fputs("<|im_start|>assistant\n", b);
    if (!enable_thinking) fputs("<think>\n\n</think>\n\n", b);
  }
  if (ferror(b) | fclose(b)) {
    free(text);
    return st_set_error(ST_ENOMEM, "out of memory rendering the chat");
  }
  *out = text;
  return 0;
}
