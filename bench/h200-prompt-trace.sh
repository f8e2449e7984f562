#!/usr/bin/env bash
# One call on nvidia-h200 (issue #22): where a prompt's time goes with every expert on the GPU.
# For each chunk in PREFILLS (default 512 4096): `strata bench --prompt PROMPT (default 4096)
# --decode 0 -r 2 --trace` on the qwen3-30b-a3b Q8_0 model (bench/vs-llama.sh model), then
# `strata trace` of it (ENVS=STARPU_NCUDA=0 PROMPT=128 PREFILLS=512 CACHE_ARGS=: the CPU pool's prompt);
# the summaries (time per task kind, busy % per worker) go to $OUT/summary-P.txt and their top
# lines are printed. Extra strata flags in ARGS, environment in ENVS. After scripts/gather-libs;
# carry carry/. Builds nothing.
set -u
cd "$(dirname "$0")/.."
C=$PWD/carry W=/tmp/vs-llama
mkdir -p "$W"
export LD_LIBRARY_PATH=$C/lib STARPU_SILENT=1 STARPU_HOME=$W/starpu-home
bench/vs-llama.sh model > /dev/null 2>&1 || { echo "no model"; exit 1; }
for P in ${PREFILLS:-512 4096}; do
  rm -rf "$W/trace-$P"
  echo "== prompt ${PROMPT:-4096}, --prefill $P ${ENVS:-} ${ARGS:-}"
  env ${ENVS:-} timeout 200 "$C/strata" bench -m "$W/q30b-q8_0.gguf" -r 2 --prompt "${PROMPT:-4096}" --decode 0 --prefill "$P" \
    ${CACHE_ARGS---expert-profile "$W/q30b.profile" --expert-cache auto} --trace "$W/trace-$P" ${ARGS:-} 2> "$W/bench-$P.err" | tail -n 3
  grep -iE "error|refus" "$W/bench-$P.err" | head -n 3
  timeout 120 "$C/strata" trace "$W/trace-$P" --no-paje -q -o "$W/trace-$P/out" > /dev/null 2>&1
  cp "$W/trace-$P/out/summary.txt" "${OUT:-/tmp}/summary-$P.txt" 2>/dev/null
  head -n 60 "$W/trace-$P/out/summary.txt"
done
