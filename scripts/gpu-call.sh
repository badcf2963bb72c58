#!/usr/bin/env bash
# One device call's driver: runs each argument (a space-separated list of
# scripts/gpu-agent.sh or scripts/gpu-bench.sh steps, e.g. "agent:setup build
# savebuild models" "agent:dense8") in turn, with results under a work folder,
# and after each one packs that folder into $OUT/results.tgz, so that what ran
# comes back even when a later step is cut off by the call's limit. The CUDA
# build's pieces (savebuild) go to $OUT as they are. CALL_LIMIT (default 570)
# is the call's seconds: each step's DEADLINE is what is left of it.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT: the output folder of the device call}"
R=${GPU_RESULTS:-/tmp/gpu-results}
LIMIT=${CALL_LIMIT:-570}
mkdir -p "$R"
for group in "$@"; do
  script=agent
  case $group in
    agent:*) group=${group#agent:} ;;
    bench:*) script=bench; group=${group#bench:} ;;
  esac
  left=$((LIMIT - SECONDS))
  [ "$left" -gt 20 ] || { echo "== skipped (call limit): $group" | tee -a "$R/log.txt"; continue; }
  # shellcheck disable=SC2086
  OUT=$R DEADLINE=$((left - 10)) timeout "$left" bash "scripts/gpu-$script.sh" $group
  echo "== [$SECONDS s] $script: $group: exit $?" | tee -a "$R/log.txt"
  mv "$R"/cudabuild.tar.xz.* "$OUT/" 2>/dev/null
  tar czf "$OUT/results.tgz.part" -C "$R" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
  cp "$R/log.txt" "$OUT/log.txt" 2>/dev/null
done
