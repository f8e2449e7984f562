# Sourced by scripts/gpu-step.sh, gpu-prof.sh and gpu-ncu.sh on a GPU host, after scripts/gather-libs:
# the carried binary and its libraries (C, S), the work folder (W) and the folder whose files come
# back ($OUT, else W), and gpu_model NAME [MKMODEL-ARGS...], which makes W/NAME.gguf and its profile
# W/NAME.profile (over ~440 tokens) once and prints the model's path.
C=${CARRY:-carry}
CARRY=$C "$(dirname "${BASH_SOURCE[0]}")/carry-unpack" # each call brings carry/ packed
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
W=${W:-/tmp/gpu-step}
out=${OUT:-$W}
mkdir -p "$W" "$out"
gpu_model() {
  local name=$1 tok=$C/tokenizer.json; shift
  [ -f "$tok" ] || { [ -f "$W/tokenizer.json" ] || xz -dc "$tok.xz" > "$W/tokenizer.json"; tok=$W/tokenizer.json; }
  if [ ! -f "$W/$name.gguf" ]; then
    local t0=$SECONDS
    STRATA_TOKENIZER_JSON=$tok "$S" mkmodel -q -o "$W/$name.gguf" "$@" >&2
    echo "mkmodel $name: $((SECONDS - t0)) s" >&2
  fi
  yes 'The history of mixture of experts models and their routing.' | head -n 40 | tr '\n' ' ' > "$W/calib30.txt"
  [ -f "$W/$name.profile" ] || "$S" profile -m "$W/$name.gguf" -f "$W/calib30.txt" -o "$W/$name.profile" 2>&1 | tail -n 1 >&2
  echo "$W/$name.gguf"
}
