#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs: where a decode step's time goes on an 8-layer model of
# the qwen3-30b-a3b shape (Q8_0) with every expert cached: strata bench (graph counters, host time
# in the decode codelets, tasks per token, GPU busy share) for the decode step and the per-task
# path, a recorded trace's summary of one decode step, the CUDA mat-vec kernels' GB/s, and, with
# NCU=1, Nsight Compute's per-kernel durations of a few steps. Builds nothing.
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
W=${W:-/tmp/diag}
mkdir -p "$W"
m=$W/m8.gguf
LAYERS=${LAYERS:-8}
[ -f "$m" ] || STRATA_TOKENIZER_JSON=$C/tokenizer.json "$S" mkmodel -q -o "$m" --preset qwen3-30b-a3b --layers "$LAYERS" --type q8_0
yes 'The history of mixture of experts models and their routing.' | head -n 40 | tr '\n' ' ' > "$W/calib.txt"
[ -f "$W/m8.profile" ] || "$S" profile -m "$m" -f "$W/calib.txt" -o "$W/m8.profile" 2>&1 | tail -n 1
cache=(--expert-profile "$W/m8.profile" --expert-cache auto)
for g in 1 0; do
  echo "== bench, STRATA_DECODE_GRAPH=$g ${EXTRA:-}"
  STRATA_DECODE_GRAPH=$g timeout 200 "$S" bench -m "$m" --prompt 0 --decode 128 -r 3 "${cache[@]}" ${EXTRA:-} 2>"$W/bench-$g.err" | tail -n 6
  grep -iE "graph|fail|error" "$W/bench-$g.err" | head -n 5
done
STRATA_DECODE_GRAPH=1 timeout 200 "$S" bench -m "$m" --prompt 0 --decode 64 --json "${cache[@]}" ${EXTRA:-} 2>/dev/null \
  | grep -o '"graph_[a-z]*": [0-9]*\|"dense_[a-z_]*": [0-9.]*\|"tasks_per_token": [0-9.]*\|"gpu_busy_share": [0-9.]*' | tr '\n' ' '; echo
rm -rf "$W/tr"
timeout 200 "$S" generate -m "$m" -p "Explain the sky." -n 16 --temp 0 --ignore-eos "${cache[@]}" --trace "$W/tr" ${EXTRA:-} > /dev/null 2>"$W/gen.err"
timeout 120 "$S" trace "$W/tr" --no-paje --step decode:10 -o "$W/tr-out" 2>&1 | head -n 70
timeout 120 "$S" bench --kernels --formats q8_0,q4_K,q6_K,iq4_xs 2>&1 | tail -n 12
if [ "${NCU:-0}" = 1 ] && command -v ncu > /dev/null; then
  timeout 200 ncu --clock-control none --graph-profiling node --launch-skip 300 --launch-count 120 --print-summary per-kernel \
    "$S" generate -m "$m" -p "Hi" -n 12 --temp 0 --ignore-eos "${cache[@]}" 2>&1 | grep -E "^  [a-z_]|Duration|Memory Throughput|Invocations" | head -n 80
fi
