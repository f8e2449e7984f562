#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs (builds nothing): each CUDA graph of the decode step (a
# layer's, the head's) timed whole by Nsight Compute (--graph-profiling graph: a graph is one
# workload, replayed alone), every expert cached, 8-layer cut of the qwen3-30b-a3b shape (PRESET:
# another preset's); then the same run's step span from strata bench. The difference between the
# step span and the graphs' sum is what the boundaries between graphs cost.
set -u
. "$(dirname "$0")/gpu-lib.sh"
P=${PRESET:-qwen3-30b-a3b}
mname=$([ "$P" = qwen3-30b-a3b ] && echo m8 || echo "$P-8")
m8=$(gpu_model "$mname" --preset "$P" --layers 8 --type q8_0)
timeout 300 ncu --clock-control none --cache-control none --graph-profiling graph --launch-skip "${SKIP:-60}" \
  --launch-count "${COUNT:-45}" --metrics gpu__time_duration.sum --csv --page raw --print-units base \
  "$S" generate -m "$m8" -p "Hi" -n 40 --temp 0 --ignore-eos --expert-profile "$W/$mname.profile" --expert-cache auto \
  > "$out/graphs.csv" 2> "$out/graphs.err"
echo "ncu exit $?"
python3 - "$out/graphs.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = None; t = []
for r in rows:
    if 'ID' in r and hdr is None: hdr = r; continue
    if hdr is None or len(r) != len(hdr) or not r[0].isdigit(): continue
    d = dict(zip(hdr, r))
    try: t.append(float(d['gpu__time_duration.sum'].replace(',', '')) / 1e3)
    except (KeyError, ValueError): pass
print("graphs timed: %d; us each: %s" % (len(t), " ".join("%.1f" % x for x in t[:27])))
if len(t) >= 9:
    big = max(range(len(t)), key=lambda i: t[i])  # a head graph
    print("head graph %.1f us; mean of the others %.1f us" % (t[big], sum(x for i, x in enumerate(t) if i != big) / (len(t) - 1)))
PY
tail -n 2 "$out/graphs.err"
