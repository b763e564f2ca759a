"""Device (CUDA) tensors: allreduce on N ranks in Numba's CUDA simulator (or on a GPU), the
CUDA-aware-MPI path, join, detection, local errors, and, on a real GPU only, torch.cuda and
CuPy tensors.

Run under NUMBA_ENABLE_CUDASIM=1 (the README's test command sets it): simulated device arrays
are NumPy arrays behind Numba's device-array API, so everything but real streams, copies and
pinned memory is exercised here.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import fastring
from fastring import Compression
from fastring._core import device

cuda = pytest.importorskip("numba.cuda")
from numba import config  # noqa: E402

SIMULATED = bool(config.ENABLE_CUDASIM)
REAL_GPU = not SIMULATED and cuda.is_available()
needs_device = pytest.mark.skipif(not (SIMULATED or REAL_GPU),
                                  reason="no GPU (set NUMBA_ENABLE_CUDASIM=1 for the simulator)")
needs_gpu = pytest.mark.skipif(not REAL_GPU, reason="needs a real NVIDIA GPU (not the simulator)")
# A real device pointer handed to an MPI built without CUDA support is dereferenced on the host
# and crashes the rank; in the simulator a device array is host memory, so any MPI takes it.
needs_cuda_aware_mpi = pytest.mark.skipif(
    not (SIMULATED or (REAL_GPU and device.cuda_aware_mpi())),
    reason="MPI reports no CUDA support (MPIX_Query_cuda_support) and no simulator")

pytestmark = [pytest.mark.cuda,
              # the simulator computes kernels with NumPy scalars, which warn where the GPU wraps
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]


# ------------------------------------------------------------------ multi-rank

@needs_device
@pytest.mark.parametrize("n", [1, 2, 3])
def test_allreduce_staged_through_host(mpirun, n):
    """Every op x float32/float16/int32 x lengths 0, 1, N+1, uneven; fused async batches,
    grouped, scales, out=, 0-d, bfloat16, compression (+ error feedback) bitwise equal to the
    host's, a foreign __cuda_array_interface__ array, a device/host mismatch."""
    mpirun(n, "device_allreduce", "staged")


@needs_cuda_aware_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_cuda_aware_mpi(mpirun, n):
    """Device pointers handed to MPI (FASTRING_CUDA_AWARE_MPI=1)."""
    mpirun(n, "device_allreduce", "aware", "quick")


@needs_device
@pytest.mark.parametrize("n", [2, 3])
def test_join_contributes_zeros_on_the_device_ring(mpirun, n):
    mpirun(n, "device_join")


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2])
def test_torch_cuda_and_cupy_tensors(mpirun, n):
    """torch.cuda (and CuPy, when installed) tensors, all ranks on the one GPU."""
    pytest.importorskip("torch")
    mpirun(n, "device_frameworks")


# ------------------------------------------------------------------ detection

class _CudaInterface:
    """An object exporting only __cuda_array_interface__ (never dereferenced here)."""
    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}


class _DLPackOn:
    def __init__(self, device_type):
        self.device_type = device_type

    def __dlpack__(self, stream=None):
        raise BufferError("not needed for detection")

    def __dlpack_device__(self):
        return (self.device_type, 0)


@pytest.mark.parametrize("tensor, expected", [
    (np.ones(3), False), (np.float32(1.0), False), (bytearray(b"ab"), False), (3.0, False),
    (_CudaInterface(), True), (_DLPackOn(2), True), (_DLPackOn(13), True), (_DLPackOn(1), False),
])
def test_is_device_tensor(tensor, expected):
    assert device.is_device_tensor(tensor) is expected


def test_torch_cpu_tensor_is_not_a_device_tensor():
    torch = pytest.importorskip("torch")
    assert device.is_device_tensor(torch.ones(2)) is False
    assert device.is_device_tensor(torch.ones(2, dtype=torch.bfloat16)) is False


@needs_device
def test_device_arrays_are_device_tensors():
    assert device.is_device_tensor(cuda.to_device(np.ones(3))) is True
    assert device.is_device_tensor(cuda.device_array(0, np.float32)) is True


def test_cuda_aware_mpi_setting(monkeypatch):
    monkeypatch.setenv("FASTRING_CUDA_AWARE_MPI", "1")
    assert device.cuda_aware_mpi() is True
    monkeypatch.setenv("FASTRING_CUDA_AWARE_MPI", "0")
    assert device.cuda_aware_mpi() is False
    monkeypatch.setenv("FASTRING_CUDA_AWARE_MPI", "maybe")
    with pytest.raises(ValueError, match="FASTRING_CUDA_AWARE_MPI"):
        device.cuda_aware_mpi()
    monkeypatch.delenv("FASTRING_CUDA_AWARE_MPI")
    assert isinstance(device.cuda_aware_mpi(), bool)  # MPIX_Query_cuda_support, or False


def test_import_and_host_allreduce_never_touch_numba_cuda():
    code = ("import sys, numpy as np, fastring; fastring.init(); "
            "assert fastring.allreduce(np.ones(2), op=fastring.Sum).tolist() == [1.0, 1.0]; "
            "assert 'numba.cuda' not in sys.modules, 'numba.cuda imported'; "
            "assert 'cupy' not in sys.modules")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------ local errors (one rank)

@pytest.fixture
def initialized():
    fastring.init()
    yield


@needs_device
def test_one_rank_result_is_a_new_device_array(initialized):
    x = cuda.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))
    got = fastring.allreduce(x, op=fastring.Average, postscale_factor=2.0)
    assert getattr(got, "__cuda_ndarray__", False) and got is not x
    assert got.shape == (2, 3) and got.dtype == np.float32
    np.testing.assert_array_equal(got.copy_to_host(), np.arange(6, dtype=np.float32).reshape(2, 3) * 2)
    np.testing.assert_array_equal(x.copy_to_host(), np.arange(6, dtype=np.float32).reshape(2, 3))


@needs_device
def test_local_argument_errors(initialized):
    d = cuda.to_device(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="mix device and host"):
        fastring.grouped_allreduce([d, np.ones(4, np.float32)])
    with pytest.raises(TypeError, match="share one dtype"):
        fastring.grouped_allreduce([d, cuda.to_device(np.ones(4, np.float64))])
    with pytest.raises(TypeError, match="out must be a device tensor"):
        fastring.allreduce(d, out=np.ones(4, np.float32))
    with pytest.raises(ValueError, match="shape"):
        fastring.allreduce(d, out=cuda.to_device(np.ones(5, np.float32)))
    with pytest.raises(TypeError, match="dtype"):
        fastring.allreduce(d, out=cuda.to_device(np.ones(4, np.float64)))
    strided = cuda.to_device(np.ones((4, 4), np.float32))[:, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        fastring.allreduce(strided)
    with pytest.raises(TypeError, match="Average is not defined for bool"):
        fastring.allreduce(cuda.to_device(np.ones(3, np.bool_)))
    with pytest.raises(TypeError, match="complex64"):
        fastring.allreduce(cuda.to_device(np.ones(3, np.complex64)))
    with pytest.raises(ValueError, match="give the tensor a name"):
        fastring.allreduce(d, compression=Compression.fp16_ef)
    # nothing was queued: the next allreduce runs
    assert fastring.allreduce(d, op=fastring.Sum).copy_to_host().tolist() == [1.0] * 4


def test_one_gpu_per_process():
    state = device.DeviceState()
    state.claim(0)
    state.claim(0)
    with pytest.raises(ValueError, match="one GPU per process"):
        state.claim(1)


# ------------------------------------------------------------------ real GPU only

@needs_gpu
@pytest.mark.gpu
def test_torch_cuda_result_is_a_torch_cuda_tensor(initialized):
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        t = torch.arange(10, device="cuda").to(dtype)
        got = fastring.allreduce(t, op=fastring.Sum)
        assert isinstance(got, torch.Tensor) and got.device == t.device and got.dtype == dtype
        assert torch.equal(got, t)
    t = torch.ones(3, device="cuda")
    assert fastring.allreduce(t, op=fastring.Sum, out=t) is t


@needs_gpu
@pytest.mark.gpu
def test_cupy_result_is_a_cupy_array(initialized):
    cupy = pytest.importorskip("cupy")
    x = cupy.arange(10, dtype=cupy.float32)
    got = fastring.allreduce(x, op=fastring.Sum)
    assert isinstance(got, cupy.ndarray) and bool((got == x).all())
