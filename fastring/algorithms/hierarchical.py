"""The hierarchical allreduce, for jobs of several hosts with several ranks each.

A flat ring over N = H hosts x L ranks (ranks placed host by host) sends 2 (N - 1) / N of the
buffer through every link of the ring, the hosts' network links included, in 2 (N - 1) steps.
The hierarchy sends 2 (H - 1) / H of it through each host's network link, in 2 (H - 1) steps
across hosts, and the rest of the work moves through memory:

1. reduce-scatter within the host: local rank j ends with chunk j summed over its host;
2. every local rank j runs a ring across hosts over chunk j alone (the L rings run at once,
   each carrying 1/L of the buffer: the host's link carries one buffer's ring traffic in all);
3. allgather within the host.

Phases 1 and 3 use the host-level transport (`rt.hierarchy`), which today is MPI over
shared memory; a faster one-host path plugs in there. Under compression only phase 2 moves
16-bit values (the compressed ring, whose result every rank decodes alike), so the host
phases keep full precision and every rank still ends with the same bits.
"""
from __future__ import annotations

import weakref

from .. import kernels
from .._core.config import SMALL_MESSAGE_BYTES
from .._core.ops import KERNEL_OP
from .._transport import array_address, ring_reduce_scatter_to
from .allreduce import CompressedRing, Ring
from .base import Message, Reduction, chunk_offsets, ring_segment


class Level:
    """One level of the hierarchy as the flat algorithms see a runtime: its transport, this
    rank's place in it and the runtime's scratch buffer. Kept one per runtime and level, so
    that what the compressed ring learns about segment sizes persists."""

    __slots__ = ("transport", "rank", "size", "crosses_hosts", "_runtime", "__weakref__")

    def __init__(self, rt, transport, crosses_hosts: bool):
        self.transport, self.rank, self.size = transport, transport.rank, transport.size
        self.crosses_hosts = crosses_hosts
        self._runtime = weakref.ref(rt)  # a strong one would keep `_levels`' key alive forever

    def scratch(self, nbytes: int):
        return self._runtime().scratch(nbytes)


_levels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def levels(rt) -> tuple[Level, Level]:
    """(host level, cross-host level) of a runtime whose `hierarchy` is set."""
    found = _levels.get(rt)
    if found is None:
        (host, _), (cross, _) = rt.hierarchy
        found = _levels[rt] = (Level(rt, host, False), Level(rt, cross, True))
    return found


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
        segment = ring_segment(local, itemsize)
        reduce_fn = kernels.reduce_cfunc(KERNEL_OP[r.op], dtype)
        with r.phase("host reduce-scatter"):
            if src is not None:
                ring_reduce_scatter_to(local.transport, array_address(src), offsets, array_address(flat),
                                       segment, reduce_fn, itemsize)
            else:
                tmp = rt.scratch(2 * segment)
                local.transport.ring_reduce_scatter(array_address(flat), offsets, array_address(tmp), segment,
                                                    reduce_fn, itemsize)
        lo, hi = offsets[local.rank] // itemsize, offsets[local.rank + 1] // itemsize
        part = Reduction(flat[lo:hi], r.spec, r.op, r.finalize, r.phase, wire=r.wire, scale=r.scale)
        (Ring if r.wire is None else CompressedRing).run(cross, part)
        with r.phase("host allgather"):
            local.transport.ring_allgather(array_address(flat), offsets)
