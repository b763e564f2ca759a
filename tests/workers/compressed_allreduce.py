"""Compressed allreduce on N ranks: the documented error bound, overflow safety at 60000,
integers untouched, result dtypes, bitwise identity, error feedback, mismatches."""
import numpy as np

import _common as c
import fastring
from fastring import Compression
from fastring._core.config import PATH_TIMING_PERIOD_CALLS
from fastring._core.runtime import runtime
from fastring._core.dtypes import spec_of
from fastring.algorithms.base import Reduction
from fastring.algorithms.choice import TimedChoice
from fastring.algorithms.hierarchical import Level

fastring.init()
N, R = c.SIZE, c.RANK
U = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
SUBNORMAL_HALF = {"fp16": 2.0 ** -25, "bf16": 2.0 ** -134}


def bound(wire, inputs, scale):
    # fastring/compression.py: |err| <= N * u * sum_i |s x_i| + N * d
    return N * U[wire] * np.sum([np.abs(x.astype(np.float64) * scale) for x in inputs], axis=0) \
        + N * SUBNORMAL_HALF[wire]


for comp in (Compression.fp16, Compression.bf16):
    wire = comp.wire
    for dtype in (np.float32, np.float64, np.float16, c.BF16):
        for op, pre, post in ((fastring.Average, 1.0, 1.0), (fastring.Sum, 1.0, 1.0),
                              (fastring.Average, 0.5, 4.0), (fastring.Max, 1.0, 1.0)):
            for length in (0, 1, N + 1, 200003):
                rng = [np.random.default_rng([length, r]) for r in range(N)]
                inputs = [(g.standard_normal(length) * 100).astype(dtype) for g in rng]
                name = f"{comp} {np.dtype(dtype)} {op.name} pre={pre} post={post} n={length}"
                got = fastring.allreduce(inputs[R], op=op, compression=comp, prescale_factor=pre,
                                         postscale_factor=post)
                if got.dtype != np.dtype(dtype) or got.shape != (length,):
                    c.fail(f"{name}: result {got.dtype}{got.shape}")
                stack = np.stack([x.astype(np.float64) * pre for x in inputs]) if length else np.zeros((N, 0))
                exact = {fastring.Sum: stack.sum(0), fastring.Average: stack.sum(0) / N,
                         fastring.Max: stack.max(0) if length else np.zeros(0)}[op] * post
                scale = pre / N if op == fastring.Average else pre
                limit = bound(wire, inputs, scale) * post
                out_eps = c.EPS[np.dtype(dtype)] if np.dtype(dtype).itemsize == 2 else 0.0
                limit = limit + out_eps * np.abs(exact)  # rounding into a 16-bit result dtype
                err = np.abs(got.astype(np.float64) - exact)
                if err.size and not np.all(err <= limit):
                    i = int(np.argmax(err - limit))
                    c.fail(f"{name}: error {err[i]} > bound {limit[i]} at {i}")
                c.check_identical(name, got)

# The ring runs segment by segment: chunks of many segments (the last one short), in place
# or into out=, give the same bits as chunks of one segment.
A = fastring.algorithms.allreduce


class Counted(TimedChoice):
    """A TimedChoice that remembers every way it picked."""

    def __init__(self, ways):
        super().__init__(ways)
        self.picked = []

    def pick(self, nbytes):
        way, timed = super().pick(nbytes)
        self.picked.append(way)
        return way, timed


default_segments = A.WIRE_SEGMENT_ELEMENTS, A.WIRE_STREAM_SEGMENT_ELEMENTS
for comp in (Compression.fp16, Compression.bf16):
    x = (np.random.default_rng([11, R]).standard_normal(10007) * 100).astype(np.float32)
    one = fastring.allreduce(x, compression=comp, prescale_factor=0.5, postscale_factor=3.0)
    A.WIRE_SEGMENT_ELEMENTS = A.WIRE_STREAM_SEGMENT_ELEMENTS = 1000
    many = fastring.allreduce(x, compression=comp, prescale_factor=0.5, postscale_factor=3.0)
    inplace = x.copy()
    fastring.allreduce(inplace, compression=comp, prescale_factor=0.5, postscale_factor=3.0, out=inplace)
    c.check_close(f"{comp} many segments", many, one, 0)
    c.check_close(f"{comp} in place", inplace, one, 0)
    c.check_identical(f"{comp} segments", many)
    # The ring chooses between two segment sizes by the times it measures (TimedChoice): every
    # rank makes the same choices (or the exchanges would not match), and the bits never change.
    A.WIRE_SEGMENT_ELEMENTS, A.WIRE_STREAM_SEGMENT_ELEMENTS = 1000, 3000
    if N > 1:
        chooser = runtime().choices["compressed ring segments 1000/3000"] = Counted((1000, 3000))
        calls = PATH_TIMING_PERIOD_CALLS + 8  # the tries (each size warmed and timed twice), a period
        for k in range(calls):
            again = fastring.allreduce(x, compression=comp, prescale_factor=0.5, postscale_factor=3.0)
            c.check_close(f"{comp} chosen segments, call {k}", again, one, 0)
        # every call went through the choice, whose first calls alternate the sizes (a jittery
        # machine may have started its tries afresh since: alike everywhere)
        if chooser.picked.count(1000) < 2 or chooser.picked.count(3000) < 2 or len(chooser.picked) != calls:
            c.fail(f"{comp}: the segment sizes picked: {chooser.picked}")
        learnt = chooser._sizes[x.nbytes.bit_length()]
        c.check_identical(f"{comp} chooser state", np.array([learnt[1] or 0, *sum(learnt[2], [])], np.float64))
    # A level of the hierarchy (the cross-host phase runs the compressed ring on one) has its
    # own timed choice: a chunk above the small segment there
    if N > 1:
        level = Level(runtime(), runtime().transport, True)
        inputs = [(np.random.default_rng([12, r]).standard_normal(N * 1001) * 100).astype(np.float32)
                  for r in range(N)]
        through = [fastring.allreduce(inputs[R], op=fastring.Sum, compression=comp) for _ in range(2)]
        for k in range(10):
            flat = inputs[R].copy()
            A.CompressedRing.run(level, Reduction(flat, spec_of("float32"), fastring.Sum, wire=comp.wire))
            c.check_close(f"{comp} on a level, call {k}", flat, through[0], 0)
        if not level.choices["compressed ring segments 1000/3000"]._sizes:
            c.fail(f"{comp}: the level's choice of segment sizes learnt nothing")
    A.WIRE_SEGMENT_ELEMENTS, A.WIRE_STREAM_SEGMENT_ELEMENTS = default_segments

# Averaging values near the fp16 maximum stays finite and exact (divide before the sum).
for dtype in (np.float32, np.float16):
    big = np.full(1000, 60000.0, dtype)
    for comp in (Compression.fp16, Compression.none):
        got = fastring.allreduce(big, compression=comp)
        if not np.all(np.isfinite(got.astype(np.float64))):
            c.fail(f"average of 60000 in {np.dtype(dtype)} with {comp} overflowed: {got[:3]}")
        rel = np.max(np.abs(got.astype(np.float64) - 60000.0)) / 60000.0
        if rel > N * U["fp16"]:
            c.fail(f"average of 60000 in {np.dtype(dtype)} with {comp}: relative error {rel}")

# Integers (and bools) are never compressed: exact results.
for dtype in (np.int32, np.int64, np.uint8):
    x = [np.random.default_rng([7, r]).integers(0, 50, 999).astype(dtype) for r in range(N)]
    got = fastring.allreduce(x[R], op=fastring.Sum, compression=Compression.fp16)
    c.check_close(f"int {np.dtype(dtype)} untouched", got, np.sum(np.stack(x), axis=0, dtype=dtype), 0)

# Grouped and fused compressed requests.
g = fastring.grouped_allreduce([np.full(10, 1.5, np.float16), np.full(7, 2.0, np.float16)],
                               op=fastring.Sum, compression=Compression.bf16)
c.check_close("grouped compressed 0", g[0], np.full(10, 1.5 * N), 0)
c.check_close("grouped compressed 1", g[1].astype(np.float64), np.full(7, 2.0 * N), 0)

# Error feedback: rank 0 sends 1 + 1e-4 every step (not representable in fp16), the others 0,
# so the only error is rank 0's own rounding; feedback keeps the sum over steps close.
steps = 40
value = np.float32(1 + 1e-4)
errors = {}
for comp in (Compression.fp16, Compression.fp16_ef):
    total = 0.0
    for step in range(steps):
        x = np.full(8, value if R == 0 else 0.0, np.float32)
        total += float(fastring.allreduce(x, op=fastring.Sum, name="ef.w", compression=comp)[0])
    errors[comp.name] = abs(total - steps * float(value))
if not errors["fp16_ef"] * 4 < errors["fp16"]:
    c.fail(f"error feedback does not reduce the accumulated error: {errors}")

# A compression that differs across ranks is a mismatch.
if N > 1:
    try:
        fastring.allreduce(np.ones(4, np.float32), name="cmp", compression=Compression.fp16 if R else Compression.bf16)
        c.fail("compression mismatch not detected")
    except fastring.FastringError as e:
        if "compression" not in str(e):
            c.fail(f"mismatch message lacks the field: {e}")
c.done(f"compression, errors {errors}")
