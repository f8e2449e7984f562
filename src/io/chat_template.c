/* The chat template families written out in C (chat_template.h): Qwen3's ChatML turns, reasoning
 * strip of history messages and tool-response grouping follow the Jinja template shipped in
 * Qwen3's tokenizer_config.json (and copied into its GGUFs as tokenizer.chat_template); the other
 * families follow llama.cpp's llm_chat_apply_template. */
#include "io/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum st_chat_kind st_chat_template_detect(const char *tmpl) {
  if (!tmpl) return ST_CHAT_FALLBACK;
  if (strstr(tmpl, "<|im_start|>")) return ST_CHAT_QWEN3;
  if (strstr(tmpl, "[gMASK]<sop>")) return ST_CHAT_GLM4;
  if (strstr(tmpl, "'Assistant: ' + message['content'] + eos_token")) return ST_CHAT_DEEPSEEK2;
  if (strstr(tmpl, "<｜Assistant｜>") && strstr(tmpl, "<｜User｜>") && strstr(tmpl, "<｜end▁of▁sentence｜>"))
    return ST_CHAT_DEEPSEEK3;
  if (strstr(tmpl, "<|start|>") && strstr(tmpl, "<|channel|>")) return ST_CHAT_HARMONY;
  if (strstr(tmpl, "<|im_assistant|>assistant<|im_middle|>")) return ST_CHAT_KIMI_K2;
  return ST_CHAT_FALLBACK;
}

const char *st_chat_kind_name(enum st_chat_kind kind) {
  switch (kind) {
  case ST_CHAT_QWEN3: return "Qwen (ChatML, <think> handling)";
  case ST_CHAT_DEEPSEEK3: return "DeepSeek-V3/R1";
  case ST_CHAT_DEEPSEEK2: return "DeepSeek-V2";
  case ST_CHAT_HARMONY: return "gpt-oss harmony";
  case ST_CHAT_GLM4: return "GLM-4";
  case ST_CHAT_KIMI_K2: return "Kimi K2";
  default: return "ChatML fallback";
  }
}

/* One message in a family other than ChatML's. */
static void render_other(FILE *b, enum st_chat_kind kind, const char *r, const char *c) {
  switch (kind) {
  case ST_CHAT_DEEPSEEK3:
    if (!strcmp(r, "system")) fprintf(b, "%s\n\n", c);
    else if (!strcmp(r, "user")) fprintf(b, "<｜User｜>%s", c);
    else if (!strcmp(r, "assistant")) fprintf(b, "<｜Assistant｜>%s<｜end▁of▁sentence｜>", c);
    else fprintf(b, "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>%s<｜tool▁output▁end｜><｜tool▁outputs▁end｜>", c);
    break;
  case ST_CHAT_DEEPSEEK2:
    if (!strcmp(r, "system")) fprintf(b, "%s\n\n", c);
    else if (!strcmp(r, "user")) fprintf(b, "User: %s\n\n", c);
    else if (!strcmp(r, "assistant")) fprintf(b, "Assistant: %s<｜end▁of▁sentence｜>", c);
    else fprintf(b, "User: %s\n\n", c); /* a tool result as the user's turn (llama.cpp's renderer drops it) */
    break;
  case ST_CHAT_HARMONY:
    fprintf(b, "<|start|>%s<|message|>%s%s", r, c, !strcmp(r, "assistant") ? "<|return|>" : "<|end|>");
    break;
  case ST_CHAT_GLM4: fprintf(b, "<|%s|>\n%s", r, c); break;
  default: /* Kimi K2 */
    if (!strcmp(r, "tool")) fputs("<|im_system|>tool<|im_middle|>", b);
    else fprintf(b, "<|im_%s|>%s<|im_middle|>", r, r);
    fprintf(b, "%s<|im_end|>", c);
  }
}

const char *st_chat_strip_think(const char *content) {
  const char *p = content, *q;
  while ((q = strstr(p, "</think>"))) p = q + strlen("</think>");
  if (p == content) return content;
  while (*p == '\n') p++;
  return p;
}

int st_chat_render(enum st_chat_kind kind, const struct st_chat_msg *msgs, size_t n, int add_generation_prompt,
                   int enable_thinking, char **out) {
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
  if (kind != ST_CHAT_QWEN3 && kind != ST_CHAT_FALLBACK) {
    if (kind == ST_CHAT_GLM4) fputs("[gMASK]<sop>", b);
    for (size_t i = 0; i < n; i++) {
      const char *r = msgs[i].role, *c = msgs[i].content ? msgs[i].content : "";
      if (kind == ST_CHAT_DEEPSEEK3 && !strcmp(r, "assistant") && (last_user == (size_t)-1 || i < last_user))
        c = st_chat_strip_think(c);
      render_other(b, kind, r, c);
    }
    if (add_generation_prompt)
      fputs(kind == ST_CHAT_DEEPSEEK3 ? "<｜Assistant｜>"
            : kind == ST_CHAT_DEEPSEEK2 ? "Assistant:"
            : kind == ST_CHAT_HARMONY ? "<|start|>assistant"
            : kind == ST_CHAT_GLM4    ? "<|assistant|>\n"
                                      : "<|im_assistant|>assistant<|im_middle|>",
            b);
  }
  for (size_t i = 0; (kind == ST_CHAT_QWEN3 || kind == ST_CHAT_FALLBACK) && i < n; i++) {
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
  if (add_generation_prompt && (kind == ST_CHAT_QWEN3 || kind == ST_CHAT_FALLBACK)) {
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
