#!/usr/bin/env bash
# On nvidia-h200 from the repository root after scripts/gather-libs (builds nothing): a change to the
# decode step checked and timed against the build before it in one call (issue #20). Carry carry/
# with the new build (carry/strata) and the old one as carry/ab/strata-base (either may be xz'd:
# binaries are unpacked in place, to keep carry/ under a call's 64 MiB).
#  1. tests/test_cuda_kernels; the decode step against the per-task path, logits bitwise over 300
#     steps, on the fixtures (scripts/gpu-step.sh STEPS="1 2"; CACHES "0 all", KVS "f16 f32"), and
#     test_forward_ref on CUDA0;
#  2. strata bench on the qwen3-30b-a3b Q8_0 preset (bench/vs-llama.sh model: made in /tmp/vs-llama,
#     kept for a following call on the same machine): every expert cached, decode 128 tokens at depth
#     0, -r 3, the two builds alternately (ROUNDS, default 2); then the 24 GB class (--gpu-mem
#     GPU_MEM, default 21.25) decode 64 at depths 0 and 4096 once each.
# Environment: ROUNDS, GPU_MEM, STEPS (1 2: which parts), VARIANTS ("NAME|BINARY ...": more builds
# timed in every round after the two, e.g. scripts/build-decode-variants' carry/strata-NAME; carried xz'd
# or plain), AB24 (0: without the 24 GB class rows). Prints a table last.
set -u
cd "$(dirname "$0")/.."
scripts/carry-unpack # each call brings carry/ packed
. scripts/gpu-lib.sh
STEPS=${STEPS:-1 2}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
rows=()
add() { rows+=("$1"); echo "ROW $1"; }
t00=$SECONDS
if has 2; then # the model in the background while the checks run
  (W=/tmp/vs-llama bench/vs-llama.sh model > "$out/model.log" 2>&1) &
  model_pid=$!
fi
if has 1; then
  STEPS="1 2" CACHES=${CACHES:-0 all} KVS=${KVS:-f16 f32} timeout 330 scripts/gpu-step.sh > "$out/checks.log" 2>&1
  while IFS= read -r l; do add "${l#ROW }"; done < <(grep '^ROW' "$out/checks.log")
  grep -E '^FAIL' "$out/cuda_kernels.log" 2> /dev/null | head -n 8
fi
echo "checks done at $((SECONDS - t00)) s"
if has 2; then
  wait "$model_pid"
  cat "$out/model.log"
  m=/tmp/vs-llama/q30b-q8_0.gguf
  p=/tmp/vs-llama/q30b.profile
  one() { # name, binary, bench arguments...
    local name=$1 bin=$2; shift 2
    local t0=$SECONDS
    timeout 200 "$bin" bench -m "$m" --json -r 3 --prompt 0 --expert-profile "$p" --expert-cache auto "$@" \
      > "$out/bench-$name.json" 2> "$out/bench-$name.err"
    local rc=$?
    local ts
    ts=$(grep -o '"tok_s": [0-9.]*' "$out/bench-$name.json" | awk '{print $2}' | tr '\n' ' ')
    add "bench $name ($*): exit $rc, decode ${ts:-?}tok/s ($((SECONDS - t0)) s)"
    [ $rc = 0 ] || tail -n 4 "$out/bench-$name.err"
  }
  for r in $(seq 1 "${ROUNDS:-2}"); do
    one "new-$r" "$S" --decode 128
    one "base-$r" "$C/ab/strata-base" --decode 128
    for v in ${VARIANTS:-}; do one "${v%%|*}-$r" "${v#*|}" --decode 128; done
  done
  if [ "${AB24:-1}" = 1 ]; then
    one new-24gb "$S" --decode 64 --depth 0,4096 --gpu-mem "${GPU_MEM:-21.25}"
    one base-24gb "$C/ab/strata-base" --decode 64 --depth 0,4096 --gpu-mem "${GPU_MEM:-21.25}"
  fi
fi
echo "== gpu-ab ($((SECONDS - t00)) s)"
for r in "${rows[@]}"; do echo "$r"; done
