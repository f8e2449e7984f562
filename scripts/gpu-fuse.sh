#!/usr/bin/env bash
# On nvidia-h200 from the repository root after scripts/gather-libs (builds nothing): the decode
# step's six-kernel layer (STRATA_DECODE_FUSE=1, the default) checked and timed against the
# eight-kernel one (STRATA_DECODE_FUSE=0) in one call (issue #20):
#  1. tests/test_cuda_kernels (the attention doing its own RoPE and KV append, bitwise, among them);
#  2. the decode step against the per-task path, logits bitwise over 300 steps, on the fixtures
#     (scripts/gpu-step.sh STEPS=2; CACHES "0 all", KVS "f16 f32"), and test_forward_ref on CUDA0;
#  3. strata bench, every expert of the qwen3-30b-a3b Q8_0 preset cached (bench/vs-llama.sh model:
#     made once in /tmp/vs-llama, kept for a following call on the same machine), decode 128 tokens
#     at depth 0, -r 3: STRATA_DECODE_FUSE 1 and 0 alternately (ROUNDS, default 2), then 1 with
#     STRATA_PDL=1;
#  4. bench/mmv-bench (a layer's mat-vec kernels, both layers, PDL on and off, one graph or a graph a
#     layer) and bench/attn-bench (MODE=1: no PDL, as the engine; ROPE=1 against ROPE=2).
# Environment: ROUNDS, STEPS (which of 1 2 3 4, default all). Prints a table last.
set -u
cd "$(dirname "$0")/.."
# binaries carried xz'd (to keep carry/ under a call's 64 MiB): unpacked in place
for f in carry/*.xz carry/tests/*.xz; do
  case $f in *tokenizer.json.xz) continue ;; esac
  [ -e "${f%.xz}" ] || { xz -dk "$f" && chmod +x "${f%.xz}"; }
done
. scripts/gpu-lib.sh
STEPS=${STEPS:-1 2 3 4}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
rows=()
add() { rows+=("$1"); echo "ROW $1"; }
t00=$SECONDS
export W
if has 3; then # the model in the background while the checks run
  (W=/tmp/vs-llama bench/vs-llama.sh model > "$out/model.log" 2>&1) &
  model_pid=$!
fi
if has 1 || has 2; then
  st=""
  has 1 && st="1"
  has 2 && st="$st 2"
  STEPS="$st" CACHES=${CACHES:-0 all} KVS=${KVS:-f16 f32} timeout 330 scripts/gpu-step.sh > "$out/checks.log" 2>&1
  while IFS= read -r l; do add "${l#ROW }"; done < <(grep '^ROW' "$out/checks.log")
  grep -E '^FAIL' "$out/cuda_kernels.log" 2> /dev/null | head -n 8
  grep -E 'decode attention with its own RoPE' "$out/cuda_kernels.log" 2> /dev/null | head -n 3
fi
echo "checks done at $((SECONDS - t00)) s"
if has 3; then
  wait "$model_pid"
  cat "$out/model.log"
  m=/tmp/vs-llama/q30b-q8_0.gguf
  p=/tmp/vs-llama/q30b.profile
  one() { # name, env...
    local name=$1; shift
    local t0=$SECONDS
    env "$@" timeout 200 "$S" bench -m "$m" --json -r 3 --prompt 0 --decode 128 --expert-profile "$p" --expert-cache auto \
      > "$out/bench-$name.json" 2> "$out/bench-$name.err"
    local rc=$?
    local ts tpt busy
    ts=$(grep -o '"tok_s": [0-9.]*' "$out/bench-$name.json" | head -n 1 | awk '{print $2}')
    tpt=$(grep -o '"tasks_per_token": [0-9.]*' "$out/bench-$name.json" | head -n 1 | awk '{print $2}')
    busy=$(grep -o '"gpu_busy_share": [0-9.]*' "$out/bench-$name.json" | head -n 1 | awk '{print $2}')
    add "bench $name ($*): exit $rc, decode ${ts:-?} tok/s, tasks/token ${tpt:-?}, GPU busy ${busy:-?} ($((SECONDS - t0)) s)"
    [ $rc = 0 ] || tail -n 4 "$out/bench-$name.err"
  }
  for r in $(seq 1 "${ROUNDS:-2}"); do
    one "fuse1-$r" STRATA_DECODE_FUSE=1
    one "fuse0-$r" STRATA_DECODE_FUSE=0
  done
  one fuse1-pdl STRATA_DECODE_FUSE=1 STRATA_PDL=1
fi
echo "benches done at $((SECONDS - t00)) s"
if has 4; then
  [ -x "$C/mmv-bench" ] && timeout 90 "$C/mmv-bench" 20 > "$out/mmv-bench.txt" 2>&1
  tail -n 9 "$out/mmv-bench.txt"
  if [ -x "$C/attn-bench" ]; then
    for rp in 1 2; do
      MODE=1 ROPE=$rp KV=f16 timeout 60 "$C/attn-bench" 20 > "$out/attn-rope$rp.txt" 2>&1
    done
    paste <(awk 'NF == 5 && $1 ~ /^[0-9]+$/ {print $1, $3}' "$out/attn-rope1.txt") \
      <(awk 'NF == 5 && $1 ~ /^[0-9]+$/ {print $3}' "$out/attn-rope2.txt") |
      while read -r keys a b; do add "attn-bench f16 KV, $keys keys: rope_append + attention $a us, attention with RoPE $b us"; done
  fi
fi
echo "== gpu-fuse ($((SECONDS - t00)) s)"
for r in "${rows[@]}"; do echo "$r"; done
