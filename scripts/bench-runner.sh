#!/usr/bin/env bash
# Decode speed through a runner process (`hypura serve`, the default) next to
# the same model run inside the server's process (`hypura serve --in-process`).
#
#   scripts/bench-runner.sh [MODEL] [N_TOKENS] [GENERATIONS] [ROUNDS]
#
# Each round starts both servers in turn (the order alternates between rounds),
# warms each with one short request, then times GENERATIONS generations of N_TOKENS
# tokens at temperature 0 (one at a time) and takes the median of
# eval_count / eval_duration from the responses. Prints each round and the
# median over rounds with the ratio runner / in-process.
# HYPURA_BIN: the binary (default: built here, target/release/hypura).
# THREADS: decode threads (default: all cores). HYPURA_ARGS: more serve flags.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
n="${2:-128}"
generations="${3:-10}"
rounds="${4:-3}"
threads="${THREADS:-$(nproc)}"
target="${CARGO_TARGET_DIR:-target}"
bin="${HYPURA_BIN:-$target/release/hypura}"
if [ -z "${HYPURA_BIN:-}" ]; then
  cargo build --release -q -p hypura
fi
# A saved profile: the server then never measures this machine in the background.
profile="${PROFILE:-config/profiles/h200.json}"
work=$(mktemp -d)
server_pid=
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# Median tok/s of one server: `bench_one runner|in-process`.
bench_one() {
  local mode=$1 flag=
  [ "$mode" = in-process ] && flag=--in-process
  : > "$work/log"
  "$bin" serve "$model" --port 0 --parallel 1 --threads "$threads" --profile "$profile" \
    $flag ${HYPURA_ARGS:-} 2>"$work/log" &
  server_pid=$!
  local base=
  for _ in $(seq 600); do
    base=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$work/log" | head -1)
    [ -n "$base" ] && break
    sleep 0.1
  done
  [ -n "$base" ] || { cat "$work/log" >&2; echo "the server did not start" >&2; exit 1; }
  local name body
  name=$(basename "$model" .gguf):latest
  body="{\"model\": \"$name\", \"prompt\": \"The history of the city of Paris begins\", \"raw\": true,
         \"stream\": false, \"options\": {\"temperature\": 0, \"num_predict\": $n}}"
  # Loads the model (and warms its caches) with a short generation.
  curl -sf "$base/api/generate" -d "${body/\"num_predict\": $n/\"num_predict\": 8}" >/dev/null
  for _ in $(seq "$generations"); do
    curl -sf "$base/api/generate" -d "$body" |
      python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["eval_count"] / r["eval_duration"] * 1e9)'
  done | median
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=
}

r_all=(); p_all=()
for i in $(seq "$rounds"); do
  if [ $((i % 2)) = 1 ]; then
    r=$(bench_one runner); p=$(bench_one in-process)
  else
    p=$(bench_one in-process); r=$(bench_one runner)
  fi
  echo "round $i: runner $r tok/s, in-process $p tok/s, ratio $(python3 -c "print(round($r/$p, 3))")"
  r_all+=("$r"); p_all+=("$p")
done
rm=$(printf '%s\n' "${r_all[@]}" | median)
pm=$(printf '%s\n' "${p_all[@]}" | median)
echo "median decode: runner $rm tok/s, in-process $pm tok/s, ratio $(python3 -c "print(round($rm/$pm, 3))") ($(basename "$model"), $n tokens, $generations generations x $rounds rounds, $threads threads)"
