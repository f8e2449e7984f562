#!/usr/bin/env bash
# One call on nvidia-h200 for issue #22's first measurement: how much of the prompt path (every
# expert on the GPU) the GEMMs' arithmetic and the 512-token chunk are. With CUDA_TESTS=1 (the
# default) test_cuda_kernels and the fixture comparisons on CUDA0 with the defaults
# (test_forward_ref), then `strata bench
# --prompt 512,4096 --decode 0 -r 3` on the qwen3-30b-a3b Q8_0 model (bench/vs-llama.sh model)
# for each variant in VARIANTS (';'-separated: environment assignments and strata flags), then,
# with DECODE24=1, the 24 GB row's decode (--gpu-mem GPU_MEM, default 21.25; depths 0,4096).
# After scripts/gather-libs; carry carry/. Builds nothing.
set -u
cd "$(dirname "$0")/.."
C=$PWD/carry W=/tmp/vs-llama S=${STRATA:-$PWD/carry/strata}
mkdir -p "$W"
export LD_LIBRARY_PATH=$C/lib STARPU_SILENT=1 STARPU_HOME=$W/starpu-home
if [ "${CUDA_TESTS:-1}" = 1 ]; then
  echo "== test_cuda_kernels"
  timeout 120 "$C/tests/test_cuda_kernels" > "$W/ck.log" 2>&1
  echo "   exit $?: $(tail -n 1 "$W/ck.log")"
  grep -E "^FAIL|tensor-core" "$W/ck.log" | head -n 8
  echo "== fixtures on CUDA0, defaults"
  STRATA_FIXTURES=$C/fixtures timeout 150 "$C/tests/test_forward_ref" > "$W/fr.log" 2>&1
  echo "   exit $?: $(tail -n 1 "$W/fr.log")"
  grep -E "^FAIL" "$W/fr.log" | head -n 8
  cp "$W/fr.log" "$W/ck.log" "${OUT:-/tmp}/" 2>/dev/null
fi
bench/vs-llama.sh model > /dev/null 2>&1 || { echo "no model"; exit 1; }
IFS=';' read -ra variants <<< "${VARIANTS:-STRATA_MMQ=0;default;--prefill 4096}"
for v in "${variants[@]}"; do
  envs=() flags=()
  for w in $v; do case $w in default) ;; *=*) envs+=("$w") ;; *) flags+=("$w") ;; esac; done
  echo "== prompt, $v"
  t0=$SECONDS
  env "${envs[@]}" timeout 200 "$S" bench -m "$W/q30b-q8_0.gguf" --json -r 3 --prompt 512,4096 --decode 0 \
    --expert-profile "$W/q30b.profile" --expert-cache auto "${flags[@]}" 2> "$W/prompt.err" \
    | grep -E '"test"' | sed -E 's/("tok_s": [0-9.]+).*("tok_s_runs": [^]]*\]).*/\1 ... \2/'
  echo "   $((SECONDS - t0)) s"
  grep -iE "error|refus" "$W/prompt.err" | head -n 3
done
[ "${DECODE24:-1}" = 1 ] || exit 0
echo "== 24 GB class decode, --gpu-mem ${GPU_MEM:-21.25}"
timeout 150 "$S" bench -m "$W/q30b-q8_0.gguf" --json -r 3 --prompt 0 --decode 64 --depth 0,4096 \
  --expert-profile "$W/q30b.profile" --expert-cache auto --gpu-mem "${GPU_MEM:-21.25}" 2> /dev/null \
  | grep -E '"test"' | sed -E 's/("tok_s": [0-9.]+).*("tok_s_runs": [^]]*\]).*/\1 ... \2/'
