#!/usr/bin/env bash
# On the GPU machine after scripts/gather-libs: the kernel table, then strata bench on the
# qwen3-30b-a3b preset (Q8_0) for CPU only, the 24 GB budget and every expert cached.
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
"$S" bench --kernels --threads 16
model=/tmp/q30b.gguf
STRATA_TOKENIZER_JSON=$C/tokenizer.json "$S" mkmodel -q -o $model --preset qwen3-30b-a3b --type q8_0
yes 'The history of mixture of experts models and their routing.' | head -n 40 > /tmp/calib30.txt
"$S" profile -m $model -f /tmp/calib30.txt -o /tmp/q30b.profile 2>&1 | tail -n 1
run() { local name=$1; shift; echo "== $name"; timeout 200 "$S" bench -m $model "$@" 2>&1 | grep -v '^\s*$' | tail -n 6; }
STARPU_NCUDA=0 run "CPU only (15 CPU workers)" --prompt 64 --decode 16 --roofline
run "24 GB budget: 4000 of 6144 pairs cached" --prompt 512 --decode 32 --depth 0,1024 --roofline --expert-profile /tmp/q30b.profile --expert-cache 4000
run "all 6144 pairs cached" --prompt 512 --decode 32 --depth 0,1024 --roofline --expert-profile /tmp/q30b.profile --expert-cache 6144
