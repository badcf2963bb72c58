#!/usr/bin/env python3
"""Runs a command inside a cgroup v2 and says what its memory was made of.

    cgroup_watch.py CGROUP_DIR -- COMMAND...

Every 50 ms it reads the cgroup's `memory.current` and `memory.stat` and
the command's `/proc/PID/status`. It prints one JSON object: the command's
return code and stdout (parsed when it is JSON), the cgroup's `memory.peak`
and `memory.events`, the sample taken when `memory.current` was highest
(each `memory.stat` field then, and the process's VmRSS, RssAnon, RssFile,
RssShmem, VmPTE, VmLck, VmPin), and the highest value each field reached.
The command's stderr passes through.
"""
import json
import os
import subprocess
import sys
import threading
import time

STATUS_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmPTE", "VmLck", "VmPin", "VmHWM")


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def stat(cg):
    out = {}
    for line in read(f"{cg}/memory.stat").splitlines():
        key, value = line.split()
        out[key] = int(value)
    return out


def status(pid):
    out = {}
    for line in read(f"/proc/{pid}/status").splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_FIELDS:
            out[key] = int(value.split()[0]) * 1024
    return out


def main():
    cg = sys.argv[1]
    cmd = sys.argv[sys.argv.index("--") + 1:]

    def enter():
        with open(f"{cg}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, preexec_fn=enter)
    stdout = []
    reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()))
    reader.start()
    at_peak, highest, current_peak = {}, {}, -1
    while proc.poll() is None:
        current = int(read(f"{cg}/memory.current") or 0)
        sample = {"memory.current": current, **stat(cg), **status(proc.pid)}
        for key, value in sample.items():
            highest[key] = max(highest.get(key, 0), value)
        if current > current_peak:
            current_peak, at_peak = current, sample
        time.sleep(0.05)
    reader.join()
    text = stdout[0].decode(errors="replace") if stdout else ""
    try:
        result = json.loads(text)
    except ValueError:
        result = text[-4000:]
    events = dict(line.split() for line in read(f"{cg}/memory.events").splitlines())
    keep = ("memory.current", "anon", "file", "kernel", "kernel_stack", "pagetables", "sec_pagetables",
            "percpu", "sock", "shmem", "file_mapped", "unevictable", "slab") + STATUS_FIELDS
    print(json.dumps({
        "returncode": proc.returncode,
        "memory_max": read(f"{cg}/memory.max").strip(),
        "memory_peak": int(read(f"{cg}/memory.peak") or 0),
        "oom_kills": int(events.get("oom_kill", 0)),
        "at_peak": {k: at_peak.get(k) for k in keep if k in at_peak},
        "highest": {k: highest.get(k) for k in keep if k in highest},
        "result": result,
    }))


if __name__ == "__main__":
    main()
