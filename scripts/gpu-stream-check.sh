#!/usr/bin/env bash
# Streamed experts on the prompt path (--prompt-stream) against the CPU pool, on the fixture models,
# on a GPU host from the repository root after scripts/gather-libs. For each model: half the expert
# pairs cached on CUDA0, a 100-token prompt's logits at every position (--all-logits) with
# --prompt-stream 1 (every uncached expert with a row in the chunk streamed to CUDA0), again (the
# same bits), and with --prompt-stream off (the CPU pool computes them). Prints, per model, whether
# the streamed runs are bitwise equal, the largest and mean |difference| against off over the
# logits' standard deviation, and at how many positions the argmax agrees. PASS: bitwise equal runs
# and a mean |difference| under 0.05 of a standard deviation (other kernels, the same weights).
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
out=${OUT:-/tmp}
text=$(yes 'Mixture of experts models route each token to a few experts; the rest of the experts stay idle.' | head -n 6 | tr '\n' ' ')
rc_all=0
for m in "$C"/fixtures/models/*.gguf; do
  name=$(basename "$m" .gguf)
  # the model's expert pairs, from the start-up line of a run that caches them all
  pairs=$("$S" eval -m "$m" --expert-cache auto --no-learn -p hi 2>&1 >/dev/null | grep -o "of [0-9]* expert pairs" | head -n 1 | tr -dc 0-9)
  half=$((${pairs:-2} / 2))
  for run in s1 s2 off; do
    ps=1
    [ $run = off ] && ps=off
    "$S" eval -m "$m" --expert-cache "$half" --no-learn --prompt-stream $ps -p "$text" --all-logits \
      --logits-out "$out/stream-$name-$run.f32" > /dev/null 2> "$out/stream-$name-$run.err" ||
      { echo "$name $run: exit $?"; tail -n 3 "$out/stream-$name-$run.err"; rc_all=1; }
  done
  n_tok=$(grep -o 'eval: [0-9]* tokens' "$out/stream-$name-off.err" | tr -dc 0-9)
  python3 - "$out/stream-$name" "$name ($half of $pairs pairs cached)" "${n_tok:-1}" <<'PY' || rc_all=1
import sys, array, math
base, label, n_tok = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(r):
    a = array.array('f')
    a.frombytes(open(f"{base}-{r}.f32", 'rb').read())
    return a
s1, s2, off = load("s1"), load("s2"), load("off")
same = s1.tobytes() == s2.tobytes()
V = len(off) // n_tok
mean = sum(off) / len(off)
sd = math.sqrt(sum((x - mean) ** 2 for x in off) / len(off))
dmax = dsum = 0.0
agree = 0
for t in range(n_tok):
    a, b = s1[t * V:(t + 1) * V], off[t * V:(t + 1) * V]
    for x, y in zip(a, b):
        d = abs(x - y)
        dsum += d
        dmax = d if d > dmax else dmax
    agree += max(range(V), key=a.__getitem__) == max(range(V), key=b.__getitem__)
mean_d = dsum / len(off) / sd
print(f"{label}, {n_tok} tokens: streamed runs bitwise equal: {same}; against off: max |d|/sd {dmax / sd:.2e}, "
      f"mean {mean_d:.2e}, argmax agrees at {agree} of {n_tok} positions")
ok = same and mean_d < 0.05
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
  grep -h "streamed\|host->device" "$out/stream-$name-s1.err" | head -n 2
done
exit $rc_all
