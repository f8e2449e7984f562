#!/bin/sh
# Scheduler independence: the same prompt gives bitwise-identical logits under STARPU_SCHED=eager,
# lws and dmda, and with STARPU_NCPU=1 and 2 (the task slicing never depends on the workers).
# Prints the scheduler/worker settings compared and the checksum of each logits file.
set -u
: "${STRATA:=./strata}" "${FIXTURES:=../shared/fixtures}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
prompt='Mixture-of-experts models route every token through a few experts; the rest stay idle.'
for model in tiny-qwen3moe-bf16 tiny-qwen3moe-q8_0; do
  m="$FIXTURES/models/$model.gguf"
  ref=""
  for cfg in "STARPU_SCHED=lws STARPU_NCPU=2" "STARPU_SCHED=eager STARPU_NCPU=2" \
             "STARPU_SCHED=dmda STARPU_NCPU=2" "STARPU_SCHED=lws STARPU_NCPU=1" \
             "STARPU_SCHED=eager STARPU_NCPU=1"; do
    out="$tmp/$(echo "$model $cfg" | tr ' =' '__').f32"
    # dmda calibrates its performance models on first use; keep them out of $HOME for the test
    if ! env $cfg STARPU_HOME="$tmp" STARPU_SILENT=1 "$STRATA" eval -m "$m" -p "$prompt" --prefill 7 \
         --logits-out "$out" 2>"$tmp/err"; then
      echo "FAIL $model [$cfg]: eval failed: $(cat "$tmp/err")"; fail=$((fail + 1)); continue
    fi
    sum=$(cksum < "$out" | cut -d' ' -f1)
    if [ -z "$ref" ]; then
      ref=$out; echo "     $model [$cfg]: logits checksum $sum (baseline)"; continue
    fi
    if cmp -s "$ref" "$out"; then
      echo "PASS $model [$cfg]: logits checksum $sum, bitwise identical to the baseline"; pass=$((pass + 1))
    else
      echo "FAIL $model [$cfg]: logits checksum $sum differ from the baseline"; fail=$((fail + 1))
    fi
  done
done
echo "test_sched: $pass passed, $fail failed"
[ "$fail" = 0 ]
