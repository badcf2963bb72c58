#!/usr/bin/env bash
# The test command: fetches the test models (cached after the first run),
# then runs every test of the workspace. Release build: the tests run real
# models, and llama.cpp is compiled once for this profile.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-models.sh
cargo test --release --workspace "$@"
