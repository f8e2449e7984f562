#!/usr/bin/env bash
# On the GPU machine after scripts/gather-libs: decode speed at several context depths with every
# expert cached and with the 24 GB budget (split-K attention), on the qwen3-30b-a3b preset.
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
model=/tmp/q30b.gguf
[ -f $model ] || STRATA_TOKENIZER_JSON=$C/tokenizer.json "$S" mkmodel -q -o $model --preset qwen3-30b-a3b --type q8_0
yes 'The history of mixture of experts models and their routing.' | head -n 40 > /tmp/calib30.txt
[ -f /tmp/q30b.profile ] || "$S" profile -m $model -f /tmp/calib30.txt -o /tmp/q30b.profile 2>&1 | tail -n 1
for n in 6144 4000; do
  echo "== $n of 6144 pairs cached"
  timeout 200 "$S" bench -m $model --prompt 512 --decode 32 --depth 0,1024,4096 --roofline \
    --expert-profile /tmp/q30b.profile --expert-cache $n 2>&1 | grep -v '^\s*$' | tail -n 7
done
