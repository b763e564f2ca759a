"""Result buffers reused once nothing references them any more, within a cap.

Collectives that return new tensors run every training step with the same or nearby shapes;
a fresh buffer each time faults in a page per 4 KiB on first touch, which for a few MiB
costs about as much as moving the data. So results come from a pool of byte buffers, each
handed out as a view of the requested shape and dtype.

A buffer is handed out again only when reference counts show that no result (nor any view
of it, nor a tensor made from it by DLPack, all of which keep the buffer alive) exists
outside the pool, so a result a caller holds is never overwritten.

Buffers are kept by size class, not by shape: a request is rounded up to one of
POOL_CLASSES_PER_OCTAVE sizes per power of two, so one buffer serves every shape and dtype of
nearby byte sizes. Keyed by shape, 2,000 distinct shapes kept 2,000 buffers; by class they
share a few dozen. What the pool keeps is capped in bytes and in buffers (config.py says
why those values); past a cap the least recently used buffer nobody references is freed.
"""
from __future__ import annotations

import math
import sys
import threading
import weakref
from collections import OrderedDict

import numpy as np

from .config import (ARENA_BLOCK_BYTES, COPY_PHASE_BYTES, POOL_ALIGN_BYTES, POOL_CLASSES_PER_OCTAVE, POOL_MAX_BYTES,
                     POOL_MAX_ENTRIES, POOL_MIN_BYTES, POOL_PER_SIZE)

_getrefcount = sys.getrefcount
# What a heap buffer holds beyond its size class: room to start a view up to this many bytes
# less one past its start, on a POOL_ALIGN_BYTES boundary or at any phase
_SPARE_BYTES = max(POOL_ALIGN_BYTES, COPY_PHASE_BYTES)
# A class spans 1/POOL_CLASSES_PER_OCTAVE of its power of two: the request's bit length less
# this many bits is the log2 of the class step.
_CLASS_BITS = POOL_CLASSES_PER_OCTAVE.bit_length()


def size_class(nbytes: int) -> int:
    """The buffer size that serves a request of `nbytes` (POOL_CLASSES_PER_OCTAVE per power
    of two; a power of two or a multiple of the class step is its own class).

    Example:
        >>> size_class(65536), size_class(65537), size_class(100_000)
        (65536, 73728, 106496)
    """
    step = 1 << max(nbytes.bit_length() - _CLASS_BITS, 0)
    return (nbytes + step - 1) & -step


class Arena:
    """Blocks of one mapping (`buffer`, anything with the buffer protocol: the host segment's
    results area, which the other ranks on the host map too) from byte `start` on, `length`
    bytes, each handed out as a uint8 array. A block returns to the arena when its array and
    every view of it are gone, so memory a caller still holds is never handed out again.

    Example:
        >>> import mmap
        >>> arena = Arena(mmap.mmap(-1, 1 << 16), 0, 1 << 16)
        >>> a = arena.take(40_000); a.size, arena.take(40_000) is None   # one block of pages
        (40960, True)
        >>> del a; arena.take(40_000).size                               # back once a is gone
        40960
    """

    def __init__(self, buffer, start: int, length: int) -> None:
        self._buffer = buffer
        self._bounds = (np.frombuffer(buffer, np.uint8).ctypes.data + start, length)
        self._free = [(start, length)]  # (offset, bytes), by offset, none adjacent
        self._returned: list = []  # blocks whose arrays are gone: merged at the next take
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray | None:
        """A block of at least `nbytes` (whole pages) as a uint8 array, or None when no free
        run of the arena is that long."""
        size = -(-nbytes // ARENA_BLOCK_BYTES) * ARENA_BLOCK_BYTES
        with self._lock:
            self._merge_returned()
            for i, (offset, length) in enumerate(self._free):
                if length >= size:
                    self._free[i:i + 1] = [(offset + size, length - size)] if length > size else []
                    break
            else:
                return None
        block = np.frombuffer(self._buffer, np.uint8, size, offset)
        # list.append is atomic: a block may die on any thread, this one holding the lock included
        weakref.finalize(block, self._returned.append, (offset, size))
        return block

    def holds(self, arr: np.ndarray) -> bool:
        """Whether every byte of `arr` lies in this arena.

        Example:
            >>> import mmap
            >>> arena = Arena(mmap.mmap(-1, 1 << 16), 4096, 8192)
            >>> arena.holds(arena.take(100)[3:]), arena.holds(np.zeros(4))
            (True, False)
        """
        first, length = self._bounds
        return arr.size == 0 or first <= arr.ctypes.data and arr.ctypes.data + arr.nbytes <= first + length

    def _merge_returned(self) -> None:
        while self._returned:
            self._free.append(self._returned.pop())
        self._free.sort()
        merged = self._free[:1]
        for offset, length in self._free[1:]:
            last_offset, last_length = merged[-1]
            if last_offset + last_length == offset:
                merged[-1] = (last_offset, last_length + length)
            else:
                merged.append((offset, length))
        self._free = merged


class _Slot:
    """One pooled buffer and the view of it last handed out (reused while the caller asks
    for the same shape, dtype and phase, so the hot path builds no array).

    `base` is the allocation of `size` (the size class) bytes and more: _SPARE_BYTES more from
    the heap, or a block of an Arena, which starts on a page. A view starts on the first
    POOL_ALIGN_BYTES boundary, or at the key's phase where the allocation has the room for
    it (always on the heap).
    """
    __slots__ = ("base", "address", "view", "key", "size")

    def __init__(self, size: int, key: tuple, base: np.ndarray | None = None) -> None:
        self.base = np.empty(size + _SPARE_BYTES, np.uint8) if base is None else base
        self.address = self.base.ctypes.data
        self.size = size
        self.view_as(key)

    def view_as(self, key: tuple) -> None:
        shape, dtype, phase = key
        nbytes = dtype.itemsize * math.prod(shape)
        start = -self.address % POOL_ALIGN_BYTES
        if phase is not None:
            at_phase = (phase - self.address) % COPY_PHASE_BYTES
            if at_phase + nbytes <= self.base.size:
                start = at_phase
        self.view, self.key = self.base[start:start + nbytes].view(dtype).reshape(shape), key


# A slot is free when only the pool references its buffer and view. Counted by getrefcount
# on the attribute itself: the view's references are `slot.view` and getrefcount's argument;
# the buffer's, `slot.base`, the view's .base (NumPy points every view, and every view of a
# view, at the array that owns the memory) and the argument. Anything a caller holds - the
# result, a slice, a reshape, a memoryview, a DLPack capsule - adds one to one of the two.
_FREE_VIEW, _FREE_BASE = 2, 3


def _is_free(slot: _Slot) -> bool:
    return _getrefcount(slot.view) == _FREE_VIEW and _getrefcount(slot.base) == _FREE_BASE


class Pool:
    """Buffers for results, reused when nothing references them, at most `max_bytes` and
    `max_entries` of them kept (in size-class bytes), `per_size` per size class; from
    `arena` where given (a result it has no room for is then the caller's alone, from the
    heap).

    Thread-safe: the engine's thread and the callers' allocate from one pool.

    Example:
        >>> pool = Pool(max_bytes=1 << 20, max_entries=4)
        >>> a = pool.empty((128, 128), np.float32); address = a.ctypes.data; del a
        >>> b = pool.empty((64, 256), np.float32)        # another shape, same bytes
        >>> b.ctypes.data == address, b.shape
        (True, (64, 256))
        >>> c = pool.empty((128, 128), np.float32)       # b is still held: never handed out
        >>> c.ctypes.data == address
        False
        >>> pool.kept()
        (2, 131072)
    """

    def __init__(self, max_bytes: int = POOL_MAX_BYTES, max_entries: int = POOL_MAX_ENTRIES,
                 per_size: int = POOL_PER_SIZE, min_bytes: int = POOL_MIN_BYTES, arena: Arena | None = None) -> None:
        self.max_bytes, self.max_entries, self.arena = max_bytes, max_entries, arena
        self.per_size, self.min_bytes = per_size, min_bytes
        self._by_size: dict[int, list[_Slot]] = {}
        self._by_key: dict[tuple, _Slot] = {}  # (shape, dtype, phase) -> a slot viewed so: the hot path
        self._lru: OrderedDict[_Slot, None] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._lock = threading.Lock()

    def empty(self, shape, dtype, phase: int | None = None) -> np.ndarray:
        """Like np.empty, but a pooled buffer of the request's size class that nothing
        references any more is reused (as a view) instead of freshly allocated. It starts
        on a POOL_ALIGN_BYTES boundary, or given `phase` (an address) at its offset modulo
        COPY_PHASE_BYTES, rounded down to the dtype's alignment: where the result is copied
        from memory that lies so (config.COPY_PHASE_BYTES says why). An Arena's block without
        the room for it, and a result the pool does not keep (a plain np.empty), ignore it.

        Example:
            >>> pool = Pool()
            >>> a = pool.empty((1 << 15,), np.float32); address = a.ctypes.data; del a
            >>> pool.empty((1 << 15,), np.float32).ctypes.data == address
            True
            >>> pool.empty((1 << 15,), np.float32, phase=4096 + 16).ctypes.data % 64
            16
        """
        dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)  # the callers' usual case, at a quarter of the cost
        shape = tuple(shape)
        nbytes = dtype.itemsize * math.prod(shape)
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        key = (shape, dtype, None if phase is None else phase % COPY_PHASE_BYTES // dtype.alignment * dtype.alignment)
        with self._lock:
            # The hot path, a shape asked for again: its last buffer, if free, as it was.
            slot = self._by_key.get(key)
            if slot is not None and _getrefcount(slot.view) == _FREE_VIEW \
                    and _getrefcount(slot.base) == _FREE_BASE:
                self._lru.move_to_end(slot)
                return slot.view
            return self._reuse_or_add(key, nbytes)

    def _reuse_or_add(self, key: tuple, nbytes: int) -> np.ndarray:
        """A free buffer of the request's size class, viewed as `key` says; else a new one."""
        shape, dtype, _ = key
        if dtype.hasobject:  # object arrays cannot view bytes
            return np.empty(shape, dtype)
        size = size_class(nbytes)
        slots = self._by_size.get(size)
        if slots is not None:
            for slot in slots:
                if _is_free(slot):
                    self._lru.move_to_end(slot)
                    if slot.key != key:
                        self._unkey(slot)
                        slot.view_as(key)
                    self._by_key[key] = slot
                    return slot.view
            if len(slots) >= self.per_size:  # all held: this one is the caller's alone
                return np.empty(shape, dtype)
        if size > self.max_bytes or self.max_entries < 1:
            return np.empty(shape, dtype)
        while self._bytes + size > self.max_bytes or len(self._lru) >= self.max_entries:
            self._evict()
        base = None
        if self.arena is not None:
            base = self.arena.take(size)
            while base is None and self._evict_free():  # room the pool's free buffers take
                base = self.arena.take(size)
            if base is None:
                return np.empty(shape, dtype)
        slot = _Slot(size, key, base)
        self._by_size.setdefault(size, []).append(slot)
        self._by_key[key] = slot
        self._lru[slot] = None
        self._bytes += size
        return slot.view

    def _unkey(self, slot: _Slot) -> None:
        if self._by_key.get(slot.key) is slot:
            del self._by_key[slot.key]

    def _evict(self) -> None:
        """Drop the least recently used free buffer; failing that (every buffer is held),
        forget the least recently used held one: its holder keeps it alive, and it is freed
        with the holder's last reference instead of staying in the pool after."""
        if not self._evict_free():
            self._drop(next(iter(self._lru)))

    def _evict_free(self) -> bool:
        """Drop the least recently used free buffer, if any (its memory goes back to the heap
        or the arena at once); whether there was one."""
        victim = next((slot for slot in self._lru if _is_free(slot)), None)
        if victim is not None:
            self._drop(victim)
        return victim is not None

    def _drop(self, victim: _Slot) -> None:
        del self._lru[victim]
        self._unkey(victim)
        size = victim.size
        slots = self._by_size[size]
        slots.remove(victim)
        if not slots:
            del self._by_size[size]
        self._bytes -= size

    def kept(self) -> tuple[int, int]:
        """(buffers, bytes) the pool keeps now.

        Example:
            >>> Pool().kept()
            (0, 0)
        """
        with self._lock:
            return len(self._lru), self._bytes

    def clear(self) -> None:
        """Forget every buffer (held ones live on with their holders).

        Example:
            >>> pool = Pool(); _ = pool.empty((1 << 16,), np.uint8); pool.clear(); pool.kept()
            (0, 0)
        """
        with self._lock:
            self._by_size.clear()
            self._by_key.clear()
            self._lru.clear()
            self._bytes = 0


# The process's pool: every collective's results.
POOL = Pool()
empty = POOL.empty
