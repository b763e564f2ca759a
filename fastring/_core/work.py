"""What one allreduce means, below the engine: where each tensor is read, reduced and
shown (`Entry`), the reduction's parameters (`AllreduceWork`), and the arithmetic every
algorithm applies around the reduction (prescale, Average's division, postscale)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import kernels
from .compression import Compression, Compressor
from .dtypes import DtypeSpec
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
    spec: DtypeSpec
    op: ReduceOp
    prescale: float
    postscale: float
    entries: list[Entry]
    grouped: bool  # the handle returns a list
    compression: Compressor = Compression.none
    device: str = "cpu"  # "cuda": entries hold device arrays (fastring/algorithms/device.py)
    block: np.ndarray | None = None  # flat buffer that the entries' work arrays tile, if any

    def own_buffer(self) -> np.ndarray | None:
        """The contiguous buffer this request can be reduced in without a fusion buffer:
        its block, or its single entry's work array; None if it must be packed."""
        if self.block is not None:
            return self.block
        if len(self.entries) == 1:
            return self.entries[0].work.reshape(-1)
        return None

    def key(self) -> tuple:
        return (self.spec.name, int(self.op), self.prescale, self.postscale, self.compression.name,
                self.device)

    @property
    def accumulator(self) -> np.dtype:
        """The dtype reduced in: the tensor's own, or float32/float64 under compression."""
        if self.compression.wire is None:
            return self.spec.dtype
        return np.dtype(np.float64) if self.spec.dtype == np.float64 else np.dtype(np.float32)


def nothing(view: np.ndarray) -> None:
    pass


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


def pack(work: AllreduceWork, flat: np.ndarray, size: int) -> None:
    offset = 0
    for e in work.entries:
        n = e.src.size
        np.copyto(flat[offset:offset + n].reshape(e.src.shape), e.src, casting="unsafe")
        offset += n
    prescale(work, flat, size)


@functools.lru_cache(maxsize=None)
def divider(size: int) -> Callable[[np.ndarray], None]:
    """Average's division by `size`, in place on a flat array."""
    return lambda view: kernels.divide_into(view, size)


def finalizer(work: AllreduceWork, size: int) -> Callable[[np.ndarray], None] | None:
    """What runs on fully reduced data (Average's division, the postscale), or None."""
    divide = work.op == ReduceOp.Average and size > 1 and not predivides(work, size)
    postscale = work.postscale
    if not divide and postscale == 1.0:
        return None

    def finalize(view: np.ndarray) -> None:
        if divide:
            kernels.divide_into(view, size)
        if postscale != 1.0:
            kernels.scale_into(view, postscale)
    return finalize
