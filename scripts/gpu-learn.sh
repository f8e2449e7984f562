#!/usr/bin/env bash
# On a GPU host from the repository root, after scripts/gather-libs (builds nothing): zero-
# configuration GPU use (issue #23) on MODEL: `strata generate -m MODEL -p TEXT` with no placement
# flag, twice, with a fresh $XDG_CACHE_HOME: the first run starts from the prior and writes the
# learned profile, the second reads it. Prints each run's start-up lines about the expert profile
# and the cache, then its speed line.
# Usage: scripts/gpu-learn.sh MODEL [TOKENS (default 32)]
set -u
. "$(dirname "$0")/gpu-lib.sh"
m=$1
n=${2:-32}
export XDG_CACHE_HOME=$W/xdg-learn
rm -rf "$XDG_CACHE_HOME"
for run in 1 2; do
  t0=$SECONDS
  timeout 120 "$S" generate -m "$m" -p "Explain how a mixture of experts model routes each token." -n "$n" --temp 0 \
    > "$out/learn-$run.out" 2> "$out/learn-$run.err"
  rc=$?
  echo "== run $run: exit $rc ($((SECONDS - t0)) s)"
  grep -E "^strata: (expert profile|learned expert profile|expert cache|--expert-cache|primary cache|placement)|cache" "$out/learn-$run.err" | head -n 8
  grep -iE "decode|tok/s" "$out/learn-$run.err" | tail -n 2
done
ls -l "$XDG_CACHE_HOME/strata" 2>/dev/null | tail -n +2
