# The ring: reduce-scatter (one loop for every place the partial results may live), allgather,
# and the allreduce whose messages travel as 16-bit values.

from libc.stdint cimport int64_t
from .mpi cimport Link, TransportBase, reduce_fn_t

# An element step of the ring on a 16-bit wire (kernels/cfuncs.py, wire_cfunc): each reads
# what it needs of this rank's input `src` (scaled by mul / div), the received 16-bit `recv`,
# and writes the 16-bit `bits` to send on and/or the result `dst`.
ctypedef void (*wire_fn_t)(void* bits, void* src, void* recv, void* dst, int64_t count,
                           double mul, double div, double post) noexcept nogil


# Where reduce_scatter keeps the partial results it receives (and so what it reduces into).
cdef enum Landing:
    # In place: segments land in two segment-sized halves of `work`, and are reduced into
    # this rank's `src`, which ends with chunk `rank` reduced.
    IN_SCRATCH
    # `dst` is as large as `src`: each chunk lands at its own offset there and this rank's
    # `src` is reduced into it, so `src` is left as it is.
    IN_DST
    # Chunks land in two chunk-sized slots of `work` in turn, the last step in `dst`, which
    # holds only this rank's chunk; `src` is reduced into them and left as it is.
    IN_WORK


cdef struct WireSteps:
    char* src
    char* dst
    int64_t accsize
    double mul, div, post
    wire_fn_t encode, hop, last, decode


cdef int check_ring_args(TransportBase t, Py_ssize_t entries, int64_t segment_bytes,
                         int64_t itemsize) except -1

cdef int reduce_scatter(const Link* link, int rank, int size, Landing landing, char* src,
                        const int64_t* offsets, char* dst, char* work, int64_t segment,
                        reduce_fn_t reduce, int64_t itemsize, int tag) except -1 nogil

cdef int allgather(const Link* link, int rank, int size, char* buf, const int64_t* offsets,
                   char* own, int tag) except -1 nogil

cdef int allreduce_wire(const Link* link, int rank, int size, WireSteps* w, const int64_t* offsets,
                        char* tmp, int64_t segment, int* roles, int tag) except -1 nogil
