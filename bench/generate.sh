#!/usr/bin/env bash
# Prompt and decode speed of `strata generate` on one model, under several StarPU schedulers,
# median of REPEAT runs each. Usage: bench/generate.sh MODEL [PROMPT_TOKENS] [GEN_TOKENS]
# Environment: SCHEDS (default "lws eager dmda"), REPEAT (3), STRATA (./strata).
# Prints one line per run, then a table of medians.
set -euo pipefail
model=${1:?usage: bench/generate.sh MODEL [PROMPT_TOKENS] [GEN_TOKENS]}
np=${2:-128}; ng=${3:-64}
STRATA=${STRATA:-./strata}; REPEAT=${REPEAT:-3}; SCHEDS=${SCHEDS:-lws eager dmda}
# A prompt of exactly np token ids (ids of ordinary word pieces, cycled).
ids=$(awk -v n="$np" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), 1000 + (i * 37) % 5000 }')
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
printf '%-8s %14s %14s\n' sched "prompt tok/s" "decode tok/s" > "$tmp/table"
for s in $SCHEDS; do
  : > "$tmp/p"; : > "$tmp/d"
  for r in $(seq "$REPEAT"); do
    STARPU_SCHED=$s STARPU_SILENT=1 STARPU_HOME="$tmp" "$STRATA" generate -m "$model" --prompt-ids "$ids" \
      -n "$ng" --temp 0 --ignore-eos --print-ids > /dev/null 2> "$tmp/err"
    p=$(sed -n 's/^prompt: .*(\([0-9.]*\) tok\/s)/\1/p' "$tmp/err")
    d=$(sed -n 's/^decode: .*(\([0-9.]*\) tok\/s)/\1/p' "$tmp/err")
    echo "$s run $r: prompt $p tok/s, decode $d tok/s" >&2
    echo "$p" >> "$tmp/p"; echo "$d" >> "$tmp/d"
  done
  printf '%-8s %14s %14s\n' "$s" "$(median < "$tmp/p")" "$(median < "$tmp/d")" >> "$tmp/table"
done
echo "model $model, prompt $np tokens, $ng generated, median of $REPEAT; $(grep 'StarPU workers' "$tmp/err")"
cat "$tmp/table"
