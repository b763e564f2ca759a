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

# A communicator with its deadline: every loop sends on `comm` and waits through `wait`, which
# calls `hook(partner, seconds waited)` (a Python callable, with the GIL) every `interval`
# seconds while a request is pending; the hook may raise to give up the wait.
cdef struct Link:
    MPI_Comm comm
    double spin      # seconds a wait spins at least before it sleeps
    double interval  # 0: never call the hook
    void* hook       # a Python callable (borrowed: its owner keeps it alive) or NULL


# The peer of a request, as `wait` takes it: a receive's source as it is, a send's
# destination as SENT_TO(dest), so that giving up cancels the receives only.
cdef inline int SENT_TO(int dest) noexcept nogil:
    return -1 - dest


cdef int wait(const Link* link, MPI_Request* reqs, int n, const int* peers,
              MPI_Request* also, const int* also_peers, int n_also, int64_t nbytes) except -1 nogil
cdef double back_off(double pause_s, double waited) noexcept nogil
cdef int wait1(const Link* link, MPI_Request* req, int peer, int64_t nbytes) except -1 nogil
cdef int send(const Link* link, char* buf, MPI_Count nbytes, int dest, int tag) except -1 nogil
cdef int recv(const Link* link, char* buf, MPI_Count nbytes, int source, int tag) except -1 nogil
cdef int sendrecv(const Link* link, char* send, MPI_Count send_nbytes, int dest,
                  char* recv, MPI_Count recv_nbytes, int source, int tag) except -1 nogil
cdef int post_exchange(const Link* link, char* send, int64_t send_nbytes, int dest,
                       char* recv, int64_t recv_nbytes, int source, int tag,
                       MPI_Request* reqs) except -1 nogil

cdef double now() noexcept nogil


cdef inline int64_t mod(int64_t a, int64_t n) noexcept nogil:
    """a mod n in [0, n), for ring positions counted back from a rank."""
    return ((a % n) + n) % n


cdef class TransportBase:
    cdef MPI_Comm comm
    # `comm` with the data phase's stall hook (set_stall), which every loop waits through.
    cdef Link link
    cdef object _stall_hook  # keeps link.hook alive
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
