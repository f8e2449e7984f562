#!/usr/bin/env bash
# The host expert arena on a GPU host (nvidia-h200), from the repository root after
# scripts/gather-libs (carry/ travels with the tree). Builds nothing. On the qwen3-30b-a3b preset
# (Q8_0, made once into models/ with a profile, as scripts/gpu-tiers.sh does) with
# --expert-cache 4000: peak resident memory, decode tok/s and greedy ids of
#   mmap       STRATA_HOST_ARENA=0 (the CPU pool reads the mapped file, as before the arena)
#   arena      the default: every pair copied to RAM, pinned
#   resident   --resident-experts: the 4000 cached pairs stay in the file
#   arena+adapt, resident+adapt   the same with --adapt-swaps (refills read through the source)
# then the RAM refusal at the real size (no cache, STRATA_MEMAVAILABLE_GIB=20). Prints a summary last.
# MODES="arena resident" runs only those of the first three (default: all); REFUSAL=0 skips the
# refusal. With STRATA_MEMORY_LOG=1 (exported to every run) each run's "strata: memory:" lines
# (doc/tuning.md) are printed after it, and the summary repeats their VmRSS / VmHWM per stage.
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
out=${OUT:-/tmp}
N=${N:-32}
rows=()
MODES=${MODES:-mmap arena resident}
grep -E "MemTotal|MemAvailable" /proc/meminfo | tr -s ' ' | tr '\n' ' '; echo
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
echo "kernel $(uname -r); THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null), shmem THP" \
  "$(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null); models/ on $(df -T . | awk 'NR==2{print $2}')"

mkdir -p models
M=models/q30b-q8_0.gguf
P=models/q30b.profile
if [ ! -s $M ]; then
  STRATA_TOKENIZER_JSON=$C/tokenizer.json "$S" mkmodel -q -o $M --preset qwen3-30b-a3b --type q8_0 || exit 1
fi
if [ ! -s $P ]; then
  yes 'The history of mixture of experts models and their routing, with code: for i in range(10): print(i)' | head -n 12 > "$out/calib30.txt"
  STRATA_HOST_ARENA=0 "$S" profile -m $M -f "$out/calib30.txt" -o $P 2>&1 | tail -n 1
fi
prompt="Question: what is 17 * 23? Answer step by step."

# run NAME ENV... -- FLAGS: one greedy generation; keeps its ids in $out/ids_NAME
run() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  timeout 240 env "${envs[@]}" "$S" generate -m $M -p "$prompt" -n "$N" --temp 0 --ignore-eos --print-ids \
    --expert-profile $P --expert-cache 4000 "$@" > "$out/ids_$name" 2> "$out/$name.err"
  local st=$?
  grep -E "host expert arena|expert cache:" "$out/$name.err" | head -n 3
  [ "${STRATA_MEMORY_LOG:-0}" = 1 ] && grep "strata: memory:" "$out/$name.err"
  local peak dec swaps
  peak=$(grep -o "peak resident memory [0-9.]* GiB" "$out/$name.err" | awk '{print $4}')
  dec=$(grep -o "^decode: .*" "$out/$name.err")
  swaps=$(grep -c "adapt:" "$out/$name.err")
  rows+=("$name: exit $st, peak resident memory ${peak:-?} GiB; $dec; swaps $swaps; ids $(head -c 60 "$out/ids_$name")...")
  while read -r l; do # the memory log, one summary row per stage
    rows+=("  $(echo "$l" | sed -E 's/^strata: memory: ([^:]*): VmRSS ([0-9.]+) GiB.*VmHWM ([0-9.]+) GiB.*/\1: VmRSS \2, VmHWM \3 GiB/')")
  done < <(grep "strata: memory:" "$out/$name.err")
  [ $st = 0 ] || tail -n 3 "$out/$name.err"
}
same() { # same A B: greedy ids equal
  if [ -s "$out/ids_$1" ] && cmp -s "$out/ids_$1" "$out/ids_$2"; then rows+=("ids $1 == $2: PASS"); else rows+=("ids $1 == $2: FAIL"); fi
}

has() { case " $MODES " in *" $1 "*) return 0 ;; esac; return 1; }
has mmap && run mmap STRATA_HOST_ARENA=0 --
has arena && run arena X=1 --
has resident && run resident X=1 -- --resident-experts
has mmap && has arena && same mmap arena
has mmap && has resident && same mmap resident
has arena && has resident && ! has mmap && same arena resident
if [ "${ADAPT:-1}" = 1 ]; then # ADAPT=0 skips the two adaptive runs
  run arena_adapt X=1 -- --adapt-swaps 16 --adapt-interval 8
  run resident_adapt X=1 -- --resident-experts --adapt-swaps 16 --adapt-interval 8
  same arena_adapt resident_adapt
fi
if [ "${REFUSAL:-1}" = 1 ]; then
  timeout 120 env STRATA_MEMAVAILABLE_GIB=20 "$S" generate -m $M -p hi -n 1 >/dev/null 2>"$out/refuse.err"
  rows+=("refusal with STRATA_MEMAVAILABLE_GIB=20: exit $? '$(tail -n 1 "$out/refuse.err")'")
fi
echo "===== summary (arena, qwen3-30b-a3b Q8_0, --expert-cache 4000, $N greedy tokens)"
printf '%s\n' "${rows[@]}"
