# Shared by the shell tests: PASS/FAIL counters and expect_error. Source it after setting $tmp.
pass=0; fail=0
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
