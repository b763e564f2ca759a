"""How the bytes of allgather, broadcast, alltoall and reducescatter move, once the engine
has agreed that every rank runs them.

- allgather: dim-0 sizes are gathered first, then the ring (`ring_allgather`) circulates the
  rows: (N-1)/N of the result's bytes cross each link once. Through the shared segment the
  sizes travel in the first data round's barrier instead (`allgather_concat`), and a lean
  synchronous call (Engine.lone_run) already learned them in its negotiation cycle.
- broadcast: when every rank is on one host, large messages are copied straight between
  the ranks' memories (`single_copy_broadcast`): the root writes the leading part of the
  bytes into each rank while every rank reads the rest, so the root copies too instead of
  waiting. Otherwise a binomial tree for small messages and on two ranks; above that a
  chain, pipelined in segments, whose time hardly grows with N.
- alltoall: the row counts are exchanged first, then N-1 pairwise exchange steps; through
  the shared segment they travel in the first data round's barrier, or, in a lean call, in
  its negotiation cycle.
- reducescatter: a ring reduce-scatter that receives partial results straight into scratch
  and reduces this rank's input into them, so the input is neither copied nor modified and
  the last step lands in the result.

When every rank runs on this host with the shared segment mapped (`rt.shm`), the data of all
four go through it up to SHM_COLLECTIVE_MAX_BYTES (reducescatter's up to
SHM_REDUCESCATTER_MAX_BYTES); where the ranks may copy between their
memories, allgather and alltoall at every size (up to SHM_STREAM_EXCHANGE_MAX_BYTES of output
streamed through the ranks' rings in pieces, above it copied straight between the ranks'
buffers: fastring/_transport/shm.pyx); broadcast streams through the root's ring up to
SHM_STREAM_BROADCAST_MAX_BYTES, or takes the single-copy broadcast above where the calls of
its size measured that faster (`SharedMemoryBroadcast`). Allgather and alltoall results come
from `rt.results`: on one host the segment's results area, into which every rank writes its
bytes directly where every rank knows the counts (`_exchange`).
"""
from __future__ import annotations

import functools
import itertools
import logging
import math
import os
from typing import NamedTuple

import numpy as np

from .. import kernels
from .._core import pool as _pool
from .._core.config import (BROADCAST_CHAIN_BYTES, BROADCAST_SEGMENT_BYTES, BROADCAST_SINGLE_COPY_BYTES,
                            CYCLE_GATHER_BYTES, POOL_ALIGN_BYTES, SHM_COLLECTIVE_MAX_BYTES, SHM_REDUCESCATTER_MAX_BYTES,
                            SHM_STREAM_BROADCAST_MAX_BYTES, SHM_STREAM_EXCHANGE_MAX_BYTES, SHM_TIMED_CHOICE_MIN_BYTES,
                            SMALL_MESSAGE_BYTES)
from .._core.dtypes import spec_of
from .._core.ops import KERNEL_OP, ReduceOp
from .._core.work import AllreduceWork, Finish, finalizer, predivides, prescale, split_for_average, unpack, work_of
from .._transport import (array_address, chain_broadcast, copy_from_array, gather_strided, is_c_contiguous,
                          pairwise_alltoall, ring_reduce_scatter_into, single_copy_broadcast, tree_broadcast)
from .._transport.shm import EXCHANGE_BY_SIZE, EXCHANGE_DIRECT, EXCHANGE_SINGLE_COPY, EXCHANGE_STREAM
from . import hierarchical
from .base import Message, chunk_offsets, ring_segment
from .choice import choice_of, timed_stores

log = logging.getLogger("fastring")


def row_bytes(arr: np.ndarray) -> int:
    return arr.dtype.itemsize * math.prod(arr.shape[1:])


def byte_offsets(counts: np.ndarray, unit: int) -> np.ndarray:
    """Byte offsets of consecutive blocks of counts[i] units of `unit` bytes."""
    # Python ints: for a few ranks, NumPy's per-call overhead would dominate
    return np.array([0, *itertools.accumulate(c * unit for c in counts.tolist())], np.int64)


@functools.lru_cache(maxsize=None)
def _one_word_each(size: int) -> np.ndarray:
    """Offsets for exchanging one int64 with every rank (read-only, shared)."""
    offsets = byte_offsets(np.ones(size, np.int64), 8)
    offsets.flags.writeable = False
    return offsets


def gather_counts(rt, value) -> np.ndarray:
    """Every rank's `value` in rank order: shape (size,) for an int, (size, k) for a 1-d
    array of k ints (k equal on every rank). An allgather: through the shared segment on one
    host, else the ring."""
    mine = np.asarray(value, np.int64)
    counts = np.zeros((rt.size,) + mine.shape, np.int64)
    counts[rt.rank] = mine
    if rt.size > 1:
        offsets = _one_word_each(rt.size) * mine.size
        if rt.shm is not None:
            rt.shm.gatherv(array_address(counts) + int(offsets[rt.rank]), array_address(counts),
                           np.diff(offsets), offsets[:-1])
        else:
            rt.transport.ring_allgather(array_address(counts), offsets)
    return counts


def allgather_rows(rt, src: np.ndarray, counts: np.ndarray, out: np.ndarray) -> None:
    """Concatenate every rank's rows into `out` (C-contiguous; counts[r] rows from rank r)."""
    offsets = byte_offsets(counts, row_bytes(out))
    start = sum(counts.tolist()[:rt.rank])
    np.copyto(out[start:start + src.shape[0]], src)
    if rt.size > 1 and offsets[-1] and _through_segment(rt, int(offsets[-1])):
        mine = array_address(out) + int(offsets[rt.rank])
        rt.shm.gatherv(mine, array_address(out), np.diff(offsets), offsets[:-1])
    elif rt.size > 1 and hierarchical.allgather_pays(rt, int(offsets[-1])):
        hierarchical.allgather(rt, out, offsets)
    elif rt.size > 1 and offsets[-1]:
        # The others read this rank's rows from its input, not from `out`, which stays
        # quick to write the next time it is handed out (see Transport.ring_allgather).
        own = array_address(src) if src.size and is_c_contiguous(src) else 0
        rt.transport.ring_allgather(array_address(out), offsets, own=own)


def _own_copy(rows: np.ndarray) -> np.ndarray:
    """An allgather's, alltoall's or reducescatter's result on one rank: its own rows, in a
    pooled buffer. The general paths' offsets and transport calls cost a 64-byte call 8-9 us
    there, against MPI's whole call's 1.0-1.5 (BENCHMARKS.md, "Round 2, session 27")."""
    out = _pool.empty(rows.shape, rows.dtype)
    np.copyto(out, rows)
    return out


def total_of(counts: np.ndarray) -> int:
    """The sum of an int64 array of row counts, as an int: through a list for the lean calls'
    few counts, where numpy's reduction costs about a microsecond however small the array.

    Example:
        >>> total_of(np.array([[1, 2], [3, 4]], np.int64))
        10
    """
    return sum(counts.ravel().tolist()) if counts.size <= 64 else int(counts.sum())


_EXCHANGE_WAYS = {"stream": EXCHANGE_STREAM, "single copy": EXCHANGE_SINGLE_COPY}
_EXCHANGE_NAMES = tuple(_EXCHANGE_WAYS)


def _exchange(rt, collective: str, nbytes: int | None, call):
    """`call(way)` of an allgather or alltoall through the segment (`way`: an EXCHANGE_*),
    whose result comes from `rt.results`. Where every rank knows the call's bytes alike
    (`nbytes`, the lean path's): where results come from the segment's results area (alike on
    every rank), written straight into every rank's result (streamed where one has no room
    there); otherwise streamed or by single copy, whichever the calls of that size measured
    faster (`TimedChoice`: on an Intel Xeon single copy beat the stream at 1 and 16 MiB, the
    stream was chosen for the AMD Zen 3 the sizes were set on; BENCHMARKS.md, "Round 2,
    session 8"). Otherwise by size."""
    if not _direct_size(nbytes):
        return call(EXCHANGE_BY_SIZE)
    if rt.results.arena is not None:
        return call(EXCHANGE_DIRECT)
    return choice_of(rt, collective, _EXCHANGE_NAMES).run(rt, nbytes, lambda way: call(_EXCHANGE_WAYS[way]))


def _direct_size(nbytes: int | None) -> bool:
    """Whether a lean exchange of `nbytes` in all (every rank's output together; None: not
    known alike) may choose its way, the direct one included (`_exchange`)."""
    return nbytes is not None and SHM_TIMED_CHOICE_MIN_BYTES <= nbytes <= SHM_STREAM_EXCHANGE_MAX_BYTES


def _by_rows(rt, nbytes: int | None) -> bool:
    """Whether an allgather or alltoall of `nbytes` in all (None: not known alike) goes
    through the segment's calls that learn the row counts on the way
    (`SharedSegment.allgather_rows`, `alltoall_rows`): where the ranks may copy between their
    memories, or where its results are written straight into the results area's (no such copy
    needed: `_exchange`); other sizes then take the MPI paths, faster than the segment's
    buffers without single copy."""
    return rt.size > 1 and rt.shm is not None and (
        rt.transport.single_copy or (_direct_size(nbytes) and rt.results.arena is not None))


def allgather_concat(rt, arr: np.ndarray, counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's rows of `arr` concatenated in rank order, in a pooled buffer, and the
    rows that came from each rank. `counts`: those rows, where every rank already knows them
    (the lean path's negotiation cycle carried them); otherwise, where the segment takes
    allgathers at every size, they travel in the data round's barrier
    (`SharedSegment.allgather_rows`), and elsewhere they are gathered first."""
    if rt.size == 1:
        return np.array([arr.shape[0]], np.int64), _own_copy(arr)
    unit = row_bytes(arr)
    nbytes = None if counts is None else total_of(counts) * unit
    if _by_rows(rt, nbytes):
        src = arr if is_c_contiguous(arr) else np.ascontiguousarray(arr)
        return _exchange(rt, "allgather", nbytes,
                         lambda way: rt.shm.allgather_rows(
                             array_address(src), src.shape[0], unit,
                             lambda rows: rt.results.empty((total_of(rows),) + arr.shape[1:], arr.dtype), counts, way))
    if counts is None:
        counts = gather_counts(rt, arr.shape[0])
    out = _pool.empty((int(counts.sum()),) + arr.shape[1:], arr.dtype)
    allgather_rows(rt, arr, counts, out)
    return counts, out


def _through_segment(rt, nbytes: int, single_copy: bool = True) -> bool:
    """Whether a collective's data of `nbytes` moves through the shared segment (the same
    answer on every rank: the sizes are agreed): through its buffers up to
    SHM_COLLECTIVE_MAX_BYTES, and at any size where the segment's calls copy straight between
    the ranks' memories, for the collectives that do (`single_copy`)."""
    return rt.shm is not None and (nbytes <= SHM_COLLECTIVE_MAX_BYTES or (single_copy and rt.transport.single_copy))


def allgather_bytes(rt, data: bytes) -> list[bytes]:
    """Every rank's `data`, in rank order: the lengths, then the bytes, by the ring (so every
    wait is the transport's, with its stall deadline).

    Example:
        >>> import fastring
        >>> from fastring._core.runtime import runtime
        >>> fastring.init()
        >>> allgather_bytes(runtime(), b"abc")   # one rank
        [b'abc']
    """
    mine = np.frombuffer(data, np.uint8)
    counts = gather_counts(rt, mine.size)
    out = np.empty(int(counts.sum()), np.uint8)
    allgather_rows(rt, mine, counts, out)
    bounds = byte_offsets(counts, 1)
    return [out[bounds[r]:bounds[r + 1]].tobytes() for r in range(rt.size)]


class SharedMemoryBroadcast:
    """Every rank on one host with the shared segment mapped, up to
    SHM_STREAM_BROADCAST_MAX_BYTES: the root streams the bytes through its ring in the segment
    and the others copy each piece out as it lands (`SharedSegment.stream_broadcast`), no
    barrier and no MPI message; or, where the ranks may copy between their memories, the
    single-copy broadcast (`SingleCopyBroadcast`), whichever the calls of that size measured
    faster (`TimedChoice`): the stream was up to 2x faster on one machine (AMD Zen 3) and
    1.7-2.7x slower on another (an Intel Xeon; BENCHMARKS.md, "Round 2, session 8")."""

    name = "shm"
    ways = ("stream", "single copy")

    @staticmethod
    def accepts(m: Message) -> bool:
        return m.rt.shm is not None and m.nbytes <= SHM_STREAM_BROADCAST_MAX_BYTES

    @staticmethod
    def run(rt, buf: np.ndarray, root: int) -> None:
        def broadcast(way: str) -> None:
            if way == "stream":
                rt.shm.stream_broadcast(array_address(buf), buf.nbytes, root)
            else:
                SingleCopyBroadcast.run(rt, buf, root)
        if SingleCopyBroadcast.fits(rt, buf.nbytes):
            choice_of(rt, "broadcast", SharedMemoryBroadcast.ways).run(rt, buf.nbytes, broadcast)
        else:
            broadcast("stream")


class SingleCopyBroadcast:
    """Every rank on one host: the root writes the leading part of the bytes into each rank
    while every rank reads the rest (Cross Memory Attach), so the root copies too; with the
    shared segment mapped, the addresses and statuses go through it instead of MPI messages
    (a 64 KiB broadcast's fixed cost)."""

    name = "single_copy"

    @staticmethod
    def accepts(m: Message) -> bool:
        return SingleCopyBroadcast.fits(m.rt, m.nbytes)

    @staticmethod
    def fits(rt, nbytes: int) -> bool:
        return rt.transport.single_copy and nbytes >= BROADCAST_SINGLE_COPY_BYTES

    @staticmethod
    def run(rt, buf: np.ndarray, root: int) -> None:
        if rt.shm is None:
            failed = single_copy_broadcast(rt.transport, array_address(buf), buf.nbytes, root)
            again = "as MPI messages"
        else:
            failed = rt.shm.single_copy_broadcast(array_address(buf), buf.nbytes, root)
            if failed:  # every rank alike: the bytes again, through the segment
                rt.transport.disable_single_copy()
                rt.shm.stream_broadcast(array_address(buf), buf.nbytes, root)
            again = "through the shared segment"
        if failed:
            log.warning("single-copy broadcast failed (%s); it was sent %s instead, and no "
                        "collective will copy between the processes from now on", os.strerror(failed), again)


class ChainBroadcast:
    """A chain pipelined in segments: its time hardly grows with the number of ranks."""

    name = "chain"

    @staticmethod
    def accepts(m: Message) -> bool:
        return m.rt.size > 2 and m.nbytes > BROADCAST_CHAIN_BYTES

    @staticmethod
    def run(rt, buf: np.ndarray, root: int) -> None:
        chain_broadcast(rt.transport, array_address(buf), buf.nbytes, root, BROADCAST_SEGMENT_BYTES)


class TreeBroadcast:
    """A binomial tree: log2(N) rounds of whole messages, the latency choice."""

    name = "tree"

    @staticmethod
    def accepts(m: Message) -> bool:
        return True

    @staticmethod
    def run(rt, buf: np.ndarray, root: int) -> None:
        tree_broadcast(rt.transport, array_address(buf), buf.nbytes, root)


def alltoall_rows(rt, arr: np.ndarray, send_rows: np.ndarray,
                  matrix: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Send send_rows[r] consecutive rows of `arr` to rank r; return (the rows received, in
    rank order, and how many came from each rank). `matrix`: every rank's send_rows (row r:
    rank r's), where every rank already knows them (the lean path's negotiation cycle
    carried them)."""
    if rt.size == 1:
        return _own_copy(arr[:int(send_rows[0])]), np.array(send_rows, np.int64)
    unit_bytes = row_bytes(arr)
    nbytes = None if matrix is None else total_of(matrix) * unit_bytes
    if _by_rows(rt, nbytes):
        # unless known, the row counts travel in the data round's barrier (SharedSegment.alltoall_rows)
        src = arr if is_c_contiguous(arr) else np.ascontiguousarray(arr[:int(send_rows.sum())])
        recv_rows, out = _exchange(rt, "alltoall", nbytes,
                                   lambda way: rt.shm.alltoall_rows(
                                       array_address(src), send_rows, unit_bytes,
                                       lambda rows: rt.results.empty((total_of(rows),) + arr.shape[1:], arr.dtype),
                                       matrix, way))
        return out, recv_rows
    if matrix is None and rt.shm is not None:  # every rank learns every rank's row counts
        matrix = gather_counts(rt, send_rows)
    if matrix is not None:
        recv_rows = np.ascontiguousarray(matrix[:, rt.rank])
    else:
        recv_rows = np.empty(rt.size, np.int64)
        unit = _one_word_each(rt.size)
        pairwise_alltoall(rt.transport, array_address(send_rows), unit, array_address(recv_rows), unit)
    out = _pool.empty((int(recv_rows.sum()),) + arr.shape[1:], arr.dtype)
    if unit_bytes:  # equal on every rank: the trailing shape is negotiated
        src = arr if is_c_contiguous(arr) else np.ascontiguousarray(arr[:int(send_rows.sum())])
        sent, received = byte_offsets(send_rows, unit_bytes), byte_offsets(recv_rows, unit_bytes)
        if matrix is not None and _through_segment(rt, int(matrix.sum()) * unit_bytes // rt.size):
            rt.shm.alltoallv(array_address(src), matrix * unit_bytes, sent[:-1], array_address(out), received[:-1])
        else:
            pairwise_alltoall(rt.transport, array_address(src), sent, array_address(out), received)
    return out, recv_rows


class _ScatterPlan(NamedTuple):
    """What a reducescatter derives from its signature alone (`_scatter_plan`)."""
    offsets: np.ndarray  # byte offsets of every rank's rows in the input (read-only)
    out_shape: tuple  # this rank's result
    need_copy: bool  # the input is scaled (prescale, or Average dividing first) into a copy
    reduce_fn: int  # the reduction cfunc
    finalize: Finish | None  # finalizer(work, size): the division and postscale


# (input shape, dtype, work, ranks, rank) -> its _ScatterPlan: training repeats the same
# reducescatter, and deriving the plan every call cost 8-20 us of a 1 MiB call, where it runs
# after the data has left the caches (BENCHMARKS.md, "Round 2, session 25")
_SCATTER_PLANS: dict[tuple, _ScatterPlan] = {}
SCATTER_PLANS_KEPT = 1024  # distinct signatures remembered (then derived each call)


def _scatter_plan(rt, arr: np.ndarray, work: AllreduceWork, counts: np.ndarray | None) -> _ScatterPlan:
    """`reduce_scatter_rows`' plan for `arr` (counts[r] rows to rank r; None: the contract's
    split, and the plan is kept)."""
    key = None if counts is not None else (arr.shape, arr.dtype, work, rt.size, rt.rank)
    plan = _SCATTER_PLANS.get(key)
    if plan is not None:
        return plan
    rows = chunk_offsets(arr.shape[0], rt.size, 1) if counts is None else byte_offsets(counts, 1)
    offsets = rows * row_bytes(arr)
    offsets.flags.writeable = False
    plan = _ScatterPlan(offsets, (int(rows[rt.rank + 1] - rows[rt.rank]),) + arr.shape[1:],
                        work.prescale != 1.0 or predivides(work, rt.size),
                        kernels.reduce_cfunc(KERNEL_OP[work.op], work.spec.dtype), finalizer(work, rt.size))
    if key is not None and len(_SCATTER_PLANS) < SCATTER_PLANS_KEPT:
        _SCATTER_PLANS[key] = plan
    return plan


def reduce_scatter_rows(rt, arr: np.ndarray, work: AllreduceWork, counts: np.ndarray | None = None) -> np.ndarray:
    """This rank's rows of the reduction of every rank's `arr` (split on dim 0: counts[r]
    rows to rank r, by default the first d0 % N ranks one row more), scaled as `work` says;
    `arr` is left as it is."""
    if work.splits_average:
        return _exact_average_rows(rt, arr, work, counts)
    plan = _scatter_plan(rt, arr, work, counts)
    if rt.size == 1:
        out = _own_copy(arr[:plan.out_shape[0]])
        if plan.need_copy:
            prescale(work, out.reshape(-1), 1)
    else:
        out = _reduce_scatter_exchange(rt, arr, work, plan)
    if plan.finalize is not None:
        plan.finalize(out.reshape(-1))
    return out


def _reduce_scatter_exchange(rt, arr: np.ndarray, work: AllreduceWork, plan: _ScatterPlan) -> np.ndarray:
    """`reduce_scatter_rows`' result over more than one rank, before its finish."""
    offsets, itemsize = plan.offsets, work.spec.dtype.itemsize
    total = int(offsets[-1])
    by_segment = rt.shm is not None and total <= SHM_REDUCESCATTER_MAX_BYTES
    # Scratch: for the ring, two chunks; then, when the input must be scaled first, a copy of it.
    scaled_at = 0 if by_segment else -(-2 * int(np.diff(offsets).max()) // 64) * 64
    scratch = rt.scratch(scaled_at + (arr.nbytes if plan.need_copy else 0))
    src = arr
    if plan.need_copy:
        src = scratch[scaled_at:scaled_at + arr.nbytes].view(arr.dtype).reshape(arr.shape)
        np.copyto(src, arr)
        prescale(work, src.reshape(-1), rt.size)
    elif not is_c_contiguous(arr):
        src = np.ascontiguousarray(arr)
    # Two ranks on one host: the ring receives the peer's part of its input straight into `out`
    # by a copy in memory, at full speed where `out` lies as that part does within a line
    # (config.COPY_PHASE_BYTES), taken to be where this rank's own part lies. An input on a
    # line boundary (the frameworks') keeps its result on one too, which JAX and TensorFlow
    # need to take it without a copy. With more ranks the ring receives a partial sum there.
    at = array_address(src)
    phase = (at + int(offsets[rt.rank]) if rt.size == 2 and not (by_segment or rt.crosses_hosts)
             and at % POOL_ALIGN_BYTES else None)
    out = _pool.empty(plan.out_shape, arr.dtype, phase=phase)
    reduce_fn = plan.reduce_fn
    if total and by_segment:
        def reduce_scatter(streaming: bool) -> None:
            rt.shm.reduce_scatter(at, offsets, array_address(out), reduce_fn, itemsize, streaming)
        if total >= SHM_TIMED_CHOICE_MIN_BYTES:
            timed_stores(rt, "reducescatter", total, reduce_scatter)
        else:
            reduce_scatter(False)
    elif total:
        ring_reduce_scatter_into(rt.transport, at, offsets, array_address(out),
                                 array_address(scratch), ring_segment(rt, itemsize), reduce_fn, itemsize)
    return out


def _room(size: int) -> tuple[int, int]:
    """(where the room for rows starts, the bytes of each rank's share of it) in an allgather's
    cycle payload: `size` int64 words, then CYCLE_GATHER_BYTES // size per rank in whole
    words."""
    return 8 * size, 8 * (CYCLE_GATHER_BYTES // size // 8)


def gather_payload(rt, word: int, data: np.ndarray) -> np.ndarray:
    """What an allgather's lean cycle carries for this rank, summed over the ranks: `word`
    (its row count) at entry rt.rank of the first rt.size int64 words, then `data`'s bytes
    in this rank's share of the room that follows, where they fit (else nothing); zeros
    elsewhere. The sum holds every rank's word, and every rank's bytes where they fit
    (`allgather_reduced`), bit for bit."""
    start, share = _room(rt.size)
    copied = 0 < data.nbytes <= share  # else the word alone: the payload is kept
    key = (rt.size, rt.rank, word)
    payload = None if copied else _COUNTS_ONLY.get(key)
    if payload is None:
        payload = np.zeros((start + rt.size * share) // 8, np.int64)
        payload[rt.rank] = word
        if copied:
            at = array_address(payload) + start + rt.rank * share
            if not copy_from_array(at, data):
                copy_from_array(at, np.ascontiguousarray(data))
        elif (len(_COUNTS_ONLY) + 1) * payload.nbytes <= COUNTS_ONLY_BYTES:
            payload.flags.writeable = False
            _COUNTS_ONLY[key] = payload
    return payload


# (ranks, rank, word) -> the payload of a word alone (read-only, shared: building it cost a
# microsecond a call), up to COUNTS_ONLY_BYTES of them
_COUNTS_ONLY: dict[tuple, np.ndarray] = {}
COUNTS_ONLY_BYTES = 4 << 20


def gather_fits(size: int) -> bool:
    """Whether `gather_payload`s of `size` ranks fit in a cycle."""
    start, share = _room(size)
    return start + size * share <= SMALL_MESSAGE_BYTES


def gathered_bytes(rt, reduced: np.ndarray, lengths: list) -> list | None:
    """Every rank's bytes out of `reduced` (a sum of `gather_payload`s), uint8 views of it of
    `lengths` bytes each, or None where one rank's did not fit in its share."""
    start, share = _room(rt.size)
    if max(lengths) > share:
        return None
    room = reduced.view(np.uint8)
    return [room[start + r * share:start + r * share + length] for r, length in enumerate(lengths)]


def allgather_reduced(rt, arr: np.ndarray, reduced: np.ndarray) -> np.ndarray:
    """Every rank's rows of `arr` concatenated, from the sum of the ranks' `gather_payload`s
    (their row counts as the words): out of it where every rank's rows fit there, else by
    `allgather_concat` with the counts it holds."""
    start, share = _room(rt.size)
    counts = reduced[:rt.size]
    unit = row_bytes(arr)
    rows = None if arr.nbytes > share else counts.tolist()  # this rank's did not fit, at least
    if rows is None or max(rows) * unit > share:
        return allgather_concat(rt, arr, counts)[1]
    out = np.empty((sum(rows),) + arr.shape[1:], arr.dtype)
    gather_strided(out, array_address(reduced) + start, share, [r * unit for r in rows])
    return out


def rides_cycle(work: AllreduceWork, size: int) -> bool:
    """Whether a reducescatter of `work` may reduce its whole input as it is, in the cycle
    that agrees on it (`own_rows` then keeps this rank's rows): no scaling before the
    reduction, no integer Average's quotients and remainders."""
    return not work.splits_average and work.prescale == 1.0 and not predivides(work, size)


def own_rows(rt, reduced: np.ndarray, work: AllreduceWork) -> np.ndarray:
    """This rank's rows of `reduced` (every rank's input reduced, as `rides_cycle` allows),
    finished as `reduce_scatter_rows` finishes them (Average's division, the postscale)."""
    rows = chunk_offsets(reduced.shape[0], rt.size, 1)
    out = reduced[int(rows[rt.rank]):int(rows[rt.rank + 1])]
    finalize = finalizer(work, rt.size)
    if finalize is not None:
        finalize(out.reshape(-1))
    return out


def _exact_average_rows(rt, arr: np.ndarray, work: AllreduceWork, counts: np.ndarray | None) -> np.ndarray:
    """reduce_scatter_rows of an integer Average: each row travels as its quotients then its
    remainders (int64, see `split_for_average`), summed, and joined into the exact mean."""
    rows = arr.shape[0]
    width = arr.size // rows if rows else 0
    wide = np.empty(2 * arr.size, np.int64)
    inputs = arr.reshape(-1).astype(np.int64)
    prescale(work, inputs, rt.size)
    split_for_average(inputs, rt.size, wide)
    # row r: [its quotients | its remainders], so that a row's parts stay together
    interleaved = np.concatenate([wide[:arr.size].reshape(rows, width), wide[arr.size:].reshape(rows, width)], axis=1)
    summed = reduce_scatter_rows(rt, interleaved, work_of(spec_of(np.int64), ReduceOp.Sum, 1.0, 1.0),
                                 counts)
    mine = summed.shape[0]
    parts = np.concatenate([summed[:, :width].reshape(-1), summed[:, width:].reshape(-1)])
    return unpack(work, parts, rt.size).astype(arr.dtype).reshape((mine,) + arr.shape[1:])
