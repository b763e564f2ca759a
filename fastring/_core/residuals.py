"""Error-feedback residuals by tensor name, bounded in bytes and in names.

Compression with error feedback keeps, per tensor name, what 16-bit rounding lost last step
and adds it back the next. Names that come and go (a name per step or per batch shape) would
keep a residual each forever; this store keeps at most RESIDUAL_MAX_BYTES and
RESIDUAL_MAX_ENTRIES (config.py says why those values) and drops the least recently used
name past either. A dropped residual costs its tensor one step's correction, nothing else.

The arrays may be NumPy arrays (the host engine) or device arrays (the device ring): the
store needs only their `shape`, `dtype` and `size`.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from .config import RESIDUAL_MAX_BYTES, RESIDUAL_MAX_ENTRIES

log = logging.getLogger("fastring")


def _nbytes(array: Any) -> int:
    return int(array.size) * np.dtype(array.dtype).itemsize


class Residuals:
    """A name -> residual store holding at most `max_bytes` and `max_entries`, dropping the
    least recently used name (get and put both count as a use). Thread-safe.

    Example:
        >>> store = Residuals(max_bytes=64, max_entries=2)
        >>> store.put("a", np.zeros(4, np.float32)); store.put("b", np.ones(4, np.float32))
        >>> store.get("a", (4,), np.float32) is not None    # a is now the most recent
        True
        >>> store.put("c", np.zeros(4, np.float32))          # a third name: b goes
        >>> sorted(store.names()), store.nbytes
        (['a', 'c'], 32)
    """

    def __init__(self, max_bytes: int = RESIDUAL_MAX_BYTES,
                 max_entries: int = RESIDUAL_MAX_ENTRIES) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.nbytes = 0  # held now
        self.dropped = 0  # residuals dropped to stay within the caps, ever
        self._arrays: OrderedDict[str, Any] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def get(self, name: str, shape: tuple, dtype: Any) -> Any | None:
        """The residual kept for `name` if it has this shape and dtype, else None (one of
        another shape or dtype is dropped: it cannot be added to this tensor).

        Example:
            >>> store = Residuals(); store.put("w", np.full(3, 0.5))
            >>> store.get("w", (3,), np.float64)
            array([0.5, 0.5, 0.5])
            >>> store.get("w", (4,), np.float64) is None, len(store)
            (True, 0)
        """
        with self._lock:
            array = self._arrays.get(name)
            if array is None:
                return None
            if tuple(array.shape) != tuple(shape) or array.dtype != np.dtype(dtype):
                self._remove(name)
                return None
            self._arrays.move_to_end(name)
            return array

    def put(self, name: str, array: Any) -> None:
        """Keep `array` as `name`'s residual (replacing any), dropping least recently used
        names until the caps hold. One larger than `max_bytes` alone is not kept.

        Example:
            >>> store = Residuals(max_bytes=16); store.put("big", np.zeros(4))  # 32 bytes
            >>> len(store), store.dropped
            (0, 1)
        """
        nbytes = _nbytes(array)
        with self._lock:
            if name in self._arrays:
                self._remove(name)
            if nbytes > self.max_bytes or self.max_entries < 1:
                self._dropped(name)
                return
            while self.nbytes + nbytes > self.max_bytes or len(self._arrays) >= self.max_entries:
                oldest = next(iter(self._arrays))
                self._remove(oldest)
                self._dropped(oldest)
            self._arrays[name] = array
            self.nbytes += nbytes

    def names(self) -> list[str]:
        """The names kept, least recently used first.

        Example:
            >>> store = Residuals(); store.put("a", np.zeros(1)); store.put("b", np.zeros(1))
            >>> store.names()
            ['a', 'b']
        """
        with self._lock:
            return list(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def _remove(self, name: str) -> None:
        self.nbytes -= _nbytes(self._arrays.pop(name))

    def _dropped(self, name: str) -> None:
        # Said once per store: a model whose residuals outgrow the caps drops some every step,
        # and its error feedback is then partly off; the caps are in config.py.
        if not self.dropped:
            log.warning("error feedback: dropped the residual of %r to stay within %d bytes "
                        "and %d names of residuals; a dropped name loses one step's rounding "
                        "correction", name, self.max_bytes, self.max_entries)
        self.dropped += 1
