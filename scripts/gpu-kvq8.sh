#!/usr/bin/env bash
# On a GPU host from the repository root, after scripts/gather-libs (builds nothing): the q8_0 KV
# cache (--cache-type-k/-v q8_0) on CUDA0 (issue #20's depth row).
#  1. tests/test_cuda_kernels: its q8_0 lines (the GPU's quantiser against the CPU's bitwise, the
#     attention against float64, the decode step against the per-task kernels bitwise) and every FAIL;
#     test_forward_ref on CUDA0 (its fifth pass: the q8_0 cache on the fixtures with heads of 32);
#  2. a small qwen3moe model with head_dim 128 (Qwen3-30B-A3B's; the fixtures' q8_0 passes in
#     test_forward_ref have heads of 32): the decode step against the per-task path over 300 one-token
#     steps, bitwise (experts off and all cached); the same run twice, bitwise; the logits of a
#     300-token prompt against the same cache type on CPU workers and against f16 and f32 on CUDA0
#     (mean |Δ|/σ over every position, argmax agreement);
#  3. speed on the qwen3-30b-a3b preset (Q8_0; every expert cached): decode at depth 0 and 32768,
#     f16 and q8_0, and prompt 4096 with each (SKIP3=1 skips the step, SKIP12=1 the first two).
# Environment: W work folder (/tmp/gpu-step), R repetitions (3), DECODE tokens (64).
# Prints a table last.
set -u
. "$(dirname "$0")/gpu-lib.sh"
R=${R:-3}
DECODE=${DECODE:-64}
rows=()
add() { rows+=("$1"); echo "ROW $1"; }

if [ "${SKIP12:-0}" != 1 ]; then
t0=$SECONDS
timeout 400 "$C/tests/test_cuda_kernels" > "$out/cuda_kernels.log" 2>&1
rc=$?
add "test_cuda_kernels: exit $rc, $(grep -c '^PASS' "$out/cuda_kernels.log") PASS, $(grep -c '^FAIL' "$out/cuda_kernels.log") FAIL ($((SECONDS - t0)) s); q8_0 lines: $(grep 'q8_0' "$out/cuda_kernels.log" | grep -c '^PASS') PASS, $(grep 'q8_0' "$out/cuda_kernels.log" | grep -c '^FAIL') FAIL"
grep -E "^FAIL" "$out/cuda_kernels.log" | head -n 12
grep -E "q8_0" "$out/cuda_kernels.log" | grep -E "pos0=(4096|17000)|position 20000|quantised" | head -n 8
STRATA_FIXTURES=$PWD/$C/fixtures timeout 400 "$C/tests/test_forward_ref" > "$out/forward_ref.log" 2>&1
add "fixture comparisons on CUDA0 (test_forward_ref): $(tail -n 1 "$out/forward_ref.log"); q8_0 KV lines: $(grep 'q8_0 KV' "$out/forward_ref.log" | grep -c '^PASS') PASS, $(grep 'q8_0 KV' "$out/forward_ref.log" | grep -c '^FAIL') FAIL"
grep -E "^FAIL" "$out/forward_ref.log" | head -n 10

# mean |Δ|/σ of two logits files (float32, rows of V values) over every row, and the argmax agreement
cmp_logits() {
  python3 - "$1" "$2" "$3" <<'EOF'
import struct, sys, math
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read(); V = int(sys.argv[3])
n = len(a) // 4
if n == 0 or len(b) != len(a): print("no comparison (sizes %d, %d)" % (len(a), len(b))); sys.exit()
x = struct.unpack('%df' % n, a); y = struct.unpack('%df' % n, b)
rows = n // V; tot = 0.0; agree = 0
for r in range(rows):
    xs = x[r * V:(r + 1) * V]; ys = y[r * V:(r + 1) * V]
    m = sum(ys) / V; sd = math.sqrt(sum((v - m) ** 2 for v in ys) / V) or 1.0
    tot += sum(abs(p - q) for p, q in zip(xs, ys)) / V / sd
    agree += xs.index(max(xs)) == ys.index(max(ys))
print("mean |d|/sigma %.2e over %d positions, argmax equal at %d" % (tot / rows, rows, agree))
EOF
}

m=$(gpu_model kvq8-small --preset tiny --layers 4 --hidden 512 --heads 8 --kv-heads 2 --head-dim 128 --context 8192)
ids=$(seq -s, 100 399)
V=$("$S" eval -m "$m" --prompt-ids 1 --no-learn 2>&1 | sed -n 's/.*vocab \([0-9]*\).*/\1/p' | head -n 1)
V=${V:-151680}
for cache in 0 all; do
  args=(--no-learn --cache-type-k q8_0 --cache-type-v q8_0 -c 1024)
  [ "$cache" = all ] && args+=(--expert-profile "$W/kvq8-small.profile" --expert-cache auto) || args+=(--expert-cache 0)
  for g in 1 0; do
    STRATA_DECODE_GRAPH=$g STARPU_SCHED=eager timeout 120 "$S" eval -m "$m" --prompt-ids "$ids" --prefill 1 --all-logits \
      --logits-out "$W/q8-$g.f32" "${args[@]}" 2>"$W/err-$g"
  done
  [ -s "$W/q8-1.f32" ] && cmp -s "$W/q8-1.f32" "$W/q8-0.f32" && r=PASS || r="FAIL ($(tail -n 2 "$W/err-1" | tr '\n' ' '))"
  add "head_dim 128, experts cached: $cache, q8_0 KV: decode step vs per-task path, 300 steps, logits bitwise: $r"
done
for kv in q8_0 f16 f32; do
  timeout 120 "$S" eval -m "$m" --prompt-ids "$ids" --all-logits --no-learn -c 1024 --cache-type-k $kv --cache-type-v $kv \
    --logits-out "$W/p-$kv.f32" 2>"$W/err-p-$kv" || add "prompt, $kv KV: eval failed: $(tail -n 1 "$W/err-p-$kv")"
done
timeout 120 "$S" eval -m "$m" --prompt-ids "$ids" --all-logits --no-learn -c 1024 --cache-type-k q8_0 --cache-type-v q8_0 \
  --logits-out "$W/p-q8_0-again.f32" 2>/dev/null
cmp -s "$W/p-q8_0.f32" "$W/p-q8_0-again.f32" && r=PASS || r=FAIL
add "head_dim 128, 300-token prompt, q8_0 KV on CUDA0, the same run twice bitwise: $r"
STARPU_NCUDA=0 timeout 300 "$S" eval -m "$m" --prompt-ids "$ids" --all-logits --no-learn -c 1024 --cache-type-k q8_0 \
  --cache-type-v q8_0 --logits-out "$W/p-q8_0-cpu.f32" 2>/dev/null
add "q8_0 KV, CUDA0 vs CPU workers: $(cmp_logits "$W/p-q8_0.f32" "$W/p-q8_0-cpu.f32" "$V")"
add "CUDA0, q8_0 KV vs f16: $(cmp_logits "$W/p-q8_0.f32" "$W/p-f16.f32" "$V")"
add "CUDA0, q8_0 KV vs f32: $(cmp_logits "$W/p-q8_0.f32" "$W/p-f32.f32" "$V")"
add "CUDA0, f16 KV vs f32 (for scale): $(cmp_logits "$W/p-f16.f32" "$W/p-f32.f32" "$V")"
fi

if [ "${SKIP3:-0}" != 1 ]; then
  big=$(gpu_model qwen3-30b-a3b-q8_0 --preset qwen3-30b-a3b --type q8_0)
  for kv in f16 q8_0; do
    timeout 500 "$S" bench -m "$big" --expert-profile "$W/qwen3-30b-a3b-q8_0.profile" --prompt 4096 --decode "$DECODE" \
      --depth 0,32768 -c 32896 -r "$R" --no-learn --cache-type-k $kv --cache-type-v $kv > "$out/bench-$kv.log" 2>&1
    d0=$(sed -n 's/^decode at depth 0, .* (tok\/s): //p' "$out/bench-$kv.log" | head -n 1)
    d32=$(sed -n 's/^decode at depth 32768, .* (tok\/s): //p' "$out/bench-$kv.log" | head -n 1)
    p=$(sed -n 's/^prompt of 4096, .* (tok\/s): //p' "$out/bench-$kv.log" | head -n 1)
    add "qwen3-30b-a3b Q8_0, every expert cached, $kv KV: prompt 4096 [$p] tok/s; decode depth 0 [$d0], depth 32768 [$d32] tok/s"
    grep -iE "error|refus" "$out/bench-$kv.log" | head -n 3
  done
fi

echo
echo "== q8_0 KV cache on CUDA0 =="
for r in "${rows[@]}"; do echo "$r"; done
