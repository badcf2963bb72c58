"""Aggregate decode throughput of `hypura serve` with N concurrent requests (not a test).

    python3 gateway/tests/clients/bench_parallel.py [--parallel 8] [--tokens 128] [--requests 1 8]

Starts `hypura serve MODEL --parallel P`, then for each N in --requests sends N
greedy raw generations of --tokens tokens at once and prints the aggregate
decode rate: generated tokens / wall time from the first request sent to the
last reply (prompt evaluation included), and the sum of each request's
eval_count / eval_duration.
"""
import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from conftest import MODEL, Server


def one(base, i, tokens):
    body = {
        "model": MODEL,
        "prompt": f"Story number {i}: Once upon a time",
        "raw": True,
        "stream": False,
        "options": {"temperature": 0, "num_predict": tokens},
    }
    return httpx.post(f"{base}/api/generate", json=body, timeout=600).json()


def run(base, n, tokens):
    started = time.monotonic()
    with ThreadPoolExecutor(n) as pool:
        replies = list(pool.map(lambda i: one(base, i, tokens), range(n)))
    wall = time.monotonic() - started
    generated = sum(r["eval_count"] for r in replies)
    per_request = [r["eval_count"] / (r["eval_duration"] / 1e9) for r in replies]
    print(
        f"{n} concurrent: {generated} tokens in {wall:.2f} s = {generated / wall:.1f} tok/s aggregate (wall); "
        f"per request {min(per_request):.1f}-{max(per_request):.1f} tok/s, sum {sum(per_request):.1f} tok/s"
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--requests", type=int, nargs="+", default=[1, 8])
    args = p.parse_args()
    server = Server("--parallel", str(args.parallel), "--context", "1024")
    try:
        one(server.base, 0, 4)  # load the model
        for n in args.requests:
            run(server.base, n, args.tokens)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
