/* Chat messages to prompt text, per template family. The Jinja text of the GGUF's
 * `tokenizer.chat_template` is not interpreted: st_chat_template_detect tells the family by the
 * markers llama.cpp's llm_chat_detect_template looks for, and st_chat_render writes that family's
 * turns. Qwen3 (ChatML) as its Jinja template renders them: each turn
 * `<|im_start|>{role}\n{content}<|im_end|>\n`, then the generation prompt `<|im_start|>assistant\n`,
 * plus `<think>\n\n</think>\n\n` after it when thinking is switched off (enable_thinking=false);
 * the families of the other architectures (io/arch.h) as llama.cpp's llm_chat_apply_template
 * writes them (llama-chat.cpp, de3ff815): DeepSeek-V3/R1, gpt-oss's harmony, GLM-4 and Kimi K2.
 * Any other template falls back to the ChatML rendering. */
#ifndef ST_CHAT_TEMPLATE_H
#define ST_CHAT_TEMPLATE_H

#include <stddef.h>

enum st_chat_kind {
  ST_CHAT_QWEN3 = 0,    /* the GGUF's template is ChatML-based (Qwen2/Qwen3): `<|im_start|>` */
  ST_CHAT_FALLBACK = 1, /* no template or another family's: rendered as ChatML anyway */
  ST_CHAT_DEEPSEEK3,    /* `<｜User｜>`, `<｜Assistant｜>`, `<｜end▁of▁sentence｜>`: system text then "\n\n",
                           <｜User｜>{user}, <｜Assistant｜>{assistant}<｜end▁of▁sentence｜>, tool output
                           in <｜tool▁output▁begin｜>..<｜tool▁output▁end｜> */
  ST_CHAT_HARMONY,      /* gpt-oss (`<|start|>`, `<|channel|>`): <|start|>{role}<|message|>{content}<|end|>
                           (<|return|> after an assistant's), generation prompt <|start|>assistant */
  ST_CHAT_GLM4,         /* `[gMASK]<sop>`: [gMASK]<sop> then <|{role}|>\n{content}, prompt <|assistant|>\n */
  ST_CHAT_DEEPSEEK2,    /* DeepSeek-V2 (`'Assistant: ' + message['content'] + eos_token`): system text then "\n\n",
                           "User: {user}\n\n", "Assistant: {assistant}<｜end▁of▁sentence｜>", prompt "Assistant:" */
  ST_CHAT_KIMI_K2,      /* `<|im_assistant|>assistant<|im_middle|>`: <|im_{role}|>{role}<|im_middle|>{content}<|im_end|>
                           (tool: <|im_system|>tool<|im_middle|>) */
};

/* The family's name for logs ("Qwen (ChatML)", "DeepSeek-V3", ...). */
const char *st_chat_kind_name(enum st_chat_kind kind);

/* The kind of `tmpl` (the GGUF's tokenizer.chat_template, or NULL when absent). */
enum st_chat_kind st_chat_template_detect(const char *tmpl);

struct st_chat_msg {
  const char *role;    /* "system", "user", "assistant" or "tool" */
  const char *content; /* UTF-8; NULL is rendered as empty */
};

/* Renders n messages in family `kind` into a malloc'd NUL-terminated string *out (caller frees).
 * Qwen3 and the fallback as Qwen3's template does: assistant messages before the last user message
 * lose their reasoning (the text up to the last `</think>`, and the newlines after it); consecutive
 * "tool" messages become one user turn of `<tool_response>\n...\n</tool_response>` blocks.
 * add_generation_prompt != 0 appends `<|im_start|>assistant\n` (and the empty think block when
 * enable_thinking == 0). DeepSeek-V3 strips the history's reasoning the same way; the other
 * families render as their enum entries say and ignore enable_thinking. Errors: ST_EINVAL naming the
 * role for a role other than the four above, ST_ENOMEM. */
int st_chat_render(enum st_chat_kind kind, const struct st_chat_msg *msgs, size_t n, int add_generation_prompt,
                   int enable_thinking, char **out);

/* The part of an assistant message Qwen3 keeps in the history: after the last `</think>`, with
 * leading newlines removed; the whole text when it has no `</think>`. Returns a pointer into
 * `content`. */
const char *st_chat_strip_think(const char *content);

#endif
