"""Result buffers reused once nothing references them any more.

Collectives that return new tensors run every training step with the same shapes; a fresh
buffer each time faults in a page per 4 KiB on first touch, which for a few MiB costs about
as much as moving the data. A buffer is handed out again only when its reference count shows
that no result (nor any view of it, nor a tensor made from it by DLPack, all of which keep
it alive) exists outside the pool, so a result a caller holds is never overwritten.
"""
from __future__ import annotations

import math
import sys
import threading

import numpy as np

# Buffers smaller than this come from malloc's reused heap memory anyway.
MIN_POOLED_BYTES = 64 * 1024
PER_SHAPE = 4

_buffers: dict[tuple, list[np.ndarray]] = {}
_lock = threading.Lock()


def empty(shape, dtype) -> np.ndarray:
    """Like np.empty, but a buffer of this shape and dtype that is no longer referenced is
    reused instead of freshly allocated.

    Example:
        >>> a = empty((1 << 15,), np.float32); address = a.ctypes.data; del a
        >>> empty((1 << 15,), np.float32).ctypes.data == address
        True
    """
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if dtype.itemsize * math.prod(shape) < MIN_POOLED_BYTES:
        return np.empty(shape, dtype)
    key = (shape, dtype)
    with _lock:
        buffers = _buffers.setdefault(key, [])
        for buffer in buffers:
            if sys.getrefcount(buffer) == 3:  # the list, `buffer`, getrefcount's argument
                return buffer
        buffer = np.empty(shape, dtype)
        if len(buffers) < PER_SHAPE:
            buffers.append(buffer)
        return buffer
