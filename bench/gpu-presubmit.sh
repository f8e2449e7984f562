#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs (builds nothing): STRATA_PRESUBMIT (graph/token.c) judged in
# one call. For each 8-layer cut of MODELS (every expert cached):
#   1. the greedy continuation (GEN tokens of "The history of") with STRATA_PRESUBMIT=0 and =1, by
#      md5 (the same bits either way);
#   2. bench/gpu-step-gap.sh's per-step timers with each, off / on / off / on (R repetitions each);
# then, with STRATA_PRESUBMIT=1, the decode step against the per-task path on the small Q4_K_M
# fixture (scripts/gpu-step.sh step 2, when carry/fixtures/models has it). A table last.
# Environment: MODELS (bench/gpu-step-gap.sh's; default the gpt-oss-20b and qwen3-30b-a3b cuts),
# GEN (160), R (3), W (/tmp/gpu-step).
set -u
cd "$(dirname "$0")/.."
. scripts/gpu-lib.sh
MODELS=${MODELS:-"oss8:--preset gpt-oss-20b --layers 8 --type q8_0;m8:--preset qwen3-30b-a3b --layers 8 --type q8_0"}
rows=()
IFS=';' read -ra models <<< "$MODELS"
for me in "${models[@]}"; do
  name=${me%%:*}
  # shellcheck disable=SC2086
  m=$(gpu_model "$name" ${me#*:})
  sums=()
  for p in 0 1; do
    sums+=("$(STRATA_PRESUBMIT=$p timeout 120 "$S" generate -m "$m" -p "The history of" -n "${GEN:-160}" --temp 0 --no-learn \
      --expert-profile "$W/$name.profile" --expert-cache auto 2> "$out/gen-$name-$p.err" | md5sum | cut -c1-12)")
  done
  [ "${sums[0]}" = "${sums[1]}" ] && same=equal || same=DIFFER
  rows+=("$name: greedy ${GEN:-160} tokens, presubmit off ${sums[0]} / on ${sums[1]}: $same")
done
gap=$(MODELS="$MODELS" ENVS="off:STRATA_PRESUBMIT=0;on:STRATA_PRESUBMIT=1;off2:STRATA_PRESUBMIT=0;on2:STRATA_PRESUBMIT=1" \
  bench/gpu-step-gap.sh 2>&1 | tail -n "$((4 * ${#models[@]} + 2))")
if [ -f "$C/fixtures/models/small-qwen3moe-q4_k_m.gguf" ]; then
  while IFS= read -r l; do rows+=("${l#ROW }"); done < <(STRATA_PRESUBMIT=1 STEPS=2 FIXTURES=small-qwen3moe-q4_k_m \
    CACHES="0 all" scripts/gpu-step.sh 2>&1 | grep '^ROW .*decode step')
fi
echo "===== STRATA_PRESUBMIT"
printf '%s\n' "$gap"
printf '%s\n' "${rows[@]}"
