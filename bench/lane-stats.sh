#!/usr/bin/env bash
# Where the CPU lanes' time goes in a decode step (STRATA_LANE_STATS=1, doc/tuning.md), on the GPU
# host, for one or more configurations in one job: each runs the CPU-only decode (STARPU_NCUDA=0,
# STARPU_NCPU=$NCPU workers) with its lane table, and, with ROWS containing 24gb, the 24 GB class
# decode (CPU-pool experts through the mailbox) at GPU_MEM GiB. The full tables go to $LOG; the
# last lines are one table, a configuration a row: tok/s, and per decode step the wall ms of the
# main phases and the lanes busy on average.
# Uses bench/vs-llama.sh's model and profile (its `model` phase makes them when missing).
# Environment: CONFIGS (default "new|carry/strata|"): space-separated label|binary|environment, the
# environment comma-separated (e.g. "rows|carry/strata|STRATA_LANE_ROWS=down=64"); W (/tmp/vs-llama);
# NCPU (15); DECODE tokens (32); ROWS ("cpu"; add 24gb for the 24 GB class); GPU_MEM (21.55);
# LOG (default $W/lane-stats.log; ${OUT}/lane-stats.log when OUT is set).
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
C=$root/carry
W=${W:-/tmp/vs-llama}
export LD_LIBRARY_PATH=$C/lib STARPU_SILENT=1 STARPU_HOME=$W/starpu-home
model=$W/q30b-q8_0.gguf profile=$W/q30b.profile
[ -f "$model" ] && [ -f "$profile" ] || W=$W bash "$root/bench/vs-llama.sh" model || exit 1
LOG=${LOG:-${OUT:+$OUT/lane-stats.log}}
LOG=${LOG:-$W/lane-stats.log}
: > "$LOG"
N=${DECODE:-32}
for cfg in ${CONFIGS:-new|carry/strata|}; do
  IFS='|' read -r label bin envs <<< "$cfg"
  [ "${bin#/}" = "$bin" ] && bin=$root/$bin
  for row in ${ROWS:-cpu}; do
    echo "### $label $row" >> "$LOG"
    case $row in
      cpu) env ${envs//,/ } STRATA_LANE_STATS=1 STARPU_NCUDA=0 STARPU_NCPU=${NCPU:-15} "$bin" bench -m "$model" --prompt 0 \
             --decode "$N" -r 1 >> "$LOG" 2>&1 ;;
      24gb) env ${envs//,/ } STRATA_LANE_STATS=1 "$bin" bench -m "$model" --prompt 0 --decode "$N" -r 1 \
              --expert-profile "$profile" --expert-cache auto --gpu-mem "${GPU_MEM:-21.55}" >> "$LOG" 2>&1 ;;
    esac
  done
done
python3 - "$LOG" <<'PY'
import sys, re
cols = ["qkv", "oproj", "rlogits", "gateup", "down", "combine", "norm", "head", "mailwait", "total"]
print("%-22s %7s" % ("config row", "tok/s") + "".join(" %8s" % c[:8] for c in cols) + " %6s" % "lanes")
cur, wall, lanes, tok = None, {}, "", ""
def flush():
    if cur: print("%-22s %7s" % (cur[:22], tok) + "".join(" %8s" % wall.get(c, "-") for c in cols) + " %6s" % lanes)
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("### "):
        flush(); cur, wall, lanes, tok = line[4:].strip(), {}, "", ""; continue
    f = line.split()
    if len(f) >= 5 and f[0] in cols:
        if f[0] == "total": wall["total"], lanes = f[1], f[-1]
        elif f[0] == "mailwait": wall["mailwait"] = "%.1f" % float(f[4])  # lane-ms
        else: wall[f[0]] = f[2]
    if f and f[0] == "decode" and len(f) > 4 and re.match(r"^[0-9.]+$", f[4]): tok = f[4]
    if "error" in line.lower() or "expected" in line: print("   " + line.strip()[:150])
flush()
print("(per decode step: wall ms of each phase kind; mailwait: lane-ms waiting for the GPU; lanes: busy on average)")
PY
