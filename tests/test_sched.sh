#!/bin/sh
# Scheduler independence: the same prompt gives bitwise-identical logits under STARPU_SCHED=eager,
# lws and dmda, and with STARPU_NCPU=1 and 2 (the prompt lanes share work items whatever the
# workers), and the same through the per-task prompt path (STRATA_PROMPT_LANES=0: its task slicing
# never depends on the workers);
# the same through decode steps (--prefill 1: every token one decode step, its lanes sharing work
# items whatever the workers), and through the per-task decode path (STRATA_DECODE_GRAPH=0), all
# against the prompt path's logits; all of it for the float32 and for the half KV cache
# (--cache-type-k/-v f16: the CPU codelet's and the decode lanes' f16 reads), and for the q8_0 KV
# cache on a Q8_0 model with heads of 32 (whole q8_0 blocks). Then greedy
# generation: the same ids under every setting.
# Prints the scheduler/worker settings compared and the checksum of each logits file. The models are
# the tiny preset of `strata mkmodel` in BF16 and Q8_0 (tests/lib.sh test_model).
set -u
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
models="$(test_model tiny-qwen3moe-bf16 --preset tiny --type bf16) $(test_model tiny-qwen3moe-q8_0 --preset tiny --type q8_0)"
hd32=$(test_model tiny-qwen3moe-q8_0-hd32 --preset tiny --type q8_0 --head-dim 32)
prompt='Mixture-of-experts models route every token through a few experts; the rest stay idle.'
# same_as_baseline LABEL MODEL CFG [EVAL-ARGS...]: logits of `strata eval` on MODEL under the
# environment CFG (PREFILL=1: one-token chunks, else 7) bitwise equal to the first of the series
# ($ref, reset by the caller; the first run becomes it).
same_as_baseline() {
  _label=$1 _m=$2 _cfg=$3; shift 3
  _out="$tmp/$(echo "$_label $_cfg" | tr ' =' '__').f32"
  _prefill=7
  case "$_cfg" in PREFILL=1*) _prefill=1 ;; esac
  # dmda calibrates its performance models on first use; keep them out of $HOME for the test
  if ! env $_cfg STARPU_HOME="$tmp" STARPU_SILENT=1 "$STRATA" eval -m "$_m" -p "$prompt" --prefill $_prefill \
       "$@" --logits-out "$_out" 2>"$tmp/err"; then
    echo "FAIL $_label [$_cfg]: eval failed: $(cat "$tmp/err")"; fail=$((fail + 1)); return
  fi
  _sum=$(cksum < "$_out" | cut -d' ' -f1)
  if [ -z "$ref" ]; then
    ref=$_out; echo "     $_label [$_cfg]: logits checksum $_sum (baseline)"
  elif cmp -s "$ref" "$_out"; then
    echo "PASS $_label [$_cfg]: logits checksum $_sum, bitwise identical to the baseline"; pass=$((pass + 1))
  else
    echo "FAIL $_label [$_cfg]: logits checksum $_sum differ from the baseline"; fail=$((fail + 1))
  fi
}
for kv in f32 f16 q8_0; do
kv_models=$models
[ "$kv" = q8_0 ] && kv_models=$hd32
for m in $kv_models; do
  ref=""
  for cfg in "STARPU_SCHED=lws STARPU_NCPU=2" "STARPU_SCHED=eager STARPU_NCPU=2" \
             "STARPU_SCHED=dmda STARPU_NCPU=2" "STARPU_SCHED=lws STARPU_NCPU=1" \
             "STARPU_SCHED=eager STARPU_NCPU=1" "STRATA_PROMPT_LANES=0 STARPU_SCHED=lws STARPU_NCPU=2" \
             "STRATA_PROMPT_LANES=0 STARPU_SCHED=dmda STARPU_NCPU=1" "PREFILL=1 STARPU_SCHED=lws STARPU_NCPU=2" \
             "PREFILL=1 STARPU_SCHED=eager STARPU_NCPU=1" "PREFILL=1 STARPU_SCHED=dmda STARPU_NCPU=2" \
             "PREFILL=1 STARPU_SCHED=lws STARPU_NCPU=2 STRATA_DECODE_GRAPH=0"; do
    same_as_baseline "$(basename "$m" .gguf) $kv KV" "$m" "$cfg" --cache-type-k $kv --cache-type-v $kv
  done
done
done
for m in $models; do
  model=$(basename "$m" .gguf)
  ref=""
  for cfg in "STARPU_SCHED=lws STARPU_NCPU=2" "STARPU_SCHED=eager STARPU_NCPU=1" "STARPU_SCHED=dmda STARPU_NCPU=2" \
             "STARPU_SCHED=lws STARPU_NCPU=2 STRATA_DECODE_GRAPH=0"; do
    ids=$(env $cfg STARPU_HOME="$tmp" STARPU_SILENT=1 "$STRATA" generate -m "$m" -p "$prompt" -n 24 --temp 0 \
          --print-ids 2>"$tmp/err" | grep '^\[')
    if [ -z "$ids" ]; then
      echo "FAIL $model generate [$cfg]: $(cat "$tmp/err")"; fail=$((fail + 1)); continue
    fi
    if [ -z "$ref" ]; then
      ref=$ids; echo "     $model generate [$cfg]: 24 greedy ids (baseline) $ids"; continue
    fi
    if [ "$ids" = "$ref" ]; then
      echo "PASS $model generate [$cfg]: the same 24 greedy ids"; pass=$((pass + 1))
    else
      echo "FAIL $model generate [$cfg]: $ids differ from the baseline"; fail=$((fail + 1))
    fi
  done
done
# Many query heads per KV head (4096 of dim 8 on one) over 300 positions: one token's attention
# scores (4096 x 300 floats) pass the 2^20 a scores buffer holds by default, which both prompt
# paths must size for (they overflowed it before); both finish and agree bitwise.
wide=$(test_model wide-gqa-q8_0 --preset tiny --layers 1 --heads 4096 --kv-heads 1 --head-dim 8)
ids=$(seq -s, 100 399)
for lanes in 0 1; do
  env STRATA_PROMPT_LANES=$lanes STARPU_NCPU=2 STARPU_HOME="$tmp" STARPU_SILENT=1 "$STRATA" eval -m "$wide" --prompt-ids "$ids" \
    -c 300 --no-learn --logits-out "$tmp/wide$lanes.f32" 2>"$tmp/err" || echo "     eval STRATA_PROMPT_LANES=$lanes: exit $?: $(tail -n 1 "$tmp/err")"
done
if [ -s "$tmp/wide0.f32" ] && cmp -s "$tmp/wide0.f32" "$tmp/wide1.f32"; then
  echo "PASS 4096 query heads on 1 KV head, 300 tokens: both prompt paths finish, logits bitwise identical"; pass=$((pass + 1))
else
  echo "FAIL 4096 query heads on 1 KV head, 300 tokens: a path failed or the logits differ"; fail=$((fail + 1))
fi
# The K formats' dense products on two-term int8 activations (st_dense_terms; the head on one): the
# small Q4_K_M fixture through the prompt lanes, the per-task path, one-token chunks (decode steps
# of the lanes and of the per-task path), other schedulers and worker counts, bitwise.
if have_fixtures && [ -f "$STRATA_FIXTURES/models/small-qwen3moe-q4_k_m.gguf" ]; then
  ref=""
  for cfg in "STARPU_SCHED=lws STARPU_NCPU=2" "STARPU_SCHED=dmda STARPU_NCPU=1" "STRATA_PROMPT_LANES=0 STARPU_SCHED=eager STARPU_NCPU=2" \
             "PREFILL=1 STARPU_SCHED=lws STARPU_NCPU=2" "PREFILL=1 STRATA_DECODE_GRAPH=0 STARPU_SCHED=lws STARPU_NCPU=2"; do
    same_as_baseline "small-q4_k_m" "$STRATA_FIXTURES/models/small-qwen3moe-q4_k_m.gguf" "STARPU_NCUDA=0 $cfg" --no-learn
  done
fi
# The other architectures (the fixtures' deepseek2, gpt-oss and glm4moe in Q8_0, CPU workers only):
# the prompt lanes under other schedulers and worker counts, one-token chunks (decode steps) and
# the prompt a token at a time (STRATA_PROMPT_LANES=0) give bitwise-identical logits; the per-task
# decode path (STRATA_DECODE_GRAPH=0) and a CUDA worker are refused by name.
if have_fixtures && [ -d "$STRATA_FIXTURES/archs" ]; then
  for arch in deepseek2 gpt-oss glm4moe; do
    m="$STRATA_FIXTURES/archs/tiny-$arch-q8_0.gguf"
    ref=""
    for cfg in "STARPU_SCHED=lws STARPU_NCPU=2" "STARPU_SCHED=eager STARPU_NCPU=1" "STARPU_SCHED=dmda STARPU_NCPU=2" \
               "PREFILL=1 STARPU_SCHED=lws STARPU_NCPU=2" "STRATA_PROMPT_LANES=0 STARPU_SCHED=eager STARPU_NCPU=2"; do
      same_as_baseline "tiny-$arch-q8_0" "$m" "STARPU_NCUDA=0 $cfg" --no-learn
    done
  done
  # gpt-oss's sliding layers keep a ring of window + prompt chunk rows: 120 tokens in a context of
  # 128 with chunks of 128 (no ring), 16, 5 and 1 (rings of 24, 13, 9 rows, wrapping many times)
  ref=""
  for pf in 128 16 5 1; do
    env STARPU_NCUDA=0 STARPU_NCPU=2 STARPU_HOME="$tmp" STARPU_SILENT=1 "$STRATA" eval -m "$STRATA_FIXTURES/archs/tiny-gpt-oss-q8_0.gguf" \
      --prompt-ids "$(seq -s, 100 219)" -c 128 --prefill $pf --no-learn --logits-out "$tmp/ring$pf.f32" 2>"$tmp/err" \
      || echo "     eval --prefill $pf: exit $?: $(tail -n 1 "$tmp/err")"
    if [ -z "$ref" ]; then ref="$tmp/ring$pf.f32"; continue; fi
    if [ -s "$ref" ] && cmp -s "$ref" "$tmp/ring$pf.f32"; then
      ok "tiny-gpt-oss-q8_0 sliding layers' ring buffer: 120 tokens with --prefill $pf, logits bitwise identical to --prefill 128's"
    else
      bad "tiny-gpt-oss-q8_0 sliding layers' ring buffer: --prefill $pf differs from --prefill 128 (or failed)"
    fi
  done
  expect_error "deepseek2 with STRATA_DECODE_GRAPH=0" "STRATA_DECODE_GRAPH=0 takes qwen3moe" \
    env STRATA_DECODE_GRAPH=0 STARPU_NCUDA=0 STARPU_SILENT=1 "$STRATA" eval -m "$STRATA_FIXTURES/archs/tiny-deepseek2-q8_0.gguf" -p hi --no-learn
else
  skip "the other architectures' scheduler independence: no $STRATA_FIXTURES/archs"
fi
echo "test_sched: $pass passed, $fail failed"
[ "$fail" = 0 ]
