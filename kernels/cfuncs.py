"""C-callable kernels for the Cython ring and recursive-doubling loops.

Those loops run without the GIL, so they cannot call a Numba dispatcher; they call a Numba
`cfunc` through its address instead. The element steps are the ones the `@njit` kernels
compile (ops.reduce_step, convert_step, accumulate_step...), so the targets cannot disagree.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import carray, cfunc, types

from .ops import (SOURCE_FINGERPRINT, WIRE_CODECS, accumulate_last_step, accumulate_step,
                  binary_op, convert_step, element_type, kernel_op, reduce_step, wire_format)

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


def _compile3(step, s0, s1, s2):
    fingerprint = SOURCE_FINGERPRINT

    @cfunc(types.void(types.voidptr, types.voidptr, types.voidptr, types.int64), nopython=True,
           cache=True, error_model="numpy")
    def kernel(p0, p1, p2, count):
        fingerprint  # noqa: B018
        a = carray(p0, count, s0)
        b = carray(p1, count, s1)
        c = carray(p2, count, s2)
        for i in range(count):
            step(a, b, c, i)
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


def encode_cfunc(wire: Any, float_dtype: Any) -> int:
    """Address of `void f(uint16* dst, float* src, int64 count)`: dst = encode16(src).

    Example:
        >>> import numpy as np
        >>> encode_cfunc("fp16", np.float32) != 0
        True
    """
    def build():
        fmt, fdt = wire_format(wire), np.dtype(float_dtype)
        return _compile2(convert_step(WIRE_CODECS[fmt][1]), _U16, fdt)
    return _address(("encode", wire, float_dtype), build)


def accumulate_cfunc(wire: Any, op: Any, float_dtype: Any, last: bool) -> int:
    """Address of the fused ring step on a 16-bit wire: with `last` false,
    `void f(float* acc, uint16* recv, uint16* send, int64 count)` computing
    acc = acc op decode(recv); send = encode(acc); with `last` true the 3-pointer-less
    `void f(float* acc, uint16* recv, int64 count)` (the final hop sends nothing).

    Example:
        >>> import numpy as np
        >>> accumulate_cfunc("bf16", 0, np.float32, last=True) != 0
        True
    """
    def build():
        fmt, kop, fdt = wire_format(wire), kernel_op(op), np.dtype(float_dtype)
        widen, narrow = WIRE_CODECS[fmt]
        fn = binary_op(kop, element_type(fdt))
        if last:
            return _compile2(accumulate_last_step(fn, widen), fdt, _U16)
        return _compile3(accumulate_step(fn, widen, narrow), fdt, _U16, _U16)
    return _address(("accumulate", wire, op, float_dtype, last), build)
