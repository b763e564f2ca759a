"""What every algorithm shares: the chunk layout of a buffer over the ranks and the
callables an algorithm is handed (the finalizer of reduced data, the timeline's phases)."""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import numpy as np

from .._core.config import NETWORK_RING_SEGMENT_BYTES, RING_SEGMENT_BYTES
from .._core.dtypes import DtypeSpec
from .._core.ops import ReduceOp
from .._core.work import nothing

Finalize = Callable[[np.ndarray], None]
Phase = Callable[[str], ContextManager]  # phase("reduce-scatter") times that phase (timeline)


def no_phase(name: str) -> ContextManager:
    """A Phase that records nothing."""
    return contextlib.nullcontext()


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ cost 0.8 us of every choice
class Message:
    """What the registry chooses an algorithm by: the collective, its size and dtype, where the
    tensors live, the wire format, and the runtime (rank count, hosts, single copy).

    `may_ride_cycle`: the message can still travel inside the negotiation cycle (False once
    the negotiation has agreed on it without carrying it).
    """
    collective: str
    nbytes: int
    spec: DtypeSpec | None = None
    device: str = "cpu"
    wire: str | None = None
    rt: Any = None
    may_ride_cycle: bool = True


@dataclass(slots=True)
class Reduction:
    """One allreduce of a flat, contiguous buffer as an algorithm sees it.

    `flat` receives the result. `src`, if given, is the unscaled input of the same size read
    where it lies (the ring reads it directly; the others copy it into `flat` first);
    otherwise `flat` holds the input. `finalize` runs once on every fully reduced element
    (Average's division, the postscale). Under compression `wire` names the 16-bit format and
    `scale` = (mul, div, post) is applied to the input as it is read and to the result.

    Example:
        >>> from fastring._core.dtypes import spec_of
        >>> r = Reduction(np.ones(4, np.float32), spec_of("float32"), ReduceOp.Sum)
        >>> r.input_in_flat().tolist()
        [1.0, 1.0, 1.0, 1.0]
    """
    flat: np.ndarray
    spec: DtypeSpec
    op: ReduceOp
    finalize: Finalize = nothing
    phase: Phase = no_phase
    src: np.ndarray | None = None
    wire: str | None = None
    scale: tuple[float, float, float] = (1.0, 1.0, 1.0)

    def input_in_flat(self) -> np.ndarray:
        """`flat`, holding the input (copied from `src` if it was elsewhere)."""
        if self.src is not None:
            np.copyto(self.flat, self.src)
            self.src = None
        return self.flat


@functools.lru_cache(maxsize=256)
def chunk_offsets(count: int, parts: int, itemsize: int) -> np.ndarray:
    """Byte offsets splitting `count` elements into `parts` chunks, the first count % parts
    one element longer (the contract's reducescatter layout). Cached (training repeats the
    same sizes), so the array is read-only.

    Example:
        >>> chunk_offsets(5, 2, 4).tolist()
        [0, 12, 20]
    """
    base, extra = divmod(count, parts)
    sizes = np.full(parts, base, np.int64)
    sizes[:extra] += 1
    offsets = np.zeros(parts + 1, np.int64)
    np.cumsum(sizes * itemsize, out=offsets[1:])
    offsets.flags.writeable = False
    return offsets


def ring_segment(rt, itemsize: int) -> int:
    """The ring's segment in bytes on `rt` (a runtime or a level of the hierarchy), a multiple
    of `itemsize`: NETWORK_RING_SEGMENT_BYTES where the ring crosses hosts, RING_SEGMENT_BYTES
    through memory (fastring/_core/config.py says why). Every rank of `rt` gets the same.

    Example:
        >>> from types import SimpleNamespace
        >>> ring_segment(SimpleNamespace(crosses_hosts=False), 12)
        1048572
    """
    nbytes = NETWORK_RING_SEGMENT_BYTES if rt.crosses_hosts else RING_SEGMENT_BYTES
    return max(itemsize, nbytes - nbytes % itemsize)
