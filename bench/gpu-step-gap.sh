#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs (builds nothing): a decode step's GPU span against the
# GPU's idle time between steps and the host's share of it (strata bench's per-step timers), with
# every expert cached, for each model of MODELS and each environment of ENVS, one table last.
# Each row is also printed as it comes, as a line starting with ROW (a call stopped at its limit
# still reports the runs it finished).
# With STRATA_PRESUBMIT=1 (the default) a step's first kernel waits on the GPU for the host's
# token, so the GPU span includes that wait: compare kernels' spans with STRATA_PRESUBMIT=0.
#   MODELS  "NAME:MKMODEL-ARGS;..." (default: the qwen3-30b-a3b shape cut to 8 layers, Q8_0)
#   ENVS    "LABEL:VAR=VALUE,...;..." environments to compare on every model (default: "default:")
#   DECODE  decode tokens a run (default 128); R repetitions (default 3, the median's row)
#   BINS    "LABEL|BINARY ..." builds to compare (default: the carried strata); each env row then
#           runs once per build, builds innermost, in the order given (repeat one to see the drift)
#   GREEDY  N: also each build's greedy continuation of N tokens (md5 of its text) per model
#   TIMEOUT seconds a bench run may take before it is stopped (default 300; the greedy run 120)
#   ARGS    more strata bench arguments for every run (e.g. "--depth 32768 -c 32832 -ctk q8_0 -ctv q8_0":
#           the decode row at that depth; the table shows the first decode row)
set -u
. "$(dirname "$0")/../scripts/gpu-lib.sh"
MODELS=${MODELS:-"m8:--preset qwen3-30b-a3b --layers 8 --type q8_0"}
ENVS=${ENVS:-"default:"}
rows=()
IFS=';' read -ra models <<< "$MODELS"
IFS=';' read -ra envs <<< "$ENVS"
for me in "${models[@]}"; do
  name=${me%%:*}
  # shellcheck disable=SC2086
  model=$(gpu_model "$name" ${me#*:})
  for ev in "${envs[@]}"; do
    for bl in ${BINS:-"-|$S"}; do
      bname=${bl%%|*} bin=${bl#*|}
      [ "${bin#/}" = "$bin" ] && bin=$PWD/$bin
      label=${ev%%:*}
      [ "$bname" = - ] || label=$bname${label:+-$label}
      vars=${ev#*:}
      t0=$SECONDS
      if [ -n "${GREEDY:-}" ]; then
        env ${vars//,/ } timeout 120 "$bin" generate -m "$model" -p "The history of the sky" -n "$GREEDY" --temp 0 --ignore-eos \
          --expert-profile "$W/$name.profile" --expert-cache auto > "$out/greedy-$name-$label.txt" 2> /dev/null
        echo "greedy $name $label: exit $? md5 $(md5sum < "$out/greedy-$name-$label.txt" | cut -c1-12)"
      fi
      # shellcheck disable=SC2086
      env ${vars//,/ } timeout "${TIMEOUT:-300}" "$bin" bench -m "$model" --json -r "${R:-3}" --prompt 0 --decode "${DECODE:-128}" \
        --expert-profile "$W/$name.profile" --expert-cache auto ${ARGS:-} > "$out/gap-$name-$label.json" 2> "$out/gap-$name-$label.err"
      st=$?
      rows+=("$(python3 - "$out/gap-$name-$label.json" "$name" "$label" "$st" "$((SECONDS - t0))" <<'EOF'
import json, sys
f, name, label, st, secs = sys.argv[1:]
try:
    r = [x for x in json.load(open(f))["results"] if x["test"] == "decode"][0]
except Exception as ex:
    print("%-10s %-10s exit %s: no result (%s)" % (name, label, st, ex)); sys.exit()
us = 1e6 / r["tok_s"]
print("%-10s %-10s %9.2f %9.1f %9.1f %9.1f %9.1f %9.1f %7.1f   %ss" % (name, label, r["tok_s"], us, r["gpu_span_us_per_step"],
      r["gpu_gap_us_per_step"], r["host_tail_us_per_step"], r["host_between_us_per_step"], r["tasks_per_token"], secs))
EOF
)")
      echo "ROW ${rows[-1]}" # as it comes, in case the call's limit stops the run before the table
    done
  done
done
echo "===== decode, every expert cached (us a step)"
printf '%-10s %-10s %9s %9s %9s %9s %9s %9s %7s\n' model env "tok/s" "us/tok" "GPU span" "GPU idle" "host tail" "host betw" tasks
printf '%s\n' "${rows[@]}"
