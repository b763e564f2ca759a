# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The native seam: MPI point-to-point calls on raw addresses, with the GIL released.

Only (address, byte count, rank, tag) and plain integer codes cross this layer; the Python
layers above validate tensors and raise errors that name the bad argument. Every MPI call runs
`with nogil` and goes through `_check`, which turns an MPI error code into `FastringError`
carrying MPI's own error string. The large-count (`_c`) MPI-4 calls are used throughout, so a
message larger than 2 GiB needs no splitting.

The ring and recursive-doubling loops live here too, so that a whole collective runs without
touching the GIL: a Python thread (the engine's) can keep computing while bytes move. The
chunk reductions are Numba `cfunc`s, passed in as C function pointers.
"""

from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.string cimport memcpy
from posix.time cimport nanosleep, timespec, clock_gettime, CLOCK_MONOTONIC
from libc.stdlib cimport malloc, realloc, free
from libc.errno cimport errno, EIO
from posix.types cimport pid_t
from posix.unistd cimport getpid

cimport mpi4py.libmpi as mpi
from mpi4py.libmpi cimport MPI_Comm, MPI_Request, MPI_Count, MPI_Datatype, MPI_Op
from mpi4py.MPI cimport Comm

from ._core.errors import FastringError

# A chunk reduction: dst[i] = dst[i] op src[i] for i < count (elements, not bytes).
ctypedef void (*reduce_fn_t)(void* dst, void* src, int64_t count) noexcept nogil

# Cross Memory Attach (Linux): copy between this process and another one on the same host in
# one pass, without a shared-memory bounce buffer. Python.h defines _GNU_SOURCE, which
# sys/uio.h needs to declare these.
cdef extern from "<sys/uio.h>" nogil:
    cdef struct iovec:
        void* iov_base
        size_t iov_len
    ssize_t process_vm_readv(pid_t pid, const iovec* local, unsigned long liovcnt,
                             const iovec* remote, unsigned long riovcnt, unsigned long flags)
    ssize_t process_vm_writev(pid_t pid, const iovec* local, unsigned long liovcnt,
                              const iovec* remote, unsigned long riovcnt, unsigned long flags)

# An element step of the ring on a 16-bit wire (kernels/cfuncs.py wire_cfunc): each reads
# what it needs of this rank's input `src` (scaled by mul / div), the received 16-bit `recv`,
# and writes the 16-bit `bits` to send on and/or the result `dst`.
ctypedef void (*wire_fn_t)(void* bits, void* src, void* recv, void* dst, int64_t count,
                           double mul, double div, double post) noexcept nogil


cdef int _raise_mpi_error(int code) except -1 with gil:
    cdef char message[512]
    cdef int length = 0
    if mpi.MPI_Error_string(code, message, &length) != mpi.MPI_SUCCESS:
        raise FastringError(f"MPI call failed with error code {code}")
    raise FastringError(f"MPI call failed: {message[:length].decode('utf-8', 'replace')} (code {code})")


cdef inline int _check(int code) except -1 nogil:
    if code != mpi.MPI_SUCCESS:
        _raise_mpi_error(code)
    return 0


# Codes shared with fastring/_dtypes.py (MPI_DATATYPES) and fastring/_ops.py: an enum across
# the seam, never strings. They index these tables.
cdef MPI_Datatype _datatype(int code) noexcept:
    if code == 0: return mpi.MPI_UINT8_T
    if code == 1: return mpi.MPI_INT8_T
    if code == 2: return mpi.MPI_INT32_T
    if code == 3: return mpi.MPI_INT64_T
    if code == 4: return mpi.MPI_FLOAT
    if code == 5: return mpi.MPI_DOUBLE
    if code == 6: return mpi.MPI_C_BOOL
    return mpi.MPI_DATATYPE_NULL


cdef MPI_Op _op(int code) noexcept:
    if code == 0: return mpi.MPI_SUM
    if code == 1: return mpi.MPI_MIN
    if code == 2: return mpi.MPI_MAX
    if code == 3: return mpi.MPI_PROD
    if code == 4: return mpi.MPI_LOR
    if code == 5: return mpi.MPI_LAND
    return mpi.MPI_OP_NULL


cdef class Requests:
    """A growable set of outstanding MPI requests, completed together by `waitall`."""
    cdef MPI_Request* reqs
    cdef int count
    cdef int capacity

    def __cinit__(self):
        self.capacity = 8
        self.count = 0
        self.reqs = <MPI_Request*> malloc(self.capacity * sizeof(MPI_Request))
        if self.reqs == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.reqs)

    def __len__(self):
        return self.count

    cdef MPI_Request* slot(self) except NULL:
        cdef MPI_Request* grown
        if self.count == self.capacity:
            grown = <MPI_Request*> realloc(self.reqs, 2 * self.capacity * sizeof(MPI_Request))
            if grown == NULL:
                raise MemoryError()
            self.reqs = grown
            self.capacity *= 2
        self.count += 1
        return &self.reqs[self.count - 1]

    def waitall(self):
        """Block until every request completes (GIL released), then empty the set."""
        with nogil:
            _check(mpi.MPI_Waitall(self.count, self.reqs, mpi.MPI_STATUSES_IGNORE))
        self.count = 0

    def testall(self):
        """True (and the set emptied) when every request has completed; never blocks."""
        cdef int done = 0
        with nogil:
            _check(mpi.MPI_Testall(self.count, self.reqs, &done, mpi.MPI_STATUSES_IGNORE))
        if done:
            self.count = 0
        return bool(done)


cdef uint64_t _PROBE_MARK = 0xFA57000000000000  # + rank: what enable_single_copy looks for


cdef class Transport:
    """Point-to-point byte transfers over one MPI communicator.

    The communicator is duplicated so that fastring's traffic never matches a user's message,
    and its error handler is set to return codes, which `_check` turns into FastringError.

    Example:
        >>> from mpi4py import MPI
        >>> t = Transport(MPI.COMM_WORLD)
        >>> t.rank, t.size
        (0, 1)
    """
    cdef MPI_Comm comm
    cdef readonly int rank
    cdef readonly int size
    cdef object _owner  # the mpi4py duplicate, kept alive and freed with this object
    # Process ids of every rank, set when `enable_single_copy` finds that all ranks share
    # this host and may copy from and into each other's memory (NULL otherwise).
    cdef pid_t* pids
    # The fraction of a broadcast's bytes this rank, as root, writes into each other rank,
    # per power-of-two message size: learnt from how fast its writes and the others' reads
    # went, since a write into lines another core holds can cost half again a read.
    cdef double root_share[64]
    # Which of ring_allreduce_wire's three 16-bit buffers is sending, spare and landing: kept
    # from one call to the next, since the rule it follows spans calls.
    cdef int wire_roles[3]

    def __cinit__(self, Comm comm not None):
        dup = comm.Dup()
        self._owner = dup
        self.comm = (<Comm> dup).ob_mpi
        _check(mpi.MPI_Comm_set_errhandler(self.comm, mpi.MPI_ERRORS_RETURN))
        _check(mpi.MPI_Comm_rank(self.comm, &self.rank))
        _check(mpi.MPI_Comm_size(self.comm, &self.size))
        self.wire_roles[0], self.wire_roles[1], self.wire_roles[2] = 0, 1, 2

    def __dealloc__(self):
        free(self.pids)

    @property
    def single_copy(self):
        """True when broadcasts may copy straight between the ranks' memories (see
        `enable_single_copy`)."""
        return self.pids != NULL

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
        cdef pid_t* pids = <pid_t*> malloc(self.size * sizeof(pid_t))
        if pids == NULL:
            raise MemoryError()
        cdef MPI_Comm local
        cdef int local_size = 0, works = 0, everywhere = 0
        cdef pid_t me = getpid()
        # Each rank offers `mark`; its left neighbour reads it and writes into its `slot`.
        cdef uint64_t mark = _PROBE_MARK + <uint64_t> self.rank
        cdef uint64_t slot = 0, seen = 0
        cdef uint64_t addrs[2]
        cdef uint64_t right_addrs[2]
        cdef int right = (self.rank + 1) % self.size, left = (self.rank - 1 + self.size) % self.size
        cdef int i
        try:
            with nogil:
                _check(mpi.MPI_Comm_split_type(self.comm, mpi.MPI_COMM_TYPE_SHARED, self.rank,
                                               mpi.MPI_INFO_NULL, &local))
                _check(mpi.MPI_Comm_size(local, &local_size))
                _check(mpi.MPI_Comm_free(&local))
                _check(mpi.MPI_Allgather(&me, sizeof(pid_t), mpi.MPI_BYTE, pids, sizeof(pid_t),
                                         mpi.MPI_BYTE, self.comm))
                addrs[0], addrs[1] = <uint64_t> &mark, <uint64_t> &slot
                _sendrecv(self.comm, <char*> addrs, sizeof(addrs), left, <char*> right_addrs,
                          sizeof(right_addrs), right, 11)
                if self.size > 1 and local_size == self.size:
                    works = (_vm_copy(False, pids[right], <char*> &seen, right_addrs[0], 8) == 0
                             and seen == _PROBE_MARK + <uint64_t> right
                             and _vm_copy(True, pids[right], <char*> &mark, right_addrs[1], 8) == 0)
                # Every write lands before anyone looks at its slot.
                _check(mpi.MPI_Allreduce(&works, &everywhere, 1, mpi.MPI_INT, mpi.MPI_MIN, self.comm))
                works = everywhere and slot == _PROBE_MARK + <uint64_t> left
                _check(mpi.MPI_Allreduce(&works, &everywhere, 1, mpi.MPI_INT, mpi.MPI_MIN, self.comm))
        except BaseException:
            free(pids)
            raise
        free(self.pids)
        self.pids = pids if everywhere else NULL
        for i in range(64):
            self.root_share[i] = 1.0 / self.size
        if not everywhere:
            free(pids)
        return bool(everywhere)

    def disable_single_copy(self):
        """Send broadcasts as MPI messages from now on (collective: every rank must call it,
        since the ranks of one broadcast must agree on how it travels).

        Example:
            >>> from mpi4py import MPI
            >>> t = Transport(MPI.COMM_WORLD); t.disable_single_copy(); t.single_copy
            False
        """
        free(self.pids)
        self.pids = NULL

    def _set_pid(self, int rank, pid_t pid):
        """Test hook: pretend `rank` runs as process `pid`, to make single copies fail."""
        if self.pids == NULL or not 0 <= rank < self.size:
            raise ValueError("single copy is off or the rank is out of range")
        self.pids[rank] = pid

    def free(self):
        """Release the duplicated communicator (collective over its ranks)."""
        if self._owner is not None:
            self._owner.Free()
            self._owner = None

    @property
    def comm(self):
        """The mpi4py communicator this transport sends on."""
        return self._owner

    def send(self, uintptr_t addr, MPI_Count nbytes, int dest, int tag=0):
        with nogil:
            _check(mpi.MPI_Send_c(<void*> addr, nbytes, mpi.MPI_BYTE, dest, tag, self.comm))

    def recv(self, uintptr_t addr, MPI_Count nbytes, int source, int tag=0):
        with nogil:
            _check(mpi.MPI_Recv_c(<void*> addr, nbytes, mpi.MPI_BYTE, source, tag, self.comm,
                                  mpi.MPI_STATUS_IGNORE))

    def isend(self, Requests reqs, uintptr_t addr, MPI_Count nbytes, int dest, int tag=0):
        cdef MPI_Request* slot = reqs.slot()
        with nogil:
            _check(mpi.MPI_Isend_c(<void*> addr, nbytes, mpi.MPI_BYTE, dest, tag, self.comm, slot))

    def irecv(self, Requests reqs, uintptr_t addr, MPI_Count nbytes, int source, int tag=0):
        cdef MPI_Request* slot = reqs.slot()
        with nogil:
            _check(mpi.MPI_Irecv_c(<void*> addr, nbytes, mpi.MPI_BYTE, source, tag, self.comm, slot))

    def sendrecv(self, uintptr_t send_addr, MPI_Count send_nbytes, int dest,
                 uintptr_t recv_addr, MPI_Count recv_nbytes, int source, int tag=0):
        with nogil:
            _sendrecv(self.comm, <char*> send_addr, send_nbytes, dest,
                      <char*> recv_addr, recv_nbytes, source, tag)

    def barrier(self):
        with nogil:
            _check(mpi.MPI_Barrier(self.comm))

    def mpi_allreduce(self, uintptr_t send_addr, uintptr_t recv_addr, MPI_Count count,
                      int dtype_code, int op_code):
        """The MPI library's own allreduce; send_addr == recv_addr means in place."""
        cdef MPI_Datatype dtype = _datatype(dtype_code)
        cdef MPI_Op op = _op(op_code)
        if dtype == mpi.MPI_DATATYPE_NULL or op == mpi.MPI_OP_NULL:
            raise ValueError(f"no MPI datatype/op for codes ({dtype_code}, {op_code})")
        cdef void* sendbuf = mpi.MPI_IN_PLACE if send_addr == recv_addr else <void*> send_addr
        with nogil:
            _check(mpi.MPI_Allreduce_c(sendbuf, <void*> recv_addr, count, dtype, op, self.comm))

    def ring_reduce_scatter(self, uintptr_t buf, const int64_t[::1] offsets, uintptr_t tmp,
                            int64_t segment_bytes, uintptr_t reduce_fn, int64_t itemsize,
                            int tag=1):
        """Reduce chunk c = buf[offsets[c]:offsets[c+1]] (bytes) over all ranks into rank c.

        After return, this rank's chunk `rank` holds the full reduction; other chunks hold
        partial sums. `tmp` must hold 2 * `segment_bytes`; segments are received there while the
        reduction of the previous one still sits in cache.
        """
        if offsets.shape[0] != self.size + 1:
            raise ValueError(f"offsets needs {self.size + 1} entries, got {offsets.shape[0]}")
        if segment_bytes < itemsize or segment_bytes % itemsize:
            raise ValueError(f"segment_bytes {segment_bytes} must be a positive multiple of {itemsize}")
        with nogil:
            _ring_reduce_scatter(self.comm, self.rank, self.size, <char*> buf, &offsets[0],
                                 <char*> tmp, segment_bytes, <reduce_fn_t> reduce_fn, itemsize, tag)

    def ring_allgather(self, uintptr_t buf, const int64_t[::1] offsets, int tag=2,
                       uintptr_t own=0):
        """Circulate chunk c, held complete by rank c, so that every rank holds every chunk.

        With `own`, this rank's chunk is sent from there rather than from its place in buf
        (which it may then fill before or after). A buffer that another rank's copy has just
        read is slow to write again (its cache lines are shared with that core: 200 µs
        instead of 12 for 512 KiB here), so sending from the caller's input leaves the
        result's lines to this rank alone.
        """
        if offsets.shape[0] != self.size + 1:
            raise ValueError(f"offsets needs {self.size + 1} entries, got {offsets.shape[0]}")
        with nogil:
            _ring_allgather(self.comm, self.rank, self.size, <char*> buf, &offsets[0],
                            <char*> own if own else <char*> buf + offsets[self.rank], tag)

    def recursive_doubling(self, uintptr_t buf, int64_t nbytes, uintptr_t tmp,
                           uintptr_t reduce_fn, int64_t itemsize, int tag=3):
        """Allreduce of a small buffer in log2(N) exchanges; `tmp` must hold nbytes."""
        with nogil:
            _recursive_doubling(self.comm, self.rank, self.size, <char*> buf, nbytes,
                                <char*> tmp, <reduce_fn_t> reduce_fn, itemsize, tag)


    def cycle_exchange(self, uintptr_t block, int64_t vector_words, int64_t capacity,
                       uintptr_t tmp, uintptr_t reduce_fn, int64_t itemsize,
                       double stall_seconds, object on_stall, int tag=4):
        """One negotiation cycle: an allreduce of a header and an optional speculative payload.

        `block` holds 3 + 2 * `vector_words` uint64 words followed by up to `capacity` payload
        bytes; `tmp` must hold as much. Word 0 is combined with OR (flags); word 1 (the
        speculative request's hash) and word 2 (its byte count) must agree on every rank or
        word 1 becomes SPECULATION_FAILED; then `vector_words` words are combined with AND (ready
        everywhere) and `vector_words` with OR (pending somewhere). When the
        speculative request agrees, the payloads are reduced with `reduce_fn`. Waiting longer
        than `stall_seconds` for a partner calls `on_stall(partner, waited)` (with the GIL),
        which may raise to abandon the cycle.

        Returns (flags, speculative hash, whether some rank has a request pending that is not
        ready everywhere, whether any request is ready everywhere).
        """
        cdef _Cycle cyc
        cyc.comm = self.comm
        cyc.words = 3 + 2 * vector_words
        cyc.vector_words = vector_words
        cyc.capacity = capacity
        cyc.reduce = <reduce_fn_t> reduce_fn
        cyc.itemsize = itemsize
        cyc.stall_seconds = stall_seconds
        cyc.on_stall = <void*> on_stall
        cyc.tag = tag
        cdef uint64_t* header = <uint64_t*> block
        cdef int64_t i
        cdef bint leftover = False, any_ready = False
        with nogil:
            _cycle_allreduce(&cyc, self.rank, self.size, <char*> block, <char*> tmp)
            for i in range(vector_words):
                any_ready = any_ready or header[3 + i] != 0
                leftover = leftover or (header[3 + vector_words + i] & ~header[3 + i]) != 0
        return header[0], header[1], leftover, any_ready


    def ring_allreduce_wire(self, uintptr_t src, uintptr_t dst, const int64_t[::1] offsets,
                            uintptr_t tmp, int64_t segment, uintptr_t encode_fn, uintptr_t hop_fn,
                            uintptr_t last_fn, uintptr_t decode_fn, int64_t acc_itemsize,
                            double mul, double div, double post, int tag=9):
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
        if offsets.shape[0] != self.size + 1:
            raise ValueError(f"offsets needs {self.size + 1} entries, got {offsets.shape[0]}")
        if segment < 1:
            raise ValueError(f"segment must be positive, got {segment}")
        if self.size < 2:
            raise ValueError("ring_allreduce_wire needs at least 2 ranks")
        cdef _WireRing w
        w.src, w.dst, w.accsize = <char*> src, <char*> dst, acc_itemsize
        w.mul, w.div, w.post = mul, div, post
        w.encode, w.hop, w.last = <wire_fn_t> encode_fn, <wire_fn_t> hop_fn, <wire_fn_t> last_fn
        w.decode = <wire_fn_t> decode_fn
        with nogil:
            _ring_allreduce_wire(self.comm, self.rank, self.size, &w, &offsets[0], <char*> tmp,
                                 segment, self.wire_roles, tag)


cdef int _sendrecv(MPI_Comm comm, char* send, MPI_Count send_nbytes, int dest,
                   char* recv, MPI_Count recv_nbytes, int source, int tag) except -1 nogil:
    return _check(mpi.MPI_Sendrecv_c(send, send_nbytes, mpi.MPI_BYTE, dest, tag,
                                     recv, recv_nbytes, mpi.MPI_BYTE, source, tag,
                                     comm, mpi.MPI_STATUS_IGNORE))


cdef inline int64_t _largest_chunk(const int64_t* offsets, int size) noexcept nogil:
    cdef int64_t largest = 0
    cdef int c
    for c in range(size):
        largest = max(largest, offsets[c + 1] - offsets[c])
    return largest


cdef inline int64_t _mod(int64_t a, int64_t n) noexcept nogil:
    return ((a % n) + n) % n


cdef int _post_exchange(MPI_Comm comm, char* send, int64_t send_nbytes, int dest,
                        char* recv, int64_t recv_nbytes, int source, int tag,
                        MPI_Request* reqs) except -1 nogil:
    _check(mpi.MPI_Irecv_c(recv, recv_nbytes, mpi.MPI_BYTE, source, tag, comm, &reqs[0]))
    return _check(mpi.MPI_Isend_c(send, send_nbytes, mpi.MPI_BYTE, dest, tag, comm, &reqs[1]))


cdef int _ring_reduce_scatter(MPI_Comm comm, int rank, int size, char* buf,
                              const int64_t* offsets, char* tmp, int64_t segment_bytes,
                              reduce_fn_t reduce, int64_t itemsize, int tag) except -1 nogil:
    # Double-buffered: segment k+1 is already posted (and the partner, waiting in MPI, keeps
    # moving its bytes) while segment k is reduced out of the other half of `tmp`.
    cdef int right = (rank + 1) % size
    cdef int left = (rank + size - 1) % size
    cdef int64_t largest = 0, step, seg, segments, send_c, recv_c, lo, hi
    cdef MPI_Request reqs[4]
    cdef char* halves[2]
    halves[0] = tmp
    halves[1] = tmp + segment_bytes
    largest = _largest_chunk(offsets, size)
    # Chunks differ in length by at most a few elements; every rank walks the same number of
    # segments (some possibly empty) so that each exchange has its partner.
    segments = (largest + segment_bytes - 1) // segment_bytes
    for step in range(size - 1):
        send_c = _mod(rank - step - 1, size)
        recv_c = _mod(rank - step - 2, size)
        for seg in range(segments + 1):
            if seg < segments:
                _post_exchange(comm, buf + _seg_lo(offsets, send_c, seg, segment_bytes),
                               _seg_len(offsets, send_c, seg, segment_bytes), right,
                               halves[seg % 2], _seg_len(offsets, recv_c, seg, segment_bytes),
                               left, tag, &reqs[2 * (seg % 2)])
            if seg > 0:
                _check(mpi.MPI_Waitall(2, &reqs[2 * ((seg - 1) % 2)], mpi.MPI_STATUSES_IGNORE))
                lo = _seg_lo(offsets, recv_c, seg - 1, segment_bytes)
                hi = lo + _seg_len(offsets, recv_c, seg - 1, segment_bytes)
                if hi > lo:
                    reduce(buf + lo, halves[(seg - 1) % 2], (hi - lo) // itemsize)
    return 0


cdef inline int64_t _seg_lo(const int64_t* offsets, int64_t chunk, int64_t seg,
                            int64_t segment) noexcept nogil:
    return offsets[chunk] + seg * segment


cdef inline int64_t _seg_len(const int64_t* offsets, int64_t chunk, int64_t seg,
                             int64_t segment) noexcept nogil:
    cdef int64_t lo = offsets[chunk] + seg * segment
    return max(min(lo + segment, offsets[chunk + 1]) - lo, 0)


cdef struct _WireRing:
    char* src
    char* dst
    int64_t accsize
    double mul, div, post
    wire_fn_t encode, hop, last, decode


cdef int _ring_allreduce_wire(MPI_Comm comm, int rank, int size, _WireRing* w,
                              const int64_t* offsets, char* tmp, int64_t segment,
                              int* roles, int tag) except -1 nogil:
    # Three 16-bit buffers rotate so that this rank's kernels only ever write a buffer whose
    # lines are its own: a buffer the next rank has just read (by copying it out of this
    # process) costs up to 20x more to overwrite (see Transport.ring_allgather), while a
    # buffer this rank has received into since is as fast as any. `sending` goes out next;
    # `spare` was last written by this rank and not read by another since; `landing` receives.
    # `roles` holds which buffer (0, 1, 2) is which, from the previous call to the next.
    cdef int right = (rank + 1) % size
    cdef int left = (rank + size - 1) % size
    cdef int64_t seg, step, c, lo, n
    cdef int64_t segments = (_largest_chunk(offsets, size) + segment - 1) // segment
    cdef char* sending = tmp + 2 * segment * roles[0]
    cdef char* spare = tmp + 2 * segment * roles[1]
    cdef char* landing = tmp + 2 * segment * roles[2]
    cdef char* sent
    for seg in range(segments):
        c = _mod(rank - 1, size)
        w.encode(spare, w.src + w.accsize * _seg_lo(offsets, c, seg, segment), NULL, NULL,
                 _seg_len(offsets, c, seg, segment), w.mul, w.div, w.post)
        sending, spare = spare, sending
        for step in range(size - 1):
            # send segment `seg` of chunk rank-step-1, receive that of chunk rank-step-2 (at
            # the last step this rank's own) and combine it into `spare`, to send next
            _sendrecv(comm, sending, 2 * _seg_len(offsets, _mod(rank - step - 1, size), seg, segment),
                      right, landing, 2 * _seg_len(offsets, _mod(rank - step - 2, size), seg, segment),
                      left, tag)
            c = _mod(rank - step - 2, size)
            lo, n = _seg_lo(offsets, c, seg, segment), _seg_len(offsets, c, seg, segment)
            (w.last if step == size - 2 else w.hop)(
                spare, w.src + w.accsize * lo, landing, w.dst + w.accsize * lo, n, w.mul, w.div, w.post)
            sent = sending
            sending, spare, landing = spare, landing, sent
        for step in range(size - 1):
            # `sending` holds the finished 16-bit segment of chunk rank-step; pass it on,
            # decode the one that arrives, and forward that one next
            _sendrecv(comm, sending, 2 * _seg_len(offsets, _mod(rank - step, size), seg, segment),
                      right, landing, 2 * _seg_len(offsets, _mod(rank - step - 1, size), seg, segment),
                      left, tag)
            c = _mod(rank - step - 1, size)
            lo, n = _seg_lo(offsets, c, seg, segment), _seg_len(offsets, c, seg, segment)
            w.decode(NULL, NULL, landing, w.dst + w.accsize * lo, n, w.mul, w.div, w.post)
            sending, landing = landing, sending
    roles[0] = (sending - tmp) // (2 * segment)
    roles[1] = (spare - tmp) // (2 * segment)
    roles[2] = (landing - tmp) // (2 * segment)
    return 0


cdef int _ring_allgather(MPI_Comm comm, int rank, int size, char* buf,
                         const int64_t* offsets, char* own, int tag) except -1 nogil:
    # No arithmetic to overlap here, so each step moves a whole chunk in one exchange.
    cdef int right = (rank + 1) % size
    cdef int left = (rank + size - 1) % size
    cdef int64_t step, send_c, recv_c
    for step in range(size - 1):
        send_c = _mod(rank - step, size)
        recv_c = _mod(rank - step - 1, size)
        _sendrecv(comm, own if step == 0 else buf + offsets[send_c],
                  offsets[send_c + 1] - offsets[send_c], right,
                  buf + offsets[recv_c], offsets[recv_c + 1] - offsets[recv_c], left, tag)
    return 0


cdef int _recursive_doubling(MPI_Comm comm, int rank, int size, char* buf, int64_t nbytes,
                             char* tmp, reduce_fn_t reduce, int64_t itemsize,
                             int tag) except -1 nogil:
    cdef int pof2 = 1
    cdef int rem, newrank, mask, partner_new, partner
    cdef int64_t count = nbytes // itemsize
    while pof2 * 2 <= size:
        pof2 *= 2
    rem = size - pof2
    # Fold the ranks beyond the largest power of two into their neighbours first: even ranks
    # below 2*rem hand their data to rank+1 and wait for the result.
    if rank < 2 * rem:
        if rank % 2 == 0:
            _check(mpi.MPI_Send_c(buf, nbytes, mpi.MPI_BYTE, rank + 1, tag, comm))
            newrank = -1
        else:
            _check(mpi.MPI_Recv_c(tmp, nbytes, mpi.MPI_BYTE, rank - 1, tag, comm,
                                  mpi.MPI_STATUS_IGNORE))
            if count:
                reduce(buf, tmp, count)
            newrank = rank // 2
    else:
        newrank = rank - rem
    if newrank != -1:
        mask = 1
        while mask < pof2:
            partner_new = newrank ^ mask
            partner = partner_new * 2 + 1 if partner_new < rem else partner_new + rem
            _sendrecv(comm, buf, nbytes, partner, tmp, nbytes, partner, tag)
            # Every op here is commutative and IEEE addition is too, so both partners compute
            # bitwise-identical results whatever the order of operands.
            if count:
                reduce(buf, tmp, count)
            mask <<= 1
    if rank < 2 * rem:
        if rank % 2 == 0:
            _check(mpi.MPI_Recv_c(buf, nbytes, mpi.MPI_BYTE, rank + 1, tag, comm,
                                  mpi.MPI_STATUS_IGNORE))
        else:
            _check(mpi.MPI_Send_c(buf, nbytes, mpi.MPI_BYTE, rank - 1, tag, comm))
    return 0


cimport numpy as cnp
cnp.import_array()


def array_address(cnp.ndarray array not None):
    """Address of an array's first byte (cheaper than `ndarray.ctypes.data` on hot paths).

    Example:
        >>> import numpy as np
        >>> a = np.zeros(2)
        >>> array_address(a) == a.ctypes.data
        True
    """
    return <uintptr_t> cnp.PyArray_DATA(array)


def is_writable_c_contiguous(cnp.ndarray array not None):
    """True when the array can be reduced in place: C-contiguous and writeable."""
    return cnp.PyArray_IS_C_CONTIGUOUS(array) and cnp.PyArray_ISWRITEABLE(array)


SPECULATION_FAILED = 0xFFFFFFFFFFFFFFFF
cdef uint64_t _FAILED = 0xFFFFFFFFFFFFFFFF


cdef struct _Cycle:
    MPI_Comm comm
    int64_t words
    int64_t vector_words
    int64_t capacity
    reduce_fn_t reduce
    int64_t itemsize
    double stall_seconds
    void* on_stall
    int tag


cdef double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + 1e-9 * ts.tv_nsec


cdef int _call_on_stall(_Cycle* cyc, int partner, double waited) except -1 with gil:
    (<object> cyc.on_stall)(partner, waited)
    return 0


cdef int _wait_patiently(_Cycle* cyc, MPI_Request* reqs, int n, int partner) except -1 nogil:
    # Spin first (a partner already in the cycle answers within microseconds), then back off
    # with short sleeps so that a rank waiting long for a slow partner leaves its core to the
    # training thread. Every stall_seconds the stall callback may report or raise.
    cdef int done = 0
    cdef long spins = 0
    cdef double start = _now(), next_report = start + cyc.stall_seconds
    cdef timespec pause
    pause.tv_sec = 0
    pause.tv_nsec = 20000
    while True:
        _check(mpi.MPI_Testall(n, reqs, &done, mpi.MPI_STATUSES_IGNORE))
        if done:
            return 0
        spins += 1
        if spins > 300:
            nanosleep(&pause, NULL)
            if pause.tv_nsec < 500000:
                pause.tv_nsec += 20000
            if cyc.stall_seconds > 0 and _now() >= next_report:
                _call_on_stall(cyc, partner, _now() - start)
                next_report = _now() + cyc.stall_seconds


cdef inline int64_t _block_bytes(_Cycle* cyc, uint64_t* header) noexcept nogil:
    cdef int64_t payload = 0
    if header[1] != 0 and header[1] != _FAILED:
        payload = <int64_t> header[2]
    return cyc.words * 8 + payload


cdef int _cycle_send(_Cycle* cyc, char* block, int peer) except -1 nogil:
    cdef MPI_Request req
    _check(mpi.MPI_Isend_c(block, _block_bytes(cyc, <uint64_t*> block), mpi.MPI_BYTE, peer,
                           cyc.tag, cyc.comm, &req))
    return _wait_patiently(cyc, &req, 1, peer)


cdef int _cycle_recv(_Cycle* cyc, char* into, int peer) except -1 nogil:
    cdef MPI_Request req
    _check(mpi.MPI_Irecv_c(into, cyc.words * 8 + cyc.capacity, mpi.MPI_BYTE, peer,
                           cyc.tag, cyc.comm, &req))
    return _wait_patiently(cyc, &req, 1, peer)


cdef int _cycle_swap(_Cycle* cyc, char* block, char* tmp, int peer) except -1 nogil:
    cdef MPI_Request reqs[2]
    _check(mpi.MPI_Irecv_c(tmp, cyc.words * 8 + cyc.capacity, mpi.MPI_BYTE, peer,
                           cyc.tag, cyc.comm, &reqs[0]))
    _check(mpi.MPI_Isend_c(block, _block_bytes(cyc, <uint64_t*> block), mpi.MPI_BYTE, peer,
                           cyc.tag, cyc.comm, &reqs[1]))
    return _wait_patiently(cyc, reqs, 2, peer)


cdef void _cycle_combine(_Cycle* cyc, char* block, char* other) noexcept nogil:
    cdef uint64_t* mine = <uint64_t*> block
    cdef uint64_t* theirs = <uint64_t*> other
    cdef int64_t i
    mine[0] |= theirs[0]
    for i in range(3, 3 + cyc.vector_words):
        mine[i] &= theirs[i]
    for i in range(3 + cyc.vector_words, cyc.words):
        mine[i] |= theirs[i]
    if mine[1] != theirs[1] or mine[2] != theirs[2]:
        mine[1] = _FAILED
    elif mine[1] != 0 and mine[1] != _FAILED and mine[2] > 0:
        cyc.reduce(block + cyc.words * 8, other + cyc.words * 8, <int64_t> mine[2] // cyc.itemsize)


cdef int _cycle_allreduce(_Cycle* cyc, int rank, int size, char* block, char* tmp) except -1 nogil:
    # Recursive doubling with the same fold-in of surplus ranks as _recursive_doubling; the
    # combine is commutative, so every rank ends with the same bytes.
    cdef int pof2 = 1
    cdef int rem, newrank, mask, partner_new, partner
    while pof2 * 2 <= size:
        pof2 *= 2
    rem = size - pof2
    if rank < 2 * rem:
        if rank % 2 == 0:
            _cycle_send(cyc, block, rank + 1)
            newrank = -1
        else:
            _cycle_recv(cyc, tmp, rank - 1)
            _cycle_combine(cyc, block, tmp)
            newrank = rank // 2
    else:
        newrank = rank - rem
    if newrank != -1:
        mask = 1
        while mask < pof2:
            partner_new = newrank ^ mask
            partner = partner_new * 2 + 1 if partner_new < rem else partner_new + rem
            _cycle_swap(cyc, block, tmp, partner)
            _cycle_combine(cyc, block, tmp)
            mask <<= 1
    if rank < 2 * rem:
        if rank % 2 == 0:
            _cycle_recv(cyc, block, rank + 1)
        else:
            _cycle_send(cyc, block, rank - 1)
    return 0


def copy_from_array(uintptr_t dst, cnp.ndarray array not None):
    """Copy a C-contiguous array's bytes to `dst` and return True, or return False (and copy
    nothing) when the array is not contiguous. One call for the latency path."""
    if not cnp.PyArray_IS_C_CONTIGUOUS(array):
        return False
    memcpy(<void*> dst, cnp.PyArray_DATA(array), cnp.PyArray_NBYTES(array))
    return True


def copy_to_array(cnp.ndarray array not None, uintptr_t src):
    """Copy as many bytes as a C-contiguous, writeable array holds from `src` into it."""
    if not (cnp.PyArray_IS_C_CONTIGUOUS(array) and cnp.PyArray_ISWRITEABLE(array)):
        raise ValueError("copy_to_array needs a C-contiguous, writeable array")
    memcpy(cnp.PyArray_DATA(array), <void*> src, cnp.PyArray_NBYTES(array))


def is_c_contiguous(cnp.ndarray array not None):
    """True when the array's elements are contiguous in C order."""
    return cnp.PyArray_IS_C_CONTIGUOUS(array)


# ---------------------------------------------------------------- the other collectives
# Module-level functions on a Transport (fastring/collectives.py drives them). Tags 5-8 keep
# their messages apart from the allreduce loops' and the negotiation cycle's.

cdef inline int _check_offsets(Transport t, const int64_t[::1] offsets, str what) except -1:
    if offsets.shape[0] != t.size + 1:
        raise ValueError(f"{what} needs {t.size + 1} entries, got {offsets.shape[0]}")
    return 0


cdef int _check_ring_args(Transport t, const int64_t[::1] offsets, int64_t segment_bytes,
                          int64_t itemsize) except -1:
    _check_offsets(t, offsets, "offsets")
    if segment_bytes < itemsize or segment_bytes % itemsize:
        raise ValueError(f"segment_bytes {segment_bytes} must be a positive multiple of {itemsize}")
    return 0


def pairwise_alltoall(Transport t, uintptr_t send, const int64_t[::1] send_offsets,
                      uintptr_t recv, const int64_t[::1] recv_offsets, int tag=5):
    """Alltoall by pairwise exchange: block c of `send` (bytes send_offsets[c]..[c+1]) goes to
    rank c, which stores it as block `rank` of its `recv`. In step k = 1..N-1 a rank sends to
    rank+k and receives from rank-k, so every step pairs all ranks at once; its own block is
    copied. Block sizes must agree between the partners (exchange them first).

    Example:
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> t = Transport(MPI.COMM_WORLD)
        >>> a, b = np.arange(4, dtype=np.uint8), np.zeros(4, np.uint8)
        >>> pairwise_alltoall(t, a.ctypes.data, np.array([0, 4]), b.ctypes.data, np.array([0, 4]))
        >>> b.tolist()
        [0, 1, 2, 3]
    """
    _check_offsets(t, send_offsets, "send_offsets")
    _check_offsets(t, recv_offsets, "recv_offsets")
    if send_offsets[t.rank + 1] - send_offsets[t.rank] != recv_offsets[t.rank + 1] - recv_offsets[t.rank]:
        raise ValueError("the block a rank sends itself must be as long as the one it receives")
    with nogil:
        _pairwise_alltoall(t.comm, t.rank, t.size, <char*> send, &send_offsets[0],
                           <char*> recv, &recv_offsets[0], tag)


cdef int _pairwise_alltoall(MPI_Comm comm, int rank, int size, char* send, const int64_t* soff,
                            char* recv, const int64_t* roff, int tag) except -1 nogil:
    cdef int k, dest, source
    memcpy(recv + roff[rank], send + soff[rank], soff[rank + 1] - soff[rank])
    for k in range(1, size):
        dest = (rank + k) % size
        source = (rank + size - k) % size
        _sendrecv(comm, send + soff[dest], soff[dest + 1] - soff[dest], dest,
                  recv + roff[source], roff[source + 1] - roff[source], source, tag)
    return 0


def tree_broadcast(Transport t, uintptr_t buf, int64_t nbytes, int root, int tag=6):
    """Binomial-tree broadcast of `nbytes` at `buf` from `root`: ceil(log2 N) rounds, each
    message whole. The latency algorithm (and the only one needed on two ranks).

    Example:
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> t = Transport(MPI.COMM_WORLD); a = np.ones(3)
        >>> tree_broadcast(t, a.ctypes.data, a.nbytes, 0)
    """
    if not 0 <= root < t.size:
        raise ValueError(f"root {root} is outside [0, {t.size})")
    with nogil:
        _tree_broadcast(t.comm, t.rank, t.size, root, <char*> buf, nbytes, tag)


cdef int _tree_broadcast(MPI_Comm comm, int rank, int size, int root, char* buf,
                         int64_t nbytes, int tag) except -1 nogil:
    # Ranks relative to the root: relative rank v receives from v - (its lowest set bit),
    # then sends to v + m for every smaller power of two m.
    cdef int v = (rank - root + size) % size
    cdef int mask = 1
    while mask < size:
        if v & mask:
            _check(mpi.MPI_Recv_c(buf, nbytes, mpi.MPI_BYTE, (rank - mask + size) % size, tag, comm,
                                  mpi.MPI_STATUS_IGNORE))
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if v + mask < size:
            _check(mpi.MPI_Send_c(buf, nbytes, mpi.MPI_BYTE, (rank + mask) % size, tag, comm))
        mask >>= 1
    return 0


def single_copy_broadcast(Transport t, uintptr_t buf, int64_t nbytes, int root, int tag=11):
    """Broadcast from `root` by copying straight between the ranks' memories (requires
    `t.single_copy`): every rank sends the root its buffer's address; the root writes the
    first part of the bytes into every other rank while each of them reads the rest from the
    root, so that on two ranks both processes copy at once, where with a point-to-point
    message only the receiver copies. A final status exchange keeps every buffer in use until
    all copies into or out of it are done.

    The root's part starts at 1/N and then follows the speeds measured in the previous
    broadcasts of about this size, so that the root and the readers finish together.

    If a copy fails (a policy that changed since `enable_single_copy`), every rank learns it
    in that status exchange, the bytes go again by `tree_broadcast`, single copy is switched
    off on every rank, and the failing errno is returned (0 on success).

    Example:
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> t = Transport(MPI.COMM_WORLD); a = np.ones(3)
        >>> t.enable_single_copy() and single_copy_broadcast(t, a.ctypes.data, a.nbytes, 0)
        False
    """
    if not 0 <= root < t.size:
        raise ValueError(f"root {root} is outside [0, {t.size})")
    if not t.single_copy:
        raise ValueError("single copy is not enabled on this transport (enable_single_copy)")
    if nbytes < 0:
        raise ValueError(f"nbytes must not be negative, got {nbytes}")
    cdef uint64_t failed = 0
    cdef uint64_t* addrs = <uint64_t*> malloc(t.size * sizeof(uint64_t))
    if addrs == NULL:
        raise MemoryError()
    cdef double* share = &t.root_share[_bit_length(nbytes)]
    try:
        with nogil:
            failed = _single_copy_broadcast(t.comm, t.rank, t.size, root, <char*> buf, nbytes,
                                            t.pids, addrs, share, tag)
            if failed:
                _tree_broadcast(t.comm, t.rank, t.size, root, <char*> buf, nbytes, tag)
    finally:
        free(addrs)
    if failed:
        t.disable_single_copy()
    return failed


cdef inline int _bit_length(uint64_t n) noexcept nogil:
    cdef int bits = 0
    while n:
        n >>= 1
        bits += 1
    return bits


cdef int _vm_copy(bint write, pid_t pid, char* local, uint64_t remote, int64_t nbytes) noexcept nogil:
    """Copy nbytes between `local` and process pid's address `remote`; 0 or an errno."""
    cdef iovec here, there
    cdef ssize_t done
    while nbytes > 0:
        here.iov_base, here.iov_len = local, nbytes
        there.iov_base, there.iov_len = <void*> remote, nbytes
        if write:
            done = process_vm_writev(pid, &here, 1, &there, 1, 0)
        else:
            done = process_vm_readv(pid, &here, 1, &there, 1, 0)
        if done <= 0:
            return errno if done < 0 and errno != 0 else EIO
        local += done
        remote += done
        nbytes -= done
    return 0


cdef uint64_t _single_copy_broadcast(MPI_Comm comm, int rank, int size, int root, char* buf,
                                     int64_t nbytes, const pid_t* pids, uint64_t* addrs,
                                     double* root_share, int tag) except? 0xFFFFFFFFFFFFFFFF nogil:
    # The root sends (its address, how many leading bytes it writes); a reader answers with
    # its address, then with (errno or 0, nanoseconds its read took); the root answers with
    # the first failure anyone had.
    cdef uint64_t offer[2]
    cdef uint64_t report[2]
    cdef uint64_t failed = 0, mine = <uint64_t> buf
    cdef double began, wrote, slowest_read = 0, f, write_rate, read_rate
    cdef int64_t share
    cdef int j
    if rank != root:
        _sendrecv(comm, <char*> &mine, 8, root, <char*> offer, 16, root, tag)
        share = <int64_t> offer[1]
        began = _now()
        report[0] = _vm_copy(False, pids[root], buf + share, offer[0] + share, nbytes - share)
        report[1] = <uint64_t> ((_now() - began) * 1e9)
        _sendrecv(comm, <char*> report, 16, root, <char*> &failed, 8, root, tag)
        return failed
    share = (<int64_t> (nbytes * root_share[0])) & ~(<int64_t> 63)  # whole cache lines
    offer[0], offer[1] = mine, share
    for j in range(size):
        if j != root:
            _sendrecv(comm, <char*> offer, 16, j, <char*> &addrs[j], 8, j, tag)
    began = _now()
    for j in range(size):
        if j != root and not failed:
            failed = _vm_copy(True, pids[j], buf, addrs[j], share)
    wrote = _now() - began
    for j in range(size):
        if j != root:
            _check(mpi.MPI_Recv(report, 16, mpi.MPI_BYTE, j, tag, comm, mpi.MPI_STATUS_IGNORE))
            failed = failed or report[0]
            slowest_read = max(slowest_read, 1e-9 * report[1])
    for j in range(size):
        if j != root:
            _check(mpi.MPI_Send(&failed, 8, mpi.MPI_BYTE, j, tag, comm))
    if not failed and wrote > 0 and slowest_read > 0 and 0 < share < nbytes:
        # Both finish together when share * (N-1) / write_rate == (nbytes - share) / read_rate.
        write_rate = share * (size - 1) / wrote
        read_rate = (nbytes - share) / slowest_read
        f = write_rate / (write_rate + (size - 1) * read_rate)
        root_share[0] = min(0.9, max(0.05, 0.75 * root_share[0] + 0.25 * f))
    return failed


def chain_broadcast(Transport t, uintptr_t buf, int64_t nbytes, int root, int64_t segment_bytes,
                    int tag=7):
    """Pipelined chain broadcast from `root`: root -> root+1 -> ... in segments, each rank
    forwarding segment s while it receives segment s+1, so a large message costs about one
    transfer of its bytes plus (N-2) segments, whatever N.

    Example:
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> t = Transport(MPI.COMM_WORLD); a = np.ones(3)
        >>> chain_broadcast(t, a.ctypes.data, a.nbytes, 0, 8)
    """
    if not 0 <= root < t.size:
        raise ValueError(f"root {root} is outside [0, {t.size})")
    if segment_bytes <= 0:
        raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
    with nogil:
        _chain_broadcast(t.comm, t.rank, t.size, root, <char*> buf, nbytes, segment_bytes, tag)


cdef int _chain_broadcast(MPI_Comm comm, int rank, int size, int root, char* buf, int64_t nbytes,
                          int64_t segment, int tag) except -1 nogil:
    cdef int v = (rank - root + size) % size
    cdef bint has_prev = v > 0
    cdef bint has_next = v < size - 1
    cdef int prev = (rank + size - 1) % size
    cdef int nxt = (rank + 1) % size
    cdef int64_t segments = (nbytes + segment - 1) // segment
    cdef int64_t s, lo
    cdef MPI_Request recv_req = mpi.MPI_REQUEST_NULL
    cdef MPI_Request send_req = mpi.MPI_REQUEST_NULL
    if has_prev and segments > 0:
        _check(mpi.MPI_Irecv_c(buf, min(segment, nbytes), mpi.MPI_BYTE, prev, tag, comm, &recv_req))
    for s in range(segments):
        lo = s * segment
        if has_prev:
            _check(mpi.MPI_Wait(&recv_req, mpi.MPI_STATUS_IGNORE))
            if s + 1 < segments:
                _check(mpi.MPI_Irecv_c(buf + lo + segment, min(segment, nbytes - lo - segment),
                                       mpi.MPI_BYTE, prev, tag, comm, &recv_req))
        if has_next:
            _check(mpi.MPI_Wait(&send_req, mpi.MPI_STATUS_IGNORE))
            _check(mpi.MPI_Isend_c(buf + lo, min(segment, nbytes - lo), mpi.MPI_BYTE, nxt, tag,
                                   comm, &send_req))
    _check(mpi.MPI_Wait(&send_req, mpi.MPI_STATUS_IGNORE))
    return 0


def ring_reduce_scatter_into(Transport t, uintptr_t src, const int64_t[::1] offsets,
                             uintptr_t out, uintptr_t work, int64_t segment_bytes,
                             uintptr_t reduce_fn, int64_t itemsize, int tag=8):
    """Ring reduce-scatter that leaves `src` untouched: the reduction over all ranks of chunk
    `rank` (bytes offsets[rank]..[rank+1] of src) lands in `out`.

    A partial sum is received straight into a buffer and this rank's input is reduced into it
    (every op is commutative), so nothing is copied: `work` holds two chunks of the largest
    size, used in turn, and the last step receives into `out` itself.

    Example:
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> t = Transport(MPI.COMM_WORLD); a = np.ones(3); o = np.zeros(3)
        >>> ring_reduce_scatter_into(t, a.ctypes.data, np.array([0, 24]), o.ctypes.data, 0, 8, 0, 8)
        >>> o.tolist()
        [1.0, 1.0, 1.0]
    """
    _check_ring_args(t, offsets, segment_bytes, itemsize)
    with nogil:
        if t.size == 1:
            memcpy(<void*> out, <void*> src, offsets[1] - offsets[0])
        else:
            _ring_reduce_scatter_into(t.comm, t.rank, t.size, <const char*> src, &offsets[0],
                                      <char*> out, <char*> work, segment_bytes,
                                      <reduce_fn_t> reduce_fn, itemsize, False, tag)


def ring_reduce_scatter_to(Transport t, uintptr_t src, const int64_t[::1] offsets, uintptr_t dst,
                           int64_t segment_bytes, uintptr_t reduce_fn, int64_t itemsize, int tag=10):
    """Reduce-scatter from `src` into the same-sized `dst`, leaving `src` untouched: an
    out-of-place allreduce needs no copy of its input. Chunks are received straight into
    `dst` and this rank's input is reduced into them; afterwards chunk `rank` of `dst` holds
    the reduction over all ranks (the others partial sums, for the allgather to overwrite).

    Example:
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> t = Transport(MPI.COMM_WORLD); a = np.ones(3); o = np.zeros(3)
        >>> ring_reduce_scatter_to(t, a.ctypes.data, np.array([0, 24]), o.ctypes.data, 8, 0, 8)
        >>> o.tolist()
        [1.0, 1.0, 1.0]
    """
    _check_ring_args(t, offsets, segment_bytes, itemsize)
    with nogil:
        if t.size == 1:
            memcpy(<void*> dst, <void*> src, offsets[1] - offsets[0])
        else:
            _ring_reduce_scatter_into(t.comm, t.rank, t.size, <const char*> src, &offsets[0],
                                      <char*> dst, NULL, segment_bytes, <reduce_fn_t> reduce_fn,
                                      itemsize, True, tag)


cdef int _ring_reduce_scatter_into(MPI_Comm comm, int rank, int size, const char* src,
                                   const int64_t* offsets, char* out, char* work,
                                   int64_t segment_bytes, reduce_fn_t reduce, int64_t itemsize,
                                   bint full_dst, int tag) except -1 nogil:
    # full_dst: `out` is as large as `src` and every chunk passes through its own place
    # there; otherwise `out` holds only this rank's chunk and `work` two chunks in turn.
    cdef int right = (rank + 1) % size
    cdef int left = (rank + size - 1) % size
    cdef int64_t largest = 0, step, seg, segments, send_c, recv_c, s_len, r_len, s_hi, r_hi, lo
    cdef const char* send_base
    cdef char* recv_base
    largest = _largest_chunk(offsets, size)
    segments = (largest + segment_bytes - 1) // segment_bytes
    for step in range(size - 1):
        send_c = _mod(rank - step - 1, size)
        recv_c = _mod(rank - step - 2, size)   # at the last step, this rank's own chunk
        # Step 0 sends an untouched input chunk; later steps forward what the previous received.
        if full_dst:
            send_base = src + offsets[send_c] if step == 0 else out + offsets[send_c]
            recv_base = out + offsets[recv_c]
        else:
            send_base = src + offsets[send_c] if step == 0 else work + ((step - 1) % 2) * largest
            recv_base = out if step == size - 2 else work + (step % 2) * largest
        s_len = offsets[send_c + 1] - offsets[send_c]
        r_len = offsets[recv_c + 1] - offsets[recv_c]
        for seg in range(segments):
            lo = seg * segment_bytes
            s_hi = min(lo + segment_bytes, s_len)
            r_hi = min(lo + segment_bytes, r_len)
            _sendrecv(comm, <char*> send_base + lo, max(s_hi - lo, 0), right,
                      recv_base + lo, max(r_hi - lo, 0), left, tag)
            if r_hi > lo:
                reduce(recv_base + lo, <void*> (src + offsets[recv_c] + lo), (r_hi - lo) // itemsize)
    return 0
