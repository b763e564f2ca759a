# cython: language_level=3, boundscheck=False, wraparound=False
"""Calls only the tests make: plain point-to-point messages, request sets, and a hook that
makes single copies fail. fastring itself moves its bytes through the collectives."""

from libc.stdint cimport uintptr_t
from libc.stdlib cimport free, malloc, realloc
from posix.types cimport pid_t

cimport mpi4py.libmpi as mpi
from mpi4py.libmpi cimport MPI_Count, MPI_Request

from .mpi cimport TransportBase, check
from .tags cimport Tag


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
            check(mpi.MPI_Waitall(self.count, self.reqs, mpi.MPI_STATUSES_IGNORE))
        self.count = 0

    def testall(self):
        """True (and the set emptied) when every request has completed; never blocks."""
        cdef int done = 0
        with nogil:
            check(mpi.MPI_Testall(self.count, self.reqs, &done, mpi.MPI_STATUSES_IGNORE))
        if done:
            self.count = 0
        return bool(done)


def send(TransportBase t, uintptr_t addr, MPI_Count nbytes, int dest, int tag=Tag.TESTING):
    """Blocking send of `nbytes` at `addr` to rank `dest`."""
    with nogil:
        check(mpi.MPI_Send_c(<void*> addr, nbytes, mpi.MPI_BYTE, dest, tag, t.comm))


def recv(TransportBase t, uintptr_t addr, MPI_Count nbytes, int source, int tag=Tag.TESTING):
    """Blocking receive of `nbytes` from rank `source` into `addr`."""
    with nogil:
        check(mpi.MPI_Recv_c(<void*> addr, nbytes, mpi.MPI_BYTE, source, tag, t.comm,
                             mpi.MPI_STATUS_IGNORE))


def isend(TransportBase t, Requests reqs, uintptr_t addr, MPI_Count nbytes, int dest,
          int tag=Tag.TESTING):
    """Start sending `nbytes` at `addr` to rank `dest`; `reqs` completes it."""
    cdef MPI_Request* slot = reqs.slot()
    with nogil:
        check(mpi.MPI_Isend_c(<void*> addr, nbytes, mpi.MPI_BYTE, dest, tag, t.comm, slot))


def irecv(TransportBase t, Requests reqs, uintptr_t addr, MPI_Count nbytes, int source,
          int tag=Tag.TESTING):
    """Start receiving `nbytes` from rank `source` into `addr`; `reqs` completes it."""
    cdef MPI_Request* slot = reqs.slot()
    with nogil:
        check(mpi.MPI_Irecv_c(<void*> addr, nbytes, mpi.MPI_BYTE, source, tag, t.comm, slot))


def set_pid(TransportBase t, int rank, pid_t pid):
    """Pretend `rank` runs as process `pid`, to make single copies fail."""
    if t.pids == NULL or not 0 <= rank < t.size:
        raise ValueError("single copy is off or the rank is out of range")
    t.pids[rank] = pid
