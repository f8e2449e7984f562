#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs (builds nothing): Nsight Compute's source-level counters
# (SASS with stall reasons per instruction) for one instance of a decode kernel (KERNEL: a regex,
# default dk_router; SKIP launches of it first, default 40) on an 8-layer model of the qwen3-30b-a3b
# shape (PRESET: another preset's, e.g. gpt-oss-20b; Q8_0, every expert cached); writes
# $OUT/src.csv and prints the details page's main lines and the instructions with the most stall
# samples.
set -u
. "$(dirname "$0")/gpu-lib.sh"
P=${PRESET:-qwen3-30b-a3b}
mname=$([ "$P" = qwen3-30b-a3b ] && echo m8 || echo "$P-8")
m8=$(gpu_model "$mname" --preset "$P" --layers 8 --type q8_0)
timeout 300 ncu --clock-control none --cache-control none --graph-profiling node -k "regex:${KERNEL:-dk_router}" \
  --launch-skip "${SKIP:-40}" --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats \
  --section SourceCounters --section LaunchStats --import-source no -o "$out/k${TAG:-}" \
  "$S" generate -m "$m8" -p "Hi" -n 24 --temp 0 --ignore-eos --expert-profile "$W/$mname.profile" --expert-cache auto \
  > "$out/ncu.log" 2>&1
echo "ncu exit $?"
ncu -i "$out/k${TAG:-}.ncu-rep" --page details > "$out/details${TAG:-}.txt" 2>&1
ncu -i "$out/k${TAG:-}.ncu-rep" --page source --print-source sass --csv > "$out/src${TAG:-}.csv" 2>&1
grep -E "Duration|Elapsed Cycles|SM Active|Registers|Achieved Occ|Warp Cycles Per Issued|Block Size|Grid Size|Stall|stall" "$out/details${TAG:-}.txt" | cut -c1-160 | head -30
python3 - "$out/src${TAG:-}.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors='replace')))
h = next(i for i, r in enumerate(rows) if 'Source' in r)
hdr = rows[h]; data = [r for r in rows[h + 1:] if len(r) == len(hdr)]
col = lambda name: next((i for i, c in enumerate(hdr) if c.startswith(name)), None)
ws = col('Warp Stall Sampling (All'); src = col('Source'); addr = col('Address')
tot = sum(float(r[ws] or 0) for r in data)
print('stall samples', tot, 'instructions', len(data))
top = sorted(range(len(data)), key=lambda i: -float(data[i][ws] or 0))[:40]
for i in sorted(top):
    r = data[i]
    print('%5d %6.1f%%  %s' % (i, 100 * float(r[ws] or 0) / max(tot, 1), r[src][:110]))
PY
