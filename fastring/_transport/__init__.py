"""The native seam: MPI point-to-point calls and whole collectives on raw addresses, run in C
with the GIL released. Layers, each a Cython module that cimports only those listed before it:

- `tags`: `Tag`, the MPI tag of every message fastring sends.
- `mpi`: the error check, dtype/op codes, exchange helpers and `TransportBase`, the
  communicator and the state the algorithms keep with it.
- `ring`, `doubling`, `cycle`, `broadcast`, `alltoall`: the algorithms, one module each.
- `gate`: `Gate`, where the engine's background thread waits for work, GIL released.
- `handle`: `Handle`, the future of one asynchronous collective (re-exported by `fastring`).
- `shm`: `SharedSegment`, the one-host shared-memory segment and the collectives through it.
- `transport`: `Transport`, whose methods are the allreduce and negotiation calls.
- `arrays`: NumPy arrays as raw addresses.
- `testing`: calls only the tests make (not re-exported here, except `Requests`).
"""
from .._core.errors import FastringError
from .alltoall import pairwise_alltoall
from .arrays import (array_address, copy_from_array, copy_to_array, gather_from_arrays, gather_strided,
                     group_of, is_c_contiguous, is_writable_c_contiguous, pieces_of, scatter_to_arrays, views_of)
from .broadcast import chain_broadcast, single_copy_broadcast, tree_broadcast
from .cycle import CYCLE_HEADER_WORDS, SPECULATION_FAILED, mark_bits, sort_by_cache
from .gate import Gate
from .mpi import exit_unless_gone_within
from .ring import ring_reduce_scatter_into, ring_reduce_scatter_to
from .shm import SharedSegment
from .tags import Tag
from .testing import Requests
from .transport import Transport

__all__ = ["CYCLE_HEADER_WORDS", "SPECULATION_FAILED", "FastringError", "Gate", "Requests", "SharedSegment", "Tag", "Transport", "array_address",
           "chain_broadcast", "copy_from_array", "copy_to_array", "exit_unless_gone_within", "gather_from_arrays", "gather_strided", "group_of", "is_c_contiguous",
           "is_writable_c_contiguous", "mark_bits", "pairwise_alltoall", "pieces_of", "ring_reduce_scatter_into",
           "ring_reduce_scatter_to", "scatter_to_arrays", "single_copy_broadcast", "sort_by_cache", "tree_broadcast", "views_of"]
