#!/bin/sh
# `strata serve` under load (issue #21), too long for make check: CLIENTS concurrent clients (32)
# for SECONDS (600) on the tiny Q8_0 fixture, each cycling through chat and text completions,
# streamed and not, at temperature 0 with four fixed prompts, every response checked complete and
# equal, byte for byte in its content, to the first answer to the same request; the server's VmRSS
# sampled every 10 s (printed: flat after warm-up); then 1,000 half-open connections (tests/halfopen)
# and a normal request, answered 503 at once and 200 once the header timeout (5 s) has passed.
# Run from the build tree: bench/serve-soak.sh  (STRATA, FIXTURES, CLIENTS, SECONDS to change).
set -u
: "${STRATA:=./strata}" "${FIXTURES:=../shared/fixtures}" "${CLIENTS:=32}" "${SECONDS_RUN:=${SECONDS_TOTAL:-600}}"
HALFOPEN=${HALFOPEN:-$(dirname "$STRATA")/tests/halfopen}
export STARPU_SILENT=1
tmp=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
model=$FIXTURES/models/tiny-qwen3moe-q8_0.gguf
. "$(dirname "$0")/../tests/lib.sh"
start_server "$tmp/srv" -m "$model" -c 2048 --header-timeout 5
pid=$server_pid port=$server_port
[ -n "$port" ] || { echo "serve-soak: the server did not start: $(cat "$tmp/srv.err")"; exit 1; }
u=http://127.0.0.1:$port
rss() { sed -n 's/^VmRSS:[^0-9]*\([0-9]*\) kB/\1/p' "/proc/$pid/status"; }

# request v (0..7): prompt v % 4, chat or text by v / 4 % 2, streamed by v % 2; the content is what
# the check compares (streamed deltas joined)
body() {
  p="prompt number $(( $1 % 4 )) about mixture of experts"
  s=$([ $(( $1 % 2 )) = 1 ] && echo true || echo false)
  if [ $(( $1 / 4 % 2 )) = 0 ]; then
    printf '{"messages":[{"role":"user","content":"%s"}],"max_tokens":24,"temperature":0,"ignore_eos":true,"stream":%s}' "$p" "$s"
  else
    printf '{"prompt":"%s","max_tokens":24,"temperature":0,"ignore_eos":true,"stream":%s}' "$p" "$s"
  fi
}
path() { [ $(( $1 / 4 % 2 )) = 0 ] && echo /v1/chat/completions || echo /v1/completions; }
content() { # response file, streamed?: the text (repr, JSON-decoded), or FAIL (python3 reads the JSON)
  python3 - "$1" "$2" <<'PY'
import json, sys
raw = open(sys.argv[1], 'rb').read().decode('utf-8')  # invalid UTF-8 fails here
if sys.argv[2] == '1':
    lines = [l for l in raw.split('\n') if l.startswith('data: ')]
    if not lines or lines[-1] != 'data: [DONE]': print('FAIL'); sys.exit()
    out = ''
    for l in lines[:-1]:
        c = json.loads(l[6:])['choices'][0]
        out += (c.get('delta') or {}).get('content') or c.get('text') or ''
    print(repr(out))
else:
    o = json.loads(raw)
    c = o['choices'][0]
    if o['usage']['completion_tokens'] != 24: print('FAIL'); sys.exit()
    print(repr(c['message']['content'] if 'message' in c else c['text']))
PY
}
for v in 0 1 2 3 4 5 6 7; do # references, one client
  curl -sN --max-time 60 -o "$tmp/ref$v" -H 'Content-Type: application/json' -d "$(body $v)" "$u$(path $v)"
  content "$tmp/ref$v" $((v % 2)) > "$tmp/ref$v.txt"
done
echo "serve-soak: $CLIENTS clients for $SECONDS_RUN s on $u; VmRSS after warm-up: $(rss) KiB"
end=$(($(date +%s) + SECONDS_RUN))
k=1
clients=""
while [ $k -le "$CLIENTS" ]; do
  (
    n=0; okc=0; badc=0
    while [ "$(date +%s)" -lt "$end" ]; do
      v=$(( (k + n) % 8 )); n=$((n + 1))
      curl -sN --max-time 120 -o "$tmp/c$k" -H 'Content-Type: application/json' -d "$(body $v)" "$u$(path $v)"
      if [ "$(content "$tmp/c$k" $((v % 2)))" = "$(cat "$tmp/ref$v.txt")" ]; then okc=$((okc + 1)); else badc=$((badc + 1)); cp "$tmp/c$k" "$tmp/bad-$k-$n"; fi
    done
    echo "$okc $badc" > "$tmp/count$k"
  ) &
  clients="$clients $!"
  k=$((k + 1))
done
series=""
while [ "$(date +%s)" -lt "$end" ]; do
  sleep 10
  series="$series $(rss)"
done
for c in $clients; do wait "$c"; done
total=0; bad=0
for f in "$tmp"/count*; do read -r a b < "$f"; total=$((total + a + b)); bad=$((bad + b)); done
echo "serve-soak: $total responses, $bad failed or different from the reference"
echo "serve-soak: VmRSS every 10 s (KiB):$series"
set -- $series
first=${2:-${1:-0}}; last=$(echo "$series" | awk '{ print $NF }')
echo "serve-soak: VmRSS from the second sample to the last: $first -> $last KiB ($((last - first)) KiB)"
for f in "$tmp"/bad-*; do [ -f "$f" ] && { echo "first bad response ($f):"; head -c 400 "$f"; echo; break; }; done
if [ -x "$HALFOPEN" ]; then
  t0=$(date +%s.%N)
  "$HALFOPEN" "$port" 1000 15 > "$tmp/half" &
  i=0
  while [ ! -s "$tmp/half" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
  code=$(curl -s -m 5 -o "$tmp/r" -w '%{http_code}' -d '{"prompt":"hi","max_tokens":2}' "$u/v1/completions")
  echo "serve-soak: $(cat "$tmp/half") half-open connections; a normal request: $code $(head -c 120 "$tmp/r")"
  while [ "$code" != 200 ]; do
    sleep 0.25
    code=$(curl -s -m 5 -o "$tmp/r" -w '%{http_code}' -d '{"prompt":"hi","max_tokens":2}' "$u/v1/completions")
  done
  echo "serve-soak: answered 200 after $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s (header timeout 5 s)"
fi
[ "$bad" = 0 ]
