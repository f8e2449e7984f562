#!/bin/sh
# `strata serve` as an OpenAI client sees it, on loopback with the tiny Q8_0 model of `strata
# mkmodel`: health,
# models, chat and text completions streamed and not, metrics; 16 concurrent clients for
# TEST_SERVE_SECONDS (default 30) where every response is complete and carries its own request's
# token count; malformed requests each get their status and an OpenAI-style error; clients that
# disconnect mid-request free the engine; config files refused with the key or mode named.
set -u
: "${TEST_SERVE_SECONDS:=30}"
export STARPU_SILENT=1
tmp=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM
. "$(dirname "$0")/lib.sh"
model=$(test_model tiny-qwen3moe-q8_0 --preset tiny --type q8_0)

# 1. start on 127.0.0.1, any free port (--port 0; the log names it), wait for /health
start_server "$tmp/srv" -m "$model" -c 2048
pid=$server_pid port=$server_port
if [ -z "$port" ] || ! curl -sf "http://127.0.0.1:$port/health" >"$tmp/h"; then
  bad "server did not start: $(cat "$tmp/srv.err")"
  echo "test_serve: $pass passed, $((fail)) failed"
  exit 1
fi
u=http://127.0.0.1:$port
# a second server on the same port is refused before it loads the model, in one line
t0=$(date +%s)
"$STRATA" serve -m "$model" --port "$port" >"$tmp/busy.out" 2>"$tmp/busy.err"; st=$?
if [ "$st" = 1 ] && [ "$(grep -c . "$tmp/busy.err")" = 1 ] && grep -q "cannot listen on 127.0.0.1 port $port: Address already in use" "$tmp/busy.err"; then
  ok "a busy port: exit 1 in $(( $(date +%s) - t0 )) s, '$(cat "$tmp/busy.err")'"
else bad "a busy port: exit $st: $(cat "$tmp/busy.err")"; fi
grep -q '"status":"ok"' "$tmp/h" && ok "health on 127.0.0.1:$port: $(cat "$tmp/h")" || bad "health: $(cat "$tmp/h")"

# post PATH JSON: the body in $tmp/r, the status in $code
post() { code=$(curl -s -o "$tmp/r" -w '%{http_code}' -H 'Content-Type: application/json' -d "$2" "$u$1"); }
has() { grep -q -- "$1" "$tmp/r"; }

# 2. models
code=$(curl -s -o "$tmp/r" -w '%{http_code}' "$u/v1/models")
[ "$code" = 200 ] && has '"object":"list"' && has '"id":"tiny-qwen3moe-q8_0"' \
  && ok "GET /v1/models: $(cat "$tmp/r")" || bad "GET /v1/models: $code $(cat "$tmp/r")"

# 3. chat completion, not streamed
post /v1/chat/completions '{"model":"tiny-qwen3moe-q8_0","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}],"max_tokens":12,"temperature":0,"ignore_eos":true}'
[ "$code" = 200 ] && has '"object":"chat.completion"' && has '"id":"chatcmpl-' && has '"role":"assistant"' \
  && has '"finish_reason":"length"' && has '"completion_tokens":12' && has '"total_tokens":' \
  && ok "chat completion: $(head -c 300 "$tmp/r")" || bad "chat completion: $code $(cat "$tmp/r")"

# 4. chat completion, streamed: role first, deltas, finish_reason, usage, [DONE] last
curl -sN -o "$tmp/s" -H 'Content-Type: application/json' "$u/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":6,"stream":true,"stream_options":{"include_usage":true},"ignore_eos":true,"seed":7}'
n_data=$(grep -c '^data: ' "$tmp/s")
if head -n 1 "$tmp/s" | grep -q '"delta":{"role":"assistant"' && grep -q '"object":"chat.completion.chunk"' "$tmp/s" \
   && grep -q '"finish_reason":"length"' "$tmp/s" && grep -q '"completion_tokens":6' "$tmp/s" \
   && [ "$(grep '^data: ' "$tmp/s" | tail -n 1)" = "data: [DONE]" ]; then
  ok "chat stream: $n_data events, last 'data: [DONE]'"
else
  bad "chat stream: $(cat "$tmp/s")"
fi

# 5. text completion, streamed and not; a stop string ends the text
post /v1/completions '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"ignore_eos":true}'
[ "$code" = 200 ] && has '"object":"text_completion"' && has '"text":' && has '"completion_tokens":8' \
  && ok "completion: $(head -c 200 "$tmp/r")" || bad "completion: $code $(cat "$tmp/r")"
curl -sN -o "$tmp/s" "$u/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"stream":true,"ignore_eos":true}'
grep -q '"object":"text_completion"' "$tmp/s" && [ "$(tail -n 2 "$tmp/s" | head -n 1)" = "data: [DONE]" ] \
  && ok "completion stream: $(grep -c '^data: ' "$tmp/s") events" || bad "completion stream: $(cat "$tmp/s")"
post /v1/completions '{"prompt":"Once upon a time","max_tokens":40,"temperature":0,"ignore_eos":true,"stop":["e"]}'
[ "$code" = 200 ] && has '"finish_reason":"stop"' && ! sed 's/.*"text":"\([^"]*\)".*/\1/' "$tmp/r" | grep -q e \
  && ok "stop string: $(head -c 200 "$tmp/r")" || bad "stop string: $code $(cat "$tmp/r")"

# 6. malformed requests: status and an OpenAI-style error
expect() {
  name=$1; want=$2; shift 2
  code=$(curl -s -o "$tmp/r" -w '%{http_code}' "$@")
  if [ "$code" = "$want" ] && has '"error":{"message":' && has '"type":'; then
    ok "$name: $code $(head -c 160 "$tmp/r")"
  else
    bad "$name: got $code want $want: $(cat "$tmp/r")"
  fi
}
expect "bad JSON" 400 -d '{"messages": [' "$u/v1/chat/completions"
expect "missing messages" 400 -d '{"max_tokens": 4}' "$u/v1/chat/completions"
expect "missing prompt" 400 -d '{"max_tokens": 4}' "$u/v1/completions"
expect "a user turn without content" 400 -d '{"messages":[{"role":"user"}],"max_tokens":4}' "$u/v1/chat/completions"
expect "a tool turn with null content" 400 -d '{"messages":[{"role":"tool","content":null}],"max_tokens":4}' "$u/v1/chat/completions"
expect "wrong type" 400 -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":"many"}' "$u/v1/chat/completions"
expect "unknown model" 404 -d '{"model":"gpt-4","messages":[{"role":"user","content":"hi"}]}' "$u/v1/chat/completions"
expect "unknown path" 404 -d '{}' "$u/v1/engines"
expect "GET on a POST route" 405 "$u/v1/chat/completions"
expect "a NUL in the prompt (cJSON would end the string there)" 400 -d '{"prompt":"Hello\u0000 world","max_tokens":1}' "$u/v1/completions"
post /v1/completions '{"prompt":"Hello\\u0000 world","max_tokens":1}'
[ "$code" = 200 ] && ok "an escaped backslash before u0000 is text: $code" || bad "escaped backslash before u0000: $code $(cat "$tmp/r")"
expect "prompt + max_tokens over the context" 400 -d '{"prompt":"hi","max_tokens":5000}' "$u/v1/completions"
words=$(i=0; while [ $i -lt 2100 ]; do printf 'word '; i=$((i + 1)); done)
expect "prompt over the context" 400 -d "{\"prompt\":\"$words\"}" "$u/v1/completions"
grep -q 'context_length_exceeded' "$tmp/r" || bad "over-long prompt code: $(cat "$tmp/r")"

# invalid UTF-8 from the client never reaches the JSON it gets back (issue #21): the error quotes
# it with U+FFFD instead (checked with iconv)
utf8_expect() {
  name=$1; want=$2; shift 2
  code=$(curl -s -o "$tmp/r" -w '%{http_code}' "$@")
  if [ "$code" = "$want" ] && has '"error":{"message":' && iconv -f UTF-8 -t UTF-8 "$tmp/r" >/dev/null 2>&1; then
    ok "$name: $code, valid UTF-8: $(head -c 160 "$tmp/r")"
  else
    bad "$name: got $code want $want, or not UTF-8: $(head -c 300 "$tmp/r" | od -c | head -n 5)"
  fi
}
printf '{"model":"bad\377model","messages":[{"role":"user","content":"hi"}]}' > "$tmp/badm.json"
utf8_expect "unknown model with invalid UTF-8" 404 --data-binary "@$tmp/badm.json" "$u/v1/chat/completions"
printf '{"messages":[{"role":"us\377er","content":"hi"}]}' > "$tmp/badr.json"
utf8_expect "role with invalid UTF-8" 400 --data-binary "@$tmp/badr.json" "$u/v1/chat/completions"
utf8_expect "URL with a raw 0xff byte" 404 -d '{}' "$u/v1/eng%FFines"

# 7. clients that leave mid-request: streaming and not; the engine stops, the server answers
curl -sN --max-time 0.5 -o "$tmp/cut1" "$u/v1/completions" -d '{"prompt":"x","max_tokens":2000,"ignore_eos":true,"stream":true}'
curl -s --max-time 0.5 -o "$tmp/cut2" "$u/v1/completions" -d '{"prompt":"y","max_tokens":2000,"ignore_eos":true}'
sleep 0.5
post /v1/completions '{"prompt":"after","max_tokens":3,"ignore_eos":true}'
n_cut=$(grep -c 'client disconnected' "$tmp/srv.err")
[ "$code" = 200 ] && has '"completion_tokens":3' && [ "$n_cut" -ge 2 ] \
  && ok "disconnects: $n_cut requests stopped early ($(grep 'client disconnected' "$tmp/srv.err" | sed 's/.*generated \([0-9]*\) tokens.*/\1/' | tr '\n' ' ')tokens of 2000), then answered" \
  || bad "disconnects: $code, $n_cut stopped: $(grep 'request' "$tmp/srv.err" | tail -n 3)"

# 8. 16 concurrent clients: every response complete and carrying its own request's token count
#    (client k asks for k tokens with ignore_eos; odd clients stream)
end=$(($(date +%s) + TEST_SERVE_SECONDS))
k=1
clients=""
while [ $k -le 16 ]; do
  (
    n=0
    while [ "$(date +%s)" -lt "$end" ]; do
      n=$((n + 1)); f="$tmp/c$k-$n"
      if [ $((k % 2)) = 1 ]; then
        curl -sN --max-time 60 -o "$f" "$u/v1/chat/completions" \
          -d "{\"messages\":[{\"role\":\"user\",\"content\":\"client $k request $n\"}],\"max_tokens\":$k,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"user\":\"c$k-$n\"}"
      else
        curl -s --max-time 60 -o "$f" "$u/v1/chat/completions" \
          -d "{\"messages\":[{\"role\":\"user\",\"content\":\"client $k request $n\"}],\"max_tokens\":$k,\"ignore_eos\":true,\"user\":\"c$k-$n\"}"
      fi
    done
  ) &
  clients="$clients $!"
  k=$((k + 1))
done
# each client finishes its last request (curl's --max-time bounds it)
for c in $clients; do wait "$c"; done
total=0; good=0; badlist=""
for f in "$tmp"/c*-*; do
  [ -f "$f" ] || continue
  total=$((total + 1))
  k=$(basename "$f" | sed 's/^c\([0-9]*\)-.*/\1/')
  if [ $((k % 2)) = 1 ]; then
    last=$(grep '^data: ' "$f" | tail -n 1)
    fin=$(grep -c '"finish_reason":"length"' "$f")
    if [ "$last" = "data: [DONE]" ] && [ "$fin" = 1 ] && grep -q "\"completion_tokens\":$k," "$f"; then good=$((good + 1)); else badlist="$badlist $(basename "$f")"; fi
  else
    if head -c 30 "$f" | grep -q '^{"id":"chatcmpl-' && [ "$(tail -c 2 "$f")" = "}}" ] \
       && grep -q "\"completion_tokens\":$k," "$f" && grep -q '"finish_reason":"length"' "$f"; then
      good=$((good + 1)); else badlist="$badlist $(basename "$f")"; fi
  fi
done
ids=$(cat "$tmp"/c*-* 2>/dev/null | grep -o '"id":"chatcmpl-[^"]*"' | sort -u | wc -l)
if [ "$total" -ge 16 ] && [ "$good" = "$total" ] && [ "$ids" = "$total" ]; then
  ok "16 clients for ${TEST_SERVE_SECONDS} s: $good of $total responses complete, each with its own token count, $ids distinct ids"
else
  bad "16 clients: $good of $total good, $ids distinct ids; bad:$(echo "$badlist" | cut -c 1-300)"
  for f in $(echo "$badlist" | cut -d' ' -f2); do echo "  $f: $(head -c 300 "$tmp/$f")"; done
fi

# 9. metrics after all that
code=$(curl -s -o "$tmp/r" -w '%{http_code}' "$u/metrics")
req=$(sed -n 's/^strata_requests_total \([0-9]*\)$/\1/p' "$tmp/r")
[ "$code" = 200 ] && has '^strata_prompt_tokens_total [0-9]' && has '^strata_generated_tokens_total [0-9]' \
  && has '^strata_last_request_tokens_per_second ' && has '^strata_expert_entries_total{tier="CPU"} [1-9]' \
  && has '^strata_cache_routed_share ' \
  && has '^strata_queue_length 0' && [ "${req:-0}" -ge "$total" ] \
  && ok "metrics: $req requests, $(grep -E '^strata_(generated_tokens_total|last_request)' "$tmp/r" | tr '\n' ' ')" \
  || bad "metrics: $code $(cat "$tmp/r")"

# 10. the per-request log line, then SIGTERM stops it cleanly
line=$(grep 'strata serve: request' "$tmp/srv.err" | tail -n 1)
echo "$line" | grep -Eq 'prompt [0-9]+ tokens.*generated [0-9]+ tokens.*tok/s.*expert entries CPU [0-9]+(, CUDA[0-9] [0-9]+)*(; CUDA[0-9] [^;]*)*; host->device [0-9.]+ MiB' \
  && ok "request log: $line" || bad "request log: $line"
kill -TERM "$pid"
i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$pid" 2>/dev/null; then bad "SIGTERM: still running after 10 s"; else
  wait "$pid"; st=$?; pid=""
  [ "$st" = 0 ] && grep -q 'SIGTERM: stopping' "$tmp/srv.err" && ok "SIGTERM: exit 0" || bad "SIGTERM: exit $st: $(tail -n 2 "$tmp/srv.err")"
fi

# 11. one client cannot lock everyone out (issue #21): 1,000 connections from 127.0.0.1 that send
# "GET /hea" and wait; a normal request meanwhile gets 503 with an OpenAI-style error (its address
# is past --max-connections-per-address), and is answered 200 once the header timeout (3 s here)
# has closed the idle ones: within 2 s of it
HALFOPEN=${HALFOPEN:-$(dirname "$STRATA")/tests/halfopen}
if [ -x "$HALFOPEN" ]; then
  start_server "$tmp/srv2" -m "$model" -c 512 --header-timeout 3 --max-connections-per-address 64
  pid2=$server_pid port2=$server_port
  t0=$(date +%s.%N)
  "$HALFOPEN" "$port2" 1000 10 > "$tmp/half.out" &
  hpid=$!
  i=0
  while [ $i -lt 100 ] && [ ! -s "$tmp/half.out" ]; do sleep 0.05; i=$((i + 1)); done
  n_open=$(cat "$tmp/half.out")
  req2() { curl -s -m 5 -o "$tmp/r2" -w '%{http_code}' -H 'Content-Type: application/json' \
           -d '{"prompt":"hi","max_tokens":2}' "http://127.0.0.1:$port2/v1/completions"; }
  code=$(req2)
  if [ "$code" = 503 ] && grep -q '"code":"too_many_connections"' "$tmp/r2"; then
    ok "$n_open half-open connections: a normal request gets 503 at once: $(head -c 200 "$tmp/r2")"
  else
    bad "$n_open half-open connections: a normal request got $code: $(head -c 300 "$tmp/r2")"
  fi
  while [ "$code" != 200 ] && awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { exit !(b - a < 15) }'; do
    sleep 0.25
    code=$(req2)
  done
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  if [ "$code" = 200 ] && awk -v d="$dt" 'BEGIN { exit !(d <= 3 + 2) }'; then
    ok "answered 200 $dt s after the half-open connections opened (header timeout 3 s, allowed 5 s)"
  else
    bad "after the half-open connections: $code at $dt s (want 200 within 5 s): $(head -c 200 "$tmp/r2")"
  fi
  metrics=$(curl -s "http://127.0.0.1:$port2/metrics" | grep -E '^strata_connections_(open|over_limit_total) ' | tr '\n' ' ')
  echo "     metrics: $metrics"
  kill "$hpid" "$pid2" 2>/dev/null; wait "$hpid" "$pid2" 2>/dev/null
else
  echo "SKIP half-open connections: $HALFOPEN not built"
fi

# 12. config files: unknown key, wrong type, several GPUs (a layer split, or the peer tier; refused here without a GPU)
cfg() {
  name=$1; pat=$2; echo "$3" >"$tmp/cfg.json"
  "$STRATA" serve --config "$tmp/cfg.json" >"$tmp/out" 2>"$tmp/err"; st=$?
  if [ "$st" = 1 ] && grep -q -- "$pat" "$tmp/err"; then ok "config $name: $(tail -n 1 "$tmp/err")"; else bad "config $name: exit $st: $(cat "$tmp/err")"; fi
}
cfg "unknown key" 'unknown key "gpus"' "{\"model\":\"$model\",\"gpus\":[0]}"
cfg "wrong type" '"port" must be a whole number' "{\"model\":\"$model\",\"port\":\"8080\"}"
cfg "missing model" 'missing key "model"' '{"port":8080}'
cfg "two GPUs: layer split" 'layer split' "{\"model\":\"$model\",\"gpu\":[0,1]}"
cfg "two GPUs + --peer-device: peer tier" "peer tier on nvidia-smi's card 0" "{\"model\":\"$model\",\"gpu\":[2,0],\"args\":[\"--peer-device\",\"1\"]}"
had_ncuda=${STARPU_NCUDA+x} was_ncuda=${STARPU_NCUDA-}
STARPU_NCUDA=0 && export STARPU_NCUDA
cfg "a GPU listed and none usable (STARPU_NCUDA=0)" 'this process can use 0 of them' "{\"model\":\"$model\",\"gpu\":[0]}"
if [ -n "$had_ncuda" ]; then STARPU_NCUDA=$was_ncuda; else unset STARPU_NCUDA; fi
cfg "--peer-device outside the list" 'counts positions in "gpu"' "{\"model\":\"$model\",\"gpu\":[0,1],\"args\":[\"--peer-device\",\"2\"]}"
# strict (issue #21): nothing after the object, no repeated key, UTF-8 only
cfg "text after the object" 'text after the JSON object at byte' "{\"model\":\"$model\"} {\"port\":1}"
cfg "a repeated key" 'key "port" appears twice' "{\"model\":\"$model\",\"port\":8080,\"port\":9090}"
cfg "a name that is not UTF-8" 'the value of "name" is not valid UTF-8' "$(printf '{"model":"%s","name":"bad\377name"}' "$model")"
cfg "bad engine flag in args" '"args": unknown engine flag' "{\"model\":\"$model\",\"args\":[\"--bogus\"]}"

echo "test_serve: $pass passed, $fail failed"
[ "$fail" = 0 ]
