# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The negotiation cycle's exchange (Transport.cycle_exchange): recursive doubling of a block

    [flags | speculative hash | payload bytes | vector_words ready bits | vector_words pending bits | payload]

where the header and the bits are combined with OR, agreement and AND, and the payload with
the speculative request's reduction. Only the bytes in use travel: the header and bits, and
the payload only while the hash is a real request's.

A partner may be late by a whole training step, so waits (mpi.pyx's `wait`, as every wait of
the transport) spin briefly, then sleep, and call back into Python every stall_seconds to let
the engine report or abandon the cycle: the cycle has its own hook, not the data phase's.
"""

from cpython.mem cimport PyMem_Calloc, PyMem_Free
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

cimport numpy as cnp

cimport mpi4py.libmpi as mpi
from mpi4py.libmpi cimport MPI_Request

from .doubling cimport Exchange, doubling_allreduce
from .mpi cimport SENT_TO, Link, check, reduce_fn_t, wait, wait1

from .._core.config import WAIT_CYCLE_SPIN_SECONDS

cnp.import_array()

CYCLE_HEADER_WORDS = HEADER_WORDS
SPECULATION_FAILED = 0xFFFFFFFFFFFFFFFF
cdef uint64_t _FAILED = 0xFFFFFFFFFFFFFFFF


cdef struct _Cycle:
    Link link              # the communicator, with the negotiation's stall hook
    int64_t words          # header and bit-vector words
    int64_t vector_words
    int64_t capacity       # payload bytes a block has room for
    reduce_fn_t reduce
    int64_t itemsize
    int tag


cdef tuple exchange(TransportBase t, uintptr_t block, int64_t vector_words, int64_t capacity,
                    uintptr_t tmp, uintptr_t reduce_fn, int64_t itemsize, double stall_seconds,
                    object on_stall, int tag):
    """Transport.cycle_exchange (see there)."""
    cdef _Cycle cyc
    cyc.link.comm = t.comm
    cyc.link.spin = WAIT_CYCLE_SPIN_SECONDS
    cyc.link.interval = stall_seconds if on_stall is not None else 0
    cyc.link.hook = <void*> on_stall if on_stall is not None else NULL
    cyc.words = HEADER_WORDS + 2 * vector_words
    cyc.vector_words = vector_words
    cyc.capacity = capacity
    cyc.reduce = <reduce_fn_t> reduce_fn
    cyc.itemsize = itemsize
    cyc.tag = tag
    cdef Exchange x
    x.ctx = &cyc
    x.send, x.recv, x.swap = _cycle_send, _cycle_recv, _cycle_swap
    x.combine, x.copy = _cycle_combine, _cycle_copy
    cdef uint64_t* header = <uint64_t*> block
    cdef uint64_t* ready = header + HEADER_WORDS
    cdef uint64_t* pending = ready + vector_words
    cdef int64_t i
    cdef bint leftover = False, any_ready = False
    with nogil:
        doubling_allreduce(&x, t.rank, t.size, <char*> block, <char*> tmp)
        for i in range(vector_words):
            any_ready = any_ready or ready[i] != 0
            leftover = leftover or (pending[i] & ~ready[i]) != 0
    return header[FLAGS], header[HASH], leftover, any_ready


cdef inline bint _has_payload(uint64_t* header) noexcept nogil:
    return header[HASH] != 0 and header[HASH] != _FAILED


cdef int64_t block_bytes(int64_t words, char* block) noexcept nogil:
    cdef uint64_t* header = <uint64_t*> block
    return words * 8 + (<int64_t> header[PAYLOAD_BYTES] if _has_payload(header) else 0)


cdef inline int64_t _block_bytes(_Cycle* cyc, char* block) noexcept nogil:
    return block_bytes(cyc.words, block)


cdef int _cycle_send(void* ctx, char* block, int peer) except -1 nogil:
    cdef _Cycle* cyc = <_Cycle*> ctx
    cdef MPI_Request req
    check(mpi.MPI_Isend_c(block, _block_bytes(cyc, block), mpi.MPI_BYTE, peer, cyc.tag,
                          cyc.link.comm, &req))
    return wait1(&cyc.link, &req, SENT_TO(peer), 0)


cdef int _cycle_recv(void* ctx, char* into, int peer) except -1 nogil:
    cdef _Cycle* cyc = <_Cycle*> ctx
    cdef MPI_Request req
    check(mpi.MPI_Irecv_c(into, cyc.words * 8 + cyc.capacity, mpi.MPI_BYTE, peer, cyc.tag,
                          cyc.link.comm, &req))
    return wait1(&cyc.link, &req, peer, 0)


cdef int _cycle_swap(void* ctx, char* block, char* into, int peer) except -1 nogil:
    cdef _Cycle* cyc = <_Cycle*> ctx
    cdef MPI_Request reqs[2]
    cdef int peers[2]
    check(mpi.MPI_Irecv_c(into, cyc.words * 8 + cyc.capacity, mpi.MPI_BYTE, peer, cyc.tag,
                          cyc.link.comm, &reqs[0]))
    check(mpi.MPI_Isend_c(block, _block_bytes(cyc, block), mpi.MPI_BYTE, peer, cyc.tag,
                          cyc.link.comm, &reqs[1]))
    peers[0], peers[1] = peer, SENT_TO(peer)
    return wait(&cyc.link, reqs, 2, peers, NULL, NULL, 0, 0)


cdef void _cycle_combine(void* ctx, char* first, char* second) noexcept nogil:
    cdef _Cycle* cyc = <_Cycle*> ctx
    combine_blocks(cyc.words, cyc.vector_words, cyc.reduce, cyc.itemsize, first, second)


cdef void combine_blocks(int64_t words, int64_t vector_words, reduce_fn_t reduce, int64_t itemsize,
                         char* first, char* second) noexcept nogil:
    cdef uint64_t* into = <uint64_t*> first
    cdef uint64_t* other = <uint64_t*> second
    cdef int64_t i
    into[FLAGS] |= other[FLAGS]
    for i in range(HEADER_WORDS, HEADER_WORDS + vector_words):
        into[i] &= other[i]
    for i in range(HEADER_WORDS + vector_words, words):
        into[i] |= other[i]
    if into[HASH] != other[HASH] or into[PAYLOAD_BYTES] != other[PAYLOAD_BYTES]:
        into[HASH] = _FAILED
    elif reduce != NULL and _has_payload(into) and into[PAYLOAD_BYTES] > 0:
        # `first` is the lower rank's block (see doubling.pyx), so both partners reduce the
        # payloads in the same order and get the same bits
        reduce(first + words * 8, second + words * 8, <int64_t> into[PAYLOAD_BYTES] // itemsize)


cdef void _cycle_copy(void* ctx, char* dst, char* src) noexcept nogil:
    memcpy(dst, src, _block_bytes(<_Cycle*> ctx, src))


cdef int lone_payload(uintptr_t block, int64_t vector_words, int64_t capacity, uint64_t h,
                      cnp.ndarray src, cnp.ndarray dst, bint copy=True) except -1:
    if not cnp.PyArray_IS_C_CONTIGUOUS(src):
        raise ValueError("a lone cycle's payload must be C-contiguous")
    cdef int64_t nbytes = cnp.PyArray_NBYTES(src)
    if nbytes > capacity:
        raise ValueError(f"a lone cycle's payload must fit in {capacity} bytes, got {nbytes}")
    if dst is not None and not (cnp.PyArray_IS_C_CONTIGUOUS(dst) and cnp.PyArray_ISWRITEABLE(dst)
                                and cnp.PyArray_NBYTES(dst) == nbytes):
        raise ValueError(f"a lone cycle's result must be a C-contiguous, writeable array of {nbytes} "
                         f"bytes, got {cnp.PyArray_NBYTES(dst)} bytes (C-contiguous: "
                         f"{cnp.PyArray_IS_C_CONTIGUOUS(dst)}, writeable: {cnp.PyArray_ISWRITEABLE(dst)})")
    cdef uint64_t* header = <uint64_t*> block
    header[FLAGS] = 0
    header[HASH] = h
    header[PAYLOAD_BYTES] = <uint64_t> nbytes
    if copy:
        memcpy(<char*> block + (HEADER_WORDS + 2 * vector_words) * 8, cnp.PyArray_DATA(src), nbytes)
    return 0


cdef bint lone_result(uintptr_t block, int64_t vector_words, uint64_t h, tuple outcome,
                      cnp.ndarray dst) except -1:
    cdef uint64_t* header = <uint64_t*> block
    if header[FLAGS] != 0 or header[HASH] != h or outcome[2] or outcome[3]:
        return False
    if dst is not None:
        memcpy(cnp.PyArray_DATA(dst), <char*> block + (HEADER_WORDS + 2 * vector_words) * 8,
               header[PAYLOAD_BYTES])
    return True


def sort_by_cache(list pending not None, object skip, dict cache not None, double now):
    """The queued requests `pending` (objects with `name`, `fields` and `next_report`) against
    the response cache `cache` (name -> (bit, fields)), as a cycle writes its bits: returns
    (bit -> request, for each whose name the cache holds with equal fields; whether any but
    `skip` is not so held; whether any request's next_report is due at `now`). One C loop:
    in Python it cost about a sixth of a microsecond a request.

    Example:
        >>> class R:
        ...     def __init__(self, name, fields, due=float("inf")):
        ...         self.name, self.fields, self.next_report = name, fields, due
        >>> a, b, c = R("a", (1,)), R("b", (2,)), R("c", (3,), due=5.0)
        >>> cached, uncached, due = sort_by_cache([a, b, c], c, {"a": (7, (1,)), "b": (3, (9,))}, 6.0)
        >>> cached == {7: a}, uncached, due
        (True, True, True)
    """
    cdef dict cached = {}
    cdef bint uncached = False, due = False
    for r in pending:
        if not due and now >= <double> r.next_report:
            due = True
        if r is skip:
            continue
        found = cache.get(r.name)
        if found is not None:
            bit, fields = found
            if fields is r.fields or fields == r.fields:
                cached[bit] = r
                continue
        uncached = True
    return cached, uncached, due


def mark_bits(cnp.ndarray block not None, int64_t vector_words, bits):
    """Set bit b of the ready (AND) and pending (OR) bit words of the cycle block `block`
    (uint64, C-contiguous, aligned, with `vector_words` words of each) for every b in `bits` (ints
    below 64 * vector_words); returns the words `bits` alone make, a list of ints. One C loop:
    in Python, shifting an integer a bit at a time cost 70 ns a bit.

    Example:
        >>> import numpy as np
        >>> block = np.zeros(CYCLE_HEADER_WORDS + 4, np.uint64)
        >>> mark_bits(block, 2, {0: "a", 65: "b", 2: "c"})
        [5, 2]
        >>> block[CYCLE_HEADER_WORDS:].tolist()
        [5, 2, 5, 2]
    """
    if not (cnp.PyArray_IS_C_CONTIGUOUS(block) and cnp.PyArray_ISWRITEABLE(block) and cnp.PyArray_ISALIGNED(block)
            and cnp.PyArray_TYPE(block) == cnp.NPY_UINT64 and vector_words >= 0
            and cnp.PyArray_SIZE(block) >= HEADER_WORDS + 2 * vector_words):
        raise ValueError(f"mark_bits needs a C-contiguous, writeable, aligned uint64 block of at least "
                         f"{HEADER_WORDS + 2 * vector_words} words")
    cdef uint64_t* words = <uint64_t*> cnp.PyArray_DATA(block) + HEADER_WORDS
    cdef uint64_t* m = <uint64_t*> PyMem_Calloc(max(vector_words, 1), sizeof(uint64_t))
    cdef int64_t bit, i
    if m == NULL:
        raise MemoryError()
    try:
        for b in bits:
            if not 0 <= b < 64 * vector_words:
                raise ValueError(f"bit {b} is outside {vector_words} words")
            bit = b
            m[bit >> 6] |= (<uint64_t> 1) << (bit & 63)
        for i in range(vector_words):
            words[i] |= m[i]
            words[vector_words + i] |= m[i]
        return [m[i] for i in range(vector_words)]
    finally:
        PyMem_Free(m)
