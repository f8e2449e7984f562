#!/bin/sh
# Learned expert profiles (issue #23, io/learned.h), on the CPU: a first run writes the model's
# profile into $XDG_CACHE_HOME/strata/ and says so, a second run reads it (the log says so) and adds
# its tokens; --no-learn reads and writes nothing; --expert-profile wins over the learned one; a
# corrupt or truncated learned profile is ignored with one warning and rewritten whole; four
# processes saving at once leave a valid file holding all four runs' tokens; another model file gets a file of its own; strata serve
# saves at shutdown. A
# profile counts as valid when `strata generate --expert-profile FILE` (the strict parser) takes it.
set -u
export STARPU_SILENT=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
export XDG_CACHE_HOME="$tmp/xdg"
q8=$(test_model tiny-qwen3moe-q8_0 --preset tiny --type q8_0)
bf=$(test_model tiny-qwen3moe-bf16 --preset tiny --type bf16)
gen() { m=$1; shift; "$STRATA" generate -m "$m" -p "Mixture-of-experts models route every token." -n 6 --temp 0 "$@" \
          >/dev/null 2>"$tmp/err"; }
tokens_of() { sed -n 's/^layers [0-9]* experts [0-9]* top_k [0-9]* tokens \([0-9]*\)$/\1/p' "$1"; }
valid() { "$STRATA" generate -m "$1" -p hi -n 1 --no-learn --expert-profile "$2" >/dev/null 2>"$tmp/verr"; }

# 1. the first run writes it
gen "$q8"
f=$(sed -n 's/^strata: learned expert profile: \(.*\) (\([0-9]*\) tokens)$/\1/p' "$tmp/err")
n1=$(sed -n 's/^strata: learned expert profile: .* (\([0-9]*\) tokens)$/\1/p' "$tmp/err")
if grep -q "^strata: expert profile: none learned for this model file yet" "$tmp/err" && [ -n "$f" ] && [ -s "$f" ] \
   && case "$f" in "$XDG_CACHE_HOME/strata/tiny-qwen3moe-q8_0-"*.profile) true ;; *) false ;; esac \
   && valid "$q8" "$f" && [ "$(tokens_of "$f")" = "$n1" ]; then
  ok "first run: none learned yet, then $f written ($n1 tokens), a valid profile"
else
  bad "first run: $(grep '^strata:' "$tmp/err" | head -n 5) / $(cat "$tmp/verr" 2>/dev/null)"
fi

# 2. the second run reads it and adds its own tokens
gen "$q8"
n2=$(tokens_of "$f")
if grep -q "^strata: expert profile: learned from $n1 tokens of earlier runs on this model file ($f)" "$tmp/err" \
   && [ "$n2" = $((2 * n1)) ]; then
  ok "second run: read the learned profile ($n1 tokens), saved $n2"
else
  bad "second run: $(grep '^strata:' "$tmp/err" | head -n 5); tokens now ${n2:-?}"
fi

# 3. --no-learn neither reads nor writes
before=$(cksum < "$f")
gen "$q8" --no-learn
if grep -q "^strata: --no-learn: no learned expert profile is read or written" "$tmp/err" \
   && ! grep -q "learned from" "$tmp/err" && [ "$(cksum < "$f")" = "$before" ]; then
  ok "--no-learn: the learned profile neither read nor written"
else
  bad "--no-learn: $(grep '^strata:' "$tmp/err" | head -n 3)"
fi

# 4. --expert-profile wins; the run's routing still goes to the learned file
printf 'The quick brown fox jumps over the lazy dog.\n' > "$tmp/calib.txt"
"$STRATA" profile -m "$q8" -f "$tmp/calib.txt" -o "$tmp/own.profile" 2>/dev/null
gen "$q8" --expert-profile "$tmp/own.profile"
if grep -q "^strata: expert profile: $tmp/own.profile (--expert-profile); this run's routing is added to $f" "$tmp/err" \
   && [ "$(tokens_of "$f")" = $((3 * n1)) ]; then
  ok "--expert-profile: used, the learned file grows to $(tokens_of "$f") tokens"
else
  bad "--expert-profile: $(grep '^strata:' "$tmp/err" | head -n 3)"
fi

# 5. corrupt, then truncated: ignored with one warning naming the file, then rewritten whole
printf 'strata-expert-profile 1\nlayers 4 experts 16 top_k 4 tokens 12\n0 0 banana\n' > "$f"
gen "$q8"
w=$(grep -c "^strata: warning: ignoring the learned expert profile $f: " "$tmp/err")
if [ "$w" = 1 ] && valid "$q8" "$f" && [ "$(tokens_of "$f")" = "$n1" ]; then
  ok "a corrupt learned profile: one warning ($(grep '^strata: warning: ignoring' "$tmp/err" | cut -c1-160)), rewritten ($n1 tokens)"
else
  bad "a corrupt learned profile: $w warnings; $(grep '^strata:' "$tmp/err" | head -n 4)"
fi
head -c "$(( $(wc -c < "$f") / 2 ))" "$f" > "$tmp/half" && cp "$tmp/half" "$f"
gen "$q8"
if grep -q "^strata: warning: ignoring the learned expert profile $f: " "$tmp/err" && valid "$q8" "$f"; then
  ok "a truncated learned profile: ignored with a warning, rewritten"
else
  bad "a truncated learned profile: $(grep '^strata:' "$tmp/err" | head -n 4)"
fi

# 6. four processes saving at once: every one succeeds, the file is whole, and it holds all four
# runs' tokens (each save adds its own run to the file as it is then, under the lock)
run6() { "$STRATA" generate -m "$q8" -p "Mixture-of-experts models route every token." -n 6 --temp 0 --ignore-eos >/dev/null 2>"$1"; }
t0=$(tokens_of "$f")
run6 "$tmp/err"
d=$(($(tokens_of "$f") - t0))
t1=$(tokens_of "$f")
i=0
while [ $i -lt 4 ]; do
  run6 "$tmp/err$i" &
  i=$((i + 1))
done
wait
saved=$(cat "$tmp"/err[0-3] | grep -c "^strata: learned expert profile: ")
left=$(ls "$XDG_CACHE_HOME/strata" | grep -v '\.profile\.lock$' | grep -vc '\.profile$')
t2=$(tokens_of "$f")
if [ "$saved" = 4 ] && [ "$left" = 0 ] && [ "$d" -gt 0 ] && [ "$t2" = $((t1 + 4 * d)) ] && valid "$q8" "$f"; then
  ok "four processes at once: 4 saves, no temporary file left, a valid profile of $t2 tokens = $t1 + 4 x $d (one run alone)"
else
  bad "four processes at once: $saved saves, $left other files, tokens $t1 -> $t2 (one run alone: $d), $(cat "$tmp/verr" 2>/dev/null)"
fi

# 7. another model file: a file of its own
gen "$bf"
g=$(sed -n 's/^strata: learned expert profile: \(.*\) (.*$/\1/p' "$tmp/err")
case "$g" in
  "$XDG_CACHE_HOME/strata/tiny-qwen3moe-bf16-"*.profile) [ "$g" != "$f" ] && ok "another model: $g" || bad "another model: $g" ;;
  *) bad "another model: '$g'" ;;
esac
# 8. strata serve learns across requests and saves at shutdown (SIGTERM)
rm -f "$f"
start_server "$tmp/srv" -m "$q8" -c 512
if [ -n "$server_port" ]; then
  curl -s -o /dev/null -H 'Content-Type: application/json' \
    -d '{"prompt":"Mixture-of-experts models","max_tokens":8,"temperature":0,"ignore_eos":true}' \
    "http://127.0.0.1:$server_port/v1/completions"
  kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null
  if grep -q "^strata: learned expert profile: $f (" "$tmp/srv.err" && valid "$q8" "$f" && [ "$(tokens_of "$f")" -gt 0 ]; then
    ok "serve: saved at shutdown ($(tokens_of "$f") tokens)"
  else
    bad "serve: $(grep '^strata' "$tmp/srv.err" | tail -n 4)"
  fi
else
  bad "serve did not start: $(tail -n 3 "$tmp/srv.err")"
fi
echo "test_learn: $pass passed, $fail failed"
[ "$fail" = 0 ]
