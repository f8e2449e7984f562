#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs (builds nothing): the decode attention's ring (attention.cu,
# ATT_RING_BYTES) against its loads straight from the cache, in one call, each step only while the
# call's time (LIMIT seconds, default 540) lasts:
#  1. bench/attn-bench for every carried variant (scripts/gpu-attn-variants.sh, NCU=0), f16 and q8_0
#     caches: us a launch by depth, and at CHECK_KEYS depths the float64 comparison and the output's
#     bits (variants that keep every operation print the same bits);
#  2. tests/test_cuda_kernels: PASS and FAIL counts, and its FAIL lines;
#  3. bench/gpu-step-gap.sh on the qwen3-30b-a3b shape cut to 8 layers (every expert cached) at
#     depth DEPTH (32768) for the builds of BINS (default: strata, and strata-noring, strata-early
#     when carried, each twice), with the f16 and the q8_0 cache.
# Build here first: scripts/build-attn-variants noring=-DATT_RING_BYTES=0 ...; SRC=attention
# scripts/build-decode-variants noring=-DATT_RING_BYTES=0 ...; scripts/gather-libs carry.
# Environment: STEPS ("1 2 3"), LIMIT, SHARE (step 1 takes at most LIMIT / SHARE seconds; 3),
# VARIANTS (step 1's attn-bench builds), DEPTH, BINS, R (2). Prints the tables last.
set -u
. "$(dirname "$0")/gpu-lib.sh"
LIMIT=${LIMIT:-540}
left() { [ $((LIMIT - SECONDS)) -gt "$1" ]; }
step() { case " ${STEPS:-1 2 3} " in *" $1 "*) return 0 ;; esac; return 1; }
report=()

if step 1; then
  CHECK_KEYS=${CHECK_KEYS:-4096,20000,32769} NCU=0 timeout $((LIMIT / ${SHARE:-3})) bash "$(dirname "$0")/gpu-attn-variants.sh" \
    > "$out/attn-variants.txt" 2>&1
  report+=("$(grep -A40 '== decode attention' "$out/attn-variants.txt")")
fi

if step 2 && left 60; then
  timeout $((LIMIT - SECONDS - 10)) "$C/tests/test_cuda_kernels" > "$out/cuda_kernels.log" 2>&1
  report+=("test_cuda_kernels: exit $?, $(grep -c '^PASS' "$out/cuda_kernels.log") PASS, $(grep -c '^FAIL' "$out/cuda_kernels.log") FAIL")
  report+=("$(grep -E '^FAIL' "$out/cuda_kernels.log" | head -n 8)")
fi

if step 3; then
  bins=${BINS:-}
  if [ -z "$bins" ]; then
    bins="ring|$C/strata"
    for v in noring early; do [ -x "$C/strata-$v" ] && bins="$bins $v|$C/strata-$v"; done
    bins="$bins ring2|$C/strata"
    [ -x "$C/strata-noring" ] && bins="$bins noring2|$C/strata-noring"
  fi
  for kv in f16 q8_0; do
    left 100 || { report+=("depth ${DEPTH:-32768} $kv: no time left"); continue; }
    BINS=$bins R=${R:-2} DECODE=64 TIMEOUT=120 ARGS="--depth ${DEPTH:-32768} -c 32896 -ctk $kv -ctv $kv" \
      timeout $((LIMIT - SECONDS - 20)) bash "$(dirname "$0")/../bench/gpu-step-gap.sh" > "$out/gap-$kv.txt" 2>&1
    report+=("== qwen3 8-layer cut, depth ${DEPTH:-32768}, $kv cache ==" "$(grep -A20 '=====' "$out/gap-$kv.txt")")
  done
fi

echo
for r in "${report[@]}"; do echo "$r"; done
