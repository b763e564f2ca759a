"""Argument checks every collective shares: local errors (TypeError/ValueError) raised at call
time on the calling rank, before anything is queued."""
from __future__ import annotations

import numbers

import numpy as np

from .._core import pool as _pool
from .._core.dtypes import DtypeSpec
from .._core.ops import ReduceOp
from .._core.tensor import as_array, like
from .._core.work import Entry
from .._transport import array_address, is_writable_c_contiguous


def factor(value, what: str) -> float:
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a real number, got {type(value).__name__}")
    return float(value)


def request_name(rt, kind: str, name) -> str:
    """The collective's name: the user's, or the next automatic name for `kind` on this
    thread. Called first, before any other check, so that a call that then fails on one rank
    only still uses up its automatic name there, as the same call does on the other ranks.

    Example:
        >>> import fastring
        >>> from fastring._core.runtime import runtime
        >>> fastring.init()
        >>> request_name(runtime(), "allreduce", "grad.w")
        'grad.w'
    """
    if name is None:
        return rt.engine.auto_name(kind)
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    return name


def is_automatic(name: str) -> bool:
    """Whether `name` was given by `request_name` rather than by the user."""
    return ".noname." in name


def entry(tensor, arr: np.ndarray, out) -> Entry:
    """Where one tensor's allreduce reads, works and writes; nothing is copied until it runs."""
    if out is None:
        work = _pool.empty(arr.shape, arr.dtype)
        return Entry(arr, work, work, like(tensor, work))
    if out is tensor and is_writable_c_contiguous(arr):  # in place: nothing else to check
        return Entry(arr, arr, arr, out)
    target = arr if out is tensor else as_array(out, "out")
    if target.shape != arr.shape:
        raise ValueError(f"out has shape {target.shape}, the tensor {arr.shape}")
    if target.dtype != arr.dtype:
        raise TypeError(f"out has dtype {target.dtype}, the tensor {arr.dtype}")
    if target is not arr and np.may_share_memory(target, arr):
        if same_view(target, arr):
            target = arr  # in place, through another view of the same memory
        else:
            # Writing the result would overwrite input not yet read: read a private copy.
            arr = arr.copy()
    if is_writable_c_contiguous(target):
        return Entry(arr, target, target, out)
    if not target.flags.writeable:
        raise ValueError("out is read-only")
    # A non-contiguous target is reduced through a contiguous copy, written back at the end.
    return Entry(arr, np.empty(arr.shape, arr.dtype), target, out)


def same_view(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays view the same memory the same way (the same address, shape,
    strides and dtype), so that writing one is writing the other element for element.

    Example:
        >>> x = np.arange(4)
        >>> same_view(x, x[:]), same_view(x[1:], x[:3])
        (True, False)
    """
    return (a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype
            and array_address(a) == array_address(b))


def check_op_for_dtype(op: ReduceOp, spec: DtypeSpec, prescale: float = 1.0, postscale: float = 1.0) -> None:
    if spec.name == "bool" and op == ReduceOp.Average:
        raise TypeError("Average is not defined for bool tensors; use Sum (logical or) or Min/Max")
    if spec.name == "uint64" and op == ReduceOp.Average:
        # the exact integer mean works in int64, which holds no uint64 above 2**63
        raise TypeError("Average is not supported for uint64 tensors; use Sum and divide")
    if spec.name == "uint64" and (prescale != 1.0 or postscale != 1.0):
        raise TypeError("scale factors are not supported for uint64 tensors (they are applied "
                        "in int64 arithmetic)")
