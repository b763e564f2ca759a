"""Horovod's argument conventions, shared by every framework adapter (`fastring.torch` and
the adapters to come), so that each adapter only converts its tensors:

- `init(comm=None, process_sets=None)` and the `*_built`/`*_enabled` queries;
- `op=` beside the deprecated `average=` (`horovod_op`), `Adasum`;
- names prefixed by the collective's kind, as Horovod does ("allreduce.<name>"), so that one
  user name may be used by different collectives at the same time (`full_name`);
- `process_set=` (`ProcessSet`, `global_process_set`, `add_process_set`, `remove_process_set`:
  the core's, passed through);
- Horovod-shaped custom compressors (`compress(t) -> (t, ctx)` / `decompress(t, ctx)`),
  applied around a core call, beside the core's own `Compression` (`compressed`);
- a plain allreduce straight to the core's lean paths, past `compressed` and the facade's
  keyword call (`lean_allreduce`).

Adapters import this module and the public `fastring` facade, nothing below them.
"""
from __future__ import annotations

import warnings
from typing import Any

from mpi4py import MPI

import fastring
from fastring import Compressor, ReduceOp
from fastring._core.tensor import host_view, like
from fastring.api.allreduce import _lone_allreduce, _plain_allreduce_async

Average, Sum, Min, Max, Product = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max,
                                   ReduceOp.Product)
# The process queries every adapter re-exports under Horovod's names.
shutdown = fastring.shutdown
is_initialized = fastring.is_initialized
rank = fastring.rank
size = fastring.size
local_rank = fastring.local_rank
local_size = fastring.local_size
cross_rank = fastring.cross_rank
cross_size = fastring.cross_size


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

# Adasum combines whole tensors (allreduce and its grouped, gradient and optimizer forms): the
# collectives that reduce otherwise refuse it with this error rather than reduce by another op.
ADASUM_UNSUPPORTED = ("op=Adasum combines whole tensors (allreduce, grouped_allreduce and the "
                      "gradient reductions); this call has no Adasum form, as in Horovod: use "
                      "op=hvd.Average or op=hvd.Sum")


def dense_op(op, average=None) -> ReduceOp:
    """`horovod_op` for the calls without an Adasum form (reducescatter, Keras' value
    allreduce): NotImplementedError naming the way out for op=Adasum.

    Example:
        >>> from fastring import _horovod as hvd
        >>> hvd.dense_op(hvd.Sum)
        <ReduceOp.Sum: 1>
    """
    op = horovod_op(op, average)
    if op is Adasum:
        raise NotImplementedError(ADASUM_UNSUPPORTED)
    return op


def member_set(process_set) -> ProcessSet:
    """`process_set` (None: the global set) checked where an adapter is called, before it
    builds a graph op whose error would surface later: TypeError unless it is a ProcessSet,
    ValueError unless it is registered and this rank belongs to it.

    Example:
        >>> from fastring import _horovod as hvd
        >>> hvd.init(); hvd.member_set(None) is hvd.global_process_set
        True
    """
    if process_set is None:
        return global_process_set
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a fastring.ProcessSet, got {type(process_set).__name__}")
    included = process_set.included()
    if included is None:
        raise ValueError("process_set is not registered: add it with add_process_set (on every rank) first")
    if not included:
        raise ValueError(f"rank {rank()} is not a member of the process set (ranks {process_set.ranks})")
    return process_set


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


def lean_allreduce(tensor, op, name: str | None, prescale_factor: float, postscale_factor: float, process_set,
                   out, *, asynchronous: bool) -> Any:
    """An allreduce of Horovod's arguments on the core's lean paths, where they are plain (a
    ReduceOp, a string name or none, scale factors of 1.0, no compression: the caller's to
    check) and the core's quick view reads the tensor's host memory: its Handle
    (`asynchronous`) or its result, `out` itself when given or a new tensor of the caller's
    type; `out` must be None or `tensor`. None, having done nothing, where the general path
    must take the call (and raise any error). Neither `compressed` nor a keyword call into
    the facade runs: on a small tensor they cost as much as a tenth of the call.

    Example:
        >>> import torch
        >>> fastring.init()
        >>> t = torch.ones(3)
        >>> lean_allreduce(t, Sum, "w", 1.0, 1.0, None, None, asynchronous=False)   # on 1 rank
        tensor([1., 1., 1.])
        >>> lean_allreduce(t, Sum, "w", 2.0, 1.0, None, t, asynchronous=False) is None   # a scale factor
        True
    """
    # api.allreduce._plain_args' checks and full_name, inline: their two calls would cost as
    # much as this step saves an asynchronous call
    if not (type(op) is ReduceOp and type(prescale_factor) is float and prescale_factor == 1.0
            and type(postscale_factor) is float and postscale_factor == 1.0
            and (out is None or out is tensor)):
        return None
    if type(name) is str:
        name = "allreduce." + name
    elif name is not None:
        return None
    view = host_view(tensor)
    if view is None:
        return None
    if asynchronous:
        return _plain_allreduce_async(tensor, view, op, name, out, process_set)
    result = _lone_allreduce(view, op, name, view if out is tensor else None, process_set)
    if result is None:
        return None
    return out if out is not None else like(tensor, result)


def compressed_all(tensors: list, compression, reduce) -> list:
    """reduce(tensors, core_compression) through `compression`, native or Horovod-shaped
    (each tensor compressed before, decompressed after, with its own context)."""
    if is_native(compression):
        return reduce(tensors, compression)
    packed, ctxs = zip(*(compression.compress(t) for t in tensors)) if tensors else ((), ())
    return [compression.decompress(t, c) for t, c in zip(reduce(list(packed), None), ctxs)]


def compressed(compression, tensor, reduce):
    """reduce(tensor, core_compression) through `compression`, native or Horovod-shaped."""
    if is_native(compression):
        return reduce(tensor, compression)
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(reduce(compressed, None), ctx)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set=global_process_set) -> Any:
    """Every rank receives a copy of `root_rank`'s picklable object (cloudpickle).

    Example:
        >>> from fastring import _horovod as hvd
        >>> hvd.init()
        >>> hvd.broadcast_object({"epoch": 3} if hvd.fastring.rank() == 0 else None, root_rank=0)
        {'epoch': 3}
    """
    return fastring.broadcast_object(obj, root_rank, name=full_name("broadcast_object", name),
                                     process_set=process_set)


def allgather_object(obj: Any, name: str | None = None, process_set=global_process_set) -> list:
    """A list with every rank's picklable object, in rank order.

    Example:
        >>> from fastring import _horovod as hvd
        >>> hvd.init()
        >>> hvd.allgather_object(hvd.fastring.rank())   # on 1 rank
        [0]
    """
    return fastring.allgather_object(obj, name=full_name("allgather_object", name),
                                     process_set=process_set)


def wait_all(handles) -> list:
    """The results of every handle, waiting for all of them (so that nothing stays in flight)
    before raising the first error.

    Example:
        >>> import numpy as np
        >>> from fastring import _horovod as hvd
        >>> hvd.init()
        >>> hvd.wait_all([hvd.fastring.allreduce_async(np.ones(1), op=Sum)])
        [array([1.])]
    """
    results, first_error = [], None
    for handle in handles:
        try:
            results.append(handle.wait())
        except Exception as err:  # noqa: BLE001 - re-raised below, after the others finished
            results.append(None)
            first_error = first_error or err
    if first_error is not None:
        raise first_error
    return results


def start_adasum(tensors, name, compression, prescale_factor: float, process_set) -> list:
    """op=Adasum of a list of tensors: one `fastring.adasum_allreduce_async` per tensor (each
    tensor is its own Adasum; fusing would change the result), the prescale applied before it.
    ValueError for the core's 16-bit compression (Adasum combines full precision).

    Example:
        >>> import numpy as np
        >>> from fastring import _horovod as hvd
        >>> hvd.init()
        >>> [h.wait() for h in hvd.start_adasum([np.ones(2)], None, None, 1.0, None)]   # 1 rank
        [array([1., 1.])]
    """
    if getattr(compression, "wire", None) is not None:
        raise ValueError("op=Adasum takes no compression")
    return [fastring.adasum_allreduce_async(t * prescale_factor if prescale_factor != 1.0 else t,
                                            name=None if name is None else f"{name}.{i}",
                                            process_set=process_set)
            for i, t in enumerate(tensors)]


def reduce_by_dtype(tensors, op, name, compression, prescale_factor: float,
                    postscale_factor: float, process_set=global_process_set) -> list:
    """Allreduce tensors of any dtypes (any framework the core reads): one fused grouped
    allreduce per dtype, all in flight together, results in input order (op=Adasum: one
    Adasum per tensor, `start_adasum`). The core raises (on every rank of `process_set`) if
    the ranks disagree.

    Example:
        >>> import numpy as np
        >>> from fastring import _horovod as hvd
        >>> hvd.init()
        >>> hvd.reduce_by_dtype([np.ones(1), np.arange(2)], Sum, "g", None, 1.0, 1.0)   # 1 rank
        [array([1.]), array([0, 1])]
    """
    if op is Adasum:
        results = wait_all(start_adasum(tensors, name, compression, prescale_factor, process_set))
        return [r * postscale_factor if postscale_factor != 1.0 else r for r in results]
    by_dtype: dict = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    groups = list(by_dtype.items())

    def group_call(dtype, indices, call):
        return call([tensors[i] for i in indices], op, compression=compression,
                    name=None if name is None else f"{name}.{str(dtype).rpartition('.')[2]}",
                    prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                    process_set=process_set)
    # All but the last group in flight; the last one synchronously, which runs the engine's
    # cycles on this thread (a wait on a handle alone is woken by the engine's background
    # thread, a cost of its own on a busy machine).
    handles = [group_call(dtype, indices, fastring.grouped_allreduce_async) for dtype, indices in groups[:-1]]
    try:
        last = group_call(*groups[-1], fastring.grouped_allreduce)
    except Exception:
        wait_all(handles)
        raise
    results: list = [None] * len(tensors)
    for (_, indices), reduced in zip(groups, wait_all(handles) + [last]):
        for i, r in zip(indices, reduced):
            results[i] = r
    return results


def gradient_scaling(op, gradient_predivide_factor: float) -> tuple:
    """(op, prescale_factor, postscale_factor) of a gradient reduction with Horovod's
    arguments: with op=Average the averaging is split around the sum (1/factor before it,
    factor/size after it). ValueError for a predivide factor with another op (Adasum too).

    Example:
        >>> from fastring import _horovod as hvd
        >>> hvd.gradient_scaling(hvd.Average, 4.0)
        (<ReduceOp.Average: 0>, 0.25, 4.0)
    """
    if op is not Adasum:
        op = ReduceOp(op)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Average:
        return op, 1.0 / gradient_predivide_factor, float(gradient_predivide_factor)
    return op, 1.0, 1.0
