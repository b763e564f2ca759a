# Broadcasts: binomial tree, pipelined chain, and single copy between the ranks' memories with
# Cross Memory Attach, with the probe that finds whether single copy works.

from .mpi cimport TransportBase


cdef object probe_single_copy(TransportBase t)
