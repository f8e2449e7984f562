/* The GGUF `gpt2` byte-level BPE tokenizer with the `qwen2` pre-tokenizer (Qwen2/Qwen3 models).
 * Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,eos_token_id,...} from a GGUF file
 * (a vocabulary-only file without tensors is fine). The pre-split regex is Qwen2's from
 * Hugging Face tokenizers / llama.cpp (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_QWEN2), run with
 * PCRE2 in UTF+UCP mode. Special (control / user-defined) tokens written in the text are
 * matched first and become their own ids. No BOS is added. */
#ifndef ST_TOKENIZER_H
#define ST_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct st_gguf;
struct st_tokenizer;

/* Builds a tokenizer from the GGUF's tokenizer.* keys. Refuses (ST_EUNSUP) a model other than
 * "gpt2" or a pre-tokenizer other than "qwen2" (naming it), and (ST_EFORMAT) missing or
 * inconsistent arrays. The GGUF handle may be closed afterwards (strings are copied).
 * *out is owned by the caller: st_tokenizer_free(). */
int st_tokenizer_load(const struct st_gguf *g, struct st_tokenizer **out);
void st_tokenizer_free(struct st_tokenizer *t);

/* Encodes `text` (len bytes of UTF-8; invalid UTF-8 bytes are encoded byte-wise) into a
 * malloc'd array *ids of *n ids (caller frees, also when *n is 0). flags: ST_TOK_SPECIAL turns
 * special-token text (control / unknown types) into its id (user-defined tokens (<think>,
 * <tool_call>, ...) are matched either way, as llama.cpp and Hugging Face do); ST_TOK_BOS starts
 * with the BOS id when the file sets tokenizer.ggml.add_bos_token (a prompt, as llama.cpp's
 * add_special); ST_TOK_PROMPT is both. The pre-split follows tokenizer.ggml.pre (qwen2,
 * deepseek-r1-qwen, deepseek-v3, gpt-4o, glm4, chatglm-bpe, kimi-k2: llama.cpp's splits). Several threads
 * may encode with one tokenizer at once. Errors: ST_ENOMEM, ST_ERUNTIME (PCRE2 failure). */
enum { ST_TOK_SPECIAL = 1, ST_TOK_BOS = 2, ST_TOK_PROMPT = 3 };
int st_tokenizer_encode(const struct st_tokenizer *t, const char *text, size_t len,
                        int flags, int32_t **ids, size_t *n);

/* Vocabulary size (number of ids) and special ids (-1 when absent). */
int32_t st_tokenizer_n_vocab(const struct st_tokenizer *t);
int32_t st_tokenizer_eos(const struct st_tokenizer *t);   /* tokenizer.ggml.eos_token_id */
int32_t st_tokenizer_eot(const struct st_tokenizer *t);   /* <|im_end|> when present */
/* 1 when id ends a generation (llama.cpp's "end of generation" set): eos, tokenizer.ggml.eot_token_id
 * and eom_token_id, and the end-of-turn tokens of the chat families io/chat_template.h renders
 * (<|im_end|>; gpt-oss's <|end|>, <|return|>, <|call|>; GLM's <|user|>, <|observation|>;
 * DeepSeek's <｜end▁of▁sentence｜>) where the vocabulary has them. */
int st_tokenizer_is_eog(const struct st_tokenizer *t, int32_t id);
/* 1 when a generated id is shown as text: every ordinary token, and of the special ones Qwen3's
 * <think> / </think> and gpt-oss's <|channel|>, <|message|>, <|start|>, <|constrain|> (as llama.cpp
 * renders them); 0 for the other special tokens and a bad id. */
int st_tokenizer_is_shown(const struct st_tokenizer *t, int32_t id);
/* 1 for a control or user-defined token (token_type 3 or 4), else 0 (also for a bad id). */
int st_tokenizer_is_special(const struct st_tokenizer *t, int32_t id);
/* Bytes of the longest token (sizing for st_tokenizer_token_bytes / st_detok_push). */
size_t st_tokenizer_max_token_bytes(const struct st_tokenizer *t);

/* The bytes of one token (byte-level BPE decoded back to raw bytes; special tokens give their
 * text). Returns the byte count written to buf (at most cap) or a negative ST_E* for a bad id. */
int st_tokenizer_token_bytes(const struct st_tokenizer *t, int32_t id, char *buf, size_t cap);

/* Streaming detokenizer: feeds ids, emits only complete UTF-8 characters; a character split
 * over several tokens is held back until complete. */
struct st_detok {
  const struct st_tokenizer *tok;
  char pending[16];
  size_t n_pending;
};
void st_detok_init(struct st_detok *d, const struct st_tokenizer *t);
/* Writes the text now complete after `id` to out (NUL-terminated, at most cap-1 bytes; always
 * whole, valid UTF-8 characters) and returns the number of bytes written. Invalid bytes become
 * U+FFFD. cap >= 3 * (st_tokenizer_max_token_bytes() + 4) + 1 always suffices; with less, the
 * output is cut at a character boundary and the rest is lost. A bad id writes nothing. */
size_t st_detok_push(struct st_detok *d, int32_t id, char *out, size_t cap);
/* Emits whatever is held back (invalid or truncated sequences as U+FFFD). */
size_t st_detok_flush(struct st_detok *d, char *out, size_t cap);

#endif
