#!/usr/bin/env bash
# Planner predictions against measurements: runs `hypura bench --json` on
# SmolLM2 and on synthetic models in each mode, prints a Markdown table of
# predicted vs measured decode speed with the relative error.
#
#   scripts/bench-plan.sh            # this machine's cached profile (`hypura profile`)
#   PROFILE=FILE TOKENS=32 THREADS=2 SKIP_BUILD=1 scripts/bench-plan.sh
#   HYPURA=BIN SYNTH=BIN NO_FETCH=1 ...   # binaries built elsewhere; no SmolLM2 download
#
# Synthetic models are written once to $WORK (default /tmp/hypura-bench-plan).
set -euo pipefail
cd "$(dirname "$0")/.."

TOKENS=${TOKENS:-32}
PROMPT_TOKENS=${PROMPT_TOKENS:-32}
THREADS=${THREADS:-$(nproc)}
WORK=${WORK:-/tmp/hypura-bench-plan}
SMOLLM2=${SMOLLM2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
mkdir -p "$WORK"

if [[ -z "${SKIP_BUILD:-}" ]]; then
  cargo build --release -p hypura -p hypura-synth --bins >&2
fi
HYPURA=${HYPURA:-target/release/hypura}
SYNTH=${SYNTH:-target/release/hypura-synth}
[[ -f "$SMOLLM2" || -n "${NO_FETCH:-}" ]] || scripts/fetch-models.sh >&2

synth() { # KIND PRESET LAYERS FILE
  [[ -f "$WORK/$4" ]] || "$SYNTH" "$1" --preset "$2" --layers "$3" -o "$WORK/$4" >&2
}
synth dense tiny-llama 2 tiny-llama.gguf
synth moe tiny-mixtral 2 tiny-mixtral.gguf
synth dense llama-8b 4 llama8b-4l.gguf
synth moe mixtral-8x7b 2 mixtral-2l.gguf

profile_args=()
[[ -n "${PROFILE:-}" ]] && profile_args=(--profile "$PROFILE")

# model | mode | RAM budget ("-" for none). Streaming budgets sit a little
# above each model's minimum (resident weights + KV cache + one layer of
# streamed weights), so the cache holds a part of the streamed bytes.
cases=(
  "$SMOLLM2|full-resident|-"
  "$WORK/tiny-llama.gguf|full-resident|-"
  "$WORK/tiny-llama.gguf|dense-ffn-streaming|1.35MiB"
  "$WORK/tiny-mixtral.gguf|full-resident|-"
  "$WORK/tiny-mixtral.gguf|expert-streaming|2.3MiB"
  "$WORK/llama8b-4l.gguf|full-resident|-"
  "$WORK/llama8b-4l.gguf|dense-ffn-streaming|1000MiB"
  "$WORK/mixtral-2l.gguf|full-resident|-"
  "$WORK/mixtral-2l.gguf|expert-streaming|1GiB"
)

echo "| model | size | mode | RAM budget | predicted tok/s | measured tok/s | error | bottleneck | NVMe/token predicted → measured | hit rate predicted → measured |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for c in "${cases[@]}"; do
  IFS='|' read -r model mode budget <<<"$c"
  [[ -f "$model" ]] || { echo "skipping $model: missing" >&2; continue; }
  args=(bench "$model" --json --mode "$mode" --tokens "$TOKENS" --prompt-tokens "$PROMPT_TOKENS"
        --threads "$THREADS" --gpu-budget 0 "${profile_args[@]}")
  [[ "$budget" != "-" ]] && args+=(--ram-budget "$budget")
  # Cold page cache for the streamed file is not needed: O_DIRECT reads bypass it.
  if ! json=$("$HYPURA" "${args[@]}"); then
    echo "| $(basename "$model") | | $mode | $budget | failed (see stderr) | | | | | |"
    continue
  fi
  python3 - "$json" "$model" "$budget" <<'PY'
import json, os, sys
r = json.loads(sys.argv[1]); model = os.path.basename(sys.argv[2]); budget = sys.argv[3]
mib = lambda b: f"{b / 2**20:.1f} MiB"
size = os.path.getsize(sys.argv[2])
stream = r["mode"] != "full-resident"
nvme = f'{mib(r["predicted_nvme_bytes_per_token"])} → {mib(r["stream"]["nvme_bytes_per_token"])}' if stream else "–"
hit = f'{r["expected_hit_rate"]:.0%} → {r["stream"]["hit_rate"]:.0%}' if stream else "–"
print(f'| {model} | {mib(size)} | {r["mode"]} | {budget} | {r["predicted_tokens_per_second"]:.1f} | '
      f'{r["measured_tokens_per_second"]:.1f} | {r["relative_error"]:+.0%} | {r["bottleneck"]} | {nvme} | {hit} |')
PY
done
