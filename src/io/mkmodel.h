/* Random-weight MoE GGUF files for demos and benchmarks (`strata mkmodel`), of any architecture
 * io/arch.h describes. The metadata and tensor names/shapes are those llama.cpp writes for the
 * architecture (the loader and this writer read one list, st_arch_layer_tensors); the weights are random but scaled so activations stay O(1) over many
 * layers, and routing is skewed on purpose (a few experts per layer routed far more often), as in
 * trained models. Output is identical for a given seed whatever the thread count. */
#ifndef ST_MKMODEL_H
#define ST_MKMODEL_H

#include <stddef.h>
#include <stdint.h>

struct st_mkmodel_config {
  uint32_t arch;          /* enum st_arch_id (io/model.h): the keys' prefix and the layers' tensors */
  uint32_t n_layer;       /* <arch>.block_count */
  uint32_t n_expert;      /* qwen3moe.expert_count */
  uint32_t n_expert_used; /* qwen3moe.expert_used_count (top-k) */
  uint32_t n_embd;        /* qwen3moe.embedding_length (hidden) */
  uint32_t n_ff_exp;      /* qwen3moe.expert_feed_forward_length */
  uint32_t n_ff;          /* qwen3moe.feed_forward_length (dense FFN; unused by qwen3moe) */
  uint32_t n_head, n_head_kv, head_dim;
  uint32_t n_ctx;      /* qwen3moe.context_length (tokens) */
  float rope_theta;    /* qwen3moe.rope.freq_base */
  float rms_eps;       /* qwen3moe.attention.layer_norm_rms_epsilon */
  uint32_t type;       /* st_type of the 2-D/3-D matrices (see st_mkmodel_file_type) */
  uint32_t expert_type; /* st_type of the routed experts' matrices when has_expert_type (gpt-oss-20b: mxfp4) */
  int has_expert_type;  /* 0: the experts take `type` */
  /* what the other architectures add (their GGUF keys; 0 = none) */
  uint32_t n_rot;         /* rope.dimension_count (0 = head_dim) */
  uint32_t n_layer_dense; /* leading_dense_block_count (FFN feed_forward_length) */
  uint32_t n_shared;      /* expert_shared_count */
  uint32_t gating;        /* enum st_gating: written as expert_gating_func for deepseek2 and glm4moe */
  uint32_t n_group, n_group_used;
  float w_scale;          /* expert_weights_scale (0 = not written) */
  int w_norm;             /* expert_weights_norm */
  uint32_t n_swa;         /* attention.sliding_window */
  float yarn_factor;      /* rope.scaling.factor with type yarn (0 = no YaRN) */
  uint32_t yarn_orig_ctx; /* rope.scaling.original_context_length */
  float yarn_log_mul;     /* rope.scaling.yarn_log_multiplier (deepseek2: 0.1 mscale_all_dim; 0 = not written) */
  uint32_t q_lora, kv_lora, qk_nope, v_head; /* MLA: head_dim is then kv_lora + n_rot */
  uint64_t seed;       /* RNG seed */
  float skew;          /* routing skew; 0 = uniform routing */
  char name[64];       /* general.name */
  int n_threads;       /* generator threads; 0 = online CPUs */
  int progress;        /* print a `\r` progress line on stderr */
};

/* Fills *cfg with a preset: "tiny" (qwen3moe: 4 layers, 16 experts, top-4, hidden 64, expert FFN
 * 64, 4/2 heads of 16, context 4096), "qwen3-30b-a3b" (48 layers, 128 experts, top-8, hidden 2048,
 * expert FFN 768, 32/4 heads of 128, context 40960; shapes from Qwen3-30B-A3B's config.json);
 * "tiny-deepseek2", "tiny-gpt-oss", "tiny-glm4moe" (the shapes of ../shared/fixtures/archs);
 * "gpt-oss-20b" (24 layers, 32 experts, top-4, hidden 2880, 64/8 heads of 64, sliding window 128,
 * YaRN 32 over 4096; MXFP4 experts), "deepseek2-lite" (DeepSeek-V2-Lite: 27 layers, 1 dense, 64
 * experts, top-6, 2 shared, hidden 2048, MLA kv_lora 512 + rope 64, no q LoRA; without YaRN),
 * "glm4.5-air" (GLM-4.5-Air cut to 16 of its 46 layers: 128 experts, top-8, 1 shared, hidden 4096,
 * 96/8 heads of 128, half rotary). Shapes from the models' config.json files. Type q8_0, seed 1,
 * skew 1.5. Returns ST_EINVAL for an unknown name. */
int st_mkmodel_preset(const char *name, struct st_mkmodel_config *cfg);

/* A tokenizer to embed: arrays as written to tokenizer.ggml.*; ids -1 when absent. */
struct st_mkmodel_vocab {
  uint64_t n_tokens;  /* padded to a multiple of 64 with "[PAD<id>]" tokens (type 5) */
  char **tokens;      /* n_tokens owned strings */
  int32_t *types;     /* llama.cpp token types: 1 normal, 3 control, 4 user-defined, 5 unused */
  uint64_t n_merges;
  char **merges;      /* "a b" */
  int64_t eos_id, bos_id, pad_id;
  char *model, *pre;  /* tokenizer.ggml.model / .pre ("gpt2" / "qwen2" for tokenizer.json) */
  char *chat_template; /* NULL when the source has none */
  int add_bos;        /* tokenizer.ggml.add_bos_token */
};

/* Loads a vocabulary from a Hugging Face tokenizer.json (model.vocab, model.merges as "a b"
 * strings or [a, b] pairs, added_tokens; chat_template from a tokenizer_config.json beside it)
 * or from a GGUF file's tokenizer.* keys (chosen by the GGUF magic). eos = <|im_end|> if present,
 * else <|endoftext|>; bos = pad = <|endoftext|>. Free with st_mkmodel_vocab_free. */
int st_mkmodel_vocab_load(const char *path, struct st_mkmodel_vocab *v);
void st_mkmodel_vocab_free(struct st_mkmodel_vocab *v);

/* Checks the shape (every count > 0, top-k <= experts, matrix row lengths multiples of 32 for
 * q8_0). ST_EINVAL with a message naming the field. */
int st_mkmodel_check(const struct st_mkmodel_config *cfg);

/* llama.cpp's general.file_type (llama_ftype) for a model whose matrices are `type` (the _S
 * variant for K-quants), or -1 when mkmodel cannot write that type. */
int st_mkmodel_file_type(uint32_t type);

/* Of the weight matrices (token embedding included) st_mkmodel_write would write for cfg and a vocabulary
 * of n_vocab tokens: *n_matrices, and *n_fallback of them in another type than asked (--type, or the
 * experts' type) because that type's blocks do not divide their rows (as llama.cpp's quantiser: q8_0,
 * or f32 where 32 does not divide them either), *fallback_type the last such type. 0, or ST_ENOMEM. */
int st_mkmodel_fallbacks(const struct st_mkmodel_config *cfg, uint64_t n_vocab, uint32_t *n_fallback, uint32_t *n_matrices,
                         uint32_t *fallback_type);

/* Writes the model to `path` (GGUF v3), streaming: weights are generated by cfg->n_threads
 * threads in chunks of about 4 MiB and written in order, so memory use is a few MiB per thread.
 * On success, *bytes_out (if not NULL) is the file size. */
int st_mkmodel_write(const struct st_mkmodel_config *cfg, const struct st_mkmodel_vocab *vocab,
                     const char *path, uint64_t *bytes_out);

#endif
