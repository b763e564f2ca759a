"""Argument checks and error messages shared by cpu.py and cuda.py.

The hot paths in cpu.py/cuda.py do the few cheap checks inline and call in here
only to resolve a cache miss or to explain a failure, so none of this runs per
call on the fast path.  Arrays here are NumPy arrays or device arrays; both
expose ``dtype``, ``shape`` and ``ndim``.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .ops import BFLOAT16, ElementType, KernelOp, WireFormat, element_type, kernel_op

U16 = np.dtype(np.uint16)
U8 = np.dtype(np.uint8)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def is_c_contiguous(arr: Any) -> bool:
    if 0 in tuple(arr.shape):  # numba-cuda calls an empty device array non-contiguous
        return True
    flags = getattr(arr, "flags", None)
    if flags is not None and hasattr(flags, "c_contiguous"):
        return bool(flags.c_contiguous)
    return bool(arr.is_c_contiguous())  # numba device arrays


def _describe(arr: Any) -> str:
    return f"{type(arr).__name__}(dtype={arr.dtype}, shape={tuple(arr.shape)})"


def check_vector(arr: Any, name: str, *, writable: bool = False) -> None:
    """Raise unless ``arr`` is a 1-D C-contiguous array (and writable if asked)."""
    if not hasattr(arr, "dtype") or not hasattr(arr, "shape"):
        raise TypeError(f"{name} must be an array, got {type(arr).__name__}")
    if len(arr.shape) != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    if not is_c_contiguous(arr):
        raise ValueError(f"{name} must be C-contiguous")
    if writable:
        flags = getattr(arr, "flags", None)
        if flags is not None and hasattr(flags, "writeable") and not flags.writeable:
            raise ValueError(f"{name} is read-only")


def check_same_length(a: Any, a_name: str, b: Any, b_name: str) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"length mismatch: {a_name} has {tuple(a.shape)} elements, "
                         f"{b_name} has {tuple(b.shape)}")


def resolve_element(arr: Any, dtype: Any, name: str) -> ElementType:
    """ElementType for ``arr`` (or for the ``dtype`` override, checked against arr)."""
    if not hasattr(arr, "dtype"):
        raise TypeError(f"{name} must be an array, got {type(arr).__name__}")
    if dtype is None:
        return element_type(arr.dtype)
    et = element_type(dtype)
    if arr.dtype.itemsize != et.storage.itemsize:
        raise ValueError(f"dtype={et.name} needs {et.storage.itemsize}-byte elements, "
                         f"{name} has {arr.dtype} ({arr.dtype.itemsize} bytes)")
    return et


def check_pair(dst: Any, src: Any, dtype: Any) -> None:
    """Explain why (dst, src) cannot be reduced; called after the fast path failed."""
    for arr, name in ((dst, "dst"), (src, "src")):
        if not hasattr(arr, "dtype") or not hasattr(arr, "shape"):
            raise TypeError(f"{name} must be an array, got {type(arr).__name__}")
    resolve_element(dst, dtype, "dst")
    if src.dtype != dst.dtype:
        raise ValueError(f"dtype mismatch: dst is {dst.dtype}, src is {src.dtype}")
    check_vector(dst, "dst", writable=True)
    check_vector(src, "src")
    check_same_length(dst, "dst", src, "src")


def resolve_reduce(op: Any, arr: Any, dtype: Any) -> tuple[KernelOp, ElementType]:
    et = resolve_element(arr, dtype, "dst")
    return kernel_op(op), et


def resolve_scalar_target(arr: Any, dtype: Any, what: str) -> ElementType:
    et = resolve_element(arr, dtype, "dst")
    if et.category == "bool":
        raise TypeError(f"{what} is not defined for dtype bool")
    return et


def check_divisor(divisor: Any) -> int:
    import operator

    try:
        n = operator.index(divisor)
    except TypeError:
        raise TypeError(f"divisor must be an integer, got {type(divisor).__name__}") from None
    if n == 0:
        raise ZeroDivisionError("divide_into: divisor is zero")
    return n


def wire_storage(arr: Any, fmt: WireFormat, name: str) -> np.dtype:
    """Check that ``arr`` can hold ``fmt`` bit patterns; returns its dtype.

    uint16 always works; a float16 array is accepted for fp16 and a bfloat16 array
    for bf16, so callers can pass typed arrays without viewing them first.
    """
    if not hasattr(arr, "dtype"):
        raise TypeError(f"{name} must be an array, got {type(arr).__name__}")
    dt = arr.dtype
    if dt == U16:
        return dt
    if fmt == WireFormat.FP16 and dt == np.dtype(np.float16):
        return dt
    if fmt == WireFormat.BF16 and BFLOAT16 is not None and dt == BFLOAT16:
        return dt
    raise TypeError(f"{name} must hold {fmt.name.lower()} bit patterns (uint16"
                    f"{' or float16' if fmt == WireFormat.FP16 else ' or bfloat16'}), "
                    f"got dtype {dt}")


def float_storage(arr: Any, name: str) -> np.dtype:
    if not hasattr(arr, "dtype"):
        raise TypeError(f"{name} must be an array, got {type(arr).__name__}")
    if arr.dtype not in (F32, F64):
        raise TypeError(f"{name} must be float32 or float64, got dtype {arr.dtype}")
    return arr.dtype


def pack_plan(buf: Any, buf_name: str, parts: Sequence[Any], parts_name: str,
              offsets: Sequence[Any]) -> list[tuple[int, int]]:
    """Validate a pack/unpack call; returns [(offset, nbytes)] per part."""
    check_vector(buf, buf_name)
    if buf.dtype != U8:
        raise TypeError(f"{buf_name} must be uint8, got dtype {buf.dtype}")
    if len(parts) != len(offsets):
        raise ValueError(f"{len(parts)} {parts_name} but {len(offsets)} offsets")
    total = buf.shape[0]
    plan = []
    for k, (part, off) in enumerate(zip(parts, offsets)):
        label = f"{parts_name}[{k}]"
        check_vector(part, label)
        if part.dtype != U8:
            raise TypeError(f"{label} must be uint8, got dtype {part.dtype}")
        off = int(off)
        n = part.shape[0]
        if off < 0 or off + n > total:
            raise ValueError(f"{label} ({n} bytes at offset {off}) does not fit in "
                             f"{buf_name} of {total} bytes")
        plan.append((off, n))
    return plan
