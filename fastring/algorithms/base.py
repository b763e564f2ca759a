"""What every algorithm shares: the chunk layout of a buffer over the ranks and the
callables an algorithm is handed (the finalizer of reduced data, the timeline's phases)."""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, ContextManager

import numpy as np

Finalize = Callable[[np.ndarray], None]
Phase = Callable[[str], ContextManager]  # phase("reduce-scatter") times that phase (timeline)


def no_phase(name: str) -> ContextManager:
    return contextlib.nullcontext()


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
