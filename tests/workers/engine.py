"""Engine semantics on N ranks: out-of-order submission, every mismatch kind (error on every
rank, tensors untouched, next collective fine), duplicate names, poll, fusion, timeline.
usage: engine.py [timeline-path]"""
import json
import sys
import time

import numpy as np

import _common as c
import fastring
from fastring._core.config import FUSION_MAX_TENSOR_BYTES
from fastring._core.runtime import runtime

fastring.init()
N, R = c.SIZE, c.RANK
engine = fastring._core.runtime.runtime().engine

# --- out-of-order submission: every rank submits the same names in its own order
names = [f"grad{i}" for i in range(12)]
order = np.random.default_rng(R).permutation(len(names))
inputs = {n: np.arange(100 + i, dtype=np.float32) for i, n in enumerate(names)}
handles = {names[i]: fastring.allreduce_async(inputs[names[i]] * (R + 1), op=fastring.Sum, name=names[i])
           for i in order}
for n in reversed(names):
    got = handles[n].wait()
    c.check_close(f"out of order {n}", got, inputs[n] * (N * (N + 1) / 2), 0)
    if not fastring.poll(handles[n]):
        c.fail("poll() is False after wait()")

# --- unnamed requests get the same names on every rank from their submission order
hs = [fastring.allreduce_async(np.full(3, float(k)), op=fastring.Sum) for k in range(5)]
for k, h in enumerate(hs):
    c.check_close(f"unnamed {k}", h.wait(), np.full(3, float(k * N)), 0)

# --- every mismatch kind under one name raises FastringError on every rank
if N > 1:
    cases = {
        "shape": lambda t: fastring.allreduce(np.zeros(4 if R == 0 else 5, np.float32), name="m.shape"),
        "dtype": lambda t: fastring.allreduce(np.zeros(4, np.float32 if R == 0 else np.float64), name="m.dtype"),
        "op": lambda t: fastring.allreduce(t, op=fastring.Sum if R == 0 else fastring.Max, name="m.op", out=t),
        "prescale_factor": lambda t: fastring.allreduce(t, prescale_factor=1.0 if R == 0 else 2.0, name="m.pre", out=t),
        "postscale_factor": lambda t: fastring.allreduce(t, postscale_factor=1.0 if R else 3.0, name="m.post", out=t),
        "collective": lambda t: (fastring.allreduce(t, name="m.kind", out=t) if R == 0
                                 else fastring.grouped_allreduce([t], name="m.kind")),
        "small and large": lambda t: fastring.allreduce(np.zeros(10 if R == 0 else 100000, np.float32), name="m.big"),
    }
    for field, call in cases.items():
        t = np.arange(4, dtype=np.float32) + R
        before = t.copy()
        try:
            call(t)
        except fastring.FastringError as e:
            msg = str(e)
            expect = "shape" if field == "small and large" else field
            if expect not in msg or "rank" not in msg:
                c.fail(f"mismatch {field}: message does not name it and the ranks: {msg}")
        else:
            c.fail(f"mismatch {field}: no FastringError")
        c.check_close(f"mismatch {field} leaves the tensor untouched", t, before, 0)
        # the next collective works
        c.check_close(f"after mismatch {field}", fastring.allreduce(np.ones(3), op=fastring.Sum), np.full(3, N), 0)
    # the same mismatch through async handles, with other work in flight
    h1 = fastring.allreduce_async(np.ones(2), op=fastring.Sum, name="fine")
    h2 = fastring.allreduce_async(np.ones(2 + R), op=fastring.Sum, name="bad")
    c.check_close("fine beside bad", h1.wait(), np.full(2, N), 0)
    try:
        h2.wait()
        c.fail("async mismatch: no FastringError")
    except fastring.FastringError as e:
        if "ranks" not in str(e) and "rank" not in str(e):
            c.fail(f"async mismatch message: {e}")

# --- a synchronous call on the latency path meets another rank's different request: rank 0
# has "q1" queued when it calls "q2"; the others call "q2" alone first, then "q1"
# (a small call carries its data in the cycle, a large one runs the ring after it)
for n in ((3, 100003) if N > 1 else ()):
    c.COMM.Barrier()
    if R == 0:
        h = fastring.allreduce_async(np.full(n, 1.0), op=fastring.Sum, name=f"q1.{n}")
        c.check_close("crossed q2", fastring.allreduce(np.full(n, 2.0), op=fastring.Sum, name=f"q2.{n}"), np.full(n, 2.0 * N), 0)
        c.check_close("crossed q1", h.wait(), np.full(n, N), 0)
    else:
        c.check_close("crossed q2", fastring.allreduce(np.full(n, 2.0), op=fastring.Sum, name=f"q2.{n}"), np.full(n, 2.0 * N), 0)
        c.check_close("crossed q1", fastring.allreduce(np.full(n, 1.0), op=fastring.Sum, name=f"q1.{n}"), np.full(n, N), 0)

# --- a name already in flight is a ValueError at call time, on the calling rank
h = fastring.allreduce_async(np.ones(2), op=fastring.Sum, name="dup")
try:
    fastring.allreduce_async(np.ones(2), name="dup")
    c.fail("duplicate in-flight name accepted")
except ValueError as e:
    if "dup" not in str(e):
        c.fail(f"duplicate name message: {e}")
c.check_close("dup original", h.wait(), np.full(2, N), 0)
# once finished, the name can be used again
c.check_close("dup reuse", fastring.allreduce(np.ones(2), op=fastring.Sum, name="dup"), np.full(2, N), 0)

# --- poll before completion: rank 0 submits while the others are still asleep
if N > 1:
    c.COMM.Barrier()
    if R == 0:
        h = fastring.allreduce_async(np.ones(2), op=fastring.Sum, name="late")
        if fastring.poll(h):
            c.fail("poll() is True before the other ranks submitted")
        c.check_close("late", fastring.synchronize(h), np.full(2, N), 0)
    else:
        time.sleep(0.3)
        fastring.allreduce(np.ones(2), op=fastring.Sum, name="late")

# --- fusion: 100 async tensors of one dtype go out in far fewer reductions
batches = []
original = engine._executor._reduce_batch
engine._executor._reduce_batch = lambda batch: (batches.append(len(batch)), original(batch))[1]
xs = [np.full(1000, float(i), np.float32) for i in range(100)]
c.COMM.Barrier()
hs = [fastring.allreduce_async(x, op=fastring.Sum, name=f"fuse{i}") for i, x in enumerate(xs)]
for i, h in enumerate(hs):
    c.check_close(f"fused {i}", h.wait(), np.full(1000, i * N, np.float32), 0)
fused_batches = [b for b in batches if b]
if sum(fused_batches) + 0 > 100 or len(fused_batches) > 20:
    c.fail(f"100 tensors ran in {len(fused_batches)} batches: {fused_batches}")
# mixed dtypes and ops are never fused together, and still come out right
batches.clear()
h_a = fastring.allreduce_async(np.ones(5, np.float64), op=fastring.Sum, name="mix.a")
h_b = fastring.allreduce_async(np.ones(5, np.int32), op=fastring.Sum, name="mix.b")
h_c = fastring.allreduce_async(np.full(5, R, np.int32), op=fastring.Max, name="mix.c")
c.check_close("mix a", h_a.wait(), np.full(5, N), 0)
c.check_close("mix b", h_b.wait(), np.full(5, N), 0)
c.check_close("mix c", h_c.wait(), np.full(5, N - 1), 0)
# in place, asynchronously: a contiguous array takes the plain path, a strided view the general
# one (reduced through a contiguous copy, written back); each handle returns its own array
flat_in, strided = np.full(6, R + 1.0), np.full(12, R + 1.0)[::2]
h_flat = fastring.allreduce_async(flat_in, op=fastring.Sum, name="inplace.flat", out=flat_in)
h_strided = fastring.allreduce_async(strided, op=fastring.Sum, name="inplace.strided", out=strided)
if h_flat.wait() is not flat_in or h_strided.wait() is not strided:
    c.fail("an in-place allreduce_async did not return its own array")
c.check_close("in place, contiguous", flat_in, np.full(6, N * (N + 1) / 2), 0)
c.check_close("in place, strided", strided, np.full(6, N * (N + 1) / 2), 0)
frozen = np.ones(3)
frozen.flags.writeable = False
try:
    fastring.allreduce_async(frozen, op=fastring.Sum, name="inplace.frozen", out=frozen)
    c.fail("an in-place allreduce_async of a read-only array was accepted")
except ValueError as e:
    if "read-only" not in str(e):
        c.fail(f"read-only in place: {e}")
# grouped: one request, one batch
g = fastring.grouped_allreduce([np.ones(3), np.full((2, 2), 2.0)], op=fastring.Sum, name="group")
c.check_close("group 0", g[0], np.full(3, N), 0)
c.check_close("group 1", g[1], np.full((2, 2), 2.0 * N), 0)
# a large tensor is reduced alone, where it lies, never copied into the fusion buffer; the
# small ones around it fuse, in place or into a strided out= (unpacked in one call)
sizes = []
engine._executor._reduce_batch = lambda batch: (sizes.append([r.nbytes for r in batch]), original(batch))[1]
big = FUSION_MAX_TENSOR_BYTES // 4
ins = [np.full(10, 1.0, np.float32), np.full(7, R + 1.0, np.float32), np.full(big, 2.0, np.float32),
       np.full(10, 3.0, np.float32), np.full(big + 1, R + 1.0, np.float32)]
strided = np.zeros(14, np.float32)
outs = [ins[0], strided[::2], ins[2], ins[3], ins[4]]
c.COMM.Barrier()
hs = [fastring.allreduce_async(x, op=fastring.Sum, name=f"alone{i}", out=o) for i, (x, o) in enumerate(zip(ins, outs))]
got = [h.wait() for h in hs]
for i, want in enumerate((N, N * (N + 1) / 2, 2.0 * N, 3.0 * N, N * (N + 1) / 2)):
    c.check_close(f"alone {i}", got[i], np.full(outs[i].shape, want, np.float32), 0)
    c.CHECKS.check(got[i] is outs[i], f"alone {i}: the result is not the out= array")
c.check_close("alone strided gaps", strided[1::2], np.zeros(7, np.float32), 0)
for batch in sizes:
    c.CHECKS.check(len(batch) == 1 or max(batch) < FUSION_MAX_TENSOR_BYTES,
                   f"a tensor of {FUSION_MAX_TENSOR_BYTES} bytes or more was fused: {batch}")
c.CHECKS.check(sorted(b[0] for b in sizes if b[0] >= FUSION_MAX_TENSOR_BYTES) == [ins[2].nbytes, ins[4].nbytes],
               f"the large tensors did not run as batches of their own: {sizes}")
engine._executor._reduce_batch = original

# --- timeline
if len(sys.argv) > 1:
    path = sys.argv[1]
    fastring.start_timeline(path)
    fastring.allreduce(np.ones(1000), name="tl.small")
    fastring.allreduce(np.ones(100000), name="tl.big")
    hs = [fastring.allreduce_async(np.ones(10), name=f"tl.async{i}") for i in range(3)]
    [h.wait() for h in hs]
    fastring.stop_timeline()
    if R == 0:
        with open(path) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
        pids = {e["pid"] for e in events}
        if pids != set(range(N)):
            c.fail(f"timeline pids {pids}")
        tensors = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        for n in ("tl.small", "tl.big", "tl.async0"):
            if n not in tensors:
                c.fail(f"timeline lacks tensor {n}: {tensors}")
        phases = {e["name"] for e in events if e.get("ph") == "X"}
        # tl.big's algorithm: through the shared segment on one host, else the ring
        moved = ("shm-allreduce",) if runtime().shm is not None else ("reduce-scatter", "allgather")
        for p in ("queued", "negotiate", "pack", *moved, "unpack"):
            if p not in phases:
                c.fail(f"timeline lacks phase {p}: {phases}")
c.done("engine")
