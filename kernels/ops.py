"""Scalar definitions shared by the CPU and CUDA kernels.

Everything element-wise is written here exactly once, as plain Python functions
registered with :func:`numba.extending.register_jitable`.  That keeps each one

* an ordinary Python callable (the CUDA simulator and debuggers run it as is),
* callable from ``@njit`` code (CPU) and from ``@cuda.jit`` code (GPU), because
  ``register_jitable`` installs a target-generic overload.

``cpu.py`` and ``cuda.py`` only add the iteration: a ``range`` loop on the CPU, a
grid-stride loop on the GPU, around the *step* functions built at the bottom of
this module.

Why ``register_jitable`` and not ``njit``-ed ops captured in a closure: Numba's
on-disk cache keys a closure by pickling its cell contents, and a pickled
``Dispatcher`` embeds a per-process UUID, so ``cache=True`` would miss on every
run and grow the cache.  A plain function pickles by reference and keys stably.

16-bit formats are handled as ``uint16`` bit patterns because Numba has no
bfloat16 type and float16 support differs between targets.  The conversions are
written with integer arithmetic on ``int64`` (Numba promotes mixed unsigned and
signed integers to float64, so staying signed avoids silent float math) and are
bit-identical to NumPy's ``astype(np.float16)`` and ml_dtypes'
``astype(bfloat16)`` for every float32 input, NaN payloads included.
"""
from __future__ import annotations

import enum
import functools
import hashlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, register_jitable

from .._core.dtypes import BFLOAT16, SUPPORTED

__all__ = ["KernelOp", "WireFormat", "ElementType", "element_type", "wire_format",
           "binary_op", "BFLOAT16"]


class KernelOp(enum.IntEnum):
    """Reduction operator codes understood by every kernel."""

    SUM = 0
    MIN = 1
    MAX = 2
    PRODUCT = 3


class WireFormat(enum.IntEnum):
    """16-bit formats used to compress float payloads on the wire."""

    FP16 = 0
    BF16 = 1


def _source_fingerprint() -> str:
    # Numba's cache only watches the mtime of the file that defines the jitted loop
    # (cpu.py); folding this file's hash into the cache key makes edits here
    # invalidate cached machine code too.
    try:
        with open(__file__, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()[:16]
    except OSError:  # pragma: no cover - e.g. zipped install: fall back to no invalidation
        return "unknown"


SOURCE_FINGERPRINT = _source_fingerprint()


# --------------------------------------------------------------------------- bit casts

@register_jitable
def bits_from_f32(x):
    """float32 (or float64, rounded to float32 first) -> its IEEE bits as int64."""
    return np.int64(np.float32(x).view(np.uint32))


@register_jitable
def f32_from_bits(bits):
    """Low 32 bits of an integer -> the float32 they encode."""
    return np.uint32(bits).view(np.float32)


# ------------------------------------------------------------------- 16-bit formats

# 0.5f: adding it to a value below 2**-14 lines the fp16 subnormal mantissa up with
# the float32 mantissa's low bits, so the FPU's own round-to-nearest-even does the
# rounding (F. Giesen's float_to_half_fast3_rtne).
_DENORM_MAGIC = np.float32(0.5)
_DENORM_MAGIC_BITS = 0x3F000000
_FP16_TINY = np.float32(2.0 ** -24)  # value of the fp16 subnormal ulp; exact in float32


# The two fp16 conversions compute every candidate and pick one with conditional
# expressions instead of early returns, so LLVM emits selects: the CPU loops that
# call them vectorise and GPU threads do not diverge on special values.

@register_jitable
def fp16_to_f32(h):
    """fp16 bit pattern -> float32 value (exact; NaN payload kept like NumPy)."""
    u = np.int64(h)
    sign = (u & 0x8000) << 16
    exp = u & 0x7C00
    rest = (u & 0x7FFF) << 13
    normal = rest + 0x38000000       # rebias exponent 15 -> 127
    inf_nan = rest + 0x70000000      # max out the float32 exponent, keep the payload
    subnormal = bits_from_f32(np.float32(u & 0x3FF) * _FP16_TINY)  # m * 2**-24, exact
    bits = inf_nan if exp == 0x7C00 else normal
    bits = subnormal if exp == 0 else bits
    return f32_from_bits(bits | sign)


@register_jitable
def f32_to_fp16(x):
    """float32 (float64 via float32) -> fp16 bits, round-to-nearest-even.

    Matches NumPy bit for bit, including NaN payloads (``payload >> 13``, forced
    non-zero so a NaN never turns into inf).
    """
    u = bits_from_f32(x)
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    # Normal result: rebias the exponent, then add 0x0fff (+1 if the kept mantissa is
    # odd) so the truncating shift rounds to nearest, ties to even; a carry correctly
    # bumps the exponent, up to inf for [65520, 65536).
    normal = (a - 0x38000000 + 0x0FFF + ((a >> 13) & 1)) >> 13
    # Below 2**-14 the result is subnormal or zero: let the float adder round.
    subnormal = bits_from_f32(f32_from_bits(a) + _DENORM_MAGIC) - _DENORM_MAGIC_BITS
    payload = (a & 0x7FFFFF) >> 13
    nan = 0x7C00 | payload | (payload == 0)
    h = subnormal if a < 0x38800000 else normal
    h = 0x7C00 if a >= 0x47800000 else h
    h = nan if a > 0x7F800000 else h
    return sign | h


# The CPU's own conversion instructions (x86 F16C, AArch64 FCVT), reached through LLVM's
# half type: several times faster than the portable versions above because they vectorise.
# They round the same way (to nearest, ties to even); only a signalling NaN comes out quieted,
# where NumPy keeps its payload bits. The host ring's wire uses them (HOST_WIRE_CODECS).

@intrinsic
def _half_bits(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


@intrinsic
def _from_half_bits(typingctx, h):
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@register_jitable
def f32_to_fp16_native(x):
    """float32 (float64 via float32) -> fp16 bits with the CPU's conversion instruction."""
    return _half_bits(np.float32(x))


@register_jitable
def fp16_to_f32_native(h):
    """fp16 bits -> float32 with the CPU's conversion instruction (exact)."""
    return _from_half_bits(np.uint16(h))


def _host_converts_fp16() -> bool:
    # Without the instructions LLVM would call a runtime helper Numba does not link.
    try:
        import platform

        import llvmlite.binding as llvm
        machine = platform.machine().lower()
        if machine in ("aarch64", "arm64"):
            return True
        return machine in ("x86_64", "amd64") and "+f16c" in llvm.get_host_cpu_features().flatten()
    except Exception:  # noqa: BLE001 - any doubt: the portable conversions
        return False


@register_jitable
def bf16_to_f32(h):
    """bfloat16 bit pattern -> float32 value (exact)."""
    return f32_from_bits(np.int64(h) << 16)


@register_jitable
def f32_to_bf16(x):
    """float32 (float64 via float32) -> bfloat16 bits, round-to-nearest-even.

    NaN becomes the canonical quiet NaN with its sign kept (0x7fc0 / 0xffc0), the
    same bits ml_dtypes produces.
    """
    u = bits_from_f32(x)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return ((u >> 16) & 0x8000) | 0x7FC0
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


@register_jitable
def identity(x):
    return x


# Integer results are int64 (Numba widens before arithmetic); these wrap them into
# the storage width explicitly.  Compiled code would truncate on the store anyway,
# but NumPy (hence the CUDA simulator) refuses out-of-range stores, and spelling
# the modular arithmetic out keeps both identical.  LLVM folds it to a truncation.

@register_jitable
def wrap_u8(x):
    return np.int64(x) & 0xFF


@register_jitable
def wrap_i8(x):
    return ((np.int64(x) + 0x80) & 0xFF) - 0x80


@register_jitable
def wrap_i16(x):
    return ((np.int64(x) + 0x8000) & 0xFFFF) - 0x8000


@register_jitable
def wrap_u16(x):
    return np.int64(x) & 0xFFFF


@register_jitable
def wrap_u32(x):
    return np.int64(x) & 0xFFFFFFFF


@register_jitable
def wrap_u64(x):
    # uint64 arithmetic stays uint64 in Numba (and wraps modulo 2**64) as long as both
    # operands are uint64; the store only pins the type.
    return np.uint64(x)


@register_jitable
def wrap_i32(x):
    return ((np.int64(x) + 0x80000000) & 0xFFFFFFFF) - 0x80000000


@register_jitable
def to_f32(x):
    return np.float32(x)


@register_jitable
def to_f64(x):
    return np.float64(x)


@register_jitable
def to_i64(x):
    return np.int64(x)


# ------------------------------------------------------------------------ reductions
# Integer results come back as int64 and are wrapped into the storage width
# (ElementType.store), which is NumPy's modular behaviour for SUM/PRODUCT.

@register_jitable
def op_sum(a, b):
    return a + b


@register_jitable
def op_product(a, b):
    return a * b


@register_jitable
def op_min(a, b):
    # `a != a` is the NaN test: NaN propagates from either side like np.minimum.
    return a if (a < b or a != a) else b


@register_jitable
def op_max(a, b):
    return a if (a > b or a != a) else b


@register_jitable
def op_or(a, b):
    return a | b


@register_jitable
def op_and(a, b):
    return a & b


_NUMERIC_OPS = {KernelOp.SUM: op_sum, KernelOp.MIN: op_min,
                KernelOp.MAX: op_max, KernelOp.PRODUCT: op_product}
# bool: SUM is "any", PRODUCT is "all"; MIN/MAX agree with and/or on {False, True}.
_BOOL_OPS = {KernelOp.SUM: op_or, KernelOp.MIN: op_and,
             KernelOp.MAX: op_or, KernelOp.PRODUCT: op_and}


# ------------------------------------------------------------------- scale / divide

@register_jitable
def mul(x, factor):
    return x * factor


@register_jitable
def true_div(x, divisor):
    return x / divisor


_TWO_63, _TWO_64, _TWO_117 = 2.0 ** 63, 2.0 ** 64, 2.0 ** 117


@register_jitable
def scale_int(x, factor):
    # The float64 product truncated toward zero and wrapped modulo 2**64, as integer
    # arithmetic wraps. A float->int conversion out of int64's range is undefined (x86
    # gives INT64_MIN, a GPU saturates), so such products are wrapped by hand, with steps
    # that are exact: beyond 2**63 a double is an integer, and from 2**117 on a multiple of
    # 2**64. Not finite (a factor beyond about 1e289): 0.
    p = np.float64(x) * factor
    if -_TWO_63 <= p < _TWO_63:
        return np.int64(p)
    a = abs(p)
    if not a < _TWO_117:
        return np.int64(0)
    r = a - np.float64(np.int64(a / _TWO_64)) * _TWO_64
    if r >= _TWO_63:
        r -= _TWO_64
    q = np.int64(r)
    return -q if p < 0 else q


@register_jitable
def trunc_div(x, divisor):
    a = np.int64(x)
    if divisor == -1:  # INT64_MIN // -1 traps on x86; negation wraps instead
        return -a
    q = a // divisor  # floor division; fix up to C-style truncation below
    if q < 0 and q * divisor != a:
        q += 1
    return q


# ------------------------------------------------------------------------ dtypes

@dataclass(frozen=True)
class ElementType:
    """How one user-visible dtype is stored and computed on by the kernels."""

    name: str
    storage: np.dtype          # dtype the kernels index (uint16 for fp16/bf16)
    load: Callable             # storage element -> compute value
    store: Callable            # compute value -> storage element
    category: str              # 'int', 'float' or 'bool'
    compute: Callable          # casts a float parameter to the arithmetic type

    @property
    def stored_as_bits(self) -> bool:
        """True when arrays must be viewed as ``storage`` (fp16 / bf16 as uint16)."""
        return self.load is not identity


_U16 = np.dtype(np.uint16)


# How the kernels load, store and compute each dtype of fastring's one dtype table
# (fastring._core.dtypes.SUPPORTED); a dtype added there must be given its entry here.
_INTEGER_WRAP = {"uint8": wrap_u8, "int8": wrap_i8, "int16": wrap_i16, "uint16": wrap_u16,
                 "int32": wrap_i32, "uint32": wrap_u32, "int64": identity, "uint64": wrap_u64}


def _element_type(spec) -> ElementType:
    if spec.name in _INTEGER_WRAP:
        return ElementType(spec.name, spec.dtype, identity, _INTEGER_WRAP[spec.name], "int", to_f64)
    if spec.name == "float16":  # arithmetic in float32, rounded once per element
        return ElementType("float16", _U16, fp16_to_f32, f32_to_fp16, "float", to_f32)
    if spec.name == "bfloat16":
        return ElementType("bfloat16", _U16, bf16_to_f32, f32_to_bf16, "float", to_f32)
    if spec.name == "float32":
        return ElementType("float32", spec.dtype, identity, identity, "float", to_f32)
    if spec.name == "float64":
        return ElementType("float64", spec.dtype, identity, identity, "float", to_f64)
    if spec.name == "bool":
        return ElementType("bool", spec.dtype, identity, identity, "bool", to_f64)
    raise TypeError(f"the kernels have no element type for dtype {spec.name}")


ELEMENT_TYPES: dict[np.dtype, ElementType] = {dt: _element_type(spec) for dt, spec in SUPPORTED.items()}
BF16_ELEMENT = ELEMENT_TYPES[BFLOAT16]
SUPPORTED_DTYPE_NAMES = tuple(spec.name for spec in SUPPORTED.values())


def element_type(dtype) -> ElementType:
    """Look up the kernel description of ``dtype``; TypeError naming it if unsupported.

    >>> element_type(np.float16).storage
    dtype('uint16')
    """
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16"):
        return BF16_ELEMENT
    try:
        key = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"unsupported dtype {dtype!r}; supported: "
                        f"{', '.join(SUPPORTED_DTYPE_NAMES)}") from None
    et = ELEMENT_TYPES.get(key)
    if et is None:
        raise TypeError(f"unsupported dtype {key.name} ({key.str}); supported: "
                        f"{', '.join(SUPPORTED_DTYPE_NAMES)}")
    return et


def kernel_op(op) -> KernelOp:
    """Normalise an op code; ValueError naming it if it is not a KernelOp.

    >>> kernel_op(0)
    <KernelOp.SUM: 0>
    """
    if isinstance(op, (bool, np.bool_)):
        raise ValueError(f"unknown reduction op {op!r}")
    try:
        return KernelOp(op)
    except (ValueError, TypeError):
        raise ValueError(f"unknown reduction op {op!r}; expected one of "
                         f"{', '.join(f'KernelOp.{m.name}' for m in KernelOp)}") from None


_WIRE_NAMES = {"fp16": WireFormat.FP16, "float16": WireFormat.FP16,
               "bf16": WireFormat.BF16, "bfloat16": WireFormat.BF16}
WIRE_CODECS = {WireFormat.FP16: (fp16_to_f32, f32_to_fp16),
               WireFormat.BF16: (bf16_to_f32, f32_to_bf16)}
# (widen, narrow) for the host ring's cfuncs: the CPU's fp16 instructions where it has them.
HOST_WIRE_CODECS = dict(WIRE_CODECS)
if _host_converts_fp16():
    HOST_WIRE_CODECS[WireFormat.FP16] = (fp16_to_f32_native, f32_to_fp16_native)


def wire_format(wire) -> WireFormat:
    """'fp16' / 'bf16' / WireFormat -> WireFormat; ValueError otherwise.

    >>> wire_format("bf16")
    <WireFormat.BF16: 1>
    """
    if isinstance(wire, str):
        fmt = _WIRE_NAMES.get(wire.lower())
        if fmt is not None:
            return fmt
    elif isinstance(wire, (int, np.integer)) and not isinstance(wire, (bool, np.bool_)):
        try:
            return WireFormat(wire)
        except ValueError:
            pass
    raise ValueError(f"unknown wire format {wire!r}; expected 'fp16' or 'bf16'")


def binary_op(op: KernelOp, et: ElementType) -> Callable:
    """The scalar function implementing ``op`` on values of ``et``."""
    return (_BOOL_OPS if et.category == "bool" else _NUMERIC_OPS)[op]


def map_function(kind: str, et: ElementType) -> tuple[Callable, Callable]:
    """(fn, parameter cast) for ``kind`` 'scale' or 'divide' on values of ``et``.

    The cast is ``to_i64`` exactly when the parameter must be passed as an integer.
    """
    if et.category == "int":
        return (scale_int, to_f64) if kind == "scale" else (trunc_div, to_i64)
    return (mul if kind == "scale" else true_div), et.compute


# ------------------------------------------------------------------------- steps
# A step does the work for element i; the targets supply only the loop over i.
# Memoised so each (op, codec) combination is one function object: that keeps
# Numba's cache keys and the register_jitable overload registry small.

@functools.lru_cache(maxsize=None)
def reduce_step(op: Callable, load: Callable, store: Callable) -> Callable:
    """step(dst, src, i): dst[i] = dst[i] op src[i]."""
    def step(dst, src, i):
        dst[i] = store(op(load(dst[i]), load(src[i])))
    return register_jitable(step)


@functools.lru_cache(maxsize=None)
def reduce_after_step(op: Callable, load: Callable, store: Callable) -> Callable:
    """step(dst, src, i): dst[i] = src[i] op dst[i], reduce_step with the operands' order
    turned round."""
    def step(dst, src, i):
        dst[i] = store(op(load(src[i]), load(dst[i])))
    return register_jitable(step)


@functools.lru_cache(maxsize=None)
def map_step(fn: Callable, cast: Callable, load: Callable, store: Callable) -> Callable:
    """step(dst, param, i): dst[i] = fn(dst[i], cast(param)) -- scale and divide."""
    def step(dst, param, i):
        dst[i] = store(fn(load(dst[i]), cast(param)))
    return register_jitable(step)


@functools.lru_cache(maxsize=None)
def convert_step(conv: Callable) -> Callable:
    """step(dst, src, i): dst[i] = conv(src[i]) -- encode16 / decode16."""
    def step(dst, src, i):
        dst[i] = conv(src[i])
    return register_jitable(step)


@functools.lru_cache(maxsize=None)
def wire_steps(op: Callable, widen: Callable, narrow: Callable,
               compute: Callable) -> dict[str, Callable]:
    """The element steps of the host ring on a 16-bit wire, by name, all with the signature
    step(bits, src, recv, dst, i, mul, div, post); each ignores what it does not need.

    This rank's input enters as ``x = src[i] * mul / div`` in the compute precision, the
    same bits as scale_into(mul) then divide_into(div) (each skipped when 1).
    encode: bits = narrow(x) -- the first chunk a rank sends;
    hop:    bits = narrow(x op widen(recv)) -- combine a partial result and pass it on;
    last:   bits = narrow((x op widen(recv)) * post); dst = widen(bits) -- the owner keeps
            exactly what every other rank will decode;
    decode: dst = widen(recv) -- the allgather.
    """
    def scaled(src, i, mul, div):
        x = src[i]
        if mul != 1.0:
            x = x * compute(mul)
        if div != 1.0:
            x = x / compute(div)
        return x

    def encode(bits, src, recv, dst, i, mul, div, post):
        bits[i] = narrow(scaled(src, i, mul, div))

    def hop(bits, src, recv, dst, i, mul, div, post):
        bits[i] = narrow(op(scaled(src, i, mul, div), widen(recv[i])))

    def last(bits, src, recv, dst, i, mul, div, post):
        value = op(scaled(src, i, mul, div), widen(recv[i]))
        if post != 1.0:
            value = value * compute(post)
        h = narrow(value)
        bits[i] = h
        dst[i] = widen(h)

    def decode(bits, src, recv, dst, i, mul, div, post):
        dst[i] = widen(recv[i])

    register_jitable(scaled)
    return {f.__name__: register_jitable(f) for f in (encode, hop, last, decode)}


@functools.lru_cache(maxsize=None)
def accumulate_step(op: Callable, widen: Callable, narrow: Callable) -> Callable:
    """step(acc, recv, send, i): acc[i] = acc[i] op widen(recv[i]); send[i] = narrow(acc[i])."""
    def step(acc, recv, send, i):
        value = op(acc[i], widen(recv[i]))
        acc[i] = value
        # Encode what was stored, so a float64 acc and its wire copy agree.
        send[i] = narrow(acc[i])
    return register_jitable(step)


@functools.lru_cache(maxsize=None)
def accumulate_last_step(op: Callable, widen: Callable) -> Callable:
    """step(acc, recv, i): acc[i] = acc[i] op widen(recv[i]) (last hop, nothing to send)."""
    def step(acc, recv, i):
        acc[i] = op(acc[i], widen(recv[i]))
    return register_jitable(step)
