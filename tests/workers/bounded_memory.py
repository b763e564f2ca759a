"""Bounded memory on N ranks: allreduce and allgather (uneven rows) of 2,000 distinct shapes
of 64 KiB and more, each result checked exactly and dropped; the resident set must not grow
past what the pool may keep for the sizes used, plus slack for malloc and Python.
usage: bounded_memory.py [shapes]"""
import sys
import time

import numpy as np

import _common as c
import fastring
from fastring._core import pool as _pool

N, R = c.SIZE, c.RANK
SHAPES = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
ROW = 32  # int32 elements per allgather row: 128 bytes
FIRST = 64 * 1024 // 4  # elements of the smallest allreduce: 64 KiB
# Whatever the pool's classes: on 2 ranks the 2,000 results add up to 447 MiB, and a pool
# keyed by shape (which kept them all) must fail this.
CEILING_BYTES = 128 << 20
# Growth the pool does not account for: glibc's heap keeps freed blocks (up to its 32 MiB
# mmap threshold) for reuse instead of returning them, and NumPy and Python keep a few caches.
SLACK_BYTES = 64 << 20
# Small integers (sums over ranks stay exact in int32), made once: each shape's input is a
# slice of them plus the rank, so the loop's own work is the collectives'.
BASE = (np.arange(max(FIRST + 4 * SHAPES, (512 + SHAPES + N) * ROW), dtype=np.int32) * 7) % 1001


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def check(name: str, got: np.ndarray, expected: np.ndarray) -> None:
    if got.shape != expected.shape or got.dtype != expected.dtype or not np.array_equal(got, expected):
        c.fail(f"{name}: got {got.dtype}{got.shape} {got.reshape(-1)[:4]}, expected "
               f"{expected.dtype}{expected.shape} {expected.reshape(-1)[:4]}")


fastring.init()
# Warm up the transport's buffers and the pool's first classes before the baseline.
check("warm-up", fastring.allreduce(np.ones(FIRST, np.int32), op=fastring.Sum), np.full(FIRST, N, np.int32))
before = rss_bytes()
start = time.perf_counter()
sizes: set[int] = set()
for i in range(SHAPES):
    if i % 2 == 0:  # allreduce of FIRST + 4 i elements: 64 KiB and up, 16 bytes apart
        count = FIRST + 4 * i
        got = fastring.allreduce(BASE[:count] + R, op=fastring.Sum)
        check(f"allreduce of {count}", got, N * BASE[:count] + N * (N - 1) // 2)
    else:  # allgather of 512 + i + r rows of ROW from rank r: uneven, 64 KiB and up each
        rows = [512 + i + r for r in range(N)]
        got = fastring.allgather(BASE[:rows[R] * ROW].reshape(rows[R], ROW) + R)
        if got.shape != (sum(rows), ROW):
            c.fail(f"allgather of {rows} rows: got shape {got.shape}")
        offsets = np.cumsum([0] + rows)
        for r in range(N):
            check(f"allgather of {rows} rows, rank {r}'s", got[offsets[r]:offsets[r + 1]],
                  BASE[:rows[r] * ROW].reshape(rows[r], ROW) + r)
    sizes.add(_pool.size_class(got.nbytes))
    del got
growth = rss_bytes() - before
seconds = time.perf_counter() - start
entries, kept = _pool.POOL.kept()
# Each result was dropped before the next collective, so the pool keeps at most one buffer
# per size class the results fell into (their sum); keyed by shape it kept one per shape.
may_keep = sum(sizes)
print(f"[rank {R}] {SHAPES} distinct shapes: RSS +{growth / 2**20:.1f} MiB; pool keeps "
      f"{entries} buffers, {kept / 2**20:.1f} MiB, of {len(sizes)} classes, "
      f"{may_keep / 2**20:.1f} MiB; {seconds:.1f} s", flush=True)
if kept > may_keep or entries > len(sizes):
    c.fail(f"the pool keeps {entries} buffers, {kept} bytes: more than one per class ({may_keep})")
if growth > min(may_keep + SLACK_BYTES, CEILING_BYTES):
    c.fail(f"RSS grew {growth / 2**20:.1f} MiB over {SHAPES} distinct shapes, more than the "
           f"{may_keep / 2**20:.1f} MiB the pool may keep plus {SLACK_BYTES >> 20} MiB, or "
           f"{CEILING_BYTES >> 20} MiB")
fastring.shutdown()
c.done(f"bounded memory over {SHAPES} distinct shapes")
