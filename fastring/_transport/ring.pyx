# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The ring: N-1 steps in which every rank sends to its right neighbour and receives from its
left one, all ranks at once, so each link carries (N-1)/N of the bytes in each direction.

Chunk c of a buffer is bytes offsets[c]..offsets[c+1]. In the reduce-scatter, a rank at step
s sends chunk rank-s-1 and receives chunk rank-s-2, which it reduces with its own input; after
N-1 steps it holds chunk `rank` reduced over all ranks. In the allgather the finished chunks
circulate the same way. `reduce_scatter` is one loop for the in-place ring and the two that
leave their input untouched; the 16-bit wire ring interleaves reduce-scatter and allgather
segment by segment and so has its own loop.
"""

from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcpy

cimport mpi4py.libmpi as mpi
from mpi4py.libmpi cimport MPI_Request

from .mpi cimport SENT_TO, check_offsets, mod, post_exchange, sendrecv, wait
from .tags cimport Tag


cdef int check_ring_args(TransportBase t, Py_ssize_t entries, int64_t segment_bytes,
                         int64_t itemsize) except -1:
    check_offsets(t, entries, "offsets")
    if segment_bytes < itemsize or segment_bytes % itemsize:
        raise ValueError(f"segment_bytes {segment_bytes} must be a positive multiple of {itemsize}")
    return 0


cdef inline int64_t _largest_chunk(const int64_t* offsets, int size) noexcept nogil:
    cdef int64_t largest = 0
    cdef int c
    for c in range(size):
        largest = max(largest, offsets[c + 1] - offsets[c])
    return largest


cdef inline int64_t _seg_len(int64_t chunk_len, int64_t seg, int64_t segment) noexcept nogil:
    """Bytes of segment `seg` of a chunk of `chunk_len` bytes (0 past its end)."""
    return max(min(segment, chunk_len - seg * segment), 0)


cdef inline char* _partial(Landing landing, int rank_steps, char* src, const int64_t* offsets,
                           char* dst, char* work, int64_t largest, int64_t step,
                           int64_t c) noexcept nogil:
    # Where this rank keeps its partial result of chunk c, the one it receives at `step`
    # (rank_steps: how many steps the ring has, N-1).
    if landing == IN_SCRATCH:
        return src + offsets[c]
    if landing == IN_DST:
        return dst + offsets[c]
    return dst if step == rank_steps - 1 else work + (step % 2) * largest


cdef int reduce_scatter(const Link* link, int rank, int size, Landing landing, char* src,
                        const int64_t* offsets, char* dst, char* work, int64_t segment,
                        reduce_fn_t reduce, int64_t itemsize, int tag) except -1 nogil:
    """Reduce chunk c of every rank's `src` into rank c, `segment` bytes at a time, keeping
    the partial results where `landing` says (see Landing)."""
    # Double-buffered: segment k+1 is already posted (and the partner, waiting in MPI, keeps
    # moving its bytes) while segment k is reduced.
    cdef int right = (rank + 1) % size
    cdef int left = (rank + size - 1) % size
    cdef int64_t largest = _largest_chunk(offsets, size)
    # Chunks differ in length by at most a few elements; every rank walks the same number of
    # segments (some possibly empty) so that each exchange has its partner.
    cdef int64_t segments = (largest + segment - 1) // segment
    cdef int64_t step, seg, send_c, recv_c, send_len, recv_len, lo, n
    cdef char* send
    cdef char* partial
    cdef char* own
    cdef char* landed
    cdef MPI_Request reqs[4]
    cdef int peers[4]
    reqs[0] = reqs[1] = reqs[2] = reqs[3] = mpi.MPI_REQUEST_NULL
    peers[0], peers[1], peers[2], peers[3] = left, SENT_TO(right), left, SENT_TO(right)
    for step in range(size - 1):
        send_c = mod(rank - step - 1, size)
        recv_c = mod(rank - step - 2, size)   # at the last step, this rank's own chunk
        # Step 0 sends an untouched input chunk; later steps forward what the previous received.
        if step == 0:
            send = src + offsets[send_c]
        else:
            send = _partial(landing, size - 1, src, offsets, dst, work, largest, step - 1, send_c)
        partial = _partial(landing, size - 1, src, offsets, dst, work, largest, step, recv_c)
        own = src + offsets[recv_c]
        send_len = offsets[send_c + 1] - offsets[send_c]
        recv_len = offsets[recv_c + 1] - offsets[recv_c]
        for seg in range(segments + 1):
            if seg < segments:
                lo = seg * segment
                landed = work + (seg % 2) * segment if landing == IN_SCRATCH else partial + lo
                post_exchange(link, send + lo, _seg_len(send_len, seg, segment), right,
                              landed, _seg_len(recv_len, seg, segment), left, tag,
                              &reqs[2 * (seg % 2)])
            if seg > 0:
                # the other pair (the next segment's) is outstanding too: given up with it
                wait(link, &reqs[2 * ((seg - 1) % 2)], 2, peers, reqs, peers, 4, segment)
                lo = (seg - 1) * segment
                n = _seg_len(recv_len, seg - 1, segment) // itemsize
                if n == 0:
                    continue
                if landing == IN_SCRATCH:
                    reduce(partial + lo, work + ((seg - 1) % 2) * segment, n)
                else:
                    reduce(partial + lo, own + lo, n)
    return 0


cdef int allgather(const Link* link, int rank, int size, char* buf, const int64_t* offsets,
                   char* own, int tag) except -1 nogil:
    """Circulate chunk c, held complete by rank c, so that every rank holds every chunk;
    this rank's chunk goes out from `own`."""
    # No arithmetic to overlap here, so each step moves a whole chunk in one exchange.
    cdef int right = (rank + 1) % size
    cdef int left = (rank + size - 1) % size
    cdef int64_t step, send_c, recv_c
    for step in range(size - 1):
        send_c = mod(rank - step, size)
        recv_c = mod(rank - step - 1, size)
        sendrecv(link, own if step == 0 else buf + offsets[send_c],
                 offsets[send_c + 1] - offsets[send_c], right,
                 buf + offsets[recv_c], offsets[recv_c + 1] - offsets[recv_c], left, tag)
    return 0


cdef int allreduce_wire(const Link* link, int rank, int size, WireSteps* w, const int64_t* offsets,
                        char* tmp, int64_t segment, int* roles, int tag) except -1 nogil:
    """The allreduce of Transport.ring_allreduce_wire: offsets and `segment` in elements."""
    # Three 16-bit buffers rotate so that this rank's kernels only ever write a buffer whose
    # lines are its own: a buffer the next rank has just read (by copying it out of this
    # process) is slow to overwrite (see Transport.ring_allgather), while a buffer this rank
    # has received into since is as fast as any. `sending` goes out next; `spare` was last
    # written by this rank and not read by another since; `landing` receives. `roles` holds
    # which buffer (0, 1, 2) is which, from the previous call to the next.
    cdef int right = (rank + 1) % size
    cdef int left = (rank + size - 1) % size
    cdef int64_t seg, step, c, lo, n
    cdef int64_t segments = (_largest_chunk(offsets, size) + segment - 1) // segment
    cdef char* sending = tmp + 2 * segment * roles[0]
    cdef char* spare = tmp + 2 * segment * roles[1]
    cdef char* landing = tmp + 2 * segment * roles[2]
    cdef char* sent
    for seg in range(segments):
        c = mod(rank - 1, size)
        w.encode(spare, w.src + w.accsize * (offsets[c] + seg * segment), NULL, NULL,
                 _chunk_seg_len(offsets, c, seg, segment), w.mul, w.div, w.post)
        sending, spare = spare, sending
        for step in range(size - 1):
            # send segment `seg` of chunk rank-step-1, receive that of chunk rank-step-2 (at
            # the last step this rank's own) and combine it into `spare`, to send next
            c = mod(rank - step - 2, size)
            lo, n = offsets[c] + seg * segment, _chunk_seg_len(offsets, c, seg, segment)
            sendrecv(link, sending, 2 * _chunk_seg_len(offsets, mod(rank - step - 1, size), seg, segment),
                     right, landing, 2 * n, left, tag)
            (w.last if step == size - 2 else w.hop)(
                spare, w.src + w.accsize * lo, landing, w.dst + w.accsize * lo, n, w.mul, w.div, w.post)
            sent = sending
            sending, spare, landing = spare, landing, sent
        for step in range(size - 1):
            # `sending` holds the finished 16-bit segment of chunk rank-step; pass it on,
            # decode the one that arrives, and forward that one next
            c = mod(rank - step - 1, size)
            lo, n = offsets[c] + seg * segment, _chunk_seg_len(offsets, c, seg, segment)
            sendrecv(link, sending, 2 * _chunk_seg_len(offsets, mod(rank - step, size), seg, segment),
                     right, landing, 2 * n, left, tag)
            w.decode(NULL, NULL, landing, w.dst + w.accsize * lo, n, w.mul, w.div, w.post)
            sending, landing = landing, sending
    roles[0] = (sending - tmp) // (2 * segment)
    roles[1] = (spare - tmp) // (2 * segment)
    roles[2] = (landing - tmp) // (2 * segment)
    return 0


cdef inline int64_t _chunk_seg_len(const int64_t* offsets, int64_t c, int64_t seg,
                                   int64_t segment) noexcept nogil:
    return _seg_len(offsets[c + 1] - offsets[c], seg, segment)


def ring_reduce_scatter_into(TransportBase t, uintptr_t src, const int64_t[::1] offsets,
                             uintptr_t out, uintptr_t work, int64_t segment_bytes,
                             uintptr_t reduce_fn, int64_t itemsize, int tag=Tag.REDUCE_SCATTER_INTO):
    """Ring reduce-scatter that leaves `src` untouched: the reduction over all ranks of chunk
    `rank` (bytes offsets[rank]..[rank+1] of src) lands in `out`.

    A partial sum is received straight into a buffer and this rank's input is reduced into it
    (every op is commutative), so nothing is copied: `work` holds two chunks of the largest
    size, used in turn, and the last step receives into `out` itself.

    Example:
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> from fastring._transport import Transport
        >>> t = Transport(MPI.COMM_WORLD); a = np.ones(3); o = np.zeros(3)
        >>> ring_reduce_scatter_into(t, a.ctypes.data, np.array([0, 24]), o.ctypes.data, 0, 8, 0, 8)
        >>> o.tolist()
        [1.0, 1.0, 1.0]
    """
    _reduce_scatter_from(t, IN_WORK, src, offsets, out, work, segment_bytes, reduce_fn, itemsize, tag)


def ring_reduce_scatter_to(TransportBase t, uintptr_t src, const int64_t[::1] offsets,
                           uintptr_t dst, int64_t segment_bytes, uintptr_t reduce_fn,
                           int64_t itemsize, int tag=Tag.REDUCE_SCATTER_TO):
    """Reduce-scatter from `src` into the same-sized `dst`, leaving `src` untouched: an
    out-of-place allreduce needs no copy of its input. Chunks are received straight into
    `dst` and this rank's input is reduced into them; afterwards chunk `rank` of `dst` holds
    the reduction over all ranks (the others partial sums, for the allgather to overwrite).

    Example:
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> from fastring._transport import Transport
        >>> t = Transport(MPI.COMM_WORLD); a = np.ones(3); o = np.zeros(3)
        >>> ring_reduce_scatter_to(t, a.ctypes.data, np.array([0, 24]), o.ctypes.data, 8, 0, 8)
        >>> o.tolist()
        [1.0, 1.0, 1.0]
    """
    _reduce_scatter_from(t, IN_DST, src, offsets, dst, 0, segment_bytes, reduce_fn, itemsize, tag)


cdef int _reduce_scatter_from(TransportBase t, Landing landing, uintptr_t src,
                              const int64_t[::1] offsets, uintptr_t dst, uintptr_t work,
                              int64_t segment_bytes, uintptr_t reduce_fn, int64_t itemsize,
                              int tag) except -1:
    # The reduce-scatters that leave `src` as it is; on one rank, chunk 0 is all of it.
    check_ring_args(t, offsets.shape[0], segment_bytes, itemsize)
    with nogil:
        if t.size == 1:
            memcpy(<void*> dst, <void*> src, offsets[1] - offsets[0])
        else:
            reduce_scatter(&t.link, t.rank, t.size, landing, <char*> src, &offsets[0], <char*> dst,
                           <char*> work, segment_bytes, <reduce_fn_t> reduce_fn, itemsize, tag)
    return 0
