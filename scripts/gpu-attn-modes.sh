#!/usr/bin/env bash
# On a GPU host: bench/attn-bench variants (carry/attn/*.xz) in each MODE (MODES, default "0 1 2"),
# then mode 0 with each of COPIES_LIST (default 1: L2 holds the cache; 48: a cache per layer),
# then, with NCU=1, Nsight Compute on one launch of the decode kernel at depth DEPTH (default 4096,
# MODE 1): the details and the SASS source view into $OUT. Builds nothing.
set -u
. "$(dirname "$0")/gpu-lib.sh"
for x in "$C"/attn/*.xz; do
  xz -dc "$x" > "$W/attn-bench" && chmod +x "$W/attn-bench"
  for m in ${MODES:-0 1 2}; do echo "== $(basename "$x" .xz) mode $m"; MODE=$m timeout 60 "$W/attn-bench" 10 | tail -n +3; done
  for c in ${COPIES_LIST:-1}; do echo "== $(basename "$x" .xz) mode 0, $c copies"; COPIES=$c timeout 60 "$W/attn-bench" 10 | tail -n +3; done
done
command -v ncu > /dev/null && [ "${NCU:-1}" = 1 ] || exit 0
x=$(ls "$C"/attn/*.xz | head -n 1)
xz -dc "$x" > "$W/attn-bench" && chmod +x "$W/attn-bench"
MODE=1 DEPTH=${DEPTH:-4096} timeout 120 ncu --clock-control none --graph-profiling node -k regex:attend_decode_all \
  --launch-skip 60 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats \
  --section SourceCounters --section InstructionStats --section MemoryWorkloadAnalysis -o "$out/attn" "$W/attn-bench" 1 > "$out/ncu.log" 2>&1
echo "ncu exit $?"
ncu -i "$out/attn.ncu-rep" --page details > "$out/ncu-details.txt" 2>&1
ncu -i "$out/attn.ncu-rep" --page source --print-source sass --csv > "$out/ncu-source.csv" 2>&1
grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|Stall|stalled" "$out/ncu-details.txt" | head -20
