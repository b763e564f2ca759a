# The engine's negotiation cycle: one small allreduce of a header, bit vectors and an optional
# speculative payload, on the recursive-doubling schedule.

from libc.stdint cimport int64_t, uint64_t, uintptr_t

cimport numpy as cnp

from .mpi cimport TransportBase, reduce_fn_t


# The header of a cycle block, in uint64 words; Python sees HEADER_WORDS as CYCLE_HEADER_WORDS.
cdef enum:
    FLAGS          # combined with OR
    HASH           # the speculative request's hash: kept where every rank agrees
    PAYLOAD_BYTES  # the speculative payload's byte count: must agree too
    HEADER_WORDS


cdef tuple exchange(TransportBase t, uintptr_t block, int64_t vector_words, int64_t capacity,
                    uintptr_t tmp, uintptr_t reduce_fn, int64_t itemsize, double stall_seconds,
                    object on_stall, int tag)


# The byte count of a cycle block of `words` header and bit words (its payload counted only
# while its hash is a real request's), and the combination of two blocks into `first`, the
# lower rank's (payloads reduced with `reduce` unless it is NULL): shared with the shared-memory cycle (shm.pyx).
cdef int64_t block_bytes(int64_t words, char* block) noexcept nogil
cdef void combine_blocks(int64_t words, int64_t vector_words, reduce_fn_t reduce, int64_t itemsize,
                         char* first, char* second) noexcept nogil


# A lone cycle: this rank proposes one small allreduce alone, its bytes as the payload
# (`lone_payload` checks both arrays, before anything moves, and writes the block's header
# and, with `copy`, its payload; the bit words must be zero), and the reduction goes to `dst`
# (unless it is None) only when the outcome is clean (`lone_result`, which returns whether it
# was). Shared by Transport.lone_cycle and SharedSegment.lone_cycle, which moves the payload
# itself.
cdef int lone_payload(uintptr_t block, int64_t vector_words, int64_t capacity, uint64_t h,
                      cnp.ndarray src, cnp.ndarray dst, bint copy=*) except -1
cdef bint lone_result(uintptr_t block, int64_t vector_words, uint64_t h, tuple outcome,
                      cnp.ndarray dst) except -1
