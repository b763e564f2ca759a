# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The negotiation cycle's exchange (Transport.cycle_exchange): recursive doubling of a block

    [flags | speculative hash | payload bytes | vector_words ready bits | vector_words pending bits | payload]

where the header and the bits are combined with OR, agreement and AND, and the payload with
the speculative request's reduction. Only the bytes in use travel: the header and bits, and
the payload only while the hash is a real request's.

A partner may be late by a whole training step, so waits spin briefly, then sleep, and call
back into Python every stall_seconds to let the engine report or abandon the cycle.
"""

from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy
from posix.time cimport nanosleep, timespec

cimport mpi4py.libmpi as mpi
from mpi4py.libmpi cimport MPI_Comm, MPI_Request

from .doubling cimport Exchange, doubling_allreduce
from .mpi cimport check, now, reduce_fn_t

CYCLE_HEADER_WORDS = HEADER_WORDS
SPECULATION_FAILED = 0xFFFFFFFFFFFFFFFF
cdef uint64_t _FAILED = 0xFFFFFFFFFFFFFFFF


cdef struct _Cycle:
    MPI_Comm comm
    int64_t words          # header and bit-vector words
    int64_t vector_words
    int64_t capacity       # payload bytes a block has room for
    reduce_fn_t reduce
    int64_t itemsize
    double stall_seconds
    void* on_stall
    int tag


cdef tuple exchange(TransportBase t, uintptr_t block, int64_t vector_words, int64_t capacity,
                    uintptr_t tmp, uintptr_t reduce_fn, int64_t itemsize, double stall_seconds,
                    object on_stall, int tag):
    """Transport.cycle_exchange (see there)."""
    cdef _Cycle cyc
    cyc.comm = t.comm
    cyc.words = HEADER_WORDS + 2 * vector_words
    cyc.vector_words = vector_words
    cyc.capacity = capacity
    cyc.reduce = <reduce_fn_t> reduce_fn
    cyc.itemsize = itemsize
    cyc.stall_seconds = stall_seconds
    cyc.on_stall = <void*> on_stall
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


cdef int _call_on_stall(_Cycle* cyc, int partner, double waited) except -1 with gil:
    (<object> cyc.on_stall)(partner, waited)
    return 0


cdef int _wait_patiently(_Cycle* cyc, MPI_Request* reqs, int n, int partner) except -1 nogil:
    # Spin first (a partner already in the cycle answers within microseconds), then back off
    # with short sleeps so that a rank waiting long for a slow partner leaves its core to the
    # training thread. Every stall_seconds the stall callback may report or raise.
    cdef int done = 0
    cdef long spins = 0
    cdef double start = now(), next_report = start + cyc.stall_seconds
    cdef timespec pause
    pause.tv_sec = 0
    pause.tv_nsec = 20000
    while True:
        check(mpi.MPI_Testall(n, reqs, &done, mpi.MPI_STATUSES_IGNORE))
        if done:
            return 0
        spins += 1
        if spins > 300:
            nanosleep(&pause, NULL)
            if pause.tv_nsec < 500000:
                pause.tv_nsec += 20000
            if cyc.stall_seconds > 0 and now() >= next_report:
                _call_on_stall(cyc, partner, now() - start)
                next_report = now() + cyc.stall_seconds


cdef inline bint _has_payload(uint64_t* header) noexcept nogil:
    return header[HASH] != 0 and header[HASH] != _FAILED


cdef inline int64_t _block_bytes(_Cycle* cyc, char* block) noexcept nogil:
    cdef uint64_t* header = <uint64_t*> block
    return cyc.words * 8 + (<int64_t> header[PAYLOAD_BYTES] if _has_payload(header) else 0)


cdef int _cycle_send(void* ctx, char* block, int peer) except -1 nogil:
    cdef _Cycle* cyc = <_Cycle*> ctx
    cdef MPI_Request req
    check(mpi.MPI_Isend_c(block, _block_bytes(cyc, block), mpi.MPI_BYTE, peer, cyc.tag,
                          cyc.comm, &req))
    return _wait_patiently(cyc, &req, 1, peer)


cdef int _cycle_recv(void* ctx, char* into, int peer) except -1 nogil:
    cdef _Cycle* cyc = <_Cycle*> ctx
    cdef MPI_Request req
    check(mpi.MPI_Irecv_c(into, cyc.words * 8 + cyc.capacity, mpi.MPI_BYTE, peer, cyc.tag,
                          cyc.comm, &req))
    return _wait_patiently(cyc, &req, 1, peer)


cdef int _cycle_swap(void* ctx, char* block, char* into, int peer) except -1 nogil:
    cdef _Cycle* cyc = <_Cycle*> ctx
    cdef MPI_Request reqs[2]
    check(mpi.MPI_Irecv_c(into, cyc.words * 8 + cyc.capacity, mpi.MPI_BYTE, peer, cyc.tag,
                          cyc.comm, &reqs[0]))
    check(mpi.MPI_Isend_c(block, _block_bytes(cyc, block), mpi.MPI_BYTE, peer, cyc.tag,
                          cyc.comm, &reqs[1]))
    return _wait_patiently(cyc, reqs, 2, peer)


cdef void _cycle_combine(void* ctx, char* first, char* second) noexcept nogil:
    cdef _Cycle* cyc = <_Cycle*> ctx
    cdef uint64_t* into = <uint64_t*> first
    cdef uint64_t* other = <uint64_t*> second
    cdef int64_t i
    into[FLAGS] |= other[FLAGS]
    for i in range(HEADER_WORDS, HEADER_WORDS + cyc.vector_words):
        into[i] &= other[i]
    for i in range(HEADER_WORDS + cyc.vector_words, cyc.words):
        into[i] |= other[i]
    if into[HASH] != other[HASH] or into[PAYLOAD_BYTES] != other[PAYLOAD_BYTES]:
        into[HASH] = _FAILED
    elif _has_payload(into) and into[PAYLOAD_BYTES] > 0:
        # `first` is the lower rank's block (see doubling.pyx), so both partners reduce the
        # payloads in the same order and get the same bits
        cyc.reduce(first + cyc.words * 8, second + cyc.words * 8,
                   <int64_t> into[PAYLOAD_BYTES] // cyc.itemsize)


cdef void _cycle_copy(void* ctx, char* dst, char* src) noexcept nogil:
    memcpy(dst, src, _block_bytes(<_Cycle*> ctx, src))
