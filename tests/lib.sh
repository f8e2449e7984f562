# Shared by the shell tests: PASS/FAIL counters, expect_error, the test models and the external
# references. Source it after setting $tmp.
pass=0; fail=0
: "${STRATA:=./strata}" "${STRATA_FIXTURES:=../shared/fixtures}"

# test_model NAME [MKMODEL-ARGS...]: prints the path of a model `strata mkmodel` makes once per
# build (random weights, the Qwen3 tokenizer the build installs) in $STRATA_TEST_MODELS (default
# tests/models); written under a temporary name and renamed, so parallel tests never read half a
# file. Default arguments: --preset tiny.
test_model() {
  _n=$1; shift
  _d=${STRATA_TEST_MODELS:-tests/models}
  mkdir -p "$_d"
  _f="$_d/$_n.gguf"
  if [ ! -s "$_f" ]; then
    [ $# -gt 0 ] || set -- --preset tiny
    "$STRATA" mkmodel -q -o "$_f.$$.tmp" "$@" >/dev/null 2>"$_d/$_n.err" && mv "$_f.$$.tmp" "$_f"       || { echo "test_model $_n: strata mkmodel $*: $(cat "$_d/$_n.err")" >&2; rm -f "$_f.$$.tmp"; }
  fi
  echo "$_f"
}

# have_fixtures: whether the external references (../shared/fixtures, or $STRATA_FIXTURES) are
# there; the comparisons with them are skipped, and said to be, when not.
have_fixtures() { [ -d "$STRATA_FIXTURES/models" ]; }
skip() { echo "SKIP $1"; }
ok()  { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

# expect_error NAME PATTERN CMD...: exit status 1 (not a crash), one stderr line matching PATTERN
expect_error() {
  name=$1; pat=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"; st=$?
  lines=$(grep -c . "$tmp/err")
  if [ "$st" = 1 ] && [ "$lines" = 1 ] && grep -q -- "$pat" "$tmp/err"; then
    ok "$name: exit 1, '$(cat "$tmp/err")'"
  else
    bad "$name: exit $st, $lines stderr lines, want /$pat/: $(head -c 400 "$tmp/err")"
  fi
}

# start_server LOG_PREFIX ARGS...: starts `$STRATA serve ARGS --port 0` in the background with its
# stdout and stderr in LOG_PREFIX.out and LOG_PREFIX.err, waits (10 s at most) for the port its log
# names; sets $server_pid and $server_port (empty when it did not start).
start_server() {
  log=$1; shift
  "$STRATA" serve "$@" --port 0 >"$log.out" 2>"$log.err" &
  server_pid=$!
  server_port=""
  i=0
  while [ $i -lt 100 ] && [ -z "$server_port" ]; do
    server_port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$log.err")
    [ -z "$server_port" ] && sleep 0.1
    i=$((i + 1))
  done
}
