#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs (builds nothing): the decode step's attention alone
# (bench/attn-bench) for every build variant carried as carry/attn-bench and carry/attn-bench-NAME
# (built here with ATT_FLAGS; see bench/attn-bench.cu), f16 and q8_0 caches, 48 cache copies (one a
# layer, as the engine has), the launch of each position's regime; then Nsight Compute on the
# tensor-core kernel at DEPTH (16384) for each cache: duration, DRAM throughput, top warp stalls.
# Prints a table last (us a launch by depth). Environment: VARIANTS (the names; default: every one
# carried), KVS (f16 q8_0), NCU (1), EXTRA_COPIES (cache copies of extra runs of the default build).
set -u
. "$(dirname "$0")/gpu-lib.sh"
vs=${VARIANTS:-$(cd "$C" && ls attn-bench attn-bench-* 2> /dev/null | sed 's/^attn-bench-\{0,1\}//' | sed 's/^$/base/')}
table=()
for v in $vs; do
  b=$C/attn-bench$([ "$v" = base ] || echo "-$v")
  [ -x "$b" ] || { echo "no $b"; continue; }
  for kv in ${KVS:-f16 q8_0}; do
    KV=$kv MODE=0 COPIES=48 timeout 120 "$b" > "$out/attn-$v-$kv.txt" 2>&1
    row=$(awk '$1 ~ /^[0-9]+$/ && NF == 5 { printf "%s:%s ", $1, $3 }' "$out/attn-$v-$kv.txt")
    chk=$(grep -o 'depth [0-9]* against float64: max |d| [^ ]* over [0-9]* values, bits [0-9a-f]*' "$out/attn-$v-$kv.txt" | awk '{print $2 ":" $7 " " $12}' | tr '\n' ' ')
    table+=("$(printf '%-10s %-5s %s (%s)' "$v" "$kv" "$row" "$chk")")
    # ATT_PROBE builds: each depth's block clocks
    awk -v v="$v" -v kv="$kv" '$1 ~ /^[0-9]+$/ && NF == 5 { d = $1 } /probe/ { sub(/^.*max\):/, ""); print "probe " v " " kv " " d ":" $0 }' \
      "$out/attn-$v-$kv.txt" >> "$out/probes.txt"
  done
done
# the default build with COPIES caches (e.g. 2: the depth's bytes past L2, few pages): what the 48 copies' pages cost
for c in ${EXTRA_COPIES:-}; do
  for kv in ${KVS:-f16 q8_0}; do
    KV=$kv MODE=0 COPIES=$c timeout 120 "$C/attn-bench" > "$out/attn-copies$c-$kv.txt" 2>&1
    table+=("$(printf '%-10s %-5s %s' "copies=$c" "$kv" "$(awk '$1 ~ /^[0-9]+$/ && NF == 5 { printf "%s:%s ", $1, $3 }' "$out/attn-copies$c-$kv.txt")")")
  done
done
if command -v ncu > /dev/null && [ "${NCU:-1}" = 1 ]; then
  for kv in ${KVS:-f16 q8_0}; do
    KV=$kv MODE=1 COPIES=48 DEPTH=${DEPTH:-16384} timeout 200 ncu --clock-control none --graph-profiling node \
      -k regex:attend_decode_all --launch-skip 60 --launch-count 3 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section LaunchStats --csv --page raw "$C/attn-bench" 3 > "$out/ncu-$kv.csv" 2> "$out/ncu-$kv.err"
    python3 - "$out/ncu-$kv.csv" "$kv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = next((r for r in rows if 'Kernel Name' in r), None)
if not hdr: print("ncu %s: no rows" % sys.argv[2]); sys.exit()
def num(x):
    try: return float(x.replace(',', ''))
    except ValueError: return None
for r in rows:
    if len(r) != len(hdr) or not r[0].isdigit(): continue
    d = dict(zip(hdr, r))
    st = sorted(((num(v) or 0, k) for k, v in d.items() if 'issue_stalled' in k and 'not_issued' not in k), reverse=True)[:6]
    print("ncu %s %s grid %s dur %s ns dram %s%% warps_active %s regs %s | %s" % (sys.argv[2], d['Kernel Name'][:34], d.get('launch__grid_size'),
          d.get('gpu__time_duration.sum'), d.get('dram__throughput.avg.pct_of_peak_sustained_elapsed'),
          d.get('sm__warps_active.avg.pct_of_peak_sustained_active'), d.get('launch__registers_per_thread'),
          " ".join("%s=%.2f" % (k.split('stalled_')[-1][:24], v) for v, k in st)))
PY
    tail -n 2 "$out/ncu-$kv.err"
  done
fi
echo
[ -s "$out/probes.txt" ] && echo "== block clocks of one launch (us from the first block's entry; min/median/max over blocks) ==" && cat "$out/probes.txt"
echo "== decode attention, us a launch by keys (attn-bench, MODE=0, COPIES=48) =="
for r in "${table[@]}"; do echo "$r"; done
