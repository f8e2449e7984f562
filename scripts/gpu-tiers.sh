#!/usr/bin/env bash
# The second-GPU tiers on a host with two GPUs (nvidia-h200-x2), from the repository root after
# scripts/gather-libs (carry/ travels with the tree). Builds nothing.
#   scripts/gpu-tiers.sh check   exactness gates on the tiny Q8_0 fixture (three prompts, greedy):
#                                every tier layout that holds all experts on GPUs vs one card
#                                caching them all; the host route vs P2P; remote-expert-opt
#   scripts/gpu-tiers.sh one     the stand-in on one card (nvidia-h200): STARPU_NWORKER_PER_CUDA=2,
#                                the helper tier on CUDA0.1 (stripe, layer placement) vs CUDA0
#                                caching every pair, on the tiny Q8_0 fixture (three prompts, greedy)
#   scripts/gpu-tiers.sh exact   the same gates on a qwen3-30b-a3b-preset Q8_0 model (made once
#                                into models/, kept while the machine stays warm)
#   scripts/gpu-tiers.sh table [PROMPT DEPTHS REPS]  strata bench per setup (ONLY=REGEX picks setups;
#                                e.g. table 32768 32768,1024 3: the 32K decode reuses the prompt), each card's cache
#                                limited to 4000 pairs (18.7 GiB: a 24 GB card with the dense
#                                weights and KV cache, as in the single-GPU bench), median of REPS
#                                (strata bench -r REPS: one load per setup)
# Prints a short table last. The 32K table takes ~16 minutes, longer than one device call: start it
# detached at the end of a call, then wait in the next calls (each within the machine's idle window):
#   (OUT=/tmp/tab setsid nohup scripts/gpu-tiers.sh table 32768 32768,1024 3 > /tmp/tab.log 2>&1 &)
#   for i in $(seq 57); do sleep 10; grep -q "===== summary" /tmp/tab.log && break; done; cat /tmp/tab/table.tsv
set -u
C=${CARRY:-carry}
export LD_LIBRARY_PATH=$PWD/$C/lib STARPU_SILENT=1 STARPU_HOME=/tmp/strata-starpu-home
S=$PWD/$C/strata
out=${OUT:-/tmp}
mode=${1:-check}
rows=()
prompts=("<|im_start|>user\nWhat is a good name for a cat?<|im_end|>\n<|im_start|>assistant\n"
         "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
         "Question: what is 17 * 23? Answer step by step.\n")
pnames=(chat code math)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader

big_model() {
  mkdir -p models
  M=models/q30b-q8_0.gguf
  if [ ! -s $M ]; then
    STRATA_TOKENIZER_JSON=$C/tokenizer.json "$S" mkmodel -q -o $M --preset qwen3-30b-a3b --type q8_0 || exit 1
  fi
  if [ ! -s models/q30b.profile ]; then
    yes 'The history of mixture of experts models and their routing, with code: for i in range(10): print(i)' | head -n 40 > /tmp/calib30.txt
    "$S" profile -m $M -f /tmp/calib30.txt -o models/q30b.profile 2>&1 | tail -n 1
  fi
  P=models/q30b.profile
}

# gate NAME REF_LOG ENV... -- FLAGS: greedy ids of the three prompts vs the reference run's
gate() {
  local name=$1 ref=$2; shift 2
  local envs=() all=PASS
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  for i in 0 1 2; do
    got=$(env "${envs[@]}" "$S" generate -m "$M" -p "$(printf '%b' "${prompts[$i]}")" -n "$N" --temp 0 --ignore-eos --print-ids \
          --expert-profile "$P" "$@" 2>"$out/gate.err")
    [ -n "$got" ] || { all="FAIL (${pnames[$i]}: $(tail -n 1 "$out/gate.err"))"; break; }
    if [ "$ref" = "-" ]; then echo "$got" > "$out/ref_$i"; continue; fi
    [ "$got" = "$(cat "$out/ref_$i")" ] || all="FAIL (${pnames[$i]}: $got vs $(cat "$out/ref_$i"))"
  done
  grep -E "expert cache|P2P|host route|layer split" "$out/gate.err" | head -n 4
  grep -E "^expert entries" "$out/gate.err"
  rows+=("$name: $all")
}

gates() { # pairs = all pairs of the model; half = the primary's share in the split runs; QUICK=1: the issue's gates only
  gate "reference: one card caches all $pairs pairs" - -- --expert-cache $pairs
  gate "(a) two GPUs visible, no second-GPU flag vs CUDA_VISIBLE_DEVICES=0" x CUDA_VISIBLE_DEVICES=0 -- --expert-cache $pairs
  gate "(b) peer: CUDA0 $half + peer the rest vs one card" x -- --expert-cache $half --peer-device 1 --peer-slots $((pairs - half))
  gate "(c) peer, host route (STRATA_PEER_NO_P2P=1) vs one card" x STRATA_PEER_NO_P2P=1 -- --expert-cache $half --peer-device 1 --peer-slots $((pairs - half))
  [ "${QUICK:-0}" = 1 ] || gate "    peer, --peer-prefill-rows 0 vs one card" x -- --expert-cache $half --peer-device 1 --peer-slots $((pairs - half)) --peer-prefill-rows 0
  gate "helper CUDA1 stripe: CUDA0 $half + helper the rest vs one card" x -- --expert-cache $half --expert-cache-device1 $((pairs - half))
  [ "${QUICK:-0}" = 1 ] || gate "helper CUDA1 layer placement vs one card" x -- --expert-cache $half --expert-cache-device1 $((pairs - half)) --gpu-placement layer
  [ "${QUICK:-0}" = 1 ] || gate "helper CUDA1 auto vs one card" x -- --expert-cache $half --expert-cache-device1 auto
  gate "layer split, every stage caches its layers vs one card" x -- --layer-split auto --expert-cache $pairs
  "$S" generate -m "$M" -p hi -n 1 --expert-profile "$P" --expert-cache $half --expert-cache-device1 8 --expert-cache-device2 8 \
    --expert-cache-device3 8 >/dev/null 2>"$out/three.err"
  rows+=("three helpers on two GPUs: exit $? '$(tail -n 1 "$out/three.err")'")
  # three helpers on two cards: two StarPU workers per device give CUDA1, CUDA0.1 and CUDA1.1
  q=$((pairs / 4))
  gate "three helpers (STARPU_NWORKER_PER_CUDA=2), stripe, vs one card" x STARPU_NWORKER_PER_CUDA=2 -- \
    --expert-cache $q --expert-cache-device1 $q --expert-cache-device2 $q --expert-cache-device3 $((pairs - 3 * q))
  [ "${QUICK:-0}" = 1 ] || gate "three helpers (STARPU_NWORKER_PER_CUDA=2), layer placement, vs one card" x STARPU_NWORKER_PER_CUDA=2 -- \
    --expert-cache $q --expert-cache-device1 $pairs --expert-cache-device2 $pairs --expert-cache-device3 $pairs --gpu-placement layer
  [ "${QUICK:-0}" = 1 ] || gate "--remote-expert-opt (not claimed bitwise identical)" x -- --expert-cache $half --expert-cache-device1 $((pairs - half)) --remote-expert-opt
}

case $mode in
check)
  M=$C/fixtures/models/tiny-qwen3moe-q8_0.gguf; N=32; pairs=64; half=24
  printf 'The quick brown fox jumps over the lazy dog.\nMixture-of-experts models route every token.\n' > "$out/calib.txt"
  "$S" profile -m "$M" -f "$out/calib.txt" -o "$out/tiny.profile" 2>&1 | tail -n 1
  P=$out/tiny.profile
  gates
  gate "adaptive peer: 16 + 16 slots, --adapt-swaps 4 (runs; the set moves)" - -- --expert-cache 16 --peer-device 1 --peer-slots 16 --adapt-swaps 4 --adapt-interval 8
  grep -c "adapt:" "$out/gate.err" | sed 's/^/adaptive swaps logged: /'
  ;;
one)
  M=$C/fixtures/models/tiny-qwen3moe-q8_0.gguf; N=32; pairs=64; half=24
  printf 'The quick brown fox jumps over the lazy dog.\nMixture-of-experts models route every token.\n' > "$out/calib.txt"
  "$S" profile -m "$M" -f "$out/calib.txt" -o "$out/tiny.profile" 2>&1 | tail -n 1
  P=$out/tiny.profile
  gate "reference: CUDA0 caches all $pairs pairs" - -- --expert-cache $pairs
  gate "two workers on CUDA0, no helper flag vs one worker" x STARPU_NWORKER_PER_CUDA=2 -- --expert-cache $pairs
  gate "helper CUDA0.1 stripe: CUDA0 $half + helper the rest vs CUDA0 alone" x STARPU_NWORKER_PER_CUDA=2 -- \
    --expert-cache $half --expert-cache-device1 $((pairs - half))
  gate "helper CUDA0.1 layer placement vs CUDA0 alone" x STARPU_NWORKER_PER_CUDA=2 -- \
    --expert-cache $half --expert-cache-device1 $pairs --gpu-placement layer
  gate "helper CUDA0.1 stripe, --cuda-graphs off vs CUDA0 alone" x STARPU_NWORKER_PER_CUDA=2 -- \
    --expert-cache $half --expert-cache-device1 $((pairs - half)) --cuda-graphs off
  ;;
exact)
  big_model; N=16; pairs=6144; half=3000
  QUICK=1 gates
  ;;
table)
  big_model
  PR=${2:-4096}; DEPTHS=${3:-1024,4096}; REPS=${4:-1}
  # (STARPU_LIMIT_CUDA_MEM=24576 was tried: StarPU then reclaims buffers every step at the edge of
  # the limit and decode falls to ~6 tok/s on every setup; explicit slot counts emulate the card)
  bench() { # ONLY=REGEX runs the setups whose name matches (to split the table over calls)
    local name=$1; shift
    [[ "$name" =~ ${ONLY:-.} ]] || return 0
    local t0=$SECONDS
    timeout 590 env "${BENV[@]}" "$S" bench -m $M --prompt "$PR" --decode 32 --depth "$DEPTHS" -r "$REPS" --expert-profile $P "$@" \
      > "$out/b.txt" 2> "$out/b.err" || { rows+=("$name: failed: $(tail -n 1 "$out/b.err")"); return; }
    grep -E "expert cache|^  |runs" "$out/b.err" "$out/b.txt" | head -n 12
    # the rows are the median runs; "prompt of N" / "decode at depth N" lines list every run
    awk -v n="$name" '/^(prompt|decode) +[0-9]+ +[0-9]+ / {row[++k] = n "\t" $1 " " ($1=="prompt"?$2:$3) "\t" $5 " tok/s"}
         / runs \(tok\/s\):/ {sub(/.*:/, ""); run[++j] = " (runs:" $0 ")"}
         END {for (i = 1; i <= k; i++) print row[i] run[i]}' "$out/b.txt" >> "$out/table.tsv"
    echo "$name: $((SECONDS - t0)) s"
  }
  : > "$out/table.tsv"
  BENV=(CUDA_VISIBLE_DEVICES=0); bench "single GPU, 4000 slots" --expert-cache 4000
  BENV=(); bench "helper cache on CUDA1 (4000 + 4000)" --expert-cache 4000 --expert-cache-device1 4000
  bench "helper + --remote-expert-opt" --expert-cache 4000 --expert-cache-device1 4000 --remote-expert-opt
  bench "layer split (4000 per stage)" --layer-split auto --expert-cache 4000
  bench "peer tier (--peer-device 1, 4000 + 4000)" --expert-cache 4000 --peer-device 1 --peer-slots 4000
  rows+=("$(cat "$out/table.tsv")")
  ;;
esac
echo "===== summary ($mode)"
printf '%s\n' "${rows[@]}"
