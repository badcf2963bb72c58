#!/usr/bin/env bash
# A bounded soak of `hypura serve` on loopback: CLIENTS clients for MINUTES
# minutes over two models (SmolLM2 and a mixture-of-experts model derived from
# it) under one RAM budget, mixing chat, generate, embeddings, dropped streams,
# injected runner crashes and residency moves, and meanwhile the attack corpus
# of issue 30: schema and template bombs, big bodies, slow bodies, a stopped
# runner (scripts/soak.py says how).
#
#   scripts/soak.sh [CLIENTS] [MINUTES] [OUT.json]
#
# HYPURA_BIN / SYNTH_BIN: prebuilt binaries (default: built here). CRASH_EVERY,
# PHASE (seconds), DEMOTE_AFTER, RAM_BUDGET, THREADS: passed on; ATTACKS=0:
# no attacks. The server binds 127.0.0.1 only. Exit status 1: the server died,
# stopped answering, a request failed outside a crash window, an attack got
# anything but its refusal, or the server's RSS did not come back under 1.5x
# its start.
set -euo pipefail
cd "$(dirname "$0")/.."
clients="${1:-8}"
minutes="${2:-2}"
out="${3:-soak.json}"
target="${CARGO_TARGET_DIR:-target}"
if [ -z "${HYPURA_BIN:-}" ] || [ -z "${SYNTH_BIN:-}" ]; then
  cargo build --release -q -p hypura -p hypura-synth
fi
bin="${HYPURA_BIN:-$target/release/hypura}"
synth="${SYNTH_BIN:-$target/release/hypura-synth}"
scripts/fetch-models.sh >/dev/null
smol=models/SmolLM2-135M-Instruct.Q4_1.gguf
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
moe="$work/smollm2-moe.gguf"
"$synth" derive-moe --from "$smol" --experts 8 --used 2 -o "$moe" >/dev/null
python3 scripts/soak.py --bin "$bin" --model "$smol" --model "$moe" \
  --clients "$clients" --minutes "$minutes" --out "$out" \
  --crash-every "${CRASH_EVERY:-120}" --phase "${PHASE:-60}" \
  --demote-after "${DEMOTE_AFTER:-20s}" --ram-budget "${RAM_BUDGET:-4GiB}" \
  --threads "${THREADS:-1}" \
  $([ "${ATTACKS:-1}" = 0 ] || echo --attacks)
