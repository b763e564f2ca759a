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

cimport mpi4py.libmpi as mpi
from mpi4py.libmpi cimport MPI_Comm, MPI_Request, MPI_Count, MPI_Datatype, MPI_Op
from mpi4py.MPI cimport Comm

from ._errors import FastringError

# A chunk reduction: dst[i] = dst[i] op src[i] for i < count (elements, not bytes).
ctypedef void (*reduce_fn_t)(void* dst, void* src, int64_t count) noexcept nogil


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

    def __cinit__(self, Comm comm not None):
        dup = comm.Dup()
        self._owner = dup
        self.comm = (<Comm> dup).ob_mpi
        _check(mpi.MPI_Comm_set_errhandler(self.comm, mpi.MPI_ERRORS_RETURN))
        _check(mpi.MPI_Comm_rank(self.comm, &self.rank))
        _check(mpi.MPI_Comm_size(self.comm, &self.size))

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
        partial sums. `tmp` must hold `segment_bytes`; segments are received there while the
        reduction of the previous one still sits in cache.
        """
        if offsets.shape[0] != self.size + 1:
            raise ValueError(f"offsets needs {self.size + 1} entries, got {offsets.shape[0]}")
        if segment_bytes < itemsize or segment_bytes % itemsize:
            raise ValueError(f"segment_bytes {segment_bytes} must be a positive multiple of {itemsize}")
        with nogil:
            _ring_reduce_scatter(self.comm, self.rank, self.size, <char*> buf, &offsets[0],
                                 <char*> tmp, segment_bytes, <reduce_fn_t> reduce_fn, itemsize, tag)

    def ring_allgather(self, uintptr_t buf, const int64_t[::1] offsets, int tag=2):
        """Circulate chunk c, held complete by rank c, so that every rank holds every chunk."""
        if offsets.shape[0] != self.size + 1:
            raise ValueError(f"offsets needs {self.size + 1} entries, got {offsets.shape[0]}")
        with nogil:
            _ring_allgather(self.comm, self.rank, self.size, <char*> buf, &offsets[0], tag)

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


cdef int _sendrecv(MPI_Comm comm, char* send, MPI_Count send_nbytes, int dest,
                   char* recv, MPI_Count recv_nbytes, int source, int tag) except -1 nogil:
    return _check(mpi.MPI_Sendrecv_c(send, send_nbytes, mpi.MPI_BYTE, dest, tag,
                                     recv, recv_nbytes, mpi.MPI_BYTE, source, tag,
                                     comm, mpi.MPI_STATUS_IGNORE))


cdef inline int64_t _mod(int64_t a, int64_t n) noexcept nogil:
    return ((a % n) + n) % n


cdef int _ring_reduce_scatter(MPI_Comm comm, int rank, int size, char* buf,
                              const int64_t* offsets, char* tmp, int64_t segment_bytes,
                              reduce_fn_t reduce, int64_t itemsize, int tag) except -1 nogil:
    cdef int right = (rank + 1) % size
    cdef int left = (rank + size - 1) % size
    cdef int64_t largest = 0, step, seg, segments, send_c, recv_c
    cdef int64_t s_lo, s_hi, r_lo, r_hi
    cdef int c
    for c in range(size):
        if offsets[c + 1] - offsets[c] > largest:
            largest = offsets[c + 1] - offsets[c]
    # Chunks differ in length by at most a few elements; every rank walks the same number of
    # segments (some possibly empty) so that each sendrecv has its partner.
    segments = (largest + segment_bytes - 1) // segment_bytes
    for step in range(size - 1):
        send_c = _mod(rank - step - 1, size)
        recv_c = _mod(rank - step - 2, size)
        for seg in range(segments):
            s_lo = offsets[send_c] + seg * segment_bytes
            s_hi = min(s_lo + segment_bytes, offsets[send_c + 1])
            r_lo = offsets[recv_c] + seg * segment_bytes
            r_hi = min(r_lo + segment_bytes, offsets[recv_c + 1])
            _sendrecv(comm, buf + s_lo, max(s_hi - s_lo, 0), right,
                      tmp, max(r_hi - r_lo, 0), left, tag)
            if r_hi > r_lo:
                reduce(buf + r_lo, tmp, (r_hi - r_lo) // itemsize)
    return 0


cdef int _ring_allgather(MPI_Comm comm, int rank, int size, char* buf,
                         const int64_t* offsets, int tag) except -1 nogil:
    # No arithmetic to overlap here, so each step moves a whole chunk in one exchange.
    cdef int right = (rank + 1) % size
    cdef int left = (rank + size - 1) % size
    cdef int64_t step, send_c, recv_c
    for step in range(size - 1):
        send_c = _mod(rank - step, size)
        recv_c = _mod(rank - step - 1, size)
        _sendrecv(comm, buf + offsets[send_c], offsets[send_c + 1] - offsets[send_c], right,
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
        if spins > 2000:
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


def copy_bytes(uintptr_t dst, uintptr_t src, size_t nbytes):
    """memcpy between two addresses (the GIL is kept: used on small buffers only)."""
    memcpy(<void*> dst, <void*> src, nbytes)


def is_c_contiguous(cnp.ndarray array not None):
    """True when the array's elements are contiguous in C order."""
    return cnp.PyArray_IS_C_CONTIGUOUS(array)
