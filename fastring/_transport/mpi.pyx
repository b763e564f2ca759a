# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""MPI on raw addresses: the error check, the dtype and op codes, the exchange helpers every
algorithm uses, and `TransportBase`, the communicator and the C state kept with it.

Only (address, byte count, rank, tag) and plain integer codes cross this layer; the Python
layers above validate tensors and raise errors that name the bad argument. Every MPI call runs
`with nogil` and goes through `check`, which turns an MPI error code into FastringError
carrying MPI's own error string. The large-count (`_c`) MPI-4 calls are used throughout, so a
message larger than 2 GiB needs no splitting.
"""

from libc.stdint cimport uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from posix.unistd cimport _exit, write
from posix.time cimport clock_gettime, nanosleep, timespec, CLOCK_MONOTONIC

cdef extern from "<sched.h>" nogil:
    int sched_yield()

from mpi4py.MPI cimport Comm

from .._core.config import (WAIT_LONG_PAUSE_SECONDS, WAIT_LONG_SECONDS, WAIT_PAUSE_STEP_SECONDS,
                            WAIT_SHORT_PAUSE_SECONDS, WAIT_SPIN_BYTES_PER_SECOND, WAIT_DATA_SPIN_SECONDS)
from .._core.errors import FastringError

import sys


cdef int raise_mpi_error(int code) except -1 with gil:
    cdef char message[512]
    cdef int length = 0
    if mpi.MPI_Error_string(code, message, &length) != mpi.MPI_SUCCESS:
        raise FastringError(f"MPI call failed with error code {code}")
    raise FastringError(f"MPI call failed: {message[:length].decode('utf-8', 'replace')} (code {code})")


# The codes of fastring._core.dtypes (DtypeSpec.mpi_code) and fastring._core.ops (MPI_OP,
# MPI_BOOL_OP) index these tables: an enum across the seam, never strings.
cdef MPI_Datatype _DATATYPES[11]
_DATATYPES[:] = [mpi.MPI_UINT8_T, mpi.MPI_INT8_T, mpi.MPI_INT32_T, mpi.MPI_INT64_T, mpi.MPI_FLOAT,
                 mpi.MPI_DOUBLE, mpi.MPI_C_BOOL, mpi.MPI_INT16_T, mpi.MPI_UINT16_T, mpi.MPI_UINT32_T,
                 mpi.MPI_UINT64_T]
cdef MPI_Op _OPS[6]
_OPS[:] = [mpi.MPI_SUM, mpi.MPI_MIN, mpi.MPI_MAX, mpi.MPI_PROD, mpi.MPI_LOR, mpi.MPI_LAND]


cdef MPI_Datatype datatype(int code) noexcept:
    return _DATATYPES[code] if 0 <= code < 11 else mpi.MPI_DATATYPE_NULL


cdef MPI_Op reduce_op(int code) noexcept:
    return _OPS[code] if 0 <= code < 6 else mpi.MPI_OP_NULL


# How a wait paces itself (fastring/_core/config.py, "waiting for a partner"), read once.
cdef double _DATA_SPIN = WAIT_DATA_SPIN_SECONDS
cdef double _SPIN_RATE = WAIT_SPIN_BYTES_PER_SECOND
cdef double _STEP = WAIT_PAUSE_STEP_SECONDS
cdef double _SHORT_PAUSE = WAIT_SHORT_PAUSE_SECONDS
cdef double _LONG = WAIT_LONG_SECONDS
cdef double _LONG_PAUSE = WAIT_LONG_PAUSE_SECONDS


cdef int _call_hook(const Link* link, int partner, double waited, MPI_Request* reqs, int n,
                    const int* peers, MPI_Request* also, const int* also_peers,
                    int n_also) except -1 with gil:
    try:
        (<object> link.hook)(partner, waited)
    except BaseException:
        _give_up(reqs, n, peers)
        _give_up(also, n_also, also_peers)
        raise
    return 0


cdef int _pending_peer(MPI_Request* reqs, int n, const int* peers) except? -2 nogil:
    """The peer of the first request of `reqs` still pending (-1 when it is not known), or -2
    when all have completed; completed requests become MPI_REQUEST_NULL."""
    cdef int i, done = 0
    for i in range(n):
        if reqs[i] != mpi.MPI_REQUEST_NULL:
            check(mpi.MPI_Test(&reqs[i], &done, mpi.MPI_STATUS_IGNORE))
            if not done:
                if peers == NULL:
                    return -1
                return peers[i] if peers[i] >= 0 else -1 - peers[i]
    return -2


cdef void _give_up(MPI_Request* reqs, int n, const int* peers) noexcept nogil:
    # Never wait on these again: a receive is cancelled (MPI lets it go unless its message
    # is already arriving), a send cannot be and is left to complete or die with its peer;
    # either way the request is freed, so that nothing here refers to it any more.
    cdef int i
    for i in range(n):
        if reqs[i] != mpi.MPI_REQUEST_NULL:
            if peers != NULL and peers[i] >= 0:
                mpi.MPI_Cancel(&reqs[i])
            mpi.MPI_Request_free(&reqs[i])


cdef int wait(const Link* link, MPI_Request* reqs, int n, const int* peers,
              MPI_Request* also, const int* also_peers, int n_also, int64_t nbytes) except -1 nogil:
    """Wait until the `n` requests at `reqs` complete; `peers[i]` is request i's partner
    (SENT_TO for a send; `peers` may be NULL). Every `link.interval` seconds the link's hook
    gets (the partner of the first request still pending, seconds waited); if it raises,
    these requests and the `n_also` others the caller has outstanding (`also`,
    `also_peers`) are cancelled where MPI allows and freed, and the error propagates.

    Spins first, for as long as `nbytes` (the most that any of the requests moves) take at
    the slowest rate a moving transfer has, then sleeps between tests, longer the longer the
    wait (see fastring/_core/config.py), so that the hot path costs what MPI_Waitall did and a
    long wait costs next to no CPU."""
    cdef int done = 0, partner
    cdef long tests = 0
    cdef double start, t, next_report
    cdef double pause_s = 0
    cdef double spin = max(link.spin, nbytes / _SPIN_RATE)
    start = now()
    next_report = start + link.interval
    while True:
        check(mpi.MPI_Testall(n, reqs, &done, mpi.MPI_STATUSES_IGNORE))
        if done:
            return 0
        tests += 1
        if tests & 63:
            continue  # the clock only every 64 tests: spinning must cost what MPI_Waitall did
        t = now()
        if t - start < spin:
            # Where ranks outnumber free cores (simulated hosts, a busy machine), the partner
            # this rank waits for may need this core to move the bytes; MPICH's own waits
            # yield too. With the core to itself, a yield returns at once.
            sched_yield()
            continue
        pause_s = back_off(pause_s, t - start)
        tests = -1  # after a pause, read the clock at the next failed test again
        if link.hook != NULL and link.interval > 0 and t >= next_report:
            partner = _pending_peer(reqs, n, peers)
            if partner == -2:
                return 0
            _call_hook(link, partner, now() - start, reqs, n, peers, also, also_peers, n_also)
            next_report = now() + link.interval


cdef double back_off(double pause_s, double waited) noexcept nogil:
    """Sleep the next pause of a wait that has lasted `waited` seconds after sleeping `pause_s`
    last time, and return it: 20 us more each time up to the short pause, then doubling once
    the wait has lasted WAIT_LONG_SECONDS (see fastring/_core/config.py)."""
    cdef timespec pause
    if pause_s < _SHORT_PAUSE:
        pause_s += _STEP
    elif waited >= _LONG and pause_s < _LONG_PAUSE:
        pause_s = min(2 * pause_s, _LONG_PAUSE)
    pause.tv_sec = 0
    pause.tv_nsec = <long> (pause_s * 1e9)
    nanosleep(&pause, NULL)
    return pause_s


cdef int wait1(const Link* link, MPI_Request* req, int peer, int64_t nbytes) except -1 nogil:
    """`wait` for one request (peer: SENT_TO(dest) for a send) that moves `nbytes`."""
    return wait(link, req, 1, &peer, NULL, NULL, 0, nbytes)


cdef int send(const Link* link, char* buf, MPI_Count nbytes, int dest, int tag) except -1 nogil:
    """Send `nbytes` at `buf` to `dest`, waiting through the link."""
    cdef MPI_Request req
    check(mpi.MPI_Isend_c(buf, nbytes, mpi.MPI_BYTE, dest, tag, link.comm, &req))
    return wait1(link, &req, SENT_TO(dest), nbytes)


cdef int recv(const Link* link, char* buf, MPI_Count nbytes, int source, int tag) except -1 nogil:
    """Receive `nbytes` from `source` into `buf`, waiting through the link."""
    cdef MPI_Request req
    check(mpi.MPI_Irecv_c(buf, nbytes, mpi.MPI_BYTE, source, tag, link.comm, &req))
    return wait1(link, &req, source, nbytes)


cdef int sendrecv(const Link* link, char* send, MPI_Count send_nbytes, int dest,
                  char* recv, MPI_Count recv_nbytes, int source, int tag) except -1 nogil:
    cdef MPI_Request reqs[2]
    cdef int peers[2]
    post_exchange(link, send, send_nbytes, dest, recv, recv_nbytes, source, tag, reqs)
    peers[0], peers[1] = source, SENT_TO(dest)
    return wait(link, reqs, 2, peers, NULL, NULL, 0, max(send_nbytes, recv_nbytes))


cdef int post_exchange(const Link* link, char* send, int64_t send_nbytes, int dest,
                       char* recv, int64_t recv_nbytes, int source, int tag,
                       MPI_Request* reqs) except -1 nogil:
    # The receive goes first, so that the partner's message can land straight in `recv`.
    check(mpi.MPI_Irecv_c(recv, recv_nbytes, mpi.MPI_BYTE, source, tag, link.comm, &reqs[0]))
    return check(mpi.MPI_Isend_c(send, send_nbytes, mpi.MPI_BYTE, dest, tag, link.comm, &reqs[1]))


cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t* thread, void* attr, void* (*start)(void*) noexcept nogil, void* arg)
    int pthread_detach(pthread_t thread)


cdef struct _Deadline:
    double seconds
    size_t length
    char text[1]  # the message, `length` bytes, allocated with the struct


cdef void* _exit_when_due(void* arg) noexcept nogil:
    cdef _Deadline* d = <_Deadline*> arg
    cdef timespec pause
    pause.tv_sec = <long> d.seconds
    pause.tv_nsec = <long> ((d.seconds - pause.tv_sec) * 1e9)
    nanosleep(&pause, NULL)
    write(2, d.text, d.length)
    pause.tv_sec, pause.tv_nsec = 0, 200000000  # let hydra forward it before the exit stops the job
    nanosleep(&pause, NULL)
    _exit(1)
    return NULL


def exit_unless_gone_within(double seconds, str message):
    """Say `message` on stderr, and start a C thread that, unless this process has ended
    within `seconds`, says so and ends it with exit code 1, skipping whatever it is waiting for.

    For a process leaving after it gave up on a rank that stopped answering: MPI_Finalize
    (at interpreter exit, after every Python thread stopped running) waits for every rank
    to finalize too, forever if one is stopped or hung. Exiting without it ends the job
    (hydra stops the other ranks), which is what the failure calls for."""
    # Said now, in full: the job may be torn down before the last words of an exiting process
    # are forwarded.
    print(f"{message}; if this process has not ended {seconds:g} s from now (MPI_Finalize waits "
          "for every rank), it exits with code 1 without MPI_Finalize", file=sys.stderr, flush=True)
    data = f"{message}: exiting with code 1 now\n".encode("utf-8", "replace")
    cdef _Deadline* d = <_Deadline*> malloc(sizeof(_Deadline) + len(data))
    if d == NULL:
        raise MemoryError()
    d.seconds, d.length = seconds, len(data)
    memcpy(d.text, <char*> data, len(data))
    cdef pthread_t thread
    if pthread_create(&thread, NULL, _exit_when_due, d) != 0:
        free(d)
        raise OSError("could not start the exit watchdog thread")
    pthread_detach(thread)


cdef double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + 1e-9 * ts.tv_nsec


cdef class TransportBase:
    """One MPI communicator, duplicated so that fastring's traffic never matches a user's
    message, with its error handler set to return codes, which `check` turns into
    FastringError. `Transport` adds the collectives; the algorithm modules cimport this
    class, which holds what they read and remember between calls."""

    def __cinit__(self, Comm comm not None):
        dup = comm.Dup()
        self._owner = dup
        self.comm = (<Comm> dup).ob_mpi
        check(mpi.MPI_Comm_set_errhandler(self.comm, mpi.MPI_ERRORS_RETURN))
        check(mpi.MPI_Comm_rank(self.comm, &self.rank))
        check(mpi.MPI_Comm_size(self.comm, &self.size))
        self.link.comm, self.link.spin, self.link.interval, self.link.hook = self.comm, _DATA_SPIN, 0, NULL
        self.wire_roles[0], self.wire_roles[1], self.wire_roles[2] = 0, 1, 2

    def __dealloc__(self):
        free(self.pids)

    def free(self):
        """Release the duplicated communicator (collective over its ranks)."""
        if self._owner is not None:
            self._owner.Free()
            self._owner = None

    def set_stall(self, double interval, object hook):
        """Call `hook(partner, seconds waited)` every `interval` seconds while any of this
        transport's collectives (all but the negotiation cycle, which has its own) waits for a
        partner: `partner` is the rank it waits for (-1: not known, as in MPI's own
        collectives). The hook may raise (FastringError) to give the collective up: the
        requests this rank posted for it are cancelled where MPI allows and never waited on
        again. `hook=None` or `interval=0` turns it off.

        Example:
            >>> from mpi4py import MPI
            >>> t = TransportBase(MPI.COMM_WORLD)
            >>> t.set_stall(1.0, lambda partner, waited: None)
        """
        if interval < 0:
            raise ValueError(f"interval must not be negative, got {interval}")
        self._stall_hook = hook
        self.link.interval = interval if hook is not None else 0
        self.link.hook = <void*> hook if hook is not None else NULL

    @property
    def comm(self):
        """The mpi4py communicator this transport sends on."""
        return self._owner

    @property
    def single_copy(self):
        """True when broadcasts may copy straight between the ranks' memories (see
        `Transport.enable_single_copy`)."""
        return self.pids != NULL

    def disable_single_copy(self):
        """Send broadcasts as MPI messages from now on (collective: every rank must call it,
        since the ranks of one broadcast must agree on how it travels).

        Example:
            >>> from mpi4py import MPI
            >>> from fastring._transport import Transport
            >>> t = Transport(MPI.COMM_WORLD); t.disable_single_copy(); t.single_copy
            False
        """
        free(self.pids)
        self.pids = NULL

    def sendrecv(self, uintptr_t send_addr, MPI_Count send_nbytes, int dest,
                 uintptr_t recv_addr, MPI_Count recv_nbytes, int source, int tag):
        """Send `send_nbytes` at `send_addr` to `dest` while receiving `recv_nbytes` from
        `source` into `recv_addr`, both under `tag` (a `Tag`)."""
        with nogil:
            sendrecv(&self.link, <char*> send_addr, send_nbytes, dest,
                     <char*> recv_addr, recv_nbytes, source, tag)

    def mpi_allreduce(self, uintptr_t send_addr, uintptr_t recv_addr, MPI_Count count,
                      int dtype_code, int op_code):
        """The MPI library's own allreduce (nonblocking, so that it waits through the stall
        hook, see `set_stall`); send_addr == recv_addr means in place."""
        cdef MPI_Datatype dtype = datatype(dtype_code)
        cdef MPI_Op op = reduce_op(op_code)
        if dtype == mpi.MPI_DATATYPE_NULL or op == mpi.MPI_OP_NULL:
            raise ValueError(f"no MPI datatype/op for codes ({dtype_code}, {op_code})")
        cdef void* sendbuf = mpi.MPI_IN_PLACE if send_addr == recv_addr else <void*> send_addr
        cdef MPI_Request req
        cdef int itemsize = 0
        with nogil:
            check(mpi.MPI_Type_size(dtype, &itemsize))
            check(mpi.MPI_Iallreduce_c(sendbuf, <void*> recv_addr, count, dtype, op, self.comm, &req))
            wait(&self.link, &req, 1, NULL, NULL, NULL, 0, count * itemsize)


cdef int check_offsets(TransportBase t, Py_ssize_t entries, str what) except -1:
    """Raise ValueError unless an offsets array of `entries` bounds one block per rank."""
    if entries != t.size + 1:
        raise ValueError(f"{what} needs {t.size + 1} entries, got {entries}")
    return 0
