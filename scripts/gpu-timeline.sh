#!/usr/bin/env bash
# On a GPU host after scripts/gather-libs (builds nothing): the decode step's kernels on a timeline
# (Nsight Systems, CUDA graphs traced per node), every expert cached, on an 8-layer cut of the
# qwen3-30b-a3b shape (PRESET: another preset's). Prints, for the steady decode steps, each kernel
# kind's mean duration and the mean idle gap before it (µs), and one layer's kernels in order.
# Environment: PRESET, N (decode tokens, 48), BIN (the strata binary; default the carried one),
# and ENV ("VAR=VALUE,...") for the run.
set -u
. "$(dirname "$0")/gpu-lib.sh"
P=${PRESET:-qwen3-30b-a3b}
mname=$([ "$P" = qwen3-30b-a3b ] && echo m8 || echo "$P-8")
m8=$(gpu_model "$mname" --preset "$P" --layers 8 --type q8_0)
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2> /dev/null | head -n 1)
[ -n "$NSYS" ] || { echo "no nsys on this host"; exit 1; }
bin=${BIN:-$S}
rm -f "$out/tl.nsys-rep" "$out/tl.sqlite"
env ${ENV//,/ } timeout 300 "$NSYS" profile -o "$out/tl" --trace=cuda --cuda-graph-trace=node --sample=none --cpuctxsw=none \
  "$bin" generate -m "$m8" -p "Hi" -n "${N:-48}" --temp 0 --ignore-eos --expert-profile "$W/$mname.profile" \
  --expert-cache auto > "$out/tl.out" 2> "$out/tl.err"
echo "nsys exit $?"
"$NSYS" export --type sqlite -o "$out/tl.sqlite" "$out/tl.nsys-rep" > /dev/null 2>&1 || { tail -n 5 "$out/tl.err"; exit 1; }
rm -f "$out/tl.nsys-rep"
python3 - "$out/tl.sqlite" <<'PY'
import sqlite3, sys, re, collections
db = sqlite3.connect(sys.argv[1])
names = dict(db.execute("select id, value from StringIds"))
rows = db.execute("select start, end, demangledName, shortName from CUPTI_ACTIVITY_KIND_KERNEL order by start").fetchall()
def short(r):
    n = names.get(r[2], "?")
    n = re.sub(r"\(anonymous namespace\)::", "", n)
    n = re.sub(r"\(.*", "", n)
    return n[:48]
ks = [(s, e, short((s, e, d, sh))) for s, e, d, sh in rows]
# steps: a step starts at the first kernel after an idle gap of more than 40 us
steps, cur = [], []
for i, k in enumerate(ks):
    if cur and k[0] - cur[-1][1] > 40000:
        steps.append(cur); cur = []
    cur.append(k)
if cur: steps.append(cur)
lens = collections.Counter(len(s) for s in steps)
L = lens.most_common(1)[0][0]
good = [s for s in steps if len(s) == L][5:]
print("kernels %d, steps %d, the common step has %d kernels; %d such steps after the first 5 used" % (len(ks), len(steps), L, len(good)))
if not good: sys.exit()
span = sum(s[-1][1] - s[0][0] for s in good) / len(good)
busy = sum(sum(k[1] - k[0] for k in s) for s in good) / len(good)
print("step span %.1f us, kernels busy %.1f us (union-free sum), idle between steps %.1f us" % (span / 1e3, busy / 1e3,
      sum(good[i + 1][0][0] - good[i][-1][1] for i in range(len(good) - 1)) / max(1, len(good) - 1) / 1e3))
agg = collections.OrderedDict()
for s in good:
    for j, k in enumerate(s):
        gap = k[0] - s[j - 1][1] if j else 0
        a = agg.setdefault(k[2], [0, 0.0, 0.0])
        a[0] += 1; a[1] += k[1] - k[0]; a[2] += gap
n = len(good)
print("%-48s %6s %9s %9s %9s" % ("kernel", "/step", "us each", "gap us", "us/step"))
for name, (c, d, g) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print("%-48s %6.1f %9.2f %9.2f %9.1f" % (name, c / n, d / c / 1e3, g / c / 1e3, (d + g) / n / 1e3))
s = good[len(good) // 2]
print("one step, kernels in order (start us from the step's start, duration, gap before):")
t0 = s[0][0]
for j, k in enumerate(s[:40]):
    print("  %8.2f %7.2f %7.2f  %s" % ((k[0] - t0) / 1e3, (k[1] - k[0]) / 1e3, ((k[0] - s[j - 1][1]) if j else 0) / 1e3, k[2]))
PY
