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
    from kernel_cases import Backend, KernelContract, operands
except ImportError:  # collected with --import-mode=importlib from the repository root
    from tests.kernel_cases import Backend, KernelContract, operands


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
