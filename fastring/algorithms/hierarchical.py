"""The hierarchical collectives, for jobs of several hosts with several ranks each.

A flat ring over N = H hosts x L ranks (ranks placed host by host) sends 2 (N - 1) / N of the
buffer through every link of the ring, the hosts' network links included, in 2 (N - 1) steps.
The hierarchical allreduce sends 2 (H - 1) / H of it through each host's network link, in
2 (H - 1) steps across hosts, and the rest of the work moves through memory:

1. reduce-scatter within the host: local rank j ends with chunk j summed over its host;
2. every local rank j runs a ring across hosts over chunk j alone (the L rings run at once,
   each carrying 1/L of the buffer: the host's link carries one buffer's ring traffic in all);
3. allgather within the host.

Phases 1 and 3 go through the host's shared segment (`rt.host_shm`, one per host, which
simulated hosts' namespaces share too); where none could be mapped, through the host-level
transport (MPI). Under compression only phase 2 moves 16-bit values (the compressed ring,
whose result every rank decodes alike), so the host phases keep full precision and every
rank still ends with the same bits.

The allgather takes the same shape where a segment carries the host part (without one, the
host part would be MPI messages through the kernel, and the flat ring wins): across hosts
each host's link carries (H - 1) / H of the result instead of the flat ring's (N - 1) / N.
A broadcast has no such saving: the chain already sends the bytes through each host's link
once, at the wire's rate, and a hierarchical one measured slower (BENCHMARKS.md, issue #15).
"""
from __future__ import annotations

import queue
import threading
import weakref

import numpy as np

from .. import kernels
from .._core.config import HIERARCHY_CHUNK_BYTES, HIERARCHY_SLICE_BYTES, SMALL_MESSAGE_BYTES
from .._core.ops import KERNEL_OP
from .._transport import array_address, ring_reduce_scatter_to
from .allreduce import CompressedRing, Ring
from .base import Message, Reduction, chunk_offsets, ring_segment


class Level:
    """One level of the hierarchy as the flat algorithms see a runtime: its transport, this
    rank's place in it, the runtime's scratch buffer, and its own timed choices (`choices`,
    as a runtime's: the compressed ring's segment size, timed on this level's calls). Kept one
    per runtime and level, so that what the compressed ring learns persists."""

    __slots__ = ("transport", "rank", "size", "crosses_hosts", "choices", "_runtime", "_part")

    def __init__(self, rt, transport, crosses_hosts: bool):
        self.transport, self.rank, self.size = transport, transport.rank, transport.size
        self.crosses_hosts = crosses_hosts
        self.choices: dict = {}
        self._runtime = weakref.ref(rt)  # a strong one would keep `_hosts`' key alive forever
        self._part = np.empty(0, np.uint8)

    def scratch(self, nbytes: int):
        return self._runtime().scratch(nbytes)

    def part(self, nbytes: int) -> np.ndarray:
        """A byte buffer of at least `nbytes` apart from `scratch`, which the flat algorithms
        run inside a hierarchical one use (grown, never shrunk)."""
        if self._part.nbytes < nbytes:
            self._part = np.empty(max(nbytes, 2 * self._part.nbytes), np.uint8)
        return self._part


class Hosts:
    """The hierarchy of a runtime: its two levels and, for every host (by cross rank), the
    runtime ranks of its local ranks in local-rank order. Ranks need not be placed host by
    host."""

    __slots__ = ("local", "cross", "ranks", "in_order", "_helper", "__weakref__")

    def __init__(self, rt):
        (host, host_ranks), (cross, _) = rt.hierarchy
        self.local, self.cross = Level(rt, host, False), Level(rt, cross, True)
        # Every host's rank j sends its host's list along its cross-host level: all alike.
        self.ranks: list[list[int]] = cross.comm.allgather(list(host_ranks))
        # Cross ranks order the hosts by the rank of their local rank j, which may differ
        # between the j's: a walk over the hosts that every local rank takes alike goes by
        # each host's lowest rank (its local rank 0) instead.
        self.in_order = sorted(range(len(self.ranks)), key=lambda c: self.ranks[c][0])
        self._helper = None

    def helper(self) -> "Helper":
        """The thread that runs the host segment's work beside this one (started once, and
        stopped when this hierarchy goes with its runtime)."""
        if self._helper is None:
            self._helper = Helper()
            weakref.finalize(self, self._helper.stop)
        return self._helper

    def abandon_helper(self) -> None:
        self._helper = None


class Helper:
    """A daemon thread that runs one job at a time beside the caller: the host segment's
    work while the caller's thread drives the ring across hosts (both release the GIL). A
    daemon, so that a job left waiting for a peer that failed never holds up the exit."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="fastring-host-segment", daemon=True).start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
                self._done.put(None)
            except BaseException as e:  # handed to the caller, whose collective fails with it
                self._done.put(e)

    def start(self, job) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        """End the thread once it has run what it was given."""
        self._jobs.put(None)

    def wait(self) -> None:
        error = self._done.get()
        if error is not None:
            raise error


_hosts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def hosts(rt) -> Hosts:
    """The hierarchy of a runtime whose `hierarchy` is set. Collective the first time (every
    rank calls it at the same collective: the hierarchical ones are chosen alike)."""
    found = _hosts.get(rt)
    if found is None:
        found = _hosts[rt] = Hosts(rt)
    return found


def levels(rt) -> tuple[Level, Level]:
    """(host level, cross-host level) of a runtime whose `hierarchy` is set."""
    h = hosts(rt)
    return h.local, h.cross


def _segment(rt):
    """The host's shared segment under a hierarchy, or None."""
    return getattr(rt, "host_shm", None) if getattr(rt, "hierarchy", None) is not None else None


class Hierarchical:
    """Reduce-scatter within the host, one ring across hosts per local rank at once,
    allgather within the host (see the module docstring). Chosen for large host allreduces,
    compressed or not, wherever `rt.hierarchy` is set (several hosts with the same number
    of ranks, more than one); FASTRING_ALGORITHM=<name> runs the flat algorithm instead."""

    name = "hierarchical"
    selectable = False

    @staticmethod
    def accepts(m: Message) -> bool:
        rt = m.rt
        return (rt is not None and getattr(rt, "hierarchy", None) is not None and m.device == "cpu"
                and m.nbytes > SMALL_MESSAGE_BYTES and rt.config.algorithm == "auto")

    available = accepts

    @staticmethod
    def run(rt, r: Reduction) -> None:
        """r.flat = allreduce(r.src or r.flat); under compression (r.wire) as the compressed
        ring computes it, with r.scale applied in the cross-host phase (the host phase only
        sums, and scaling a sum is scaling its terms)."""
        local, cross = levels(rt)
        flat, src = r.flat, r.src
        dtype = flat.dtype if r.wire is not None else r.spec.dtype
        itemsize = dtype.itemsize
        offsets = chunk_offsets(flat.size, local.size, itemsize)
        reduce_fn = kernels.reduce_cfunc(KERNEL_OP[r.op], dtype)
        seg = _segment(rt)
        if seg is not None:
            _through_segment(rt, r, seg, dtype, reduce_fn)
            return
        segment = ring_segment(local, itemsize)
        with r.phase("host reduce-scatter"):
            if src is not None:
                ring_reduce_scatter_to(local.transport, array_address(src), offsets, array_address(flat),
                                       segment, reduce_fn, itemsize)
            else:
                tmp = rt.scratch(2 * segment)
                local.transport.ring_reduce_scatter(array_address(flat), offsets, array_address(tmp), segment,
                                                    reduce_fn, itemsize)
        lo, hi = offsets[local.rank] // itemsize, offsets[local.rank + 1] // itemsize
        _cross(cross, r, flat[lo:hi])
        with r.phase("host allgather"):
            local.transport.ring_allgather(array_address(flat), offsets)


def _cross(cross: Level, r: Reduction, part: np.ndarray) -> None:
    """Phase 2 on this rank's reduced chunk `part`, in place."""
    cut = Reduction(part, r.spec, r.op, r.finalize, r.phase, wire=r.wire, scale=r.scale)
    (Ring if r.wire is None else CompressedRing).run(cross, cut)


def _through_segment(rt, r: Reduction, seg, dtype: np.dtype, reduce_fn) -> None:
    """The three phases with the host's segment, in slices (`slice_bytes`): while
    slice s crosses hosts (this thread), the helper thread reduce-scatters slice s + 1 and
    allgathers slice s - 1 through the segment, in that order on every local rank. Each
    slice's chunk is reduced into a buffer of this rank's own (the segment's reduce-scatter
    may not write where it reads), three in turn, carried across hosts there, and copied
    from there into every local rank's result."""
    h = hosts(rt)
    local, cross = h.local, h.cross
    flat = r.flat
    src = array_address(flat if r.src is None else r.src)
    dst = array_address(flat)
    itemsize = dtype.itemsize
    per = max(1, slice_bytes(cross.size) // itemsize)
    starts = range(0, flat.size, per)
    widest = int(chunk_offsets(min(per, flat.size), local.size, itemsize)[1])  # chunk 0 is the longest
    room = local.part(3 * widest)

    def layout(s: int):
        lo = starts[s]
        offsets = chunk_offsets(min(per, flat.size - lo), local.size, itemsize)
        mine = int(offsets[local.rank + 1] - offsets[local.rank])
        part = room[(s % 3) * widest:(s % 3) * widest + mine].view(dtype)
        return lo * itemsize, offsets, part

    def host_reduce_scatter(s: int) -> None:
        at, offsets, part = layout(s)
        seg.reduce_scatter(src + at, offsets, array_address(part), reduce_fn, itemsize)

    def host_allgather(s: int) -> None:
        at, offsets, part = layout(s)
        seg.gatherv(array_address(part), dst + at, np.diff(offsets), offsets[:-1])

    _pipeline(h, len(starts), lambda s: _cross(cross, r, layout(s)[2]), host_reduce_scatter, host_allgather, r.phase)


def slice_bytes(hosts: int) -> int:
    """The bytes of a slice of the pipelined hierarchy across `hosts` hosts
    (fastring/_core/config.py says why).

    Example:
        >>> slice_bytes(2) >> 20, slice_bytes(128) >> 20
        (8, 128)
    """
    return max(HIERARCHY_SLICE_BYTES, HIERARCHY_CHUNK_BYTES * hosts)


def _beside(h: Hosts, side, main) -> None:
    """side() in the helper thread (through the host's segment) while this one runs main()."""
    helper = h.helper()
    helper.start(side)
    try:
        main()
    except BaseException:
        h.abandon_helper()  # it may still wait on a peer: a later call gets a new one
        raise
    helper.wait()


def _pipeline(h: Hosts, count: int, across, before, after, phase) -> None:
    """For each of `count` slices: before(s) through the host's segment, across(s) across
    hosts, after(s) through the segment; before(s + 1) and after(s - 1) run in the helper
    thread while this one runs across(s), in that order on every local rank. The first
    before and the last after run alone, timed as the timeline's `phase`s."""
    with phase("host reduce-scatter"):
        before(0)

    def beside(s: int) -> None:
        if s > 0:
            after(s - 1)
        if s + 1 < count:
            before(s + 1)

    for s in range(count):
        _beside(h, lambda s=s: beside(s), lambda s=s: across(s))
    with phase("host allgather"):
        after(count - 1)


def allgather_pays(rt, nbytes: int) -> bool:
    """Whether an allgather of `nbytes` (in all) takes the hierarchical path:
    under a hierarchy with the host's segment mapped, above SMALL_MESSAGE_BYTES (below, the
    flat algorithms' fewer calls win). The same answer on every rank: the sizes are agreed and
    the segment is mapped on every rank or on none."""
    return _segment(rt) is not None and nbytes > SMALL_MESSAGE_BYTES and rt.config.algorithm == "auto"


def allgather(rt, out: np.ndarray, offsets: np.ndarray) -> None:
    """Every rank's bytes out[offsets[r]:offsets[r + 1]] (this rank's already there) onto
    every rank: local rank j of every host circulates the bytes of every host's local rank j
    across hosts (a ring over H, into a buffer of its own), then each host's segment
    gathers those beside the host's own into place."""
    h = hosts(rt)
    local, cross, seg = h.local, h.cross, rt.host_shm
    j = local.rank
    sizes = np.diff(offsets)
    # cross-host chunk c: the bytes of host c's local rank j, side by side
    mine = [h.ranks[c][j] for c in range(cross.size)]
    across = np.zeros(cross.size + 1, np.int64)
    np.cumsum(sizes[mine], out=across[1:])
    landing = local.part(int(across[-1]))
    base = array_address(out)

    def gather(c: int) -> None:
        ranks = h.ranks[c]
        src = base + int(offsets[rt.rank]) if c == cross.rank else array_address(landing) + int(across[c])
        seg.gatherv(src, base, sizes[ranks], offsets[ranks])

    # this host's rows move through the segment while the other hosts' cross to this one
    _beside(h, lambda: gather(cross.rank),
            lambda: cross.transport.ring_allgather(array_address(landing), across, own=base + int(offsets[rt.rank])))
    for c in h.in_order:
        if c != cross.rank:
            gather(c)
