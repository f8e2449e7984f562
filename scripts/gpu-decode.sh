#!/usr/bin/env bash
# On a GPU host from the repository root, after scripts/gather-libs (builds nothing): the decode
# step (graph/decode.h) against the per-task path (STRATA_DECODE_GRAPH=0) on CUDA0: bitwise-equal
# logits over 300 one-token steps (--prefill 1, crossing the attention's 256-key chunk) with the
# primary cache off, half full and full, under eager (with spans of 3 layers a task: the fixtures'
# 4 layers as two tasks) and dmda (STRATA_LAYER_SPAN, else the default: one task); byte-identical
# greedy ids, also with one layer a task; the
# fixture comparisons (tests/test_forward_ref) on CUDA0. Prints a table last. BIN: the strata binary
# to check (default carry/strata; e.g. BIN=carry/strata-tags, a scripts/build-decode-variants build).
set -u
C=${CARRY:-carry}
CARRY=$C "$(dirname "$0")/carry-unpack" # each call brings carry/ packed
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=${BIN:-$PWD/$C/strata}
[ "${S#/}" = "$S" ] && S=$PWD/$S
M=$C/fixtures/models
out=${OUT:-/tmp}
mkdir -p "$out"
rows=()
add() { rows+=("$1"); echo "ROW $1"; }
MODELS=${MODELS:-tiny-qwen3moe-q8_0 small-qwen3moe-q4_k_m tiny-qwen3moe-bf16}
printf 'The quick brown fox jumps over the lazy dog.\nMixture-of-experts models route every token.\n' > "$out/calib.txt"
ids=$(seq -s, 100 399)
for mf in $MODELS; do
  "$S" profile -m "$M/$mf.gguf" -f "$out/calib.txt" -o "$out/$mf.profile" 2>/dev/null
  for cache in 0 half all; do
    args=(--expert-cache 0)
    if [ "$cache" != 0 ]; then args=(--expert-profile "$out/$mf.profile" --expert-cache "$([ $cache = all ] && echo auto || echo 8)"); fi
    for sched in eager dmda; do
      # eager with spans of 3 layers (the fixtures' 4: a task of 3 and one of 1), dmda with the default
      span=$([ $sched = eager ] && echo 3 || echo "${STRATA_LAYER_SPAN:-12}")
      for g in 1 0; do
        STRATA_LAYER_SPAN=$span STRATA_DECODE_GRAPH=$g STARPU_SCHED=$sched timeout 120 "$S" eval -m "$M/$mf.gguf" -c 512 --prompt-ids "$ids" --prefill 1 \
          --all-logits --logits-out "$out/l-$g.f32" "${args[@]}" 2>"$out/err-$g"
      done
      [ -s "$out/l-1.f32" ] && cmp -s "$out/l-1.f32" "$out/l-0.f32" && r=PASS || r="FAIL ($(tail -n 2 "$out/err-1" | tr '\n' ' '))"
      add "$mf, cache $cache, $sched, span $span: decode step vs per-task path, 300 steps, logits bitwise: $r"
    done
  done
  gen() { timeout 120 "$S" generate -m "$M/$mf.gguf" -p "Explain why the sky is blue." -n 48 --temp 0 --ignore-eos --print-ids \
          --expert-profile "$out/$mf.profile" --expert-cache 8 "$@" 2>>"$out/gen.err" | grep '^\['; }
  a=$(gen); b=$(STRATA_DECODE_GRAPH=0 gen); c=$(STARPU_SCHED=dmda gen); s1=$(STRATA_LAYER_SPAN=1 gen)
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && [ "$a" = "$s1" ] && r=PASS || r="FAIL ($a / $b / $c / $s1)"
  add "$mf: greedy ids, decode step (lws, dmda, one layer a task) vs per-task path, half cached: $r"
done
STRATA_FIXTURES=$PWD/$C/fixtures timeout 300 "$C/tests/test_forward_ref" > "$out/forward_ref.log" 2>&1
add "fixture comparisons on CUDA0 (test_forward_ref): $(tail -n 1 "$out/forward_ref.log")"
grep -E "^(FAIL)" "$out/forward_ref.log" | head -n 10
tail -n 5 "$out/gen.err"
echo "== gpu-decode"
for r in "${rows[@]}"; do echo "$r"; done
