#!/bin/bash
# The planner's prompt and decode predictions against `hypura bench` on this
# machine's CPU alone: 8-layer cuts of the Mixtral-8x7B and Qwen3-30B-A3B
# shapes (their default routing) and a 4-layer Llama-8B cut, all in RAM and
# (the MoE cuts) streaming their experts, and SmolLM2.
#
#   scripts/bench/cpu_prompt_check.sh [MODELS_DIR]
#
# Writes the cuts into MODELS_DIR (default /work/devmodels; ~10 GB) once,
# uses the cached profile (`hypura profile --refresh` first to measure this
# machine now), prints one line per case. Needs `cargo build --release -p
# hypura -p hypura-synth` and SmolLM2 in ~/.cache/hypura/models (`hypura serve`
# fetches it).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-/work/devmodels}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
B=./target/release/hypura
synth=./target/release/hypura-synth
mkdir -p "$dir"
cut() { [ -f "$dir/$1" ] || "$synth" "${@:2}" -o "$dir/$1" >/dev/null 2>&1; }
cut mixtral-8l.gguf moe --preset mixtral-8x7b --layers 8
cut qwen3-8l.gguf moe --preset qwen3-30b-a3b --layers 8
cut llama8b-4l.gguf dense --preset llama-8b --layers 4
smol=${HYPURA_MODELS_DIR:-$HOME/.cache/hypura/models}/SmolLM2-135M-Instruct.Q4_1.gguf

run() {
  local name=$1
  shift
  "$B" bench "$@" --gpu-budget 0 --context 600 --prompt-tokens 512 --tokens 16 \
    --threads "$(nproc)" --repetitions 2 --json >"$out/$name.json" 2>/dev/null
}
run mixtral-ram "$dir/mixtral-8l.gguf" --ram-budget 12GiB
run qwen3-ram "$dir/qwen3-8l.gguf" --ram-budget 8GiB
run llama8b-ram "$dir/llama8b-4l.gguf" --ram-budget 8GiB
run smollm2 "$smol"
run mixtral-stream "$dir/mixtral-8l.gguf" --ram-budget 5GiB
run qwen3-stream "$dir/qwen3-8l.gguf" --ram-budget 2GiB

python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
for name in ["mixtral-ram", "qwen3-ram", "llama8b-ram", "smollm2", "mixtral-stream", "qwen3-stream"]:
    d = json.load(open(os.path.join(out, name + ".json")))
    print(f"{name:15} {d['mode']:16} pp512 {d['prompt_tokens_per_second']:7.1f} "
          f"planner {d['predicted_prompt_tokens_per_second']:7.1f} ({d['prompt_relative_error']:+.0%})  "
          f"decode {d['measured_tokens_per_second']:6.2f} planner {d['predicted_tokens_per_second']:6.2f} "
          f"({d['relative_error']:+.0%})")
EOF
