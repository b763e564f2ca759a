"""CPU kernels (fastring.kernels) against NumPy references.

The parametrised cases live in kernel_cases.KernelContract and are shared with
the CUDA tests; this module adds the checks only the CPU path has.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import fastring.kernels as kernels
from fastring.kernels import KernelOp, cpu, reduce_into

try:
    from kernel_cases import DTYPES, FLOAT_DTYPES, OPS, Backend, KernelContract, dtype_of, operands
except ImportError:  # collected with --import-mode=importlib from the repository root
    from tests.kernel_cases import DTYPES, FLOAT_DTYPES, OPS, Backend, KernelContract, dtype_of, operands


class TestCpuKernels(KernelContract):
    backend = Backend(kernels)


def test_read_only_destination_is_value_error():
    a = np.zeros(4, np.float32)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        reduce_into(a, np.zeros(4, np.float32), KernelOp.SUM)
    with pytest.raises(ValueError, match="read-only"):
        kernels.scale_into(a, 2.0)


def test_non_array_argument_is_type_error():
    with pytest.raises(TypeError, match="array"):
        reduce_into(np.zeros(3, np.float32), [1.0, 2.0, 3.0], KernelOp.SUM)
    with pytest.raises(TypeError, match="array"):
        reduce_into([1.0], np.zeros(1, np.float32), KernelOp.SUM)


def test_one_compiled_specialisation_per_op_and_dtype():
    """Calls with other lengths or arrays reuse the cached function: no recompiles."""
    for n in (0, 3, 4096):
        a, b = operands("int32", n)
        reduce_into(a, b, KernelOp.MAX)
        reduce_into(a, b, 2)  # plain int op code hits the same entry
    fn, view = cpu._REDUCE[KernelOp.MAX, np.dtype(np.int32)]
    assert view is None
    assert len(fn.signatures) == 1
    assert sum(1 for key in cpu._REDUCE if key[1] == np.dtype(np.int32)
               and key[0] == KernelOp.MAX) == 1


def test_float16_sum_rounds_to_nearest_even_at_overflow():
    # 65504 is the largest fp16 (odd mantissa, ulp 32); 65520 is the tie with 2**16,
    # which rounds to even, i.e. to inf; anything below the tie stays finite.
    a = np.array([65504.0, 65504.0, -65504.0, 2048.0], np.float16)
    b = np.array([15.0, 16.0, -16.0, 3.0], np.float16)
    reduce_into(a, b, KernelOp.SUM)
    np.testing.assert_array_equal(a, np.array([65504.0, np.inf, -np.inf, 2052.0], np.float16))


def test_import_does_not_touch_numba_cuda():
    code = ("import sys, fastring.kernels as k; "
            "assert 'numba.cuda' not in sys.modules, 'numba.cuda imported'; "
            "assert callable(k.cuda_kernels)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


# ------------------------------------------------------------ the shared segment's reduction cfuncs
@pytest.mark.parametrize("name", DTYPES)
def test_reduce_after_is_reduce_with_the_operands_turned_round(name):
    """reduce_after_cfunc(dst=b, src=a) leaves in b the bits reduce_cfunc(dst=a, src=b) leaves
    in a, for every op, on wrapping integers and on floats with special values, among them
    zeros and NaNs of both signs against each other, where Min and Max (selects) show the
    operands' order. Where both operands of a Sum or Product are NaN, which NaN comes out is
    the compiler's to choose (it may swap an addition's operands): there, a NaN."""
    import ctypes
    call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    a, b = operands(name, 1000)
    floats = name in FLOAT_DTYPES
    if floats:
        a[:4], b[:4] = [0.0, -0.0, np.nan, -np.nan], [-0.0, 0.0, -np.nan, np.nan]

    def reduced(fn, dst, src):
        dst = dst.copy()
        call(fn)(dst.ctypes.data, src.ctypes.data, dst.size)
        return dst
    both_nan = np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64)) if floats else np.zeros(a.size, bool)
    for op in OPS:
        forward = kernels.reduce_cfunc(op, dtype_of(name))
        want, got = reduced(forward, a, b), reduced(kernels.reduce_after_cfunc(op, dtype_of(name)), b, a)
        selects = op in (KernelOp.MIN, KernelOp.MAX)
        same = (got.view(np.uint8).reshape(a.size, -1) == want.view(np.uint8).reshape(a.size, -1)).all(axis=1)
        either_nan = np.zeros(a.size, bool) if selects else both_nan & np.isnan(got.astype(np.float64))
        assert (same | either_nan).all(), (name, op)
        if floats and selects:
            assert reduced(forward, b, a).tobytes() != want.tobytes(), "the data does not show the operands' order"


# ------------------------------------------------------------ the host ring's wire cfuncs
try:
    from kernel_cases import ACC_DTYPES, OPS, WIRES, reference_decode, reference_encode, wire_inputs
except ImportError:
    from tests.kernel_cases import ACC_DTYPES, OPS, WIRES, reference_decode, reference_encode, wire_inputs

_WIRE_FN = None


def _wire_call(step, wire, op, acc, bits, src, recv, dst, mul, div, post):
    import ctypes

    global _WIRE_FN
    if _WIRE_FN is None:
        _WIRE_FN = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4, ctypes.c_int64, ctypes.c_double,
                                    ctypes.c_double, ctypes.c_double)
    fn = _WIRE_FN(kernels.wire_cfunc(step, wire, op, acc))
    fn(bits.ctypes.data, src.ctypes.data, recv.ctypes.data, dst.ctypes.data, src.size, mul, div, post)


def _same_bits_or_both_nan(got_bits, want_bits, wire):
    # The CPU's fp16 instruction quiets a signalling NaN that NumPy passes through; every
    # other value must match bit for bit.
    nan = np.isnan(reference_decode(want_bits, wire))
    np.testing.assert_array_equal(np.isnan(reference_decode(got_bits, wire)), nan)
    np.testing.assert_array_equal(got_bits[~nan], want_bits[~nan])


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("acc", ACC_DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mul, div, post", [(1.0, 1.0, 1.0), (0.5, 3.0, 2.0), (-1.5, 2.0, 1e-3)])
def test_wire_steps_match_numpy(wire, acc, op, mul, div, post):
    """Each wire step against its NumPy reference: x = src * mul / div in the compute
    precision, combined with the decoded received value, rounded once to 16 bits."""
    acc = np.dtype(acc)
    src = wire_inputs(4000, seed=1).astype(acc)
    recv = reference_encode(wire_inputs(4000, seed=2)[::-1].copy(), wire)
    fn = {KernelOp.SUM: np.add, KernelOp.MIN: np.minimum, KernelOp.MAX: np.maximum,
          KernelOp.PRODUCT: np.multiply}[op]
    with np.errstate(all="ignore"):
        x = src.copy()
        if mul != 1.0:
            x = x * acc.type(mul)
        if div != 1.0:
            x = x / acc.type(div)
        combined = fn(x, reference_decode(recv, wire, acc))
        final = combined * acc.type(post) if post != 1.0 else combined
    bits, dst = np.empty(src.size, np.uint16), np.full(src.size, 7, acc)
    _wire_call("encode", wire, op, acc, bits, src, recv, dst, mul, div, post)
    _same_bits_or_both_nan(bits, reference_encode(x, wire), wire)
    _wire_call("hop", wire, op, acc, bits, src, recv, dst, mul, div, post)
    _same_bits_or_both_nan(bits, reference_encode(combined, wire), wire)
    _wire_call("last", wire, op, acc, bits, src, recv, dst, mul, div, post)
    _same_bits_or_both_nan(bits, reference_encode(final, wire), wire)
    # the owner keeps exactly what it sends: the decode of its own bits
    _same_values_or_both_nan(dst, reference_decode(bits, wire, acc))
    dst[:] = 7
    _wire_call("decode", wire, op, acc, bits, src, recv, dst, mul, div, post)
    _same_values_or_both_nan(dst, reference_decode(recv, wire, acc))


def _same_values_or_both_nan(got, want):
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint8), want[~nan].view(np.uint8))  # -0.0 too


def test_wire_cfunc_rejects_unknown_step():
    with pytest.raises(ValueError, match="wire step"):
        kernels.wire_cfunc("squash", "fp16", KernelOp.SUM, np.float32)
