#!/usr/bin/env bash
# The CPU expert-row kernels on a GPU host (issue #5's 80 % target): run from the repository root
# after scripts/gather-libs (carry/ travels with the tree); builds nothing. Prints the CPU
# (lscpu: cores, threads per core, caches, the AVX-512 flags the kernels use), runs
# tests/test_quant there (scalar / AVX2 / VNNI / VNNI + VBMI bitwise equal on that CPU), then
# `strata bench --kernels` RUNS times (default 1) at each thread count of THREADS (default "16";
# FORMATS, ISA, ROW, LOOKUP and PAIRS, if set, are passed as --formats, --isa, --row-length,
# --grid-lookup and --row-pairs), and prints the int8 GB/s and share of the host read per format, run and thread
# count last. Full outputs under $OUT (or /tmp).
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1
out=${OUT:-/tmp}
lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|L1d|L2|L3|NUMA node\(s\))" | tee "$out/lscpu.txt"
echo "flags: $(grep -o -w -E 'avx512f|avx512bw|avx512vl|avx512_vnni|avx512vbmi|avx512_vbmi2|gfni|avx_vnni|amx_tile|amx_int8|avx512_bf16|avx512_fp16' /proc/cpuinfo | sort -u | tr '\n' ' ')" | tee -a "$out/lscpu.txt"
echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null), defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null)" | tee -a "$out/lscpu.txt"
"$C/tests/test_quant" > "$out/test_quant.log" 2>&1
echo "test_quant: $(tail -n 1 "$out/test_quant.log")"
fmt=()
[ -n "${FORMATS:-}" ] && fmt+=(--formats "$FORMATS")
[ -n "${ISA:-}" ] && fmt+=(--isa "$ISA")
[ -n "${ROW:-}" ] && fmt+=(--row-length "$ROW")
[ -n "${LOOKUP:-}" ] && fmt+=(--grid-lookup "$LOOKUP")
[ -n "${PAIRS:-}" ] && fmt+=(--row-pairs "$PAIRS")
runs=${RUNS:-1}
for r in $(seq "$runs"); do
  for t in ${THREADS:-16}; do
    "$C/strata" bench --kernels --threads "$t" ${fmt[@]+"${fmt[@]}"} > "$out/kernels-$t-$r.txt" 2>&1
    echo "threads $t, run $r: exit $?"
  done
done
echo
echo "int8 GB/s (median share of the read in the same rounds) per thread count and run"
printf '%-8s' format
for t in ${THREADS:-16}; do for r in $(seq "$runs"); do printf ' %20s' "$t thr, run $r"; done; done
echo
first=${THREADS:-16}
first=${first%% *}
# the format rows: a name, then bits per weight (a number)
for f in $(awk 'NF >= 9 && $2 ~ /^[0-9]+[.][0-9]+$/ {print $1}' "$out/kernels-$first-1.txt"); do
  printf '%-8s' "$f"
  for t in ${THREADS:-16}; do
    for r in $(seq "$runs"); do
      awk -v f="$f" '$1 == f { if ($6 == "-") printf " %20s", "-"; else printf " %11s (%6s)", $6, $7 }' "$out/kernels-$t-$r.txt"
    done
  done
  echo
done
