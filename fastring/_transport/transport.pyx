# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""`Transport`: the calls the allreduce algorithms and the engine make on one communicator.

Each method checks its arguments, then runs the whole collective in C with the GIL released,
so that a Python thread (the engine's) can keep computing while bytes move. The loops live
in the module of their algorithm (ring, doubling, cycle, broadcast); the chunk reductions
are Numba cfuncs, passed in as C function pointers.
"""

from libc.stdint cimport int64_t, uint64_t, uintptr_t

cimport numpy as cnp

from .broadcast cimport probe_single_copy
from .cycle cimport exchange, lone_payload, lone_result
from .doubling cimport recursive_doubling
from .mpi cimport TransportBase, check_offsets, reduce_fn_t
from .ring cimport (IN_SCRATCH, WireSteps, allgather, allreduce_wire, check_ring_args,
                    reduce_scatter, wire_fn_t)
from .tags cimport Tag

cnp.import_array()


cdef class Transport(TransportBase):
    """Point-to-point byte transfers and whole collectives over one MPI communicator.

    The communicator is duplicated so that fastring's traffic never matches a user's message,
    and its error handler is set to return codes, which become FastringError.

    Example:
        >>> from mpi4py import MPI
        >>> t = Transport(MPI.COMM_WORLD)
        >>> t.rank, t.size
        (0, 1)
    """

    def enable_single_copy(self):
        """Collective: find whether every rank runs on this host and may read and write the
        others' memory with Cross Memory Attach (process_vm_readv/writev; a container or
        ptrace policy may forbid it), by trying it between ring neighbours. Returns the
        answer, the same on every rank, which `single_copy` keeps.

        Example:
            >>> from mpi4py import MPI
            >>> Transport(MPI.COMM_WORLD).enable_single_copy()   # on 1 rank: nothing to copy
            False
        """
        return probe_single_copy(self)

    def ring_reduce_scatter(self, uintptr_t buf, const int64_t[::1] offsets, uintptr_t tmp,
                            int64_t segment_bytes, uintptr_t reduce_fn, int64_t itemsize,
                            int tag=Tag.RING_REDUCE_SCATTER):
        """Reduce chunk c = buf[offsets[c]:offsets[c+1]] (bytes) over all ranks into rank c.

        After return, this rank's chunk `rank` holds the full reduction; other chunks hold
        partial sums. `tmp` must hold 2 * `segment_bytes`; segments are received there while the
        reduction of the previous one still sits in cache.
        """
        check_ring_args(self, offsets.shape[0], segment_bytes, itemsize)
        with nogil:
            reduce_scatter(&self.link, self.rank, self.size, IN_SCRATCH, <char*> buf, &offsets[0],
                           NULL, <char*> tmp, segment_bytes, <reduce_fn_t> reduce_fn, itemsize, tag)

    def ring_allgather(self, uintptr_t buf, const int64_t[::1] offsets,
                       int tag=Tag.RING_ALLGATHER, uintptr_t own=0):
        """Circulate chunk c, held complete by rank c, so that every rank holds every chunk.

        With `own`, this rank's chunk is sent from there rather than from its place in buf
        (which it may then fill before or after). A buffer that another rank's copy has just
        read is slow to write again (its cache lines are shared with that core), so sending
        from the caller's input leaves the result's lines to this rank alone.
        """
        check_offsets(self, offsets.shape[0], "offsets")
        with nogil:
            allgather(&self.link, self.rank, self.size, <char*> buf, &offsets[0],
                      <char*> own if own else <char*> buf + offsets[self.rank], tag)

    def recursive_doubling(self, uintptr_t buf, int64_t nbytes, uintptr_t tmp,
                           uintptr_t reduce_fn, int64_t itemsize, int tag=Tag.RECURSIVE_DOUBLING):
        """Allreduce of a small buffer in log2(N) exchanges; `tmp` must hold nbytes."""
        with nogil:
            recursive_doubling(&self.link, self.rank, self.size, <char*> buf, nbytes,
                               <char*> tmp, <reduce_fn_t> reduce_fn, itemsize, tag)

    def cycle_exchange(self, uintptr_t block, int64_t vector_words, int64_t capacity,
                       uintptr_t tmp, uintptr_t reduce_fn, int64_t itemsize,
                       double stall_seconds, object on_stall, int tag=Tag.CYCLE):
        """One negotiation cycle: an allreduce of a header and an optional speculative payload.

        `block` holds CYCLE_HEADER_WORDS + 2 * `vector_words` uint64 words followed by up to
        `capacity` payload bytes; `tmp` must hold as much. Header word 0 is combined with OR
        (flags); word 1 (the speculative request's hash) and word 2 (its byte count) must agree
        on every rank or word 1 becomes SPECULATION_FAILED; then `vector_words` words are
        combined with AND (ready everywhere) and `vector_words` with OR (pending somewhere).
        When the speculative request agrees, the payloads are reduced with `reduce_fn`.
        Waiting longer than `stall_seconds` for a partner calls `on_stall(partner, waited)`
        (with the GIL), which may raise to abandon the cycle.

        Returns (flags, speculative hash, whether some rank has a request pending that is not
        ready everywhere, whether any request is ready everywhere).
        """
        return exchange(self, block, vector_words, capacity, tmp, reduce_fn, itemsize,
                        stall_seconds, on_stall, tag)

    def lone_cycle(self, uintptr_t block, int64_t vector_words, int64_t capacity, uintptr_t tmp,
                   uintptr_t reduce_fn, int64_t itemsize, double stall_seconds, object on_stall,
                   uint64_t h, cnp.ndarray src not None, cnp.ndarray dst):
        """A cycle (`cycle_exchange`, same first arguments) in which this rank proposes request
        `h` alone, with `src` (C-contiguous, at most `capacity` bytes) as its payload; the bit
        words of `block` must be zero. When the outcome is clean (every rank proposed `h` and
        nothing else waits anywhere) the reduction is copied into `dst` (writeable,
        C-contiguous, as many bytes as `src`; None: it stays in the block's payload). Returns
        (the outcome, whether it was clean): the whole lean path of a small synchronous
        allreduce in one call."""
        lone_payload(block, vector_words, capacity, h, src, dst)
        outcome = exchange(self, block, vector_words, capacity, tmp, reduce_fn, itemsize,
                           stall_seconds, on_stall, Tag.CYCLE)
        return outcome, lone_result(block, vector_words, h, outcome, dst)

    def ring_allreduce_wire(self, uintptr_t src, uintptr_t dst, const int64_t[::1] offsets,
                            uintptr_t tmp, int64_t segment, uintptr_t encode_fn, uintptr_t hop_fn,
                            uintptr_t last_fn, uintptr_t decode_fn, int64_t acc_itemsize,
                            double mul, double div, double post, int tag=Tag.WIRE_RING):
        """Allreduce whose messages travel as 16-bit values: reads `src` (float32/float64,
        scaled by mul / div as it is read), leaves the result in `dst` (same dtype; may be
        `src`). Chunk c is elements offsets[c]..offsets[c+1]; `tmp` holds 3 * `segment`
        uint16.

        On one host the wire is memory, and a 16-bit copy of the whole buffer would cost
        more memory traffic than it saves on the wire. So the ring runs segment by segment:
        segment s of every chunk goes through the whole reduce-scatter and allgather before
        segment s+1 starts, and its 16-bit values only ever live in three segment-sized
        buffers that stay in cache. The input is read once and the result written once.

        Reduce-scatter: a rank encodes the segment it sends first (encode_fn); every later
        one is received, combined with its own input and re-encoded in one pass (hop_fn);
        the last hop (last_fn) rounds the result, postscaled, to 16 bits and decodes it back,
        so the owner holds exactly what the others will decode. Allgather: those 16-bit
        segments circulate and each rank decodes them (decode_fn).
        """
        check_offsets(self, offsets.shape[0], "offsets")
        if segment < 1:
            raise ValueError(f"segment must be positive, got {segment}")
        if self.size < 2:
            raise ValueError("ring_allreduce_wire needs at least 2 ranks")
        cdef WireSteps w
        w.src, w.dst, w.accsize = <char*> src, <char*> dst, acc_itemsize
        w.mul, w.div, w.post = mul, div, post
        w.encode, w.hop, w.last = <wire_fn_t> encode_fn, <wire_fn_t> hop_fn, <wire_fn_t> last_fn
        w.decode = <wire_fn_t> decode_fn
        with nogil:
            allreduce_wire(&self.link, self.rank, self.size, &w, &offsets[0], <char*> tmp,
                           segment, self.wire_roles, tag)
