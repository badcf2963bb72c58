#!/usr/bin/env python3
"""Replays a decode's recorded expert choices through stream-cache eviction
policies and prints the units each reads per token.

    hypura bench MODEL --routing --routing-trace trace.jsonl --prompt-tokens 1 --tokens 256 ...
    scripts/bench/cache_replay.py trace.jsonl --shares 0.69,0.78

The trace: one JSON line per prompt size, `decode[layer][token]` the expert
ids that layer chose (every layer taken as streamed). A cache holds a share
of the units (one expert of one layer each), starts empty, and reads a unit
on a miss, evicting one unit not used by the request at hand. Policies:

- `chance`: the streamer's (tiered/streamer.rs, `decode_wait`): the unit
  whose next use is expected last, from its chance of use by the next token
  (0.3 × its use by the last token or two, halved per token, + 0.7 × its
  use rate over ~64 tokens) and the layers until the decode reaches it.
- `frequency`: the streamer's before: fewest uses, every use halved each
  4 × units uses, ties to the highest layer, then the least recently used.
- `lru`: the least recently used.
- `belady`: the unit next used last, knowing the future (a bound, not a policy).

Prefetch is not replayed: the streamer's co-activation prefetch adds its
wrong guesses' reads on top (7% more bytes on `mixtral` routing, dev machine).
"""
import argparse
import json
import math

RECENT_WEIGHT = 0.3
RATE_HALF_LIFE_TOKENS = 64.0


def replay(decode, n_expert, share, policy):
    layers, tokens = len(decode), min(len(rows) for rows in decode)
    units = [(l, e) for l in range(layers) for e in range(n_expert)]
    capacity = max(1, int(round(share * len(units))))
    used = max(len(decode[0][0]), 1)
    recent = dict.fromkeys(units, 0.0)
    score = dict.fromkeys(units, 0.0)
    last = dict.fromkeys(units, 0)
    decay = 0.5 ** (1 / RATE_HALF_LIFE_TOKENS)
    resident, clock, accesses, reads = set(), 0, 0, 0

    def next_use(unit, t, layer):
        for tt in range(t, tokens):
            if (tt > t or unit[0] > layer) and unit[1] in decode[unit[0]][tt]:
                return (tt, unit[0])
        return (math.inf, 0)

    def victim_key(unit, t, layer):
        distance = (unit[0] - layer - 1) % layers + 1
        if policy == "chance":
            p = RECENT_WEIGHT * min(recent[unit], 1.0) + (1 - RECENT_WEIGHT) * score[unit] * (1 - decay)
            wait = math.inf if p <= 0 else distance + layers * (1 / p - 1)
            return (wait, unit[0], -last[unit])
        if policy == "frequency":
            return (-score[unit], unit[0], -last[unit])
        if policy == "lru":
            return (-last[unit],)
        return next_use(unit, t, layer)

    for t in range(tokens):
        for layer in range(layers):
            clock += 1
            asked = {(layer, e) for e in decode[layer][t]}
            for unit in asked:
                recent[unit] += 1
                score[unit] += 1
                last[unit] = clock
                accesses += 1
            if policy == "chance" and accesses >= layers * used:
                accesses = 0
                for unit in units:
                    recent[unit] *= 0.5
                    score[unit] *= decay
            elif policy == "frequency" and accesses >= 4 * len(units):
                accesses = 0
                for unit in units:
                    score[unit] *= 0.5
            for unit in asked - resident:
                if len(resident) >= capacity:
                    evictable = [u for u in resident if u not in asked]
                    resident.discard(max(evictable, key=lambda u: victim_key(u, t, layer)))
                resident.add(unit)
                reads += 1
    return reads / tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a --routing-trace file")
    ap.add_argument("--shares", default="0.69,0.78", help="cache shares of the units, comma-separated")
    ap.add_argument("--policies", default="chance,frequency,lru,belady")
    args = ap.parse_args()
    for line in open(args.trace):
        record = json.loads(line)
        decode = record["decode"]
        n_expert = record["n_expert"]
        tokens = min(len(rows) for rows in decode)
        print(f"prompt {record['prompt_tokens']}: {len(decode)} layers, {n_expert} experts, {tokens} tokens decoded")
        for share in (float(s) for s in args.shares.split(",")):
            figures = {p: replay(decode, n_expert, share, p) for p in args.policies.split(",")}
            row = "  ".join(f"{p} {r:.2f}" for p, r in figures.items())
            print(f"  share {share:.2f}: units read per token: {row}")


if __name__ == "__main__":
    main()
