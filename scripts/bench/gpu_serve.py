#!/usr/bin/env python3
"""Moves into and out of GPU memory inside `hypura serve`, on a GPU machine.

Two models share one budget: a GPU budget that holds one of them in full
and a RAM budget. The cold model is asked first and takes the GPU (its full
placement); the hot one starts streaming from RAM. Then only the hot one is
asked, with requests always in flight: the policy moves the cold one out of
GPU memory (its streaming placement loaded beside, the engine switched
between decode steps) and the hot one in. Every request must succeed; the
script records decode tok/s over time, /api/ps (residency, tier bytes) and
the server's log of moves.

    gpu_serve.py HYPURA HOT.gguf COLD.gguf OUT_DIR [--gpu-budget 8GiB] [--ram-budget 6GiB]

Standard library only (the GPU machine has no network).
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request


def post(url, body, timeout=600):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def get(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hypura")
    ap.add_argument("hot")
    ap.add_argument("cold")
    ap.add_argument("out")
    ap.add_argument("--gpu-budget", default="8GiB")
    ap.add_argument("--ram-budget", default="6GiB")
    ap.add_argument("--threads", default=str(os.cpu_count()))
    ap.add_argument("--seconds", type=int, default=150)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log_path = os.path.join(a.out, "serve-log.txt")
    log = open(log_path, "w")
    cmd = [a.hypura, "serve", a.hot, a.cold, "--port", "0", "--parallel", "2",
           "--context", "1024", "--threads", a.threads,
           "--gpu-budget", a.gpu_budget, "--ram-budget", a.ram_budget]
    env = dict(os.environ, RUST_LOG="info,llama.cpp=error", NO_COLOR="1")
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    base = None
    lines = []

    def pump():
        nonlocal base
        for line in server.stderr:
            lines.append(line)
            log.write(line)
            log.flush()
            if "listening on " in line:
                base = line.split("listening on ")[1].strip()

    threading.Thread(target=pump, daemon=True).start()
    t0 = time.time()
    while base is None:
        if server.poll() is not None or time.time() - t0 > 300:
            print("server did not start:\n" + "".join(lines[-30:]))
            return 1
        time.sleep(0.2)
    names = [m["name"] for m in get(base + "/api/tags")["models"]]
    hot = next(n for n in names if os.path.basename(a.hot).split(".")[0].lower() in n.lower())
    cold = next(n for n in names if n != hot)
    results = open(os.path.join(a.out, "serve.jsonl"), "w")

    def record(kind, **kw):
        kw.update(kind=kind, t=round(time.time() - t0, 2))
        results.write(json.dumps(kw) + "\n")
        results.flush()
        print(json.dumps(kw)[:300], flush=True)

    def ps():
        return {m["name"]: {"residency": m.get("residency"), "tier_bytes": m.get("tier_bytes")}
                for m in get(base + "/api/ps")["models"]}

    def generate(model, n):
        r = post(base + "/api/generate", {
            "model": model, "prompt": "The history of the city of Paris begins", "raw": True,
            "stream": False, "options": {"temperature": 0, "num_predict": n}})
        tps = r["eval_count"] / (r["eval_duration"] / 1e9) if r.get("eval_duration") else 0.0
        return r["eval_count"], tps

    n, tps = generate(cold, 32)
    record("request", model=cold, tokens=n, tok_s=round(tps, 2), ps=ps())
    failures = []
    stop = time.time() + a.seconds

    def traffic(worker):
        while time.time() < stop:
            try:
                n, tps = generate(hot, 96)
                record("request", model=hot, worker=worker, tokens=n, tok_s=round(tps, 2))
                if n != 96:
                    failures.append(f"{n} tokens")
            except Exception as e:  # noqa: BLE001 — any failure is recorded
                failures.append(repr(e))
                record("failure", model=hot, error=repr(e))

    workers = [threading.Thread(target=traffic, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    last = None
    while any(w.is_alive() for w in workers):
        now = ps()
        if now != last:
            record("ps", ps=now)
            last = now
        time.sleep(1)
    for w in workers:
        w.join()
    n, tps = generate(cold, 32)
    record("request", model=cold, tokens=n, tok_s=round(tps, 2), ps=ps())
    moves = [l.strip() for l in lines if "→" in l or "placement" in l or "ERROR" in l or "WARN" in l]
    record("summary", failures=failures, moves=moves[-40:])
    server.terminate()
    server.wait(timeout=60)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
