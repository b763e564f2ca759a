"""Helpers shared by the multi-rank workers: deterministic inputs, NumPy references, tolerances,
the cross-rank identity check (done through mpi4py, independently of fastring), and CHECKS,
which collects failed checks so that a worker reports all of them, not only the first."""
from __future__ import annotations

import atexit
import hashlib
import os
import sys

import ml_dtypes
import numpy as np
from mpi4py import MPI

import fastring

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(d) for d in (np.uint8, np.int8, np.int32, np.int64, np.float16, BF16,
                                 np.float32, np.float64, np.bool_)]
# Unit roundoff of each float format: one rounding of a value v errs by at most eps*|v|.
EPS = {np.dtype(np.float16): 2.0 ** -11, BF16: 2.0 ** -8, np.dtype(np.float32): 2.0 ** -24,
       np.dtype(np.float64): 2.0 ** -53}


def converters(framework: str):
    """(to_fw, from_fw): a NumPy array as a fresh tensor of `framework` ('numpy' or 'torch'),
    and a result back as NumPy (asserting it came back in the framework's type)."""
    if framework == "torch":
        import torch

        def to_fw(a):
            if a.dtype == BF16:
                return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
            return torch.from_numpy(a.copy())

        def from_fw(t):
            assert isinstance(t, torch.Tensor), type(t)
            if t.dtype == torch.bfloat16:
                return t.view(torch.int16).numpy().view(BF16)
            return t.numpy()
        return to_fw, from_fw

    def to_numpy(a):
        return a.copy()

    def from_numpy(a):
        assert isinstance(a, np.ndarray), type(a)
        return a
    return to_numpy, from_numpy


def reinit(algorithm: str = "auto") -> None:
    """Restart fastring under another FASTRING_ALGORITHM (init reads the environment)."""
    os.environ["FASTRING_ALGORITHM"] = algorithm
    fastring.shutdown()
    fastring.init()


def rank_input(dtype: np.dtype, shape, rank: int, seed: int) -> np.ndarray:
    """The array that `rank` contributes; every rank can rebuild every other rank's input."""
    rng = np.random.default_rng([seed, rank])
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -5
        return rng.integers(lo, 6, shape).astype(dtype)
    # Floats in [-2, 2] on a grid of 1/64, exact in every format here, so the only error is
    # the reduction's own rounding.
    return (rng.integers(-128, 129, shape) / 64.0).astype(dtype)


def reference(inputs: list[np.ndarray], op, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(expected value, per-element error bound) of reducing `inputs`, NumPy only."""
    dt = inputs[0].dtype
    if dt.kind in "iub":
        stack = np.stack(inputs)  # integer arithmetic wraps exactly as the kernels do
        if op in (fastring.Sum, fastring.Average):
            if dt == np.bool_:
                return np.logical_or.reduce(stack), 0
            if op == fastring.Average:  # the exact mean, truncated toward zero, never wrapped
                return exact_int_mean(stack).astype(dt), 0
            return np.add.reduce(stack, dtype=dt), 0
        if op == fastring.Product:
            return (np.logical_and.reduce(stack) if dt == np.bool_ else np.multiply.reduce(stack, dtype=dt)), 0
        if op == fastring.Min:
            return np.minimum.reduce(stack), 0
        return np.maximum.reduce(stack), 0
    stack = np.stack([x.astype(np.float64) for x in inputs])
    eps = EPS[dt]
    if op == fastring.Min:
        return np.minimum.reduce(stack), 0
    if op == fastring.Max:
        return np.maximum.reduce(stack), 0
    if op == fastring.Product:
        exact = np.multiply.reduce(stack)
        # each of the size-1 products rounds once
        return exact, size * eps * np.abs(exact)
    exact = np.add.reduce(stack)
    # Each partial sum rounds once (at most size-1 of them), each bounded by sum |x|; Average
    # adds the division's rounding (or, for 16-bit floats, one rounding per divided input).
    bound = size * eps * np.add.reduce(np.abs(stack))
    if op == fastring.Average:
        return exact / size, bound / size + eps * np.abs(exact / size)
    return exact, bound


def exact_int_mean(stack: np.ndarray) -> np.ndarray:
    """The mean over axis 0 of integer arrays, truncated toward zero, in Python integers."""
    totals = np.add.reduce(stack.astype(object))
    n = stack.shape[0]
    return np.array([(abs(t) // n) * (1 if t >= 0 else -1) for t in np.ravel(totals)],
                    dtype=object).reshape(np.shape(totals))


class Checks:
    """The failed checks of one process, kept so that a worker reports every failure instead of
    stopping at the first. Each failure is printed when it happens (a later hang still shows
    it); `finish` prints them all again and exits 1 if there was any. A process that records
    failures and never reaches `finish` (nor `report`) prints them and exits 1 at exit.

    Example:
        >>> checks = Checks("[rank 0/2] ")
        >>> checks.check(1 + 1 == 2, "sum")
        True
        >>> checks.check(2 * 2 == 5, "product is 5")
        [rank 0/2] FAIL product is 5
        False
        >>> checks.fail("bytes differ")
        [rank 0/2] FAIL bytes differ
        >>> print(checks.report())
        [rank 0/2] 2 failed checks:
          product is 5
          bytes differ
        >>> checks.finish()
        Traceback (most recent call last):
        SystemExit: 1
    """

    def __init__(self, label: str = ""):
        self.label = label
        self.failures: list[str] = []
        self._reported = 0  # how many failures a report has listed
        atexit.register(self._at_exit)

    def fail(self, message: str) -> None:
        """Record a failed check and print it."""
        self.failures.append(message)
        print(f"{self.label}FAIL {message}", flush=True)

    def check(self, ok, message: str) -> bool:
        """Record `message` as failed unless `ok`; returns whether it passed."""
        if not ok:
            self.fail(message)
        return bool(ok)

    def report(self) -> str:
        """Every failure so far, one per line under a count (empty if none)."""
        self._reported = len(self.failures)
        if not self.failures:
            return ""
        lines = "".join(f"\n  {m}" for m in self.failures)
        return f"{self.label}{len(self.failures)} failed check{'s' * (len(self.failures) != 1)}:{lines}"

    def finish(self) -> None:
        """Exit 1, listing every failure, if there was any; otherwise return."""
        if self.failures:
            print(self.report(), flush=True)
            sys.exit(1)

    def _at_exit(self) -> None:
        if len(self.failures) > self._reported:
            print(self.report(), flush=True)
            sys.stdout.flush()
            os._exit(1)  # atexit cannot change the exit code any other way


CHECKS = Checks(f"[rank {RANK}/{SIZE}] ")


def check_close(name: str, got: np.ndarray, expected, bound) -> bool:
    """Record a failure in CHECKS unless `got` equals `expected` (integers, bool, `bound` 0) or
    lies within `bound` of it elementwise; returns whether it passed.

    Example:
        >>> check_close("sum", np.array([3.0]), np.array([3.0 + 1e-9]), 1e-6)
        True
    """
    if got.dtype.kind in "iub" or np.isscalar(bound) and bound == 0:
        if not np.array_equal(np.asarray(got), np.asarray(expected).astype(got.dtype)):
            bad = np.flatnonzero(np.asarray(got).reshape(-1) != np.asarray(expected).astype(got.dtype).reshape(-1))
            CHECKS.fail(f"{name}: {bad.size} wrong elements, first at {bad[:5]}: got "
                        f"{np.asarray(got).reshape(-1)[bad[:5]]}, expected {np.asarray(expected).reshape(-1)[bad[:5]]}")
            return False
        return True
    err = np.abs(got.astype(np.float64) - expected)
    if not np.all(err <= bound):
        i = int(np.argmax(err - bound))
        CHECKS.fail(f"{name}: error {err.reshape(-1)[i]} > bound {np.broadcast_to(bound, err.shape).reshape(-1)[i]} "
                    f"at {i}: got {got.reshape(-1)[i]}, expected {expected.reshape(-1)[i]}")
        return False
    return True


def check_identical(name: str, got: np.ndarray) -> bool:
    """Every rank holds the same bytes (collective: every rank must call it); a difference is
    recorded in CHECKS on every rank. Returns whether they agree."""
    digest = hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()
    digests = COMM.allgather(digest)
    return CHECKS.check(len(set(digests)) == 1, f"{name}: results differ across ranks: {digests}")


def expect_error(name: str, call, error: type, *words: str) -> None:
    """Record a failure in CHECKS unless `call()` raises `error` with every one of `words` in
    its message."""
    try:
        call()
    except error as e:
        missing = [w for w in words if w not in str(e)]
        CHECKS.check(not missing, f"{name}: {error.__name__} does not mention {missing}: {e}")
        return
    except Exception as e:  # noqa: BLE001
        CHECKS.fail(f"{name}: expected {error.__name__}, got {type(e).__name__}: {e}")
        return
    CHECKS.fail(f"{name}: no {error.__name__}")


def fail(message: str) -> None:
    """A failure after which this rank cannot go on: print it and every failure recorded so
    far, and abort the job."""
    CHECKS.fail(message)
    print(CHECKS.report(), flush=True)
    COMM.Abort(1)


def done(what: str) -> None:
    """End of a worker (collective): exits 1 on every rank that recorded a failed check, each
    listing its failures, with rank 0 naming how many each rank had; otherwise rank 0 prints
    `OK <what> on <size> ranks`."""
    counts = COMM.allgather(len(CHECKS.failures))
    if RANK == 0:
        if any(counts):
            print(f"FAILED {what} on {SIZE} ranks: failed checks per rank {counts}", flush=True)
        else:
            print(f"OK {what} on {SIZE} ranks", flush=True)
    CHECKS.finish()


def pid_of_no_process() -> int:
    """A process id no process can have (ids are below pid_max): to make a copy into or out
    of another rank fail on purpose."""
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read())
