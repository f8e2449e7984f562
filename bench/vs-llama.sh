#!/usr/bin/env bash
# strata against llama.cpp on the same GGUF file, in one job on one GPU host (issue #20): decode
# and prompt tok/s with every expert on the GPU, in the 24 GB class (llama.cpp -ngl 99 -ncmoe N
# against strata --gpu-mem at llama.cpp's measured peak), on the CPU alone, and strata's decode at
# depth 32768 against depth 0; peak GPU memory of every run from nvidia-smi; the ratios last.
#
# Here (the development machine), once:   bench/vs-llama.sh pack
#   packs llama.cpp's sources (node-llama-cpp@3.22.1's git bundle, commit de3ff815ea7d) into
#   carry/llama-src.tar.xz; scripts/gather-libs puts strata and its libraries into carry/.
# There (the GPU host, repository root):   bench/vs-llama.sh [PHASE ...]
#   build   start building llama-bench (CUDA for sm_90, CPU backend native) in the background
#           (setsid; about 5 minutes with 15 jobs); its log is $W/llama-build.log. Only untimed work
#           (model, checks) may overlap it: the strata and llama phases wait for it to finish
#   model   strata mkmodel --preset $PRESET --type $TYPE and strata profile over ~440 tokens
#   strata  strata bench rows (JSON into $W/strata-*.json)
#   llama   wait for the build, then llama-bench rows (JSON into $W/llama-*.json)
#   report  the table (also written to $W/table.md)
#   default: build model llama strata report (llama.cpp first, so that strata's 24 GB row takes
#   llama.cpp's measured peak as its --gpu-mem: equal peak GPU memory without GPU_MEM)
# Environment: W work folder (default /tmp/vs-llama), R repetitions (3), NCMOE llama.cpp's
# -ncmoe for the 24 GB class (17), GPU_MEM strata's --gpu-mem for it in GiB (default: llama.cpp's
# measured peak of that row when $W/llama-24gb.json exists, else 20.2), ROWS (strata rows to run,
# default "gpu 24gb cpu deep"; cpu-tasks: CPU-only prompt 128 on the per-task path, STRATA_PROMPT_LANES=0,
# against the cpu row's lanes; long: strata alone in the 24 GB class with a 32,768-token context, prompt
# 4096 and 32768, for issue #22's ratio of the two, RLONG repetitions (1)), STRATA_ENV extra environment for strata (e.g. STRATA_DECODE_GRAPH=0),
# STRATA_ARGS extra arguments for every strata bench row (e.g. "--cache-type-k f16 --cache-type-v f16",
# llama.cpp's default KV cache type),
# PRESET / TYPE the model strata mkmodel writes (default qwen3-30b-a3b / q8_0; PRESET=gpt-oss-20b,
# MXFP4 experts, takes the gpu, 24gb and cpu rows (with NCMOE=4 the 24gb row is a 12 GB class:
# CLASS labels it); the deepseek2 and glm4moe presets take every row too),
# CLASS the label of the 24gb rows in the table (default "24 GB class"),
# QUICK=1 decode rows only (no prompt rows; llama.cpp with -t 16 only), for a short lease, at the
# depths QUICK_DEPTHS gives for the 24 GB row (default 0); with QUICK_PROMPT=1 also the prompt 4096
# of the every-expert row and the CPU's prompt 128. RDEEP repetitions of the deep row (1).
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
C=$root/carry
W=${W:-/tmp/vs-llama}
R=${R:-3}
NCMOE=${NCMOE:-17}
ROWS=${ROWS:-gpu 24gb cpu deep}
mkdir -p "$W"
phases=${*:-build model llama strata report}
LB=$W/llama-build/bin/llama-bench
PRESET=${PRESET:-qwen3-30b-a3b}
TYPE=${TYPE:-q8_0}
if [ "$PRESET" = qwen3-30b-a3b ] && [ "$TYPE" = q8_0 ]; then
  model=$W/q30b-q8_0.gguf profile=$W/q30b.profile
else
  model=$W/$PRESET-$TYPE.gguf profile=$W/$PRESET-$TYPE.profile
fi

pack() {
  local work=${TMPDIR:-/tmp}/strata-ggml src
  src=${LLAMA_CPP_SRC:-$work/src/llama.cpp}
  if [ ! -f "$src/ggml/CMakeLists.txt" ]; then
    mkdir -p "$work/src"
    (cd "$work/src" && npm pack --silent node-llama-cpp@3.22.1 > /dev/null)
    tar -xzf "$work/src/node-llama-cpp-3.22.1.tgz" -C "$work/src" package/llama/gitRelease.bundle
    git -c advice.detachedHead=false clone -q "$work/src/package/llama/gitRelease.bundle" "$src"
  fi
  mkdir -p "$C"
  git -C "$src" archive --format=tar HEAD CMakeLists.txt cmake common ggml include src tools vendor licenses LICENSE \
    | xz -T2 -6 > "$C/llama-src.tar.xz"
  git -C "$src" log -1 --format=%H > "$C/llama-src.commit"
  echo "packed llama.cpp $(cat "$C/llama-src.commit") into $C/llama-src.tar.xz ($(du -h "$C/llama-src.tar.xz" | cut -f1))"
}

build() {
  [ -x "$LB" ] && { echo "llama-bench already built"; return; }
  [ -f "$C/llama-src.tar.xz" ] || { echo "no $C/llama-src.tar.xz: run bench/vs-llama.sh pack here first" >&2; return 1; }
  rm -rf "$W/llama-src" && mkdir -p "$W/llama-src" && tar -xJf "$C/llama-src.tar.xz" -C "$W/llama-src"
  setsid bash -c "cd '$W' && cmake -S llama-src -B llama-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF && \
    cmake --build llama-build --target llama-bench -j 15 && echo BUILD-DONE" > "$W/llama-build.log" 2>&1 < /dev/null &
  echo "llama-bench: building in the background (log $W/llama-build.log)"
}

export LD_LIBRARY_PATH=$C/lib STARPU_SILENT=1 STARPU_HOME=$W/starpu-home
S=${STRATA:-$C/strata} # STRATA: another strata binary (bench/h200-ab.sh)

model_phase() {
  if [ ! -f "$model" ]; then
    local t0=$SECONDS
    local tok=$C/tokenizer.json
    [ -f "$tok" ] || { xz -dc "$tok.xz" > "$W/tokenizer.json" && tok=$W/tokenizer.json; }
    STRATA_TOKENIZER_JSON=$tok "$S" mkmodel -q -o "$model" --preset "$PRESET" --type "$TYPE" || return 1
    echo "mkmodel: $((SECONDS - t0)) s, $(du -h "$model" | cut -f1)"
  fi
  if [ ! -f "$profile" ]; then
    yes 'The history of mixture of experts models and their routing.' | head -n 40 | tr '\n' ' ' > "$W/calib.txt"
    "$S" profile -m "$model" -f "$W/calib.txt" -o "$profile" 2>&1 | tail -n 1
  fi
}

# Peak memory.used of GPU 0 while a command runs (nvidia-smi every 100 ms), into the file $1.
peak_run() {
  local peak_file=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 > "$peak_file.series" 2>/dev/null &
  local smi=$!
  "$@"
  local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  sort -n "$peak_file.series" | tail -n 1 > "$peak_file"
  return $rc
}

sbench() { # name, then strata bench arguments
  local name=$1; shift
  echo "== strata $name: bench $*"
  local t0=$SECONDS
  peak_run "$W/strata-$name.peak" env ${STRATA_ENV:-} timeout 560 "$S" bench -m "$model" --json -r "$R" ${STRATA_ARGS:-} "$@" \
    > "$W/strata-$name.json" 2> "$W/strata-$name.err"
  echo "   exit $?, $((SECONDS - t0)) s, peak $(cat "$W/strata-$name.peak") MiB; $(grep -E 'expert cache|gpu-mem' "$W/strata-$name.err" | tr '\n' ' ')"
  grep -E '"test"' "$W/strata-$name.json" | sed 's/, "entries_cpu.*"tasks_per_token"/ ... "tasks_per_token"/' | head -n 6
}

# Waits (up to 520 s) while a build started by `build` is still compiling: no timed row may share
# the CPU with it (on 2026-12-02 a compile on 15 of the 16 cores cut strata's decode with every
# expert on the GPU from 196 to 59 tok/s and its 24 GB row from 69 to 5 tok/s).
wait_build() {
  local waited=0
  [ -f "$W/llama-build.log" ] || return 0
  while [ ! -x "$LB" ] && ! grep -q "BUILD-DONE\|Error\|error:" "$W/llama-build.log" 2>/dev/null && [ $waited -lt 520 ]; do
    sleep 5; waited=$((waited + 5))
  done
  echo "waited $waited s for the llama.cpp build"
}

strata_phase() {
  wait_build
  local gm=${GPU_MEM:-}
  if [ -z "$gm" ] && [ -f "$W/llama-24gb.peak" ]; then gm=$(awk '{ printf "%.2f", $1 / 1024 }' "$W/llama-24gb.peak"); fi
  gm=${gm:-20.2}
  local pg=4096 pc=128 dd=0,4096
  [ "${QUICK:-0}" = 1 ] && pg=0 pc=0 dd=${QUICK_DEPTHS:-0}
  local pgg=$pg
  [ "${QUICK_PROMPT:-0}" = 1 ] && pgg=4096 pc=128
  for row in $ROWS; do
    case $row in
      gpu) sbench gpu --prompt $pgg --decode 128 --expert-profile "$profile" --expert-cache auto ;;
      24gb) sbench 24gb --prompt $pg --decode 64 --depth $dd --expert-profile "$profile" --expert-cache auto --gpu-mem "$gm" ;;
      cpu) STARPU_NCUDA=0 sbench cpu --prompt $pc --decode 32 ;;
      cpu-tasks) STRATA_PROMPT_LANES=0 STARPU_NCUDA=0 sbench cpu-tasks --prompt 128 --decode 0 ;;
      deep) R=${RDEEP:-1} sbench deep -c 32832 --prompt 0 --decode 64 --depth 0,32768 --expert-profile "$profile" --expert-cache auto ;;
      long) R=${RLONG:-1} sbench long -c 33024 --prompt 4096,32768 --decode 0 --expert-profile "$profile" --expert-cache auto \
        --gpu-mem "$gm" ;;
    esac
  done
}

lbench() { # name, then llama-bench arguments
  local name=$1; shift
  echo "== llama.cpp $name: llama-bench $*"
  local t0=$SECONDS
  peak_run "$W/llama-$name.peak" timeout 560 "$LB" -m "$model" -r "$R" -o json "$@" > "$W/llama-$name.json" 2> "$W/llama-$name.err"
  echo "   exit $?, $((SECONDS - t0)) s, peak $(cat "$W/llama-$name.peak") MiB"
  grep -E '"(n_prompt|n_gen|n_depth|n_threads|avg_ts)"' "$W/llama-$name.json" | tr -d ' \n' | sed 's/"n_prompt"/\n"n_prompt"/g'; echo
}

llama_phase() {
  wait_build
  [ -x "$LB" ] || { echo "llama-bench is not built: $(tail -n 3 "$W/llama-build.log")"; return 1; }
  local pg=4096 pc=128 dd=0,4096 th=8,16
  [ "${QUICK:-0}" = 1 ] && pg=0 pc=0 dd=${QUICK_DEPTHS:-0} th=16
  local pgg=$pg
  [ "${QUICK_PROMPT:-0}" = 1 ] && pgg=4096 pc=128
  for row in $ROWS; do
    case $row in
      gpu) lbench gpu -ngl 99 -p $pgg -n 128 ;;
      24gb) lbench 24gb -ngl 99 -ncmoe "$NCMOE" -t $th -p $pg -n 64 -d $dd ;;
      cpu) lbench cpu -dev none -t $th -p $pc -n 32 ;;
      deep) R=1 lbench deep -ngl 99 -p 0 -n 64 -d 32768 ;;
    esac
  done
}

report() {
  python3 - "$W" <<'EOF'
import json, os, sys
W = sys.argv[1]
def load(name):
    try: return json.load(open(os.path.join(W, name + ".json")))
    except Exception: return None
def peak(name):
    try: return float(open(os.path.join(W, name + ".peak")).read().split()[0])
    except Exception: return None
def s_ts(r, test, tokens=None, depth=0):
    if not r: return None
    for x in r["results"]:
        if x["test"] == test and (tokens is None or x["tokens"] == tokens) and x["depth"] == depth: return x
def l_ts(r, n_prompt, n_gen, depth=0):
    if not r: return None
    best = None
    for x in r:
        if x["n_prompt"] == n_prompt and x["n_gen"] == n_gen and x.get("n_depth", 0) == depth:
            if best is None or x["avg_ts"] > best["avg_ts"]: best = x
    return best
rows = []
def row(label, sname, stest, stok, sdepth, lname, lp, lg, ldepth):
    s, l = s_ts(load("strata-" + sname), stest, stok, sdepth), l_ts(load("llama-" + lname), lp, lg, ldepth)
    st = s["tok_s"] if s else None
    lt = l["avg_ts"] if l else None
    extra = ""
    if s and stest == "decode": extra = "%.0f tasks/token, GPU busy %.0f %%" % (s.get("tasks_per_token", 0), 100 * s.get("gpu_busy_share", 0))
    if l: extra += ("; " if extra else "") + "llama.cpp -t %d" % l.get("n_threads", 0)
    rows.append((label, lt, st, (st / lt) if st and lt else None, peak("llama-" + lname), peak("strata-" + sname), extra))
row("every expert on the GPU: decode", "gpu", "decode", None, 0, "gpu", 0, 128, 0)
row("every expert on the GPU: prompt 4096", "gpu", "prompt", 4096, 0, "gpu", 4096, 0, 0)
CLASS = os.environ.get("CLASS", "24 GB class")
row(CLASS + ": decode", "24gb", "decode", None, 0, "24gb", 0, 64, 0)
row(CLASS + ": decode at depth 4096", "24gb", "decode", None, 4096, "24gb", 0, 64, 4096)
row(CLASS + ": prompt 4096", "24gb", "prompt", 4096, 0, "24gb", 4096, 0, 0)
row("CPU only: decode", "cpu", "decode", None, 0, "cpu", 0, 32, 0)
row("CPU only: prompt 128", "cpu", "prompt", 128, 0, "cpu", 128, 0, 0)
row("CPU only: prompt 128, per-task path (STRATA_PROMPT_LANES=0)", "cpu-tasks", "prompt", 128, 0, "cpu", 128, 0, 0)
row("every expert on the GPU: decode at depth 32768", "deep", "decode", None, 32768, "deep", 0, 64, 32768)
f = lambda v, p=2: "—" if v is None else ("%.*f" % (p, v))
out = ["| setup | llama.cpp tok/s | strata tok/s | strata / llama.cpp | peak GPU MiB llama.cpp / strata | notes |", "|---|---|---|---|---|---|"]
for label, lt, st, ratio, lp, sp, extra in rows:
    out.append("| %s | %s | %s | %s | %s / %s | %s |" % (label, f(lt), f(st), f(ratio), f(lp, 0), f(sp, 0), extra))
d0, d32 = s_ts(load("strata-deep"), "decode", None, 0), s_ts(load("strata-deep"), "decode", None, 32768)
if d0 and d32: out.append("\nstrata decode at depth 32768 / depth 0: %.2f (%.2f / %.2f tok/s)" % (d32["tok_s"] / d0["tok_s"], d32["tok_s"], d0["tok_s"]))
p4, p32 = s_ts(load("strata-long"), "prompt", 4096, 0), s_ts(load("strata-long"), "prompt", 32768, 0)
if p4 and p32: out.append("\nstrata %s, a 32,768-token context: prompt 32768 / prompt 4096: %.2f (%.2f / %.2f tok/s, peak %s MiB)" % (CLASS, p32["tok_s"] / p4["tok_s"], p32["tok_s"], p4["tok_s"], f(peak("strata-long"), 0)))
text = "\n".join(out)
open(os.path.join(W, "table.md"), "w").write(text + "\n")
print(text)
EOF
}

case " $phases " in *" pack "*) ;; *) CARRY=$C "$root/scripts/carry-unpack" ;; esac # each call brings carry/ packed
for p in $phases; do
  case $p in
    pack) pack ;;
    build) build ;;
    model) model_phase ;;
    strata) strata_phase ;;
    llama) llama_phase ;;
    report) report ;;
    *) echo "unknown phase $p (pack build model strata llama report)" >&2; exit 2 ;;
  esac
done
