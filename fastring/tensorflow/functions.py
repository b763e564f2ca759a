"""horovod.tensorflow's variable helpers: broadcast_variables (and the object collectives,
re-exported from mpi_ops)."""
from __future__ import annotations

from typing import Iterable

import numpy as np
import tensorflow as tf

import fastring
from fastring._horovod import global_process_set, member_set, wait_all

from .tensors import as_tensor, run

__all__ = ["broadcast_variables", "broadcast_arrays"]


def broadcast_arrays(arrays: Iterable[np.ndarray], root_rank: int, name: str,
                     process_set=global_process_set) -> list:
    """`root_rank`'s arrays on every rank of `process_set`: one broadcast each, all in flight
    together."""
    return wait_all([fastring.broadcast_async(a, root_rank, name=f"{name}.{i}", process_set=process_set)
                     for i, a in enumerate(arrays)])


def broadcast_variables(variables, root_rank: int, process_set=global_process_set,
                        inplace: bool = False):
    """Assign `root_rank`'s values to `variables` (tf.Variable or Keras variables) on every
    rank of `process_set`, in list order. Returns the group of assignments (None when executing eagerly, once
    they are done). `inplace` is accepted for Horovod compatibility.

    Example:
        >>> import tensorflow as tf, fastring.tensorflow as hvd
        >>> hvd.init()
        >>> v = tf.Variable([1.0, 2.0])
        >>> hvd.broadcast_variables([v], root_rank=0)
        >>> v.numpy()
        array([1., 2.], dtype=float32)
    """
    process_set = member_set(process_set)
    variables = list(variables)
    if not variables:
        return tf.group()
    values = [as_tensor(v) for v in variables]
    received = run(lambda name, *arrays: broadcast_arrays(arrays, root_rank, name, process_set), values,
                   [t.dtype for t in values], [t.shape for t in values], "broadcast_variables",
                   "broadcast_variables")
    return tf.group(*[v.assign(x) for v, x in zip(variables, received)])
