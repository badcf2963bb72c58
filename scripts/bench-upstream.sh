#!/usr/bin/env bash
# First-token latency through a front hypura (no model of its own, routing to
# a peer with `--upstream`) next to the same request sent to the peer directly.
#
#   scripts/bench-upstream.sh [MODEL] [REQUESTS]
#
# Starts the peer with MODEL and the front, warms the model, then sends
# REQUESTS pairs of the same streamed greedy /api/chat (one at a time,
# alternating direct and through the front) and times each from sending to
# the first line carrying text. Prints the median and p90 of each and the
# median of the pairwise difference (front − direct): the front's overhead.
# HYPURA_BIN: the binary (default: built here, target/release/hypura).
# ROUTE=generate: a raw /api/generate instead (for a model without a chat
# template, e.g. a synthetic one).
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
requests="${2:-20}"
target="${CARGO_TARGET_DIR:-target}"
bin="${HYPURA_BIN:-$target/release/hypura}"
if [ -z "${HYPURA_BIN:-}" ]; then
  cargo build --release -q -p hypura
fi
# A saved profile: the servers never measure this machine in the background.
profile="${PROFILE:-config/profiles/h200.json}"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

# Starts `hypura serve ARGS...` logging to $work/NAME; sets $base to its URL.
start() {
  local name=$1; shift
  "$bin" serve "$@" --port 0 --profile "$profile" >/dev/null 2>"$work/$name" &
  pids+=($!)
  base=
  for _ in $(seq 600); do
    base=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$work/$name" | head -1)
    [ -n "$base" ] && break
    sleep 0.1
  done
  [ -n "$base" ] || { cat "$work/$name" >&2; echo "$name did not start" >&2; exit 1; }
}

start peer "$model" --parallel 1
peer=$base
start front --upstream "$peer"
front=$base
name=$(basename "$model" .gguf):latest

python3 - "$peer" "$front" "$name" "$requests" "${ROUTE:-chat}" <<'PY'
import json, statistics, sys, time, urllib.request

peer, front, name, requests = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
chat = sys.argv[5] != "generate"
options = {"temperature": 0, "num_predict": 4}
if chat:
    route = "/api/chat"
    body = {"model": name, "options": options,
            "messages": [{"role": "user", "content": "Name three rivers of Europe."}]}
else:
    route = "/api/generate"
    body = {"model": name, "options": options, "raw": True,
            "prompt": "Name three rivers of Europe."}
body = json.dumps(body).encode()

def text_of(chunk):
    return chunk.get("message", {}).get("content") if chat else chunk.get("response")

def first_token_ms(base):
    """Milliseconds to the first line carrying text (else to the last line)."""
    request = urllib.request.Request(base + route, data=body,
                                     headers={"content-type": "application/json"})
    sent = time.perf_counter()
    first = last = None
    with urllib.request.urlopen(request) as reply:
        for line in reply:
            chunk = json.loads(line)
            last = (time.perf_counter() - sent) * 1e3
            if first is None and text_of(chunk):
                first = last
    return first if first is not None else last

for base in (peer, front):  # load the model and warm its prompt cache
    first_token_ms(base)
direct, through = [], []
for _ in range(requests):
    direct.append(first_token_ms(peer))
    through.append(first_token_ms(front))

def p90(xs):
    return sorted(xs)[max(0, int(len(xs) * 0.9) - 1)]

overhead = [t - d for d, t in zip(direct, through)]
print(f"first token, {requests} requests each (ms): "
      f"direct median {statistics.median(direct):.1f} p90 {p90(direct):.1f}; "
      f"through the front median {statistics.median(through):.1f} p90 {p90(through):.1f}; "
      f"front - direct median {statistics.median(overhead):.1f}")
PY
