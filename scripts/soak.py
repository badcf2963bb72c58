#!/usr/bin/env python3
"""A bounded soak of one `hypura serve` on loopback (run by scripts/soak.sh).

Starts the server with two models under a RAM budget (runner processes, test
hooks on, `--demote-after` short), then for MINUTES minutes CLIENTS threads mix:
Ollama chat and generate (streamed and not), OpenAI chat (streamed), embeddings,
and streams the client drops after a few chunks. Traffic favours one model,
then the other, in turns (PHASE seconds), so the budget demotes the idle one
and promotes the busy one: residency moves with requests in flight. Every
CRASH_EVERY seconds one model's runner is aborted through the test-only route
(`/api/debug/abort-runner`): its in-flight requests fail, the next request
reloads it.

With --attacks, one more thread sends the attack corpus of issue 30 in
turns meanwhile: JSON Schema bombs (a 2,500-link $ref chain, 100 properties
nested 3 deep), chat-template bombs (a request's `template`, one a namespace
in itself), big bad bodies
(24 x 8 MB at once), slow bodies (16 connections trickling a byte a second
past the server's --body-timeout) and a stopped runner (SIGSTOP for
STOP_SECONDS, then SIGCONT; its model's failures meanwhile are charged to
it, as a crash's are). Each attack must get its refusal (400, 408, 413 or
503), never a dead server; after the soak the server's RSS must come back
under 1.5x its start (waited for, at most RSS_WAIT seconds).

Reports requests and errors by kind and status, p50/p95 latency, moves and
crashes from /metrics, the attacks' outcomes, and the RSS of the server and
each runner at the start, the middle and the end; writes it all as JSON.
Exits 1 if the server died, stopped answering, a request failed outside a
crash window, an attack got anything but its refusal, or (with --attacks)
the server's RSS stayed over 1.5x its start.

Standard library only.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict

MAX_CLIENTS = 64
MAX_MINUTES = 60
PROMPTS = [
    "Write a short poem about the sea.",
    "What is the capital of France?",
    "List three colours.",
    "Explain what a GPU is in one sentence.",
    "Count from one to ten.",
]
# A request sent this soon after its model's runner was aborted may still
# reach the dying runner (the gateway has not yet seen it go): its failure is
# charged to the crash. Later ones must succeed (the model reloads).
CRASH_WINDOW = 2.0
# Seconds between two attacks, how long a runner stays stopped, the longest
# wait for the server's RSS to come back after the soak.
ATTACK_EVERY = 6.0
STOP_SECONDS = 4.0
RSS_WAIT = 60.0
# A body is given this long to arrive (--body-timeout): slow bodies end soon.
BODY_TIMEOUT = "5s"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the hypura binary")
    p.add_argument("--model", action="append", required=True, help="a GGUF file (twice: two models)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--minutes", type=float, default=2.0)
    p.add_argument("--phase", type=float, default=60.0, help="seconds each model is the busy one")
    p.add_argument("--crash-every", type=float, default=120.0, help="seconds between injected crashes (0: none)")
    p.add_argument("--demote-after", default="20s")
    p.add_argument("--ram-budget", default="4GiB")
    p.add_argument("--threads", type=int, default=1, help="decode threads per model")
    p.add_argument("--out", default="soak.json")
    p.add_argument("--attacks", action="store_true", help="send the attack corpus meanwhile (issue 30)")
    a = p.parse_args()
    if not 1 <= a.clients <= MAX_CLIENTS:
        p.error(f"--clients must be 1..{MAX_CLIENTS}")
    if not 0 < a.minutes <= MAX_MINUTES:
        p.error(f"--minutes must be in (0, {MAX_MINUTES}]")
    return a


def model_name(path):
    return os.path.basename(path)[: -len(".gguf")] + ":latest"


def children(pid):
    """Direct child pids of `pid` (the runners)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return sorted(out)


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


class Server:
    def __init__(self, args):
        self.log_path = os.path.abspath(args.out + ".server.log")
        env = dict(os.environ, HYPURA_RUNNER_TEST_HOOKS="1", RUST_LOG=os.environ.get("RUST_LOG", "info,llama.cpp=error"))
        cmd = [args.bin, "serve", *args.model, "--host", "127.0.0.1", "--port", "0",
               "--parallel", "2", "--context", "1024", "--threads", str(args.threads),
               "--ram-budget", args.ram_budget, "--demote-after", args.demote_after,
               "--keep-alive", "-1", "--body-timeout", BODY_TIMEOUT]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 120
        self.port = None
        while time.time() < deadline and self.port is None:
            if self.proc.poll() is not None:
                sys.exit(f"the server exited at start; see {self.log_path}")
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(self.log_path).read())
            if m:
                self.port = int(m.group(1))
            time.sleep(0.1)
        if self.port is None:
            sys.exit(f"the server did not start; see {self.log_path}")

    def conn(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def alive(self):
        return self.proc.poll() is None

    def memory(self):
        procs = {"server": rss_mib(self.proc.pid), "load average": os.getloadavg()[0]}
        for i, pid in enumerate(children(self.proc.pid)):
            procs[f"runner {pid}"] = rss_mib(pid)
        return procs

    def runner_of(self, model):
        """The pid of `model`'s runner, from the log."""
        pids = re.findall(re.escape(model) + r": runner pid (\d+)", open(self.log_path).read())
        return int(pids[-1]) if pids else None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def post(server, path, body, stream=False, timeout=120):
    c = server.conn(timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return c, c.getresponse()


class Results:
    def __init__(self):
        self.lock = threading.Lock()
        self.rows = []  # (kind, model, outcome, seconds, started)

    def add(self, kind, model, outcome, seconds, started):
        with self.lock:
            self.rows.append((kind, model, outcome, seconds, started))


def read_stream(resp, limit=None):
    """Reads a streamed body line by line; returns (lines, error text or None)."""
    lines, error = 0, None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line:
            continue
        lines += 1
        if line.startswith(b"data: "):
            line = line[6:]
            if line == b"[DONE]":
                continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("error"):
            error = str(obj["error"])[:120]
        if limit and lines >= limit:
            break
    return lines, error


def one_request(server, kind, model, rng):
    """Runs one request; returns its outcome ("ok", "http 503", "stream error", ...)."""
    prompt = rng.choice(PROMPTS)
    n = rng.choice([16, 32, 64])
    opts = {"num_predict": n, "temperature": 0.7, "seed": rng.randrange(1 << 30)}
    if kind == "ollama-chat":
        c, r = post(server, "/api/chat", {"model": model, "stream": False, "options": opts,
                                          "messages": [{"role": "user", "content": prompt}]})
        body = r.read()
        c.close()
        return "ok" if r.status == 200 and json.loads(body).get("done") else f"http {r.status}"
    if kind == "ollama-generate-stream":
        c, r = post(server, "/api/generate", {"model": model, "prompt": prompt, "options": opts})
        if r.status != 200:
            r.read()
            return f"http {r.status}"
        _, error = read_stream(r)
        c.close()
        return "stream error" if error else "ok"
    if kind == "openai-chat-stream":
        c, r = post(server, "/v1/chat/completions", {"model": model, "stream": True, "max_tokens": n,
                                                     "messages": [{"role": "user", "content": prompt}]})
        if r.status != 200:
            r.read()
            return f"http {r.status}"
        _, error = read_stream(r)
        c.close()
        return "stream error" if error else "ok"
    if kind == "embed":
        c, r = post(server, "/api/embed", {"model": model, "input": [prompt] * rng.randint(1, 8)})
        body = r.read()
        c.close()
        return "ok" if r.status == 200 and json.loads(body).get("embeddings") else f"http {r.status}"
    if kind == "disconnect":
        c, r = post(server, "/api/generate", {"model": model, "prompt": prompt,
                                              "options": dict(opts, num_predict=256)})
        if r.status != 200:
            r.read()
            return f"http {r.status}"
        read_stream(r, limit=3)
        # Drops the connection mid-stream: the server must cancel the generation.
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
        return "ok"
    raise ValueError(kind)


KINDS = [("ollama-chat", 3), ("ollama-generate-stream", 3), ("openai-chat-stream", 3), ("embed", 2), ("disconnect", 1)]


def client(server, models, args, start, stop, results, seed):
    rng = random.Random(seed)
    kinds = [k for k, w in KINDS for _ in range(w)]
    while time.time() < stop:
        phase = int((time.time() - start) // args.phase)
        busy = models[phase % len(models)]
        model = busy if rng.random() < 0.9 else rng.choice(models)
        kind = rng.choice(kinds)
        t0 = time.time()
        try:
            outcome = one_request(server, kind, model, rng)
        except (OSError, http.client.HTTPException, ValueError) as e:
            outcome = f"client error: {type(e).__name__}"
        results.add(kind, model, outcome, time.time() - t0, t0)


def ref_chain(n):
    defs = {f"a{i}": ({"$ref": f"#/$defs/a{i + 1}"} if i + 1 < n else {"type": "string"}) for i in range(n)}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/a0"}}, "$defs": defs}


def nested_objects(width, depth):
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {f"property_{i:03}": schema for i in range(width)}}
    return schema


TEMPLATE_BOMBS = [
    "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
    "{{ 'a' * 1000000000 }}",
    # A namespace in itself: printing it recursed until the stack overflowed.
    "{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}",
]


def status_of(server, path, body, timeout=120):
    """The status of a POST of `body` (bytes or JSON), or the client error."""
    try:
        c = server.conn(timeout)
        data = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
        c.request("POST", path, data, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        c.close()
        return str(r.status)
    except (OSError, http.client.HTTPException) as e:
        return f"client error: {type(e).__name__}"


def at_once(n, fn):
    out = []
    lock = threading.Lock()

    def one():
        o = fn()
        with lock:
            out.append(o)

    ts = [threading.Thread(target=one) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def trickle(server):
    """A body of 1,000 bytes sent a byte a second: the server's answer's status."""
    try:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=1.0)
        s.sendall(b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n")
        answer = b""
        for _ in range(60):
            try:
                answer = s.recv(4096)
                break
            except socket.timeout:
                try:
                    s.sendall(b" ")
                except OSError:
                    pass
        s.close()
        m = re.match(rb"HTTP/1\.1 (\d+)", answer)
        return m.group(1).decode() if m else "no answer"
    except OSError as e:
        return f"client error: {type(e).__name__}"


def attacker(server, models, stop, attacks, stops):
    """Sends the corpus in turns until `stop`; outcomes into `attacks`,
    stopped runners' windows into `stops` ((start, end, model))."""
    model = models[0]
    bad = b'{"model": "x", "prompt": "' + b"a" * (8 << 20)
    chain = ref_chain(2500)
    bomb = nested_objects(100, 3)
    kinds = ["ref chain", "schema bomb", "template bombs", "big bodies", "slow bodies", "stopped runner"]
    i = 0
    while time.time() + ATTACK_EVERY < stop:
        kind = kinds[i % len(kinds)]
        i += 1
        if kind == "ref chain":
            outcomes = [status_of(server, "/api/generate", {"model": model, "prompt": "Hi", "format": chain}),
                        status_of(server, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Hi"}],
                                  "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": chain}}})]
        elif kind == "schema bomb":
            outcomes = at_once(2, lambda: status_of(server, "/api/generate", {"model": model, "prompt": "Hi", "format": bomb}))
        elif kind == "template bombs":
            outcomes = [status_of(server, "/api/generate", {"model": model, "prompt": "Hi", "template": t})
                        for t in TEMPLATE_BOMBS]
        elif kind == "big bodies":
            outcomes = at_once(24, lambda: status_of(server, "/api/generate", bad))
        elif kind == "slow bodies":
            outcomes = at_once(16, lambda: trickle(server))
        else:
            victim = models[(i // len(kinds)) % len(models)]
            pid = server.runner_of(victim)
            outcomes = []
            if pid:
                try:
                    t0 = time.time()
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(STOP_SECONDS)
                    os.kill(pid, signal.SIGCONT)
                    stops.append((t0, time.time(), victim))
                    outcomes = ["stopped and continued"]
                except OSError:
                    outcomes = ["runner gone"]
        for o in outcomes:
            attacks[kind][o] += 1
        time.sleep(ATTACK_EVERY)
        if not server.alive():
            return


# What each attack must get: its refusal (a 503 when the budget or the
# model is busy), or, for a stopped runner, to have been stopped and continued.
EXPECTED = {
    "ref chain": {"400"},
    # 413: its 2 million values parsed would take more than the bodies' budget.
    "schema bomb": {"400", "413", "503"},
    "template bombs": {"400"},
    "big bodies": {"400", "503"},
    "slow bodies": {"408"},
    "stopped runner": {"stopped and continued", "runner gone"},
}


def metric_sum(text, family, label=None):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(family) and (label is None or label in line):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


def main():
    args = parse_args()
    server = Server(args)
    models = [model_name(m) for m in args.model]
    results = Results()
    crashes = []  # (time, model)
    memory = {}
    # Loads both models before the clock starts.
    for m in models:
        c, r = post(server, "/api/generate", {"model": m, "prompt": "Hi", "options": {"num_predict": 1}})
        r.read()
        c.close()
        if r.status != 200:
            sys.exit(f"warm-up of {m} answered {r.status}; see {server.log_path}")
    memory["start"] = server.memory()
    start = time.time()
    stop = start + args.minutes * 60
    threads = [threading.Thread(target=client, args=(server, models, args, start, stop, results, i), daemon=True)
               for i in range(args.clients)]
    for t in threads:
        t.start()
    attacks = defaultdict(lambda: defaultdict(int))
    stops = []  # (start, end, model): a runner stopped (SIGSTOP) meanwhile
    if args.attacks:
        threads.append(threading.Thread(target=attacker, args=(server, models, stop, attacks, stops), daemon=True))
        threads[-1].start()
    next_crash = start + args.crash_every if args.crash_every > 0 else float("inf")
    crash_i = 0
    middle_taken = False
    samples = []  # (seconds, server RSS MiB, all runners' RSS MiB), every 30 s
    next_sample = start
    while time.time() < stop:
        time.sleep(1)
        now = time.time()
        if now >= next_sample:
            m = server.memory()
            runners = sum(v or 0 for k, v in m.items() if k.startswith("runner"))
            samples.append((round(now - start), m["server"], round(runners, 1)))
            next_sample += 30
        if not middle_taken and now >= start + (stop - start) / 2:
            memory["middle"] = server.memory()
            middle_taken = True
        if now >= next_crash:
            victim = models[crash_i % len(models)]
            crash_i += 1
            # 404: that model's runner is not running now (crashed and not yet
            # reloaded): no crash is injected this time.
            try:
                c, r = post(server, "/api/debug/abort-runner", {"model": victim}, timeout=10)
                r.read()
                c.close()
                if r.status == 200:
                    crashes.append((now, victim))
            except OSError:
                pass
            next_crash += args.crash_every
        if not server.alive():
            break
    for t in threads:
        t.join(180)
    memory["end"] = server.memory()
    # The bodies and bombs freed, the server's memory must come back.
    rss_start = memory["start"]["server"]
    rss_back = None
    waited = time.time() + RSS_WAIT
    while server.alive():
        rss_back = rss_mib(server.proc.pid)
        if rss_back is not None and rss_back < 1.5 * rss_start or time.time() > waited:
            break
        time.sleep(1)
    alive = server.alive()
    healthy = False
    metrics = ""
    if alive:
        try:
            c = server.conn(10)
            c.request("GET", "/api/version")
            healthy = c.getresponse().status == 200
            c.close()
            # A crash is counted once the gateway has reaped its runner:
            # waits (15 s at most) for the last ones.
            deadline = time.time() + 15
            while True:
                c = server.conn(10)
                c.request("GET", "/metrics")
                metrics = c.getresponse().read().decode()
                c.close()
                counted = metric_sum(metrics, "hypura_runner_crashes_total{")
                if counted >= len(crashes) or time.time() > deadline:
                    break
                time.sleep(1)
        except OSError:
            pass
    server.stop()

    def crash_cause(model, started, seconds):
        """"in flight" when its model's runner crashed during the request,
        "after" when sent within CRASH_WINDOW s after such a crash, else None."""
        times = [t for t, m in crashes if m == model]
        if any(started - 1 <= t <= started + seconds for t in times):
            return "in flight"
        if any(t < started <= t + CRASH_WINDOW for t in times):
            return "after"
        if any(m == model and t0 - 1 <= started + seconds and started <= t1 + CRASH_WINDOW for t0, t1, m in stops):
            return "runner stopped"
        return None

    by_kind = defaultdict(lambda: defaultdict(int))
    latencies = defaultdict(list)
    defects = 0
    for kind, model, outcome, seconds, started in results.rows:
        if outcome == "ok":
            latencies[kind].append(seconds)
        elif cause := crash_cause(model, started, seconds):
            outcome += f" (crash: {cause})"
        else:
            defects += 1
        by_kind[kind][outcome] += 1

    def pct(xs, q):
        xs = sorted(xs)
        return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None

    report = {
        "clients": args.clients,
        "minutes": args.minutes,
        "models": models,
        "requests": len(results.rows),
        "outcomes": {k: dict(v) for k, v in by_kind.items()},
        "latency_s": {k: {"p50": pct(v, 0.5), "p95": pct(v, 0.95), "n": len(v)} for k, v in latencies.items()},
        "crashes_injected": [m for _, m in crashes],
        "runner_crashes_counted": metric_sum(metrics, "hypura_runner_crashes_total{"),
        "residency_moves": metric_sum(metrics, "hypura_model_moves_total{"),
        "rss_mib": memory,
        "server_rss_mib_every_30s": [x[1] for x in samples],
        "runners_rss_mib_every_30s": [x[2] for x in samples],
        "cores": os.cpu_count(),
        "attacks": {k: dict(v) for k, v in attacks.items()},
        "attack_failures": {k: {o: n for o, n in v.items() if o not in EXPECTED[k]} for k, v in attacks.items()
                            if any(o not in EXPECTED[k] for o in v)},
        "runner_stops": [m for _, _, m in stops],
        "server_rss_start_mib": rss_start,
        "server_rss_after_mib": rss_back,
        "server_rss_back_under_1_5x": rss_back is not None and rss_back < 1.5 * rss_start,
        "server_alive": alive,
        "answering_at_end": healthy,
        "defects": defects,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    attack_failures = sum(sum(v.values()) for v in report["attack_failures"].values())
    rss_ok = report["server_rss_back_under_1_5x"] or not args.attacks
    ok = alive and healthy and defects == 0 and attack_failures == 0 and rss_ok
    deaths = 0 if alive else 1
    print(f"soak {'passed' if ok else 'FAILED'}: {len(results.rows)} requests, {defects} failed outside crash windows, "
          f"{sum(sum(v.values()) for v in attacks.values())} attacks ({attack_failures} not refused as expected), "
          f"{deaths} server deaths, server RSS {rss_start} MiB at start, {rss_back} MiB after")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
