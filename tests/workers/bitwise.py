"""Every rank gets the same bits where the operand order shows: Min/Max of -0.0 against +0.0
and Sum/Min/Max of NaNs whose payloads differ by rank (x86 keeps the first operand's NaN).
A pair of ranks that each computed op(mine, theirs) would disagree; the exchanges combine in
rank order. Small messages ride in the negotiation cycle; under recursive_doubling a larger
one takes the transport's recursive doubling itself.
usage: bitwise.py [algorithm ...]"""
import sys

import numpy as np

import _common as c
import fastring

N, R = c.SIZE, c.RANK
SMALL, LARGE = 64, 40_000  # elements: in the cycle's payload, and past SMALL_MESSAGE_BYTES


def signed_zeros(dt: np.dtype, length: int) -> np.ndarray:
    """Element j is -0.0 on rank r when bit r of j is set, else +0.0: every pair of ranks
    meets both ways round."""
    j = np.arange(length)
    return np.where((j >> R) & 1, dt.type(-0.0), dt.type(0.0)).astype(dt)


def nans(dt: np.dtype, length: int) -> np.ndarray:
    """Element j is a quiet NaN with payload R + 1 on rank r when bit r of j is set, else 1.0."""
    bits = np.dtype(f"u{dt.itemsize}")
    quiet = {4: 0x7FC00000, 8: 0x7FF8000000000000}[dt.itemsize]
    nan = np.array([quiet | (R + 1)], bits).view(dt)[0]
    j = np.arange(length)
    return np.where((j >> R) & 1, nan, dt.type(1.0)).astype(dt)


def check_same_bits(name: str, got: np.ndarray) -> None:
    everyone = c.COMM.allgather(got.tobytes())
    for r, theirs in enumerate(everyone):
        if theirs != everyone[0]:
            a = np.frombuffer(everyone[0], got.dtype).view(f"u{got.itemsize}")
            b = np.frombuffer(theirs, got.dtype).view(f"u{got.itemsize}")
            bad = np.flatnonzero(a != b)
            c.fail(f"{name}: rank {r} differs from rank 0 in {bad.size} elements, first at {bad[:4]}: "
                   f"{[hex(x) for x in b[bad[:4]]]} against {[hex(x) for x in a[bad[:4]]]}")


fastring.init()
for algorithm in sys.argv[1:] or ["auto"]:
    c.reinit(algorithm)
    for dt in (np.dtype(np.float32), np.dtype(np.float64)):
        for length in (SMALL, LARGE):
            cases = [(f"{op.name} of signed zeros", op, signed_zeros(dt, length))
                     for op in (fastring.Min, fastring.Max)]
            cases += [(f"{op.name} of NaNs", op, nans(dt, length))
                      for op in (fastring.Sum, fastring.Min, fastring.Max)]
            for what, op, x in cases:
                name = f"{algorithm} {dt} n={length} {what}"
                for how in ("sync", "async"):
                    if how == "sync":
                        got = fastring.allreduce(x, op=op)
                    else:
                        got = fastring.allreduce_async(x, op=op, name=f"{name} async").wait()
                    if "zeros" in what and not np.all(got == 0):
                        c.fail(f"{name} ({how}): a nonzero result")
                    if "NaNs" in what:
                        any_nan = np.arange(length) & ((1 << N) - 1) != 0
                        if not np.array_equal(np.isnan(got), any_nan):
                            c.fail(f"{name} ({how}): NaN where no rank had one, or none where one had")
                    check_same_bits(f"{name} ({how})", got)
c.done("bitwise")
