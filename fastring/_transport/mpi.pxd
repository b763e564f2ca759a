# The lowest layer: MPI calls on raw addresses, the error check every call goes through, and
# TransportBase, the C state of one communicator that every algorithm module reads.

from libc.stdint cimport int64_t
from posix.types cimport pid_t

cimport mpi4py.libmpi as mpi
from mpi4py.libmpi cimport MPI_Comm, MPI_Count, MPI_Datatype, MPI_Op, MPI_Request

# A chunk reduction, a Numba cfunc: dst[i] = dst[i] op src[i] for i < count (elements).
ctypedef void (*reduce_fn_t)(void* dst, void* src, int64_t count) noexcept nogil


cdef int raise_mpi_error(int code) except -1 with gil


cdef inline int check(int code) except -1 nogil:
    """Raise FastringError, with MPI's own message, unless `code` is MPI_SUCCESS."""
    if code != mpi.MPI_SUCCESS:
        raise_mpi_error(code)
    return 0


cdef MPI_Datatype datatype(int code) noexcept
cdef MPI_Op reduce_op(int code) noexcept

cdef int sendrecv(MPI_Comm comm, char* send, MPI_Count send_nbytes, int dest,
                  char* recv, MPI_Count recv_nbytes, int source, int tag) except -1 nogil
cdef int post_exchange(MPI_Comm comm, char* send, int64_t send_nbytes, int dest,
                       char* recv, int64_t recv_nbytes, int source, int tag,
                       MPI_Request* reqs) except -1 nogil

cdef double now() noexcept nogil


cdef inline int64_t mod(int64_t a, int64_t n) noexcept nogil:
    """a mod n in [0, n), for ring positions counted back from a rank."""
    return ((a % n) + n) % n


cdef class TransportBase:
    cdef MPI_Comm comm
    cdef readonly int rank
    cdef readonly int size
    cdef object _owner  # the mpi4py duplicate, kept alive and freed with this object
    # Process ids of every rank, set when Transport.enable_single_copy finds that all ranks
    # share this host and may copy from and into each other's memory (NULL otherwise).
    cdef pid_t* pids
    # The fraction of a broadcast's bytes this rank, as root, writes into each other rank,
    # per power-of-two message size: learnt from how fast its writes and the others' reads
    # went, since a write into lines another core holds costs more than a read.
    cdef double root_share[64]
    # Which of ring_allreduce_wire's three 16-bit buffers is sending, spare and landing: kept
    # from one call to the next, since the rule it follows spans calls.
    cdef int wire_roles[3]


cdef int check_offsets(TransportBase t, Py_ssize_t entries, str what) except -1
