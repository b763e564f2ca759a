"""horovod.tensorflow's collectives on fastring: Horovod's names, positional order and defaults,
for tf tensors and variables, eagerly and inside `tf.function` (see tensors.py for how a
collective becomes one ordered graph op).

allreduce, grouped_allreduce, allgather and broadcast are differentiable as Horovod's are
(`tf.custom_gradient`): allreduce's gradient is the same allreduce of the output's gradient,
allgather's the averaged gradient's rows of this rank, broadcast's the averaged gradient on
the root and zeros elsewhere. Results are new tensors; inputs are never written.
op=Adasum (float32/float64, a power-of-two number of ranks) reduces each tensor by
`fastring.adasum_allreduce`, its gradient too, as in fastring.torch.

Every collective takes Horovod's `process_set=`: a registered `ProcessSet` that this rank
belongs to (checked at the call, before any graph op is built), over whose ranks it runs;
`root_rank` stays a global rank, as in the core API.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

import fastring
from fastring import Compression, FastringError, ReduceOp
from fastring._horovod import (Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set,
                               allgather_object, remove_process_set,
                               broadcast_object, ccl_built, cross_rank, cross_size, is_initialized,
                               local_rank, local_size, rank, shutdown, size,
                               member_set, compressed_all, cuda_built, ddl_built, full_name, gloo_built,
                               gloo_enabled, global_process_set, dense_op, horovod_op, init, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, reduce_by_dtype,
                               rocm_built)

from .tensors import as_tensor, run

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "rank_op", "size_op", "local_rank_op", "local_size_op", "mpi_threads_supported",
    "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "Average", "Sum", "Min", "Max", "Product", "Adasum", "ReduceOp",
    "Compression", "FastringError", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "barrier", "join", "broadcast_object", "allgather_object",
]

def rank_op(name: str | None = None) -> tf.Tensor:
    """This rank as an int32 tensor (Horovod's op form of `rank()`).

    Example:
        >>> import fastring.tensorflow as hvd
        >>> hvd.init(); int(hvd.rank_op()) == hvd.rank()
        True
    """
    return tf.constant(rank(), tf.int32, name=name)


def size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks as an int32 tensor.

    Example:
        >>> import fastring.tensorflow as hvd
        >>> hvd.init(); int(hvd.size_op()) == hvd.size()
        True
    """
    return tf.constant(size(), tf.int32, name=name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This rank's index on its host as an int32 tensor.

    Example:
        >>> import fastring.tensorflow as hvd
        >>> hvd.init(); int(hvd.local_rank_op()) == hvd.local_rank()
        True
    """
    return tf.constant(local_rank(), tf.int32, name=name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks on this host as an int32 tensor.

    Example:
        >>> import fastring.tensorflow as hvd
        >>> hvd.init(); int(hvd.local_size_op()) == hvd.local_size()
        True
    """
    return tf.constant(local_size(), tf.int32, name=name)


def _rows_shape(tensor: tf.Tensor) -> list:
    """The static shape of a result whose dimension 0 depends on the other ranks."""
    if tensor.shape.rank is None:
        return None
    return [None] + tensor.shape.as_list()[1:]


# ----------------------------------------------------------------- allreduce
def _reduce_graph(tensors: list, op, name, compression, prescale, postscale, process_set) -> list[tf.Tensor]:
    """Dense tensors reduced by one op over `process_set` (eager call or graph op), without a
    gradient."""
    tensors = [as_tensor(t) for t in tensors]
    return run(lambda n, *arrays: reduce_by_dtype(arrays, op, n, compression, prescale, postscale, process_set),
               tensors, [t.dtype for t in tensors], [t.shape for t in tensors], "allreduce", name)


def _differentiable_reduce(tensors: list, op, name, compression, prescale, postscale, process_set) -> list:
    @tf.custom_gradient
    def reduce(*ts):
        def grad(*dys):
            return _differentiable_reduce(list(dys), op, None, compression, prescale, postscale, process_set)
        return _reduce_graph(list(ts), op, name, compression, prescale, postscale, process_set), grad
    out = reduce(*[as_tensor(t) for t in tensors])
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _sparse_allreduce(slices: tf.IndexedSlices, op, name, prescale, postscale, process_set) -> tf.IndexedSlices:
    """Horovod's reduction of IndexedSlices: gather the rows of every rank of `process_set`
    (duplicates stay, as IndexedSlices allow); Average divides the values by its size."""
    if op not in (Sum, Average):
        raise NotImplementedError("IndexedSlices are reduced by op=Sum or op=Average only "
                                  "(or pass sparse_as_dense=True)")
    values = allgather(slices.values, name=None if name is None else f"{name}.values", process_set=process_set)
    indices = allgather(slices.indices, name=None if name is None else f"{name}.indices", process_set=process_set)
    scale = prescale * postscale / (process_set.size() if op == Average else 1)
    if scale != 1.0:
        values = values * tf.constant(scale, values.dtype)
    return tf.IndexedSlices(values, indices, slices.dense_shape)


def allreduce(tensor, average: bool | None = None, device_dense: str = "", device_sparse: str = "",
              compression=Compression.none, op=None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None,
              process_set=global_process_set, ignore_name_scope: bool = False):
    """Average (default) or otherwise reduce a tensor or variable over all ranks; returns a
    new tensor. Differentiable. `tf.IndexedSlices` are gathered, as Horovod does (Sum or
    Average only). Every rank must pass the same shape and dtype under one name
    (FastringError on every rank otherwise). `device_*` and `ignore_name_scope` are accepted
    for Horovod compatibility (fastring reduces host memory; names are not scoped).

    Example:
        >>> import tensorflow as tf, fastring.tensorflow as hvd
        >>> hvd.init()
        >>> hvd.allreduce(tf.constant([1.0, 3.0]), op=hvd.Sum).numpy()   # on 1 rank
        array([1., 3.], dtype=float32)
    """
    op = horovod_op(op, average)
    process_set = member_set(process_set)
    name = full_name("allreduce", name)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, op, name, prescale_factor, postscale_factor, process_set)
    return compressed_all([tensor], compression, lambda ts, c: _differentiable_reduce(
        ts, op, name, c, prescale_factor, postscale_factor, process_set))[0]


def grouped_allreduce(tensors: Sequence, average: bool | None = None, device_dense: str = "",
                      device_sparse: str = "", compression=Compression.none, op=None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set=global_process_set, name: str | None = None) -> list:
    """Allreduce a list of tensors as fused operations (one per dtype), in one call or graph
    op; returns a list of new tensors. Differentiable like `allreduce`.

    Example:
        >>> import tensorflow as tf, fastring.tensorflow as hvd
        >>> hvd.init()
        >>> [t.numpy() for t in hvd.grouped_allreduce([tf.ones(2), tf.zeros(1, tf.int32)])]
        [array([1., 1.], dtype=float32), array([0], dtype=int32)]
    """
    op = horovod_op(op, average)
    process_set = member_set(process_set)
    tensors = list(tensors)
    if not tensors:
        return []
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        raise TypeError("grouped_allreduce takes dense tensors; reduce IndexedSlices with "
                        "allreduce, or convert them with tf.convert_to_tensor")
    name = full_name("grouped_allreduce", name)
    return compressed_all(tensors, compression, lambda ts, c: _differentiable_reduce(
        ts, op, name, c, prescale_factor, postscale_factor, process_set))


# ----------------------------------------------------------------- allgather, broadcast
def allgather(tensor, name: str | None = None, ignore_name_scope: bool = False,
              process_set=global_process_set) -> tf.Tensor:
    """Concatenate every rank's tensor along dimension 0 (which may differ between ranks).
    Differentiable (gradient: the averaged output gradient's rows of this rank).

    Example:
        >>> import tensorflow as tf, fastring.tensorflow as hvd
        >>> hvd.init()
        >>> hvd.allgather(tf.ones((2, 3))).shape   # (2 * size, 3)
        TensorShape([2, 3])
    """
    process_set = member_set(process_set)
    name = full_name("allgather", name)

    @tf.custom_gradient
    def gather(t):
        out = run(lambda n, a: [fastring.allgather(a, name=n, process_set=process_set)], [t], [t.dtype],
                  [_rows_shape(t)], "allgather", name)[0]

        def grad(dy):
            reduced = allreduce(dy, op=Average, process_set=process_set)
            rows = allgather(tf.shape(t)[:1], process_set=process_set)
            offset = tf.reduce_sum(rows[:process_set.rank()])
            return tf.slice(reduced, tf.concat([[offset], tf.zeros_like(tf.shape(t)[1:])], 0), tf.shape(t))
        return out, grad
    return gather(as_tensor(tensor))


def broadcast(tensor, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set=global_process_set) -> tf.Tensor:
    """A new tensor holding `root_rank`'s `tensor` on every rank. Differentiable.

    Example:
        >>> import tensorflow as tf, fastring.tensorflow as hvd
        >>> hvd.init()
        >>> hvd.broadcast(tf.constant([1, 2]), root_rank=0).numpy()
        array([1, 2], dtype=int32)
    """
    process_set = member_set(process_set)
    name = full_name("broadcast", name)

    @tf.custom_gradient
    def bcast(t):
        out = run(lambda n, a: [fastring.broadcast(a, root_rank, name=n, process_set=process_set)], [t],
                  [t.dtype], [t.shape], "broadcast", name)[0]

        def grad(dy):
            reduced = allreduce(dy, op=Average, process_set=process_set)
            return reduced if rank() == root_rank else reduced * tf.zeros((), reduced.dtype)
        return out, grad
    return bcast(as_tensor(tensor))


# ----------------------------------------------------------------- alltoall, reducescatter
def alltoall(tensor, splits=None, name: str | None = None, ignore_name_scope: bool = False,
             process_set=global_process_set) -> tuple[tf.Tensor, tf.Tensor]:
    """Send rows of `tensor` to every rank and receive theirs, in rank order; returns
    (tensor, received_splits) as horovod.tensorflow does. `splits` (int32, one entry per rank)
    says how many rows go to each rank; without it dimension 0 is divided equally.

    Example:
        >>> import tensorflow as tf, fastring.tensorflow as hvd
        >>> hvd.init()
        >>> out, received = hvd.alltoall(tf.range(4))   # on 1 rank
        >>> out.numpy(), received.numpy()
        (array([0, 1, 2, 3], dtype=int32), array([4], dtype=int32))
    """
    process_set = member_set(process_set)
    ranks = process_set.size()
    name = full_name("alltoall", name)
    t = as_tensor(tensor)
    inputs = [t]
    if splits is not None:
        inputs.append(tf.cast(as_tensor(splits), tf.int32))

    def exchange(name, a, s=None):
        if s is None:  # Horovod divides dimension 0 equally and still reports the splits
            if a.ndim == 0 or a.shape[0] % ranks:
                # raises the core's ValueError naming the problem
                fastring.alltoall(a, name=name, process_set=process_set)
            s = np.full(ranks, a.shape[0] // ranks, np.int32)
        return list(fastring.alltoall(a, s, name=name, process_set=process_set))
    return tuple(run(exchange, inputs, [t.dtype, tf.int32], [_rows_shape(t), [ranks]], "alltoall", name))


def reducescatter(tensor, device_dense: str = "", compression=Compression.none, op=Average,
                  name: str | None = None, ignore_name_scope: bool = False,
                  process_set=global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce `tensor` over all ranks and return this rank's slice of dimension 0 (ranks
    0..(d0 % size)-1 get one extra row).

    Example:
        >>> import tensorflow as tf, fastring.tensorflow as hvd
        >>> hvd.init()
        >>> hvd.reducescatter(tf.ones((4, 2)), op=hvd.Sum).shape   # (4 / size, 2)
        TensorShape([4, 2])
    """
    op = dense_op(op)
    process_set = member_set(process_set)
    name = full_name("reducescatter", name)

    def reduce(ts, core_compression):
        t = as_tensor(ts[0])
        wire = getattr(core_compression, "wire", None) if t.dtype.is_floating else None
        # The core's reducescatter takes no compression: cast to the wire format around it.
        sent = t if wire is None else tf.cast(t, _WIRE[wire])
        out = run(lambda n, a: [fastring.reducescatter(a, op, name=n, prescale_factor=prescale_factor,
                                                    postscale_factor=postscale_factor,
                                                    process_set=process_set)],
                  [sent], [sent.dtype], [_rows_shape(sent)], "reducescatter", name)[0]
        return [out if wire is None else tf.cast(out, t.dtype)]
    return compressed_all([tensor], compression, reduce)[0]


_WIRE = {"fp16": tf.float16, "bf16": tf.bfloat16}


# ----------------------------------------------------------------- synchronization points
def barrier(process_set=global_process_set) -> None:
    """Return once every rank has called barrier.

    Example:
        >>> import fastring.tensorflow as hvd
        >>> hvd.init(); hvd.barrier()
    """
    fastring.barrier(process_set=member_set(process_set))


def join() -> int:
    """Declare that this rank has run out of data; return the rank that joined last (see
    fastring.join: until every rank has joined, a joined rank contributes zeros).

    Example:
        >>> import fastring.tensorflow as hvd
        >>> hvd.init(); hvd.join()   # on 1 rank
        0
    """
    return int(fastring.join())
