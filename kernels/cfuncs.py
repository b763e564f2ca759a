"""C-callable kernels for the Cython ring and recursive-doubling loops.

Those loops run without the GIL, so they cannot call a Numba dispatcher; they call a Numba
`cfunc` through its address instead. The element steps are the ones the `@njit` kernels
compile (ops.reduce_step, ops.wire_steps), so the targets cannot disagree.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import carray, cfunc, types

from .ops import (HOST_WIRE_CODECS, SOURCE_FINGERPRINT, binary_op, element_type, kernel_op,
                  map_function, map_step, reduce_after_step, reduce_step, wire_format, wire_steps)

_U16 = np.dtype(np.uint16)
# key -> cfunc. Holding the object keeps its machine code, and so the address, alive.
_COMPILED: dict = {}


def _compile2(step, s0, s1):
    fingerprint = SOURCE_FINGERPRINT

    @cfunc(types.void(types.voidptr, types.voidptr, types.int64), nopython=True, cache=True,
           error_model="numpy")
    def kernel(p0, p1, count):
        fingerprint  # noqa: B018 -- part of the cache key, see ops.SOURCE_FINGERPRINT
        a = carray(p0, count, s0)
        b = carray(p1, count, s1)
        for i in range(count):
            step(a, b, i)
    return kernel


def _address(key: tuple, build) -> int:
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = _COMPILED[key] = build()
    return compiled.address


def reduce_cfunc(op: Any, dtype: Any) -> int:
    """Address of `void f(void* dst, void* src, int64 count)`: dst = dst op src.

    Example:
        >>> import numpy as np
        >>> reduce_cfunc(0, np.float32) == reduce_cfunc(0, np.float32) != 0
        True
    """
    def build():
        kop, et = kernel_op(op), element_type(dtype)
        return _compile2(reduce_step(binary_op(kop, et), et.load, et.store), et.storage, et.storage)
    return _address(("reduce", op, dtype), build)


def reduce_after_cfunc(op: Any, dtype: Any) -> int:
    """Address of `void f(void* dst, void* src, int64 count)`: dst = src op dst, reduce_cfunc
    with the operands in the other order: a rank reduces its own input in place after the
    lower ranks' values accumulated in `src`, and the result keeps their order.

    Example:
        >>> import numpy as np
        >>> reduce_after_cfunc(0, np.float32) == reduce_after_cfunc(0, np.float32) != reduce_cfunc(0, np.float32)
        True
    """
    def build():
        kop, et = kernel_op(op), element_type(dtype)
        return _compile2(reduce_after_step(binary_op(kop, et), et.load, et.store), et.storage, et.storage)
    return _address(("reduce after", op, dtype), build)


def finish_cfunc(dtype: Any) -> int:
    """Address of `void f(void* dst, int64 count, int64 divisor, float64 factor)`: what runs on
    fully reduced data, in place: divide_into(divisor) unless it is 1, then
    scale_into(factor) unless it is 1.0 -- the same bits as those two calls, element by
    element, so a transport can finish each piece while it is in cache.

    Example:
        >>> import numpy as np
        >>> finish_cfunc(np.float32) == finish_cfunc(np.float32) != 0
        True
    """
    def build():
        et = element_type(dtype)
        div_fn, div_cast = map_function("divide", et)
        scale_fn, scale_cast = map_function("scale", et)
        divide = map_step(div_fn, div_cast, et.load, et.store)
        scale = map_step(scale_fn, scale_cast, et.load, et.store)
        storage = et.storage
        fingerprint = SOURCE_FINGERPRINT

        @cfunc(types.void(types.voidptr, types.int64, types.int64, types.float64), nopython=True,
               cache=True, error_model="numpy")
        def kernel(p, count, divisor, factor):
            fingerprint  # noqa: B018 -- part of the cache key, see ops.SOURCE_FINGERPRINT
            a = carray(p, count, storage)
            if divisor != 1:
                d = div_cast(divisor)  # cast once, not per element: the loop vectorizes
                for i in range(count):
                    divide(a, d, i)
            if factor != 1.0:
                f = scale_cast(factor)
                for i in range(count):
                    scale(a, f, i)
        return kernel
    return _address(("finish", dtype), build)


def _compile_wire(step, s_bits, s_float):
    fingerprint = SOURCE_FINGERPRINT

    @cfunc(types.void(types.voidptr, types.voidptr, types.voidptr, types.voidptr, types.int64,
                      types.float64, types.float64, types.float64), nopython=True, cache=True,
           error_model="numpy")
    def kernel(p_bits, p_src, p_recv, p_dst, count, mul, div, post):
        fingerprint  # noqa: B018
        bits = carray(p_bits, count, s_bits)
        src = carray(p_src, count, s_float)
        recv = carray(p_recv, count, s_bits)
        dst = carray(p_dst, count, s_float)
        for i in range(count):
            step(bits, src, recv, dst, i, mul, div, post)
    return kernel


WIRE_STEPS = ("encode", "hop", "last", "decode")


def wire_cfunc(step: str, wire: Any, op: Any, float_dtype: Any) -> int:
    """Address of `void f(uint16* bits, float* src, uint16* recv, float* dst, int64 count,
    double mul, double div, double post)` running ops.wire_steps' `step` (one of
    WIRE_STEPS) for the 16-bit `wire` format, reduction `op` and float32/float64 values.

    Example:
        >>> import numpy as np
        >>> wire_cfunc("hop", "bf16", 0, np.float32) != 0
        True
    """
    if step not in WIRE_STEPS:
        raise ValueError(f"unknown wire step {step!r}; expected one of {WIRE_STEPS}")

    def build():
        fmt, kop, fdt = wire_format(wire), kernel_op(op), np.dtype(float_dtype)
        widen, narrow = HOST_WIRE_CODECS[fmt]
        et = element_type(fdt)
        steps = wire_steps(binary_op(kop, et), widen, narrow, et.compute)
        return _compile_wire(steps[step], _U16, fdt)
    return _address(("wire", step, wire, op, float_dtype), build)
