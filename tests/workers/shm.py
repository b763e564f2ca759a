"""The one-host shared-memory path (fastring/_transport/shm.pyx, fastring/algorithms/shm.py).
usage: shm.py check | kill | raise | quick

check: the segment is mapped and already unlinked; every dtype x op through it, one step and
    in rounds (uneven splits, a round with empty parts), Average and the postscale in rounds,
    out= into another array with the input left alone, fusion of async requests, grouped
    allreduce, compression, the negotiation cycle through it; then FASTRING_SHM=0 falls back
    (and says why at debug level) and a second init maps a fresh segment.
kill: rank V (the last) SIGKILLs itself while the ranks loop over 16 MiB allreduces.
raise: rank V raises instead of calling the allreduce the others call.
quick: one allreduce through the segment, checked.
Every rank prints `rank R pid P` first, so the test can look for the launch's segment name
(/dev/shm/fastring-<rank 0's pid>-...)."""
import io
import logging
import os
import signal
import sys
import threading

import numpy as np

import _common as c
import fastring
from fastring._core.config import SHM_ONE_STEP_BYTES, SHM_TILE_BYTES
from fastring._core.runtime import runtime
from fastring._transport import array_address
from fastring import kernels
from fastring._core.ops import KERNEL_OP

case = sys.argv[1]
log = io.StringIO()
logging.getLogger("fastring").addHandler(logging.StreamHandler(log))
os.environ["FASTRING_LOG_LEVEL"] = "debug"
fastring.init()
N, R = c.SIZE, c.RANK
V = N - 1
pid0 = c.COMM.bcast(os.getpid(), root=0)
print(f"rank {R} pid {os.getpid()}", flush=True)
OPS = [fastring.Sum, fastring.Average, fastring.Min, fastring.Max, fastring.Product]


def leftovers() -> list[str]:
    return [f for f in os.listdir("/dev/shm") if f.startswith(f"fastring-{pid0}-")]


if case == "kill":
    big = np.ones((16 << 20) // 4, np.float32)
    fastring.allreduce(big, name="big", out=big)
    if R == V:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()
    for i in range(1000):
        fastring.allreduce(big, name="big", out=big)
    sys.exit(0)
if case == "raise":
    fastring.allreduce(np.ones(2), name="warmup")
    if R == V:
        raise ValueError(f"rank {R} failed on purpose")
    try:
        fastring.allreduce(np.ones(SHM_TILE_BYTES // 8), name="never")
    except fastring.FastringError as e:
        print(f"rank {R}: FastringError: {e}", flush=True)
    sys.exit(0)

if case == "quick":
    got = fastring.allreduce(np.full(SHM_TILE_BYTES // 4, R + 1.0), op=fastring.Sum)
    c.check_close("quick", got, np.full(SHM_TILE_BYTES // 4, N * (N + 1) / 2), 0)
    c.CHECKS.check(runtime().shm is not None and not leftovers(), "no fresh segment")
    c.done("shm quick")
    sys.exit(0)

rt = runtime()
c.CHECKS.check(rt.shm is not None, f"the shared-memory path is off: {log.getvalue()}")
c.CHECKS.check(not leftovers(), f"the segment is still linked in /dev/shm: {leftovers()}")
c.CHECKS.check(rt.engine._neg._cycle_exchange == rt.shm.cycle_exchange, "the cycle does not run through the segment")

# Every dtype and op, one step (above the cycle's 64 KiB) and in rounds whose last split is
# uneven (a buffer's worth and N + 1 elements more).
for dt in c.DTYPES:
    one_step = SHM_ONE_STEP_BYTES // dt.itemsize - 1
    rounds = SHM_TILE_BYTES // dt.itemsize + N + 1
    for op in OPS:
        if dt == np.bool_ and op == fastring.Average:
            continue
        for length in (one_step, rounds):
            name = f"{dt} {op.name} n={length}"
            inputs = [c.rank_input(dt, length, r, length + int(op)) for r in range(N)]
            expected, bound = c.reference(inputs, op, N)
            x = inputs[R].copy()
            got = fastring.allreduce(x, op=op, name=name)
            c.check_close(name + " input", x, inputs[R], 0)
            c.check_close(name, got, expected, bound)
            c.check_identical(name, got)
            fastring.allreduce(x, op=op, name=name, out=x)  # in place
            c.check_close(name + " in place", x, expected, bound)

# The transport itself: rounds with parts of one element and empty parts (count < N).
shm = rt.shm
sum_f64 = kernels.reduce_cfunc(KERNEL_OP[fastring.Sum], np.dtype(np.float64))
for count in (1, N - 1, N, 2 * N + 1):
    a = np.arange(count, dtype=np.float64) + R
    out = np.full(count, -1.0)
    shm.allreduce(array_address(a), array_address(out), a.nbytes, sum_f64, 8, False)
    c.check_close(f"transport rounds n={count}", out, N * np.arange(count) + N * (N - 1) / 2, 0)
# The other collectives' loops in several rounds (the API sends only small ones through the
# segment): allgather of uneven blocks, alltoall of uneven pieces, reduce-scatter of uneven parts.
tile = shm.tile_bytes
counts = np.array([tile + 100 + 8 * r for r in range(N)], np.int64)
displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
mine = np.full(counts[R], R + 1, np.uint8)
gathered = np.zeros(int(counts.sum()), np.uint8)
shm.gatherv(array_address(mine), array_address(gathered), counts, displs)
c.check_close("gatherv rounds", gathered, np.repeat(np.arange(1, N + 1, dtype=np.uint8), counts), 0)
matrix = np.array([[tile // N + 64 * r + j for j in range(N)] for r in range(N)], np.int64)
send = np.concatenate([np.full(matrix[R, j], 10 * R + j, np.uint8) for j in range(N)])
sdispls = np.concatenate([[0], np.cumsum(matrix[R])[:-1]]).astype(np.int64)
rdispls = np.concatenate([[0], np.cumsum(matrix[:, R])[:-1]]).astype(np.int64)
received = np.zeros(int(matrix[:, R].sum()), np.uint8)
shm.alltoallv(array_address(send), matrix, sdispls, array_address(received), rdispls)
c.check_close("alltoallv rounds", received,
              np.concatenate([np.full(matrix[r, R], 10 * r + R, np.uint8) for r in range(N)]), 0)
parts = np.array([tile // 8 + r for r in range(N)], np.int64)  # float64 items per rank
offsets = np.concatenate([[0], np.cumsum(parts)]).astype(np.int64) * 8
values = np.arange(int(parts.sum()), dtype=np.float64) * (R + 1)
part = np.zeros(int(parts[R]), np.float64)
shm.reduce_scatter(array_address(values), offsets, array_address(part), sum_f64, 8)
c.check_close("reduce_scatter rounds", part,
              np.arange(offsets[R] // 8, offsets[R + 1] // 8, dtype=np.float64) * (N * (N + 1) / 2), 0)

for bad in ((12, 8, True), (SHM_TILE_BYTES + 8, 8, True)):
    try:
        shm.allreduce(array_address(a), array_address(out), bad[0], sum_f64, bad[1], bad[2])
        c.CHECKS.fail(f"shm.allreduce accepted {bad}")
    except ValueError as e:
        c.CHECKS.check("must" in str(e), f"unclear error {e}")

# Average's division and the postscale run once per element, in every round.
length = 3 * SHM_TILE_BYTES // 8 + 7
xs = [c.rank_input(np.dtype(np.float32), length, r, 11) for r in range(N)]
exp, bound = c.reference(xs, fastring.Sum, N)
got = fastring.allreduce(xs[R].copy(), op=fastring.Average, postscale_factor=3.0, name="avg post")
c.check_close("average postscaled", got, exp / N * 3.0, 3.0 * (bound / N + 2 * c.EPS[np.dtype(np.float32)] * np.abs(exp / N)))
c.check_identical("average postscaled", got)

# out= another array; the input is left as it was.
src = xs[R].copy()
dst = np.zeros_like(src)
r = fastring.allreduce(src, op=fastring.Sum, out=dst, name="out other")
c.CHECKS.check(r is dst, "out= returned another object")
c.check_close("out other", dst, exp, bound)
c.check_close("out other input", src, xs[R], 0)

# Fusion: 40 async requests of 30 KB fuse into batches that run through the segment.
parts = [[c.rank_input(np.dtype(np.int32), 7500, r, 100 + i) for r in range(N)] for i in range(40)]
handles = [fastring.allreduce_async(p[R].copy(), op=fastring.Sum, name=f"fused.{i}") for i, p in enumerate(parts)]
for i, h in enumerate(handles):
    c.check_close(f"fused {i}", fastring.synchronize(h), np.add.reduce(np.stack(parts[i])), 0)
grouped = [[c.rank_input(np.dtype(np.float32), 10_000, r, 200 + i) for r in range(N)] for i in range(100)]
results = fastring.grouped_allreduce([g[R].copy() for g in grouped], op=fastring.Average, name="grouped")
for i, g in enumerate(grouped):
    e, b = c.reference(g, fastring.Average, N)
    c.check_close(f"grouped {i}", results[i], e, b)

# Compression: the 16-bit wire format's rounding, on the same data as the plain call.
cx = [c.rank_input(np.dtype(np.float32), 100_000, r, 300) for r in range(N)]
e, b = c.reference(cx, fastring.Sum, N)
got = fastring.allreduce(cx[R].copy(), op=fastring.Sum, compression=fastring.Compression.fp16, name="fp16")
c.check_close("fp16 compression", got, e, b + N * c.EPS[np.dtype(np.float16)] * np.abs(e) * 2)
c.check_identical("fp16 compression", got)

# The cycle through the segment: ranks that propose different requests still agree.
a_in, b_in = np.ones(10), np.full(10, 2.0)
if R % 2:
    hb = fastring.allreduce_async(b_in, name="b")
    ha = fastring.allreduce_async(a_in, name="a")
else:
    ha = fastring.allreduce_async(a_in, name="a")
    hb = fastring.allreduce_async(b_in, name="b")
c.check_close("crossed a", fastring.synchronize(ha), a_in, 0)  # Average of equal inputs
c.check_close("crossed b", fastring.synchronize(hb), b_in, 0)

# FASTRING_SHM=0: the MPI paths, and the debug log says why; then a fresh segment again.
os.environ["FASTRING_SHM"] = "0"
fastring.shutdown()
fastring.init()
c.CHECKS.check(runtime().shm is None, "FASTRING_SHM=0 left the path on")
c.CHECKS.check("shared-memory path off: FASTRING_SHM=0" in log.getvalue(), f"no reason logged: {log.getvalue()}")
got = fastring.allreduce(xs[R].copy(), op=fastring.Sum, name="off")
c.check_close("FASTRING_SHM=0", got, exp, bound)
os.environ["FASTRING_SHM"] = "1"
fastring.shutdown()
fastring.init()
c.CHECKS.check(runtime().shm is not None and not leftovers(), "a second init did not map a fresh segment")
got = fastring.allreduce(xs[R].copy(), op=fastring.Sum, name="again")
c.check_close("after re-init", got, exp, bound)
c.done("shm check")
