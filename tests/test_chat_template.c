/* The Qwen3 chat rendering: turns in ChatML, the generation prompt with and without thinking,
 * reasoning stripped from assistant history before the last user message (kept after it), tool
 * results grouped into one user turn, an unknown role refused, and the template detection (a
 * ChatML template is Qwen's; anything else, or none, falls back). Expected strings were written
 * from Qwen3's Jinja template. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "io/chat_template.h"

static int pass, fail;

static void check_str(const char *name, const char *got, const char *want) {
  if (got && !strcmp(got, want)) {
    printf("PASS %s (%zu bytes)\n", name, strlen(got));
    pass++;
  } else {
    printf("FAIL %s\n  got:  [%s]\n  want: [%s]\n", name, got ? got : "(null)", want);
    fail++;
  }
}

static void render_kind(enum st_chat_kind kind, const char *name, const struct st_chat_msg *m, size_t n, int gen,
                        int think, const char *want) {
  char *out = NULL;
  int rc = st_chat_render(kind, m, n, gen, think, &out);
  if (rc) {
    printf("FAIL %s: error %d: %s\n", name, rc, st_last_error());
    fail++;
    return;
  }
  check_str(name, out, want);
  free(out);
}

static void render(const char *name, const struct st_chat_msg *m, size_t n, int gen, int think, const char *want) {
  render_kind(ST_CHAT_QWEN3, name, m, n, gen, think, want);
}

int main(void) {
  const struct st_chat_msg basic[] = {{"system", "You are terse."}, {"user", "Hi"}};
  render("system + user, generation prompt", basic, 2, 1, 1,
         "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  render("enable_thinking=false adds the empty think block", basic + 1, 1, 1, 0,
         "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  render("no generation prompt", basic + 1, 1, 0, 1, "<|im_start|>user\nHi<|im_end|>\n");

  const struct st_chat_msg hist[] = {{"user", "2+2?"},
                                     {"assistant", "<think>\nadd them\n</think>\n\n4"},
                                     {"user", "and 3+3?"},
                                     {"assistant", "<think>\nagain\n</think>\n\n6"}};
  render("reasoning stripped before the last user turn, kept after it", hist, 4, 0, 1,
         "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
         "<|im_start|>user\nand 3+3?<|im_end|>\n<|im_start|>assistant\n<think>\nagain\n</think>\n\n6<|im_end|>\n");

  const struct st_chat_msg tools[] = {{"user", "weather?"}, {"assistant", "calling"}, {"tool", "sunny"},
                                      {"tool", "22 C"}};
  render("tool results grouped in one user turn", tools, 4, 1, 1,
         "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\ncalling<|im_end|>\n"
         "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22 C\n</tool_response>"
         "<|im_end|>\n<|im_start|>assistant\n");

  const struct st_chat_msg nullc[] = {{"assistant", NULL}};
  render("NULL content renders empty", nullc, 1, 0, 1, "<|im_start|>assistant\n<|im_end|>\n");

  check_str("strip_think without </think>", st_chat_strip_think("plain"), "plain");
  check_str("strip_think keeps the text after the last </think>", st_chat_strip_think("<think>a</think>b</think>\n\nc"), "c");

  const struct st_chat_msg badrole[] = {{"wizard", "x"}};
  char *out = NULL;
  int rc = st_chat_render(ST_CHAT_QWEN3, badrole, 1, 1, 1, &out);
  if (rc == ST_EINVAL && strstr(st_last_error(), "wizard")) {
    printf("PASS unknown role refused: %s\n", st_last_error());
    pass++;
  } else {
    printf("FAIL unknown role: rc %d, '%s'\n", rc, st_last_error());
    fail++;
  }
  free(out);

  const char *qwen = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}";
  const int d1 = st_chat_template_detect(qwen), d2 = st_chat_template_detect("{{ bos_token }}[INST]"),
            d3 = st_chat_template_detect(NULL);
  if (d1 == ST_CHAT_QWEN3 && d2 == ST_CHAT_FALLBACK && d3 == ST_CHAT_FALLBACK) {
    printf("PASS detection: ChatML template -> qwen3, [INST] -> fallback, none -> fallback\n");
    pass++;
  } else {
    printf("FAIL detection: %d %d %d\n", d1, d2, d3);
    fail++;
  }
  /* the other architectures' families, as llama.cpp's llm_chat_apply_template writes them
   * (llama-chat.cpp at de3ff815), and their detection by the same markers */
  const struct st_chat_msg conv[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "<think>x</think>\n\nHello"},
                                     {"user", "Again"}};
  render_kind(ST_CHAT_DEEPSEEK3, "DeepSeek-V3 turns, history reasoning stripped, generation prompt", conv, 4, 1, 1,
              "Be brief.\n\n<｜User｜>Hi<｜Assistant｜>Hello<｜end▁of▁sentence｜><｜User｜>Again<｜Assistant｜>");
  render_kind(ST_CHAT_DEEPSEEK2, "DeepSeek-V2 turns, generation prompt", conv, 2, 1, 1, "Be brief.\n\nUser: Hi\n\nAssistant:");
  if (st_chat_template_detect("{% if %}{{ 'Assistant: ' + message['content'] + eos_token }}") == ST_CHAT_DEEPSEEK2) {
    printf("PASS detection: DeepSeek-V2's marker -> its family\n");
    pass++;
  } else {
    printf("FAIL detection of DeepSeek-V2\n");
    fail++;
  }
  render_kind(ST_CHAT_HARMONY, "gpt-oss harmony turns, generation prompt", conv + 1, 3, 1, 1,
              "<|start|>user<|message|>Hi<|end|><|start|>assistant<|message|><think>x</think>\n\nHello<|return|>"
              "<|start|>user<|message|>Again<|end|><|start|>assistant");
  render_kind(ST_CHAT_GLM4, "GLM-4 turns, generation prompt", conv, 2, 1, 1,
              "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi<|assistant|>\n");
  const struct st_chat_msg kimi[] = {{"system", "S"}, {"user", "U"}, {"tool", "T"}};
  render_kind(ST_CHAT_KIMI_K2, "Kimi K2 turns, tool as a system turn, generation prompt", kimi, 3, 1, 1,
              "<|im_system|>system<|im_middle|>S<|im_end|><|im_user|>user<|im_middle|>U<|im_end|>"
              "<|im_system|>tool<|im_middle|>T<|im_end|><|im_assistant|>assistant<|im_middle|>");
  const int k1 = st_chat_template_detect("{{bos_token}}{% if m %}<｜User｜>{% endif %}<｜Assistant｜><｜end▁of▁sentence｜>");
  const int k2 = st_chat_template_detect("<|start|>{{ role }}<|channel|>final<|message|>");
  const int k3 = st_chat_template_detect("[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>");
  const int k4 = st_chat_template_detect("{% for m in messages %}<|im_assistant|>assistant<|im_middle|>{% endfor %}");
  if (k1 == ST_CHAT_DEEPSEEK3 && k2 == ST_CHAT_HARMONY && k3 == ST_CHAT_GLM4 && k4 == ST_CHAT_KIMI_K2) {
    printf("PASS detection: DeepSeek-V3, harmony, [gMASK]<sop> and Kimi K2 markers -> their families\n");
    pass++;
  } else {
    printf("FAIL detection of the other families: %d %d %d %d\n", k1, k2, k3, k4);
    fail++;
  }
  printf("test_chat_template: %d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
}
