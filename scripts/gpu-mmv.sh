#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs (which copies bench/mmv-bench, `make bench/mmv-bench`,
# into carry/; builds nothing): the decode step's mat-vec kernels alone (bench/mmv-bench.cu: µs per
# launch against a plain read of the same bytes, float32 and int8 activations), then, with NCU=1
# (the default), Nsight Compute's warp-state and source views of one launch of KERNEL (a regex of
# the demangled name, default the int8 gate/up kernel) and the kernels' SASS into $OUT.
# Environment: BENCH (0: skip the timing), REPLAYS (20), NCU, KERNEL.
set -u
. "$(dirname "$0")/gpu-lib.sh"
[ "${BENCH:-1}" = 1 ] && "$C/mmv-bench" "${REPLAYS:-20}" | tee "$out/mmv-bench.txt"
command -v cuobjdump > /dev/null && cuobjdump -sass "$C/mmv-bench" > "$out/mmv-bench.sass"
if command -v ncu > /dev/null && [ "${NCU:-1}" = 1 ]; then
  timeout 240 ncu --clock-control none --graph-profiling node --kernel-name-base demangled \
    --kernel-name "regex:${KERNEL:-dk_gateup<.*\\(bool\\)1>}" --launch-skip 20 --launch-count 1 \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis --section InstructionStats --section SourceCounters --section LaunchStats -o "$out/mmv" "$C/mmv-bench" 1 > "$out/ncu.log" 2>&1
  echo "ncu exit $?"
  ncu -i "$out/mmv.ncu-rep" --page details > "$out/ncu-details.txt" 2>&1
  ncu -i "$out/mmv.ncu-rep" --page source --print-source sass --csv > "$out/ncu-source.csv" 2>&1
  grep -E "Warp Cycles|Issued Ipc|Eligible|Active Warps|Achieved Occupancy|Stall|Throughput|Duration|Registers" "$out/ncu-details.txt" | head -60
fi
