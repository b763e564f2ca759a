"""What one allreduce means, below the engine: where each tensor is read, reduced and
shown (`Entry`), the reduction's parameters (`AllreduceWork`), and the arithmetic every
algorithm applies around the reduction (prescale, Average's division, postscale)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import kernels
from .compression import Compression, Compressor
from .dtypes import DtypeSpec, spec_of
from .ops import ReduceOp


@dataclass(eq=False, slots=True)
class Entry:
    """One tensor of an allreduce: read `src`, reduce in `work` (contiguous), show `target`."""
    src: np.ndarray
    work: np.ndarray
    target: np.ndarray
    result: Any  # what the handle returns for this tensor


@dataclass(eq=False, slots=True)
class AllreduceWork:
    """How an allreduce reduces: the same for every request of one signature, so that the
    api shares one object between them (the tensors are the request's, `Request.entries`)."""
    spec: DtypeSpec
    op: ReduceOp
    prescale: float
    postscale: float
    compression: Compressor = Compression.none
    device: str = "cpu"  # "cuda": the requests' entries hold device arrays (fastring/algorithms/device.py)
    key: tuple = field(init=False, default=())  # what requests must share to be fused into one batch (set from the above)
    # Derived once from the above (a work is never changed once built): a cycle reads them
    # a dozen times.
    # An integer Average: reduced exactly as quotients and remainders (see
    # `split_for_average`), never as a sum that could wrap.
    splits_average: bool = field(init=False, default=False)
    # The dtype reduced in: the tensor's own, float32/float64 under compression, int64 for an
    # integer Average.
    accumulator: np.dtype = field(init=False, default=None)
    reduce_op: ReduceOp = field(init=False, default=None)  # what the algorithm reduces with (an integer Average sums its parts)
    reduced_spec: DtypeSpec = field(init=False, default=None)  # the spec the algorithm reduces (an integer Average: int64)

    def __post_init__(self):
        spec = self.spec
        self.key = ("allreduce", spec.name, int(self.op), self.prescale, self.postscale,
                    self.compression.name, self.device)
        self.splits_average = splits = self.op == ReduceOp.Average and not spec.is_float and spec.name != "bool"
        if splits:
            self.accumulator = _INT64
        elif self.compression.wire is None:
            self.accumulator = spec.dtype
        else:
            self.accumulator = np.dtype(np.float64) if spec.dtype == np.float64 else np.dtype(np.float32)
        self.reduce_op = ReduceOp.Sum if splits else self.op
        self.reduced_spec = spec_of(_INT64) if splits else spec

    def reduced_nbytes(self, nbytes: int) -> int:
        """Bytes reduced for `nbytes` of input: in the accumulator dtype, and two values per
        element for an integer Average."""
        count = nbytes // self.spec.dtype.itemsize
        return (2 * count if self.splits_average else count) * self.accumulator.itemsize


_INT64 = np.dtype(np.int64)

# (dtype name, op, prescale, postscale, compressor, device) -> its AllreduceWork
_WORKS: dict[tuple, AllreduceWork] = {}
WORKS_KEPT = 1024  # distinct reductions remembered (then built each call)


def work_of(spec: DtypeSpec, op: ReduceOp, prescale: float, postscale: float,
            compression: Compressor = Compression.none, device: str = "cpu") -> AllreduceWork:
    """The AllreduceWork of these parameters, one object for all the requests that share
    them: building one costs more than the lookup, on every call of the hot paths.

    Example:
        >>> f32 = spec_of(np.float32)
        >>> work_of(f32, ReduceOp.Sum, 1.0, 1.0) is work_of(f32, ReduceOp.Sum, 1.0, 1.0)
        True
    """
    key = (spec.name, op, prescale, postscale, compression, device)
    work = _WORKS.get(key)
    if work is None:
        work = AllreduceWork(spec, op, prescale, postscale, compression, device)
        if len(_WORKS) < WORKS_KEPT:
            _WORKS[key] = work
    return work


def nothing(view: np.ndarray) -> None:
    """A finalizer that leaves the reduced values as they are."""


def split_for_average(x: np.ndarray, size: int, out: np.ndarray) -> None:
    """Write x's quotients and remainders by `size` into `out` (int64, twice x's length):
    q = trunc(x / size) and r = x - size * q. Summed over the ranks, Q + R / size is the
    exact mean, and neither sum can wrap: |Q| is at most the largest |x| and |R| < size**2.

    Example:
        >>> out = np.empty(4, np.int64); split_for_average(np.array([7, -7]), 2, out); out
        array([ 3, -3,  1, -1])
    """
    n = x.size
    q, r = out[:n], out[n:]
    np.fmod(x, size, out=r, casting="unsafe")  # C's remainder: the sign of x, so q truncates
    np.subtract(x, r, out=q, casting="unsafe")  # x may be q itself: r is already taken
    np.floor_divide(q, size, out=q)  # exact: q is a multiple of size


def join_average(parts: np.ndarray, size: int) -> np.ndarray:
    """The mean, truncated toward zero, from summed quotients and remainders (the layout of
    `split_for_average`); int64.

    Example:
        >>> join_average(np.array([3 + 4, 1 + 0]), 2)   # the mean of 7 and 8
        array([7])
    """
    n = parts.size // 2
    q, r = parts[:n], parts[n:]
    m = np.fmod(r, size)  # R = size * d + m, d truncated, m with R's sign (|R| < size**2)
    t = r - m
    np.floor_divide(t, size, out=t)
    t += q
    return t - ((t > 0) & (m < 0)) + ((t < 0) & (m > 0))


def predivides(work: AllreduceWork, size: int) -> bool:
    # Summing values near a 16-bit format's maximum would overflow before the division (in
    # the tensor itself, or on a compressed wire), so Average divides first there.
    return (work.op == ReduceOp.Average and size > 1
            and (work.spec.is_16bit_float or work.compression.wire is not None))


def prescale(work: AllreduceWork, flat: np.ndarray, size: int) -> None:
    if work.prescale != 1.0:
        kernels.scale_into(flat, work.prescale)
    if predivides(work, size):
        kernels.divide_into(flat, size)


def pack(work: AllreduceWork, entries: list[Entry], flat: np.ndarray, size: int) -> None:
    """Copy the entries' inputs, one after another, into `flat` (the work's accumulator dtype,
    its reduced count) and scale them as they must be before the reduction."""
    count = sum(e.src.size for e in entries)
    inputs = flat[:count]
    offset = 0
    for e in entries:
        n = e.src.size
        np.copyto(inputs[offset:offset + n].reshape(e.src.shape), e.src, casting="unsafe")
        offset += n
    prescale(work, inputs, size)
    if work.splits_average:
        split_for_average(inputs, size, flat)


def unpack(work: AllreduceWork, flat: np.ndarray, size: int) -> np.ndarray:
    """The reduced values of a request's tensors, one after another, from its part of the
    reduced buffer (an integer Average: joined into the mean, postscaled)."""
    if not work.splits_average:
        return flat
    mean = join_average(flat, size)
    if work.postscale != 1.0:
        kernels.scale_into(mean, work.postscale)
    return mean


@dataclass(frozen=True)
class Finish:
    """What runs on fully reduced data: divide by `divisor` (Average) unless it is 1, then
    scale by `factor` (the postscale) unless it is 1.0. A transport that knows it can run
    the same arithmetic on each piece where it is reduced (kernels.finish_cfunc)."""
    divisor: int
    factor: float

    def __call__(self, view: np.ndarray) -> None:
        if self.divisor != 1:
            kernels.divide_into(view, self.divisor)
        if self.factor != 1.0:
            kernels.scale_into(view, self.factor)


def finalizer(work: AllreduceWork, size: int) -> Finish | None:
    """What runs on fully reduced data (Average's division, the postscale), or None (an
    integer Average finishes in `unpack`)."""
    if work.splits_average:
        return None
    divide = work.op == ReduceOp.Average and size > 1 and not predivides(work, size)
    if not divide and work.postscale == 1.0:
        return None
    return Finish(size if divide else 1, work.postscale)
