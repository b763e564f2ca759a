# Broadcasts: binomial tree, pipelined chain, and single copy between the ranks' memories with
# Cross Memory Attach, with the probe that finds whether single copy works.

from libc.stdint cimport int64_t, uint64_t
from posix.types cimport pid_t

from .mpi cimport TransportBase


cdef object probe_single_copy(TransportBase t)

# Copy nbytes between `local` and process pid's address `remote` (`write`: into it) with Cross
# Memory Attach, in as many calls as the kernel needs; 0 or an errno.
cdef int vm_copy(bint write, pid_t pid, char* local, uint64_t remote, int64_t nbytes) noexcept nogil

# The single-copy broadcast's split: the root's share of a broadcast of `nbytes` (t.root_share,
# one per power of two), the leading bytes it writes (`root_part`, whole cache lines), and what
# the next broadcast of that size takes after the root wrote its part into every other rank in
# `wrote` seconds while the slowest reader read the rest in `slowest_read` (`learn_root_share`).
cdef double* root_share_of(TransportBase t, int64_t nbytes) noexcept nogil
cdef int64_t root_part(const double* share, int64_t nbytes) noexcept nogil
cdef void learn_root_share(double* share, int64_t nbytes, int64_t part, int size, double wrote,
                           double slowest_read) noexcept nogil
