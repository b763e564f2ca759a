"""Reduction operators of the public API and their codes below it."""
from __future__ import annotations

import enum

from ..kernels.ops import KernelOp


class ReduceOp(enum.IntEnum):
    """How allreduce and reducescatter combine the ranks' tensors.

    Average is Sum followed by division by the number of ranks (integers truncate toward
    zero). On bool tensors Sum and Max are logical or, Product and Min logical and.

    Example:
        >>> ReduceOp.Average is ReduceOp(0)
        True
    """

    Average = 0
    Sum = 1
    Min = 2
    Max = 3
    Product = 4


# Enum .name is a property lookup on a hot path; a dict is cheaper.
OP_NAMES = {op: op.name for op in ReduceOp}
# What each ReduceOp reduces with in the kernels (Average is a Sum, divided afterwards).
KERNEL_OP = {ReduceOp.Average: KernelOp.SUM, ReduceOp.Sum: KernelOp.SUM, ReduceOp.Min: KernelOp.MIN,
             ReduceOp.Max: KernelOp.MAX, ReduceOp.Product: KernelOp.PRODUCT}
# ReduceOp -> code of the transport's op table (fastring/_transport/mpi.pyx: SUM, MIN, MAX, PROD,
# LOR, LAND); bool uses the logical ones.
MPI_OP = {ReduceOp.Average: 0, ReduceOp.Sum: 0, ReduceOp.Min: 1, ReduceOp.Max: 2, ReduceOp.Product: 3}
MPI_BOOL_OP = {ReduceOp.Sum: 4, ReduceOp.Max: 4, ReduceOp.Min: 5, ReduceOp.Product: 5}


def as_reduce_op(op) -> ReduceOp:
    """Validate a user's op argument.

    Example:
        >>> as_reduce_op(1).name
        'Sum'
    """
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, int) and not isinstance(op, bool):
        try:
            return ReduceOp(op)
        except ValueError:
            pass
    raise ValueError(f"op must be one of {', '.join(o.name for o in ReduceOp)}, got {op!r}")
