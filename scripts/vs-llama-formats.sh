#!/usr/bin/env bash
# strata against llama.cpp on files llama.cpp's own llama-quantize writes (issue #25): a bf16 model
# made by `strata mkmodel` (the tiny preset with every row 256 long: hidden size, expert FFN and
# heads x head_dim, so that the 128- and 256-weight blocks apply to every matrix), quantised by llama-quantize to each format, then the last
# position's logits of four prompts from llama.cpp's CPU build (llama_logits, ../shared/tools) and
# from strata (`strata eval`, CPU only) on the same file: mean |Δlogit| / σ (σ: the standard
# deviation of llama.cpp's logits), max |Δ|, and whether the top-1 ids agree (required where
# llama.cpp's margin between its first two logits is over 0.1 σ, as the fixtures' tolerance
# rules do; "tie" below). Prints a table last.
# Needs nothing but this build and ../shared/tools/llama-cpu-avx2.tar.xz (unpacked to $W).
# IQ2_XXS, IQ1_S and IQ1_M need an importance matrix: llama-imatrix computes one on this
# repository's README and ../shared/docs/DESIGN.md (128-token chunks) first.
# Usage: scripts/vs-llama-formats.sh [FORMAT ...]
#   (default: q2_0 q1_0 tq2_0 tq1_0 iq2_xxs iq1_s iq1_m)
# Environment: W (work folder, default /tmp/vs-llama-formats), STRATA (default ./strata),
# TOOLS (the tar, default ../shared/tools/llama-cpu-avx2.tar.xz), BOUND (mean |Δ|/σ, default 0.05),
# SRC (another bf16 source, e.g. a fixture of ../shared/fixtures/archs: its quantised files are named
# after it, and the four prompts are the ids of its reference JSON, REF, default SRC with
# -reference.json for .gguf); e.g. issue #24's MXFP4 check:
#   SRC=../shared/fixtures/archs/tiny-gpt-oss-bf16.gguf scripts/vs-llama-formats.sh mxfp4_moe
set -u
cd "$(dirname "$0")/.."
W=${W:-/tmp/vs-llama-formats}
STRATA=${STRATA:-./strata}
TOOLS=${TOOLS:-../shared/tools/llama-cpu-avx2.tar.xz}
BOUND=${BOUND:-0.05}
formats=${*:-q2_0 q1_0 tq2_0 tq1_0 iq2_xxs iq1_s iq1_m}
mkdir -p "$W"
[ -x "$W/llama-cpu/llama-quantize" ] || tar xJf "$TOOLS" -C "$W" || { echo "cannot unpack $TOOLS" >&2; exit 1; }
export LD_LIBRARY_PATH="$W/llama-cpu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -n "${SRC:-}" ]; then
  src=$SRC
  base=$(basename "$src" .gguf); base=${base%-bf16}
  REF=${REF:-${src%.gguf}-reference.json}
  mapfile -t prompts < <(python3 -c 'import json,sys; [print(",".join(map(str, p["ids"]))) for p in json.load(open(sys.argv[1]))["prompts"]]' "$REF") \
    || { echo "cannot read the prompts of $REF" >&2; exit 1; }
else
  src=$W/tiny-r256-bf16.gguf
  base=tiny-r256
  [ -s "$src" ] || "$STRATA" mkmodel -q --preset tiny --hidden 256 --expert-ffn 256 --head-dim 64 --type bf16 -o "$src" || exit 1
  prompts=("785,3974,293,4830,282,5131,7784,82" "13,1187,4246,5562,13,2,916,279,1187" "40,1079,264,1273,13" \
           "151644,872,198,9707,0,151645,198,151644,77091,198")
fi
rows=()
fail=0
for f in $formats; do
  q=$W/$base-$f.gguf
  imx=()
  case $f in iq2_xxs | iq1_s | iq1_m)
    if [ ! -s "$W/imatrix-$base.gguf" ]; then
      cat README.md ../shared/docs/DESIGN.md > "$W/calib.txt" 2>/dev/null
      "$W/llama-cpu/llama-imatrix" -m "$src" -f "$W/calib.txt" -o "$W/imatrix-$base.gguf" -c 128 -t 2 > "$W/imatrix.log" 2>&1 \
        || { echo "llama-imatrix failed: $(tail -n 2 "$W/imatrix.log")"; fail=$((fail + 1)); continue; }
    fi
    imx=(--imatrix "$W/imatrix-$base.gguf") ;;
  esac
  if [ ! -s "$q" ]; then
    if ! "$W/llama-cpu/llama-quantize" "${imx[@]}" "$src" "$q" "$(echo "$f" | tr a-z A-Z)" > "$W/quantize-$f.log" 2>&1; then
      echo "llama-quantize $f failed: $(tail -n 2 "$W/quantize-$f.log")"; fail=$((fail + 1)); continue
    fi
  fi
  for i in "${!prompts[@]}"; do
    ids=${prompts[$i]}
    "$W/llama-cpu/llama_logits" -m "$q" -p "$ids" -o "$W/l-$base-$f-$i.f32" -t 2 --kv f32 > "$W/llama-$base-$f-$i.log" 2>&1 \
      || { echo "llama_logits $f prompt $i failed: $(tail -n 2 "$W/llama-$base-$f-$i.log")"; fail=$((fail + 1)); continue; }
    STARPU_NCUDA=0 STARPU_SILENT=1 "$STRATA" eval -m "$q" --prompt-ids "$ids" -ctk f32 -ctv f32 --no-learn \
      --logits-out "$W/s-$base-$f-$i.f32" > "$W/strata-$base-$f-$i.log" 2>&1 \
      || { echo "strata eval $f prompt $i failed: $(tail -n 2 "$W/strata-$base-$f-$i.log")"; fail=$((fail + 1)); continue; }
    r=$(python3 - "$W/l-$base-$f-$i.f32" "$W/s-$base-$f-$i.f32" "$BOUND" <<'EOF'
import struct, sys, math
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
n = len(a) // 4
l = struct.unpack("<%df" % n, a); s = struct.unpack("<%df" % n, b[-4 * n:])
mu = sum(l) / n; sd = math.sqrt(sum((x - mu) ** 2 for x in l) / n)
d = [abs(x - y) for x, y in zip(l, s)]
mean = sum(d) / n / sd
order = sorted(range(n), key=lambda i: -l[i])
margin = (l[order[0]] - l[order[1]]) / sd
top = order[0] == max(range(n), key=lambda i: s[i])
# top-1 is held to agreement only where llama.cpp's own margin is over 0.1 sigma (the fixtures' rule:
# two correct engines may break a near tie differently)
tie = margin <= 0.1
ok = mean <= float(sys.argv[3]) and (top or tie)
print("%s %.4f %.3e %s %.3f" % ("PASS" if ok else "FAIL", mean, max(d), "yes" if top else ("tie" if tie else "no"), margin))
EOF
)
    set -- $r
    [ "$1" = PASS ] || fail=$((fail + 1))
    echo "$1 $f prompt $i: mean |Δ|/σ $2 (≤ $BOUND), max |Δ| $3, top-1 equal: $4 (llama.cpp's top-1 margin $5 σ; held to it above 0.1 σ)"
    rows+=("| $f | $i | $2 | $3 | $4 | $5 |")
  done
done
echo
echo "| format | prompt | mean \|Δ\|/σ | max \|Δ\| | top-1 equal | llama.cpp's top-1 margin / σ |"
echo "|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
echo "vs-llama-formats: $fail failed"
[ "$fail" = 0 ]
