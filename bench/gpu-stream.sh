#!/usr/bin/env bash
# The prompt path's streamed experts (issue #22) on the GPU host, strata alone: in the 24 GB class
# (--gpu-mem, the profile's most routed pairs cached), prompt tok/s and host->device MiB, then 16 decode tokens (whether the dense weights stayed) with
# --prompt-stream off (the CPU pool computes every uncached expert) against row thresholds, at
# 512- and 4096-token chunks; then the greedy continuation of a long prompt twice with streaming
# (the same bits) and once with it off (other bits allowed: other kernels).
# Run there from the repository root with carry/ unpacked (scripts/gather-libs). Environment: W
# work folder with the model (default /tmp/vs-llama: bench/vs-llama.sh model makes it), GPU_MEM
# (21.25 GiB), MODES (the --prompt-stream values, default "off 4 16 64"), PREFILLS ("512 4096"),
# PROMPT (4096 tokens), R repetitions (2), DET=0 skips the greedy runs. The rows are appended to
# $OUT/stream-table.txt (or $W's).
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
C=$root/carry
W=${W:-/tmp/vs-llama}
GPU_MEM=${GPU_MEM:-21.25}
MODES=${MODES:-off 4 16 64}
PREFILLS=${PREFILLS:-512 4096}
PROMPT=${PROMPT:-4096}
R=${R:-2}
export LD_LIBRARY_PATH=$C/lib STARPU_SILENT=1 STARPU_HOME=$W/starpu-home
S=${STRATA:-$C/strata}
model=$W/q30b-q8_0.gguf profile=$W/q30b.profile
common=(-m "$model" --expert-profile "$profile" --expert-cache auto --gpu-mem "$GPU_MEM" --no-learn)
out=${OUT:-$W}
table=$out/stream-table.txt
touch "$table"

if [ "${DET:-1}" = 1 ]; then
echo "== determinism: greedy 24 tokens after a 1,500-token prompt, 24 GB class"
text=$(yes 'Mixture of experts models route each token to a few experts, and the rest stay idle.' | head -n 90 | tr '\n' ' ')
for run in stream1 stream2 off; do
  ps=auto
  [ $run = off ] && ps=off
  timeout 300 "$S" generate "${common[@]}" --prompt-stream $ps -p "$text" -n 24 --temp 0 > "$W/gen-$run.txt" 2> "$W/gen-$run.err"
  echo "$run (exit $?): md5 $(md5sum < "$W/gen-$run.txt" | cut -c1-12)  $(grep -E '^prompt:' "$W/gen-$run.err")  $(grep -o 'host->device [0-9.]* MiB' "$W/gen-$run.err")"
done
cmp -s "$W/gen-stream1.txt" "$W/gen-stream2.txt" && echo "streamed runs: same text" || echo "streamed runs: DIFFERENT"
head -c 300 "$W/gen-stream1.txt"; echo; head -c 300 "$W/gen-off.txt"; echo
fi

for pf in $PREFILLS; do
  for ps in $MODES; do
    echo "== bench --prefill $pf --prompt-stream $ps"
    timeout 400 "$S" bench "${common[@]}" --prefill "$pf" --prompt-stream "$ps" \
      --prompt "$PROMPT" --decode 16 -r "$R" > "$W/b-$pf-$ps.txt" 2> "$W/b-$pf-$ps.err"
    echo "exit $?"
    grep -hE "^(test|prompt|decode) |streamed|runs \(tok/s\)|peak GPU|expert-cache auto" "$W/b-$pf-$ps.txt" "$W/b-$pf-$ps.err" | head -n 8
    echo "prefill $pf, stream $ps:" >> "$table"
    grep -E "^(prompt|decode) " "$W/b-$pf-$ps.txt" >> "$table"
  done
done
echo "== table"
cat "$table"
