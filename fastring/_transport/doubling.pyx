# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Recursive doubling: pairs of ranks swap and combine their whole buffers, the distance
between partners doubling each round, so every rank holds the reduction after log2(N)
exchanges.

Every combine takes its operands in rank order, the lower rank's first, so the two partners
compute the same bits even where an op is not bitwise commutative (Min/Max of -0.0 and +0.0,
the payload of a NaN), and so every rank ends with the same bytes.
"""

from libc.stdint cimport int64_t
from libc.string cimport memcpy

from .mpi cimport recv, send, sendrecv


cdef int doubling_allreduce(Exchange* x, int rank, int size, char* buf,
                            char* tmp) except -1 nogil:
    """Allreduce `buf` over the ranks with `x`'s calls; `tmp` holds as much as `buf` and is
    clobbered."""
    # The result may end in either buffer: combining in rank order means the higher rank of a
    # pair reduces into the buffer it received, which then becomes its current one.
    cdef char* cur = buf
    cdef char* spare = tmp
    cdef int pof2 = 1
    cdef int rem, newrank, mask, partner_new, partner
    while pof2 * 2 <= size:
        pof2 *= 2
    rem = size - pof2
    # Fold the ranks beyond the largest power of two into their neighbours first: even ranks
    # below 2*rem hand their data to rank+1 and wait for the result.
    if rank < 2 * rem:
        if rank % 2 == 0:
            x.send(x.ctx, cur, rank + 1)
            newrank = -1
        else:
            x.recv(x.ctx, spare, rank - 1)
            x.combine(x.ctx, spare, cur)
            cur, spare = spare, cur
            newrank = rank // 2
    else:
        newrank = rank - rem
    if newrank != -1:
        mask = 1
        while mask < pof2:
            partner_new = newrank ^ mask
            partner = partner_new * 2 + 1 if partner_new < rem else partner_new + rem
            x.swap(x.ctx, cur, spare, partner)
            if partner < rank:
                x.combine(x.ctx, spare, cur)
                cur, spare = spare, cur
            else:
                x.combine(x.ctx, cur, spare)
            mask <<= 1
    if rank < 2 * rem:
        if rank % 2 == 0:
            x.recv(x.ctx, cur, rank + 1)
        else:
            x.send(x.ctx, cur, rank - 1)
    if cur != buf:
        x.copy(x.ctx, buf, cur)
    return 0


cdef struct _Plain:
    const Link* link
    int64_t nbytes
    int64_t count   # elements
    reduce_fn_t reduce
    int tag


cdef int _plain_send(void* ctx, char* buf, int peer) except -1 nogil:
    cdef _Plain* p = <_Plain*> ctx
    return send(p.link, buf, p.nbytes, peer, p.tag)


cdef int _plain_recv(void* ctx, char* into, int peer) except -1 nogil:
    cdef _Plain* p = <_Plain*> ctx
    return recv(p.link, into, p.nbytes, peer, p.tag)


cdef int _plain_swap(void* ctx, char* buf, char* into, int peer) except -1 nogil:
    cdef _Plain* p = <_Plain*> ctx
    return sendrecv(p.link, buf, p.nbytes, peer, into, p.nbytes, peer, p.tag)


cdef void _plain_combine(void* ctx, char* first, char* second) noexcept nogil:
    cdef _Plain* p = <_Plain*> ctx
    if p.count:
        p.reduce(first, second, p.count)


cdef void _plain_copy(void* ctx, char* dst, char* src) noexcept nogil:
    memcpy(dst, src, (<_Plain*> ctx).nbytes)


cdef int recursive_doubling(const Link* link, int rank, int size, char* buf, int64_t nbytes,
                            char* tmp, reduce_fn_t reduce, int64_t itemsize,
                            int tag) except -1 nogil:
    """Allreduce `nbytes` at `buf` with `reduce`; `tmp` holds nbytes."""
    cdef _Plain p
    p.link, p.nbytes, p.count, p.reduce, p.tag = link, nbytes, nbytes // itemsize, reduce, tag
    cdef Exchange x
    x.ctx = &p
    x.send, x.recv, x.swap = _plain_send, _plain_recv, _plain_swap
    x.combine, x.copy = _plain_combine, _plain_copy
    return doubling_allreduce(&x, rank, size, buf, tmp)
