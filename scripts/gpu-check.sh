#!/usr/bin/env bash
# Run on a GPU host from the repository root, after scripts/gather-libs (carry/ travels with
# the tree). Builds nothing. Checks that the CPU-built binary runs where StarPU finds CUDA
# devices (the combine codelet has a CUDA variant), that logits are bitwise identical with and
# without CUDA workers, then measures the CPU pool on the host's cores with a qwen3-30b-a3b
# shape cut to 8 layers. Prints a short table last.
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
F=$C/fixtures
out=${OUT:-/tmp}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nproc
ids="785, 3974, 293, 4830, 282, 5131, 7784, 82, 916, 279, 1187, 4246, 5562, 13"
want="[6841, 6004, 3427, 4124, 2332, 1561, 6252, 3073, 3427, 4124, 2332, 1561, 6252, 3073, 3427, 452]"
rows=()
for sched in eager dmda; do
  got=$(STARPU_SCHED=$sched "$S" generate -m "$F/tiny-qwen3moe-bf16.gguf" --prompt-ids "$ids" -n 16 --temp 0 \
        --print-ids --ignore-eos 2>"$out/gen-$sched.err")
  tail -n 4 "$out/gen-$sched.err"
  [ "$got" = "$want" ] && r=PASS || r="FAIL ($got)"
  rows+=("greedy tiny-bf16, CUDA workers on, $sched: $r; $(grep -o 'executed per worker:.*' "$out/gen-$sched.err")")
done
STARPU_NCUDA=0 "$S" eval -m "$F/tiny-qwen3moe-bf16.gguf" --prompt-ids "$ids" --logits-out "$out/cpu.f32" 2>/dev/null
STARPU_SCHED=eager "$S" eval -m "$F/tiny-qwen3moe-bf16.gguf" --prompt-ids "$ids" --logits-out "$out/gpu.f32" 2>/dev/null
cmp -s "$out/cpu.f32" "$out/gpu.f32" && r=PASS || r=FAIL
rows+=("logits STARPU_NCUDA=0 vs CUDA workers on (eager): bitwise $r")
t0=$SECONDS
STRATA_TOKENIZER_JSON=$C/tokenizer.json "$S" mkmodel -q -o /tmp/bench-30b-8l.gguf --preset qwen3-30b-a3b --layers 8 --type q8_0
rows+=("mkmodel qwen3-30b-a3b --layers 8 q8_0: $((SECONDS - t0)) s")
for n in 16 8; do
  tab=$(STARPU_NCUDA=0 STARPU_NCPU=$n SCHEDS="lws eager" REPEAT=3 STRATA="$S" bench/generate.sh /tmp/bench-30b-8l.gguf 128 64 2>/dev/null)
  rows+=("CPU pool, STARPU_NCUDA=0 STARPU_NCPU=$n, 30b-8L q8_0, 128-token prompt, 64 generated (median of 3):")
  while IFS= read -r l; do rows+=("  $l"); done <<< "$tab"
done
echo "===== summary"
printf '%s\n' "${rows[@]}"
