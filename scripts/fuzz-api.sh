#!/usr/bin/env bash
# Schemathesis against a live `hypura serve` (issue 30: "a schemathesis run of 10 minutes
# against a spec-tight server reaches generation on every route with 0 server deaths").
#
#   scripts/fuzz-api.sh [SECONDS]      (default 600)
#
# Installs schemathesis into .venv-fuzz (PyPI) on first use, serves SmolLM2 (fetched by
# scripts/fetch-models.sh) on a free port under `ulimit -v 8G`, and fuzzes every operation of
# GET /openapi.json for SECONDS with the fuzz profile below, then reports: whether the server is
# still up (deaths: 0 or 1), its RSS at the end and at its peak, the status codes seen, the 5xx
# responses (501 for /api/push and 503 for /ready before a model is loaded are what those routes
# mean), and per generation route the 2xx answers that generated (loads and unloads left out)
# against the requests sent, with the finished generations of the metrics. FUZZ_ROUTES (a
# regex) restricts the operations fuzzed (default: all); FUZZ_ARGS adds schemathesis options
# (`--mode positive --checks positive_data_acceptance` finds where the document allows what the
# server refuses).
#
# The fuzz profile: the document the server serves is already as strict as its validation
# (src/api/openapi.rs); what a document cannot say is fixed here, so that the requests reach
# generation instead of 400s and 404s:
# - `model` of the generation routes: the served model's name (an enum of one);
# - token limits (`max_tokens`, `num_predict`, …): at most FUZZ_MAX_TOKENS (8), and the
#   server's --default-max-tokens too, so a reply is short;
# - what depends on the model: token ids below its vocabulary size, embedding `dimensions` up
#   to its length, `think` false (SmolLM2 does not think), no `options.num_ctx` (each new one
#   reloads the model);
# - cross-field rules: `tool_choice` auto or none (the others need tools, by name), tools or a
#   response format but not both (SmolLM2's template has no tool support), `top_logprobs` 0
#   unless `logprobs` (chat completions).
# Not part of scripts/test.sh: it is a timed attack, not a test.
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_BUDGET=${1:-600}
OUT=${OUT:-/tmp/hypura-fuzz}
PORT=${PORT:-18620}
HYPURA=${HYPURA:-target/release/hypura}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
VENV=${VENV:-.venv-fuzz}
FUZZ_MAX_TOKENS=${FUZZ_MAX_TOKENS:-8}
FUZZ_ROUTES=${FUZZ_ROUTES:-}
FUZZ_ARGS=${FUZZ_ARGS:---checks not_a_server_error}
[ -x "$VENV/bin/schemathesis" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q schemathesis; } || exit 1
[ -x "$HYPURA" ] || cargo build --release -p hypura || exit 1
rm -rf "$OUT" && mkdir -p "$OUT/cache"
(ulimit -v $((8 << 20)); exec env HYPURA_CACHE_DIR="$OUT/cache" "$HYPURA" serve "$MODEL" --port "$PORT" \
  --parallel 2 --context 2048 --threads 2 --default-max-tokens "$FUZZ_MAX_TOKENS" \
  >"$OUT/server.log" 2>&1) &
PID=$!
BASE="http://127.0.0.1:$PORT"
for _ in $(seq 600); do curl -sf "$BASE/openapi.json" -o "$OUT/served.json" && break; sleep 0.2; done
[ -s "$OUT/served.json" ] || { echo "the server did not start"; tail -5 "$OUT/server.log"; exit 1; }
RSS_START=$(awk '/VmRSS/ {print $2}' /proc/$PID/status)
python3 - "$BASE" "$OUT/served.json" "$OUT/openapi.json" "$FUZZ_MAX_TOKENS" <<'PY' || exit 1
import copy, json, sys, urllib.request
base, served, out, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
doc = json.load(open(served))
def get(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    return json.load(urllib.request.urlopen(urllib.request.Request(base + path, data=data)))
name = get("/api/tags")["models"][0]["name"]
info = get("/api/show", {"model": name})["model_info"]
arch = info["general.architecture"]
vocab = info.get(f"{arch}.vocab_size") or len(get("/api/show", {"model": name, "verbose": True})["model_info"].get("tokenizer.ggml.tokens", [])) or 32000
width = info.get(f"{arch}.embedding_length", 64)
schemas = doc["components"]["schemas"]
bodies = {
    "/api/generate": "GenerateRequest", "/api/chat": "ChatRequest", "/api/embed": "EmbedRequest",
    "/api/embeddings": "EmbeddingsRequest", "/v1/chat/completions": "ChatCompletionRequest",
    "/v1/completions": "CompletionRequest", "/v1/embeddings": "EmbeddingRequest",
    "/v1/responses": "ResponsesRequest", "/v1/messages": "MessagesRequest",
    "/v1/messages/count_tokens": "MessagesRequest",
}
def walk(schema, visit):
    if isinstance(schema, dict):
        visit(schema)
        for value in schema.values():
            walk(value, visit)
    elif isinstance(schema, list):
        for value in schema:
            walk(value, visit)
def cap_tokens(schema):
    if schema.get("type") == "integer" and schema.get("maximum", 0) >= 2**31 - 1 and schema.get("minimum") == 0:
        schema["maximum"] = vocab - 1   # a token id
for body in set(bodies.values()):
    s = schemas[body]
    props = s["properties"]
    props["model"] = {"type": "string", "enum": [name]}
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if key in props:
            props[key] = {"type": "integer", "minimum": 0, "maximum": max_tokens}
    for key in ("context", "input"):
        if key in props:
            walk(props[key], cap_tokens)
    if "logit_bias" in props:   # token ids with fewer digits than the vocabulary size
        props["logit_bias"]["propertyNames"] = {"type": "string", "pattern": "^[0-9]{1,%d}$" % (len(str(vocab)) - 1)}
    if "dimensions" in props:
        props["dimensions"] = {"type": "integer", "minimum": 1, "maximum": width}
    if "think" in props:
        props["think"] = {"type": "boolean", "enum": [False]}
    if "tool_choice" in props:
        props["tool_choice"] = ({"type": "object", "properties": {"type": {"enum": ["auto", "none"]}}, "required": ["type"]}
                                if body == "MessagesRequest" else {"enum": ["auto", "none"]})
    if body == "ChatCompletionRequest":
        props["top_logprobs"] = {"type": "integer", "minimum": 0, "maximum": 0}
    fmt = next((k for k in ("format", "response_format", "text") if k in props), None)
    if "tools" in props and fmt:
        without_tools, without_format = copy.deepcopy(s), copy.deepcopy(s)
        without_tools["properties"]["tools"] = {"type": "array", "maxItems": 0}
        del without_format["properties"][fmt]
        schemas[body] = {"anyOf": [without_tools, without_format]}
opts = schemas["OllamaOptions"]["properties"]
opts.pop("num_ctx", None)
opts["num_predict"] = {"type": "integer", "minimum": -2, "maximum": max_tokens}
json.dump(doc, open(out, "w"), indent=1)
print(f"fuzz profile: model {name}, vocabulary {vocab}, embedding length {width}, at most {max_tokens} tokens a reply")
PY
INCLUDE=()
[ -n "$FUZZ_ROUTES" ] && INCLUDE=(--include-path-regex "$FUZZ_ROUTES")
"$VENV/bin/schemathesis" run "$OUT/openapi.json" --url "$BASE" "${INCLUDE[@]}" \
  --max-time "$SECONDS_BUDGET" --request-timeout 120 --workers 2 $FUZZ_ARGS \
  --continue-on-failure --suppress-health-check all --generation-database none \
  --report ndjson --report-ndjson-path "$OUT/events.ndjson" \
  >"$OUT/schemathesis.txt" 2>&1
deaths=1
kill -0 $PID 2>/dev/null && curl -sf -m 10 "$BASE/api/version" >/dev/null && deaths=0
echo "server deaths after ${SECONDS_BUDGET} s of fuzzing: $deaths"
echo "RSS: $(awk '/VmRSS/ {print $2}' /proc/$PID/status 2>/dev/null) kB at the end, $(awk '/VmHWM/ {print $2}' /proc/$PID/status 2>/dev/null) kB at its peak, $RSS_START kB at the start"
curl -s -m 10 "$BASE/metrics" >"$OUT/metrics.txt"
echo "generations finished (metrics): $(grep -E '^hypura_request_success_total' "$OUT/metrics.txt" | awk '{s += $2} END {print s + 0}')"
echo "answered 200 with a model, by route (metrics; loads included):"
grep -E '^hypura_requests_total\{.*model="[^"]+".*status="200"' "$OUT/metrics.txt" | sed -E 's/.*route="([^"]+)".* ([0-9]+)$/  \1 \2/' | sort
python3 - "$OUT/events.ndjson" <<'PY'
import base64, collections, json, sys
GENERATION = ["/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/v1/chat/completions",
              "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages"]
codes, errors = collections.Counter(), collections.Counter()
sent, ok, generated = collections.Counter(), collections.Counter(), collections.Counter()
def body_text(response):
    body = response.get("body") or response.get("content") or ""
    if isinstance(body, dict):
        body = body.get("$base64") or body.get("base64") or body.get("string") or ""
        try:
            return base64.b64decode(body).decode("utf-8", "replace")
        except Exception:
            return str(body)
    return str(body)
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
            path = "/" + request.get("uri", "").split("?")[0].split("/", 3)[-1]
            codes[status] += 1
            sent[path] += 1
            if status >= 500:
                errors[(request.get("method"), path[-60:], status)] += 1
            if 200 <= status < 300:
                ok[path] += 1
                text = body_text(response)
                if '"done_reason":"load"' not in text and '"done_reason":"unload"' not in text:
                    generated[path] += 1
print("responses by status:", dict(sorted(codes.items())))
print("generation routes: 2xx that generated / 2xx / requests")
for route in GENERATION:
    print(f"  {route:24s} {generated[route]:6d} {ok[route]:6d} {sent[route]:6d}")
missing = [r for r in GENERATION if generated[r] == 0 and sent[r] > 0]
print("routes that never generated:", ", ".join(missing) or "none")
print("5xx:", sum(errors.values()))
for (method, uri, status), n in errors.most_common(20):
    print(f"  {n:5d}  {status} {method} {uri}")
PY
tail -15 "$OUT/schemathesis.txt"
kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null
[ "$deaths" = 0 ]
