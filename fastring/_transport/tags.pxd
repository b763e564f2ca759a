# The MPI tag of every message fastring sends on a Transport's communicator: one for each
# collective or algorithm, so that a receive only ever matches a message sent by the same
# code, and ranks that fall out of step wait for each other instead
# of reducing another collective's bytes. Every tag is listed here and nowhere else.
#
# Python sees them as `fastring._transport.Tag.<NAME>`; the Cython modules cimport them as
# C constants.

cpdef enum Tag:
    # Transport.ring_reduce_scatter: the host ring allreduce, reduced in place.
    RING_REDUCE_SCATTER = 1
    # Transport.ring_allgather: the ring allreduce's second half, and the allgather collective.
    RING_ALLGATHER = 2
    # Transport.recursive_doubling: the small-message allreduce.
    RECURSIVE_DOUBLING = 3
    # Transport.cycle_exchange: the engine's negotiation cycle.
    CYCLE = 4
    # pairwise_alltoall: the alltoall collective and its exchange of row counts.
    ALLTOALL = 5
    # tree_broadcast.
    TREE_BROADCAST = 6
    # chain_broadcast.
    CHAIN_BROADCAST = 7
    # ring_reduce_scatter_into: the reducescatter collective.
    REDUCE_SCATTER_INTO = 8
    # Transport.ring_allreduce_wire: the ring allreduce with 16-bit messages.
    WIRE_RING = 9
    # ring_reduce_scatter_to: the ring allreduce that leaves its input untouched.
    REDUCE_SCATTER_TO = 10
    # single_copy_broadcast: its address and status exchanges, and the tree broadcast it
    # falls back to.
    SINGLE_COPY = 11
    # Transport.enable_single_copy: the ring neighbours' exchange of probe addresses.
    SINGLE_COPY_PROBE = 12
    # fastring.algorithms.device: the device ring's reduce-scatter and allgather.
    DEVICE_REDUCE_SCATTER = 13
    DEVICE_ALLGATHER = 14
    # fastring._transport.testing: the test-only point-to-point calls' default.
    TESTING = 15
    # fastring.engine.negotiation: the notice a rank sends every other rank when it abandons
    # its negotiation cycles after a stall.
    ABANDON_NOTICE = 16
