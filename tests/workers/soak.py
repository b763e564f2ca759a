"""Soak on N ranks: OPS mixed collectives of varying shapes, every result checked against NumPy,
the resident set, threads and open files measured after a warm-up and at the end.

Every rank seeds the same generator per operation index, so every rank draws the same sequence
of operations (kind, dtype, shape, op, root, splits, name, sync or async, ...); each rank's
input is a function of (seed, op index, rank) alone, so every rank rebuilds every other rank's
input and computes the exact expected result with NumPy. Covered: allreduce (Sum, Average, Min,
Max, Product on the nine dtypes where the op is defined; new result, out= a separate array,
out= the input; prescale/postscale on floats; Compression.fp16/bf16; a tenth of tensors not
contiguous, as for allgather and broadcast), grouped_allreduce,
allgather (dimension 0 uneven, sometimes 0 rows), broadcast (root varies, out= sometimes),
alltoall (splits as a list or an int32 array, or none), reducescatter, barrier,
broadcast_object and allgather_object; synchronously, or as bursts of 1-8 asynchronous calls
(with the odd synchronous call in between) waited in an order shuffled differently on every
rank, through `Handle.wait`, `fastring.synchronize` or a `fastring.poll` loop; unnamed, or
named from a small pool of names that are reused with other shapes and dtypes, as training
loops reuse names. Sizes are log-uniform from 1 byte to 4 MiB per rank (median near 2 KiB).

What counts as wrong (all counted and reported together at the end, never only the first):
a value outside its bound (integers and bools exact, Min/Max exact, floats within the bounds
justified in `reduction_expected`), a wrong dtype/shape/type, an input modified when the call
must leave it alone, a result sharing memory with its input, a kept small result whose bytes
changed after later collectives (a pool buffer handed out while still referenced), results of
allreduce/grouped_allreduce/broadcast/allgather that are not bitwise identical on every rank
(per-op digests compared through mpi4py at quiescent points), an exception.

Resources, after the warm-up (default: the first 2,000 ops, starting with one op of every
reduction kernel) and at the end: threads (the kernel's count and Python's names) and open
descriptors (with their targets) must be equal; the resident set must not grow by 50 MB or
more past the largest value it had between collectives during the warm-up. Past the peak, not
past the one sample at the warm-up's end: between ops the RSS swings by tens of MB (integer
Average of a 4 MiB tensor takes 200-300 MB for a moment, and malloc keeps or returns such
memory as it likes), so a single sample is no baseline, while a leak or a cache that keeps
growing still passes the peak. The growth from the single sample is reported as well.

Inputs avoid -0.0 and NaN on purpose: Min of +-0 and NaN payloads in small (in-cycle) messages
can differ across ranks, a known bug being fixed elsewhere. Floats are multiples of 2^-10 of
magnitude at most 32 (a grid every dtype holds exactly), so the only error is the library's own
rounding and scaling by the powers of two used as scale factors is exact.

usage: soak.py OPS [--seed S] [--warmup W] [--deadline SECONDS] [--corrupt I,J,...]
               [--corrupt-digest I] [--sabotage rss,fd,thread] [--json PATH] [--trace-rss MIB]
               [--echo]
--corrupt and --corrupt-digest falsify the expected value / rank N-1's digest of those ops,
--sabotage leaks memory (0.5 MiB per op), a file and/or a thread after the warm-up: each must
make the soak fail, which tests/test_soak.py checks. Exit status 0 only when nothing was wrong and the resource
checks held; rank 0 prints the summary and one line `SOAK-RESULT <json>`.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import faulthandler
import gc
import hashlib
import json
import os
import threading
import time
import traceback

import numpy as np

import _common as c
import fastring
from fastring import Compression
from fastring import kernels as _kernels  # noqa: F401  (fastring.kernels.cfuncs below)
from fastring._core import pool as _pool  # diagnostics only: what the pool keeps
from fastring._core import runtime as _runtime  # diagnostics only: the scratch buffer's size
from fastring.kernels import cfuncs as _cfuncs  # diagnostics only: kernels compiled

N, R, COMM = c.SIZE, c.RANK, c.COMM
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fastring.__file__)))  # for short paths
MAX_BYTES = 4 << 20
# An input is a slice of a fixed pool at an offset drawn from (seed, op, rank): much faster
# than drawing megabytes per op, and still a function of (seed, op, rank) alone.
MARGIN = 1 << 16
FLOATS = {np.dtype(np.float16), c.BF16, np.dtype(np.float32), np.dtype(np.float64)}
OPS = (fastring.Sum, fastring.Average, fastring.Min, fastring.Max, fastring.Product)
# Reference arithmetic runs on slices of this many elements, so that the checker's own float64
# temporaries stay at a few MiB and do not blur the RSS measurement of the library.
CHUNK = 1 << 16
# Kept results (<= 64 KiB each) re-hashed at each quiescent point; small so the kept set
# adds at most 2 MiB to the resident set.
KEEP, KEEP_MAX_BYTES = 32, 64 << 10
RSS_LIMIT = 50_000_000  # "RSS growth under 50 MB after warm-up" (past the warm-up's peak)
FIRST_FEW = 8

# Relative rounding of the 16-bit wires and half their smallest subnormal
# (fastring/_core/compression.py: |err| <= N u sum_i |s x_i| + N d).
WIRE_U = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
WIRE_D = {"fp16": 2.0 ** -25, "bf16": 2.0 ** -134}

# kind -> weight; allreduce dominates, as in training
KINDS = {"allreduce": 34, "grouped": 8, "compressed": 7, "allgather": 10, "broadcast": 10,
         "alltoall": 8, "reducescatter": 9, "barrier": 4, "broadcast_object": 5, "allgather_object": 5}
ASYNC_KINDS = {"allreduce", "grouped", "compressed", "allgather", "broadcast", "alltoall", "reducescatter"}


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("ops", type=int)
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--warmup", type=int, default=None, help="default: min(2000, 2 * ops // 3)")
    p.add_argument("--deadline", type=float, default=3600.0,
                   help="seconds before every thread's stack is dumped and the rank exits")
    p.add_argument("--corrupt", default="", help="op indices whose expected value is falsified")
    p.add_argument("--corrupt-digest", type=int, default=-1, help="op whose digest rank N-1 falsifies")
    p.add_argument("--sabotage", default="", help="comma-separated: rss, fd, thread")
    p.add_argument("--json", default=None, help="rank 0 writes the result here too")
    p.add_argument("--echo", action="store_true", help="print each wrong result as it is found")
    p.add_argument("--trace-rss", type=float, default=0.0,
                   help="print the ops after which the RSS rose by more than this many MiB")
    a = p.parse_args()
    a.corrupt = {int(s) for s in a.corrupt.split(",") if s}
    a.sabotage = {s for s in a.sabotage.split(",") if s}
    if a.sabotage - {"rss", "fd", "thread"}:
        p.error(f"unknown --sabotage {a.sabotage}")
    if a.warmup is None:
        a.warmup = min(2000, 2 * a.ops // 3)
    a.warmup = min(a.warmup, a.ops)
    return a


ARGS = parse_args()
SEED = ARGS.seed

# ----------------------------------------------------------------- input pools
_g = np.random.default_rng([SEED, 0xB00])
POOL_K = _g.integers(-128, 129, MAX_BYTES + MARGIN).astype(np.int16)  # the float grid, * 2^-6
POOL_F32 = POOL_K.astype(np.float32) / 64
POOL_SMALL = _g.integers(-5, 6, MAX_BYTES + MARGIN).astype(np.int8)  # sums never wrap
POOL_WIDE = _g.integers(0, 256, MAX_BYTES + 8 * MARGIN).astype(np.uint8)  # any bit pattern
del _g


def make_input(i: int, rank: int, salt: int, dtype: np.dtype, shape: tuple, wide: bool,
               scale: float) -> np.ndarray:
    """Rank `rank`'s input `salt` of op `i`: a fresh array (the library may write into it)."""
    n = int(np.prod(shape, dtype=np.int64))
    off = int(np.random.default_rng([SEED, i, rank, salt, 1]).integers(0, MARGIN))
    if dtype == np.bool_:
        a = POOL_K[off:off + n] > 0
    elif dtype.kind in "iu":
        if wide:  # any value of the dtype: sums and products wrap, Average must not
            a = POOL_WIDE[off * dtype.itemsize:(off + n) * dtype.itemsize].view(dtype).copy()
        elif dtype.kind == "u":
            a = np.abs(POOL_SMALL[off:off + n]).astype(dtype)
        else:
            a = POOL_SMALL[off:off + n].astype(dtype)
    else:
        a = (POOL_F32[off:off + n] * np.float32(scale)).astype(dtype)
    return a.reshape(shape)


# ----------------------------------------------------------------- expected values
def fast_int_mean(stack: np.ndarray) -> np.ndarray:
    """The exact mean over axis 0 truncated toward zero, in the stack's dtype, vectorized.
    Up to 32-bit inputs the int64 sum is exact; int64 inputs are split as x = N q + r with
    0 <= r < N, so sum x = N sum q + sum r, neither of which overflows int64. Checked against
    `_common.exact_int_mean` (Python integers) at start-up."""
    n = stack.shape[0]
    if stack.dtype.itemsize < 8:
        total = stack.sum(axis=0, dtype=np.int64)
        return (np.abs(total) // n * np.sign(total)).astype(stack.dtype)
    q, r = np.floor_divide(stack, n), np.remainder(stack, n)
    rs = r.sum(axis=0)
    floor = q.sum(axis=0) + rs // n
    return (floor + ((rs % n != 0) & (floor < 0))).astype(stack.dtype)


def self_check_int_mean() -> None:
    for dt in (np.uint8, np.int8, np.int32, np.int64):
        info = np.iinfo(dt)
        g = np.random.default_rng([SEED, 77])
        stack = g.integers(info.min, info.max, (N, 4000), dtype=dt, endpoint=True)
        edges = np.array([info.min, info.max, info.min + 1, info.max - 1, 0, 1, -1 if info.min else 2, 3],
                         dtype=np.int64).astype(dt)
        stack = np.concatenate([stack, np.stack([np.roll(edges, k) for k in range(N)]),
                                np.stack([edges] * N)], axis=1)
        want = c.exact_int_mean(stack).astype(dt)
        if not np.array_equal(fast_int_mean(stack), want):
            c.fail(f"the soak's own integer mean is wrong for {np.dtype(dt)}")


def reduction_expected(chunks: list[np.ndarray], op, pre: float, post: float, wire: str | None):
    """(expected, bound) of reducing the N ranks' `chunks` (same slice of every input).

    Bounds: integers and bools exact (Sum/Product wrap as NumPy's do; Average is the exact mean
    truncated toward zero). Floats: `_common.reference` (each of the N-1 partial sums or products
    rounds once, bounded by eps * sum |x|; a 16-bit Average divides each input first, one more
    rounding each; Min/Max exact) on the prescaled inputs, times the postscale; prescale and
    postscale are powers of two here, so scaling adds no error. A 16-bit wire:
    fastring/_core/compression.py's documented N u sum |s x_i| + N d (s = pre/N for Average,
    else pre), times the postscale, plus one rounding into a 16-bit result dtype.
    """
    dt = chunks[0].dtype
    if dt not in FLOATS:
        if op == fastring.Average and dt != np.bool_:
            return fast_int_mean(np.stack(chunks)), 0
        return c.reference(chunks, op, N)[0], 0
    if wire is not None:
        stack = np.stack([x.astype(np.float64) * pre for x in chunks])
        exact = {fastring.Sum: lambda: stack.sum(0), fastring.Average: lambda: stack.sum(0) / N,
                 fastring.Min: lambda: stack.min(0), fastring.Max: lambda: stack.max(0)}[op]() * post
        s = pre / N if op == fastring.Average else pre
        bound = (N * WIRE_U[wire] * np.abs(stack * (s / pre)).sum(0) + N * WIRE_D[wire]) * post
        if dt.itemsize == 2:
            bound = bound + c.EPS[dt] * np.abs(exact)
        return exact, bound
    scaled = [(x.astype(np.float64) * pre).astype(dt) for x in chunks] if pre != 1.0 else chunks
    exact, bound = c.reference(scaled, op, N)
    return exact * post, np.asarray(bound) * post


# ----------------------------------------------------------------- bookkeeping
class Tally:
    """Wrong results of this rank: a count and the first few messages."""

    def __init__(self):
        self.count, self.first = 0, []

    def wrong(self, i: int, what: str, message: str) -> None:
        self.count += 1
        if ARGS.echo:  # as it happens, for a run that may not reach its end (a hang)
            print(f"[soak rank {R}] WRONG op #{i} {what}: {message}", flush=True)
        if len(self.first) < FIRST_FEW:
            self.first.append(f"op #{i} {what}: {message}")


TALLY = Tally()
MIX: collections.Counter = collections.Counter()  # ops run, by kind, sync/async, named/unnamed
DIGESTS: dict[tuple, bytes] = {}  # (op, part) -> digest of a result every rank must hold alike
KEPT: collections.deque = collections.deque(maxlen=KEEP)  # (op, what, result, digest)


def digest(a: np.ndarray) -> bytes:
    return hashlib.blake2b(as_bytes(a), digest_size=8).digest()


def as_bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of `a`'s elements in order, whatever its strides."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def corrupt(i: int, expected: np.ndarray, bound) -> np.ndarray:
    """`expected` falsified in its first element when op `i` is listed in --corrupt."""
    if i not in ARGS.corrupt or expected.size == 0:
        return expected
    e = np.array(expected, copy=True).reshape(-1)
    if e.dtype == np.bool_:
        e[0] = not e[0]
    elif e.dtype.kind in "iu":
        e[0] = e[0] + e.dtype.type(1)
    else:
        e = e.astype(np.float64)
        e[0] = e[0] + 1.0 + 2 * float(np.max(bound))
    return e.reshape(np.shape(expected))


def check_array(i: int, what: str, got, dtype: np.dtype, shape: tuple) -> bool:
    if not isinstance(got, np.ndarray):
        TALLY.wrong(i, what, f"result is a {type(got).__name__}, not a numpy array")
        return False
    if got.dtype != dtype or got.shape != tuple(shape):
        TALLY.wrong(i, what, f"result is {got.dtype}{got.shape}, expected {dtype}{tuple(shape)}")
        return False
    return True


def check_bytes(i: int, what: str, got, expected: np.ndarray) -> None:
    """Bitwise equality (allgather, broadcast, alltoall move bytes; nothing may change them)."""
    if not check_array(i, what, got, expected.dtype, expected.shape):
        return
    expected = corrupt(i, expected, 0)
    g, e = as_bytes(got), as_bytes(expected)
    if not np.array_equal(g, e):
        bad = np.flatnonzero(g != e) // got.dtype.itemsize
        TALLY.wrong(i, what, f"{np.unique(bad).size} of {got.size} elements differ, first at "
                             f"{bad[0]}: got {got.reshape(-1)[bad[0]]!r}, expected {expected.reshape(-1)[bad[0]]!r}")


def check_reduction(i: int, what: str, got, inputs: list[np.ndarray], op, pre=1.0, post=1.0,
                    wire=None) -> None:
    """`got` against the reduction of `inputs` (one per rank), slice by slice."""
    if not check_array(i, what, got, inputs[0].dtype, inputs[0].shape):
        return
    flat = got.reshape(-1)
    ins = [x.reshape(-1) for x in inputs]
    bad_total, first = 0, None
    for s in range(0, max(flat.size, 1), CHUNK):
        g = flat[s:s + CHUNK]
        if g.size == 0:
            break
        exp, bound = reduction_expected([x[s:s + CHUNK] for x in ins], op, pre, post, wire)
        if s == 0:
            exp = corrupt(i, exp, bound)
        if np.isscalar(bound) and bound == 0:
            if g.dtype in FLOATS:
                ok = g.astype(np.float64) == exp
            else:
                ok = g == np.asarray(exp).astype(g.dtype)
        else:
            ok = np.abs(g.astype(np.float64) - exp) <= bound
        if not ok.all():
            bad = np.flatnonzero(~ok)
            bad_total += bad.size
            if first is None:
                k = bad[0]
                b = np.broadcast_to(bound, g.shape)[k]
                first = f"first at {s + k}: got {g[k]!r}, expected {np.asarray(exp).reshape(-1)[k]!r} (bound {b!r})"
    if bad_total:
        TALLY.wrong(i, what, f"{bad_total} of {flat.size} elements wrong, {first}")


def check_untouched(i: int, what: str, x: np.ndarray, original: np.ndarray) -> None:
    if not np.array_equal(as_bytes(x), as_bytes(original)):
        TALLY.wrong(i, what, "the input was modified")


def check_fresh(i: int, what: str, got, x: np.ndarray) -> None:
    if isinstance(got, np.ndarray) and got.size and np.shares_memory(got, x):
        TALLY.wrong(i, what, "the result shares memory with the input")


def identical(i: int, part, got) -> None:
    """Record a result that must be bitwise identical on every rank; keep small ones to check
    later that no later collective writes into them."""
    if isinstance(got, np.ndarray):
        d = digest(got)
        if i == ARGS.corrupt_digest and R == N - 1:
            d = bytes(8)
        DIGESTS[(i, part)] = d
        if got.nbytes <= KEEP_MAX_BYTES:
            KEPT.append((i, part, got, digest(got)))


def check_input_and_result(i: int, what: str, mode: str, x, original: np.ndarray, result) -> None:
    """What every call with an `out=` mode ("new", "inplace" or a separate array) owes once its
    values are checked: the input left alone unless in place, a new result that shares no
    memory with the input, and the same bits on every rank."""
    if mode != "inplace":
        check_untouched(i, what, x, original)
    if mode == "new":
        check_fresh(i, what, result, x)
    identical(i, 0, result)

def exchange_digests() -> None:
    """Compare every recorded digest across ranks (mpi4py, nothing of fastring in flight)."""
    mine = dict(DIGESTS)
    DIGESTS.clear()
    every = COMM.allgather(mine)
    for key in sorted(set().union(*every)):
        values = [d.get(key) for d in every]
        if len(set(values)) != 1:
            TALLY.wrong(key[0], f"identity of part {key[1]}",
                        "results differ across ranks" if None not in values else
                        f"missing on ranks {[r for r, v in enumerate(values) if v is None]}")
    for i, part, got, d in KEPT:
        if digest(got) != d:
            TALLY.wrong(i, f"kept result, part {part}", "changed after later collectives")


# ----------------------------------------------------------------- planning
def log_uniform_bytes(g) -> int:
    return int(min(MAX_BYTES, max(1, np.exp(g.uniform(0, np.log(MAX_BYTES + 1))))))


def shape_of(g, n: int) -> tuple:
    """A shape of about n elements: mostly 1-D, some 2-D/3-D, rarely 0-d (one element)."""
    u = g.random()
    if n == 1 and u < 0.3:
        return ()
    if u < 0.6 or n < 4:
        return (n,)
    k = int(g.choice([2, 3, 5, 8, 16, 64]))
    k = min(k, n)
    if u < 0.9:
        return (n // k, k)
    return (max(1, n // (2 * k)), 2, k)


def pick_dtype(g, floats_only=False) -> np.dtype:
    choices = [d for d in c.DTYPES if d in FLOATS] if floats_only else c.DTYPES
    return choices[int(g.integers(len(choices)))]


def pick_op(g, dt: np.dtype, allow_product=True):
    ops = [o for o in OPS if (allow_product or o != fastring.Product)
           and not (dt == np.bool_ and o == fastring.Average)]
    return ops[int(g.integers(len(ops)))]


def pick_name(g, kind: str, i: int, taken: set) -> str | None:
    """Unnamed half the time; else a pool name, reused by later ops with other shapes, or a
    fresh one if another call in flight holds it."""
    if g.random() < 0.5:
        return None
    name = f"soak.{kind}.{int(g.integers(16))}"
    if name in taken:
        name = f"soak.{kind}.op{i}"
    taken.add(name)
    return name


def sweep() -> list[tuple]:
    """(kind, dtype, op, wire, nbytes) of every reduction kernel the soak can reach, small (in
    the negotiation cycle) and large (the ring): the warm-up starts with them, so that what
    grows after it is not a kernel compiled for the first time (each costs a few MB)."""
    out = []
    for nbytes in (256, 256 << 10):
        for dt in c.DTYPES:
            for op in OPS:
                if dt == np.bool_ and op == fastring.Average:
                    continue
                out.append(("allreduce", dt, op, None, nbytes))
                out.append(("reducescatter", dt, op, None, nbytes))
                if dt in FLOATS and op != fastring.Product:
                    out.extend(("compressed", dt, op, w, nbytes) for w in (Compression.fp16, Compression.bf16))
    return out


SWEEP = sweep()


def plan(i: int, taken: set) -> dict:
    """Op `i`, drawn from a generator seeded by (seed, i) alone: the same on every rank. The
    first ops of the warm-up are the kernel sweep (`sweep`)."""
    g = np.random.default_rng([SEED, i])
    if i < min(len(SWEEP), ARGS.warmup):
        kind, dt, op, wire, nbytes = SWEEP[i]
        n = max(1, nbytes // dt.itemsize)
        p = {"i": i, "kind": kind, "wait": ("wait", "synchronize", "poll")[int(g.integers(3))],
             "name": pick_name(g, kind, i, taken), "dtype": dt, "wide": bool(g.random() < 0.3),
             "scale": 1.0, "n": n, "shape": (n,), "op": op}
        if kind != "reducescatter":
            p.update(out=("new", "separate", "inplace")[int(g.integers(3))], pre=1.0, post=1.0,
                     compression=wire or Compression.none)
        return p
    kinds = list(KINDS)
    w = np.array([KINDS[k] for k in kinds], np.float64)
    p = {"i": i, "kind": kinds[int(g.choice(len(kinds), p=w / w.sum()))],
         "wait": ("wait", "synchronize", "poll")[int(g.integers(3))]}
    kind = p["kind"]
    p["name"] = pick_name(g, kind, i, taken) if kind != "barrier" else None
    # a tenth of the tensors (and out= arrays) of these kinds are not contiguous
    # (drawn from a generator of its own, so that adding it changed no other draw)
    p["strided"] = (kind in ("allreduce", "compressed", "allgather", "broadcast")
                    and bool(np.random.default_rng([SEED, i, 5]).random() < 0.1))
    if kind in ("allreduce", "compressed", "broadcast", "reducescatter", "allgather", "alltoall"):
        dt = pick_dtype(g)
        p["dtype"] = dt
        p["wide"] = bool(g.random() < 0.3)
        p["scale"] = 2.0 ** int(g.integers(-4, 5))
        n = max(1, log_uniform_bytes(g) // dt.itemsize)
        p["n"] = n
    if kind in ("allreduce", "compressed"):
        p["shape"] = shape_of(g, n)
        p["op"] = pick_op(g, dt, allow_product=(kind == "allreduce"))
        if p["op"] == fastring.Product:
            p["scale"] = 1.0  # products of inputs up to 32 would overflow float16
        p["out"] = ("new", "separate", "inplace")[int(g.integers(3))]
        p["pre"], p["post"] = 1.0, 1.0
        if dt in FLOATS and g.random() < 0.15:
            p["pre"], p["post"] = float(g.choice([0.5, 2.0])), float(g.choice([0.5, 2.0]))
        p["compression"] = (Compression.none if kind == "allreduce" else
                            (Compression.fp16, Compression.bf16)[int(g.integers(2))])
    elif kind == "grouped":
        dt = pick_dtype(g)
        k = int(g.integers(1, 6))
        total = log_uniform_bytes(g) // dt.itemsize
        p.update(dtype=dt, wide=bool(g.random() < 0.3), scale=2.0 ** int(g.integers(-4, 5)),
                 shapes=[shape_of(g, max(1, total // k)) for _ in range(k)])
        p["op"] = pick_op(g, dt)
        if p["op"] == fastring.Product:
            p["scale"] = 1.0
        p["compression"] = Compression.none
        if dt in FLOATS and p["op"] != fastring.Product and g.random() < 0.25:
            p["compression"] = (Compression.fp16, Compression.bf16)[int(g.integers(2))]
    elif kind == "allgather":
        k = int(g.choice([1, 1, 1, 3, 16]))
        base = max(1, n // k)
        rows = [0 if g.random() < 0.05 else int(g.integers(max(1, base // 2), base + 1)) for _ in range(N)]
        p.update(trailing=(k,) if k > 1 else (), rows=rows)
    elif kind == "broadcast":
        p.update(shape=shape_of(g, n), root=int(g.integers(N)),
                 out=("new", "separate", "inplace")[int(g.integers(3))])
    elif kind == "alltoall":
        k = int(g.choice([1, 1, 4]))
        base = max(1, n // k)
        p["trailing"] = (k,) if k > 1 else ()
        if g.random() < 0.2:  # no splits: dimension 0 divided equally
            p["splits"] = None
            p["rows"] = [N * max(1, int(g.integers(base // (2 * N) + 1, base // N + 2))) for _ in range(N)]
        else:
            p["splits"], p["rows"] = [], []
            for _ in range(N):
                cuts = np.sort(g.integers(0, base + 1, N))  # N cuts: N-1 splits + extra rows
                sp = np.diff(np.concatenate([[0], cuts])).astype(np.int64)
                p["splits"].append([int(s) for s in sp])
                p["rows"].append(int(sp.sum()) + int(g.integers(0, 3)))  # rows beyond the splits stay
            p["splits_as"] = ("list", "array")[int(g.integers(2))]
    elif kind == "reducescatter":
        k = int(g.choice([1, 1, 2, 7]))
        rows = max(1, n // k)
        p["shape"] = (rows, k) if k > 1 else (rows,)
        p["op"] = pick_op(g, dt)
        if p["op"] == fastring.Product:
            p["scale"] = 1.0
    elif kind in ("broadcast_object", "allgather_object"):
        p["root"] = int(g.integers(N))
        p["blob"] = int(np.exp(g.uniform(0, np.log(64 << 10))))
    return p


def describe(p: dict) -> str:
    parts = [p["kind"]]
    for key in ("op", "dtype", "shape", "shapes", "rows", "splits", "root", "out", "compression", "pre", "post"):
        if key in p and p[key] is not None:
            v = p[key]
            parts.append(f"{key}={getattr(v, 'name', v)}")
    if p.get("wide"):
        parts.append("wide")
    if p.get("strided"):
        parts.append("strided")
    parts.append(f"name={p['name']}")
    return " ".join(map(str, parts))


def obj_of(p: dict, rank: int):
    g = np.random.default_rng([SEED, p["i"], rank, 9])
    off = int(g.integers(0, MARGIN))
    return {"op": p["i"], "rank": rank, "blob": POOL_WIDE[off:off + p["blob"]].tobytes(),
            "values": [int(v) for v in g.integers(-2**40, 2**40, 3)], "text": f"rank {rank} op {p['i']}"}


# ----------------------------------------------------------------- running
def tensor_of(p: dict, a: np.ndarray) -> np.ndarray:
    """A copy of `a` to hand to the library: C-contiguous, or, for ops planned `strided`, a
    view of every other element of the last dimension of a larger buffer (not contiguous)."""
    if not p.get("strided") or a.ndim == 0:
        return a.copy()
    view = np.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)[..., ::2]
    view[...] = a
    return view


def start(p: dict, asynchronous: bool):
    """Issue op `p` on this rank; returns a function that waits for it and checks it."""
    i, kind, what, name = p["i"], p["kind"], describe(p), p["name"]
    if asynchronous:
        what += f" async/{p['wait']}"

    def wait(h):
        if p["wait"] == "poll":
            while not fastring.poll(h):
                time.sleep(0.0002)
            return fastring.synchronize(h)
        return fastring.synchronize(h) if p["wait"] == "synchronize" else h.wait()

    if kind in ("allreduce", "compressed"):
        inputs = [make_input(i, r, 0, p["dtype"], p["shape"], p["wide"], p["scale"]) for r in range(N)]
        x = tensor_of(p, inputs[R])
        out = None if p["out"] == "new" else (x if p["out"] == "inplace" else tensor_of(p, np.zeros_like(inputs[R])))
        kw = dict(op=p["op"], name=name, out=out)
        if p["compression"] is not Compression.none:
            kw["compression"] = p["compression"]
        if p["pre"] != 1.0:
            kw.update(prescale_factor=p["pre"], postscale_factor=p["post"])
        h = fastring.allreduce_async(x, **kw) if asynchronous else None
        got = None if asynchronous else fastring.allreduce(x, **kw)
        wire = p["compression"].wire if p["dtype"] in FLOATS else None

        def finish():
            result = wait(h) if asynchronous else got
            check_reduction(i, what, result, inputs, p["op"], p["pre"], p["post"], wire)
            if out is not None:
                if result is not out:
                    TALLY.wrong(i, what, "out= given, but the result is not out")
                check_reduction(i, what + " (out)", out, inputs, p["op"], p["pre"], p["post"], wire)
            check_input_and_result(i, what, p["out"], x, inputs[R], result)
        return finish

    if kind == "grouped":
        inputs = [[make_input(i, r, j, p["dtype"], s, p["wide"], p["scale"]) for r in range(N)]
                  for j, s in enumerate(p["shapes"])]
        xs = [ins[R].copy() for ins in inputs]
        kw = dict(op=p["op"], name=name)
        if p["compression"] is not Compression.none:
            kw["compression"] = p["compression"]
        h = fastring.grouped_allreduce_async(xs, **kw) if asynchronous else None
        got = None if asynchronous else fastring.grouped_allreduce(xs, **kw)
        wire = p["compression"].wire

        def finish():
            results = wait(h) if asynchronous else got
            if not isinstance(results, list) or len(results) != len(xs):
                TALLY.wrong(i, what, f"result is {type(results).__name__} of {len(results)}, not a list of {len(xs)}")
                return
            for j, (res, ins, x) in enumerate(zip(results, inputs, xs)):
                check_reduction(i, f"{what} [{j}]", res, ins, p["op"], wire=wire)
                check_untouched(i, f"{what} [{j}]", x, ins[R])
                check_fresh(i, f"{what} [{j}]", res, x)
                identical(i, j, res)
        return finish

    if kind == "allgather":
        inputs = [make_input(i, r, 0, p["dtype"], (p["rows"][r],) + p["trailing"], p["wide"], p["scale"])
                  for r in range(N)]
        x = tensor_of(p, inputs[R])
        h = fastring.allgather_async(x, name=name) if asynchronous else None
        got = None if asynchronous else fastring.allgather(x, name=name)

        def finish():
            result = wait(h) if asynchronous else got
            check_bytes(i, what, result, np.concatenate(inputs))
            check_untouched(i, what, x, inputs[R])
            identical(i, 0, result)
        return finish

    if kind == "broadcast":
        inputs = {r: make_input(i, r, 0, p["dtype"], p["shape"], p["wide"], p["scale"]) for r in {R, p["root"]}}
        x = tensor_of(p, inputs[R])
        out = None if p["out"] == "new" else (x if p["out"] == "inplace" else tensor_of(p, np.zeros_like(inputs[R])))
        h = fastring.broadcast_async(x, p["root"], name=name, out=out) if asynchronous else None
        got = None if asynchronous else fastring.broadcast(x, p["root"], name=name, out=out)

        def finish():
            result = wait(h) if asynchronous else got
            check_bytes(i, what, result, inputs[p["root"]])
            if out is not None:
                check_bytes(i, what + " (out)", out, inputs[p["root"]])
            check_input_and_result(i, what, p["out"], x, inputs[R], result)
        return finish

    if kind == "alltoall":
        inputs = [make_input(i, r, 0, p["dtype"], (p["rows"][r],) + p["trailing"], p["wide"], p["scale"])
                  for r in range(N)]
        x = inputs[R].copy()
        if p["splits"] is None:
            splits = None
            sent = [[rows // N] * N for rows in p["rows"]]
        else:
            sent = p["splits"]
            splits = sent[R] if p["splits_as"] == "list" else np.array(sent[R], np.int32)
        h = fastring.alltoall_async(x, splits, name=name) if asynchronous else None
        got = None if asynchronous else fastring.alltoall(x, splits, name=name)
        # what rank R receives: from every rank s, the rows s sends to R
        pieces = [inputs[s][sum(sent[s][:R]):sum(sent[s][:R + 1])] for s in range(N)]
        expected = np.concatenate(pieces)
        received = np.array([sent[s][R] for s in range(N)], np.int32)

        def finish():
            result = wait(h) if asynchronous else got
            if splits is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    TALLY.wrong(i, what, f"result is {type(result).__name__}, not (tensor, received_splits)")
                    return
                result, got_received = result
                check_bytes(i, what + " (received_splits)", got_received, received)
            check_bytes(i, what, result, expected)
            check_untouched(i, what, x, inputs[R])
        return finish

    if kind == "reducescatter":
        inputs = [make_input(i, r, 0, p["dtype"], p["shape"], p["wide"], p["scale"]) for r in range(N)]
        x = inputs[R].copy()
        d0 = p["shape"][0]
        bounds = np.cumsum([0] + [d0 // N + (r < d0 % N) for r in range(N)])
        mine = [a[bounds[R]:bounds[R + 1]] for a in inputs]
        h = fastring.reducescatter_async(x, op=p["op"], name=name) if asynchronous else None
        got = None if asynchronous else fastring.reducescatter(x, op=p["op"], name=name)

        def finish():
            result = wait(h) if asynchronous else got
            check_reduction(i, what, result, mine, p["op"])
            check_untouched(i, what, x, inputs[R])
        return finish

    if kind == "barrier":
        got = fastring.barrier()

        def finish():
            if got is not None:
                TALLY.wrong(i, what, f"barrier returned {got!r}")
        return finish

    if kind == "broadcast_object":
        got = fastring.broadcast_object(obj_of(p, R) if R == p["root"] else None, p["root"], name=name)

        def finish():
            want = obj_of(p, p["root"])
            if i in ARGS.corrupt:
                want["op"] = -1
            if got != want:
                TALLY.wrong(i, what, f"got {str(got)[:80]}, expected {str(want)[:80]}")
        return finish

    if kind == "allgather_object":
        got = fastring.allgather_object(obj_of(p, R), name=name)

        def finish():
            want = [obj_of(p, r) for r in range(N)]
            if i in ARGS.corrupt:
                want[0]["op"] = -1
            if got != want:
                TALLY.wrong(i, what, f"got {str(got)[:80]}, expected {str(want)[:80]}")
        return finish
    raise AssertionError(kind)


def guarded(i: int, what: str, fn):
    """Run fn; an exception is a wrong result (recorded), and the soak goes on."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - every failure is counted and reported at the end
        where = " <- ".join(f"{os.path.relpath(f.filename, _ROOT)}:{f.lineno}"
                            for f in reversed(traceback.extract_tb(e.__traceback__)[-3:]))
        TALLY.wrong(i, what, f"raised {type(e).__name__}: {str(e)[:300]} (at {where})")
        return None


COMPILED_AT: dict[int, set] = {}
RSS_EVERY = 100  # ops between samples of the resident set  # kernels compiled at each call of resources()


try:
    _malloc_trim = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError):  # not glibc: nothing to give back
    _malloc_trim = None


def trim_heap() -> None:
    """Give the heap memory malloc keeps after frees back to the system, so that the resident
    set measures memory in use: glibc keeps freed blocks (here up to 230 MiB of them, varying
    from run to run), which no leak or cache of fastring's accounts for."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def rss_bytes() -> int:
    trim_heap()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


try:
    _mallinfo2 = ctypes.CDLL(None).mallinfo2
    _mallinfo2.restype = _MallInfo2
except (OSError, AttributeError):  # not glibc >= 2.33: the diagnostic is left out
    _mallinfo2 = None


def resources() -> dict:
    """Resident set, threads (the kernel's count and Python's) and open descriptors, the
    measured quantities; and, to say where a growth comes from, diagnostics (internals, read
    only): bytes the result pool keeps, the scratch and fusion buffers (grown, never shrunk),
    the negotiation caches' entries, compiled Numba kernels, malloc's bytes in use and
    free-but-kept (glibc)."""
    gc.collect()
    trim_heap()
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.split()
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir itself had open
            pass
    COMPILED_AT[len(COMPILED_AT)] = set(map(str, _cfuncs._COMPILED))
    diag = {"pool_buffers": _pool.POOL.kept()[0], "pool_mib": round(_pool.POOL.kept()[1] / 2**20, 1),
            "compiled_cfuncs": len(_cfuncs._COMPILED),
            "scratch_mib": round(_runtime.runtime()._scratch.nbytes / 2**20, 1)}
    diag["fusion_mib"] = round(_runtime.runtime().engine._executor._fusion.nbytes / 2**20, 1)
    neg = _runtime.runtime().engine._neg  # negotiation caches: bounded at CACHE_CAPACITY each
    diag.update(cached_names=len(neg.cache), field_digests=len(neg._field_digests), named_hashes=len(neg._hashes))
    if _mallinfo2 is not None:
        m = _mallinfo2()
        diag.update(malloc_in_use_mib=round((m.uordblks + m.hblkhd) / 2**20, 1),
                    malloc_free_kept_mib=round(m.fordblks / 2**20, 1))
    return {"rss": int(status["VmRSS"][0]) * 1024, "threads": int(status["Threads"][0]),
            "py_threads": sorted(t.name for t in threading.enumerate()), "fds": fds, "diag": diag}


def main() -> None:
    faulthandler.dump_traceback_later(ARGS.deadline, exit=True)
    self_check_int_mean()
    fastring.init()
    ops, warmup = ARGS.ops, ARGS.warmup
    t0 = time.perf_counter()
    warm = None
    t_warm = None
    warm_peak = after_peak = 0  # the largest RSS between collectives, in and after the warm-up
    trajectory = []
    leak = []
    last_rss = rss_bytes()
    exchanged_block = 0
    i = 0
    while i < ops:
        g = np.random.default_rng([SEED, i, 0xB5])
        burst = int(g.integers(1, 9)) if g.random() < 0.3 else 0  # 0: one synchronous op
        taken: set = set()
        pending = []
        for j in range(i, min(ops, i + max(burst, 1))):
            p = plan(j, taken)
            # in a burst, most calls are asynchronous; a few synchronous ones run in between
            asynchronous = bool(burst) and p["kind"] in ASYNC_KINDS and g.random() < 0.85
            what = describe(p)
            MIX[p["kind"]] += 1
            MIX["async" if asynchronous else "sync"] += 1
            MIX["named" if p.get("name") else "unnamed"] += 1
            finish = guarded(j, what, lambda: start(p, asynchronous))
            if finish is None:
                continue
            if asynchronous:
                pending.append((j, what, finish))
            else:
                guarded(j, what, finish)
        # wait in an order shuffled differently on every rank
        for k in np.random.default_rng([SEED, i, R, 0xA5]).permutation(len(pending)):
            j, what, finish = pending[int(k)]
            guarded(j, what, finish)
        pending = finish = None  # drop the inputs and results before measuring
        if warm is not None and "rss" in ARGS.sabotage:  # a leak: 0.5 MiB per op, every page written
            leak.extend(np.ones(1 << 19, np.uint8) for _ in range(max(burst, 1)))
        if i // RSS_EVERY != (i + max(burst, 1)) // RSS_EVERY:  # trimming the heap takes a while
            now = rss_bytes()
            if warm is None:
                warm_peak = max(warm_peak, now)
            else:
                after_peak = max(after_peak, now)
        if ARGS.trace_rss:
            now = rss_bytes()
            if now - last_rss > ARGS.trace_rss * 2**20:
                print(f"[soak rank {R}] RSS +{(now - last_rss) / 2**20:.1f} MiB to {now / 2**20:.1f} MiB "
                      f"after ops {i}..{i + max(burst, 1) - 1}: "
                      + "; ".join(describe(plan(j, set())) for j in range(i, min(ops, i + max(burst, 1)))), flush=True)
            last_rss = now
        i = min(ops, i + max(burst, 1))
        # quiescent point: nothing of ours in flight
        # by op index, never by a rank's own state (a count of digests differs when a check
        # raised on one rank only, and then one rank would wait in mpi4py, the other in fastring)
        if i // 256 != exchanged_block or i >= ops:
            exchange_digests()
            exchanged_block = i // 256
        if warm is None and i >= warmup:
            exchange_digests()
            warm, t_warm, i_warm = resources(), time.perf_counter(), i
            warm_call = len(COMPILED_AT) - 1
            warm_peak = max(warm_peak, warm["rss"])
            if "fd" in ARGS.sabotage:
                leak.append(open(os.devnull))
            if "thread" in ARGS.sabotage:
                ev = threading.Event()
                leak.append(ev)
                threading.Thread(target=ev.wait, name="sabotage", daemon=True).start()
        if i % 1000 < max(burst, 1) or i >= ops:
            rss = resources()["rss"]
            trajectory.append((i, round(rss / 2**20, 1)))
            if R == 0 and i % 5000 < max(burst, 1):
                print(f"[soak] {i}/{ops} ops, {i / (time.perf_counter() - t0):.0f} ops/s, "
                      f"RSS {rss / 2**20:.1f} MiB, wrong so far {TALLY.count}", flush=True)
    wall = time.perf_counter() - t0
    KEPT.clear()
    compiled_warm = COMPILED_AT[warm_call]
    end = resources()
    report = {"rank": R, "ops": ops, "warmup": i_warm, "wall_s": round(wall, 2),
              "ops_per_s": round(ops / wall, 1),
              "ops_per_s_after_warmup": round((ops - i_warm) / max(1e-9, time.perf_counter() - t_warm), 1),
              "rss_warm_mib": round(warm["rss"] / 2**20, 1), "rss_end_mib": round(end["rss"] / 2**20, 1),
              "rss_warm_peak_mib": round(warm_peak / 2**20, 1), "rss_after_peak_mib": round(after_peak / 2**20, 1),
              "rss_growth_mb": round((end["rss"] - warm_peak) / 1e6, 1),
              "rss_growth_from_warm_sample_mb": round((end["rss"] - warm["rss"]) / 1e6, 1),
              "threads_warm": warm["threads"], "threads_end": end["threads"],
              "py_threads_warm": warm["py_threads"], "py_threads_end": end["py_threads"],
              "fds_warm": len(warm["fds"]), "fds_end": len(end["fds"]),
              "diag_warm": warm["diag"], "diag_end": end["diag"],
              "compiled_after_warmup": sorted(COMPILED_AT[len(COMPILED_AT) - 1] - compiled_warm),
              "mix": dict(MIX), "wrong": TALLY.count, "first_wrong": TALLY.first, "rss_trajectory_mib": trajectory}
    problems = []
    if TALLY.count:
        problems.append(f"{TALLY.count} wrong results")
    if end["rss"] - warm_peak >= RSS_LIMIT:
        problems.append(f"RSS grew {(end['rss'] - warm_peak) / 1e6:.1f} MB past its warm-up peak "
                        f"(limit {RSS_LIMIT / 1e6:.0f} MB)")
    if end["threads"] != warm["threads"] or end["py_threads"] != warm["py_threads"]:
        problems.append(f"threads {warm['threads']} {warm['py_threads']} -> {end['threads']} {end['py_threads']}")
    if end["fds"] != warm["fds"]:
        opened = {k: v for k, v in end["fds"].items() if warm["fds"].get(k) != v}
        closed = {k: v for k, v in warm["fds"].items() if end["fds"].get(k) != v}
        problems.append(f"open files changed: opened {opened}, closed {closed}")
    report["problems"] = problems
    fastring.shutdown()
    reports = COMM.gather(report, root=0)
    failed = COMM.bcast(any(r["problems"] for r in reports) if R == 0 else None, root=0)
    if R == 0:
        for r in reports:
            print(f"[soak rank {r['rank']}] {r['ops']} ops in {r['wall_s']} s ({r['ops_per_s']} ops/s, "
                  f"{r['ops_per_s_after_warmup']} after warm-up); RSS {r['rss_warm_mib']} MiB after "
                  f"{r['warmup']} ops (peak {r['rss_warm_peak_mib']} in the warm-up) -> {r['rss_end_mib']} MiB "
                  f"at the end (peak after warm-up {r['rss_after_peak_mib']}): growth {r['rss_growth_mb']} MB "
                  f"past the warm-up peak, {r['rss_growth_from_warm_sample_mb']} MB from the sample at the "
                  f"warm-up; threads {r['threads_warm']} -> {r['threads_end']}; "
                  f"fds {r['fds_warm']} -> {r['fds_end']}; wrong {r['wrong']}", flush=True)
            print(f"[soak rank {r['rank']}]   diagnostics after warm-up {r['diag_warm']}, at the end "
                  f"{r['diag_end']}; kernels compiled after the warm-up {r['compiled_after_warmup']}; "
                  f"RSS (MiB) every 1000 ops {r['rss_trajectory_mib']}", flush=True)
            if r["rank"] == 0:
                print(f"[soak] ops run: {dict(sorted(r['mix'].items()))}", flush=True)
            for m in r["first_wrong"]:
                print(f"[soak rank {r['rank']}]   WRONG {m}", flush=True)
            for m in r["problems"]:
                print(f"[soak rank {r['rank']}] FAIL {m}", flush=True)
        result = {"passed": not failed, "ranks": reports}
        print("SOAK-RESULT " + json.dumps(result), flush=True)
        if ARGS.json:
            with open(ARGS.json, "w") as f:
                json.dump(result, f, indent=1)
        print(("FAILED" if failed else "OK") + f" soak of {ops} ops on {N} ranks", flush=True)
    faulthandler.cancel_dump_traceback_later()
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
