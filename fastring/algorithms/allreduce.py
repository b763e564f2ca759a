"""Host allreduce algorithms over a flat, contiguous buffer, reduced in place.

Each has `accepts(message)` (would it take this message under FASTRING_ALGORITHM=auto),
`available(message)` (can it run it at all, when forced by name) and `run(rt, reduction)`.
`run` calls `reduction.finalize(view)` exactly once per element on fully reduced data, so
Average's division and the postscale touch 1/N of the buffer in the ring instead of all of
it. Which one runs is `fastring.algorithms.registry.choose`.
"""
from __future__ import annotations

import numpy as np

from .. import kernels
from .._core.config import SMALL_MESSAGE_BYTES, WIRE_SEGMENT_ELEMENTS, WIRE_STREAM_SEGMENT_ELEMENTS
from .._core.ops import KERNEL_OP, MPI_BOOL_OP, MPI_OP
from .._transport import array_address, ring_reduce_scatter_to
from .base import Message, Reduction, chunk_offsets, ring_segment
from .choice import choice_of


class InCycle:
    """Small host allreduces travel inside the negotiation cycle that agrees on them: every
    rank proposes the same request and the cycle's own exchange reduces its bytes, so a lone
    synchronous small allreduce costs one message exchange. The engine's negotiation runs it;
    a small message that did not ride in a cycle takes the next algorithm that accepts it."""

    name = "in_cycle"
    selectable = False

    @staticmethod
    def fits(nbytes: int, device: str = "cpu", wire: str | None = None) -> bool:
        """Whether a message of this size, device and wire format fits in a cycle."""
        return nbytes <= SMALL_MESSAGE_BYTES and wire is None and device == "cpu"

    @staticmethod
    def accepts(m: Message) -> bool:
        return m.may_ride_cycle and InCycle.fits(m.nbytes, m.device, m.wire)

    available = accepts

    @staticmethod
    def run(rt, r: Reduction) -> None:
        raise AssertionError("the negotiation cycle reduces in-cycle messages itself")


class CompressedRing:
    """The ring with 16-bit messages. It reads the input where it lies (scaled by mul / div
    as it is read), never copies it, and keeps no float accumulator: each rank combines a
    received 16-bit partial result with its own input in float32/float64 and re-encodes it in
    one pass per segment. The allgather circulates the encoded result and every rank, the
    owner of a chunk included, decodes the same bits: results are bitwise identical."""

    name = "compressed_ring"
    selectable = False

    @staticmethod
    def accepts(m: Message) -> bool:
        return m.wire is not None and m.device == "cpu"

    available = accepts

    @staticmethod
    def run(rt, r: Reduction) -> None:
        """flat = round16(reduce(src * mul / div) * post) for r.scale = (mul, div, post); src
        (r.flat itself when r.src is None) and flat are float32/float64 arrays of one size."""
        dst = r.flat
        src = dst if r.src is None else r.src
        wire, op, phase = r.wire, r.op, r.phase
        count, acc = dst.size, dst.dtype
        mul, div, post = r.scale
        if rt.size == 1:  # no wire, but the same single rounding to 16 bits
            with phase("reduce-scatter"):
                if src is not dst:
                    np.copyto(dst, src)
                if mul != 1.0:
                    kernels.scale_into(dst, mul)
                if div != 1.0:
                    kernels.divide_into(dst, int(div))
                if post != 1.0:
                    kernels.scale_into(dst, post)
                bits = rt.scratch(2 * count)[:2 * count].view(np.uint16)
                kernels.encode16(dst, bits, wire)
                kernels.decode16(bits, dst, wire)
            return
        offsets = chunk_offsets(count, rt.size, 1)
        steps = [kernels.wire_cfunc(step, wire, KERNEL_OP[op], acc) for step in kernels.WIRE_STEPS]

        def ring(segment: int) -> None:
            tmp = rt.scratch(6 * segment)  # three segments of 16-bit values
            with phase("reduce-scatter+allgather"):  # interleaved, segment by segment
                rt.transport.ring_allreduce_wire(array_address(src), array_address(dst), offsets,
                                                 array_address(tmp), segment, *steps, acc.itemsize,
                                                 mul, div, post)
        small, large = WIRE_SEGMENT_ELEMENTS, WIRE_STREAM_SEGMENT_ELEMENTS
        if -(-count // rt.size) > small and large != small:  # a chunk beyond the small segment: a choice
            choice_of(rt, f"compressed ring segments {small}/{large}", (small, large)).run(rt, dst.nbytes, ring)
        else:
            ring(small)


class MpiNative:
    """The MPI library's own MPI_Allreduce: lowest latency for small messages."""

    name = "mpi"
    selectable = True

    @staticmethod
    def accepts(m: Message) -> bool:
        return m.spec.mpi_code is not None and m.nbytes <= SMALL_MESSAGE_BYTES

    @staticmethod
    def available(m: Message) -> bool:
        return m.spec.mpi_code is not None

    @staticmethod
    def run(rt, r: Reduction) -> None:
        flat, spec = r.input_in_flat(), r.spec
        codes = MPI_BOOL_OP if spec.name == "bool" else MPI_OP
        addr = array_address(flat)
        with r.phase("mpi-allreduce"):
            rt.transport.mpi_allreduce(addr, addr, flat.size, spec.mpi_code, codes[r.op])
            r.finalize(flat)


class RecursiveDoubling:
    """log2(N) whole-buffer exchanges, reducing with fastring's kernels (any dtype)."""

    name = "recursive_doubling"
    selectable = True

    @staticmethod
    def accepts(m: Message) -> bool:
        return m.nbytes <= SMALL_MESSAGE_BYTES

    @staticmethod
    def available(m: Message) -> bool:
        return True

    @staticmethod
    def run(rt, r: Reduction) -> None:
        flat, spec = r.input_in_flat(), r.spec
        with r.phase("recursive-doubling"):
            if rt.size > 1:
                tmp = rt.scratch(flat.nbytes)
                rt.transport.recursive_doubling(array_address(flat), flat.nbytes, array_address(tmp),
                                                kernels.reduce_cfunc(KERNEL_OP[r.op], spec.dtype),
                                                spec.dtype.itemsize)
            r.finalize(flat)


class Ring:
    """Bandwidth-optimal ring: reduce-scatter in cache-sized segments, then allgather. It reads
    an unscaled input (`r.src`) where it lies, without copying it into the result first."""

    name = "ring"
    selectable = True

    @staticmethod
    def accepts(m: Message) -> bool:
        return True

    available = accepts

    @staticmethod
    def run(rt, r: Reduction) -> None:
        flat, spec, src = r.flat, r.spec, r.src
        itemsize = spec.dtype.itemsize
        offsets = chunk_offsets(flat.size, rt.size, itemsize)
        segment = ring_segment(rt, itemsize)
        reduce_fn = kernels.reduce_cfunc(KERNEL_OP[r.op], spec.dtype)
        with r.phase("reduce-scatter"):
            if src is not None:
                ring_reduce_scatter_to(rt.transport, array_address(src), offsets, array_address(flat),
                                       segment, reduce_fn, itemsize)
            elif rt.size > 1:
                tmp = rt.scratch(2 * segment)
                rt.transport.ring_reduce_scatter(array_address(flat), offsets, array_address(tmp), segment,
                                                 reduce_fn, itemsize)
            lo, hi = offsets[rt.rank] // itemsize, offsets[rt.rank + 1] // itemsize
            r.finalize(flat[lo:hi])
        with r.phase("allgather"):
            if rt.size > 1:
                rt.transport.ring_allgather(array_address(flat), offsets)
