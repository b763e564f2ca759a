"""fastring.keras: a drop-in replacement for `horovod.tensorflow.keras`, for Keras 3 on the
TensorFlow or PyTorch backend.

Change `import horovod.tensorflow.keras as hvd` (or `horovod.keras`) into
`import fastring.keras as hvd`: `hvd.DistributedOptimizer(opt)`, the callbacks in
`hvd.callbacks` and `model.fit` train the same on every rank. `allreduce`, `allgather` and
`broadcast` take any value Keras can convert and return numpy arrays, as Horovod's Keras
functions do.

Example:
    >>> import keras, fastring.keras as hvd
    >>> hvd.init()
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size())),
    ...               loss="mse")
    >>> callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    ...              hvd.callbacks.MetricAverageCallback()]
    >>> float(hvd.allreduce(2.0, name="metric"))   # Average over ranks
    2.0
"""
from __future__ import annotations

import numpy as np

import fastring
from fastring import Compression, FastringError, ReduceOp
from fastring._horovod import (Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set,
                               allgather_object, remove_process_set,
                               broadcast_object, cross_rank, cross_size, full_name, global_process_set,
                               horovod_op, init, reduce_by_dtype, is_initialized, local_rank, local_size, mpi_built,
                               mpi_enabled, mpi_threads_supported, rank, shutdown, size)

from . import callbacks
from .backend import broadcast_values, check_backend, to_numpy
from .optimizer import DistributedOptimizer

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "mpi_threads_supported", "mpi_enabled", "mpi_built", "Average", "Sum", "Min", "Max",
    "Product", "Adasum", "ReduceOp", "Compression", "FastringError", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set",
    "DistributedOptimizer", "callbacks", "allreduce", "allgather", "broadcast", "broadcast_variables",
    "broadcast_object", "allgather_object",
]

def allreduce(value, name: str | None = None, average: bool | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op=None, compression=Compression.none) -> np.ndarray:
    """Average (default) or otherwise reduce a value (number, array, tensor or variable) over
    all ranks; returns a numpy array.

    Example:
        >>> import fastring.keras as hvd
        >>> hvd.init()
        >>> hvd.allreduce([1.0, 3.0], op=hvd.Sum)   # on 1 rank
        array([1., 3.])
    """
    op, name = horovod_op(op, average), full_name("allreduce", name)
    if op is Adasum:
        return reduce_by_dtype([to_numpy(value)], op, name, compression, prescale_factor, postscale_factor)[0]
    return fastring.allreduce(to_numpy(value), op, name=name, compression=compression,
                              prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def allgather(value, name: str | None = None) -> np.ndarray:
    """Concatenate every rank's value along dimension 0; returns a numpy array.

    Example:
        >>> import fastring.keras as hvd
        >>> hvd.init()
        >>> hvd.allgather([[1, 2]])   # on 1 rank
        array([[1, 2]])
    """
    return fastring.allgather(to_numpy(value), name=full_name("allgather", name))


def broadcast(value, root_rank: int, name: str | None = None) -> np.ndarray:
    """`root_rank`'s value on every rank, as a numpy array.

    Example:
        >>> import fastring.keras as hvd
        >>> hvd.init()
        >>> hvd.broadcast([1, 2], root_rank=0)
        array([1, 2])
    """
    return fastring.broadcast(to_numpy(value), root_rank, name=full_name("broadcast", name))


def broadcast_variables(variables, root_rank: int) -> None:
    """Assign `root_rank`'s values to Keras variables (e.g. `model.variables`) on every rank.

    Example:
        >>> import keras, fastring.keras as hvd
        >>> hvd.init()
        >>> v = keras.Variable([1.0, 2.0])
        >>> hvd.broadcast_variables([v], root_rank=0)
    """
    check_backend()
    broadcast_values(list(variables), root_rank, "broadcast_variables")
