#!/usr/bin/env bash
# On a GPU host from the repository root, after scripts/gather-libs (builds nothing): issue #20's
# depth row in one call, each step only while the call's time (LIMIT seconds, default 480) lasts:
#  1. a head_dim-128 model: the decode step against the per-task path over 300 steps, bitwise, with
#     the f16 and the q8_0 cache (experts all cached);
#  2. qwen3-30b-a3b Q8_0, every expert cached: `strata bench --prompt 0 --decode DECODE --depth
#     DEPTHS` with the f16 and the q8_0 cache (and carry/mk/strata's f16, when carried);
#  3. tests/test_cuda_kernels: PASS and FAIL counts, and its FAIL lines;
#  4. bench/attn-bench's carried variants (scripts/gpu-attn-variants.sh, NCU=0), when time is left.
# Environment: STEPS (the steps to run, "1 2 3 4"), W work folder (/tmp/gpu-step), R repetitions (2),
# DECODE tokens (64), DEPTHS (0,4096,32768), RUNS (step 2's builds and caches, "BIN:KV ...", e.g.
# "strata:f16 strata-noring:f16"; default strata with f16 and q8_0). Prints a table last.
set -u
. "$(dirname "$0")/gpu-lib.sh"
LIMIT=${LIMIT:-480}
R=${R:-2}
rows=()
add() { rows+=("$1"); echo "ROW $1"; }
left() { [ $((LIMIT - SECONDS)) -gt "$1" ]; }
step() { case " ${STEPS:-1 2 3 4} " in *" $1 "*) return 0 ;; esac; return 1; }

if step 1; then
m=$(gpu_model depth-small --preset tiny --layers 4 --hidden 512 --heads 8 --kv-heads 2 --head-dim 128 --context 8192)
ids=$(seq -s, 100 399)
for kv in f16 q8_0; do
  for g in 1 0; do
    STRATA_DECODE_GRAPH=$g STARPU_SCHED=eager timeout 120 "$S" eval -m "$m" --prompt-ids "$ids" --prefill 1 --all-logits \
      --logits-out "$W/d-$kv-$g.f32" --no-learn --cache-type-k $kv --cache-type-v $kv -c 1024 --expert-profile "$W/depth-small.profile" \
      --expert-cache auto 2> "$W/err-$kv-$g"
  done
  [ -s "$W/d-$kv-1.f32" ] && cmp -s "$W/d-$kv-1.f32" "$W/d-$kv-0.f32" && r=PASS || r="FAIL ($(tail -n 2 "$W/err-$kv-1" | tr '\n' ' '))"
  add "head_dim 128, $kv KV, experts cached: decode step vs per-task path, 300 steps, logits bitwise: $r"
done
fi

if step 2; then
big=$(gpu_model qwen3-30b-a3b-q8_0 --preset qwen3-30b-a3b --type q8_0)
runs=("strata f16" "strata q8_0")
[ -x "$C/mk/strata" ] && runs+=("mk/strata f16")
if [ -n "${RUNS:-}" ]; then
  runs=()
  for r in $RUNS; do runs+=("${r/:/ }"); done
fi
for run in "${runs[@]}"; do
  set -- $run
  left 60 || { add "$1 $2: no time left"; continue; }
  log=$out/bench-${1//\//-}-$2.log
  timeout $((LIMIT - SECONDS)) "$C/$1" bench -m "$big" --expert-profile "$W/qwen3-30b-a3b-q8_0.profile" --prompt 0 \
    --decode "${DECODE:-64}" --depth "${DEPTHS:-0,4096,32768}" -c 32896 -r "$R" --no-learn --cache-type-k "$2" --cache-type-v "$2" > "$log" 2>&1
  add "qwen3-30b-a3b Q8_0, every expert cached, $1, $2 KV: $(sed -n 's/^decode at depth \([0-9]*\), .* (tok\/s): /\1: /p' "$log" | tr '\n' ';')"
  grep -iE "between steps" "$log" | head -n 2
  grep -iE "error|refus" "$log" | head -n 3
done
fi

if step 3 && left 40; then
  timeout $((LIMIT - SECONDS - 30)) "$C/tests/test_cuda_kernels" > "$out/cuda_kernels.log" 2>&1
  add "test_cuda_kernels: exit $?, $(grep -c '^PASS' "$out/cuda_kernels.log") PASS, $(grep -c '^FAIL' "$out/cuda_kernels.log") FAIL"
  grep -E "^FAIL" "$out/cuda_kernels.log" | head -n 8
fi
step 4 && left 60 && NCU=0 timeout $((LIMIT - SECONDS)) bash "$(dirname "$0")/gpu-attn-variants.sh" 2>&1 | grep -A40 "== decode attention"

echo
echo "== issue #20's depth row =="
for r in "${rows[@]}"; do echo "$r"; done
