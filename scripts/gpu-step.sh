#!/usr/bin/env bash
# On a GPU host from the repository root, after scripts/gather-libs (builds nothing): one call that
# checks and times the decode step's GPU kernels (issue #20).
#  1. tests/test_cuda_kernels: the mat-vec kernels of every format against the CPU, bitwise batch
#     and expert properties, attention;
#  2. the decode step against the per-task path, bitwise over 300 one-token steps, on the fixtures
#     (cache off and full, eager), and the fixture comparisons on CUDA0 (test_forward_ref);
#  3. speed on the qwen3-30b-a3b preset (Q8_0, 48 layers; ROWS: gpu = every expert cached, 24gb =
#     --gpu-mem GPU_MEM, cpu = STARPU_NCUDA=0): strata bench, decode step and (gpu) per-task path.
# gpu also runs the decode step with STRATA_PDL=1 (PDL=1, the default) and (PERTASK=1, the default) the per-task path.
# Environment: STEPS (which of 1 2 3, default all), FIXTURES and CACHES (step 2's fixture models and
# cache settings, default all three and "0 half all"), KVS (step 2's KV cache types, default "f32";
# "f32 f16" runs each comparison with both), ROWS (default "gpu 24gb cpu"), GPU_MEM (21.55),
# W work folder (/tmp/gpu-step), DECODE tokens per bench run (64), R repetitions (3).
# Prints a table last.
set -u
. "$(dirname "$0")/gpu-lib.sh"
STEPS=${STEPS:-1 2 3}
ROWS=${ROWS:-gpu 24gb cpu}
R=${R:-3}
DECODE=${DECODE:-64}
rows=()
add() { rows+=("$1"); echo "ROW $1"; }
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }

if has 1; then
  t0=$SECONDS
  timeout 300 "$C/tests/test_cuda_kernels" > "$out/cuda_kernels.log" 2>&1
  rc=$?
  add "test_cuda_kernels: exit $rc, $(grep -c '^PASS' "$out/cuda_kernels.log") PASS, $(grep -c '^FAIL' "$out/cuda_kernels.log") FAIL ($((SECONDS - t0)) s)"
  grep -E "^FAIL" "$out/cuda_kernels.log" | head -n 12
  grep -iE "GB/s|ms per" "$out/cuda_kernels.log" | head -n 12
fi

if has 2; then
  M=$C/fixtures/models
  printf 'The quick brown fox jumps over the lazy dog.\nMixture-of-experts models route every token.\n' > "$W/calib.txt"
  ids=$(seq -s, 100 399)
  for mf in ${FIXTURES:-tiny-qwen3moe-q8_0 tiny-qwen3moe-bf16 small-qwen3moe-q4_k_m}; do
    "$S" profile -m "$M/$mf.gguf" -f "$W/calib.txt" -o "$W/$mf.profile" 2>/dev/null
    for kv in ${KVS:-f32}; do
    for cache in ${CACHES:-0 half all}; do
      args=(--expert-cache 0)
      [ "$cache" != 0 ] && args=(--expert-profile "$W/$mf.profile" --expert-cache "$([ $cache = all ] && echo auto || echo 8)")
      args+=(--cache-type-k "$kv" --cache-type-v "$kv")
      for g in 1 0; do
        STRATA_DECODE_GRAPH=$g STARPU_SCHED=eager timeout 120 "$S" eval -m "$M/$mf.gguf" -c 512 --prompt-ids "$ids" \
          --prefill 1 --all-logits --logits-out "$W/l-$g.f32" "${args[@]}" 2>"$W/err-$g"
      done
      [ -s "$W/l-1.f32" ] && cmp -s "$W/l-1.f32" "$W/l-0.f32" && r=PASS || r="FAIL ($(tail -n 2 "$W/err-1" | tr '\n' ' '))"
      add "$mf, cache $cache, $kv KV: decode step vs per-task path, 300 steps, logits bitwise: $r"
    done
    done
  done
  STRATA_FIXTURES=$PWD/$C/fixtures timeout 300 "$C/tests/test_forward_ref" > "$out/forward_ref.log" 2>&1
  add "fixture comparisons on CUDA0 (test_forward_ref): $(tail -n 1 "$out/forward_ref.log")"
  grep -E "^FAIL" "$out/forward_ref.log" | head -n 10
fi

if has 3; then
  m=$(gpu_model q30b --preset qwen3-30b-a3b --type q8_0)
  cache=(--expert-profile "$W/q30b.profile" --expert-cache auto)
  bench() { # name, env..., -- args
    local name=$1; shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    local t0=$SECONDS
    env "${envs[@]}" timeout "${TMO:-300}" "$S" bench -m "$m" --prompt 0 --decode "$DECODE" -r "$R" --json "$@" > "$out/bench-$name.json" 2> "$out/bench-$name.err"
    local rc=$?
    local ts tpt busy peak
    ts=$(grep -o '"tok_s": [0-9.]*' "$out/bench-$name.json" | head -n 1 | awk '{print $2}')
    tpt=$(grep -o '"tasks_per_token": [0-9.]*' "$out/bench-$name.json" | head -n 1 | awk '{print $2}')
    busy=$(grep -o '"gpu_busy_share": [0-9.]*' "$out/bench-$name.json" | head -n 1 | awk '{print $2}')
    peak=$(grep -o '"peak_gpu_mib": \[[0-9., ]*\]' "$out/bench-$name.json" | head -n 1)
    local host
    host=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
n = r["tokens"]
print("per token: %.0f us, in the step %.0f (submitting %.0f, waiting %.0f), outside %.0f" % (
    1e6 * r["seconds"] / n, 1e6 * r["step_s"] / n, 1e6 * r["submit_s"] / n, 1e6 * r["wait_end_s"] / n,
    1e6 * (r["seconds"] - r["step_s"]) / n))' "$out/bench-$name.json" 2>/dev/null)
    add "bench $name: exit $rc, decode ${ts:-?} tok/s, tasks/token ${tpt:-?}, GPU busy ${busy:-?}, ${peak:-?} ($((SECONDS - t0)) s); $host"
    [ $rc = 0 ] || tail -n 5 "$out/bench-$name.err"
  }
  for row in $ROWS; do
    case $row in
      gpu)
        bench gpu-step STRATA_DECODE_GRAPH=1 -- "${cache[@]}"
        [ "${PDL:-1}" = 1 ] && bench gpu-step-pdl STRATA_DECODE_GRAPH=1 STRATA_PDL=1 -- "${cache[@]}"
        [ "${PERTASK:-1}" = 1 ] && bench gpu-pertask STRATA_DECODE_GRAPH=0 -- "${cache[@]}" ;;
      24gb) TMO=200 bench 24gb STRATA_DECODE_GRAPH=1 -- "${cache[@]}" --gpu-mem "${GPU_MEM:-21.55}" ;;
      cpu) bench cpu STARPU_NCUDA=0 -- ;;
    esac
  done
fi
echo "== gpu-step"
for r in "${rows[@]}"; do echo "$r"; done
