# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Alltoall by pairwise exchange."""

from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcpy

from .mpi cimport Link, TransportBase, check_offsets, sendrecv
from .tags cimport Tag


def pairwise_alltoall(TransportBase t, uintptr_t send, const int64_t[::1] send_offsets,
                      uintptr_t recv, const int64_t[::1] recv_offsets, int tag=Tag.ALLTOALL):
    """Alltoall by pairwise exchange: block c of `send` (bytes send_offsets[c]..[c+1]) goes to
    rank c, which stores it as block `rank` of its `recv`. In step k = 1..N-1 a rank sends to
    rank+k and receives from rank-k, so every step pairs all ranks at once; its own block is
    copied. Block sizes must agree between the partners (exchange them first).

    Example:
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> from fastring._transport import Transport
        >>> t = Transport(MPI.COMM_WORLD)
        >>> a, b = np.arange(4, dtype=np.uint8), np.zeros(4, np.uint8)
        >>> pairwise_alltoall(t, a.ctypes.data, np.array([0, 4]), b.ctypes.data, np.array([0, 4]))
        >>> b.tolist()
        [0, 1, 2, 3]
    """
    check_offsets(t, send_offsets.shape[0], "send_offsets")
    check_offsets(t, recv_offsets.shape[0], "recv_offsets")
    if send_offsets[t.rank + 1] - send_offsets[t.rank] != recv_offsets[t.rank + 1] - recv_offsets[t.rank]:
        raise ValueError("the block a rank sends itself must be as long as the one it receives")
    with nogil:
        _pairwise_alltoall(&t.link, t.rank, t.size, <char*> send, &send_offsets[0],
                           <char*> recv, &recv_offsets[0], tag)


cdef int _pairwise_alltoall(const Link* link, int rank, int size, char* send, const int64_t* soff,
                            char* recv, const int64_t* roff, int tag) except -1 nogil:
    cdef int k, dest, source
    memcpy(recv + roff[rank], send + soff[rank], soff[rank + 1] - soff[rank])
    for k in range(1, size):
        dest = (rank + k) % size
        source = (rank + size - k) % size
        sendrecv(link, send + soff[dest], soff[dest + 1] - soff[dest], dest,
                 recv + roff[source], roff[source + 1] - roff[source], source, tag)
    return 0
