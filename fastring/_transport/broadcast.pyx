# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Broadcasts from a root: a binomial tree for small messages, a pipelined chain for large
ones on many ranks, and, when every rank is on one host and may read and write the others'
memory, single copy: Cross Memory Attach (process_vm_readv/writev, Linux) copies between
two processes in one pass, without a shared-memory bounce buffer, and lets the root copy too
instead of waiting while the receivers copy.
"""

from libc.errno cimport EIO, errno
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from posix.types cimport pid_t
from posix.unistd cimport getpid

cimport mpi4py.libmpi as mpi
from mpi4py.libmpi cimport MPI_Comm, MPI_Request

from .mpi cimport SENT_TO, Link, check, now, recv, send, sendrecv, wait, wait1
from .tags cimport Tag

# Python.h defines _GNU_SOURCE, which sys/uio.h needs to declare these.
cdef extern from "<sys/uio.h>" nogil:
    cdef struct iovec:
        void* iov_base
        size_t iov_len
    ssize_t process_vm_readv(pid_t pid, const iovec* local, unsigned long liovcnt,
                             const iovec* remote, unsigned long riovcnt, unsigned long flags)
    ssize_t process_vm_writev(pid_t pid, const iovec* local, unsigned long liovcnt,
                              const iovec* remote, unsigned long riovcnt, unsigned long flags)


cdef inline int _check_root(TransportBase t, int root) except -1:
    if not 0 <= root < t.size:
        raise ValueError(f"root {root} is outside [0, {t.size})")
    return 0


# ---------------------------------------------------------------- tree

def tree_broadcast(TransportBase t, uintptr_t buf, int64_t nbytes, int root,
                   int tag=Tag.TREE_BROADCAST):
    """Binomial-tree broadcast of `nbytes` at `buf` from `root`: ceil(log2 N) rounds, each
    message whole. The latency algorithm (and the only one needed on two ranks).

    Example:
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> from fastring._transport import Transport
        >>> t = Transport(MPI.COMM_WORLD); a = np.ones(3)
        >>> tree_broadcast(t, a.ctypes.data, a.nbytes, 0)
    """
    _check_root(t, root)
    with nogil:
        _tree_broadcast(&t.link, t.rank, t.size, root, <char*> buf, nbytes, tag)


cdef int _tree_broadcast(const Link* link, int rank, int size, int root, char* buf,
                         int64_t nbytes, int tag) except -1 nogil:
    # Ranks relative to the root: relative rank v receives from v - (its lowest set bit),
    # then sends to v + m for every smaller power of two m.
    cdef int v = (rank - root + size) % size
    cdef int mask = 1
    while mask < size:
        if v & mask:
            recv(link, buf, nbytes, (rank - mask + size) % size, tag)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if v + mask < size:
            send(link, buf, nbytes, (rank + mask) % size, tag)
        mask >>= 1
    return 0


# ---------------------------------------------------------------- chain

def chain_broadcast(TransportBase t, uintptr_t buf, int64_t nbytes, int root, int64_t segment_bytes,
                    int tag=Tag.CHAIN_BROADCAST):
    """Pipelined chain broadcast from `root`: root -> root+1 -> ... in segments, each rank
    forwarding segment s while it receives segment s+1, so a large message costs about one
    transfer of its bytes plus (N-2) segments, whatever N.

    Example:
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> from fastring._transport import Transport
        >>> t = Transport(MPI.COMM_WORLD); a = np.ones(3)
        >>> chain_broadcast(t, a.ctypes.data, a.nbytes, 0, 8)
    """
    _check_root(t, root)
    if segment_bytes <= 0:
        raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
    with nogil:
        _chain_broadcast(&t.link, t.rank, t.size, root, <char*> buf, nbytes, segment_bytes, tag)


cdef int _chain_broadcast(const Link* link, int rank, int size, int root, char* buf, int64_t nbytes,
                          int64_t segment, int tag) except -1 nogil:
    cdef int v = (rank - root + size) % size
    cdef bint has_prev = v > 0
    cdef bint has_next = v < size - 1
    cdef int prev = (rank + size - 1) % size
    cdef int nxt = (rank + 1) % size
    cdef int64_t segments = (nbytes + segment - 1) // segment
    cdef int64_t s, lo
    # [0]: the receive of the next segment, [1]: the send of the previous one; each wait
    # gives up both if the stall hook raises
    cdef MPI_Request reqs[2]
    cdef int peers[2]
    reqs[0] = reqs[1] = mpi.MPI_REQUEST_NULL
    peers[0], peers[1] = prev, SENT_TO(nxt)
    if has_prev and segments > 0:
        check(mpi.MPI_Irecv_c(buf, min(segment, nbytes), mpi.MPI_BYTE, prev, tag, link.comm, &reqs[0]))
    for s in range(segments):
        lo = s * segment
        if has_prev:
            wait(link, &reqs[0], 1, &peers[0], reqs, peers, 2, segment)
            if s + 1 < segments:
                check(mpi.MPI_Irecv_c(buf + lo + segment, min(segment, nbytes - lo - segment),
                                      mpi.MPI_BYTE, prev, tag, link.comm, &reqs[0]))
        if has_next:
            wait(link, &reqs[1], 1, &peers[1], reqs, peers, 2, segment)
            check(mpi.MPI_Isend_c(buf + lo, min(segment, nbytes - lo), mpi.MPI_BYTE, nxt, tag,
                                  link.comm, &reqs[1]))
    wait(link, &reqs[1], 1, &peers[1], reqs, peers, 2, segment)
    return 0


# ---------------------------------------------------------------- single copy

cdef uint64_t _PROBE_MARK = 0xFA57000000000000  # + rank: what the probe looks for


cdef object probe_single_copy(TransportBase t):
    """Transport.enable_single_copy (see there)."""
    cdef pid_t* pids = <pid_t*> malloc(t.size * sizeof(pid_t))
    if pids == NULL:
        raise MemoryError()
    cdef MPI_Comm local
    cdef int local_size = 0, works = 0, everywhere = 0
    cdef pid_t me = getpid()
    # Each rank offers `mark`; its left neighbour reads it and writes into its `slot`.
    cdef uint64_t mark = _PROBE_MARK + <uint64_t> t.rank
    cdef uint64_t slot = 0, seen = 0
    cdef uint64_t addrs[2]
    cdef uint64_t right_addrs[2]
    cdef int right = (t.rank + 1) % t.size, left = (t.rank - 1 + t.size) % t.size
    cdef int i
    try:
        with nogil:
            check(mpi.MPI_Comm_split_type(t.comm, mpi.MPI_COMM_TYPE_SHARED, t.rank,
                                          mpi.MPI_INFO_NULL, &local))
            check(mpi.MPI_Comm_size(local, &local_size))
            check(mpi.MPI_Comm_free(&local))
            check(mpi.MPI_Allgather(&me, sizeof(pid_t), mpi.MPI_BYTE, pids, sizeof(pid_t),
                                    mpi.MPI_BYTE, t.comm))
            addrs[0], addrs[1] = <uint64_t> &mark, <uint64_t> &slot
            sendrecv(&t.link, <char*> addrs, sizeof(addrs), left, <char*> right_addrs,
                     sizeof(right_addrs), right, Tag.SINGLE_COPY_PROBE)
            if t.size > 1 and local_size == t.size:
                works = (vm_copy(False, pids[right], <char*> &seen, right_addrs[0], 8) == 0
                         and seen == _PROBE_MARK + <uint64_t> right
                         and vm_copy(True, pids[right], <char*> &mark, right_addrs[1], 8) == 0)
            # Every write lands before anyone looks at its slot.
            check(mpi.MPI_Allreduce(&works, &everywhere, 1, mpi.MPI_INT, mpi.MPI_MIN, t.comm))
            works = everywhere and slot == _PROBE_MARK + <uint64_t> left
            check(mpi.MPI_Allreduce(&works, &everywhere, 1, mpi.MPI_INT, mpi.MPI_MIN, t.comm))
    except BaseException:
        free(pids)
        raise
    free(t.pids)
    t.pids = pids if everywhere else NULL
    for i in range(64):
        t.root_share[i] = 1.0 / t.size
    if not everywhere:
        free(pids)
    return bool(everywhere)


def single_copy_broadcast(TransportBase t, uintptr_t buf, int64_t nbytes, int root,
                          int tag=Tag.SINGLE_COPY):
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
        >>> from fastring._transport import Transport
        >>> t = Transport(MPI.COMM_WORLD); a = np.ones(3)
        >>> t.enable_single_copy() and single_copy_broadcast(t, a.ctypes.data, a.nbytes, 0)
        False
    """
    _check_root(t, root)
    if not t.single_copy:
        raise ValueError("single copy is not enabled on this transport (enable_single_copy)")
    if nbytes < 0:
        raise ValueError(f"nbytes must not be negative, got {nbytes}")
    cdef uint64_t failed = 0
    cdef uint64_t* addrs = <uint64_t*> malloc(t.size * sizeof(uint64_t))
    if addrs == NULL:
        raise MemoryError()
    cdef double* share = root_share_of(t, nbytes)
    try:
        with nogil:
            failed = _single_copy_broadcast(&t.link, t.rank, t.size, root, <char*> buf, nbytes,
                                            t.pids, addrs, share, tag)
            if failed:
                _tree_broadcast(&t.link, t.rank, t.size, root, <char*> buf, nbytes, tag)
    finally:
        free(addrs)
    if failed:
        t.disable_single_copy()
    return failed


cdef double* root_share_of(TransportBase t, int64_t nbytes) noexcept nogil:
    cdef int bits = 0
    cdef uint64_t n = <uint64_t> nbytes
    while n:
        n >>= 1
        bits += 1
    return &t.root_share[bits]


cdef int64_t root_part(const double* share, int64_t nbytes) noexcept nogil:
    return (<int64_t> (nbytes * share[0])) & ~(<int64_t> 63)  # whole cache lines


cdef void learn_root_share(double* share, int64_t nbytes, int64_t part, int size, double wrote,
                           double slowest_read) noexcept nogil:
    cdef double write_rate, read_rate, f
    if wrote > 0 and slowest_read > 0 and 0 < part < nbytes:
        # Both finish together when part * (N-1) / write_rate == (nbytes - part) / read_rate.
        write_rate = part * (size - 1) / wrote
        read_rate = (nbytes - part) / slowest_read
        f = write_rate / (write_rate + (size - 1) * read_rate)
        share[0] = min(0.9, max(0.05, 0.75 * share[0] + 0.25 * f))


cdef int vm_copy(bint write, pid_t pid, char* local, uint64_t remote, int64_t nbytes) noexcept nogil:
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


cdef uint64_t _single_copy_broadcast(const Link* link, int rank, int size, int root, char* buf,
                                     int64_t nbytes, const pid_t* pids, uint64_t* addrs,
                                     double* root_share, int tag) except? 0xFFFFFFFFFFFFFFFF nogil:
    # The root sends (its address, how many leading bytes it writes); a reader answers with
    # its address, then with (errno or 0, nanoseconds its read took); the root answers with
    # the first failure anyone had.
    cdef uint64_t offer[2]
    cdef uint64_t report[2]
    cdef uint64_t failed = 0, mine = <uint64_t> buf
    cdef double began, wrote, slowest_read = 0
    cdef int64_t share
    cdef int j
    if rank != root:
        sendrecv(link, <char*> &mine, 8, root, <char*> offer, 16, root, tag)
        share = <int64_t> offer[1]
        began = now()
        report[0] = vm_copy(False, pids[root], buf + share, offer[0] + share, nbytes - share)
        report[1] = <uint64_t> ((now() - began) * 1e9)
        sendrecv(link, <char*> report, 16, root, <char*> &failed, 8, root, tag)
        return failed
    share = root_part(root_share, nbytes)
    offer[0], offer[1] = mine, share
    for j in range(size):
        if j != root:
            sendrecv(link, <char*> offer, 16, j, <char*> &addrs[j], 8, j, tag)
    began = now()
    for j in range(size):
        if j != root and not failed:
            failed = vm_copy(True, pids[j], buf, addrs[j], share)
    wrote = now() - began
    for j in range(size):
        if j != root:
            recv(link, <char*> report, 16, j, tag)
            failed = failed or report[0]
            slowest_read = max(slowest_read, 1e-9 * report[1])
    for j in range(size):
        if j != root:
            send(link, <char*> &failed, 8, j, tag)
    if not failed:
        learn_root_share(root_share, nbytes, share, size, wrote, slowest_read)
    return failed
