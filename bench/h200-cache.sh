#!/usr/bin/env bash
# On the GPU machine, after scripts/gather-libs (builds nothing): writes a qwen3-30b-a3b-preset
# Q8_0 model with strata mkmodel, profiles it, and runs strata bench for CPU only, the primary
# cache off (dense work on CUDA0), a 24 GB-card budget and every expert cached. Tables last.
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
out=${OUT:-/tmp}
LAYERS=${LAYERS:-48}
model=/tmp/q30b.gguf
tiny=$C/fixtures/models/tiny-qwen3moe-q8_0.gguf
printf 'The quick brown fox jumps over the lazy dog.\nMixture-of-experts models route every token.\n' > /tmp/calib.txt
"$S" profile -m "$tiny" -f /tmp/calib.txt -o /tmp/tiny.profile 2>/dev/null
echo "== tiny q8_0, all 64 experts cached"
STARPU_SCHED=eager "$S" bench -m "$tiny" --prompt 64 --decode 64 --expert-profile /tmp/tiny.profile --expert-cache 64 2>&1 | tail -n 3
t0=$SECONDS
STRATA_TOKENIZER_JSON=$C/tokenizer.json "$S" mkmodel -q -o $model --preset qwen3-30b-a3b --layers "$LAYERS" --type q8_0
echo "mkmodel: $((SECONDS - t0)) s"; ls -la $model
python3 -c "print(' '.join(['The history of mixture of experts models and their routing.'] * 40))" > /tmp/calib30.txt 2>/dev/null \
  || yes 'The history of mixture of experts models and their routing.' | head -n 40 > /tmp/calib30.txt
t0=$SECONDS
"$S" profile -m $model -f /tmp/calib30.txt -o /tmp/q30b.profile 2>&1 | tail -n 1
echo "profile: $((SECONDS - t0)) s"
run() { local name=$1; shift; echo "== $name"; t0=$SECONDS; timeout 240 "$S" bench -m $model "$@" 2>&1 | grep -v "^\s*$" | tail -n 9; echo "($((SECONDS - t0)) s)"; }
run "cache off (dense on CUDA0, experts on 15 CPU workers)" --prompt 128 --decode 32 --depth 0
run "24 GB budget: 4000 of 6144 pairs cached" --prompt 512,4096 --decode 64 --depth 0,1024 --roofline \
  --expert-profile /tmp/q30b.profile --expert-cache 4000
run "all 6144 pairs cached" --prompt 512,4096 --decode 64 --depth 0,1024 --roofline --expert-profile /tmp/q30b.profile --expert-cache 6144
for ps in off auto; do
  STARPU_SCHED=dmda run "prompt path, 24 GB budget, STARPU_SCHED=dmda --prompt-stream $ps" --prompt 64,512,2048 --decode 0 \
    --expert-profile /tmp/q30b.profile --expert-cache 4000 --prompt-stream $ps
done
STARPU_NCUDA=0 run "CPU only (16 CPU workers)" --prompt 64 --decode 16 --depth 0 --roofline
