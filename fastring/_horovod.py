"""Horovod's argument conventions, shared by every framework adapter (`fastring.torch` and
the adapters to come), so that each adapter only converts its tensors:

- `init(comm=None, process_sets=None)` and the `*_built`/`*_enabled` queries;
- `op=` beside the deprecated `average=` (`horovod_op`), `Adasum`;
- names prefixed by the collective's kind, as Horovod does ("allreduce.<name>"), so that one
  user name may be used by different collectives at the same time (`full_name`);
- `process_set=` (`ProcessSet`, `global_process_set`, `add_process_set`, `remove_process_set`:
  the core's, passed through);
- Horovod-shaped custom compressors (`compress(t) -> (t, ctx)` / `decompress(t, ctx)`),
  applied around a core call, beside the core's own `Compression` (`compressed`).

Adapters import this module and the public `fastring` facade, nothing below them.
"""
from __future__ import annotations

import warnings
from typing import Any

from mpi4py import MPI

import fastring
from fastring import Compressor, ReduceOp

Average, Sum = ReduceOp.Average, ReduceOp.Sum


class _AdasumOp:
    """Horovod's Adasum reduction: `op=Adasum` in an allreduce runs `fastring.adasum_allreduce`
    (float32/float64 on the CPU, a power-of-two number of ranks). A distinct object, equal to
    no ReduceOp."""

    def __repr__(self) -> str:
        return "Adasum"

    def __reduce__(self):
        return "Adasum"


Adasum = _AdasumOp()
ADASUM_OPTIMIZER_UNSUPPORTED = (
    "DistributedOptimizer(op=Adasum) (Horovod's delta optimizer, which applies the Adasum of "
    "the ranks' parameter updates) is not implemented by fastring; reduce tensors with "
    "allreduce(..., op=Adasum), or use op=Average")


ProcessSet, global_process_set = fastring.ProcessSet, fastring.global_process_set
add_process_set, remove_process_set = fastring.add_process_set, fastring.remove_process_set


def init(comm=None, process_sets=None) -> None:
    """Start fastring on `comm` (an mpi4py communicator; default MPI.COMM_WORLD). Idempotent.

    Example:
        >>> from fastring import _horovod as hvd
        >>> hvd.init()
        >>> hvd.size() >= 1
        True
    """
    if comm is not None and not isinstance(comm, MPI.Comm):
        raise NotImplementedError("init(comm=) takes an mpi4py communicator; lists of ranks are "
                                  "not supported (build the communicator with mpi4py)")
    fastring.init(comm, process_sets=process_sets)


def mpi_threads_supported() -> bool:
    """True when MPI runs with MPI_THREAD_MULTIPLE.

    Example:
        >>> from fastring import _horovod as hvd
        >>> isinstance(hvd.mpi_threads_supported(), bool)
        True
    """
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    """Always True: MPI is fastring's only transport (`mpi_built` answers the same).

    Example:
        >>> from fastring import _horovod as hvd
        >>> hvd.mpi_enabled(), hvd.mpi_built()
        (True, True)
    """
    return True


mpi_built = mpi_enabled


def gloo_enabled() -> bool:
    """Always False: fastring has no Gloo, NCCL, DDL, oneCCL, CUDA or ROCm build (the
    other `*_built` functions answer the same).

    Example:
        >>> from fastring import _horovod as hvd
        >>> hvd.gloo_enabled(), hvd.nccl_built(), hvd.cuda_built()
        (False, False, False)
    """
    return False


gloo_built = nccl_built = ddl_built = ccl_built = cuda_built = rocm_built = gloo_enabled



def horovod_op(op, average=None) -> Any:
    """Horovod's op/average pair as one op: `average` is deprecated, None means Average."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average; give only one of them")
    if average is not None:
        warnings.warn("average= is deprecated; use op=Average or op=Sum", DeprecationWarning,
                      stacklevel=3)
        return Average if average else Sum
    if op is None:
        return Average
    return op  # validated by the core (Adasum: by the adapter, which calls adasum_allreduce)


def full_name(kind: str, name):
    """Horovod's full name of a collective: the user's name behind the collective's kind (None
    stays None: the core numbers unnamed collectives alike on every rank)."""
    return f"{kind}.{name}" if isinstance(name, str) else name


def is_native(compression) -> bool:
    """Compressors the core applies inside the ring; any other object with Horovod's
    compress(tensor) -> (tensor, ctx) / decompress(tensor, ctx) is applied around the call."""
    return compression is None or isinstance(compression, Compressor)


def compressed(compression, tensor, reduce):
    """reduce(tensor, core_compression) through `compression`, native or Horovod-shaped."""
    if is_native(compression):
        return reduce(tensor, compression)
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(reduce(compressed, None), ctx)
