"""allgather, broadcast, alltoall, reducescatter, barrier and the object collectives on N ranks:
every dtype x shapes (uneven, zero-size, large enough to segment), sync and async, numpy or
torch tensors, and (numpy run, N >= 2) every cross-rank mismatch and local error that needs a
second rank.
usage: collectives.py numpy|torch"""
import logging
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

import _common as c
import fastring
from fastring._core.runtime import runtime
from fastring.api import collectives as api_collectives
from fastring._transport.testing import set_pid

framework = sys.argv[1]
N, R = c.SIZE, c.RANK
to_fw, from_fw = c.converters(framework)

OPS = [fastring.Sum, fastring.Average, fastring.Min, fastring.Max, fastring.Product]
fastring.init()


def exact(name, got, expected, dt, shape=None, fw=True):
    """Same dtype, shape and bytes (a bitwise check: data movement must not alter values).
    `got` is the framework's tensor, or with fw=False a numpy array already."""
    got = from_fw(got) if fw else got
    shape = expected.shape if shape is None else shape
    if got.dtype != dt or got.shape != shape:
        c.fail(f"{name}: result {got.dtype}{got.shape}, expected {dt}{shape}")
    if got.tobytes() != np.ascontiguousarray(expected).tobytes():
        c.check_close(name, got, expected, 0)  # names the first wrong elements
        c.fail(f"{name}: bytes differ from the expected ones")


def expect_error(name, call, error, *words):
    try:
        call()
    except error as e:
        for w in words:
            if w not in str(e):
                c.fail(f"{name}: {error.__name__} does not mention {w!r}: {e}")
        return
    except Exception as e:  # noqa: BLE001
        c.fail(f"{name}: expected {error.__name__}, got {type(e).__name__}: {e}")
    c.fail(f"{name}: no {error.__name__}")


def rows_of(dt, r, seed, rows, trailing=()):
    return c.rank_input(dt, (rows,) + tuple(trailing), r, seed)


# --------------------------------------------------------------------------- allgather
def allgather_case(dt, trailing, rows_fn, seed, tag):
    inputs = [rows_of(dt, r, seed, rows_fn(r), trailing) for r in range(N)]
    expected = np.concatenate(inputs)
    t = to_fw(inputs[R])
    got = fastring.allgather(t)
    exact(f"allgather {tag}", got, expected, dt)
    c.check_identical(f"allgather {tag}", from_fw(got))
    exact(f"allgather {tag} input untouched", t, inputs[R], dt)


for dt in c.DTYPES:
    for trailing in [(), (3,), (2, 0)]:
        allgather_case(dt, trailing, lambda r: (r + 1) % 3, 11, f"{dt} {trailing} uneven")
        allgather_case(dt, trailing, lambda r: 0, 12, f"{dt} {trailing} all empty")
allgather_case(np.dtype(np.float32), (7,), lambda r: 50000 + 3 * r, 13, "large")
# a strided input
src = [rows_of(np.dtype(np.int32), r, 14, 6, (4,)) for r in range(N)]
got = fastring.allgather(to_fw(src[R])[::2, 1:3])
exact("allgather strided", got, np.concatenate([s[::2, 1:3] for s in src]), np.dtype(np.int32))

# --------------------------------------------------------------------------- broadcast
for dt in c.DTYPES:
    for shape in [(), (0,), (5,), (7, 3)]:
        for root in range(N):
            inputs = [np.asarray(c.rank_input(dt, shape, r, 21 + root)) for r in range(N)]
            t = to_fw(inputs[R])
            got = fastring.broadcast(t, root)
            tag = f"broadcast {dt} {shape} root {root}"
            exact(tag, got, inputs[root], dt)
            exact(tag + " input untouched", t, inputs[R], dt)
# Up to SHM_STREAM_BROADCAST_MAX_BYTES streamed through the shared segment (12 MB: three
# times round the root's ring), then with it off (FASTRING_SHM=0) copied straight between the ranks (this host
# allows it), then as messages: past the chain threshold (segments, partial last) and below it.
if runtime().shm is None and N > 1:
    c.fail("the shared-memory path is off")
for n_elem in (3_000_003, 200_003, 10):
    tag = f"broadcast {n_elem} through the segment"
    inputs = [c.rank_input(np.dtype(np.float32), n_elem, r, 20) for r in range(N)]
    exact(tag, fastring.broadcast(to_fw(inputs[R]), root_rank=N - 1), inputs[N - 1], np.dtype(np.float32))
os.environ["FASTRING_SHM"] = "0"
fastring.shutdown()
fastring.init()
transport = runtime().transport
for single_copy in (True, False):
    if transport.single_copy != (single_copy and N > 1):
        c.fail(f"single copy is {transport.single_copy}, expected {single_copy and N > 1}")
    for n_elem in (300_003, 40_000, 10):
        for root in {0, N - 1}:
            tag = f"broadcast {n_elem} root {root} single copy {single_copy}"
            inputs = [c.rank_input(np.dtype(np.float32), n_elem, r, 22) for r in range(N)]
            got = fastring.broadcast(to_fw(inputs[R]), root_rank=root)
            exact(tag, got, inputs[root], np.dtype(np.float32))
            c.check_identical(tag, from_fw(got))
    transport.disable_single_copy()
if transport.enable_single_copy():
    # A single copy that fails mid-way (the root's process id made wrong on the last rank):
    # the result is still right, every rank logs why and sends broadcasts as messages after.
    failures = []
    catcher = logging.Handler()
    catcher.emit = failures.append
    logging.getLogger("fastring").addHandler(catcher)
    if R == N - 1:
        set_pid(transport, 0, c.pid_of_no_process())
    inputs = [c.rank_input(np.dtype(np.float32), 300_003, r, 24) for r in range(N)]
    exact("broadcast after a failed copy", fastring.broadcast(to_fw(inputs[R]), 0), inputs[0],
          np.dtype(np.float32))
    logging.getLogger("fastring").removeHandler(catcher)
    said = [f.getMessage() for f in failures]
    if transport.single_copy or not any("No such process" in m for m in said):
        c.fail(f"failed single copy: still on {transport.single_copy}, logged {said}")
    transport.enable_single_copy()
os.environ["FASTRING_SHM"] = "1"
fastring.shutdown()
fastring.init()
for dt in (np.dtype(np.float64), c.BF16, np.dtype(np.bool_)):
    inputs = [c.rank_input(dt, (4, 6), r, 23) for r in range(N)]
    root = N - 1
    t = to_fw(inputs[R])
    res = fastring.broadcast(t, root, out=t)
    if res is not t:
        c.fail(f"broadcast {dt} out=t returned another object")
    exact(f"broadcast {dt} in place", t, inputs[root], dt)
    o = to_fw(np.zeros((4, 6), dt))
    fastring.broadcast(to_fw(inputs[R]), root, out=o)
    exact(f"broadcast {dt} out=other", o, inputs[root], dt)
    big = to_fw(np.zeros((4, 12), dt))
    fastring.broadcast(to_fw(inputs[R]), root, out=big[:, ::2])
    exact(f"broadcast {dt} strided out", from_fw(big)[:, ::2], inputs[root], dt, fw=False)
    exact(f"broadcast {dt} strided gaps", from_fw(big)[:, 1::2], np.zeros((4, 6), dt), dt, fw=False)
    strided_in = to_fw(np.repeat(inputs[R], 2, axis=1))[:, ::2]
    exact(f"broadcast {dt} strided in", fastring.broadcast(strided_in, root), inputs[root], dt)


# --------------------------------------------------------------------------- alltoall
def split_matrix(seed):
    """splits[r][q]: rows rank r sends rank q (some zero); extra[r]: rows left unsent."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 4, (N, N)), rng.integers(0, 3, N)


def alltoall_expected(inputs, splits):
    parts = []
    for r in range(N):
        start = int(splits[r][:R].sum())
        parts.append(inputs[r][start:start + splits[r][R]])
    return np.concatenate(parts)


def alltoall_case(dt, trailing, seed, tag, make_splits):
    splits, extra = split_matrix(seed)
    inputs = [rows_of(dt, r, seed, int(splits[r].sum() + extra[r]), trailing) for r in range(N)]
    t = to_fw(inputs[R])
    got, received = fastring.alltoall(t, splits=make_splits(splits[R]))
    exact(f"alltoall {tag}", got, alltoall_expected(inputs, splits), dt)
    exact(f"alltoall {tag} received_splits", received, splits[:, R].astype(np.int32), np.dtype(np.int32))
    exact(f"alltoall {tag} input untouched", t, inputs[R], dt)


SPLIT_FORMS = {"numpy int32": lambda s: s.astype(np.int32), "list": lambda s: [int(x) for x in s],
               "framework int32": lambda s: to_fw(s.astype(np.int32))}
for dt in c.DTYPES:
    for trailing in [(), (2,), (0,)]:
        for form, make in SPLIT_FORMS.items():
            alltoall_case(dt, trailing, 31 + len(form), f"{dt} {trailing} splits as {form}", make)
    # equal split of dim 0 (the tensor alone comes back)
    inputs = [rows_of(dt, r, 32, 2 * N, (3,)) for r in range(N)]
    got = fastring.alltoall(to_fw(inputs[R]))
    exact(f"alltoall {dt} equal split", got, np.concatenate([x[2 * R:2 * R + 2] for x in inputs]), dt)
    empty = [rows_of(dt, r, 33, 0, (3,)) for r in range(N)]
    exact(f"alltoall {dt} empty", fastring.alltoall(to_fw(empty[R])), np.zeros((0, 3), dt), dt)
big_splits = np.full((N, N), 40_000) + np.arange(N)[:, None]
inputs = [rows_of(np.dtype(np.float32), r, 34, int(big_splits[r].sum()), (5,)) for r in range(N)]
got, _ = fastring.alltoall(to_fw(inputs[R]), splits=big_splits[R].astype(np.int32))
exact("alltoall large", got, alltoall_expected(inputs, big_splits), np.dtype(np.float32))
strided = [np.repeat(rows_of(np.dtype(np.int64), r, 35, 2 * N, (3,)), 2, axis=1) for r in range(N)]
got = fastring.alltoall(to_fw(strided[R])[:, ::2])
exact("alltoall strided", got, np.concatenate([x[2 * R:2 * R + 2, ::2] for x in strided]), np.dtype(np.int64))


# --------------------------------------------------------------------------- reducescatter
def my_rows(d0):
    base, extra = divmod(d0, N)
    start = R * base + min(R, extra)
    return start, start + base + (R < extra)


def reducescatter_case(dt, op, shape, seed, tag, **scales):
    inputs = [c.rank_input(dt, shape, r, seed) for r in range(N)]
    expected, bound = c.reference(inputs, op, N)
    pre, post = scales.get("prescale_factor", 1.0), scales.get("postscale_factor", 1.0)
    if pre != 1.0 or post != 1.0:
        expected, bound = expected * pre * post, bound * abs(pre * post) + 1e-12
    lo, hi = my_rows(shape[0])
    expected = np.asarray(expected)[lo:hi]
    bound = bound if np.isscalar(bound) else bound[lo:hi]
    t = to_fw(inputs[R])
    got = from_fw(fastring.reducescatter(t, op=op, **scales))
    if got.dtype != dt or got.shape != (hi - lo,) + shape[1:]:
        c.fail(f"reducescatter {tag}: result {got.dtype}{got.shape}, expected {(hi - lo,) + shape[1:]}")
    c.check_close(f"reducescatter {tag}", got, expected, bound)
    exact(f"reducescatter {tag} input untouched", t, inputs[R], dt)


for dt in c.DTYPES:
    for op in OPS:
        if dt == np.bool_ and op == fastring.Average:
            continue
        for shape in [(0, 3), (1,), (N + 1, 2), (2 * N + 3, 3), (N, 0)]:
            reducescatter_case(dt, op, shape, 41 + int(op), f"{dt} {op.name} {shape}")
reducescatter_case(np.dtype(np.float32), fastring.Sum, (300_001,), 42, "large")
reducescatter_case(np.dtype(np.float32), fastring.Average, (300_001,), 42, "large average")
reducescatter_case(c.BF16, fastring.Average, (70_001, 2), 43, "large bf16 average")
reducescatter_case(np.dtype(np.float64), fastring.Sum, (5 * N + 1, 3), 44, "scaled",
                   prescale_factor=0.5, postscale_factor=3.0)
reducescatter_case(np.dtype(np.int64), fastring.Sum, (5 * N + 1,), 45, "int postscale", postscale_factor=2.0)
reducescatter_case(np.dtype(np.float16), fastring.Average, (3 * N + 2, 2), 46, "fp16 average prescaled",
                   prescale_factor=2.0)
# Average of float16 near its maximum divides before summing, so it stays finite
near_max = np.full((2 * N,), 60000, np.float16)
got = from_fw(fastring.reducescatter(to_fw(near_max), op=fastring.Average))
if not np.all(got == np.float16(60000)):
    c.fail(f"reducescatter fp16 average near max: {got}")
strided_rs = np.repeat(np.arange(4 * N, dtype=np.float32).reshape(2 * N, 2) + R, 2, axis=1)
got = fastring.reducescatter(to_fw(strided_rs)[:, ::2], op=fastring.Sum)
full = sum(np.arange(4 * N, dtype=np.float32).reshape(2 * N, 2) + r for r in range(N))
exact("reducescatter strided", got, full[2 * R:2 * R + 2], np.dtype(np.float32))

# --------------------------------------------------------------------------- riding the cycle
# A lean broadcast or reducescatter this small, and an allgather whose every rank's rows fit
# in its share of the cycle's room, carry their data in the negotiation cycle: the functions
# that would move the bytes (watched) do not run. One larger, an allgather with one rank's rows
# beyond its share, or a reducescatter that must scale first, takes the data phase; every
# result is exact either way (a broadcast's bits included: -0.0, a NaN's payload, odd sizes).
if N > 1:
    from fastring._core.config import CYCLE_COLLECTIVE_MAX_BYTES, CYCLE_GATHER_BYTES
    from fastring.algorithms import collectives as algo_collectives
    watched = {"broadcast_bytes": [], "reduce_scatter_rows": [], "allgather_concat": []}
    real = {k: getattr(api_collectives, k) for k in watched}

    def watcher(k):
        return lambda *a, **kw: watched[k].append(1) or real[k](*a, **kw)
    hooks = {k: watcher(k) for k in watched}
    for k, hook in hooks.items():
        setattr(api_collectives, k, hook)
    algo_collectives.allgather_concat = hooks["allgather_concat"]

    def moved(tag, call, kind, expected_calls):
        for calls in watched.values():
            calls.clear()
        got = call()
        if len(watched[kind]) != expected_calls:
            c.fail(f"{tag}: {kind} ran {len(watched[kind])} times, expected {expected_calls}")
        return got
    try:
        special = np.array([-0.0, np.nan, np.inf, -np.inf, 1e-45, 3.5], np.float32)
        special.view(np.uint32)[1] = 0x7FC12345  # a NaN with a payload
        cases = {"special float32": special, "5 bytes": np.arange(5, dtype=np.uint8) + 250,
                 "3 float16": np.array([-0.0, 65504, np.nan], np.float16),
                 "the cycle's limit": np.arange(CYCLE_COLLECTIVE_MAX_BYTES, dtype=np.uint8)}
        for tag, value in cases.items():
            mine = value if R == N - 1 else np.zeros_like(value)
            got = moved(f"broadcast {tag}", lambda: fastring.broadcast(mine, N - 1, name=f"ride {tag}"),
                        "broadcast_bytes", 0)
            exact(f"broadcast riding the cycle: {tag}", got, value, value.dtype, fw=False)
        over = np.arange(CYCLE_COLLECTIVE_MAX_BYTES + 8, dtype=np.uint8) + R
        exact("broadcast past the cycle's limit", moved("broadcast past the limit", lambda: fastring.broadcast(
            over, 0, name="ride over"), "broadcast_bytes", 1), over - R, over.dtype, fw=False)

        rows = np.arange(6 * N, dtype=np.float32).reshape(2 * N, 3) + R
        total = sum(np.arange(6 * N, dtype=np.float32).reshape(2 * N, 3) + r for r in range(N))
        for tag, scales, expected_calls, expected in (
                ("sum", {}, 0, total), ("postscale", {"postscale_factor": 3.0}, 0, total * 3),
                ("prescale", {"prescale_factor": 2.0}, 1, total * 2)):
            got = moved(f"reducescatter {tag}", lambda: fastring.reducescatter(
                rows, op=fastring.Sum, name=f"ride rs {tag}", **scales), "reduce_scatter_rows", expected_calls)
            exact(f"reducescatter riding the cycle: {tag}", got, expected[2 * R:2 * R + 2], np.dtype(np.float32),
                  fw=False)
        ints = np.full(N, 2 * R + 1, np.int32)  # an integer Average: quotients and remainders
        exact("reducescatter int average", moved("reducescatter int average", lambda: fastring.reducescatter(
            ints, op=fastring.Average, name="ride rs int"), "reduce_scatter_rows", 1), np.full(1, N, np.int32),
            np.dtype(np.int32), fw=False)
        over = np.ones(CYCLE_COLLECTIVE_MAX_BYTES // 4 + N, np.float32)
        moved("reducescatter past the limit", lambda: fastring.reducescatter(over, op=fastring.Sum, name="ride rs over"),
              "reduce_scatter_rows", 1)

        share_rows = CYCLE_GATHER_BYTES // N // 8  # int64 rows that fit in one rank's share
        for tag, rows_of_rank, expected_calls in (
                ("every rank's rows fit", lambda r: share_rows - r % 2, 0),
                ("the last rank's rows do not fit", lambda r: share_rows + (r == N - 1), 1),
                ("none fit", lambda r: share_rows + 1, 1)):
            parts = [np.arange(rows_of_rank(r), dtype=np.int64) * N + r for r in range(N)]
            got = moved(f"allgather {tag}", lambda: fastring.allgather(parts[R], name=f"ride ag {tag}"),
                        "allgather_concat", expected_calls)
            exact(f"allgather riding the cycle: {tag}", got, np.concatenate(parts), np.dtype(np.int64), fw=False)
    finally:
        for k in watched:
            setattr(api_collectives, k, real[k])
        algo_collectives.allgather_concat = real["allgather_concat"]

# --------------------------------------------------------------------------- async, all at once
pending = []
for k in range(3):
    x = rows_of(np.dtype(np.float32), R, 50 + k, R + k + 1, (2,))
    pending.append(("ag", k, fastring.allgather_async(to_fw(x), name=f"ag{k}")))
    pending.append(("bc", k, fastring.broadcast_async(to_fw(np.full(5, R + k, np.int32)), k % N, name=f"bc{k}")))
    splits = np.full(N, k, np.int32)
    pending.append(("a2a", k, fastring.alltoall_async(to_fw(np.full((N * k + 1, 2), R, np.int64)), splits)))
    pending.append(("rs", k, fastring.reducescatter_async(to_fw(np.full((N, 3), R + k, np.float64)),
                                                         op=fastring.Sum, name=f"rs{k}")))
    pending.append(("ar", k, fastring.allreduce_async(to_fw(np.full(4, k, np.int32)), op=fastring.Sum)))
for kind, k, h in reversed(pending):
    res = fastring.synchronize(h)
    if kind == "ag":
        expected = np.concatenate([rows_of(np.dtype(np.float32), r, 50 + k, r + k + 1, (2,)) for r in range(N)])
        exact(f"async allgather {k}", res, expected, np.dtype(np.float32))
    elif kind == "bc":
        exact(f"async broadcast {k}", res, np.full(5, k % N + k, np.int32), np.dtype(np.int32))
    elif kind == "a2a":
        out, received = res
        exact(f"async alltoall {k}", out, np.repeat(np.arange(N, dtype=np.int64), k)[:, None].repeat(2, 1),
              np.dtype(np.int64))
        exact(f"async alltoall {k} splits", received, np.full(N, k, np.int32), np.dtype(np.int32))
    elif kind == "rs":
        exact(f"async reducescatter {k}", res, np.full((1, 3), N * k + N * (N - 1) / 2), np.dtype(np.float64))
    else:
        exact(f"async allreduce beside them {k}", res, np.full(4, N * k, np.int32), np.dtype(np.int32))
    if not fastring.poll(h):
        c.fail(f"poll false after synchronize ({kind} {k})")

# --------------------------------------------------------------------------- barrier
# The last rank writes a file only after a pause; nobody may pass the barrier before it.
markers = c.COMM.bcast(tempfile.mkdtemp() if R == 0 else None)
marker = os.path.join(markers, "reached")
for k in range(2):
    if R == N - 1:
        time.sleep(0.2)
        open(f"{marker}{k}", "w").close()
    fastring.barrier()
    if not os.path.exists(f"{marker}{k}"):
        c.fail(f"barrier {k} returned before rank {N - 1} reached it")
c.COMM.Barrier()  # every rank has looked: the markers can go
if R == 0:
    shutil.rmtree(markers)

# A synchronous call whose result is None (a barrier, an object that is None) runs once, on the
# lean path and where the ranks' cycles disagree: rank 0 reaches the barrier with a broadcast
# still queued, so the others' lean cycles fail and their barrier waits as a request.
moved = []
real_broadcast_bytes = api_collectives.broadcast_bytes
api_collectives.broadcast_bytes = lambda *a: moved.append(a[1].nbytes) or real_broadcast_bytes(*a)
try:
    for how in ("lean", "queued"):
        moved.clear()
        early = (fastring.broadcast_async(np.full(3, R), 0, name=f"queued bc {how}")
                 if how == "queued" and R == 0 else None)
        mine = np.full(4, R, np.int32)  # in place, small enough to ride a lean cycle
        fastring.broadcast(mine, N - 1, name=f"in place {how}", out=mine)
        exact(f"small broadcast in place ({how})", mine, np.full(4, N - 1, np.int32), np.dtype(np.int32), fw=False)
        if fastring.broadcast_object(None) is not None:
            c.fail(f"broadcast_object of None ({how})")
        fastring.barrier()
        later = None if how == "lean" else (
            early or fastring.broadcast_async(np.full(3, R), 0, name=f"queued bc {how}"))
        if later is not None:
            exact(f"broadcast queued before a barrier {how}", later.wait(), np.zeros(3, np.int64), np.dtype(np.int64),
                  fw=False)
        # lean on more than one rank, the small broadcast and broadcast_object(None) ride their
        # cycles whole (no broadcast); otherwise the broadcast moves its 16 bytes, and
        # broadcast_object its 8-byte header and then its bytes, once each; the queued
        # broadcast moves 24 bytes
        queued = how == "queued"
        rides = N > 1 and not queued
        if (moved != [] if rides else moved.count(8) != 1 or moved.count(16) != 1 or len(moved) != 3 + queued
                or moved.count(24) != queued):
            c.fail(f"broadcasts of broadcast_object(None) and a barrier ({how}): {moved}")
    # an in place numpy broadcast too large to ride its cycle takes a lean path of its own
    # (api.collectives._lean_broadcast), which builds no general parts: its bytes move once,
    # lean or, where rank 0 has a broadcast queued, as a request (rank 0's general path, the
    # others' after their lean cycles fail), unnamed, so that the automatic names of a lean
    # rank and a general one must pair
    parts_built = []
    real_parts = {k: getattr(api_collectives, k) for k in ("_broadcast_parts", "_reducescatter_parts")}
    for k, real_part in real_parts.items():
        setattr(api_collectives, k, lambda *a, _k=k, _real=real_part: parts_built.append((_k, a[0].nbytes)) or _real(*a))
    for how in ("lean", "queued"):
        moved.clear()
        parts_built.clear()
        early = (fastring.broadcast_async(np.full(3, R), 0, name=f"queued before big {how}")
                 if how == "queued" and R == 0 else None)
        mine = np.arange(8192, dtype=np.int32) * (R + 1)  # 32 KiB
        if fastring.broadcast(mine, N - 1, out=mine) is not mine:
            c.fail(f"large broadcast in place ({how}) returned another object")
        exact(f"large broadcast in place ({how})", mine, np.arange(8192, dtype=np.int32) * N, np.dtype(np.int32),
              fw=False)
        later = None if how == "lean" else (
            early or fastring.broadcast_async(np.full(3, R), 0, name=f"queued before big {how}"))
        if later is not None:
            exact(f"broadcast queued before a large one ({how})", later.wait(), np.zeros(3, np.int64),
                  np.dtype(np.int64), fw=False)
        if moved.count(mine.nbytes) != 1 or len(moved) != 1 + (how == "queued"):
            c.fail(f"large broadcast in place ({how}): {moved}")
        # and a reducescatter without scale factors, too large to ride (_lean_reducescatter)
        early = (fastring.broadcast_async(np.full(3, R), 0, name=f"queued before rs {how}")
                 if how == "queued" and R == 0 else None)
        rows = np.arange(8192 * N, dtype=np.int64).reshape(N, 8192) * (R + 1)  # 64 KiB a rank
        exact(f"large reducescatter ({how})", fastring.reducescatter(rows, op=fastring.Sum),
              np.arange(8192 * R, 8192 * (R + 1), dtype=np.int64).reshape(1, 8192) * (N * (N + 1) // 2),
              np.dtype(np.int64), fw=False)
        exact(f"large reducescatter input untouched ({how})", rows,
              np.arange(8192 * N, dtype=np.int64).reshape(N, 8192) * (R + 1), np.dtype(np.int64), fw=False)
        later = None if how == "lean" else (
            early or fastring.broadcast_async(np.full(3, R), 0, name=f"queued before rs {how}"))
        if later is not None:
            exact(f"broadcast queued before a large reducescatter ({how})", later.wait(), np.zeros(3, np.int64),
                  np.dtype(np.int64), fw=False)
        big = [k for k, nbytes in parts_built if nbytes in (mine.nbytes, rows.nbytes)]  # not the 24-byte ones
        if big != ([] if how == "lean" else ["_broadcast_parts", "_reducescatter_parts"]):
            c.fail(f"large broadcast and reducescatter ({how}) built general parts: {parts_built}")
finally:
    api_collectives.broadcast_bytes = real_broadcast_bytes
    for k, real_part in real_parts.items():
        setattr(api_collectives, k, real_part)

# --------------------------------------------------------------------------- objects
for root in range(N):
    obj = {"root": R, "f": (lambda x, r=R: x + r), "blob": bytes(range(256)) * 2000} if R == root else None
    got = fastring.broadcast_object(obj, root_rank=root)
    if got["root"] != root or got["f"](1) != root + 1 or got["blob"] != bytes(range(256)) * 2000:
        c.fail(f"broadcast_object root {root}: {got['root']}")
if fastring.broadcast_object([R, "x"] if R == 0 else None) != [0, "x"]:
    c.fail("broadcast_object default root")
objs = [{"rank": r, "payload": list(range(r * 10))} for r in range(N)]
if fastring.allgather_object(objs[R]) != objs:
    c.fail("allgather_object")
if fastring.allgather_object(None) != [None] * N:
    c.fail("allgather_object of None")
big = fastring.allgather_object(b"z" * (100_000 * (R + 1)))
if [len(b) for b in big] != [100_000 * (r + 1) for r in range(N)]:
    c.fail("allgather_object large")
# objects that cannot be pickled: FastringError on every rank, then things work
expect_error("broadcast_object unpicklable", lambda: fastring.broadcast_object(
    threading.Lock() if R == N - 1 else None, root_rank=N - 1), fastring.FastringError,
    f"rank {N - 1}", "pickle")
expect_error("allgather_object unpicklable", lambda: fastring.allgather_object(
    threading.Lock() if R == 0 else R), fastring.FastringError, "rank 0", "lock")
if fastring.allgather_object(R) != list(range(N)):
    c.fail("allgather_object after an unpicklable object")

# --------------------------------------------------------------------------- errors needing N >= 2
if framework == "numpy" and N > 1:
    f32 = np.float32

    def mismatch(field, call, *words):
        expect_error(f"mismatch {field}", call, fastring.FastringError, *words, "rank")
        c.check_close(f"after mismatch {field}", fastring.allgather(np.ones(1)), np.ones(N), 0)

    mismatch("allgather dtype", lambda: fastring.allgather(np.zeros(2, f32 if R else np.float64), name="m1"), "dtype")
    mismatch("allgather trailing", lambda: fastring.allgather(np.zeros((2, 3 + (R == 1)), f32), name="m2"),
             "trailing_shape")
    # a rank whose tensor differs only in dimension 0 is fine
    exact("allgather dim 0 differs", fastring.allgather(np.full((R, 2), R, f32), name="m3"),
          np.concatenate([np.full((r, 2), r, f32) for r in range(N)]), np.dtype(f32))
    t = np.arange(4, dtype=f32) + R
    out = np.full(4, -1, f32)
    mismatch("broadcast root", lambda: fastring.broadcast(t, R % 2, name="m4", out=out), "root_rank")
    mismatch("broadcast shape", lambda: fastring.broadcast(np.zeros(3 + R, f32), 0, name="m5"), "shape")
    mismatch("broadcast dtype", lambda: fastring.broadcast(t.astype(f32 if R else np.int32), 0, name="m6",
                                                           out=t if R else None), "dtype")
    exact("broadcast mismatch leaves tensor", t, np.arange(4, dtype=f32) + R, np.dtype(f32))
    exact("broadcast mismatch leaves out", out, np.full(4, -1, f32), np.dtype(f32))
    large = np.arange(8192, dtype=f32) + R  # in place, too large to ride the cycle: _lean_broadcast
    mismatch("large broadcast root", lambda: fastring.broadcast(large, R % 2, name="m4 large", out=large), "root_rank")
    mismatch("large broadcast dtype", lambda: fastring.broadcast(large if R else large.view(np.int32), 0,
                                                                 name="m6 large", out=large if R else None), "dtype")
    exact("large broadcast mismatch leaves tensor", large, np.arange(8192, dtype=f32) + R, np.dtype(f32))
    mismatch("large reducescatter op", lambda: fastring.reducescatter(
        large, op=fastring.Sum if R else fastring.Max, name="m10 large"), "op")
    mismatch("large reducescatter shape", lambda: fastring.reducescatter(large[:8192 - R], op=fastring.Sum,
                                                                         name="m9 large"), "shape")
    exact("large reducescatter mismatch leaves tensor", large, np.arange(8192, dtype=f32) + R, np.dtype(f32))
    mismatch("alltoall dtype", lambda: fastring.alltoall(np.zeros(N, np.int32 if R else np.int64), name="m7"),
             "dtype")
    mismatch("alltoall trailing", lambda: fastring.alltoall(np.zeros((N, 1 + R), f32), name="m8"),
             "trailing_shape")
    mismatch("reducescatter shape", lambda: fastring.reducescatter(np.zeros(N + R, f32), name="m9"), "shape")
    mismatch("reducescatter op", lambda: fastring.reducescatter(
        t, op=fastring.Sum if R else fastring.Max, name="m10"), "op")
    mismatch("reducescatter prescale", lambda: fastring.reducescatter(
        t, prescale_factor=1.0 + R, name="m11"), "prescale_factor")
    mismatch("reducescatter postscale", lambda: fastring.reducescatter(
        t, postscale_factor=1.0 + (R == 1), name="m12"), "postscale_factor")
    mismatch("collective kind", lambda: (fastring.allgather(t, name="m13") if R == 0
                                         else fastring.broadcast(t, 0, name="m13")), "collective")
    mismatch("broadcast_object root", lambda: fastring.broadcast_object(R, root_rank=R % 2, name="m14"),
             "root_rank")
    exact("input after mismatches", t, np.arange(4, dtype=f32) + R, np.dtype(f32))
    # the same through a handle, with a good request in flight beside it
    h_ok = fastring.allgather_async(np.ones(2), name="ok")
    h_bad = fastring.reducescatter_async(np.ones(N + R), name="bad")
    exact("good beside bad", h_ok.wait(), np.ones(2 * N), np.dtype(np.float64))
    expect_error("async mismatch", h_bad.wait, fastring.FastringError, "shape")
    # local errors on one rank only, while the others make the same calls correctly: the
    # failed calls still use up their automatic names, so the next unnamed calls pair up
    if R == 0:
        expect_error("alltoall indivisible", lambda: fastring.alltoall(np.zeros(N + 1)), ValueError, "divide")
        expect_error("allgather 0-d", lambda: fastring.allgather(np.array(1.0, f32)), ValueError, "0-d")
        expect_error("broadcast root", lambda: fastring.broadcast(np.zeros(1), N), ValueError, "root_rank")
        expect_error("alltoall splits length", lambda: fastring.alltoall(np.zeros(9), splits=[1] * (N + 1)),
                     ValueError, "one entry per rank")
    else:  # never completed: rank 0 submitted none of them (they fail when rank 0 leaves)
        orphans = [fastring.alltoall_async(np.zeros(N)), fastring.allgather_async(np.ones(1, f32)),
                   fastring.broadcast_async(np.zeros(1), 0), fastring.alltoall_async(np.zeros(N))]
    exact("unnamed after local errors", fastring.allgather(np.full(1, R)), np.arange(N), np.dtype(np.int64))
    exact("unnamed alltoall after local errors", fastring.alltoall(np.full(N, R)), np.arange(N),
          np.dtype(np.int64))
c.done(f"collectives {framework}")
