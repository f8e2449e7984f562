#!/usr/bin/env bash
# One batched check on a GPU host (two GPUs for the helper gates), from the repository root after
# scripts/gather-libs: the CUDA kernel tests, scripts/gpu-check.sh (fixtures, exactness, graphs,
# cuBLAS), strata bench --kernels, the host expert arena on the qwen3-30b-a3b preset
# (scripts/gpu-arena.sh, which also makes the model), and the prompt path with cuBLAS off and on.
# Each part has a time cap and writes its log to $OUT as it goes. Prints a short table last.
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
out=${OUT:-/tmp}
mkdir -p "$out"
rows=()
timeout 60 "$C/tests/test_cuda_kernels" > "$out/kernels.log" 2>&1
rows+=("test_cuda_kernels: $(tail -n 1 "$out/kernels.log")")
grep -E "^FAIL" "$out/kernels.log" | head -n 10
mkdir -p /tmp/gc /tmp/ar
OUT=/tmp/gc timeout "${GC_CAP:-150}" scripts/gpu-check.sh > "$out/gpu-check.log" 2>&1
rows+=("gpu-check.sh: exit $?")
sed -n '/===== summary/,$p' "$out/gpu-check.log" | tail -n +2 | while read -r l; do echo "  $l"; done > "$out/gc-summary.txt"
timeout 45 "$S" bench --kernels --threads 16 > "$out/bench-kernels.txt" 2>&1
rows+=("bench --kernels: exit $?")
OUT=/tmp/ar N=16 ADAPT=0 timeout "${AR_CAP:-130}" scripts/gpu-arena.sh > "$out/arena.log" 2>&1
rows+=("gpu-arena.sh: exit $?")
for cb in 0 1; do
  STRATA_CUBLAS=$cb timeout 45 "$S" bench -m models/q30b-q8_0.gguf --prompt 2048 --decode 8 --expert-profile models/q30b.profile \
    --expert-cache 6144 > "$out/cublas$cb.txt" 2>&1
  rows+=("STRATA_CUBLAS=$cb, qwen3-30b-a3b Q8_0, all 6144 pairs cached: $(grep -E '^(prompt|decode) ' "$out/cublas$cb.txt" | awk '{printf "%s %s tok/s; ", $1, $5}')")
done
echo "===== summary"
printf '%s\n' "${rows[@]}"
cat "$out/gc-summary.txt"
sed -n '/===== summary/,$p' "$out/arena.log"
grep -E "^(format|q8_0|q4_0|q4_1|q5_0|q5_1|q2_K|q3_K|q4_K|q5_K|q6_K|iq|host)" "$out/bench-kernels.txt"
