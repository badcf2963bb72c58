# Sourced by scripts/gpu-bench.sh and scripts/gpu-agent.sh (they define `log` and W).
# profile_now MODEL TAG: with PROFILE_NOW=1, PROFILE becomes PROFILE_BASE with its
# disk measured now on MODEL, as the streamer reads (scripts/bench/profile_now.py):
# the planner then predicts this run's disk, not another day's (a virtual disk
# drifts by a third within minutes). Without PROFILE_NOW=1, nothing changes.
PROFILE_BASE=${PROFILE_BASE:-${PROFILE:-$PWD/config/profiles/h200-measured.json}}
profile_now() {
  [ "${PROFILE_NOW:-0}" = 1 ] || return 0
  local out=$W/profile-now-$2.json line
  if line=$(python3 scripts/bench/profile_now.py "$PROFILE_BASE" "$1" "$out"); then
    log "profile now ($2): $line"
    PROFILE=$out
  else
    log "profile now ($2) failed: PROFILE stays $PROFILE"
  fi
}
