#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs (builds nothing): where a decode step's time goes with
# every expert cached. Nsight Compute's per-kernel durations and DRAM throughput over a few decode
# steps of an 8-layer model of the qwen3-30b-a3b shape (PRESET: another preset's) (Q8_0; caches left warm: --cache-control
# none, clocks as found), then a recorded trace's summary of one decode step of the 48-layer model
# (W/q30b.gguf when scripts/gpu-step.sh made it, else made here). Builds nothing.
# PROMPT=N: the same per-kernel table over a prompt of N tokens in one chunk instead
# (`strata bench --prompt N --decode 0 -r 1` on the 8-layer cut: its 32-token warm-up, two decode
# steps, then the chunk; SKIP 0 and COUNT 3000 by default: every launch is counted, the warm-up's
# and the steps' too, whose time is small beside the chunk's), and no trace.
set -u
. "$(dirname "$0")/gpu-lib.sh"
# PRESET: the model's preset (default qwen3-30b-a3b; e.g. gpt-oss-20b, MXFP4 experts), cut to 8 layers
P=${PRESET:-qwen3-30b-a3b}
mname=$([ "$P" = qwen3-30b-a3b ] && echo m8 || echo "$P-8")
m8=$(gpu_model "$mname" --preset "$P" --layers 8 --type q8_0)
if command -v ncu > /dev/null && [ "${NCU:-1}" = 1 ]; then
  # generate: a prompt of 2 tokens, then decode steps (skip the prompt and the first steps' captures)
  if [ -n "${PROMPT:-}" ]; then
    run=(bench -m "$m8" --prompt "$PROMPT" --decode 0 -r 1 --prefill "$PROMPT") skip=0 count=3000
  else
    run=(generate -m "$m8" -p "Hi" -n 40 --temp 0 --ignore-eos) skip=400 count=140
  fi
  timeout 300 ncu --clock-control none --cache-control none --graph-profiling node --launch-skip "${SKIP:-$skip}" \
    --launch-count "${COUNT:-$count}" --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    --csv --page raw --print-units base "$S" "${run[@]}" --expert-profile "$W/$mname.profile" --expert-cache auto > "$out/ncu.csv" 2> "$out/ncu.err"
  echo "ncu exit $?"
  python3 - "$out/ncu.csv" <<'EOF'
import csv, sys, re, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = None
agg = collections.OrderedDict()
for r in rows:
    if 'Kernel Name' in r and hdr is None:
        hdr = r; continue
    if hdr is None or len(r) != len(hdr) or not r[0].isdigit(): continue
    d = dict(zip(hdr, r))
    name = d['Kernel Name']
    name = re.sub(r'\(.*', '', name)
    m = re.search(r'<([^>]*)>', d['Kernel Name'])
    key = name + ('<' + m.group(1).split(',')[0] + '>' if m else '')
    try:
        t = float(d['gpu__time_duration.sum'].replace(',', '')); b = float(d['dram__bytes_read.sum'].replace(',', ''))
    except ValueError:
        continue
    a = agg.setdefault(key, [0, 0.0, 0.0])
    a[0] += 1; a[1] += t; a[2] += b
tot = sum(v[1] for v in agg.values())
print("%-44s %6s %10s %10s %8s" % ("kernel", "calls", "us/call", "MB/call", "GB/s"))
for k, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    # duration unit: ncu reports ns in raw csv for gpu__time_duration.sum (usecond/nsecond header row)
    print("%-44s %6d %10.2f %10.3f %8.0f" % (k[:44], n, t / n / 1e3, b / n / 1e6, (b / t) if t else 0))
print("total kernel time %.1f us over %d kernels" % (tot / 1e3, sum(v[0] for v in agg.values())))
EOF
  tail -n 3 "$out/ncu.err"
fi
[ "${TRACE:-1}" = 1 ] && [ -z "${PROMPT:-}" ] || exit 0
m=$(gpu_model q30b --preset qwen3-30b-a3b --type q8_0)
rm -rf "$W/tr"
timeout 200 "$S" generate -m "$m" -p "Explain the sky." -n 24 --temp 0 --ignore-eos --expert-profile "$W/q30b.profile" \
  --expert-cache auto --trace "$W/tr" > /dev/null 2> "$W/gen.err"
echo "generate with trace: exit $?"
timeout 120 "$S" trace "$W/tr" --no-paje --step decode:12 -o "$W/tr-out" 2>&1 | head -n 60
