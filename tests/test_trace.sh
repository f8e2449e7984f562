#!/bin/sh
# Traces and tuning as a user drives them: `strata trace` on an event log (a synthetic one with
# 2 CPU workers and 4 layers over 1 prompt chunk and 3 decode steps, plus a real
# `generate --trace` of the tiny Q8_0 model of `strata mkmodel`) writes a well-formed
# timeline.svg with one lane per worker and one box per expert_rows task, a trace.json that
# parses, and a summary; a malformed event log gives exit 1 and one line naming the file and
# line; `strata tune` over two schedulers ranks them. Prints the counts it compared.
set -u
export STARPU_SILENT=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export STARPU_HOME="$tmp" # performance models calibrated by the runs stay out of $HOME
. "$(dirname "$0")/lib.sh"
tiny=$(test_model tiny-qwen3moe-q8_0 --preset tiny --type q8_0)
have() { command -v "$1" >/dev/null 2>&1; }

# A synthetic event log: W workers, P prompt chunks and D decode steps of L layers with E
# expert_rows tasks each, spread over the workers (format: doc/traces.md).
synth() {
  awk -v W="$1" -v P="$2" -v D="$3" -v L="$4" -v E="$5" 'BEGIN {
    print "# strata trace v1"; printf "model\tsynthetic.gguf\n"
    for (w = 0; w < W; w++) printf "worker\t%d\tCPU\tCPU %d\n", w, w
    t = 1000
    for (s = 0; s < P + D; s++) {
      sc = s < P ? 5 : 1; st = t
      for (l = 0; l < L; l++) {
        printf "task\tattention\t%d\t-1\t-\t0\t%d\t%d\t4096\tattention L%d\n", l, t, t + 40 * sc, l; t += 40 * sc + 2
        printf "task\trouter\t%d\t-1\t-\t0\t%d\t%d\t1024\trouter L%d\n", l, t, t + 10 * sc, l; t += 10 * sc + 3
        m = t; for (w = 0; w < W; w++) free[w] = t
        for (e = 0; e < E; e++) {
          w = e % W; x = (e * 5 + l + s) % 16; d = (20 + (e * 13 + s) % 17) * sc
          printf "task\texpert_rows\t%d\t%d\tCPU\t%d\t%d\t%d\t65536\texpert_rows L%d E%d CPU\n", l, x, w, free[w], free[w] + d, l, x
          free[w] += d + 1; if (free[w] > m) m = free[w]
        }
        t = m + 2; printf "task\tcombine\t%d\t-1\t-\t0\t%d\t%d\t2048\tcombine L%d\n", l, t, t + 8 * sc, l; t += 8 * sc + 2
      }
      printf "task\toutput_head\t-1\t-1\t-\t0\t%d\t%d\t8192\toutput_head\n", t, t + 30 * sc; t += 30 * sc
      printf "step\t%s\t%d\t%d\t%d\n", s < P ? "prompt" : "decode", s < P ? s : s - P, st, t; t += 15
    }
  }'
}

# check_trace NAME DIR [KIND]: strata trace DIR, then the SVG, JSON and summary against
# DIR/events.tsv; KIND (default expert_rows) is the task kind whose boxes are counted
check_trace() {
  name=$1; d=$2; ev=$d/events.tsv; kind=${3:-expert_rows}
  if ! "$STRATA" trace "$d" -o "$d/out" >"$tmp/out" 2>"$tmp/err"; then
    bad "$name: strata trace exit $?: $(cat "$tmp/err")"; return
  fi
  ok "$name: strata trace exit 0 ($(grep -c '^wrote' "$tmp/out") files written; $(grep '^paje.trace\|paje.trace (' "$tmp/out" | head -n 1))"
  svg=$d/out/timeline.svg
  if have xmllint; then
    xmllint --noout "$svg" 2>"$tmp/xerr" && ok "$name: timeline.svg is well-formed XML (xmllint)" \
      || bad "$name: timeline.svg not well-formed: $(head -c 300 "$tmp/xerr")"
  else
    echo "SKIP $name: xmllint not installed, SVG well-formedness not checked"
  fi
  want=$(grep -c '^worker	' "$ev"); got=$(grep -o 'class="lane"' "$svg" | wc -l | tr -d ' ')
  [ "$got" = "$want" ] && ok "$name: $got lanes in the SVG for $want worker lines" || bad "$name: $got lanes in the SVG for $want worker lines"
  want=$(grep -c "^task	$kind	" "$ev"); got=$(grep -o "class=\"task $kind" "$svg" | wc -l | tr -d ' ')
  [ "$got" = "$want" ] && [ "$want" -gt 0 ] && ok "$name: $got $kind boxes in the SVG for $want $kind task lines" \
    || bad "$name: $got $kind boxes in the SVG for $want $kind task lines"
  want=$(grep -c '^task	' "$ev"); got=$(grep -c '<title>' "$svg")
  [ "$got" -ge "$want" ] && ok "$name: $got tooltips for $want tasks" || bad "$name: $got tooltips for $want tasks"
  json=$d/out/trace.json
  if have python3; then
    res=$(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
print(sum(1 for e in ev if e["ph"] == "X" and e["pid"] == 1), sum(1 for e in ev if e["ph"] == "M" and e["name"] == "thread_name"))' "$json" 2>&1)
    wt=$(grep -c '^task	' "$ev"); ww=$(grep -c '^worker	' "$ev")
    [ "$res" = "$wt $ww" ] && ok "$name: trace.json parses (python3): $wt task events, $ww thread names" \
      || bad "$name: trace.json: got '$res', want '$wt $ww'"
  else
    n=$(grep -o '"ph":"X"' "$json" | wc -l | tr -d ' ')
    head -c 200 "$json" | grep -q '"traceEvents":\[' && [ "$n" -gt 0 ] && tail -c 4 "$json" | grep -q ']}' \
      && ok "$name: trace.json looks complete ($n complete events; python3 absent, not parsed)" || bad "$name: trace.json malformed"
  fi
  grep -q '^critical path of decode step' "$d/out/summary.txt" && grep -q '^worker busy' "$d/out/summary.txt" \
    && ok "$name: summary.txt: $(grep -A1 '^critical path' "$d/out/summary.txt" | tail -n 1 | sed 's/^ *//')" \
    || bad "$name: summary.txt incomplete: $(head -c 300 "$d/out/summary.txt")"
}

# 1. a synthetic log
mkdir -p "$tmp/syn"
synth 2 1 3 4 6 > "$tmp/syn/events.tsv"
check_trace "synthetic (2 workers, 4 layers, 1+3 steps)" "$tmp/syn"

# 2. real traced runs: the prompt through the per-task path (STRATA_PROMPT_LANES=0: expert-row
# tasks), then through the prompt lanes (the default without a GPU: prompt_lane tasks)
ids="785, 3974, 293, 4830, 282, 5131, 7784, 82, 916, 279, 1187, 4246, 5562, 13"
for lanes in 0 1; do
  kind=expert_rows; [ $lanes = 1 ] && kind=prompt_lane
  if env STRATA_PROMPT_LANES=$lanes "$STRATA" generate -m "$tiny" --prompt-ids "$ids" -n 4 --temp 0 --ignore-eos --print-ids \
       --trace "$tmp/real$lanes" >/dev/null 2>"$tmp/err" && [ -s "$tmp/real$lanes/events.tsv" ]; then
    ok "generate --trace (STRATA_PROMPT_LANES=$lanes): events.tsv with $(grep -c '^task	' "$tmp/real$lanes/events.tsv") tasks, $(ls "$tmp/real$lanes" | grep -c '^prof_file_') FxT files"
    check_trace "real (tiny q8_0, STRATA_PROMPT_LANES=$lanes)" "$tmp/real$lanes" $kind
  else
    bad "generate --trace (STRATA_PROMPT_LANES=$lanes): $(tail -n 3 "$tmp/err")"
  fi
done

# 3. malformed logs: exit 1 and one line naming the file and the line
mal() { mkdir -p "$tmp/$1"; cat > "$tmp/$1/events.tsv"; }
sed '7s/^task	expert_rows	[0-9]*	/task	expert_rows	x	/' "$tmp/syn/events.tsv" | mal bad-layer
expect_error "non-numeric layer" "events.tsv:7: layer" "$STRATA" trace "$tmp/bad-layer"
sed '9s/	[^	]*$//' "$tmp/syn/events.tsv" | mal short
expect_error "missing field" "events.tsv:9: task: expected 10 fields" "$STRATA" trace "$tmp/short"
sed '1d' "$tmp/syn/events.tsv" | mal header
expect_error "no header" "events.tsv:1: not a strata event log" "$STRATA" trace "$tmp/header"
sed '6s/	0	\([0-9]*\)	\([0-9]*\)	/	7	\1	\2	/' "$tmp/syn/events.tsv" | mal worker
expect_error "undeclared worker" "events.tsv:6: task on worker 7" "$STRATA" trace "$tmp/worker"
{ head -n 5 "$tmp/syn/events.tsv"; printf 'task\trouter\t0\t-1\t-\t0\t500\t400\t0\tback in time\n'; } | mal reversed
expect_error "end before start" "events.tsv:6: task ends" "$STRATA" trace "$tmp/reversed"
{ head -n 3 "$tmp/syn/events.tsv"; printf 'task\tcombine\t0\t-1\t-\t0\t1\t2\t3\tbad \377 utf8\n'; } | mal utf8
expect_error "invalid UTF-8" "events.tsv:4: invalid UTF-8" "$STRATA" trace "$tmp/utf8"
head -c 3000 /dev/urandom | mal random
expect_error "random bytes" "events.tsv:1:" "$STRATA" trace "$tmp/random"
expect_error "missing directory" "$tmp/nope" "$STRATA" trace "$tmp/nope"
expect_error "unknown flag" "unknown option '--bogus'" "$STRATA" trace --bogus "$tmp/syn"

# 3b. a second recording into the same folder replaces the first: what strata trace made of the old
# one goes, and strata trace on the new one takes only its own events
"$STRATA" generate -m "$tiny" -p hi -n 6 --temp 0 --trace "$tmp/again" >/dev/null 2>&1 && "$STRATA" trace "$tmp/again" >/dev/null 2>&1
# what starpu_fxt_tool leaves in fxt/ (made here too, where the tool is missing), and a file of the user's
mkdir -p "$tmp/again/fxt" "$tmp/again2/fxt"
for f in dag.dot tasks.rec fxt_tool.log; do echo old > "$tmp/again/fxt/$f"; echo old > "$tmp/again2/fxt/$f"; done
echo mine > "$tmp/again2/fxt/notes.txt"
"$STRATA" generate -m "$tiny" -p hi -n 2 --temp 0 --trace "$tmp/again" >/dev/null 2>"$tmp/err"
if [ -s "$tmp/again/events.tsv" ] && [ ! -e "$tmp/again/timeline.svg" ] && [ ! -e "$tmp/again/summary.txt" ] \
   && [ ! -e "$tmp/again/fxt" ] && "$STRATA" trace "$tmp/again" >/dev/null 2>&1 && [ -s "$tmp/again/timeline.svg" ]; then
  ok "a second --trace into the same folder: the first's timeline, summary and fxt/ removed, the new recording renders"
else
  bad "a second --trace into the same folder: $(ls "$tmp/again" "$tmp/again/fxt" 2>&1 | tr '\n' ' ') $(tail -n 2 "$tmp/err")"
fi
"$STRATA" generate -m "$tiny" -p hi -n 2 --temp 0 --trace "$tmp/again2" >/dev/null 2>"$tmp/err"
if [ ! -e "$tmp/again2/fxt/dag.dot" ] && [ ! -e "$tmp/again2/fxt/tasks.rec" ] && [ "$(cat "$tmp/again2/fxt/notes.txt" 2>/dev/null)" = mine ]; then
  ok "--trace into a folder whose fxt/ holds a file of the user's: starpu_fxt_tool's files removed, the user's kept"
else
  bad "--trace with a user's file in fxt/: $(ls "$tmp/again2/fxt" 2>&1 | tr '\n' ' ') $(tail -n 2 "$tmp/err")"
fi
# 4. tune over two schedulers
if "$STRATA" tune -m "$tiny" --policies eager,lws --prompt 16 --decode 8 >"$tmp/out" 2>"$tmp/err"; then
  ranked=$(grep -cE '^[0-9]+ +(eager|lws) ' "$tmp/out")
  if [ "$ranked" = 2 ] && grep -q '^export STARPU_SCHED=\(eager\|lws\)$' "$tmp/out"; then
    ok "tune eager,lws: $(grep -E '^[0-9]+ ' "$tmp/out" | awk '{ printf "%s%s decode %s tok/s", (NR > 1 ? ", " : ""), $2, $NF }'); $(grep '^export' "$tmp/out")"
  else
    bad "tune table: $(cat "$tmp/out")"
  fi
else
  bad "tune exit status non-zero: $(cat "$tmp/out" "$tmp/err" | tail -n 5)"
fi
expect_error "tune without a model" "missing -m" "$STRATA" tune --policies eager
expect_error "tune with -n after --" "'-n' after -- would override" "$STRATA" tune -m "$tiny" -- -n 5
expect_error "tune with a policy listed twice" "'eager' is listed twice" "$STRATA" tune -m "$tiny" --policies eager,lws,eager
expect_error "tune with a worker count listed twice" "1 is listed twice" "$STRATA" tune -m "$tiny" --ncpu 1,2,1
for c in trace tune; do
  "$STRATA" $c --help >"$tmp/out" 2>&1 && grep -q "usage: strata $c" "$tmp/out" && ok "$c --help" || bad "$c --help: $(head -c 200 "$tmp/out")"
done

echo "test_trace: $pass passed, $fail failed"
[ "$fail" = 0 ]
