#!/usr/bin/env python3
"""A saved profile with its disk measured now, the way the streamer reads.

    python3 scripts/bench/profile_now.py BASE_PROFILE MODEL OUT_PROFILE [GIB]

The planner prices streamed reads at the profile's disk rate. A virtual
disk's rate drifts by a third within minutes (on the H200 machine 1.1-2.0
GB/s in one call, slowest after large writes), so a profile measured on
another day predicts a run on another disk. This reads GIB (default 1.5)
GiB of MODEL as the streamer does (O_DIRECT, 1 MiB reads, 4 in flight, into
pages present: a pass populates its read-ahead's pages before they read, and
a load takes the pages of the units it evicts, so neither faults fresh pages
in under the read), in three pieces spread over the file, and writes
BASE_PROFILE with its disk reads replaced by that one point (1 MiB, 4 in
flight: the planner's rate is then this rate). Prints one JSON line: the
rate, each piece's rate, and the base profile's rate for comparison.
"""
import json
import os
import statistics
import sys

from disk_read import read_rate

BLOCK = 1 << 20
DEPTH = 4


def planner_rate(disk):
    """The planner's disk rate (scheduler::cost::disk_gbps): the median of
    the points with blocks of at least 1 MiB and at most 4 reads in flight."""
    rates = sorted(p["gbps"] for p in disk["reads"]
                   if p["block_bytes"] >= BLOCK and p["queue_depth"] <= 4)
    return statistics.median(rates) if rates else None


def main():
    base, model, out = sys.argv[1:4]
    total = int(float(sys.argv[4] if len(sys.argv) > 4 else 1.5) * (1 << 30))
    size = os.path.getsize(model)
    piece = (total // 3) // BLOCK * BLOCK
    offsets = [(size - piece) * k // 3 // BLOCK * BLOCK for k in range(3)]
    rates = [read_rate(model, o, piece, BLOCK, DEPTH, "populated") for o in offsets]
    # Bytes over seconds of all three (not the mean of their rates).
    gbps = 3 * piece / sum(piece / (r * 1e9) for r in rates) / 1e9
    profile = json.load(open(base))
    was = planner_rate(profile["disk"])
    profile["disk"]["path"] = os.path.dirname(os.path.abspath(model))
    profile["disk"]["o_direct"] = True
    profile["disk"]["reads"] = [{"block_bytes": BLOCK, "queue_depth": DEPTH, "gbps": gbps}]
    with open(out, "w") as f:
        json.dump(profile, f, indent=1)
    print(json.dumps({"disk_gbps": round(gbps, 3), "pieces": [round(r, 3) for r in rates],
                      "base_disk_gbps": round(was, 3) if was else None, "profile": out}))


if __name__ == "__main__":
    main()
