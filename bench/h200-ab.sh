#!/usr/bin/env bash
# One call on nvidia-h200: the same strata rows (ROWS, default "deep"; R repetitions, default 3)
# with each strata binary in carry/ab/*.xz (stripped, xz'd builds of variants of the engine), one
# after another in one job on one model, so that an engine change is judged by the figure a user
# sees rather than by a kernel bench. Carry carry/lib, carry/strata, carry/tokenizer.json.xz and
# carry/ab; makes the qwen3-30b-a3b Q8_0 model (bench/vs-llama.sh model). Builds nothing.
set -u
cd "$(dirname "$0")/.."
export W=/tmp/vs-llama
bench/vs-llama.sh model || exit 1
for x in carry/ab/*.xz; do
  v=$(basename "$x" .xz)
  xz -dc "$x" > "$W/strata-$v" && chmod +x "$W/strata-$v"
  echo "#### variant $v"
  STRATA=$W/strata-$v QUICK=1 R=${R:-3} RDEEP=${R:-3} ROWS=${ROWS:-deep} bench/vs-llama.sh strata 2>&1 | grep -v "filling the CUDA0"
done
