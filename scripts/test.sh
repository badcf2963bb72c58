#!/usr/bin/env bash
# The test command: checks the gateway's layers (scripts/check-layers.sh),
# installs the prerequisites (scripts/install-deps.sh
# --test: system packages and the Python client packages, skipped when
# present), fetches the test models (cached after the first run), then checks
# formatting, runs every test of the workspace, clippy, and proves in a bare
# Debian root that install-deps.sh misses no prerequisite
# (scripts/check-install-deps.sh; skipped with HYPURA_SKIP_DEPS_CHECK=1).
# Release build: the tests run real models, and llama.cpp is compiled once for
# this profile.
#
# With arguments, only `cargo test --release --workspace ARGS` runs after the
# set-up, e.g. `./scripts/test.sh -p hypura --test client`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/check-layers.sh
./scripts/install-deps.sh --test
./scripts/fetch-models.sh
if [ $# -gt 0 ]; then
  exec cargo test --release --workspace --no-fail-fast "$@"
fi
cargo fmt --all -- --check
cargo test --release --workspace --no-fail-fast
cargo clippy --release --workspace --all-targets -- -D warnings
if [ "${HYPURA_SKIP_DEPS_CHECK:-0}" != 1 ]; then
  ./scripts/check-install-deps.sh
fi
