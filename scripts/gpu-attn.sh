#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs (builds nothing): the decode attention's kernels alone.
# tests/test_cuda_kernels' TIME lines (one KV group at 512, 4096 and 32768 keys), then Nsight Compute
# (clocks as found) on the split-K kernel's launches of the 32768-key case: duration, DRAM
# throughput, occupancy and the top warp stall reasons.
set -u
. "$(dirname "$0")/gpu-lib.sh"
timeout 120 "$C/tests/test_cuda_kernels" 2>&1 | grep -E "^TIME|^FAIL|test_cuda_kernels:"
command -v ncu > /dev/null || { echo "no ncu"; exit 0; }
timeout 300 ncu --clock-control none -k regex:attend_split --launch-count "${COUNT:-200}" \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
  --csv --page raw "$C/tests/test_cuda_kernels" > "$out/ncu-attn.csv" 2> "$out/ncu-attn.err"
echo "ncu exit $?"
python3 - "$out/ncu-attn.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = next((r for r in rows if 'Kernel Name' in r), None)
if not hdr: print("no ncu rows"); sys.exit()
def num(x):
    try: return float(x.replace(',', ''))
    except ValueError: return None
ds = [dict(zip(hdr, r)) for r in rows if len(r) == len(hdr) and r[0].isdigit()]
ds.sort(key=lambda d: -(num(d.get('gpu__time_duration.sum', '0')) or 0))
for d in ds[:6]:
    st = sorted(((num(v) or 0, k) for k, v in d.items() if 'issue_stalled' in k and 'not_issued' not in k), reverse=True)[:5]
    print("%s grid %s dur %s ns dram %s%% warps_active %s regs %s | %s" % (d['Kernel Name'][:40], d.get('launch__grid_size'),
          d.get('gpu__time_duration.sum'), d.get('gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed', d.get('dram__throughput.avg.pct_of_peak_sustained_elapsed')),
          d.get('sm__warps_active.avg.pct_of_peak_sustained_active'), d.get('launch__registers_per_thread'),
          " ".join("%s=%.1f" % (k.split('stalled_')[-1][:22], v) for v, k in st)))
PY
tail -n 3 "$out/ncu-attn.err"
