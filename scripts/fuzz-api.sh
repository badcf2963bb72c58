#!/usr/bin/env bash
# Schemathesis against a live `hypura serve` (issue 30: "a schemathesis run of 10 minutes
# against a spec-tight server reaches generation on every route with 0 server deaths").
#
#   scripts/fuzz-api.sh [SECONDS]      (default 600)
#
# Installs schemathesis into .venv-fuzz (PyPI) on first use, serves SmolLM2 (fetched by
# scripts/fetch-models.sh) on a free port under `ulimit -v 8G`, fuzzes every operation of
# GET /openapi.json for SECONDS, then reports: whether the server is still up, its peak RSS,
# the status codes seen, the 5xx responses (501 for /api/push and 503 for /ready before a
# model is loaded are what those routes mean), and the requests that ran a model, per route
# (hypura_requests_total with a model, status 200) — the proof that fuzzing got past validation.
# Not part of scripts/test.sh: it is a timed attack, not a test.
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_BUDGET=${1:-600}
OUT=${OUT:-/tmp/hypura-fuzz}
PORT=${PORT:-18620}
HYPURA=${HYPURA:-target/release/hypura}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
VENV=${VENV:-.venv-fuzz}
[ -x "$VENV/bin/schemathesis" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q schemathesis; } || exit 1
[ -x "$HYPURA" ] || cargo build --release -p hypura || exit 1
rm -rf "$OUT" && mkdir -p "$OUT/cache"
(ulimit -v $((8 << 20)); exec env HYPURA_CACHE_DIR="$OUT/cache" "$HYPURA" serve "$MODEL" --port "$PORT" \
  --parallel 2 --context 2048 --threads 2 >"$OUT/server.log" 2>&1) &
PID=$!
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/openapi.json" -o "$OUT/openapi.json" && break; sleep 0.2; done
[ -s "$OUT/openapi.json" ] || { echo "the server did not start"; tail -5 "$OUT/server.log"; exit 1; }
"$VENV/bin/schemathesis" run "$OUT/openapi.json" --url "http://127.0.0.1:$PORT" \
  --max-time "$SECONDS_BUDGET" --request-timeout 120 --workers 2 --checks not_a_server_error \
  --continue-on-failure --report ndjson --report-ndjson-path "$OUT/events.ndjson" \
  >"$OUT/schemathesis.txt" 2>&1
alive=no
kill -0 $PID 2>/dev/null && curl -sf -m 10 "http://127.0.0.1:$PORT/api/version" >/dev/null && alive=yes
echo "server alive after ${SECONDS_BUDGET} s of fuzzing: $alive"
echo "peak RSS: $(grep VmHWM /proc/$PID/status 2>/dev/null | awk '{print $2, $3}')"
curl -s -m 10 "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics.txt"
echo "generations finished: $(grep -E '^hypura_request_success_total' "$OUT/metrics.txt" | awk '{s += $2} END {print s + 0}')"
echo "answered 200 with a model, by route:"
grep -E '^hypura_requests_total\{model="[^"]+".*status="200"' "$OUT/metrics.txt" | sed 's/^hypura_requests_total//' | sort
python3 - "$OUT/events.ndjson" <<'PY'
import collections, json, sys
codes = collections.Counter()
errors = collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    try:
        event = json.loads(line)
    except ValueError:
        continue
    for value in event.values():
        if not isinstance(value, dict):
            continue
        for case in (value.get("recorder") or {}).get("interactions", {}).values():
            response = case.get("response") or {}
            request = case.get("request") or {}
            status = response.get("status_code")
            if status is None:
                continue
            codes[status] += 1
            if status >= 500:
                errors[(request.get("method"), request.get("uri", "").split("?")[0][-60:], status)] += 1
print("responses by status:", dict(sorted(codes.items())))
print("5xx:", sum(errors.values()))
for (method, uri, status), n in errors.most_common(20):
    print(f"  {n:5d}  {status} {method} {uri}")
PY
tail -15 "$OUT/schemathesis.txt"
kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null
[ "$alive" = yes ]
