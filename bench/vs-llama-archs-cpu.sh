#!/usr/bin/env bash
# strata against llama.cpp on the CPU alone, for the architectures strata computes on CPU workers
# (issue #24): cuts of the gpt-oss-20b (MXFP4 experts, q8_0 elsewhere), deepseek2-lite (with a q LoRA,
# which llama.cpp needs below 27 layers) and glm4.5-air presets of `strata mkmodel`, then
# llama-bench's pp / tg rows and `strata bench`'s prompt / decode rows on the same files, the same
# thread count, in one run; the ratios in a table last.
# Usage: bench/vs-llama-archs-cpu.sh   (in the repository root, after the build)
# Environment: LLAMA_BENCH (a llama-bench binary; default /tmp/llama-native/bin/llama-bench, with its
# libraries beside it), W (work folder for the models, default /tmp/vs-llama-archs), T (threads,
# default: online CPUs), R (repetitions, 2), P (prompt tokens, 128), N (decode tokens, 32),
# LAYERS (layers of each cut: "gpt-oss-20b:4 deepseek2-lite:4 glm4.5-air:3").
set -u
cd "$(dirname "$0")/.."
LB=${LLAMA_BENCH:-/tmp/llama-native/bin/llama-bench}
W=${W:-/tmp/vs-llama-archs}
T=${T:-$(nproc)}
R=${R:-2}
P=${P:-128}
N=${N:-32}
LAYERS=${LAYERS:-gpt-oss-20b:4 deepseek2-lite:4 glm4.5-air:3}
[ -x "$LB" ] || { echo "no llama-bench at $LB (set LLAMA_BENCH)" >&2; exit 1; }
export LD_LIBRARY_PATH="$(dirname "$LB")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$W"
rows=()
for spec in $LAYERS; do
  preset=${spec%%:*} layers=${spec##*:}
  m=$W/$preset-$layers.gguf
  extra=()
  [ "$preset" = deepseek2-lite ] && extra=(--q-lora 1536)
  [ -s "$m" ] || ./strata mkmodel -q --preset "$preset" --layers "$layers" "${extra[@]}" -o "$m" || exit 1
  lj=$("$LB" -m "$m" -p "$P" -n "$N" -r "$R" -t "$T" -o json 2>/dev/null)
  sj=$(STARPU_NCUDA=0 STARPU_SILENT=1 ./strata bench -m "$m" -r "$R" --prompt "$P" --decode "$N" --no-learn --json 2>/dev/null)
  row=$(python3 - "$lj" "$sj" "$preset" "$layers" "$P" "$N" <<'PY'
import json, sys
lj, sj = json.loads(sys.argv[1]), json.loads(sys.argv[2])
P, N = int(sys.argv[5]), int(sys.argv[6])
lp = next(r["avg_ts"] for r in lj if r["n_prompt"] == P and r["n_gen"] == 0)
lg = next(r["avg_ts"] for r in lj if r["n_gen"] == N and r["n_prompt"] == 0)
rows = sj["results"]
sp = next(r["tok_s"] for r in rows if r["test"] == "prompt")
sg = next(r["tok_s"] for r in rows if r["test"] == "decode")
print("| %s, %s layers | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |" % (sys.argv[3], sys.argv[4], lp, sp, sp / lp, lg, sg, sg / lg))
PY
) || { echo "$preset: a bench failed" >&2; continue; }
  echo "$row"
  rows+=("$row")
done
echo
echo "CPU only, $T threads; llama.cpp $(basename "$LB") vs strata bench, medians/averages of $R runs"
echo "| model | llama.cpp pp$P tok/s | strata | ratio | llama.cpp tg$N tok/s | strata | ratio |"
echo "|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
