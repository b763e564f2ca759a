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
from libc.stdlib cimport free
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

from mpi4py.MPI cimport Comm

from .._core.errors import FastringError


cdef int raise_mpi_error(int code) except -1 with gil:
    cdef char message[512]
    cdef int length = 0
    if mpi.MPI_Error_string(code, message, &length) != mpi.MPI_SUCCESS:
        raise FastringError(f"MPI call failed with error code {code}")
    raise FastringError(f"MPI call failed: {message[:length].decode('utf-8', 'replace')} (code {code})")


# The codes of fastring._core.dtypes (DtypeSpec.mpi_code) and fastring._core.ops (MPI_OP,
# MPI_BOOL_OP) index these tables: an enum across the seam, never strings.
cdef MPI_Datatype _DATATYPES[7]
_DATATYPES[:] = [mpi.MPI_UINT8_T, mpi.MPI_INT8_T, mpi.MPI_INT32_T, mpi.MPI_INT64_T, mpi.MPI_FLOAT,
                 mpi.MPI_DOUBLE, mpi.MPI_C_BOOL]
cdef MPI_Op _OPS[6]
_OPS[:] = [mpi.MPI_SUM, mpi.MPI_MIN, mpi.MPI_MAX, mpi.MPI_PROD, mpi.MPI_LOR, mpi.MPI_LAND]


cdef MPI_Datatype datatype(int code) noexcept:
    return _DATATYPES[code] if 0 <= code < 7 else mpi.MPI_DATATYPE_NULL


cdef MPI_Op reduce_op(int code) noexcept:
    return _OPS[code] if 0 <= code < 6 else mpi.MPI_OP_NULL


cdef int sendrecv(MPI_Comm comm, char* send, MPI_Count send_nbytes, int dest,
                  char* recv, MPI_Count recv_nbytes, int source, int tag) except -1 nogil:
    return check(mpi.MPI_Sendrecv_c(send, send_nbytes, mpi.MPI_BYTE, dest, tag,
                                    recv, recv_nbytes, mpi.MPI_BYTE, source, tag,
                                    comm, mpi.MPI_STATUS_IGNORE))


cdef int post_exchange(MPI_Comm comm, char* send, int64_t send_nbytes, int dest,
                       char* recv, int64_t recv_nbytes, int source, int tag,
                       MPI_Request* reqs) except -1 nogil:
    # The receive goes first, so that the partner's message can land straight in `recv`.
    check(mpi.MPI_Irecv_c(recv, recv_nbytes, mpi.MPI_BYTE, source, tag, comm, &reqs[0]))
    return check(mpi.MPI_Isend_c(send, send_nbytes, mpi.MPI_BYTE, dest, tag, comm, &reqs[1]))


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
        self.wire_roles[0], self.wire_roles[1], self.wire_roles[2] = 0, 1, 2

    def __dealloc__(self):
        free(self.pids)

    def free(self):
        """Release the duplicated communicator (collective over its ranks)."""
        if self._owner is not None:
            self._owner.Free()
            self._owner = None

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
            sendrecv(self.comm, <char*> send_addr, send_nbytes, dest,
                     <char*> recv_addr, recv_nbytes, source, tag)

    def barrier(self):
        """Block until every rank of the communicator has called it (GIL released)."""
        with nogil:
            check(mpi.MPI_Barrier(self.comm))

    def mpi_allreduce(self, uintptr_t send_addr, uintptr_t recv_addr, MPI_Count count,
                      int dtype_code, int op_code):
        """The MPI library's own allreduce; send_addr == recv_addr means in place."""
        cdef MPI_Datatype dtype = datatype(dtype_code)
        cdef MPI_Op op = reduce_op(op_code)
        if dtype == mpi.MPI_DATATYPE_NULL or op == mpi.MPI_OP_NULL:
            raise ValueError(f"no MPI datatype/op for codes ({dtype_code}, {op_code})")
        cdef void* sendbuf = mpi.MPI_IN_PLACE if send_addr == recv_addr else <void*> send_addr
        with nogil:
            check(mpi.MPI_Allreduce_c(sendbuf, <void*> recv_addr, count, dtype, op, self.comm))


cdef int check_offsets(TransportBase t, Py_ssize_t entries, str what) except -1:
    """Raise ValueError unless an offsets array of `entries` bounds one block per rank."""
    if entries != t.size + 1:
        raise ValueError(f"{what} needs {t.size + 1} entries, got {entries}")
    return 0
