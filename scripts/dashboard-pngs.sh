#!/usr/bin/env bash
# Draws each Grafana dashboard panel's Prometheus answer into
# docs/dashboards/*.png, and the status page's screenshot into
# docs/status.png: runs the dashboards and status page tests keeping what
# they saw, then renders the answers with matplotlib
# (scripts/render-dashboards.py). Needs what `scripts/install-deps.sh --test`
# installs, and matplotlib (pip install matplotlib).
set -euo pipefail
cd "$(dirname "$0")/.."
answers="$(mktemp -d)"
trap 'rm -rf "$answers"' EXIT
HYPURA_DASHBOARD_ANSWERS="$answers" cargo test --release -p hypura --test dashboards
HYPURA_STATUS_SCREENSHOT="$PWD/docs/status.png" cargo test --release -p hypura --test status_page
rm -f docs/dashboards/*.png
python3 scripts/render-dashboards.py "$answers" docs/dashboards
