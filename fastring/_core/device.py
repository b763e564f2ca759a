"""Device (CUDA) tensors: detection, zero-copy views, and the per-runtime GPU resources.

A tensor in GPU memory (torch.cuda, CuPy, a Numba device array, anything exporting
``__cuda_array_interface__`` or a CUDA DLPack device) is viewed zero-copy as a Numba device
array, and an event is recorded on the producer's stream (torch's / CuPy's current stream,
the array's stream); its output is allocated by the caller's framework on the same device.
One process reduces the tensors of one GPU (Horovod's model); a tensor on another GPU of
the same process is refused at call time. ``numba.cuda``, torch and CuPy are imported only
when a device tensor shows up, so fastring imports on machines without CUDA.
"""
from __future__ import annotations

import ctypes
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import cuda_aware_setting
from .dtypes import BFLOAT16, DtypeSpec, spec_of
from .residuals import Residuals
from .work import Entry

_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13  # DLPack device types in GPU memory
U8, U16 = np.dtype(np.uint8), np.dtype(np.uint16)


# ================================================================ detection

def is_device_tensor(tensor: Any) -> bool:
    """True for a tensor that lives in GPU memory (torch.cuda, CuPy, Numba device arrays,
    ``__cuda_array_interface__`` exporters, DLPack tensors on a CUDA device).

    Cheap for host tensors: the api asks it on every allreduce.

    Example:
        >>> import numpy as np
        >>> is_device_tensor(np.ones(3))
        False
        >>> from numba import cuda                     # doctest: +SKIP
        >>> is_device_tensor(cuda.to_device(np.ones(3)))  # doctest: +SKIP
        True
    """
    if type(tensor) is np.ndarray:
        return False
    is_cuda = getattr(tensor, "is_cuda", None)  # torch
    if is_cuda is not None:
        return bool(is_cuda)
    if getattr(tensor, "__cuda_ndarray__", False) or hasattr(tensor, "__cuda_array_interface__"):
        return True
    dlpack_device = getattr(tensor, "__dlpack_device__", None)
    if dlpack_device is None:
        return False
    try:
        return int(dlpack_device()[0]) in (_KDL_CUDA, _KDL_CUDA_MANAGED)
    except Exception:  # noqa: BLE001 - an exporter that cannot say is not a device tensor
        return False


def cuda_aware_mpi() -> bool:
    """Whether MPI may be handed device pointers: ``FASTRING_CUDA_AWARE_MPI`` (1/0) if set,
    else MPICH's / Open MPI's ``MPIX_Query_cuda_support()``, else False.

    Example:
        >>> isinstance(cuda_aware_mpi(), bool)
        True
    """
    setting = cuda_aware_setting()
    if setting is not None:
        return setting
    try:
        from mpi4py import MPI

        query = ctypes.CDLL(MPI.__file__).MPIX_Query_cuda_support  # resolved in libmpi
    except (OSError, AttributeError):
        return False
    query.restype = ctypes.c_int
    return bool(query())


# ================================================================ device arrays

def numba_cuda():
    from numba import cuda

    return cuda


def simulated() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def _from_interface(obj: Any, sync: bool) -> Any:
    """A Numba device array viewing `obj`'s ``__cuda_array_interface__`` memory. In the
    simulator, where device memory is host memory, a simulated array over the same bytes."""
    cuda = numba_cuda()
    if not simulated():
        return cuda.as_cuda_array(obj, sync=sync)
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    cai = obj.__cuda_array_interface__
    dtype, shape = np.dtype(cai["typestr"]), tuple(cai["shape"])
    count = math.prod(shape)
    c_strides = tuple(int(np.prod(shape[k + 1:])) * dtype.itemsize for k in range(len(shape)))
    if cai.get("strides") not in (None, c_strides) and count > 1:
        raise ValueError("the simulator maps only C-contiguous __cuda_array_interface__ arrays")
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(cai["data"][0]) if count else b""
    return FakeCUDAArray(np.frombuffer(raw, dtype, count).reshape(shape) if count
                         else np.empty(shape, dtype))


def to_device(host: np.ndarray, stream: Any = 0) -> Any:
    """`host` copied into a new device array of its dtype and shape. bfloat16 travels as its
    uint16 bits: numba-cuda copies through the buffer protocol, which has no bfloat16 format.

    Example:
        >>> to_device(np.ones(3, BFLOAT16)).dtype == BFLOAT16     # doctest: +SKIP
        True
    """
    host = np.ascontiguousarray(host)
    if host.dtype == BFLOAT16:
        return numba_cuda().to_device(host.view(U16), stream=stream).view(BFLOAT16)
    return numba_cuda().to_device(host, stream=stream)


def to_host(arr: Any) -> np.ndarray:
    """A device array copied into a new NumPy array (bfloat16 too: see `to_device`).

    Example:
        >>> to_host(to_device(np.arange(3.0)))                     # doctest: +SKIP
        array([0., 1., 2.])
    """
    if arr.dtype == BFLOAT16:
        return arr.view(U16).copy_to_host().view(BFLOAT16)
    return arr.copy_to_host()


def current_device() -> int:
    """The GPU of this thread's CUDA context (the simulator has one, 0)."""
    return 0 if simulated() else numba_cuda().get_current_device().id


def new_event() -> Any:
    """A CUDA event without timing (the simulator's take no arguments)."""
    cuda = numba_cuda()
    return cuda.event() if simulated() else cuda.event(timing=False)


def device_address(arr: Any) -> int:
    """The device pointer of a (Numba or simulated) device array."""
    cai = getattr(arr, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0] or 0)
    return int(arr._ary.__array_interface__["data"][0])  # simulator: device memory is host memory


def _contiguous(arr: Any) -> bool:
    return arr.size <= 1 or bool(arr.is_c_contiguous())


def flat_view(arr: Any, spec: DtypeSpec, what: str) -> Any:
    """`arr` (a Numba device array) as a 1-D view in the kernels' storage dtype."""
    if not _contiguous(arr):
        raise ValueError(f"{what} must be C-contiguous on the device (copy it first)")
    flat = arr.reshape(arr.size)
    return flat.view(U16) if spec.dtype == BFLOAT16 else flat


# ---------------------------------------------------------------- framework adapters

class _Adapter:
    """How one kind of device tensor is viewed, allocated, and waited for."""

    def contiguous(self, t: Any) -> Any:
        return t

    def device_id(self, t: Any) -> int:
        return current_device()

    def view(self, t: Any) -> tuple[Any, DtypeSpec]:
        """(Numba device array of `t`, zero copy; its DtypeSpec)."""
        arr = t if getattr(t, "__cuda_ndarray__", False) else _from_interface(t, sync=True)
        return arr, spec_of(arr.dtype)

    def empty_like(self, t: Any, shape: tuple, spec: DtypeSpec, device: int) -> Any:
        """A new array of `t`'s framework, `shape` and dtype, on `device`."""
        return numba_cuda().device_array(shape, spec.dtype)

    def ready(self, t: Any) -> Any:
        """An event on the producer's stream (None: nothing to wait for; a foreign
        ``__cuda_array_interface__`` export was synchronized when it was viewed)."""
        if not getattr(t, "__cuda_ndarray__", False):
            return None
        event = new_event()
        event.record(t.stream or 0)
        return event


class _Torch(_Adapter):
    def contiguous(self, t):
        return t if t.is_contiguous() else t.contiguous()

    def device_id(self, t):
        return t.device.index if t.device.index is not None else 0

    def view(self, t):
        import torch

        t = t.detach()
        if t.dtype == torch.bfloat16:  # the interface has no bfloat16: move the bits as int16
            return _from_interface(t.view(torch.int16), sync=False), spec_of(BFLOAT16)
        arr = _from_interface(t, sync=False)
        return arr, spec_of(arr.dtype)

    def empty_like(self, t, shape, spec, device):
        import torch

        return torch.empty(shape, dtype=t.dtype, device=t.device)

    def ready(self, t):
        import torch

        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(t.device))
        return event


class _CuPy(_Adapter):
    def contiguous(self, t):
        import cupy

        return t if t.flags.c_contiguous else cupy.ascontiguousarray(t)

    def device_id(self, t):
        return t.device.id

    def view(self, t):
        arr = _from_interface(t, sync=False)
        return arr, spec_of(arr.dtype)

    def empty_like(self, t, shape, spec, device):
        import cupy

        with cupy.cuda.Device(device):
            return cupy.empty(shape, t.dtype)

    def ready(self, t):
        import cupy

        return cupy.cuda.get_current_stream().record()


_ADAPTERS = {"torch": _Torch(), "cupy": _CuPy()}
NUMBA_ADAPTER = _Adapter()


def adapter_of(t: Any) -> _Adapter:
    return _ADAPTERS.get(type(t).__module__.partition(".")[0], NUMBA_ADAPTER)


def import_dlpack(t: Any) -> Any:
    """A DLPack-only CUDA tensor (e.g. a JAX array) as a CuPy array or torch tensor."""
    try:
        import cupy

        return cupy.from_dlpack(t)
    except ImportError:
        pass
    try:
        import torch

        return torch.from_dlpack(t)
    except ImportError:
        raise TypeError(f"a CUDA tensor of type {type(t).__name__} exports only DLPack; install "
                        "CuPy (pip install 'fastring[cuda]') or torch to reduce it") from None


def export_like(template: Any, result: Any) -> Any:
    """`result` (CuPy/torch) as the framework type of a DLPack-only `template`."""
    import sys

    fw = sys.modules.get(type(template).__module__.partition(".")[0])
    from_dlpack = getattr(fw, "from_dlpack", None) or getattr(getattr(fw, "numpy", None), "from_dlpack", None)
    return from_dlpack(result) if from_dlpack is not None else result


# ================================================================ requests

@dataclass(eq=False, slots=True)
class DeviceEntry(Entry):
    """An Entry whose `src` / `work` are 1-D Numba device arrays (storage dtype: bfloat16 as
    uint16); `ready` is the producer's event, waited for before `src` is read."""
    ready: Any = None


class DeviceState:
    """Per-runtime device resources: the GPU, streams, fusion and staging buffers."""

    def __init__(self) -> None:
        self.device: int | None = None
        self.lock = threading.Lock()
        self.streams: tuple | None = None
        self.buffers: dict[str, Any] = {}
        self.residuals = Residuals()  # error feedback by tensor name, on the device
        self.aware: bool | None = None

    def claim(self, device: int) -> None:
        with self.lock:
            if self.device is None:
                self.device = device
        if device != self.device:
            raise ValueError(f"fastring reduces the device tensors of one GPU per process; this "
                             f"rank uses cuda:{self.device}, got a tensor on cuda:{device}")

    def buffer(self, name: str, nbytes: int, pinned: bool = False) -> Any:
        """A reusable uint8 buffer of at least `nbytes` on the device (pinned host: `pinned`)."""
        buf = self.buffers.get(name)
        if buf is None or buf.size < nbytes:
            size = max(nbytes, 2 * (buf.size if buf is not None else 0), 4096)
            cuda = numba_cuda()
            buf = cuda.pinned_array(size, U8) if pinned else cuda.device_array(size, U8)
            self.buffers[name] = buf
        return buf[:nbytes]


_STATES: "weakref.WeakKeyDictionary[Any, DeviceState]" = weakref.WeakKeyDictionary()


def state_of(rt: Any) -> DeviceState:
    """The device resources of runtime `rt`."""
    state = _STATES.get(rt)
    if state is None:
        state = _STATES.setdefault(rt, DeviceState())
    return state


def on_device(device: int) -> Any:
    """Make `device`'s (primary) context current on this thread for the `with` block."""
    import contextlib

    return contextlib.nullcontext() if simulated() else numba_cuda().gpus[device]


