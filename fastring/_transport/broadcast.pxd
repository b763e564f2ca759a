# Broadcasts: binomial tree, pipelined chain, and single copy between the ranks' memories with
# Cross Memory Attach, with the probe that finds whether single copy works.

from libc.stdint cimport int64_t, uint64_t
from posix.types cimport pid_t

from .mpi cimport TransportBase


cdef object probe_single_copy(TransportBase t)

# Copy nbytes between `local` and process pid's address `remote` (`write`: into it) with Cross
# Memory Attach, in as many calls as the kernel needs; 0 or an errno.
cdef int vm_copy(bint write, pid_t pid, char* local, uint64_t remote, int64_t nbytes) noexcept nogil
