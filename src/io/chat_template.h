/* Chat messages to prompt text for the Qwen3 family, as its `tokenizer.chat_template` (Jinja, in
 * the GGUF) renders them: each turn `<|im_start|>{role}\n{content}<|im_end|>\n`, then the
 * generation prompt `<|im_start|>assistant\n`, plus `<think>\n\n</think>\n\n` after it when
 * thinking is switched off (enable_thinking=false). The Jinja text itself is not interpreted:
 * a template that contains `<|im_start|>` is taken as this family's; any other falls back to the
 * same ChatML rendering (st_chat_template_detect says so). */
#ifndef ST_CHAT_TEMPLATE_H
#define ST_CHAT_TEMPLATE_H

#include <stddef.h>

enum st_chat_kind {
  ST_CHAT_QWEN3 = 0,    /* the GGUF's template is ChatML-based (Qwen2/Qwen3) */
  ST_CHAT_FALLBACK = 1, /* no template or another family's: rendered as ChatML anyway */
};

/* The kind of `tmpl` (the GGUF's tokenizer.chat_template, or NULL when absent). */
enum st_chat_kind st_chat_template_detect(const char *tmpl);

struct st_chat_msg {
  const char *role;    /* "system", "user", "assistant" or "tool" */
  const char *content; /* UTF-8; NULL is rendered as empty */
};

/* Renders n messages into a malloc'd NUL-terminated string *out (caller frees). As Qwen3's
 * template does: assistant messages before the last user message lose their reasoning (the text
 * up to the last `</think>`, and the newlines after it); consecutive "tool" messages become one
 * user turn of `<tool_response>\n...\n</tool_response>` blocks. add_generation_prompt != 0
 * appends `<|im_start|>assistant\n` (and the empty think block when enable_thinking == 0).
 * Errors: ST_EINVAL naming the role for a role other than the four above, ST_ENOMEM. */
int st_chat_render(const struct st_chat_msg *msgs, size_t n, int add_generation_prompt, int enable_thinking,
                   char **out);

/* The part of an assistant message Qwen3 keeps in the history: after the last `</think>`, with
 * leading newlines removed; the whole text when it has no `</think>`. Returns a pointer into
 * `content`. */
const char *st_chat_strip_think(const char *content);

#endif
