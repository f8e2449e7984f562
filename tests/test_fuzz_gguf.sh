#!/bin/sh
# Runs the GGUF reader's and model loader's libFuzzer target (tests/fuzz_gguf.c) for FUZZ_SECONDS (default 20)
# over a temporary copy of tests/fuzz-seeds/. Exit 0: no crash; 1: a crash (the input is kept
# as ./fuzz_gguf-crash-*); 77 (skip): clang or its libFuzzer runtime is missing (Debian:
# libclang-rt-14-dev for clang-14).
here=$(cd "$(dirname "$0")" && pwd)
top=${srcdir:+$(cd "$srcdir" && pwd)}
top=${top:-$(cd "$here/.." && pwd)}
secs=${FUZZ_SECONDS:-20}
CLANG=${CLANG:-clang}

if ! command -v "$CLANG" >/dev/null 2>&1; then
  echo "test_fuzz_gguf: SKIP: $CLANG not found"
  exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fuzz_gguf.XXXXXX") || exit 77
trap 'rm -rf "$tmp"' EXIT INT TERM

if ! "$CLANG" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$top/src" -I"$top" -o "$tmp/fuzz_gguf" "$top/tests/fuzz_gguf.c" "$top/src/io/gguf.c" \
    "$top/src/common.c" "$top/src/codelets/quant.c" "$top/src/io/model.c" "$top/src/io/arch.c" \
    "$top/src/io/tokenizer.c" -lpcre2-8 -lm >"$tmp/build.log" 2>&1; then
  echo "test_fuzz_gguf: SKIP: $CLANG cannot build with -fsanitize=fuzzer" \
    "(install libclang-rt-14-dev for clang-14):"
  tail -n 5 "$tmp/build.log"
  exit 77
fi

mkdir "$tmp/corpus"
cp "$top"/tests/fuzz-seeds/* "$tmp/corpus/" 2>/dev/null ||
  echo "test_fuzz_gguf: no seeds in $top/tests/fuzz-seeds; starting from an empty corpus"
echo "test_fuzz_gguf: fuzzing for $secs s from $(ls "$tmp/corpus" | wc -l) seeds"
"$tmp/fuzz_gguf" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$tmp/" \
  "$tmp/corpus" >"$tmp/fuzz.log" 2>&1
rc=$?
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/fuzz.log")
cov=$(grep -o 'cov: [0-9]*' "$tmp/fuzz.log" | tail -n 1)
if [ $rc -ne 0 ]; then
  echo "test_fuzz_gguf: FAIL: the fuzzer stopped with status $rc after ${execs:-?} executions"
  grep -E 'ERROR|SUMMARY|runtime error' "$tmp/fuzz.log" | head -n 20
  for f in "$tmp"/crash-* "$tmp"/leak-* "$tmp"/timeout-* "$tmp"/oom-*; do
    [ -f "$f" ] || continue
    cp "$f" "./fuzz_gguf-$(basename "$f")" && echo "test_fuzz_gguf: input kept as ./fuzz_gguf-$(basename "$f")"
  done
  exit 1
fi
echo "test_fuzz_gguf: PASS: ${execs:-?} executions in $secs s, no crash (${cov:-cov: ?}, corpus $(ls "$tmp/corpus" | wc -l) files)"
exit 0
