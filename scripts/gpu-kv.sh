#!/usr/bin/env bash
# On a GPU host from the repository root, after scripts/gather-libs (builds nothing): the KV cache's
# two element types (--cache-type-k/-v f32 and f16) on CUDA0.
#  1. tests/test_cuda_kernels (attention of both types against float64, and their TIME lines);
#  2. the decode step against the per-task path, bitwise over 300 steps, for both types
#     (scripts/gpu-step.sh step 2 with KVS="f32 f16"; FIXTURES and CACHES as there), and
#     test_forward_ref on CUDA0 (its pass 4 is the f16 cache);
#  3. bench/attn-bench (carry/attn/main.xz when present) with KV=f32 and KV=f16, mode 0.
# Prints a table last.
set -u
. "$(dirname "$0")/gpu-lib.sh"
KVS="f32 f16" STEPS="1 2" bash "$(dirname "$0")/gpu-step.sh" 2>&1 | tee "$out/step.log" | grep -E "^ROW|^FAIL|TIME decode attention" | head -n 60
if [ -f "$C/attn/main.xz" ]; then
  xz -dc "$C/attn/main.xz" > "$W/attn-bench" && chmod +x "$W/attn-bench"
  for kv in f32 f16; do echo "== attn-bench KV=$kv"; KV=$kv MODE=0 timeout 60 "$W/attn-bench" 10 | tail -n +2; done
fi
