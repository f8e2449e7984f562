#!/usr/bin/env bash
# strata's int8 CPU mat-vec kernels against llama.cpp's own (ggml's vec_dot) on the same weight
# bytes, threads and row split, in one process (bench/ggml-matvec.c). Run from anywhere; builds
# ggml's CPU backend as static libraries (llama.cpp from node-llama-cpp@3.22.1's git bundle, or
# LLAMA_CPP_SRC=/path/to/llama.cpp), then carry/ggml-matvec (stripped, ~3 MB, no non-system
# shared library: it travels with carry/ to a GPU host, where it runs alone), then runs it unless
# BUILD_ONLY=1. Arguments go to the binary (--formats a,b --threads N --rounds R). The sources and
# the build stay out of carry/ (which travels, 64 MiB at most).
#   LLAMA_CPP_SRC  an existing llama.cpp checkout (skips npm pack + git clone into $WORK/src)
#   WORK           where the fetched sources and the build go (default ${TMPDIR:-/tmp}/strata-ggml)
#   GGML_BUILD     the cmake build folder (default $WORK/build)
#   STRATA_SRC     the strata tree whose kernels are measured (default: this one), e.g. one made
#                  by `git archive REV src | tar -x -C DIR` to measure a commit from 272f1aa on
#                  (earlier trees lack src/cli/membw.h, st_bench_inputs or st_dot_row_pairs)
#   BIN            the binary (default carry/ggml-matvec)
#   BUILD_ONLY=1   build, do not run
# The ggml CPU backend is built for a Sapphire-Rapids-class x86 (AVX-512 F/BW/DQ/VL/CD, VBMI,
# VNNI, BF16; AMX off) without -march=native, so the binary built here runs on the GPU host's
# Xeon and on Zen 4 alike.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
carry=$root/carry
work=${WORK:-${TMPDIR:-/tmp}/strata-ggml}
build=${GGML_BUILD:-$work/build}
strata=${STRATA_SRC:-$root}
bin=${BIN:-$carry/ggml-matvec}
nlc_version=3.22.1

src=${LLAMA_CPP_SRC:-}
if [ -z "$src" ]; then
  src=$work/src/llama.cpp
  if [ ! -f "$src/ggml/CMakeLists.txt" ]; then
    mkdir -p "$work/src"
    (cd "$work/src" && npm pack --silent "node-llama-cpp@$nlc_version" > /dev/null)
    tar -xzf "$work/src/node-llama-cpp-$nlc_version.tgz" -C "$work/src" package/llama/gitRelease.bundle \
      package/llama/llama.cpp.info.json
    rm -rf "$src"
    git -c advice.detachedHead=false clone -q "$work/src/package/llama/gitRelease.bundle" "$src"
  fi
fi
[ -f "$src/ggml/CMakeLists.txt" ] || { echo "vs-ggml.sh: no ggml/ under $src" >&2; exit 1; }

echo "llama.cpp: $src, commit $(git -C "$src" log -1 --format='%H (%cd)' 2>/dev/null || echo unknown)"
echo "ggml version $(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$src/ggml/CMakeLists.txt" | paste -sd.)"
info=${src%/llama.cpp}/package/llama/llama.cpp.info.json # when fetched here
if [ -f "$info" ]; then echo "node-llama-cpp $nlc_version's llama.cpp.info.json: $(tr -d ' \n' < "$info")"; fi

# ggml's CPU backend, static, only the two libraries the harness needs
t0=$SECONDS
if [ -f "$build/CMakeCache.txt" ] && ! grep -q -x "CMAKE_HOME_DIRECTORY:INTERNAL=$src" "$build/CMakeCache.txt"; then
  rm -rf "$build" # configured from another checkout
fi
# (configured through llama.cpp's top level: its ggml/ does not configure on its own, ggml.pc.in
# lives in the standalone ggml repository only; everything but ggml is switched off)
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
  -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
  -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
  -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF > "$build.cmake.log" 2>&1 ||
  { tail -n 20 "$build.cmake.log" >&2; exit 1; }
grep -F 'Adding CPU backend variant' "$build.cmake.log" || true
cmake --build "$build" --target ggml-cpu -j2 > "$build.build.log" 2>&1 || { grep -E -A5 'error|Error' "$build.build.log" >&2; exit 1; }
echo "ggml build: $((SECONDS - t0)) s (logs $build.cmake.log, $build.build.log)"
libcpu=$(find "$build" -name libggml-cpu.a | head -n 1)
libbase=$(find "$build" -name libggml-base.a | head -n 1)

# the harness, strata's kernel sources (flags as Makefile.am's AM_CFLAGS) and ggml, one binary
obj=$build/strata-obj
mkdir -p "$obj"
cflags=(-std=gnu11 -O2 -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -I"$strata/src")
# the CPU kernels: dot.c, and in trees with the split by format family also dot_b32.c, dot_k.c, dot_grid.c
mapfile -t dots < <(cd "$strata" && ls src/codelets/dot*.c)
dot_objs=()
for f in "${dots[@]}" src/codelets/quant.c src/common.c src/cli/membw.c; do
  gcc "${cflags[@]}" -c "$strata/$f" -o "$obj/$(basename "$f" .c).o"
  case $f in src/codelets/dot*.c) dot_objs+=("$obj/$(basename "$f" .c).o") ;; esac
done
echo "strata kernels from $strata: $(cd "$strata" && md5sum "${dots[@]}" src/codelets/quant.c | tr '\n' ' ')"
gcc "${cflags[@]}" -I"$src/ggml/include" -c "$root/bench/ggml-matvec.c" -o "$obj/ggml-matvec.o"
mkdir -p "$(dirname "$bin")"
g++ -s -static-libstdc++ -static-libgcc -o "$bin" "$obj/ggml-matvec.o" "${dot_objs[@]}" "$obj/quant.o" \
  "$obj/common.o" "$obj/membw.o" "$libcpu" "$libbase" -lm -pthread
echo "built $bin; shared libraries:"
ldd "$bin" | sed 's/^/  /'
if ldd "$bin" | grep -v -E 'linux-vdso|ld-linux|lib(c|m|pthread|dl|rt)\.so' | grep -q '=>'; then
  echo "vs-ggml.sh: the binary needs a non-system shared library" >&2
  exit 1
fi
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
"$bin" "$@"
