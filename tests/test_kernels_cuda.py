"""CUDA kernels (fastring.kernels.cuda) against NumPy references.

Runs on a GPU or under the CUDA simulator (the test command sets
NUMBA_ENABLE_CUDASIM=1); the whole module is skipped when neither is available.
The cases are kernel_cases.KernelContract's, shared with the CPU tests; under the
simulator lengths above 1000 shrink to 4099 except in the explicit 1e5 tests.
"""
import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda")
from numba import config  # noqa: E402

if not (config.ENABLE_CUDASIM or cuda.is_available()):
    pytest.skip("numba.cuda has no GPU (set NUMBA_ENABLE_CUDASIM=1 for the simulator)",
                allow_module_level=True)

from fastring._core import device  # noqa: E402
from fastring.kernels import KernelOp, cuda_kernels  # noqa: E402

try:  # noqa: E402
    from kernel_cases import (BF16, Backend, KernelContract, assert_same, operands,
                              reference_accumulate, reference_encode, reference_reduce)
except ImportError:  # collected with --import-mode=importlib from the repository root
    from tests.kernel_cases import (BF16, Backend, KernelContract, assert_same, operands,
                                    reference_accumulate, reference_encode, reference_reduce)

pytestmark = [
    pytest.mark.cuda,
    # The simulator evaluates kernels with NumPy scalars, which warn where the
    # compiled kernel silently wraps (integer SUM/PRODUCT) or makes inf/NaN.
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

kc = cuda_kernels()


class DeviceBackend(Backend):
    name = "cuda"
    max_length = 1000 if config.ENABLE_CUDASIM else None

    def put(self, host):
        return device.to_device(host)

    def get(self, arr):
        return device.to_host(arr)

    def empty(self, n, dtype):
        return device.to_device(np.zeros(n, dtype))


class TestCudaKernels(KernelContract):
    backend = DeviceBackend(kc)


def test_host_arrays_are_refused():
    with pytest.raises(TypeError, match="device array"):
        kc.reduce_into(np.zeros(3, np.float32), cuda.to_device(np.zeros(3, np.float32)),
                       KernelOp.SUM)
    with pytest.raises(TypeError, match="device array"):
        kc.encode16(cuda.to_device(np.zeros(3, np.float32)), np.zeros(3, np.uint16), "fp16")


def test_reduce_float32_sum_1e5_on_a_stream():
    a, b = operands("float32", 10**5, seed=21)
    stream = cuda.stream()
    d = cuda.to_device(a, stream=stream)
    kc.reduce_into(d, cuda.to_device(b, stream=stream), KernelOp.SUM, stream=stream)
    stream.synchronize()
    assert_same(d.copy_to_host(), reference_reduce(a, b, KernelOp.SUM), KernelOp.SUM)


def test_accumulate_bf16_1e5():
    acc = operands("float32", 10**5, seed=22)[0]
    recv = reference_encode(operands("float32", 10**5, seed=23)[0], "bf16")
    want_acc, want_send = reference_accumulate(acc, recv, "bf16", KernelOp.SUM)
    d_acc, send = cuda.to_device(acc), cuda.device_array(10**5, np.uint16)
    kc.accumulate16(d_acc, cuda.to_device(recv), send, "bf16", KernelOp.SUM)
    assert_same(d_acc.copy_to_host(), want_acc, KernelOp.SUM)
    assert_same(send.copy_to_host().view(BF16), want_send.view(BF16), KernelOp.SUM)


def test_result_does_not_depend_on_launch_shape(monkeypatch):
    """Grid-stride loops: a single block of one warp still covers every element."""
    from fastring.kernels import cuda as kmod

    a, b = operands("float16", 777, seed=24)
    monkeypatch.setattr(kmod, "_MAX_BLOCKS", 1)
    d = cuda.to_device(a)
    kc.reduce_into(d, cuda.to_device(b), KernelOp.PRODUCT)
    assert_same(d.copy_to_host(), reference_reduce(a, b, KernelOp.PRODUCT), KernelOp.PRODUCT)


def test_zero_length_work_never_launches(monkeypatch):
    """A 0-block grid is a launch error on a GPU but not in the simulator, so check
    directly that empty inputs never reach a launch."""
    from fastring.kernels import cuda as kmod

    def no_launch(n):
        raise AssertionError(f"launch configured for {n} elements")

    monkeypatch.setattr(kmod, "_blocks", no_launch)
    f, h = cuda.to_device(np.zeros(0, np.float32)), cuda.to_device(np.zeros(0, np.uint16))
    kc.reduce_into(f, cuda.to_device(np.zeros(0, np.float32)), KernelOp.SUM)
    kc.scale_into(f, 2.0)
    kc.divide_into(f, 2)
    kc.encode16(f, h, "fp16")
    kc.decode16(h, f, "bf16")
    kc.accumulate16(f, h, h, "bf16", KernelOp.MAX)
    buf = cuda.to_device(np.zeros(4, np.uint8))
    kc.pack(buf, [cuda.to_device(np.zeros(0, np.uint8))], [4])
    kc.unpack(buf, [], [])


def test_every_function_takes_a_stream():
    stream = cuda.stream()
    x = np.array([1.5, -2.25, 3.0, 65504.0], np.float32)
    d = cuda.to_device(x, stream=stream)
    bits = cuda.device_array(4, np.uint16, stream=stream)
    kc.reduce_into(d, cuda.to_device(x, stream=stream), KernelOp.SUM, stream=stream)
    kc.scale_into(d, 0.5, stream=stream)
    kc.divide_into(d, 2, stream=stream)
    kc.encode16(d, bits, "fp16", stream=stream)
    kc.accumulate16(d, bits, None, "fp16", KernelOp.SUM, stream=stream)
    back = cuda.device_array(4, np.float32, stream=stream)
    kc.decode16(bits, back, "fp16", stream=stream)
    buf = cuda.device_array(8, np.uint8, stream=stream)
    kc.pack(buf, [bits.view(np.uint8)], [0], stream=stream)
    out = cuda.device_array(8, np.uint8, stream=stream)
    kc.unpack(buf, [out], [0], stream=stream)
    stream.synchronize()
    half = x / np.float32(2)
    np.testing.assert_array_equal(d.copy_to_host(), half + half.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(back.copy_to_host(), half.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(out.copy_to_host().view(np.uint16),
                                  half.astype(np.float16).view(np.uint16))

