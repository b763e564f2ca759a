"""CUDA reduction / compression kernels (``numba.cuda``), same API as cpu.py.

Arrays are numba device arrays or any object exposing ``__cuda_array_interface__``;
host NumPy arrays are refused rather than silently copied both ways.  Every
function takes an optional ``stream=`` and only enqueues work on it.

Each kernel is a grid-stride loop around a ``cuda.jit(device=True)`` compilation
of a step function from ``ops.py`` -- the very functions the CPU loops call --
built once per (operation, dtype) and kept in a dict.  Kernels use at most 256
threads per block and no warp intrinsics, so the CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) runs them unchanged.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

from numba import config, cuda

from . import _validate as v
from .ops import (WIRE_CODECS, KernelOp, WireFormat, accumulate_last_step, accumulate_step,
                  binary_op, convert_step, element_type, kernel_op, map_function, map_step,
                  reduce_step, to_i64, wire_format)

__all__ = ["reduce_into", "scale_into", "divide_into", "encode16", "decode16",
           "accumulate16", "pack", "unpack", "THREADS_PER_BLOCK"]

_SIMULATED = bool(config.ENABLE_CUDASIM)
# The simulator runs each thread of a block as a Python thread and blocks one after
# another, so a small block and a short grid keep its overhead down; grid-stride
# loops make the result independent of the launch shape.
THREADS_PER_BLOCK = 32 if _SIMULATED else 256
_MAX_BLOCKS = 4 if _SIMULATED else 4096
_PACK_SLOTS = 8  # buffers per pack/unpack launch (kernel args are a fixed-size tuple)


def _blocks(n: int) -> int:
    return min((n + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK, _MAX_BLOCKS)


@functools.lru_cache(maxsize=None)
def _kernel(step: Callable, arity: int):
    dstep = cuda.jit(device=True)(step)
    if arity == 2:
        @cuda.jit
        def kernel2(a, b):
            for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
                dstep(a, b, i)
        return kernel2

    @cuda.jit
    def kernel3(a, b, c):
        for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
            dstep(a, b, c, i)
    return kernel3


def _launch(kernel, stream: Any, *args: Any) -> None:
    n = args[0].shape[0]
    if n:  # a zero-block grid is a launch error
        kernel[_blocks(n), THREADS_PER_BLOCK, stream](*args)


def _device(arr: Any, name: str) -> Any:
    if getattr(arr, "__cuda_ndarray__", False):
        return arr
    if hasattr(arr, "__cuda_array_interface__"):
        return cuda.as_cuda_array(arr)
    raise TypeError(f"{name} must be a CUDA device array (or expose "
                    f"__cuda_array_interface__), got {type(arr).__name__}")


def _cached(table: dict, key: tuple, build: Callable[[], Any]) -> Any:
    try:
        return table[key]
    except KeyError:
        pass
    except TypeError:  # unhashable argument: build() raises the real error
        return build()
    entry = table[key] = build()
    return entry


_REDUCE: dict = {}
_SCALE: dict = {}
_DIVIDE: dict = {}
_CONVERT: dict = {}
_ACCUMULATE: dict = {}


def _viewed(arr: Any, et, dtype: Any) -> Any:
    if dtype is not None or et.stored_as_bits:
        return arr.view(et.storage)
    return arr


def reduce_into(dst: Any, src: Any, op: KernelOp | int, *, dtype: Any = None,
                stream: Any = 0) -> None:
    """In place ``dst[:] = dst op src`` on the device; semantics as cpu.reduce_into.

    >>> d = cuda.to_device(np.ones(4, np.float32))  # doctest: +SKIP
    >>> reduce_into(d, cuda.to_device(np.ones(4, np.float32)), KernelOp.SUM)  # doctest: +SKIP
    """
    dst, src = _device(dst, "dst"), _device(src, "src")

    def build():
        kop, et = v.resolve_reduce(op, dst, dtype)
        return _kernel(reduce_step(binary_op(kop, et), et.load, et.store), 2), et

    kernel, et = _cached(_REDUCE, (op, dst.dtype, dtype), build)
    v.check_pair(dst, src, dtype)
    _launch(kernel, stream, _viewed(dst, et, dtype), _viewed(src, et, dtype))


def _map_into(table: dict, what: str, dst: Any, param: Any, dtype: Any, stream: Any) -> None:
    dst = _device(dst, "dst")

    def build():
        et = v.resolve_scalar_target(dst, dtype, what)
        fn, cast = map_function("scale" if what == "scale_into" else "divide", et)
        return _kernel(map_step(fn, cast, et.load, et.store), 2), et, int if cast is to_i64 else float

    kernel, et, conv = _cached(table, (dst.dtype, dtype), build)
    v.check_vector(dst, "dst", writable=True)
    _launch(kernel, stream, _viewed(dst, et, dtype), conv(param))


def scale_into(dst: Any, factor: float, *, dtype: Any = None, stream: Any = 0) -> None:
    """In place ``dst *= factor`` on the device; semantics as cpu.scale_into.

    >>> scale_into(d_grad, 0.5, stream=s)  # doctest: +SKIP
    """
    _map_into(_SCALE, "scale_into", dst, float(factor), dtype, stream)


def divide_into(dst: Any, divisor: int, *, dtype: Any = None, stream: Any = 0) -> None:
    """In place division by a non-zero integer (Average); semantics as cpu.divide_into.

    >>> divide_into(d_grad, world_size)  # doctest: +SKIP
    """
    _map_into(_DIVIDE, "divide_into", dst, v.check_divisor(divisor), dtype, stream)


def _as_u16(arr: Any, fmt: WireFormat, name: str) -> Any:
    return arr if v.wire_storage(arr, fmt, name) == v.U16 else arr.view(v.U16)


def _convert(float_arr: Any, bits_arr: Any, wire: Any, encode: bool, stream: Any) -> None:
    fname, bname = ("src", "dst") if encode else ("dst", "src")
    float_arr, bits_arr = _device(float_arr, fname), _device(bits_arr, bname)

    def build():
        fmt = wire_format(wire)
        v.float_storage(float_arr, fname)
        widen, narrow = WIRE_CODECS[fmt]
        return _kernel(convert_step(narrow if encode else widen), 2), fmt

    kernel, fmt = _cached(_CONVERT, (wire, float_arr.dtype, encode), build)
    bits = _as_u16(bits_arr, fmt, bname)
    v.check_vector(float_arr, fname)
    v.check_vector(bits_arr, bname)
    v.check_same_length(float_arr, fname, bits_arr, bname)
    if encode:
        _launch(kernel, stream, bits, float_arr)
    else:
        _launch(kernel, stream, float_arr, bits)


def encode16(src: Any, dst: Any, wire: WireFormat | str, *, stream: Any = 0) -> None:
    """float32/float64 -> 16-bit ``wire`` bits on the device; as cpu.encode16.

    >>> encode16(d_f32, d_u16, "bf16")  # doctest: +SKIP
    """
    _convert(src, dst, wire, True, stream)


def decode16(src: Any, dst: Any, wire: WireFormat | str, *, stream: Any = 0) -> None:
    """16-bit ``wire`` bits -> float32/float64 on the device; as cpu.decode16.

    >>> decode16(d_u16, d_f32, "fp16")  # doctest: +SKIP
    """
    _convert(dst, src, wire, False, stream)


def accumulate16(acc: Any, recv: Any, send: Optional[Any] = None,
                 wire: WireFormat | str = WireFormat.FP16, op: KernelOp | int = KernelOp.SUM,
                 *, stream: Any = 0) -> None:
    """Fused ``acc = acc op decode(recv)``; ``send = encode(acc)`` unless send is None.

    Same semantics as cpu.accumulate16, one kernel launch.

    >>> accumulate16(d_acc, d_recv, d_send, "bf16", KernelOp.SUM, stream=s)  # doctest: +SKIP
    """
    acc, recv = _device(acc, "acc"), _device(recv, "recv")
    with_send = send is not None
    if with_send:
        send = _device(send, "send")

    def build():
        fmt, kop = wire_format(wire), kernel_op(op)
        fn = binary_op(kop, element_type(v.float_storage(acc, "acc")))
        widen, narrow = WIRE_CODECS[fmt]
        if with_send:
            return _kernel(accumulate_step(fn, widen, narrow), 3), fmt
        return _kernel(accumulate_last_step(fn, widen), 2), fmt

    kernel, fmt = _cached(_ACCUMULATE, (wire, op, acc.dtype, with_send), build)
    args = [acc, _as_u16(recv, fmt, "recv")]
    v.check_vector(acc, "acc", writable=True)
    v.check_vector(recv, "recv")
    v.check_same_length(acc, "acc", recv, "recv")
    if with_send:
        args.append(_as_u16(send, fmt, "send"))
        v.check_vector(send, "send")
        v.check_same_length(acc, "acc", send, "send")
    _launch(kernel, stream, *args)


# ----------------------------------------------------------------- pack/unpack

@functools.lru_cache(maxsize=None)
def _copy_kernels():
    # One launch moves up to _PACK_SLOTS buffers: blockIdx.y picks the buffer from a
    # fixed-size tuple (Numba cannot take an array of device pointers), the x
    # dimension grid-strides over its bytes.
    @cuda.jit
    def gather(buf, parts, offsets):
        j = cuda.blockIdx.y
        part = parts[j]
        base = offsets[j]
        start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        for i in range(start, part.shape[0], cuda.blockDim.x * cuda.gridDim.x):
            buf[base + i] = part[i]

    @cuda.jit
    def scatter(buf, parts, offsets):
        j = cuda.blockIdx.y
        part = parts[j]
        base = offsets[j]
        start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        for i in range(start, part.shape[0], cuda.blockDim.x * cuda.gridDim.x):
            part[i] = buf[base + i]

    return gather, scatter


def _copy_batches(kernel, buf: Any, parts: list, plan: list, stream: Any) -> None:
    work = [(part, off, n) for part, (off, n) in zip(parts, plan) if n]
    for k in range(0, len(work), _PACK_SLOTS):
        batch = work[k:k + _PACK_SLOTS]
        used = len(batch)
        # Pad with repeats of the first buffer so the tuple type (and the compiled
        # kernel) stays the same; padded slots are beyond gridDim.y and never run.
        batch = batch + [batch[0]] * (_PACK_SLOTS - used)
        arrays = tuple(part for part, _, _ in batch)
        offsets = tuple(off for _, off, _ in batch)
        longest = max(n for _, _, n in batch)
        kernel[(_blocks(longest), used), THREADS_PER_BLOCK, stream](buf, arrays, offsets)


def pack(dst: Any, srcs: Sequence[Any], offsets: Sequence[int], *, stream: Any = 0) -> None:
    """Copy uint8 device arrays ``srcs[k]`` into ``dst`` at byte ``offsets[k]``.

    One kernel launch per up to 8 non-empty buffers.

    >>> pack(d_fusion, [d_a.view(np.uint8), d_b.view(np.uint8)], [0, 4096])  # doctest: +SKIP
    """
    dst = _device(dst, "dst")
    srcs = [_device(s, f"srcs[{k}]") for k, s in enumerate(srcs)]
    plan = v.pack_plan(dst, "dst", srcs, "srcs", offsets)
    _copy_batches(_copy_kernels()[0], dst, srcs, plan, stream)


def unpack(src: Any, dsts: Sequence[Any], offsets: Sequence[int], *, stream: Any = 0) -> None:
    """Copy byte ranges of ``src`` at ``offsets[k]`` into uint8 device arrays ``dsts[k]``.

    >>> unpack(d_fusion, [d_a.view(np.uint8), d_b.view(np.uint8)], [0, 4096])  # doctest: +SKIP
    """
    src = _device(src, "src")
    dsts = [_device(d, f"dsts[{k}]") for k, d in enumerate(dsts)]
    plan = v.pack_plan(src, "src", dsts, "dsts", offsets)
    _copy_batches(_copy_kernels()[1], src, dsts, plan, stream)
