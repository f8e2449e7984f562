#!/bin/sh
# The `strata` binary as a user drives it: greedy generation through the CLI reproduces the
# reference continuation (with the external references of $STRATA_FIXTURES; skipped, and said so,
# without them), tokenize, eval's logits file, and bad input
# (unknown flags, missing or malformed files, an unsupported architecture or tensor type, a
# prompt longer than the context, negative -n, a host expert arena larger than the RAM, a StarPU
# folder that cannot be made) giving one
# clear line and exit status 1,
# models in the i-quant formats written by mkmodel running through generate, and Ctrl-C in generate. The models are the tiny
# preset of `strata mkmodel` (tests/lib.sh test_model).
set -u
export STARPU_SILENT=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
tiny=$(test_model tiny-qwen3moe-bf16 --preset tiny --type bf16)
q8=$(test_model tiny-qwen3moe-q8_0 --preset tiny --type q8_0)
n_vocab=$(sed -n 's/.* vocab \([0-9]*\),.*/\1/p' "${tiny%.gguf}.err")
printf 'The quick brown fox jumps over the lazy dog.\n' > "$tmp/calib.txt"

# 1. greedy generation of the reference's 'short' prompt (ids and continuation from the fixture's
# JSON, on the fixture's model); then the same run on the test model, whose report is checked
ids="785, 3974, 293, 4830, 282, 5131, 7784, 82, 916, 279, 1187, 4246, 5562, 13"
if have_fixtures; then
  want="[6841, 6004, 3427, 4124, 2332, 1561, 6252, 3073, 3427, 4124, 2332, 1561, 6252, 3073, 3427, 452]"
  got=$("$STRATA" generate -m "$STRATA_FIXTURES/models/tiny-qwen3moe-bf16.gguf" --prompt-ids "$ids" -n 16 --temp 0 \
        --print-ids --ignore-eos 2>"$tmp/err")
  if [ "$got" = "$want" ]; then ok "generate --print-ids, the fixture's reference continuation: $got"
  else bad "generate --print-ids: got '$got' want '$want' ($(tail -n 3 "$tmp/err"))"; fi
else
  skip "generate against the fixture's reference continuation: no $STRATA_FIXTURES (set STRATA_FIXTURES)"
fi
want=$("$STRATA" generate -m "$tiny" --prompt-ids "$ids" -n 16 --temp 0 --print-ids --ignore-eos 2>"$tmp/err")
grep -q "decode: 16 tokens" "$tmp/err" && grep -q "StarPU workers:" "$tmp/err" && grep -q "^expert entries CPU [0-9]" "$tmp/err" \
  && grep -q "^strata: host expert arena: 64 pairs, 0.00[0-9] GiB in RAM (none pinned: no CUDA worker), 0 pairs left in the file" "$tmp/err" \
  && grep -q "^peak resident memory [0-9.]* GiB" "$tmp/err" \
  && ok "generate report: $(grep -E '^(prompt|decode):' "$tmp/err" | tr '\n' ' ')" || bad "generate report missing: $(cat "$tmp/err")"
case "$want" in "["*", "*"]") ok "generate --print-ids on the test model: $want" ;; *) bad "generate --print-ids: '$want'" ;; esac
# the half KV cache (the default): the load line names it, at half the float32 cache's MiB
kv16=$(sed -n 's/.*(KV cache f16, \([0-9.]*\) MiB).*/\1/p' "$tmp/err")
"$STRATA" generate -m "$tiny" --prompt-ids "$ids" -n 4 --temp 0 -ctk f32 -ctv f32 >/dev/null 2>"$tmp/err32"
kv32=$(sed -n 's/.*(KV cache f32, \([0-9.]*\) MiB).*/\1/p' "$tmp/err32")
if [ -n "$kv32" ] && [ -n "$kv16" ] && awk -v a="$kv32" -v b="$kv16" 'BEGIN { exit !(a > 0 && b == a / 2) }'; then
  ok "generate's default KV cache f16: $kv16 MiB (-ctk f32 -ctv f32, llama.cpp's short forms: $kv32 MiB)"
else bad "half KV cache: f32 '$kv32' MiB, f16 (default) '$kv16' MiB ($(tail -n 2 "$tmp/err32"))"; fi

# 2. text generation streams text
"$STRATA" generate -m "$tiny" -p "Hello" -n 8 --seed 3 >"$tmp/out" 2>"$tmp/err" && [ -s "$tmp/out" ] \
  && ok "generate text: $(head -c 80 "$tmp/out" | tr '\n' ' ')" || bad "generate text: $(cat "$tmp/err")"

# --seed -1 (llama.cpp's random seed): the seed it prints repeats the run
"$STRATA" generate -m "$tiny" -p "Hello" -n 8 --seed -1 >"$tmp/s1" 2>"$tmp/s1.err"
seed=$(sed -n 's/^strata: --seed -1: sampling seed \([0-9]*\)$/\1/p' "$tmp/s1.err")
"$STRATA" generate -m "$tiny" -p "Hello" -n 8 --seed "${seed:-0}" >"$tmp/s2" 2>/dev/null
[ -n "$seed" ] && [ -s "$tmp/s1" ] && cmp -s "$tmp/s1" "$tmp/s2" && ok "--seed -1 printed seed $seed, which repeats the text" \
  || bad "--seed -1: seed '$seed', $(head -c 80 "$tmp/s1") vs $(head -c 80 "$tmp/s2")"

# 3. tokenize with the Qwen3 tokenizer (the test model's, and a vocabulary-only GGUF of the
# fixtures: no tensors), special tokens parsed
tok_want="[151644, 872, 198, 9707, 1879, 151645]"
got=$("$STRATA" tokenize -m "$tiny" -p "<|im_start|>user
Hello world<|im_end|>" 2>&1)
[ "$got" = "$tok_want" ] && ok "tokenize: $got" || bad "tokenize: $got (want $tok_want)"
if have_fixtures; then
  got=$("$STRATA" tokenize -m "$STRATA_FIXTURES/tokenizer/vocab-qwen3.gguf" -p "<|im_start|>user
Hello world<|im_end|>" 2>&1)
  [ "$got" = "$tok_want" ] && ok "tokenize vocab-only GGUF: $got" || bad "tokenize vocab-only GGUF: $got"
else
  skip "tokenize the fixtures' vocabulary-only GGUF: no $STRATA_FIXTURES"
fi

# 4. eval writes n_vocab float32 values (n_vocab as mkmodel reported it)
"$STRATA" eval -m "$tiny" --prompt-ids "$ids" --logits-out "$tmp/l.f32" 2>"$tmp/err"
sz=$(wc -c < "$tmp/l.f32" 2>/dev/null || echo 0)
[ -n "$n_vocab" ] && [ "$sz" = $((n_vocab * 4)) ] && ok "eval --logits-out: $sz bytes ($n_vocab float32)" \
  || bad "eval --logits-out: $sz bytes for a vocabulary of ${n_vocab:-?}; $(cat "$tmp/err")"

# 5. bad input
expect_error "unknown flag" "unknown option '--bogus'" "$STRATA" generate -m "$tiny" -p hi --bogus
expect_error "llama.cpp's -ngl (getopt would read -n gl)" "\-ngl is llama.cpp's flag, not strata's: the dense work goes to the primary GPU whole" \
  "$STRATA" generate -m "$tiny" -p hi -n 4 -ngl 99
expect_error "llama.cpp's --flash-attn" "\-\-flash-attn is llama.cpp's flag" "$STRATA" bench -m "$tiny" --flash-attn on
expect_error "unknown command" "unknown command" "$STRATA" frobnicate
# profile takes no KV cache flags: llama.cpp's -ctk is named as such, not read as -c tk
expect_error "profile -ctk" "--cache-type-k (-ctk) does not apply to strata profile" "$STRATA" profile -m "$tiny" -f "$tmp/calib.txt" -o "$tmp/p.profile" -ctk f16
expect_error "missing model file" "$tmp/nope.gguf" "$STRATA" generate -m "$tmp/nope.gguf" -p hi
# special files never block (issue #21): a FIFO or a directory given where a file is read is
# refused at once (each under `timeout`: before the fix, open() on the FIFO waited forever)
mkfifo "$tmp/fifo"
expect_error "-m FIFO" "$tmp/fifo: cannot open: not a regular file (a FIFO)" timeout 20 "$STRATA" generate -m "$tmp/fifo" -p hi
expect_error "-m directory" "$tmp: cannot open: not a regular file (a directory)" timeout 20 "$STRATA" generate -m "$tmp" -p hi
expect_error "--expert-profile FIFO" "expert profile: $tmp/fifo: cannot open: not a regular file (a FIFO)" \
  timeout 20 "$STRATA" generate -m "$q8" -p hi --expert-profile "$tmp/fifo"
expect_error "serve --config FIFO" "$tmp/fifo: cannot open: not a regular file (a FIFO)" timeout 20 "$STRATA" serve --config "$tmp/fifo"
expect_error "profile -f FIFO" "$tmp/fifo: cannot open: not a regular file (a FIFO)" \
  timeout 20 "$STRATA" profile -m "$q8" -f "$tmp/fifo" -o "$tmp/p.prof"
expect_error "trace of a FIFO" "$tmp/fifo: cannot open: not a regular file (a FIFO)" timeout 20 "$STRATA" trace "$tmp/fifo"
# output paths are checked before the run, with the system's reason (issue #21)
expect_error "eval --logits-out a directory" "\-\-logits-out $tmp: is a directory, not a file" \
  "$STRATA" eval -m "$q8" -p hi --logits-out "$tmp"
expect_error "eval --logits-out in a missing directory" "directory $tmp/none: No such file or directory" \
  "$STRATA" eval -m "$q8" -p hi --logits-out "$tmp/none/l.f32"
expect_error "profile -o a directory" "\-o $tmp: is a directory, not a file" \
  "$STRATA" profile -m "$q8" -f "$tmp/calib.txt" -o "$tmp"
expect_error "eval --temp (generate's)" "\-\-temp applies to strata generate" "$STRATA" eval -m "$tiny" -p hi --temp 0
expect_error "negative -n" "\-n must be between 0" "$STRATA" generate -m "$tiny" -p hi -n -1
# a block_count below the blocks the tensors hold (llama.cpp refuses it by its tensor count)
off=$(grep -obUa "qwen3moe.block_count" "$q8" | head -n 1 | cut -d: -f1)
cp "$q8" "$tmp/bc.gguf" && printf '\001\000\000\000' | dd of="$tmp/bc.gguf" bs=1 seek=$((off + 24)) conv=notrunc 2>/dev/null
expect_error "block_count 1 over 4 blocks of tensors" "tensor blk.1.* belongs to block 1, but qwen3moe.block_count is 1" \
  "$STRATA" generate -m "$tmp/bc.gguf" -p hi -n 1
# StarPU aborts where it cannot make its sampling folder: the engine checks it first
: > "$tmp/afile"
expect_error "STARPU_HOME a file" "StarPU's folder $tmp/afile/.starpu/sampling (from STARPU_HOME) cannot be created or written: Not a directory" \
  env -u XDG_CACHE_HOME -u STARPU_PERF_MODEL_DIR STARPU_HOME="$tmp/afile" "$STRATA" generate -m "$tiny" -p hi -n 1
expect_error "no prompt" "give exactly one of" "$STRATA" generate -m "$tiny"
expect_error "prompt longer than the context" "more than the context of 4 tokens" "$STRATA" generate -m "$tiny" -p "one two three four five six" -c 4
expect_error "bad --prompt-ids" "expected comma-separated token ids" "$STRATA" eval -m "$tiny" --prompt-ids "1,x"
expect_error "token id out of range" "out of range" "$STRATA" eval -m "$tiny" --prompt-ids "999999"
head -c 100000 "$tiny" > "$tmp/trunc.gguf"
expect_error "truncated GGUF" "trunc.gguf" "$STRATA" generate -m "$tmp/trunc.gguf" -p hi
printf 'NOTAGGUF%0100d' 0 > "$tmp/magic.gguf"
expect_error "wrong magic" "magic" "$STRATA" generate -m "$tmp/magic.gguf" -p hi
# the same file with its architecture renamed (same length, so the layout stays valid)
LC_ALL=C sed 's/qwen3moe/llama4xx/g' "$tiny" > "$tmp/arch.gguf"
expect_error "unsupported architecture" "unsupported architecture llama4xx" "$STRATA" generate -m "$tmp/arch.gguf" -p hi
# a tiny Q8_0 model with rows of 256 and token_embd.weight's type changed to nvfp4 (40), which strata
# does not compute: the tensor info's type field follows the name, n_dims and two dims
cp "$(test_model tiny-h256-q8_0 --preset tiny --hidden 256 --type q8_0)" "$tmp/iq.gguf"; chmod u+w "$tmp/iq.gguf"
at=$(grep -obUa "token_embd.weight" "$tmp/iq.gguf" | head -n 1 | cut -d: -f1)
printf '\050\000\000\000' | dd of="$tmp/iq.gguf" bs=1 seek=$((at + 17 + 4 + 16)) conv=notrunc 2>/dev/null
expect_error "unsupported tensor type" "unsupported tensor type nvfp4 (id 40) for token_embd.weight in $tmp/iq.gguf\$" \
  "$STRATA" generate -m "$tmp/iq.gguf" -p hi
# the same wording for i8 (24) and, from the reader,
# for an id ggml does not define (200)
printf '\030\000\000\000' | dd of="$tmp/iq.gguf" bs=1 seek=$((at + 17 + 4 + 16)) conv=notrunc 2>/dev/null
expect_error "unsupported tensor type i8" "unsupported tensor type i8 (id 24) for token_embd.weight in $tmp/iq.gguf\$" \
  "$STRATA" generate -m "$tmp/iq.gguf" -p hi
printf '\310\000\000\000' | dd of="$tmp/iq.gguf" bs=1 seek=$((at + 17 + 4 + 16)) conv=notrunc 2>/dev/null
expect_error "unknown tensor type id" "unsupported tensor type id 200 (unknown to ggml) for token_embd.weight in $tmp/iq.gguf (its block size" \
  "$STRATA" generate -m "$tmp/iq.gguf" -p hi
# an FFN slice that would cut the down matrices' 256-weight blocks (q4_K experts of 512 rows, slices of 64)
k4="$(test_model tiny-ffn512-q4_k --preset tiny --hidden 256 --expert-ffn 512 --type q4_k)"
expect_error "STRATA_FF_SLICE inside a block" "STRATA_FF_SLICE=64: this model's q4_K expert down matrices (blk.0.ffn_down_exps.weight) take slices of a multiple of 256" \
  env STRATA_FF_SLICE=64 "$STRATA" generate -m "$k4" -p hi -n 1
# the second-GPU tiers' refusals (the seeds' wording for the peer tier), before any device is touched
expect_error "peer + layer split" "^strata generate: --peer-device cannot be combined with --layer-split (use one or the other)$" \
  "$STRATA" generate -m "$tiny" -p hi --expert-profile x --expert-cache 4 --peer-device 1 --layer-split auto
expect_error "peer + helper" "^strata generate: --peer-device cannot be combined with --expert-cache-device1..3 (the peer tier already caches experts there)$" \
  "$STRATA" generate -m "$tiny" -p hi --expert-profile x --expert-cache 4 --peer-device 1 --expert-cache-device1 8
expect_error "peer without a profile" "peer-device needs --expert-profile" "$STRATA" generate -m "$tiny" -p hi --peer-device 1
expect_error "peer without a cache" "peer-device needs an enabled expert cache" \
  "$STRATA" generate -m "$tiny" -p hi --peer-device 1 --expert-profile x
expect_error "helper tiers out of order" "expert-cache-device2 needs --expert-cache-device1: tiers must be enabled in order" \
  "$STRATA" generate -m "$tiny" -p hi --expert-profile x --expert-cache-device2 auto
expect_error "remote-expert-opt without a helper" "remote-expert-opt needs a helper cache" \
  "$STRATA" generate -m "$tiny" -p hi --remote-expert-opt
expect_error "peer flags without a peer" "need --peer-device N" "$STRATA" generate -m "$tiny" -p hi --peer-slots 8
expect_error "--trace into a file" "not a directory" "$STRATA" generate -m "$tiny" -p hi --trace "$tiny"
for v in STRATA_CUBLAS=abc STRATA_CUBLAS_TF32=2 STRATA_MMQ=2 STRATA_INT8_DOT=2 STRATA_PRIMARY_DEVICE=x STRATA_FF_SLICE=7 \
         STRATA_PROMPT_LANES=2 STRATA_DECODE_GRAPH=x STRATA_PDL=3 STRATA_LAYER_SPAN=-1; do
  expect_error "malformed $v" "${v%%=*}=" env "$v" "$STRATA" generate -m "$tiny" -p hi -n 1
done
expect_error "empty id in --prompt-ids" "expected comma-separated token ids" "$STRATA" eval -m "$tiny" --prompt-ids "1,,3"
for bad in "[1,2]x" "[1,2" "1,2]" "[[1,2]]" "1 2" "1,2,"; do
  expect_error "malformed --prompt-ids '$bad'" "expected comma-separated token ids" "$STRATA" eval -m "$tiny" --prompt-ids "$bad"
done
expect_error "empty --prompt-ids '[ ]'" "no token ids" "$STRATA" eval -m "$tiny" --prompt-ids "[ ]"
expect_error "--all-logits without a file" "all-logits writes to --logits-out" "$STRATA" eval -m "$tiny" -p hi --all-logits
expect_error "STARPU_NCPU=abc" "STARPU_NCPU=abc: expected a whole number" env STARPU_NCPU=abc "$STRATA" generate -m "$tiny" -p hi -n 1
expect_error "STARPU_NCPU=0" "needs at least one CPU worker" env STARPU_NCPU=0 "$STRATA" generate -m "$tiny" -p hi -n 1
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  expect_error "--gpu-mem without a GPU" "\-\-gpu-mem needs a CUDA device" "$STRATA" generate -m "$tiny" -p hi -n 1 --gpu-mem 8
fi
expect_error "STARPU_NCPU=4096" "more than 4 CPU workers a core" env STARPU_NCPU=4096 "$STRATA" generate -m "$tiny" -p hi -n 1
expect_error "bad --gpu-placement" "gpu-placement expects stripe or layer" "$STRATA" generate -m "$tiny" -p hi --gpu-placement ring
expect_error "KV cache types differ" "cache-type-k f32 with --cache-type-v f16: strata's K and V caches have one type" \
  "$STRATA" generate -m "$tiny" -p hi --cache-type-k f32
expect_error "KV cache type strata lacks" "cache-type-v expects f32, f16 or q8_0, got 'q4_0'" \
  "$STRATA" generate -m "$tiny" -p hi --cache-type-v q4_0
expect_error "q8_0 KV cache, rows of 16" "this model's KV rows (16 values) are not whole q8_0 blocks of 32" \
  "$STRATA" generate -m "$tiny" -p hi -ctk q8_0 -ctv q8_0
"$STRATA" profile -m "$tiny" -f "$tmp/calib.txt" -o "$tmp/tiny.profile" 2>/dev/null || bad "profile for the tier refusals"
expect_error "a profile that is not one" "not an expert profile" "$STRATA" generate -m "$tiny" -p hi --expert-profile "$tmp/calib.txt"
expect_error "peer device not there" "peer-device needs a CUDA device, and StarPU found none" \
  env STARPU_NCUDA=0 "$STRATA" generate -m "$tiny" -p hi --expert-profile "$tmp/tiny.profile" --expert-cache 4 --peer-device 1
# the host expert arena's RAM check at start (STRATA_MEMAVAILABLE_GIB stands in for MemAvailable)
expect_error "arena RAM refusal" "needs 0.00[1-9] GiB of RAM for 64 expert pairs and 0.00 GiB are available (STRATA_MEMAVAILABLE_GIB): --resident-experts lowers it" \
  env STRATA_MEMAVAILABLE_GIB=0 "$STRATA" generate -m "$tiny" -p hi -n 1
expect_error "arena RAM refusal, resident" "for 64 expert pairs .*: a larger --expert-cache (or helper caches)" \
  env STRATA_MEMAVAILABLE_GIB=0 "$STRATA" generate -m "$tiny" -p hi -n 1 --resident-experts
expect_error "bad STRATA_ARENA_PIN_GIB" "STRATA_ARENA_PIN_GIB=lots: expected a number of GiB >= 0" \
  env STRATA_ARENA_PIN_GIB=lots "$STRATA" generate -m "$tiny" -p hi -n 1
expect_error "helper device not there" "expert-cache-device1 needs a CUDA device, and StarPU found none" \
  env STARPU_NCUDA=0 "$STRATA" generate -m "$tiny" -p hi --expert-profile "$tmp/tiny.profile" --expert-cache-device1 auto
expect_error "layer split without GPUs" "layer-split needs a CUDA device" \
  env STARPU_NCUDA=0 "$STRATA" generate -m "$tiny" -p hi --layer-split auto
# 6. --cuda-graphs: parsed by every model-running command; without a GPU it changes nothing
got=$("$STRATA" generate -m "$tiny" --prompt-ids "$ids" -n 16 --temp 0 --print-ids --ignore-eos --cuda-graphs on 2>"$tmp/err")
[ "$got" = "$want" ] && ok "generate --cuda-graphs on (CPU only: no effect): $got" || bad "generate --cuda-graphs on: got '$got' want '$want'"
got=$("$STRATA" generate -m "$tiny" --prompt-ids "$ids" -n 16 --temp 0 --print-ids --ignore-eos --cuda-graphs off 2>"$tmp/err")
[ "$got" = "$want" ] && ok "generate --cuda-graphs off: $got" || bad "generate --cuda-graphs off: got '$got' want '$want'"
expect_error "bad --cuda-graphs" "\-\-cuda-graphs expects on or off" "$STRATA" generate -m "$tiny" -p hi --cuda-graphs maybe
expect_error "--cuda-graphs both outside bench" "\-\-cuda-graphs both is for strata bench" "$STRATA" eval -m "$tiny" -p hi --cuda-graphs both
"$STRATA" bench -m "$tiny" --prompt 0 --decode 2 --json --cuda-graphs both >"$tmp/out" 2>"$tmp/err" \
  && grep -q '"cuda_graphs": "off"' "$tmp/out" && grep -q '"cuda_graphs_compare": \[\]' "$tmp/out" && grep -q "graphs have no effect" "$tmp/err" \
  && ok "bench --cuda-graphs both on CPU: measured once, graphs off, $(cat "$tmp/err")" || bad "bench --cuda-graphs both: $(cat "$tmp/out" "$tmp/err" | head -c 600)"
"$STRATA" bench -m "$tiny" --prompt 32 --decode 2 --depth 0,32 -r 3 >"$tmp/out" 2>"$tmp/err" \
  && [ "$(grep -c " runs (tok/s):" "$tmp/out")" = 3 ] && grep -q "each row: the run with the median time" "$tmp/out" \
  && ok "bench -r 3: three rows, each with its runs: $(grep -m1 " runs (tok/s):" "$tmp/out")" || bad "bench -r 3: $(cat "$tmp/out" "$tmp/err" | head -c 600)"
"$STRATA" bench -m "$tiny" --prompt 32 --decode 2 -r 2 --json >"$tmp/out" 2>"$tmp/err" \
  && [ "$(grep -o '"tok_s_runs": \[[0-9.]*, [0-9.]*\]' "$tmp/out" | wc -l)" = 2 ] \
  && ok "bench -r 2 --json: tok_s_runs has two runs per row" || bad "bench -r 2 --json: $(cat "$tmp/out" "$tmp/err" | head -c 600)"
# tflop_s of a 32-token prompt against the FLOPs of the tiny preset worked out here (4 layers,
# hidden 64, 4 heads and 2 KV heads of 16, 16 experts, top-4, expert FFN 64; the vocabulary from
# the logits' size): per token and layer 2 (64 (64 + 64) + 64 64 + 64 16 + 4 3 64 64) and 2 2 64
# per key seen, 528 keys over the 32 tokens, and the head once: 2 64 V
"$STRATA" eval -m "$tiny" -p hi --logits-out "$tmp/v.f32" 2>/dev/null
V=$(( $(wc -c < "$tmp/v.f32") / 4 ))
"$STRATA" bench -m "$tiny" --prompt 32 --decode 0 --json >"$tmp/out" 2>"$tmp/err"
line=$(grep '"test": "prompt"' "$tmp/out")
tps=$(echo "$line" | sed -E 's/.*"tok_s": ([0-9.e+-]+).*/\1/') tf=$(echo "$line" | sed -E 's/.*"tflop_s": ([0-9.e+-]+).*/\1/')
want=$(( 2 * 4 * (62464 * 32 + 2 * 64 * 528) + 2 * 64 * V ))
awk -v p="$tps" -v t="$tf" -v w="$want" -v V="$V" 'BEGIN { g = t * 1e12 * 32 / p; d = (g - w) / w; exit !(V > 0 && d < 1e-4 && d > -1e-4) }' \
  && ok "bench --json tflop_s: $tf TFLOP/s at $tps tok/s over 32 tokens = $want FLOPs (vocabulary $V, within 1e-4)" \
  || bad "bench tflop_s: $tf at $tps tok/s, want $want FLOPs: $(head -c 300 "$tmp/out" "$tmp/err")"
expect_error "bench -r 0" "\-\-repetitions" "$STRATA" bench -m "$tiny" -r 0
expect_error "bench --kernels with a model" "\-\-kernels takes no model" "$STRATA" bench --kernels -m "$tiny"
expect_error "bench -r with --kernels" "\-\-repetitions applies to the model bench" "$STRATA" bench --kernels -r 2
expect_error "bench --kernels --formats with an unknown format" "unknown format 'q9_K' (known: f32" "$STRATA" bench --kernels --formats q4_K,q9_K
expect_error "bench --kernels --formats empty" "no format named in ''" "$STRATA" bench --kernels --formats ""
expect_error "bench --kernels --formats ','" "no format named in ','" "$STRATA" bench --kernels --formats ,
expect_error "bench --formats without --kernels" "\-\-formats applies to \-\-kernels" "$STRATA" bench -m "$tiny" --formats q4_K
expect_error "bench --kernels --isa unknown" "\-\-isa must be scalar, avx2, avx512 or avx512vbmi" "$STRATA" bench --kernels --isa sse9
expect_error "bench --kernels --row-length not a multiple of 256" "\-\-row-length must be a multiple of 256" "$STRATA" bench --kernels --row-length 300
expect_error "bench --row-length without --kernels" "\-\-row-length applies to \-\-kernels" "$STRATA" bench -m "$tiny" --row-length 512
expect_error "bench --isa without --kernels" "\-\-isa applies to \-\-kernels" "$STRATA" bench -m "$tiny" --isa avx2
expect_error "bench --grid-lookup without --kernels" "\-\-grid-lookup applies to \-\-kernels" "$STRATA" bench -m "$tiny" --grid-lookup gather
expect_error "bench --kernels --grid-lookup unknown" "\-\-grid-lookup must be permute or gather" "$STRATA" bench --kernels --grid-lookup shuffle
expect_error "bench --kernels --grid-lookup below avx512vbmi" "\-\-grid-lookup needs the avx512vbmi kernels" "$STRATA" bench --kernels --isa avx2 --grid-lookup gather
for c in generate eval bench serve; do
  "$STRATA" $c --help 2>&1 | grep -q -- "--cuda-graphs on|off" && ok "$c --help shows --cuda-graphs" || bad "$c --help lacks --cuda-graphs"
done
# 7. mkmodel writes the i-quants and generate runs them (rows of 256, so no fallback type); the
# fixtures' small model lends its 8,192-id tokenizer when it is there (a faster search)
vocab=""
have_fixtures && vocab="--vocab $STRATA_FIXTURES/models/small-qwen3moe-q4_k_m.gguf"
for t in iq4_nl iq4_xs iq3_xxs iq3_s iq2_xs iq2_s; do
  if "$STRATA" mkmodel -o "$tmp/$t.gguf" --hidden 256 --expert-ffn 256 --layers 2 --type "$t" -q $vocab 2>"$tmp/err" \
     && "$STRATA" generate -m "$tmp/$t.gguf" -p "Hello" -n 4 >"$tmp/out" 2>>"$tmp/err" && [ -s "$tmp/out" ]; then
    ok "mkmodel --type $t, then generate: $(head -c 60 "$tmp/out" | tr '\n' ' ')"
  else
    bad "mkmodel --type $t / generate: $(tail -n 3 "$tmp/err")"
  fi
  rm -f "$tmp/$t.gguf"
done
# 7a. mkmodel's last line says which matrices fell back to q8_0: all of them at hidden 64 (q4_k's
# 256-blocks divide no row), not all at hidden and expert FFN 256 (the attention's narrower rows still do)
if "$STRATA" mkmodel -o "$tmp/fb.gguf" --layers 2 --type q4_k -q $vocab 2>"$tmp/err" \
   && grep -Eq 'q4_K \(all ([0-9]+) of \1 matrices in q8_0' "$tmp/err" \
   && "$STRATA" mkmodel -o "$tmp/fb.gguf" --hidden 256 --expert-ffn 256 --layers 2 --type q4_k -q $vocab 2>"$tmp/err2" \
   && grep -q 'q4_K' "$tmp/err2" && ! grep -q '(all ' "$tmp/err2"; then
  ok "mkmodel --type q4_k names its q8_0 fallback: $(grep -o 'q4_K (.*' "$tmp/err"); at 256: $(grep -o 'q4_K.*' "$tmp/err2")"
else
  bad "mkmodel --type q4_k fallback line: $(tail -n 1 "$tmp/err") / $(tail -n 1 "$tmp/err2" 2>/dev/null)"
fi
rm -f "$tmp/fb.gguf"
# 7b. mkmodel refuses a shape or tokenizer that would make a file no loader reads; a run stopped by
# SIGTERM leaves an existing output file as it was and no partial file beside it
expect_error "mkmodel --head-dim 9" "RoPE rotates 9 dimensions" "$STRATA" mkmodel -q -o "$tmp/hd.gguf" --type f16 --head-dim 9
echo '{"model":{"type":"WordPiece","vocab":{"a":0}}}' >"$tmp/wp.json"
expect_error "mkmodel --vocab of a WordPiece tokenizer" "mkmodel takes a BPE tokenizer.json with merges" \
  "$STRATA" mkmodel -q -o "$tmp/wp.gguf" --vocab "$tmp/wp.json"
if "$STRATA" mkmodel -q -o "$tmp/keep.gguf" --layers 2 $vocab 2>"$tmp/err"; then
  sum0=$(md5sum <"$tmp/keep.gguf")
  "$STRATA" mkmodel -q -o "$tmp/keep.gguf" --preset qwen3-30b-a3b --layers 1 --experts 8 2>"$tmp/err" &
  mp=$!
  waited=0
  while ! ls "$tmp"/keep.gguf.part.* >/dev/null 2>&1 && [ $waited -lt 300 ] && kill -0 $mp 2>/dev/null; do sleep 0.1; waited=$((waited + 1)); done
  kill -TERM $mp 2>/dev/null
  wait $mp
  st=$?
  if [ "$st" = 143 ] && [ "$(md5sum <"$tmp/keep.gguf")" = "$sum0" ] && ! ls "$tmp"/keep.gguf.part.* >/dev/null 2>&1; then
    ok "mkmodel stopped by SIGTERM (exit $st): the existing file unchanged, no partial file left"
  else
    bad "mkmodel stopped by SIGTERM: exit $st, $(ls "$tmp" | grep keep | tr '\n' ' '), $(tail -n 2 "$tmp/err")"
  fi
else
  bad "mkmodel --layers 2: $(tail -n 2 "$tmp/err")"
fi
rm -f "$tmp"/keep.gguf*
# 8. Ctrl-C during generate: the run stops after the token in progress and ends as a finished one
# (its timings printed), exit status 130; the signal is sent once the first text has come out
rm -f "$tmp/out" "$tmp/err"
"$STRATA" generate -m "$q8" -p "Hello" -n 4000 --ignore-eos --temp 0 -c 4096 >"$tmp/out" 2>"$tmp/err" &
gpid=$!
waited=0
while [ ! -s "$tmp/out" ] && [ $waited -lt 600 ] && kill -0 $gpid 2>/dev/null; do sleep 0.1; waited=$((waited + 1)); done
kill -INT $gpid 2>/dev/null
wait $gpid; grc=$?
if [ $grc = 130 ] && grep -q "interrupted (SIGINT) after [0-9]* generated tokens" "$tmp/err" && grep -q "^decode: [0-9]* tokens" "$tmp/err"; then
  ok "Ctrl-C in generate: exit 130, $(grep -o 'interrupted.*' "$tmp/err"), $(grep '^decode:' "$tmp/err")"
else
  bad "Ctrl-C in generate: exit $grc, $(tail -n 3 "$tmp/err")"
fi
for c in generate eval tokenize mkmodel; do
  "$STRATA" $c --help >"$tmp/out" 2>&1 && grep -q "usage: strata $c" "$tmp/out" && ok "$c --help" || bad "$c --help: $(head -c 200 "$tmp/out")"
done
echo "test_cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
