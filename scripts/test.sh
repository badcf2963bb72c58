#!/usr/bin/env bash
# The test command: fetches the test models (cached after the first run),
# then runs every test of the workspace. Release build: the tests run real
# models, and llama.cpp is compiled once for this profile.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-models.sh
# The gateway's client tests drive it with the real `ollama` and `openai` packages.
if ! python3 -c "import ollama, openai, pytest" 2>/dev/null; then
  python3 -m pip install --quiet -r gateway/tests/clients/requirements.txt ||
    python3 -m pip install --quiet --break-system-packages -r gateway/tests/clients/requirements.txt
fi
cargo test --release --workspace --no-fail-fast "$@"
