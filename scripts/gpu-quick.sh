#!/usr/bin/env bash
# On nvidia-h200 after scripts/gather-libs (builds nothing): the shortest call that both checks and
# times the decode step, for a lease with little device time left: the CUDA kernel tests, the decode
# step against the per-task path on the fixtures (scripts/gpu-step.sh STEPS="1 2"), then strata's
# decode rows ROWS (default "gpu": every expert cached) on the qwen3-30b-a3b Q8_0 model
# (bench/vs-llama.sh model, QUICK=1 strata report). No llama.cpp: compare with a job that ran it.
set -u
cd "$(dirname "$0")/.."
STEPS="1 2" timeout "${CHECK_S:-150}" scripts/gpu-step.sh 2>&1 | grep -E '^ROW'
export W=${W:-/tmp/vs-llama}
bench/vs-llama.sh model > /dev/null 2>&1
QUICK=1 ROWS=${ROWS:-gpu} bench/vs-llama.sh strata report 2>&1 | grep -v "filling the CUDA0" | tail -n 12
