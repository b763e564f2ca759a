"""CPU reduction / compression kernels (Numba ``@njit``).

Every kernel is a plain ``range`` loop around a step function from ``ops.py``,
compiled once per (operation, dtype) with an explicit signature and looked up in
a dict on each call, so a call costs one dict lookup, a couple of attribute
checks and Numba's native dispatch -- these run on 4 KiB messages in the latency
path.  The loops are simple enough for LLVM to vectorise, which keeps large
arrays memory-bandwidth bound.

Not ``parallel=True``: the performance configuration is two MPI ranks on a
two-core machine, so each rank already owns one core, and threading inside a
kernel would only make the ranks fight (and add a thread-pool wake-up to every
small message).  ``nogil=True`` lets the engine's progress thread run while a
kernel does.

Compiled code is cached on disk (``cache=True``); see ops.py for why the ops are
``register_jitable`` functions rather than captured dispatchers.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import numpy as np
from numba import njit, types
from numba.np.numpy_support import from_dtype

from . import _validate as v
from .ops import (SOURCE_FINGERPRINT, WIRE_CODECS, KernelOp, WireFormat, accumulate_last_step,
                  accumulate_step, binary_op, convert_step, element_type, kernel_op,
                  map_function, map_step, reduce_step, to_i64, wire_format)

__all__ = ["reduce_into", "scale_into", "divide_into", "encode16", "decode16",
           "accumulate16", "pack", "unpack"]

_JIT_OPTIONS = dict(cache=True, nogil=True,
                    # numpy error model: no per-element ZeroDivisionError branch, which
                    # would also block vectorisation; divisors are validated up front.
                    error_model="numpy")


def _loop(step: Callable, arity: int):
    """A fresh njit loop calling ``step`` for every index of its first argument."""
    fingerprint = SOURCE_FINGERPRINT
    if arity == 2:
        @njit(**_JIT_OPTIONS)
        def loop2(a, b):
            fingerprint  # noqa: B018 -- part of the cache key, see ops.SOURCE_FINGERPRINT
            for i in range(a.shape[0]):
                step(a, b, i)
        return loop2

    @njit(**_JIT_OPTIONS)
    def loop3(a, b, c):
        fingerprint  # noqa: B018
        for i in range(a.shape[0]):
            step(a, b, c, i)
    return loop3


def _vec(dtype: np.dtype) -> types.Array:
    return types.Array(from_dtype(np.dtype(dtype)), 1, "C")


@functools.lru_cache(maxsize=None)
def _compile(step: Callable, argtypes: tuple) -> Callable:
    disp = _loop(step, len(argtypes))
    disp.compile(argtypes)
    # Anything not matching the signature (wrong dtype, layout, read-only) must be
    # a TypeError we can explain, not a silent compile of a new specialisation.
    disp.disable_compile()
    return disp


# ---------------------------------------------------------------- lookup tables
# Values are (compiled function, storage dtype to view as or None, extra).

_REDUCE: dict = {}
_SCALE: dict = {}
_DIVIDE: dict = {}
_ENCODE: dict = {}
_DECODE: dict = {}
_ACCUMULATE: dict = {}


def _storage_view(et, dtype: Any) -> Optional[np.dtype]:
    # fp16/bf16 live in uint16 arrays; a dtype= override reinterprets whatever was passed.
    return et.storage if (dtype is not None or et.stored_as_bits) else None


def _reduce_entry(op: Any, dst: Any, dtype: Any):
    kop, et = v.resolve_reduce(op, dst, dtype)
    step = reduce_step(binary_op(kop, et), et.load, et.store)
    entry = (_compile(step, (_vec(et.storage), _vec(et.storage))), _storage_view(et, dtype))
    if dtype is None:
        _REDUCE[kop, dst.dtype] = entry
    return entry


def _map_entry(table: dict, dst: Any, dtype: Any, what: str):
    et = v.resolve_scalar_target(dst, dtype, what)
    fn, cast = map_function("scale" if what == "scale_into" else "divide", et)
    ptype, conv = (types.int64, int) if cast is to_i64 else (types.float64, float)
    step = map_step(fn, cast, et.load, et.store)
    entry = (_compile(step, (_vec(et.storage), ptype)), _storage_view(et, dtype), conv)
    if dtype is None:
        table[dst.dtype] = entry
    return entry


def reduce_into(dst: np.ndarray, src: np.ndarray, op: KernelOp | int, *,
                dtype: Any = None) -> None:
    """In place ``dst[:] = dst op src`` for 1-D C-contiguous arrays of one dtype.

    Integer SUM/PRODUCT wrap like NumPy; MIN/MAX propagate NaN like np.minimum /
    np.maximum; float16 and bfloat16 are computed in float32 and rounded once; bool
    uses SUM=or, PRODUCT=and, MIN=and, MAX=or.  ``dtype`` names the element type
    when the arrays carry raw bits (e.g. ``dtype='bfloat16'`` for uint16 arrays).
    ``dst`` and ``src`` should not partially overlap.

    Raises TypeError for an unsupported dtype, ValueError for mismatched dtypes or
    lengths, non-1-D / non-contiguous / read-only arrays, or an unknown op.

    >>> a = np.array([1, 5], np.int32); reduce_into(a, np.array([3, 2], np.int32), KernelOp.MAX)
    >>> a
    array([3, 5], dtype=int32)
    """
    try:
        fn, view = _REDUCE[op, dst.dtype] if dtype is None else _reduce_entry(op, dst, dtype)
    except (KeyError, TypeError, AttributeError):
        fn, view = _reduce_entry(op, dst, dtype)
    d, s = dst, src
    if view is not None:
        if getattr(src, "dtype", None) != dst.dtype:
            v.check_pair(dst, src, dtype)
        d, s = dst.view(view), src.view(view)
    try:
        if d.shape != s.shape:
            v.check_same_length(dst, "dst", src, "src")
        fn(d, s)
    except (TypeError, AttributeError):
        v.check_pair(dst, src, dtype)
        raise


def scale_into(dst: np.ndarray, factor: float, *, dtype: Any = None) -> None:
    """In place ``dst *= factor``.

    float64 is computed in float64; float32, float16 and bfloat16 in float32 with
    ``factor`` rounded to float32, then rounded once to the dtype.  Integers become
    ``trunc(dst * factor)`` computed in float64 and wrapped modulo 2**64 into the
    dtype's width, as integer arithmetic wraps (a product that is not finite, possible
    only for factors beyond about 1e289, gives 0).  bool raises TypeError.

    >>> a = np.array([3, -3], np.int8); scale_into(a, 0.5); a
    array([ 1, -1], dtype=int8)
    """
    try:
        fn, view, conv = _SCALE[dst.dtype] if dtype is None else _map_entry(_SCALE, dst, dtype,
                                                                           "scale_into")
    except (KeyError, TypeError, AttributeError):
        fn, view, conv = _map_entry(_SCALE, dst, dtype, "scale_into")
    factor = float(factor)
    d = dst if view is None else dst.view(view)
    try:
        fn(d, factor)
    except (TypeError, AttributeError):
        v.check_vector(dst, "dst", writable=True)
        raise


def divide_into(dst: np.ndarray, divisor: int, *, dtype: Any = None) -> None:
    """In place division by a non-zero integer, as used for Average.

    Floats use true division ``x / divisor`` in the dtype's compute precision
    (float32 for float32/float16/bfloat16), not a multiply by ``1/divisor``;
    integers truncate toward zero like C (``-7 / 2 == -3``).

    >>> a = np.array([-7, 7], np.int32); divide_into(a, 2); a
    array([-3,  3], dtype=int32)
    """
    n = v.check_divisor(divisor)
    try:
        fn, view, conv = _DIVIDE[dst.dtype] if dtype is None else _map_entry(_DIVIDE, dst, dtype,
                                                                            "divide_into")
    except (KeyError, TypeError, AttributeError):
        fn, view, conv = _map_entry(_DIVIDE, dst, dtype, "divide_into")
    d = dst if view is None else dst.view(view)
    try:
        fn(d, conv(n))
    except (TypeError, AttributeError):
        v.check_vector(dst, "dst", writable=True)
        raise


# ------------------------------------------------------------------ 16-bit wire

def _as_u16(arr: Any, fmt: WireFormat, name: str) -> Any:
    if arr.dtype != v.U16:
        v.wire_storage(arr, fmt, name)
        return arr.view(v.U16)
    return arr


def _codec_entry(table: dict, wire: Any, arr: Any, name: str, encode: bool):
    fmt = wire_format(wire)
    fdt = v.float_storage(arr, name)
    widen, narrow = WIRE_CODECS[fmt]
    step = convert_step(narrow if encode else widen)
    args = (_vec(v.U16), _vec(fdt)) if encode else (_vec(fdt), _vec(v.U16))
    entry = (_compile(step, args), fmt)
    table[fmt, fdt] = entry
    return entry


def _convert(table: dict, float_arr: Any, bits_arr: Any, wire: Any, encode: bool) -> None:
    fname, bname = ("src", "dst") if encode else ("dst", "src")
    try:
        fn, fmt = table[wire, float_arr.dtype]
    except (KeyError, TypeError, AttributeError):
        fn, fmt = _codec_entry(table, wire, float_arr, fname, encode)
    bits = _as_u16(bits_arr, fmt, bname)
    try:
        if bits.shape != float_arr.shape:
            v.check_same_length(float_arr, fname, bits_arr, bname)
        if encode:
            fn(bits, float_arr)
        else:
            fn(float_arr, bits)
    except (TypeError, AttributeError):
        v.check_vector(float_arr, fname, writable=not encode)
        v.check_vector(bits_arr, bname, writable=encode)
        raise


def encode16(src: np.ndarray, dst: np.ndarray, wire: WireFormat | str) -> None:
    """Round float32 ``src`` to 16-bit ``wire`` bit patterns in ``dst`` (uint16).

    Round-to-nearest-even, bit-identical to ``src.astype(np.float16)`` for 'fp16'
    and to ``src.astype(ml_dtypes.bfloat16)`` for 'bf16' (bf16 NaN becomes the
    signed canonical quiet NaN).  float64 ``src`` is rounded to float32 first (a
    double rounding; can differ from a direct float64 cast in the last bit).
    ``dst`` may also be a float16 / bfloat16 array matching ``wire``.

    >>> out = np.empty(1, np.uint16); encode16(np.array([1.0], np.float32), out, "bf16")
    >>> hex(out[0])
    '0x3f80'
    """
    _convert(_ENCODE, src, dst, wire, True)


def decode16(src: np.ndarray, dst: np.ndarray, wire: WireFormat | str) -> None:
    """Widen 16-bit ``wire`` bit patterns in ``src`` to float32 (or float64) ``dst``.

    Exact (every fp16/bf16 value is a float32 value).

    >>> out = np.empty(1, np.float32); decode16(np.array([0x3c00], np.uint16), out, "fp16")
    >>> out
    array([1.], dtype=float32)
    """
    _convert(_DECODE, dst, src, wire, False)


def _accumulate_entry(wire: Any, op: Any, acc: Any, with_send: bool):
    fmt = wire_format(wire)
    kop = kernel_op(op)
    fdt = v.float_storage(acc, "acc")
    widen, narrow = WIRE_CODECS[fmt]
    fn = binary_op(kop, element_type(fdt))
    if with_send:
        entry = _compile(accumulate_step(fn, widen, narrow),
                         (_vec(fdt), _vec(v.U16), _vec(v.U16)))
    else:
        entry = _compile(accumulate_last_step(fn, widen), (_vec(fdt), _vec(v.U16)))
    _ACCUMULATE[fmt, kop, fdt, with_send] = (entry, fmt)
    return entry, fmt


def accumulate16(acc: np.ndarray, recv: np.ndarray, send: Optional[np.ndarray] = None,
                 wire: WireFormat | str = WireFormat.FP16, op: KernelOp | int = KernelOp.SUM
                 ) -> None:
    """One fused ring step on compressed data, in a single pass.

    ``acc = acc op decode(recv)`` and, when ``send`` is given, ``send = encode(acc)``
    (pass ``send=None`` on the last hop).  ``acc`` is float32 (or float64, encoded
    via float32); ``recv``/``send`` hold ``wire`` bit patterns (uint16, or the
    matching float16 / bfloat16 dtype).

    >>> acc = np.ones(2, np.float32); recv = np.full(2, 0x3c00, np.uint16)
    >>> send = np.empty(2, np.uint16); accumulate16(acc, recv, send, "fp16", KernelOp.SUM)
    >>> acc, hex(send[0])
    (array([2., 2.], dtype=float32), '0x4000')
    """
    with_send = send is not None
    try:
        fn, fmt = _ACCUMULATE[wire, op, acc.dtype, with_send]
    except (KeyError, TypeError, AttributeError):
        fn, fmt = _accumulate_entry(wire, op, acc, with_send)
    r = _as_u16(recv, fmt, "recv")
    try:
        if r.shape != acc.shape:
            v.check_same_length(acc, "acc", recv, "recv")
        if with_send:
            s = _as_u16(send, fmt, "send")
            if s.shape != acc.shape:
                v.check_same_length(acc, "acc", send, "send")
            fn(acc, r, s)
        else:
            fn(acc, r)
    except (TypeError, AttributeError):
        v.check_vector(acc, "acc", writable=True)
        v.check_vector(recv, "recv")
        if with_send:
            v.check_vector(send, "send", writable=True)
        raise


# ----------------------------------------------------------------- pack/unpack

def pack(dst: np.ndarray, srcs: Sequence[np.ndarray], offsets: Sequence[int]) -> None:
    """Copy each uint8 array ``srcs[k]`` into ``dst[offsets[k]:offsets[k]+len]``.

    >>> buf = np.zeros(4, np.uint8); pack(buf, [np.array([7, 8], np.uint8)], [1]); buf
    array([0, 7, 8, 0], dtype=uint8)
    """
    for (off, n), part in zip(v.pack_plan(dst, "dst", srcs, "srcs", offsets), srcs):
        np.copyto(dst[off:off + n], part)


def unpack(src: np.ndarray, dsts: Sequence[np.ndarray], offsets: Sequence[int]) -> None:
    """Copy ``src[offsets[k]:offsets[k]+len(dsts[k])]`` into each uint8 array ``dsts[k]``.

    >>> out = np.empty(2, np.uint8); unpack(np.arange(4, dtype=np.uint8), [out], [2]); out
    array([2, 3], dtype=uint8)
    """
    for (off, n), part in zip(v.pack_plan(src, "src", dsts, "dsts", offsets), dsts):
        np.copyto(part, src[off:off + n])
