"""fastring: ring-allreduce collectives for data-parallel training.

Example:
    >>> import numpy as np, fastring
    >>> fastring.init()
    >>> fastring.allreduce(np.arange(3.0), op=fastring.Sum)
    array([0., 1., 2.])
"""
# libmpi must be loaded (by mpi4py, from the `mpich` wheel) before the Cython transport,
# which links against it without an rpath.
from mpi4py import MPI  # noqa: F401  (import for its side effect)

from ._core.compression import Compression, Compressor
from ._core.errors import FastringError, HostsUpdatedInterrupt
from ._core.ops import ReduceOp
from ._core.tensor import TensorAdapter
from ._core.tensor import register_adapter as register_tensor_adapter
from .api.allreduce import (Average, Max, Min, Product, Sum, allreduce, allreduce_async,
                            grouped_allreduce, grouped_allreduce_async, join, poll, start_timeline,
                            stop_timeline, synchronize)
from .api.collectives import (adasum_allreduce, adasum_allreduce_async, allgather, allgather_async, allgather_object, alltoall, alltoall_async,
                              barrier, broadcast, broadcast_async, broadcast_object, grouped_allgather,
                              grouped_allgather_async, grouped_reducescatter, grouped_reducescatter_async,
                              reducescatter, reducescatter_async)
from .api.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .api.process import (cross_rank, cross_size, init, is_initialized, local_rank, local_size, rank,
                          shutdown, size)
from .engine import Handle


__version__ = "0.1.0"

__all__ = [
    "FastringError", "HostsUpdatedInterrupt", "ReduceOp", "TensorAdapter", "register_tensor_adapter", "Compression", "Compressor", "Average", "Sum", "Min", "Max", "Product",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "allreduce", "allreduce_async", "grouped_allreduce",
    "grouped_allreduce_async", "synchronize", "poll", "join", "Handle", "start_timeline", "stop_timeline",
    "allgather", "allgather_async", "broadcast", "broadcast_async", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "barrier", "broadcast_object", "allgather_object",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "grouped_allgather", "grouped_allgather_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "adasum_allreduce", "adasum_allreduce_async",
]
