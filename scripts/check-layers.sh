#!/usr/bin/env bash
# Checks the gateway's layers: which module of gateway/src may name which.
# Fails (exit 1), printing each offending line, when an import breaks a rule.
#
# The first rule is held by the compiler, not here: core (the request, the
# one inference path, the backend and models traits) is the crate
# `hypura-core` (core/); the gateway depends on it, so a cycle would not
# compile and core cannot name the pool, upstreams, CLI, metrics or traces
# (they reach it through its traits). The gateway re-exports it as
# `crate::core`. The rest, within the gateway crate, are checked here:
#
#   pool       the one door to every model (local first, then upstreams):
#              never the HTTP side (api, server, state) nor the CLI
#   metrics    never the server (AppState lives in state.rs) nor the CLI
#   telemetry  never the HTTP side nor the CLI
#   api        never the CLI
#   upstreams  live under pool/ (no crate::upstream, no src/upstream/)
#   core       stays a crate: no gateway/src/core module beside the re-export
#
# It reads code lines only (comment lines are skipped) and refuses grouped
# paths (`crate::{a, b}`) outside the binary's glue, which a line-based check
# could not follow. Run by scripts/test.sh before the tests.
set -euo pipefail
cd "$(dirname "$0")/../gateway/src"

status=0

# The code lines (not comments) under $1 that name a crate path, as file:line:text.
code_lines() {
  grep -rnE --include='*.rs' 'crate::' "$1" | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' || true
}

# forbid WHERE MODULES WHY: no code line under WHERE may name crate::M for
# any M of MODULES (a `|`-separated list), nor a grouped `crate::{`.
forbid() {
  local where=$1 modules=$2 why=$3 hits
  hits=$(code_lines "$where" | grep -E "crate::(\{|($modules)\b)" || true)
  if [ -n "$hits" ]; then
    echo "check-layers: $why:" >&2
    echo "$hits" | sed 's/^/  gateway\/src\//' >&2
    status=1
  fi
}

if [ -e core ] || [ -e core.rs ]; then
  echo "check-layers: core is the hypura-core crate (core/ at the top), not a module of the gateway" >&2
  status=1
fi
forbid pool 'api|server|state|cli' 'the pool never names the HTTP side or the CLI'
forbid metrics 'server|cli|api' 'metrics never name the server, the API or the CLI (AppState is in state.rs)'
forbid telemetry 'api|server|state|cli' 'telemetry never names the HTTP side or the CLI'
forbid api 'cli' 'the API never names the CLI'
if [ -e upstream ] || [ -e upstream.rs ] || code_lines . | grep -qE 'crate::upstream\b'; then
  echo "check-layers: upstreams live under pool/ (crate::pool::upstream), not gateway/src/upstream" >&2
  status=1
fi

if [ "$status" -eq 0 ]; then
  echo "check-layers: the gateway's layers hold"
fi
exit "$status"
