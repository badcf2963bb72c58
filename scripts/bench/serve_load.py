#!/usr/bin/env python3
"""Aggregate decode throughput of an OpenAI-compatible server under N clients.

    serve_load.py URL MODEL --clients N [--requests R] [--max-tokens 128] [--label TEXT]

Each of N client threads sends R streamed greedy `/v1/completions` requests
one after another (prompts of about 40 words, a different one each time, so no
server reuses a cached prefix), `max_tokens` tokens each, with
`stream_options.include_usage` (and `ignore_eos`, which llama-server honours;
the others ignore it). Works against hypura and llama-server alike: both
speak this route.

Prints one JSON line: completion tokens per second over the whole run
(the sum of `usage.completion_tokens`, else of the streamed chunks, divided
by the wall time from the first request to the last answer), mean and p50/p95
time to first token, requests and failures. Standard library only.
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse

WORDS = (
    "river stone market winter garden letter engine harbor silver morning "
    "forest window paper candle mountain village music thunder bridge lantern "
    "orchard meadow copper signal planet island desert canyon glacier valley"
).split()


def prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(40))


def one_request(host, port, body, timeout):
    """Returns (ttft seconds, completion tokens) of one streamed completion."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    started = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read(300)!r}")
    ttft, chunks, usage = None, 0, None
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        if b'"usage"' in data:
            parsed = json.loads(data)
            if parsed.get("usage"):
                usage = parsed["usage"].get("completion_tokens")
            if not parsed.get("choices"):
                continue
        if ttft is None:
            ttft = time.perf_counter() - started
        chunks += 1
    conn.close()
    return ttft, usage if usage is not None else chunks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--requests", type=int, default=2, help="per client")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port or 80

    ttfts, tokens, failures = [], [], []
    lock = threading.Lock()

    def client(i):
        rng = random.Random(1000 + i)
        for _ in range(a.requests):
            body = {"model": a.model, "prompt": prompt(rng), "max_tokens": a.max_tokens,
                    "temperature": 0, "stream": True, "ignore_eos": True,
                    "stream_options": {"include_usage": True}}
            try:
                ttft, n = one_request(host, port, body, a.timeout)
                with lock:
                    tokens.append(n)
                    if ttft is not None:
                        ttfts.append(ttft)
            except Exception as e:  # counted, reported; the run goes on
                with lock:
                    failures.append(str(e)[:200])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    ttfts.sort()
    out = {
        "label": a.label,
        "clients": a.clients,
        "requests": len(tokens),
        "failures": len(failures),
        "first_failure": failures[0] if failures else None,
        "completion_tokens": sum(tokens),
        "wall_seconds": round(wall, 3),
        "tokens_per_second": round(sum(tokens) / wall, 2) if wall > 0 else 0,
        "ttft_mean_ms": round(statistics.mean(ttfts) * 1e3, 1) if ttfts else None,
        "ttft_p50_ms": round(ttfts[len(ttfts) // 2] * 1e3, 1) if ttfts else None,
        "ttft_p95_ms": round(ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.95))] * 1e3, 1)
        if ttfts else None,
    }
    print(json.dumps(out), flush=True)
    return 1 if failures and not tokens else 0


if __name__ == "__main__":
    sys.exit(main())
