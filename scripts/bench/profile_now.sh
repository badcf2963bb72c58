# Sourced by scripts/gpu-bench.sh and scripts/gpu-agent.sh (they define `log`, H and W).
# profile_now MODEL TAG: first waits for the disk to settle after model writes
# (settle_disk, below); then, with PROFILE_NOW=1, PROFILE becomes PROFILE_BASE
# with its disk measured now on MODEL, as the streamer reads
# (scripts/bench/profile_now.py): the planner then predicts this run's disk, not
# another day's (a virtual disk drifts by a third within minutes). Without
# PROFILE_NOW=1, PROFILE stays as it is.
#
# PROFILE_BASE is this machine's own `hypura profile` (CPU, RAM, GPU and
# host-to-GPU rates), measured once per work folder, unless PROFILE_MACHINE=0:
# the device tool lends H100 and H200 machines of different hosts, and a
# saved profile describes another one. Session 29's run on an H100 host with
# the H200 host's profile (CPU Q4_K 57 GB/s where that host measured 86,
# pageable copies 6.0 GB/s where it measured 7.4) predicted every prompt
# 19-28% slow. The profile took 9 s there.
PROFILE_BASE=${PROFILE_BASE:-${PROFILE:-$PWD/config/profiles/h200-measured.json}}
machine_profile() {
  [ "${PROFILE_MACHINE:-1}" = 1 ] || return 0
  local p=$W/profile-machine.json
  if [ ! -s "$p" ]; then
    if "$H" profile --json --refresh --path "$W" >"$p.part" 2>>"$W/stderr.txt"; then
      mv "$p.part" "$p"
      log "machine profile: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); g=(d.get("gpus") or [{}])[0]; print(json.dumps({"cpu": d["cpu"], "ram_gbps": d["ram"]["read_gbps"], "gpu": g.get("description"), "pinned_gbps": g.get("host_to_device_pinned_gbps"), "pageable_gbps": g.get("host_to_device_pageable_gbps")}))' "$p")"
    else
      rm -f "$p.part"
      log "machine profile failed: the base stays $PROFILE_BASE"
      return 1
    fi
  fi
  PROFILE_BASE=$p
}
# settle_disk: waits until SETTLE_S (default 90) seconds have passed since the
# newest model file in the work folder was written. A virtual disk reads slowly
# for a while after large writes: on the H100 machine of session 33 the probe
# read 1.43 GB/s 9 s after 42.8 GB of model files were written, then 1.82-1.99;
# on the dev machine 0.19 GB/s right after a 16.5 GB write and sync, 1.4-1.6
# from 30 s on. Rates learnt in those seconds priced the later runs (the
# planner keeps a model's measured rates), so every measured step waits here.
settle_disk() {
  local newest wait
  newest=$(stat -c %Y "$W"/*.gguf 2>/dev/null | sort -n | tail -1)
  [ -n "$newest" ] || return 0
  wait=$((newest + ${SETTLE_S:-90} - $(date +%s)))
  if [ "$wait" -gt 0 ]; then
    log "settle: model files written $((${SETTLE_S:-90} - wait)) s ago; waiting $wait s"
    sleep "$wait"
  fi
}
profile_now() {
  settle_disk
  [ "${PROFILE_NOW:-0}" = 1 ] || return 0
  machine_profile
  local out=$W/profile-now-$2.json line
  if line=$(python3 scripts/bench/profile_now.py "$PROFILE_BASE" "$1" "$out"); then
    log "profile now ($2): $line"
    PROFILE=$out
  else
    log "profile now ($2) failed: PROFILE stays $PROFILE"
  fi
}
