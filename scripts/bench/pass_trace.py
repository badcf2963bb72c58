#!/usr/bin/env python3
"""Where a prompt pass's time went, from a log with RUST_LOG=hypura::pass=debug.

    scripts/bench/pass_trace.py LOG [--layers] [--evictions]

Per pass (from a layer-0 request to "pass done"): its span, the disk's busy
time (the union of every read's interval: reads ahead and on-demand reads),
bytes read, the rate while busy, the idle gaps over 20 ms (where and how
long), and with --layers each layer's events. A read's interval ends at its
event's timestamp: `read_ms` before it for a read ahead, `stall_ms` for a
layer's own read (which may include waiting for a read ahead: an upper bound).
With --evictions (a log with RUST_LOG=...,hypura::evict=trace as well), the
units evicted between one pass's start, its end and the next pass's start,
counted by (layer, layer computing, whether a pass evicted them); a pass's
first request logs at its end, so its evictions count in the segment before.
"""
import re
import sys
from datetime import datetime

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LINE = re.compile(r"^(\S+)\s+DEBUG\s+hypura::pass:\s+(.*)$")
EVICT = re.compile(r"TRACE\s+hypura::evict:.*evicted\s+(.*)$")
FIELD = re.compile(r"(\w+)=(\S+)")


def pass_starts(kind, fields):
    """Whether an event is a pass's first request (its layer 0)."""
    return kind.startswith("pass layer asked") and fields.get("layer") == "0"


def event(line):
    """(timestamp, kind, fields) of a pass event line, else None."""
    m = LINE.match(line)
    if not m:
        return None
    ts = datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
    text = m.group(2)
    return ts, FIELD.sub("", text).strip(), dict(FIELD.findall(text))


def events(path):
    for raw in open(path, errors="replace"):
        e = event(ANSI.sub("", raw.strip()))
        if e:
            yield e


def passes(path):
    current = None
    for ts, kind, f in events(path):
        if pass_starts(kind, f):
            if current:
                yield current
            current = {"start": ts - float(f.get("stall_ms", 0)) / 1e3, "ev": []}
        if current is None:
            continue
        current["ev"].append((ts, kind, f))
        if kind.startswith("pass done"):
            current["end"] = ts
            yield current
            current = None


def summarize(p, show_layers):
    reads, mb = [], 0.0
    for ts, kind, f in p["ev"]:
        if kind.startswith("pass read ahead") and "read_ms" in f:
            reads.append((ts - float(f["read_ms"]) / 1e3, ts))
            mb += float(f["read_mb"])
        elif kind.startswith("pass layer asked") and float(f.get("read_mb", 0)) > 0:
            reads.append((ts - float(f["stall_ms"]) / 1e3, ts))
            mb += float(f["read_mb"])
    end = p.get("end", p["ev"][-1][0])
    reads.sort()
    busy, gaps, cursor = 0.0, [], p["start"]
    for a, b in reads:
        if a > cursor:
            if a - cursor > 0.02:
                gaps.append((cursor - p["start"], a - cursor))
            cursor = a
        if b > cursor:
            busy += b - cursor
            cursor = b
    if end - cursor > 0.02:
        gaps.append((cursor - p["start"], end - cursor))
    span = end - p["start"]
    rate = mb / 1e3 / busy if busy else 0.0
    print(f"pass: {span:.3f} s, disk busy {busy:.3f} s, {mb / 1e3:.2f} GB, {rate:.2f} GB/s while busy")
    print("  idle over 20 ms (at s, for ms): " + ", ".join(f"{a:.2f}+{d * 1e3:.0f}" for a, d in gaps))
    if show_layers:
        for ts, kind, f in p["ev"]:
            keep = {k: f[k] for k in f if k in ("layer", "current", "hits", "misses", "units", "read_mb",
                                                "stall_ms", "claim_ms", "read_ms", "wanted")}
            print(f"  {ts - p['start']:7.3f} {kind:<26} {keep}")


def evictions(path):
    """Eviction counts per segment: within a pass, and from its end to the next pass."""
    segment, counts = "before the first pass", {}
    out = []
    for raw in open(path, errors="replace"):
        line = ANSI.sub("", raw.strip())
        m = EVICT.search(line)
        if m:
            f = dict(FIELD.findall(m.group(1)))
            key = (int(f["layer"]), int(f["current"]), f["pass"])
            counts[key] = counts.get(key, 0) + 1
            continue
        e = event(line)
        if not e:
            continue
        _, kind, fields = e
        start = pass_starts(kind, fields)
        if start or kind.startswith("pass done"):
            out.append((segment, counts))
            segment = "in a pass" if start else "between passes"
            counts = {}
    out.append((segment, counts))
    for name, c in out:
        if c:
            rows = ", ".join(f"layer {l} at {cur} ({'pass' if p == 'true' else 'decode'}): {n}"
                             for (l, cur, p), n in sorted(c.items()))
            print(f"{name}: {rows}")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args:
        sys.exit(__doc__)
    for p in passes(args[0]):
        summarize(p, "--layers" in sys.argv)
    if "--evictions" in sys.argv:
        evictions(args[0])


if __name__ == "__main__":
    main()
