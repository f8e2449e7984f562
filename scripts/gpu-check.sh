#!/usr/bin/env bash
# Run on a GPU host from the repository root, after scripts/gather-libs (carry/ travels with the
# tree). Builds nothing. 1) the fixture comparisons (tests/test_forward_ref) with the dense work on
# CUDA0 and the primary cache off, half and full; 2) the exactness gate: the same greedy command
# twice, and all experts cached under eager vs dmda with --adapt-swaps 0, byte-identical; an
# adaptive run for the swap log. Prints a short table last.
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
M=$C/fixtures/models
out=${OUT:-/tmp}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
rows=()
FIXTURES=$PWD/$C/fixtures "$C/tests/test_forward_ref" > "$out/forward_ref.log" 2>&1
rows+=("fixture comparisons (tiny BF16, tiny Q8_0, small Q4_K_M) on CUDA0, cache off/half/full: $(tail -n 1 "$out/forward_ref.log") (exit $?)")
grep -E "^(FAIL|SKIP)" "$out/forward_ref.log" | head -n 20

"$C/tests/test_cuda_kernels" > "$out/cuda_kernels.log" 2>&1
rows+=("CUDA weight decoder vs CPU dequantisation: $(tail -n 1 "$out/cuda_kernels.log")")
grep FAIL "$out/cuda_kernels.log"
printf 'The quick brown fox jumps over the lazy dog.\nMixture-of-experts models route every token.\n' > "$out/calib.txt"
"$S" profile -m "$M/tiny-qwen3moe-q8_0.gguf" -f "$out/calib.txt" -o "$out/tiny.profile" 2>&1 | tail -n 1
gen() { "$S" generate -m "$M/tiny-qwen3moe-q8_0.gguf" -p "Explain why the sky is blue." -n 32 --temp 0 --ignore-eos \
        --print-ids --expert-profile "$out/tiny.profile" "$@"; }
a=$(STARPU_SCHED=eager gen --expert-cache 64 2>"$out/a.err"); b=$(STARPU_SCHED=eager gen --expert-cache 64 2>/dev/null)
c=$(STARPU_SCHED=dmda gen --expert-cache 64 --adapt-swaps 0 2>/dev/null)
tail -n 6 "$out/a.err"
[ -n "$a" ] && [ "$a" = "$b" ] && r=PASS || r="FAIL ($a vs $b)"
rows+=("exactness: same command twice, all 64 experts cached: $r")
[ -n "$a" ] && [ "$a" = "$c" ] && r=PASS || r="FAIL ($a vs $c)"
rows+=("exactness: all cached eager vs dmda --adapt-swaps 0: $r")
d=$(STARPU_SCHED=eager gen --expert-cache 16 --adapt-swaps 4 --adapt-interval 8 2>"$out/d.err")
grep -c "adapt:" "$out/d.err" | sed 's/^/adaptive swaps logged: /'
rows+=("adaptive: 16 slots, --adapt-swaps 4: $(grep -c 'adapt:' "$out/d.err") swaps logged; $(grep 'routed entries' "$out/d.err")")
e=$(STARPU_NCUDA=0 "$S" generate -m "$M/tiny-qwen3moe-q8_0.gguf" -p "Explain why the sky is blue." -n 32 --temp 0 --ignore-eos --print-ids 2>/dev/null)
rows+=("greedy ids CPU-only vs CUDA0 all cached: $([ "$a" = "$e" ] && echo identical || echo "differ (allowed across device kinds): $e")")
echo "===== summary"
printf '%s\n' "${rows[@]}"
