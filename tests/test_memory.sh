#!/bin/sh
# A flat memory footprint (issue #21): the anonymous resident memory of `strata generate` on the tiny
# Q8_0 model of `strata mkmodel` does not grow with the number of tokens, through the decode step and through the
# per-task path (STRATA_DECODE_GRAPH=0), which submits hundreds of tasks per token; and a server's
# resident memory after warm-up stays flat over a run of requests (its VmRSS series is printed).
# Allowed growth: 4 MiB over the whole run (before the fix the per-task path grew ~3.7 KiB per
# token here: StarPU kept a record per task on every read-only weight handle).
set -u
export STARPU_SILENT=1 STARPU_NCPU=2
tmp=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
. "$(dirname "$0")/lib.sh"
model=$(test_model tiny-qwen3moe-q8_0 --preset tiny --type q8_0)
LIMIT_KIB=4096

# anonymous memory at the end of the run: the heap and private buffers (the pages of the mapped
# model file a run touches grow with the tokens it reads: every new token's embedding row)
peak_mib() { sed -n 's/^peak resident memory .*; anonymous \([0-9.]*\) MiB at the end$/\1/p' "$1"; }
for g in 1 0; do
  for n in 100 3000; do
    STRATA_DECODE_GRAPH=$g "$STRATA" generate -m "$model" -p "Hello" -n $n -c 3200 --temp 0 --ignore-eos \
      > /dev/null 2>"$tmp/gen-$g-$n.err"
  done
  a=$(peak_mib "$tmp/gen-$g-100.err"); b=$(peak_mib "$tmp/gen-$g-3000.err")
  if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" -v l=$LIMIT_KIB 'BEGIN { exit !((b - a) * 1024 <= l) }'; then
    ok "generate, STRATA_DECODE_GRAPH=$g: anonymous resident memory $a MiB at -n 100, $b MiB at -n 3000 (growth ≤ $LIMIT_KIB KiB)"
  else
    bad "generate, STRATA_DECODE_GRAPH=$g: anonymous resident memory ${a:-?} MiB at -n 100, ${b:-?} MiB at -n 3000: $(tail -n 2 "$tmp/gen-$g-3000.err")"
  fi
done

# serve: 6 warm-up requests, then 40 more of 48 tokens; VmRSS (KiB) after the warm-up and every 8
export STRATA_DECODE_GRAPH=0
start_server "$tmp/srv" -m "$model" -c 2048
unset STRATA_DECODE_GRAPH
pid=$server_pid port=$server_port
rss() { sed -n 's/^VmRSS:[^0-9]*\([0-9]*\) kB/\1/p' "/proc/$pid/status"; }
req() { curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' "http://127.0.0.1:$port/v1/completions" \
        -d '{"prompt":"Once upon a time","max_tokens":48,"temperature":0,"ignore_eos":true}'; }
if [ -z "$port" ]; then
  bad "server did not start: $(cat "$tmp/srv.err")"
else
  for i in 1 2 3 4 5 6; do req > /dev/null; done
  series="$(rss)"; first=$series; codes=""
  for i in $(seq 1 40); do
    codes="$codes$(req)"
    [ $((i % 8)) = 0 ] && series="$series $(rss)"
  done
  last=$(rss)
  if [ -n "$first" ] && [ -n "$last" ] && [ "$codes" = "$(printf '200%.0s' $(seq 1 40))" ] && [ $((last - first)) -le $LIMIT_KIB ]; then
    ok "serve (per-task decode path): VmRSS after warm-up and every 8 of 40 requests of 48 tokens: $series KiB (growth $((last - first)) KiB ≤ $LIMIT_KIB)"
  else
    bad "serve: VmRSS series $series KiB, growth $((last - first)) KiB; statuses $codes"
  fi
fi
echo "test_memory: $pass passed, $fail failed"
[ "$fail" = 0 ]
