#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs (builds nothing): Nsight Compute's full sections (stall
# reasons, occupancy, memory) for the decode step's mat-vec kernels on an 8-layer model of the
# qwen3-30b-a3b shape (PRESET: another preset's, e.g. gpt-oss-20b; Q8_0, every expert cached), one
# instance each (KERNELS: a regex), after test_forward_ref (the fixture comparisons on CUDA0) when
# FWD=1.
set -u
. "$(dirname "$0")/gpu-lib.sh"
if [ "${FWD:-1}" = 1 ]; then
  STRATA_FIXTURES=$PWD/$C/fixtures timeout 300 "$C/tests/test_forward_ref" > "$out/forward_ref.log" 2>&1
  echo "test_forward_ref: exit $?: $(tail -n 1 "$out/forward_ref.log")"
  grep -iE "^FAIL|error|abort" "$out/forward_ref.log" | head -n 8
fi
P=${PRESET:-qwen3-30b-a3b}
mname=$([ "$P" = qwen3-30b-a3b ] && echo m8 || echo "$P-8")
m8=$(gpu_model "$mname" --preset "$P" --layers 8 --type q8_0)
timeout 400 ncu --clock-control none --cache-control none --set full --graph-profiling node \
  --kernel-name "regex:${KERNELS:-dk_gateup|dk_mv}" --launch-skip "${SKIP:-40}" --launch-count "${COUNT:-2}" \
  "$S" generate -m "$m8" -p "Hi" -n 24 --temp 0 --ignore-eos --expert-profile "$W/$mname.profile" --expert-cache auto \
  > "$out/ncu-full.txt" 2> "$out/ncu-full.err"
echo "ncu exit $?"
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Issue Slots Busy|Issued Ipc|Warp Cycles Per Issued|No Eligible|Active Warps Per|Eligible Warps|Executed Instructions  |Bank Conflicts|Stall|stall|est\. speedup|Est. Speedup|Dynamic Shared|Waves Per SM" "$out/ncu-full.txt" | grep -v "^    ----" | cut -c1-180 | head -n 120
