#!/usr/bin/env bash
# Streamed bytes and time of one long prompt through `hypura serve` (issue 26: the server's
# prompt pass). Serves the models in DIR under --ram-budget BUDGET with --parallel 1
# --context 4096, sends a 1,212-token raw prompt (SmolLM2's tokenizer) twice with
# cache_prompt false and 8 greedy tokens, and prints the prompt tokens, wall and prompt
# seconds, and the MiB hypura_stream_read_bytes_total grew by; the plan line's prompt pass.
#
#   scripts/bench-prompt-pass.sh DIR MODEL BUDGET [HYPURA]
#   e.g. scripts/bench-prompt-pass.sh /tmp/pp smoe8 700MiB
set -euo pipefail
dir=$1 model=$2 budget=$3 bin=${4:-target/release/hypura}
port=${PORT:-18555}
log=$(mktemp)
"$bin" serve "$dir" --ram-budget "$budget" --parallel 1 --context 4096 --port "$port" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 60); do grep -q listening "$log" && break; sleep 1; done
grep -o "prompts pass the graph [0-9]* tokens" "$log" || echo "default prompt pass"
PORT=$port MODEL=$model python3 - <<'PY'
import json, os, time, urllib.request
base = f"http://127.0.0.1:{os.environ['PORT']}"
model = os.environ["MODEL"]
def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=900).read())
def streamed():
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines()
               if l.startswith("hypura_stream_read_bytes_total{"))
post("/api/generate", {"model": model, "prompt": "Hi", "raw": True, "stream": False,
                       "options": {"num_predict": 1}})
words = " ".join(f"item{i}" for i in range(330))
for rep in range(2):
    before, start = streamed(), time.time()
    r = post("/api/generate", {"model": model, "prompt": f"{words} rep{rep}", "raw": True,
                               "stream": False, "cache_prompt": False,
                               "options": {"num_predict": 8, "temperature": 0}})
    print(f"prompt tokens {r['prompt_eval_count']}  wall {time.time() - start:.1f} s  "
          f"prompt {r['prompt_eval_duration'] / 1e9:.1f} s  "
          f"read {(streamed() - before) / 2**20:.1f} MiB")
PY
