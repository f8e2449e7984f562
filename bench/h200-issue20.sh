#!/usr/bin/env bash
# One call on nvidia-h200 for issue #20, from the repository root after scripts/gather-libs and
# `bench/vs-llama.sh pack` (builds nothing of strata; `xz carry/tokenizer.json` keeps carry/ under
# the 64 MiB a call takes: gpu-lib.sh and vs-llama.sh read the .xz): starts llama.cpp's build in the background
# and makes the qwen3-30b-a3b Q8_0 model (bench/vs-llama.sh build model); while llama.cpp compiles,
# the untimed checks: the CUDA kernel tests and the decode step against the per-task path, bitwise,
# on FIXTURES with the cache off, half and full (scripts/gpu-step.sh STEPS="1 2"), and zero-
# configuration GPU use twice on the model (scripts/gpu-learn.sh, LEARN=0 skips it); then, once the
# build is done, strata's and llama.cpp's decode rows in this one job (bench/vs-llama.sh QUICK=1
# strata llama report) and the table.
# Environment: ROWS (default "gpu 24gb cpu"), QUICK_DEPTHS (the 24 GB row's depths, default 0),
# CHECK_NCPU (CPU workers of the checks, default 4, so that they take less from the compile), GPU_MEM (strata's --gpu-mem for the 24 GB row, GiB,
# default 21.25: its nvidia-smi peak then sits at llama.cpp's -ncmoe 17 peak of about 21,100 MiB),
# FIXTURES (default "tiny-qwen3moe-q8_0 small-qwen3moe-q4_k_m"), LEARN (1), LLAMA (1; 0: strata's rows
# alone, no llama.cpp build, for a re-measure within the same lease).
set -u
cd "$(dirname "$0")/.."
export W=/tmp/vs-llama
t0=$SECONDS
if [ "${LLAMA:-1}" = 1 ]; then bench/vs-llama.sh build model; else bench/vs-llama.sh model; fi
STARPU_NCPU=${CHECK_NCPU:-4} FIXTURES=${FIXTURES:-tiny-qwen3moe-q8_0 small-qwen3moe-q4_k_m} STEPS="1 2" W=/tmp/gpu-step \
  scripts/gpu-step.sh 2>&1 \
  | sed -n '/^== gpu-step/,$p'
echo "checks done at $((SECONDS - t0)) s"
[ "${LEARN:-1}" = 1 ] && W=/tmp/gpu-step scripts/gpu-learn.sh "$W/q30b-q8_0.gguf" 16
echo "learn done at $((SECONDS - t0)) s"
phases="strata llama report"
[ "${LLAMA:-1}" = 1 ] || phases="strata report"
QUICK=1 ROWS=${ROWS:-gpu 24gb cpu} GPU_MEM=${GPU_MEM:-21.25} bench/vs-llama.sh $phases
echo "all done at $((SECONDS - t0)) s"
