"""fastring.torch's collectives on N ranks, ported from Horovod's test_torch.py: every dtype
(bfloat16 included) for allreduce (ops, average=, scale factors, compression), in-place and
async forms, grouped forms, allgather, broadcast, alltoall, reducescatter, barrier, the object
collectives, join, and the error cases (cross-rank mismatches and local argument errors)."""
import warnings

import numpy as np
import torch

import _common as c
import fastring.torch as hvd
from torch_common import (N, R, TORCH_DTYPES, HalfCompressor, close, expect_error, from_t, identical, same,
                          to_t)

DTYPES = list(TORCH_DTYPES)
FLOATS = [np.dtype(np.float16), c.BF16, np.dtype(np.float32), np.dtype(np.float64)]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def inputs(dt, shape, seed):
    return [c.rank_input(dt, shape, r, seed) for r in range(N)]


# ----------------------------------------------------------------- allreduce
for dt in DTYPES:
    for dim in (1, 2, 3):
        shape = (5,) * dim
        for op in OPS:
            if dt == np.bool_ and op == hvd.Average:
                continue
            xs = inputs(dt, shape, 10 * dim + int(op))
            expected, bound = c.reference(xs, op, N)
            t = to_t(xs[R])
            name = f"allreduce {dt} {shape} {op.name}"
            got = hvd.allreduce(t, op=op)
            if got.dtype != TORCH_DTYPES[dt] or tuple(got.shape) != shape:
                c.fail(f"{name}: result {got.dtype}{tuple(got.shape)}")
            c.check_close(name, from_t(got), expected, bound)
            same(name + " input untouched", t, xs[R])
            identical(name, got)
    # Horovod's deprecated average= (False: Sum, True: Average) and in place
    if dt != np.bool_:
        xs = inputs(dt, (17,), 3)
        t = to_t(xs[R])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summed = hvd.allreduce(t, average=False)
        if not any(issubclass(w.category, DeprecationWarning) for w in caught):
            c.fail("average= gave no DeprecationWarning")
        same(f"allreduce average=False {dt}", summed, hvd.allreduce(t, op=hvd.Sum))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            same(f"allreduce average=True {dt}", hvd.allreduce(t, average=True), hvd.allreduce(t))
        expected = hvd.allreduce(t, op=hvd.Sum)
        if hvd.allreduce_(t, op=hvd.Sum) is not t:
            c.fail("allreduce_ did not return its tensor")
        same(f"allreduce_ {dt}", t, expected)

# async, fused: many in flight at once; poll is False before the other ranks took part
xs = {dt: inputs(dt, (17, 3), 7) for dt in DTYPES if dt != np.bool_}
handles, polled_false = [], False
for i, (dt, x) in enumerate(xs.items()):
    h = hvd.allreduce_async(to_t(x[R]), name=f"fused.{i}", op=hvd.Sum)
    polled_false |= not hvd.poll(h)
    inplace = to_t(x[R])
    handles.append((dt, x, h, inplace, hvd.allreduce_async_(inplace, name=f"fused_.{i}", op=hvd.Sum)))
if not polled_false:
    c.fail("poll() was True right after every allreduce_async: not asynchronous?")
for dt, x, h, inplace, h_ in handles:
    expected, bound = c.reference(x, hvd.Sum, N)
    c.check_close(f"allreduce_async {dt}", from_t(hvd.synchronize(h)), expected, bound)
    if hvd.synchronize(h_) is not inplace or not hvd.poll(h_):
        c.fail("allreduce_async_ did not return its tensor")
    c.check_close(f"allreduce_async_ {dt}", from_t(inplace), expected, bound)

# scale factors (Horovod's prescale test), float64 and integers
x = torch.arange(12, dtype=torch.float64) + R
close("prescale/postscale", hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
      1.5 * sum(torch.arange(12, dtype=torch.float64) + r for r in range(N)), 1e-12)
same("int postscale", hvd.allreduce(torch.full((4,), R + 1, dtype=torch.int64), op=hvd.Sum, postscale_factor=2.0),
     torch.full((4,), N * (N + 1), dtype=torch.int64))
avg = hvd.allreduce_async(x, op=hvd.Average, prescale_factor=2.0, name="scaled_avg")
close("async scaled average", hvd.synchronize(avg),
      2 * sum(torch.arange(12, dtype=torch.float64) + r for r in range(N)) / N, 1e-12)

# compression: the core's fp16/bf16 wire, and a Horovod-shaped custom compressor class
big = [c.rank_input(np.dtype(np.float32), (1000,), r, 4) for r in range(N)]
ref = torch.from_numpy(sum(b.astype(np.float64) for b in big) / N)
for comp, tol in ((hvd.Compression.fp16, 2 ** -9), (hvd.Compression.bf16, 2 ** -6)):
    got = hvd.allreduce(torch.from_numpy(big[R]), compression=comp, name=f"compressed.{comp.name}")
    if got.dtype != torch.float32:
        c.fail(f"{comp}: result dtype {got.dtype}")
    close(f"allreduce {comp}", got, ref, tol * 2 * N)
got = hvd.allreduce(torch.from_numpy(big[R]), compression=HalfCompressor)
if HalfCompressor.calls != 1 or got.dtype != torch.float32:
    c.fail(f"custom compressor: {HalfCompressor.calls} calls, dtype {got.dtype}")
close("allreduce custom compressor", got, ref, 2 ** -9 * 2 * N)

# ----------------------------------------------------------------- grouped allreduce
for dt in (np.dtype(np.int32), c.BF16, np.dtype(np.float64)):
    xs = [inputs(dt, (3 + i, 2), 20 + i) for i in range(4)]
    refs = [c.reference(x, hvd.Sum, N) for x in xs]
    ts = [to_t(x[R]) for x in xs]

    def check(what, results):
        if len(results) != len(xs):
            c.fail(f"{what}: {len(results)} results")
        for (e, b), got in zip(refs, results):
            c.check_close(f"{what} {dt}", from_t(got), e, b)
            identical(what, got)
    check("grouped_allreduce", hvd.grouped_allreduce(ts, op=hvd.Sum))
    check("grouped_allreduce_async", hvd.synchronize(hvd.grouped_allreduce_async(ts, op=hvd.Sum, name="g")))
    for t, x in zip(ts, xs):
        same("grouped input untouched", t, x[R])
    copies = [t.clone() for t in ts]
    h = hvd.grouped_allreduce_async_(copies, op=hvd.Sum, name="g_")
    out = hvd.synchronize(h)
    if any(a is not b for a, b in zip(out, copies)) or not hvd.poll(h):
        c.fail("grouped_allreduce_async_ did not return its tensors")
    check("grouped_allreduce_async_", copies)
    out = hvd.grouped_allreduce_(ts, op=hvd.Sum)
    if any(a is not b for a, b in zip(out, ts)):
        c.fail("grouped_allreduce_ did not return its tensors")
    check("grouped_allreduce_", ts)

# ----------------------------------------------------------------- allgather
for dt in DTYPES:
    for trailing in ((), (3,), (2, 2)):
        xs = [c.rank_input(dt, (r + 1,) + trailing, r, 30) for r in range(N)]  # dim 0 differs
        expected = np.concatenate(xs)
        same(f"allgather {dt} {trailing}", hvd.allgather(to_t(xs[R])), expected)
        same(f"allgather_async {dt} {trailing}", hvd.synchronize(hvd.allgather_async(to_t(xs[R]), name="ag")),
             expected)

# ----------------------------------------------------------------- broadcast
for dt in DTYPES:
    for root in range(N):
        xs = inputs(dt, (4, 3), 40 + root)
        t = to_t(xs[R])
        same(f"broadcast {dt} root {root}", hvd.broadcast(t, root), xs[root])
        same("broadcast input untouched", t, xs[R])
        same("broadcast_async", hvd.synchronize(hvd.broadcast_async(t, root, name="b")), xs[root])
        if hvd.broadcast_(t, root) is not t:
            c.fail("broadcast_ did not return its tensor")
        same(f"broadcast_ {dt} root {root}", t, xs[root])
        t = to_t(xs[R])
        if hvd.synchronize(hvd.broadcast_async_(t, root, name="b_")) is not t:
            c.fail("broadcast_async_ did not return its tensor")
        same(f"broadcast_async_ {dt}", t, xs[root])

# ----------------------------------------------------------------- alltoall
for dt in (np.dtype(np.int64), c.BF16, np.dtype(np.float32), np.dtype(np.bool_)):
    # rank r sends (k + r) % 3 rows to rank k, from a tensor with two spare rows
    counts = [[(k + r) % 3 for k in range(N)] for r in range(N)]
    xs = [c.rank_input(dt, (sum(counts[r]) + 2, 2), r, 50) for r in range(N)]
    starts = [np.concatenate([[0], np.cumsum(counts[r])]) for r in range(N)]
    expected = np.concatenate([xs[r][starts[r][R]:starts[r][R + 1]] for r in range(N)])
    for splits in (counts[R], torch.tensor(counts[R], dtype=torch.int32)):
        out, received = hvd.alltoall(to_t(xs[R]), splits=splits)
        same(f"alltoall {dt}", out, expected)
        same(f"alltoall {dt} received splits", received, np.array([counts[r][R] for r in range(N)], np.int32))
    out, received = hvd.synchronize(hvd.alltoall_async(to_t(xs[R]), splits=counts[R], name="a2a"))
    same(f"alltoall_async {dt}", out, expected)
    # without splits: dimension 0 divided equally; the async form still reports the splits
    xs = inputs(dt, (2 * N, 3), 51)
    expected = np.concatenate([xs[r][2 * R:2 * R + 2] for r in range(N)])
    same(f"alltoall {dt} equal", hvd.alltoall(to_t(xs[R])), expected)
    out, received = hvd.synchronize(hvd.alltoall_async(to_t(xs[R])))
    same(f"alltoall_async {dt} equal", out, expected)
    same("alltoall_async equal splits", received, np.full(N, 2, np.int32))

# ----------------------------------------------------------------- reducescatter
for dt in (np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.float64)):
    for op in (hvd.Sum, hvd.Average):
        rows = 2 * N + 1  # rank 0 gets one extra row
        xs = inputs(dt, (rows, 3), 60 + int(op))
        full, bound = c.reference(xs, op, N)
        start = R * (rows // N) + min(R, rows % N)
        mine = slice(start, start + rows // N + (R < rows % N))
        for got in (hvd.reducescatter(to_t(xs[R]), op=op),
                    hvd.synchronize(hvd.reducescatter_async(to_t(xs[R]), op=op, name="rs"))):
            c.check_close(f"reducescatter {dt} {op.name}", from_t(got), full[mine],
                          bound if np.isscalar(bound) else bound[mine])
xs = inputs(np.dtype(np.float32), (2 * N, 4), 61)
full = sum(x.astype(np.float64) for x in xs) / N
close("reducescatter fp16", hvd.reducescatter(torch.from_numpy(xs[R]), compression=hvd.Compression.fp16),
      full[2 * R:2 * R + 2], 2 ** -9 * 4 * N)

# ----------------------------------------------------------------- barrier, objects
hvd.barrier()
obj = hvd.broadcast_object({"rank": R, "list": [R] * 3} if R == N - 1 else None, root_rank=N - 1)
if obj != {"rank": N - 1, "list": [N - 1] * 3}:
    c.fail(f"broadcast_object: {obj}")
if hvd.allgather_object((R, "x" * R), name="objs") != [(r, "x" * r) for r in range(N)]:
    c.fail("allgather_object")

# ----------------------------------------------------------------- errors
ones = torch.ones(3)
expect_error("op and average", lambda: hvd.allreduce(ones, average=True, op=hvd.Sum), ValueError, "average")
expect_error("bad op", lambda: hvd.allreduce(ones, op=17), ValueError, "op")
expect_error("complex", lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)), TypeError, "complex64")
expect_error("complex broadcast", lambda: hvd.broadcast(torch.ones(2, dtype=torch.complex128), 0), TypeError, "complex128")
expect_error("root too large", lambda: hvd.broadcast(ones, N), ValueError, "root_rank")
expect_error("root negative", lambda: hvd.broadcast_(ones, -1), ValueError, "root_rank")
expect_error("0-d allgather", lambda: hvd.allgather(torch.tensor(1.0)), ValueError, "0-d")
expect_error("alltoall uneven", lambda: hvd.alltoall(torch.ones(N + 1, 2)) if N > 1 else hvd.alltoall(torch.ones(2), [3]),
             ValueError)
expect_error("process set", lambda: hvd.allreduce(ones, process_set=object()), TypeError, "process_set")
expect_error("name type", lambda: hvd.allreduce(ones, name=3), TypeError, "name")
if N > 1:  # what only the ranks together see: FastringError on every rank, tensors untouched
    t = torch.ones(3 + R)
    expect_error("shape mismatch", lambda: hvd.allreduce_(t, name="bad_shape"), hvd.FastringError, "shape")
    same("untouched after mismatch", t, torch.ones(3 + R))
    bad = torch.ones(3, dtype=torch.float32 if R == 0 else torch.float64)
    expect_error("dtype mismatch", lambda: hvd.allreduce(bad, name="bad_dtype"), hvd.FastringError, "dtype")
    expect_error("allgather trailing mismatch", lambda: hvd.allgather(torch.ones(2, 2 + R), name="bad_ag"),
                 hvd.FastringError)
    expect_error("broadcast root mismatch", lambda: hvd.broadcast(ones, R, name="bad_root"), hvd.FastringError,
                 "root")
    expect_error("async shape mismatch", lambda: hvd.synchronize(hvd.allreduce_async(t, name="bad_async")),
                 hvd.FastringError, "shape")
    same("the next collective works", hvd.allreduce(ones, op=hvd.Sum), torch.full((3,), float(N)))

# ----------------------------------------------------------------- join
# Every rank but the last joins at once; the last one's allreduces take zeros from the others
# (Average still divides by the full size); join returns the last rank to join.
if R == N - 1:
    x = torch.arange(6, dtype=torch.float64) + 1
    same("allreduce with joined ranks (Sum)", hvd.allreduce(x, op=hvd.Sum, name="joined.sum"), x)
    same("allreduce with joined ranks (Average)", hvd.allreduce(x, name="joined.avg"), x / N)
    same("grouped allreduce with joined ranks",
         hvd.grouped_allreduce([x, x[:2]], op=hvd.Sum, name="joined.grouped")[1], x[:2])
last = hvd.join()
if last != N - 1:
    c.fail(f"join returned {last}, expected {N - 1}")
same("allreduce after join", hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(N)))
c.done("fastring.torch collectives")
