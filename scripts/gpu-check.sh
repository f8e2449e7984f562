#!/usr/bin/env bash
# Run on a GPU host from the repository root, after scripts/gather-libs (carry/ travels with the
# tree). Builds nothing. 1) the fixture comparisons (tests/test_forward_ref) with the dense work on
# CUDA0 and the primary cache off, half and full; 2) the exactness gate: the same greedy command
# twice, and all experts cached under eager vs dmda with --adapt-swaps 0, byte-identical (also for
# gpt-oss's fixtures, and with its experts on the CPU pool; ONLY=archs: 1), its gates, stop); an
# adaptive run for the swap log; 3) CUDA graphs (--cuda-graphs on vs off): byte-identical greedy
# output and bitwise-identical logits over 300 one-token steps, and strata bench --cuda-graphs
# both on the small fixture (GRAPHS_BENCH_MODEL=FILE benches that model too, with
# GRAPHS_BENCH_ARGS added); 4) cuBLAS on the prompt path (STRATA_CUBLAS=0 vs default, run to run
# and, on two GPUs, helper vs CUDA0); the defaults (TF32 GEMMs, Q8_0 experts on the tensor cores)
# run to run bitwise, and the float32 path (STRATA_CUBLAS_TF32=0 STRATA_INT8_DOT=0: the fixtures'
# tight float32 bound). Prints a short table last.
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
M=$C/fixtures/models
out=${OUT:-/tmp}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
rows=()
STRATA_FIXTURES=$PWD/$C/fixtures "$C/tests/test_forward_ref" > "$out/forward_ref.log" 2>&1
rows+=("fixture comparisons (tiny BF16, tiny Q8_0, small Q4_K_M) on CUDA0, cache off/half/full: $(tail -n 1 "$out/forward_ref.log") (exit $?)")
grep -E "^(FAIL|SKIP)" "$out/forward_ref.log" | head -n 20

"$C/tests/test_cuda_kernels" > "$out/cuda_kernels.log" 2>&1
rows+=("CUDA weight decoder vs CPU dequantisation: $(tail -n 1 "$out/cuda_kernels.log")")
grep FAIL "$out/cuda_kernels.log"
printf 'The quick brown fox jumps over the lazy dog.\nMixture-of-experts models route every token.\n' > "$out/calib.txt"
# 1b) gpt-oss on CUDA0 (test_forward_ref above compared its fixtures with the cache off, half and
# full): the exactness gate on its tiny fixtures, the same greedy command twice and eager vs dmda
# with every expert cached, and twice with the experts on the CPU pool (the mailbox); ONLY=archs
# stops after this part.
# glm4moe and deepseek2 the same (on the GPU by default since 2026-12-05).
A=$C/fixtures/archs
afs="tiny-gpt-oss-q8_0 tiny-gpt-oss-bf16 tiny-glm4moe-q8_0 tiny-glm4moe-bf16 tiny-deepseek2-q8_0 tiny-deepseek2-bf16"
for af in $afs; do
  "$S" profile -m "$A/$af.gguf" -f "$out/calib.txt" -o "$out/$af.profile" > /dev/null 2>&1
  agen() { "$S" generate -m "$A/$af.gguf" -p "Explain why the sky is blue." -n 32 --temp 0 --ignore-eos --print-ids \
           --expert-profile "$out/$af.profile" "$@"; }
  a=$(STARPU_SCHED=eager agen --expert-cache auto 2>"$out/$af-a.err"); b=$(STARPU_SCHED=eager agen --expert-cache auto 2>/dev/null)
  c=$(STARPU_SCHED=dmda agen --expert-cache auto --adapt-swaps 0 2>/dev/null)
  p=$(STARPU_SCHED=eager agen --expert-cache 0 2>"$out/$af-p.err"); q=$(STARPU_SCHED=dmda agen --expert-cache 0 2>/dev/null)
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && r=PASS || r="FAIL ($a / $b / $c; $(tail -n 2 "$out/$af-a.err" | tr '\n' ' '))"
  rows+=("$af on CUDA0, every expert cached: same command twice and eager vs dmda byte-identical: $r")
  [ -n "$p" ] && [ "$p" = "$q" ] && r=PASS || r="FAIL ($p / $q; $(tail -n 2 "$out/$af-p.err" | tr '\n' ' '))"
  rows+=("$af, dense on CUDA0 and experts on the CPU pool: eager vs dmda byte-identical: $r")
done
# MXFP4 experts (no fixture file): a gpt-oss model from strata mkmodel (hidden and expert FFN 1344:
# a chunk and a partial one per row), the last logits of a 300-token prompt on CUDA0 (every expert
# cached: the float32 MXFP4 kernels, and with STRATA_MXFP4_INT8=1 the int8 ones; none cached: the
# CPU pool through the mailbox) against the CPU alone (int8 activations), so the bound is the int8
# path's (mean |Δ|/σ 0.05, the same argmax)
mx=/tmp/strata-gpu-check; mkdir -p "$mx"
tok=$PWD/$C/tokenizer.json; [ -f "$tok" ] || { xz -dc "$tok.xz" > "$mx/tokenizer.json"; tok=$mx/tokenizer.json; }
STRATA_TOKENIZER_JSON=$tok "$S" mkmodel -q -o "$mx/gpt-oss-mxfp4.gguf" --preset tiny-gpt-oss --expert-type mxfp4 --hidden 1344 --expert-ffn 1344 2>/dev/null
ids300=$(seq -s, 100 399)
mxeval() { "$S" eval -m "$mx/gpt-oss-mxfp4.gguf" -c 512 --prompt-ids "$ids300" --logits-out "$@"; }
STARPU_NCUDA=0 mxeval "$mx/cpu.f32" 2>/dev/null
mxeval "$mx/gpu.f32" --expert-cache auto 2>"$out/mxfp4-gpu.err"
STRATA_MXFP4_INT8=1 mxeval "$mx/gpu8.f32" --expert-cache auto 2>"$out/mxfp4-gpu8.err"
mxeval "$mx/pool.f32" --expert-cache 0 2>/dev/null
for v in gpu gpu8 pool; do
  case $v in gpu) what="every expert cached" ;; gpu8) what="every expert cached, STRATA_MXFP4_INT8=1" ;; *) what="experts on the CPU pool" ;; esac
  rows+=("MXFP4 gpt-oss (mkmodel, hidden 1344), CUDA0 $what vs CPU alone: $(python3 - "$mx/cpu.f32" "$mx/$v.f32" <<'PY'
import sys, struct, math
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
if not a or len(a) != len(b): print("FAIL (missing logits)"); sys.exit()
n = len(a) // 4; x = struct.unpack("%df" % n, a); y = struct.unpack("%df" % n, b)
m = sum(x) / n; sd = math.sqrt(sum((v - m) ** 2 for v in x) / n)
d = sum(abs(p - q) for p, q in zip(x, y)) / n / sd
ax = max(range(n), key=lambda i: x[i]); ay = max(range(n), key=lambda i: y[i])
print("%s mean |Δ|/σ %.4f (≤ 0.05), argmax %d / %d" % ("PASS" if d <= 0.05 and ax == ay else "FAIL", d, ax, ay))
PY
)")
done
if [ "${ONLY:-}" = archs ]; then
  echo "===== summary"
  printf '%s\n' "${rows[@]}"
  exit 0
fi
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
# 3) CUDA graphs: replaying the decode path's dense tasks as graphs must give the same bytes.
g_on=$(STARPU_SCHED=eager gen --expert-cache 64 --cuda-graphs on 2>"$out/g_on.err")
g_off=$(STARPU_SCHED=eager gen --expert-cache 64 --cuda-graphs off 2>/dev/null)
[ -n "$g_on" ] && [ "$g_on" = "$g_off" ] && r=PASS || r="FAIL ($g_on vs $g_off)"
grep -Eq "^cuda graphs: .* [1-9][0-9]* launches, 0 fallbacks" "$out/g_on.err" || r="$r; FAIL: no graph launched or a fallback"
rows+=("--cuda-graphs on vs off: byte-identical greedy output (all 64 experts cached): $r")
rows+=("  $(grep '^cuda graphs:' "$out/g_on.err")")
g_on=$(STARPU_SCHED=eager "$S" generate -m "$M/tiny-qwen3moe-q8_0.gguf" -p "Explain why the sky is blue." -n 32 --temp 0 \
       --ignore-eos --print-ids --cuda-graphs on --expert-cache 0 2>/dev/null)
g_off=$(STARPU_SCHED=eager "$S" generate -m "$M/tiny-qwen3moe-q8_0.gguf" -p "Explain why the sky is blue." -n 32 --temp 0 \
        --ignore-eos --print-ids --cuda-graphs off --expert-cache 0 2>/dev/null)
[ -n "$g_on" ] && [ "$g_on" = "$g_off" ] && r=PASS || r="FAIL ($g_on vs $g_off)"
rows+=("--cuda-graphs on vs off: byte-identical greedy output (no cache: experts on the CPU pool): $r")
# --prefill 1 runs every prompt token as a one-token step (the graph path); 300 steps cross the
# attention's 256-key chunk, so the update path sees a grid change.
ids=$(seq -s, 100 399)
for mf in tiny-qwen3moe-q8_0 small-qwen3moe-q4_k_m; do
  for g in on off; do
    "$S" eval -m "$M/$mf.gguf" -c 512 --prompt-ids "$ids" --prefill 1 --all-logits --logits-out "$out/logits-$mf-$g.f32" \
      --cuda-graphs $g --expert-cache 0 2>"$out/eval-$mf-$g.err"
  done
  [ -s "$out/logits-$mf-on.f32" ] && cmp -s "$out/logits-$mf-on.f32" "$out/logits-$mf-off.f32" && r=PASS || r=FAIL
  rows+=("--cuda-graphs on vs off: bitwise-identical logits, $mf, 300 one-token steps: $r; $(grep '^cuda graphs:' "$out/eval-$mf-on.err")")
done
"$S" bench -m "$M/small-qwen3moe-q4_k_m.gguf" --prompt 0 --decode 64 --depth 0,1024 --cuda-graphs both --expert-cache 0 \
  > "$out/bench-graphs.txt" 2>&1
cat "$out/bench-graphs.txt"
while read -r line; do rows+=("small Q4_K_M bench: $line"); done < <(grep "^cuda graphs, decode" "$out/bench-graphs.txt")
if [ -n "${GRAPHS_BENCH_MODEL:-}" ]; then
  "$S" bench -m "$GRAPHS_BENCH_MODEL" --prompt 0 --decode 64 --depth 0,1024 --cuda-graphs both ${GRAPHS_BENCH_ARGS:-} \
    > "$out/bench-graphs-model.txt" 2>&1
  cat "$out/bench-graphs-model.txt"
  while read -r line; do rows+=("$(basename "$GRAPHS_BENCH_MODEL") bench: $line"); done \
    < <(grep "^cuda graphs, decode" "$out/bench-graphs-model.txt")
fi
# 4) cuBLAS on the prompt path (STRATA_CUBLAS, doc/tuning.md): the small fixture's comparisons with
# the float32 kernels only (0) and with cuBLAS from 32 rows (the default); a 300-token prompt (one
# chunk) with every expert cached, twice with cuBLAS: bitwise-identical logits; the same with
# STRATA_CUBLAS=0 (differs by rounding); on two GPUs, the experts on a helper card instead of CUDA0.
# 4b) the float32 path's fixtures and the defaults' repeatability.
for cb in 0 1; do
  STRATA_CUBLAS=$cb STRATA_FIXTURES=$PWD/$C/fixtures "$C/tests/test_forward_ref" small > "$out/forward_ref_cublas$cb.log" 2>&1
  st=$?
  rows+=("small Q4_K_M fixture, STRATA_CUBLAS=$cb: $(tail -n 1 "$out/forward_ref_cublas$cb.log") (exit $st)")
  grep -E "^FAIL" "$out/forward_ref_cublas$cb.log" | head -n 10
done
cbeval() { STARPU_SCHED=eager "$S" eval -m "$M/tiny-qwen3moe-q8_0.gguf" -c 512 --prompt-ids "$ids" --all-logits \
           --expert-profile "$out/tiny.profile" --logits-out "$@"; }
cbeval "$out/logits-cublas-a.f32" --expert-cache 64 2>"$out/eval-cublas-a.err"
cbeval "$out/logits-cublas-b.f32" --expert-cache 64 2>/dev/null
STRATA_CUBLAS=0 cbeval "$out/logits-cublas-0.f32" --expert-cache 64 2>/dev/null
[ -s "$out/logits-cublas-a.f32" ] && cmp -s "$out/logits-cublas-a.f32" "$out/logits-cublas-b.f32" && r=PASS || r=FAIL
cmp -s "$out/logits-cublas-a.f32" "$out/logits-cublas-0.f32" && r0=identical || r0="differ (rounding: another summation order)"
rows+=("prompt path defaults (TF32 GEMMs, Q8_0 experts on the tensor cores), tiny Q8_0, 300 tokens, all 64 experts cached: same command twice bitwise identical: $r; vs STRATA_CUBLAS=0: $r0")
# 4b) the float32 path (STRATA_CUBLAS_TF32=0 STRATA_INT8_DOT=0): every fixture, the tight float32
# bound included; the defaults' run to run bits are the cuBLAS rows above (TF32 GEMMs, Q8_0
# experts on the tensor cores)
STRATA_CUBLAS_TF32=0 STRATA_INT8_DOT=0 STRATA_FIXTURES=$PWD/$C/fixtures "$C/tests/test_forward_ref" > "$out/forward_ref_f32.log" 2>&1
st=$?
rows+=("fixture comparisons on the float32 path (STRATA_CUBLAS_TF32=0 STRATA_INT8_DOT=0, tight bound): $(tail -n 1 "$out/forward_ref_f32.log") (exit $st)")
grep -E "^FAIL" "$out/forward_ref_f32.log" | head -n 10
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  cbeval "$out/logits-cublas-h.f32" --expert-cache-device1 64 2>"$out/eval-cublas-h.err"
  [ -s "$out/logits-cublas-h.f32" ] && cmp -s "$out/logits-cublas-a.f32" "$out/logits-cublas-h.f32" && r=PASS || r=FAIL
  rows+=("cuBLAS prompt path: experts on CUDA1 (helper) vs CUDA0, bitwise-identical logits: $r")
fi
echo "===== summary"
printf '%s\n' "${rows[@]}"
