#!/bin/sh
# Runs the text parsers' libFuzzer target (tests/fuzz_text.c: expert profiles, events.tsv, serve
# configs) for FUZZ_TEXT_SECONDS (default 15) from tests/fuzz-seeds-text/. Exit 0: no crash; 1: a
# crash (its input kept as ./fuzz_text-crash-*); 77 (skip): clang or libFuzzer is missing.
here=$(cd "$(dirname "$0")" && pwd)
top=${srcdir:+$(cd "$srcdir" && pwd)}
top=${top:-$(cd "$here/.." && pwd)}
secs=${FUZZ_TEXT_SECONDS:-15}
CLANG=${CLANG:-clang}
command -v "$CLANG" >/dev/null 2>&1 || { echo "test_fuzz_text: SKIP: $CLANG not found"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fuzz_text.XXXXXX") || exit 77
trap 'rm -rf "$tmp"' EXIT INT TERM
if ! "$CLANG" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$top/src" \
    $(pkg-config --cflags libcjson libxml-2.0) -o "$tmp/fuzz_text" "$top/tests/fuzz_text.c" "$top/src/io/profile.c" \
    "$top/src/io/trace_export.c" "$top/src/io/config.c" "$top/src/common.c" \
    $(pkg-config --libs libcjson libxml-2.0) -lm >"$tmp/build.log" 2>&1; then
  echo "test_fuzz_text: SKIP: $CLANG cannot build the target:"; tail -n 5 "$tmp/build.log"; exit 77
fi
mkdir "$tmp/corpus" && cp "$top"/tests/fuzz-seeds-text/* "$tmp/corpus/"
"$tmp/fuzz_text" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$tmp/" "$tmp/corpus" >"$tmp/fuzz.log" 2>&1
rc=$?
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/fuzz.log")
if [ $rc -ne 0 ]; then
  echo "test_fuzz_text: FAIL: status $rc after ${execs:-?} executions"
  grep -E 'ERROR|SUMMARY|runtime error' "$tmp/fuzz.log" | head -n 20
  for f in "$tmp"/crash-* "$tmp"/leak-*; do [ -f "$f" ] && cp "$f" "./fuzz_text-$(basename "$f")"; done
  echo "test_fuzz_text: 0 passed, 1 failed"
  exit 1
fi
echo "test_fuzz_text: PASS: $execs executions in $secs s over profiles, events.tsv files and serve configs, no crash"
echo "test_fuzz_text: 1 passed, 0 failed"
