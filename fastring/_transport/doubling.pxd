# Recursive doubling: an allreduce in log2(N) exchanges of the whole buffer, for small messages.
# One schedule, `doubling_allreduce`, serves both the plain buffer allreduce and the engine's
# negotiation cycle, which differ only in how they move and combine their bytes.

from libc.stdint cimport int64_t
from .mpi cimport Link, reduce_fn_t


# How one user of the schedule moves and combines its buffers; `ctx` is passed to each.
cdef struct Exchange:
    void* ctx
    # send `buf` to rank `peer`
    int (*send)(void* ctx, char* buf, int peer) except -1 nogil
    # receive from rank `peer` into `into`
    int (*recv)(void* ctx, char* into, int peer) except -1 nogil
    # send `buf` to rank `peer` while receiving its buffer into `into`
    int (*swap)(void* ctx, char* buf, char* into, int peer) except -1 nogil
    # first = first op second, where `first` holds the lower rank's operand
    void (*combine)(void* ctx, char* first, char* second) noexcept nogil
    # copy a finished result from `src` to `dst`
    void (*copy)(void* ctx, char* dst, char* src) noexcept nogil


cdef int doubling_allreduce(Exchange* x, int rank, int size, char* buf,
                            char* tmp) except -1 nogil

cdef int recursive_doubling(const Link* link, int rank, int size, char* buf, int64_t nbytes,
                            char* tmp, reduce_fn_t reduce, int64_t itemsize,
                            int tag) except -1 nogil
