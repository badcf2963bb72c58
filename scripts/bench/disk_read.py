#!/usr/bin/env python3
"""How fast this disk delivers a model file, read the ways the streamer could.

    python3 scripts/bench/disk_read.py FILE [GIB_PER_CASE] [ROUNDS]

Each case reads GIB_PER_CASE (default 2) GiB of FILE from its own offset
(so no case reads what another has, and O_DIRECT cases never hit the page
cache), the cases interleaved over ROUNDS (default 1) rounds, since a
shared disk's speed drifts: O_DIRECT in chunks of a block size with a number of reads in flight
(threads), into one reused buffer per thread, into freshly mapped memory
(as the streamer's released pages are: every page faulted in by the read),
into fresh memory populated before the clock starts ("populated", as a
pass's read-ahead populates), or into pages moved by mremap from memory
used before ("moved": what recycling an evicted unit's pages would give a
decode's on-demand read); and buffered reads after dropping the page cache
where that is allowed.
Prints one JSON line per case: block, depth, destination, GB/s.
"""
import ctypes
import json
import mmap
import os
import sys
import threading
import time

CASES = [
    (1 << 20, 4, "reused"), (1 << 20, 4, "fresh"), (1 << 20, 8, "fresh"),
    (512 << 10, 8, "fresh"), (256 << 10, 16, "fresh"), (4 << 20, 4, "fresh"),
    (1 << 20, 4, "buffered"), (1 << 20, 4, "populated"), (1 << 20, 4, "moved"),
]

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
LIBC.mremap.restype = ctypes.c_void_p
LIBC.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                        ctypes.c_void_p]
LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value
MADV_POPULATE_WRITE = 23
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2


def anonymous(length):
    """A private anonymous mapping of `length` bytes: (address, buffer)."""
    prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    addr = LIBC.mmap(None, length, prot, flags, -1, 0)
    if addr in (None, MAP_FAILED):
        raise OSError(ctypes.get_errno(), "mmap")
    return addr, (ctypes.c_char * length).from_address(addr)


def destination(length, dest):
    """Memory for a case's reads, prepared as the case says (untimed):
    (address, buffer)."""
    addr, buf = anonymous(length)
    if dest == "fresh":
        return addr, buf
    if dest == "populated":
        if LIBC.madvise(addr, length, MADV_POPULATE_WRITE) != 0:
            raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")
        return addr, buf
    # "moved": pages written elsewhere, then moved over the destination.
    src, _ = anonymous(length)
    if LIBC.madvise(src, length, MADV_POPULATE_WRITE) != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")
    moved = LIBC.mremap(src, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, addr)
    if moved != addr:
        raise OSError(ctypes.get_errno(), "mremap")
    return addr, buf


def read_rate(path, offset, length, block, depth, dest):
    """GB/s of reading [offset, offset + length) of path in blocks of
    `block`, `depth` threads taking them in turn: O_DIRECT into one reused
    buffer per thread ("reused") or into one mapping prepared as
    `destination` says ("fresh", "populated", "moved"), or buffered reads
    ("buffered")."""
    direct = dest != "buffered"
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    n_blocks = length // block
    next_block = [0]
    lock = threading.Lock()
    mapped = destination(length, dest) if dest not in ("reused", "buffered") else None
    fresh = mapped[1] if mapped else None

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
    if mapped:
        LIBC.munmap(mapped[0], length)
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
