#!/usr/bin/env python3
"""How fast this disk delivers a model file, read the ways the streamer could.

    python3 scripts/bench/disk_read.py FILE [GIB_PER_CASE] [ROUNDS]

Each case reads GIB_PER_CASE (default 2) GiB of FILE from its own offset
(so no case reads what another has, and O_DIRECT cases never hit the page
cache), the cases interleaved over ROUNDS (default 1) rounds, since a
shared disk's speed drifts: O_DIRECT in chunks of a block size with a number of reads in flight
(threads), into one reused buffer per thread or into freshly mapped memory
(as the streamer's released pages are: every page faulted in by the read);
and buffered reads after dropping the page cache where that is allowed.
Prints one JSON line per case: block, depth, destination, GB/s.
"""
import json
import mmap
import os
import sys
import threading
import time

CASES = [
    (1 << 20, 4, "reused"), (1 << 20, 4, "fresh"), (1 << 20, 8, "fresh"),
    (512 << 10, 8, "fresh"), (256 << 10, 16, "fresh"), (4 << 20, 4, "fresh"),
    (1 << 20, 4, "buffered"),
]


def read_rate(path, offset, length, block, depth, dest):
    """GB/s of reading [offset, offset + length) of path in blocks of
    `block`, `depth` threads taking them in turn: O_DIRECT into one reused
    buffer per thread ("reused") or into one fresh mapping ("fresh"), or
    buffered reads ("buffered")."""
    direct = dest != "buffered"
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    n_blocks = length // block
    next_block = [0]
    lock = threading.Lock()
    fresh = mmap.mmap(-1, length) if dest == "fresh" else None

    def worker():
        buf = mmap.mmap(-1, block)
        while True:
            with lock:
                i = next_block[0]
                next_block[0] += 1
            if i >= n_blocks:
                return
            view = memoryview(fresh)[i * block:(i + 1) * block] if fresh else memoryview(buf)
            os.preadv(fd, [view], offset + i * block)
            view.release()

    threads = [threading.Thread(target=worker) for _ in range(depth)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    os.close(fd)
    if fresh:
        fresh.close()
    return n_blocks * block / seconds / 1e9


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def main():
    path = sys.argv[1]
    per_case = int(float(sys.argv[2] if len(sys.argv) > 2 else 2) * (1 << 30))
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    size = os.path.getsize(path)
    for r in range(rounds):
        for k, (block, depth, dest) in enumerate(CASES):
            offset = ((r * len(CASES) + k) * per_case) % max(size - per_case, 1)
            offset -= offset % (1 << 20)
            case = {"round": r, "block": block, "depth": depth, "dest": dest}
            if dest == "buffered" and not drop_caches():
                print(json.dumps({**case, "skipped": "cannot drop caches"}))
                continue
            rate = read_rate(path, offset, per_case, block, depth, dest)
            print(json.dumps({**case, "gbps": round(rate, 3)}), flush=True)


if __name__ == "__main__":
    main()
