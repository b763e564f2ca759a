"""Device (CUDA) tensors: detection, allreduce requests, and their reduction on the GPU.

A tensor in GPU memory (torch.cuda, CuPy, a Numba device array, anything exporting
``__cuda_array_interface__`` or a CUDA DLPack device) is reduced on its own device:

* At request time the tensor is viewed zero-copy as a Numba device array and an event is
  recorded on the producer's stream (torch's / CuPy's current stream, the array's stream);
  the output is allocated by the caller's framework on the same device.
* ``reduce_batch`` (called by the engine for a fused batch) waits for those events, packs
  the batch into a device fusion buffer (``kernels.cuda.pack``, or the 16-bit-to-float
  conversion under compression) with the prescale / Average pre-division, and runs a ring:
  reduce-scatter whose reductions are ``kernels.cuda`` kernels on a CUDA stream, then
  allgather. When MPI is not CUDA-aware, every segment is staged through pinned host
  buffers: the device-to-host copy of the next segment (second stream) and the upload and
  reduction of the previous one overlap the exchange of the current one. A CUDA-aware MPI
  (``MPIX_Query_cuda_support`` or ``FASTRING_CUDA_AWARE_MPI=1``) is given device pointers.
* Results are bitwise identical on every rank (each chunk is finalized once by its owner
  and circulated), and -- same ring, same operands -- bitwise equal to the host ring's.

One process reduces the tensors of one GPU (Horovod's model); a tensor on another GPU of
the same process is refused at call time. ``numba.cuda``, torch and CuPy are imported only
when a device tensor shows up, so fastring imports on machines without CUDA.
"""
from __future__ import annotations

import ctypes
import math
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ._dtypes import BFLOAT16, DtypeSpec, spec_of
from ._ops import KERNEL_OP, ReduceOp
from ._transport import array_address
from .algorithms import chunk_offsets
from .compression import Compression, Compressor
from .engine import AllreduceWork, Entry, Handle, Request, _predivides

# Bytes per pipelined ring segment: large enough that a copy costs far more than its launch,
# small enough that the copies of one segment hide behind the exchange of the next.
SEGMENT_BYTES = 1 << 20
_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13  # DLPack device types in GPU memory
_U8, _U16 = np.dtype(np.uint8), np.dtype(np.uint16)
_RS_TAG, _AG_TAG = 6, 7  # MPI tags of the device ring (the host algorithms use 1-5)


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
    setting = os.environ.get("FASTRING_CUDA_AWARE_MPI", "").strip().lower()
    if setting:
        if setting not in ("0", "1", "true", "false", "yes", "no"):
            raise ValueError(f"FASTRING_CUDA_AWARE_MPI={setting!r} is not one of 1, 0")
        return setting in ("1", "true", "yes")
    try:
        from mpi4py import MPI

        query = ctypes.CDLL(MPI.__file__).MPIX_Query_cuda_support  # resolved in libmpi
    except (OSError, AttributeError):
        return False
    query.restype = ctypes.c_int
    return bool(query())


# ================================================================ device arrays

def _cuda():
    from numba import cuda

    return cuda


def _simulated() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def _from_interface(obj: Any, sync: bool) -> Any:
    """A Numba device array viewing `obj`'s ``__cuda_array_interface__`` memory. In the
    simulator, where device memory is host memory, a simulated array over the same bytes."""
    cuda = _cuda()
    if not _simulated():
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


def _current_device() -> int:
    """The GPU of this thread's CUDA context (the simulator has one, 0)."""
    return 0 if _simulated() else _cuda().get_current_device().id


def _event() -> Any:
    """A CUDA event without timing (the simulator's take no arguments)."""
    cuda = _cuda()
    return cuda.event() if _simulated() else cuda.event(timing=False)


def _device_address(arr: Any) -> int:
    """The device pointer of a (Numba or simulated) device array."""
    cai = getattr(arr, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0] or 0)
    return int(arr._ary.__array_interface__["data"][0])  # simulator: device memory is host memory


def _contiguous(arr: Any) -> bool:
    return arr.size <= 1 or bool(arr.is_c_contiguous())


def _flat(arr: Any, spec: DtypeSpec, what: str) -> Any:
    """`arr` (a Numba device array) as a 1-D view in the kernels' storage dtype."""
    if not _contiguous(arr):
        raise ValueError(f"{what} must be C-contiguous on the device (copy it first)")
    flat = arr.reshape(arr.size)
    return flat.view(_U16) if spec.dtype == BFLOAT16 else flat


# ---------------------------------------------------------------- framework adapters

class _Adapter:
    """How one kind of device tensor is viewed, allocated, and waited for."""

    def contiguous(self, t: Any) -> Any:
        return t

    def device_id(self, t: Any) -> int:
        return _current_device()

    def view(self, t: Any) -> tuple[Any, DtypeSpec]:
        """(Numba device array of `t`, zero copy; its DtypeSpec)."""
        arr = t if getattr(t, "__cuda_ndarray__", False) else _from_interface(t, sync=True)
        return arr, spec_of(arr.dtype)

    def empty_like(self, t: Any, shape: tuple, spec: DtypeSpec, device: int) -> Any:
        """A new array of `t`'s framework, `shape` and dtype, on `device`."""
        return _cuda().device_array(shape, spec.dtype)

    def ready(self, t: Any) -> Any:
        """An event on the producer's stream (None: nothing to wait for; a foreign
        ``__cuda_array_interface__`` export was synchronized when it was viewed)."""
        if not getattr(t, "__cuda_ndarray__", False):
            return None
        event = _event()
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
_NUMBA = _Adapter()


def _adapter(t: Any) -> _Adapter:
    return _ADAPTERS.get(type(t).__module__.partition(".")[0], _NUMBA)


def _import_dlpack(t: Any) -> Any:
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


def _export_like(template: Any, result: Any) -> Any:
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


class _State:
    """Per-engine device resources: the GPU, streams, fusion and staging buffers."""

    def __init__(self) -> None:
        self.device: int | None = None
        self.lock = threading.Lock()
        self.streams: tuple | None = None
        self.buffers: dict[str, Any] = {}
        self.residuals: dict[str, Any] = {}  # error feedback by tensor name, on the device
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
            cuda = _cuda()
            buf = cuda.pinned_array(size, _U8) if pinned else cuda.device_array(size, _U8)
            self.buffers[name] = buf
        return buf[:nbytes]


_STATES: "weakref.WeakKeyDictionary[Any, _State]" = weakref.WeakKeyDictionary()


def _state(engine: Any) -> _State:
    state = _STATES.get(engine)
    if state is None:
        state = _STATES.setdefault(engine, _State())
    return state


def _on_device(device: int) -> Any:
    """Make `device`'s (primary) context current on this thread for the `with` block."""
    import contextlib

    return contextlib.nullcontext() if _simulated() else _cuda().gpus[device]


def _device_entry(state: _State, tensor: Any, out: Any) -> tuple[DeviceEntry, DtypeSpec, tuple]:
    """View one tensor (and its `out`) for the device ring; allocate its result."""
    if not is_device_tensor(tensor):
        raise TypeError(f"cannot mix device and host tensors: got {type(tensor).__name__}")
    original = tensor
    adapter = _adapter(tensor)
    if adapter is _NUMBA and not getattr(tensor, "__cuda_ndarray__", False) \
            and not hasattr(tensor, "__cuda_array_interface__"):
        tensor = _import_dlpack(tensor)
        adapter = _adapter(tensor)
    device = adapter.device_id(tensor)
    state.claim(device)
    with _on_device(device):
        tensor = adapter.contiguous(tensor)
        arr, spec = adapter.view(tensor)
        shape = tuple(arr.shape)
        src = _flat(arr, spec, "tensor")
        if out is None:
            result = adapter.empty_like(tensor, shape, spec, device)
            work = _flat(adapter.view(result)[0], spec, "out")
            if original is not tensor and adapter is not _adapter(original):
                result = _export_like(original, result)
        elif out is original and tensor is original:  # in place
            work, result = src, out
        else:
            if not is_device_tensor(out) or _adapter(out) is not adapter:
                raise TypeError(f"out must be a device tensor of the same framework as the "
                                f"tensor, got {type(out).__name__}")
            if adapter.device_id(out) != device:
                raise ValueError(f"out is on cuda:{adapter.device_id(out)}, the tensor on cuda:{device}")
            out_arr, out_spec = adapter.view(out)
            if tuple(out_arr.shape) != shape:
                raise ValueError(f"out has shape {tuple(out_arr.shape)}, the tensor {shape}")
            if out_spec != spec:
                raise TypeError(f"out has dtype {out_spec.name}, the tensor {spec.name}")
            work, result = _flat(out_arr, spec, "out"), out
        ready = adapter.ready(tensor)
    return DeviceEntry(src, work, work, result, ready), spec, shape


def allreduce_request(rt: Any, kind: str, tensors: Sequence, outs: Sequence, op: ReduceOp,
                      name: str | None, compressor: Compressor, prescale: float, postscale: float,
                      grouped: bool) -> tuple[Any, Request]:
    """Validate device tensors and build their allreduce Request; returns (engine, request).

    The api has already checked `op`, the factors, `name` and `compression`; this checks what
    depends on the tensors (dtype, op for that dtype, `out`, one GPU per process) and raises
    at call time, on this rank only, as the host path does.

    Example:
        >>> from numba import cuda; import numpy as np, fastring                # doctest: +SKIP
        >>> engine, req = allreduce_request(runtime(), "allreduce", [cuda.to_device(np.ones(3))],
        ...     [None], fastring.Sum, None, Compression.none, 1.0, 1.0, False)  # doctest: +SKIP
        >>> engine.run(req).copy_to_host()                                      # doctest: +SKIP
        array([1., 1., 1.])
    """
    from .api import _check_op_for_dtype  # api imports this module: import when called

    engine = rt.engine
    state = _state(engine)
    built = [_device_entry(state, t, o) for t, o in zip(tensors, outs)]
    entries = [e for e, _, _ in built]
    spec = built[0][1]
    for _, s, _ in built[1:]:
        if s != spec:
            raise TypeError(f"grouped tensors must share one dtype, got {spec.dtype} and {s.dtype}")
    _check_op_for_dtype(op, spec)
    if not spec.is_float:
        compressor = Compression.none  # integers and bools travel as they are
    if compressor.error_feedback and name is None:
        raise ValueError(f"{compressor!r} keeps a residual per tensor name; give the tensor a name")
    shapes = tuple(shape for _, _, shape in built) if grouped else built[0][2]
    nbytes = sum(e.src.size for e in entries) * spec.dtype.itemsize
    name = name or engine.auto_name(kind)
    fields = (("collective", kind), ("dtype", spec.name), ("shape", shapes), ("op", op.name),
              ("prescale_factor", prescale), ("postscale_factor", postscale), ("device", "cuda"),
              ("compression", compressor.name))
    work = AllreduceWork(spec, op, prescale, postscale, entries, grouped, compressor, device="cuda")
    return engine, Request(kind, name, fields, nbytes, Handle(engine, name), allreduce=work)


# ================================================================ reduction

@dataclass
class _Layout:
    """How a batch sits in the device buffer the ring reduces."""
    work: AllreduceWork
    acc: np.dtype            # accumulator dtype (float32/float64 under compression)
    storage: np.dtype        # dtype of the buffer the kernels index (bfloat16 as uint16)
    kdtype: Any              # the kernels' dtype= override (bfloat16) or None
    wire: str | None         # 16-bit wire format of the ring, or None
    counts: list[int] = field(default_factory=list)  # elements per request


def _layout(batch: list[Request]) -> _Layout:
    work = batch[0].allreduce
    wire = work.compression.wire
    bf16 = wire is None and work.spec.dtype == BFLOAT16
    acc = work.accumulator
    return _Layout(work, acc, _U16 if bf16 else acc, BFLOAT16 if bf16 else None, wire,
                   [sum(e.src.size for e in r.allreduce.entries) for r in batch])


def _own_format(spec: DtypeSpec) -> str | None:
    """The 16-bit format a float16/bfloat16 tensor is stored in (None for other dtypes)."""
    return {"float16": "fp16", "bfloat16": "bf16"}.get(spec.name)


def _as_device(entry: Entry, stream: Any) -> Entry:
    """A host Entry (a joined rank's zeros) as device arrays; device entries as they are."""
    if not isinstance(entry.src, np.ndarray):
        return entry
    cuda = _cuda()
    host = entry.src.reshape(-1)
    if host.dtype == BFLOAT16:
        host = host.view(_U16)
    src = cuda.to_device(host, stream=stream)
    return Entry(src, src, src, entry.result)


class _Batch:
    """One fused batch on the device: pack, ring, unpack."""

    def __init__(self, engine: Any, state: _State, batch: list[Request]):
        self.engine, self.state, self.batch = engine, state, batch
        self.rt = engine.rt
        self.lay = _layout(batch)
        self.kc = _kernels()
        self.up, self.down = state.streams
        self.names = [r.name for r in batch]
        self.entries = [[_as_device(e, self.up) for e in r.allreduce.entries] for r in batch]

    def phase(self, what: str):
        return self.engine.timeline.span(self.names, what)

    # ------------------------------------------------------------ pack / unpack
    def buffer(self) -> tuple[Any, bool]:
        """(the 1-D buffer to reduce in, whether it is the lone output itself)."""
        lay = self.lay
        if len(self.batch) == 1 and len(self.entries[0]) == 1 and lay.acc == self.lay.work.spec.dtype:
            e = self.entries[0][0]
            if e.src is not e.work and e.src.size:
                e.work.copy_to_device(e.src, stream=self.up)
            return e.work, True
        fusion = self.state.buffer("fusion", sum(lay.counts) * lay.acc.itemsize).view(lay.storage)
        self.move(fusion, pack=True)
        return fusion, False

    def move(self, flat: Any, pack: bool) -> None:
        """Copy every tensor into its place in `flat` (`pack`) or its result back out; under
        compression 16-bit tensors are widened to float32 on the way in, narrowed on the way
        out. Plain copies go up to 8 buffers per kernel launch."""
        lay, kc = self.lay, self.kc
        fmt = _own_format(lay.work.spec) if lay.wire is not None else None
        parts, offsets = [], []
        offset = 0
        for entries in self.entries:
            for e in entries:
                arr = e.src if pack else e.work
                n = arr.size
                if n and fmt is not None:
                    if pack:
                        kc.decode16(arr, flat[offset:offset + n], fmt, stream=self.up)
                    else:
                        kc.encode16(flat[offset:offset + n], arr, fmt, stream=self.up)
                elif n:
                    parts.append(arr.view(_U8))
                    offsets.append(offset * lay.acc.itemsize)
                offset += n
        if parts:
            (kc.pack if pack else kc.unpack)(flat.view(_U8), parts, offsets, stream=self.up)

    # ------------------------------------------------------------ scaling
    def prescale(self, flat: Any) -> None:
        work, kc = self.lay.work, self.kc
        if work.prescale != 1.0:
            kc.scale_into(flat, work.prescale, dtype=self.lay.kdtype, stream=self.up)
        if _predivides(work, self.rt.size):
            kc.divide_into(flat, self.rt.size, dtype=self.lay.kdtype, stream=self.up)

    def finalize(self, view: Any) -> None:
        """Average's division and the postscale, on fully reduced data (engine._finalizer)."""
        work, size, kc = self.lay.work, self.rt.size, self.kc
        if not view.size:
            return
        if work.op == ReduceOp.Average and size > 1 and not _predivides(work, size):
            kc.divide_into(view, size, dtype=self.lay.kdtype, stream=self.up)
        if work.postscale != 1.0:
            kc.scale_into(view, work.postscale, dtype=self.lay.kdtype, stream=self.up)

    def feed_back_error(self, flat: Any) -> None:
        """Error feedback on the device, per tensor name (engine._feed_back_error)."""
        lay, kc, up = self.lay, self.kc, self.up
        if not lay.work.compression.error_feedback:
            return
        bits = self.state.buffer("bits", flat.size * 2).view(_U16)
        offset = 0
        for r, n in zip(self.batch, lay.counts):
            mine = flat[offset:offset + n]
            offset += n
            if not n:
                continue
            residual = self.state.residuals.get(r.name)
            if residual is not None and residual.size == n and residual.dtype == lay.acc:
                kc.reduce_into(mine, residual, KERNEL_OP[ReduceOp.Sum], stream=up)
            else:
                residual = self.state.residuals[r.name] = _cuda().device_array(n, lay.acc)
            kc.encode16(mine, bits[:n], lay.wire, stream=up)
            kc.decode16(bits[:n], residual, lay.wire, stream=up)      # what is sent
            kc.scale_into(residual, -1.0, stream=up)                   # exact negation
            kc.reduce_into(residual, mine, KERNEL_OP[ReduceOp.Sum], stream=up)  # input - sent
            kc.decode16(bits[:n], mine, lay.wire, stream=up)

    # ------------------------------------------------------------ run
    def run(self) -> None:
        with self.phase("pack"):
            for r in self.batch:
                for e in r.allreduce.entries:
                    ready = getattr(e, "ready", None)
                    if ready is not None:
                        ready.synchronize()
            flat, lone = self.buffer()
            self.prescale(flat)
            self.feed_back_error(flat)
        _Ring(self, flat).run()
        with self.phase("unpack"):
            if not lone:
                self.move(flat, pack=False)
            self.up.synchronize()
        for r, entries in zip(self.batch, self.entries):
            results = [e.result for e in entries]
            self.engine._complete(r, results if r.allreduce.grouped else results[0])


class _Ring:
    """The ring on the device buffer `flat` (see the module docstring).

    Uncompressed, the ring sends and reduces `flat` itself. Compressed, `flat` accumulates
    in float32/float64 and a uint16 `wire` copy of it travels: each received segment is
    decoded, accumulated and re-encoded by one fused kernel (accumulate16), as the host's
    CompressedRing does; the allgather circulates the encoded result and every rank decodes
    the same bits.
    """

    def __init__(self, b: _Batch, flat: Any):
        self.b, self.flat, self.kc, self.up, self.down = b, flat, b.kc, b.up, b.down
        self.rank, self.size = b.rt.rank, b.rt.size
        self.transport = b.rt.transport
        self.count = flat.size
        self.offsets = chunk_offsets(self.count, self.size, 1)  # elements
        lay = b.lay
        self.op = KERNEL_OP[lay.work.op]
        if lay.wire is None:
            self.send = flat
        else:
            self.send = b.state.buffer("wire", 2 * self.count).view(_U16)
        self.isz = self.send.dtype.itemsize
        self.seg = max(1, SEGMENT_BYTES // self.isz)
        if b.state.aware is None:
            b.state.aware = cuda_aware_mpi()
        self.staged = not b.state.aware

    def chunk(self, c: int) -> tuple[int, int]:
        return int(self.offsets[c]), int(self.offsets[c + 1])

    def apply(self, lo: int, hi: int, received: Any, last: bool) -> None:
        """Reduce the received segment `received` into elements lo:hi of the buffer."""
        b = self.b
        if b.lay.wire is None:
            self.kc.reduce_into(self.flat[lo:hi], received, self.op, dtype=b.lay.kdtype, stream=self.up)
        else:
            self.kc.accumulate16(self.flat[lo:hi], received, None if last else self.send[lo:hi],
                                 b.lay.wire, self.op, stream=self.up)

    def run(self) -> None:
        b = self.b
        own_lo, own_hi = self.chunk(self.rank)
        with b.phase("reduce-scatter"):
            if self.size > 1 and self.count:
                if b.lay.wire is not None:
                    first = self.chunk((self.rank - 1) % self.size)
                    self._encode(*first)
                self._reduce_scatter()
            b.finalize(self.flat[own_lo:own_hi])
            if b.lay.wire is not None:
                self._encode(own_lo, own_hi)
        with b.phase("allgather"):
            if self.size > 1 and self.count:
                self._allgather()
            if b.lay.wire is not None and self.count:
                self.kc.decode16(self.send, self.flat, b.lay.wire, stream=self.up)

    def _encode(self, lo: int, hi: int) -> None:
        if hi > lo:
            self.kc.encode16(self.flat[lo:hi], self.send[lo:hi], self.b.lay.wire, stream=self.up)

    def _steps(self) -> list[tuple[int, int, int, int, bool]]:
        """(send lo, hi, receive lo, hi, last step) per segment exchange, in ring order. Every
        rank walks the same number of segments (some possibly empty) so that each exchange
        has its partner; exchange j + segments sends what exchange j reduced."""
        size, rank, seg = self.size, self.rank, self.seg
        largest = max(self.chunk(c)[1] - self.chunk(c)[0] for c in range(size))
        self.segments = max(1, -(-largest // seg))
        steps = []
        for step in range(size - 1):
            s0, s1 = self.chunk((rank - step - 1) % size)
            r0, r1 = self.chunk((rank - step - 2) % size)
            for k in range(self.segments):
                s_lo, r_lo = s0 + k * seg, r0 + k * seg
                steps.append((s_lo, max(min(s_lo + seg, s1), s_lo), r_lo, max(min(r_lo + seg, r1), r_lo),
                              step == size - 2))
        return steps

    def _reduce_scatter(self) -> None:
        steps = self._steps()
        total, segs, isz = len(steps), self.segments, self.isz
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        nbytes = self.seg * isz
        state = self.b.state
        dev_tmp = [state.buffer(f"recv{k}", nbytes) for k in range(2)]
        applied = [_event() for _ in range(total)]
        packed = _event()
        packed.record(self.up)
        if not self.staged:
            self.up.synchronize()
            base = _device_address(self.send)
            for i, (s_lo, s_hi, r_lo, r_hi, last) in enumerate(steps):
                for j in (i - segs, i - 2):  # what this exchange sends is reduced; its slot is free
                    if j >= 0:
                        applied[j].synchronize()
                slot = dev_tmp[i % 2]
                self.transport.sendrecv(base + s_lo * isz, (s_hi - s_lo) * isz, right,
                                        _device_address(slot), (r_hi - r_lo) * isz, left, _RS_TAG)
                if r_hi > r_lo:
                    self.apply(r_lo, r_hi, slot[:(r_hi - r_lo) * isz].view(self.send.dtype), last)
                applied[i].record(self.up)
            return
        # Staged: send_host/recv_host are pinned; `down` copies segments out ahead of the
        # exchange, `up` uploads and reduces behind it.
        send_host = [state.buffer(f"send_host{k}", nbytes, pinned=True) for k in range(2)]
        recv_host = [state.buffer(f"recv_host{k}", nbytes, pinned=True) for k in range(2)]
        copied = [_event() for _ in range(total)]
        uploaded = [_event() for _ in range(total)]
        send_u8 = self.send.view(_U8)
        issued = 0  # exchanges whose outgoing segment has been queued for download

        def download(upto_applied: int, upto_sent: int) -> None:
            nonlocal issued
            while issued < total and issued - 2 <= upto_sent and issued - segs <= upto_applied:
                s_lo, s_hi = steps[issued][:2]
                (applied[issued - segs] if issued >= segs else packed).wait(self.down)
                if s_hi > s_lo:
                    send_u8[s_lo * isz:s_hi * isz].copy_to_host(
                        send_host[issued % 2][:(s_hi - s_lo) * isz], stream=self.down)
                copied[issued].record(self.down)
                issued += 1

        download(-1, -1)
        for i, (s_lo, s_hi, r_lo, r_hi, last) in enumerate(steps):
            copied[i].synchronize()
            if i >= 2:
                uploaded[i - 2].synchronize()  # recv_host[i % 2] has been uploaded
            sn, rn = (s_hi - s_lo) * isz, (r_hi - r_lo) * isz
            self.transport.sendrecv(array_address(send_host[i % 2]), sn, right,
                                    array_address(recv_host[i % 2]), rn, left, _RS_TAG)
            slot = dev_tmp[i % 2]
            if rn:
                slot[:rn].copy_to_device(recv_host[i % 2][:rn], stream=self.up)
            uploaded[i].record(self.up)
            if rn:
                self.apply(r_lo, r_hi, slot[:rn].view(self.send.dtype), last)
            applied[i].record(self.up)
            download(i, i)

    def _allgather(self) -> None:
        """Circulate chunk c, complete on rank c, so that every rank holds every chunk."""
        isz, size, rank = self.isz, self.size, self.rank
        byte_offsets = self.offsets * isz
        right, left = (rank + 1) % size, (rank - 1) % size
        self.up.synchronize()
        if not self.staged:
            self.transport.ring_allgather(_device_address(self.send), byte_offsets, _AG_TAG)
            return
        # Staged: the ring runs on a pinned host mirror; each received chunk is uploaded
        # while the next one is exchanged.
        mirror = self.b.state.buffer("mirror", int(byte_offsets[-1]), pinned=True)
        send_u8 = self.send.view(_U8)
        lo, hi = int(byte_offsets[rank]), int(byte_offsets[rank + 1])
        if hi > lo:
            send_u8[lo:hi].copy_to_host(mirror[lo:hi], stream=self.up)
            self.up.synchronize()
        base = array_address(mirror)
        for step in range(size - 1):
            s0, s1 = (int(x) for x in byte_offsets[(rank - step) % size:(rank - step) % size + 2])
            r0, r1 = (int(x) for x in byte_offsets[(rank - step - 1) % size:(rank - step - 1) % size + 2])
            self.transport.sendrecv(base + s0, s1 - s0, right, base + r0, r1 - r0, left, _AG_TAG)
            if r1 > r0:
                send_u8[r0:r1].copy_to_device(mirror[r0:r1], stream=self.up)


def _kernels():
    from . import kernels

    return kernels.cuda_kernels()


def reduce_batch(engine: Any, batch: list[Request]) -> None:
    """Reduce a batch of device allreduce requests of one key (the same batch, in the same
    order, on every rank) and complete each request's handle with its result.

    Called by the engine; users call fastring.allreduce on a device tensor.

    Example:
        >>> from numba import cuda; import numpy as np, fastring                  # doctest: +SKIP
        >>> fastring.allreduce(cuda.to_device(np.ones(2)), op=fastring.Sum)       # doctest: +SKIP
        array([1., 1.])
    """
    if not batch:
        return
    state = _state(engine)
    cuda = _cuda()
    device = state.device if state.device is not None else _current_device()
    with cuda.gpus[device]:
        if state.streams is None:
            state.streams = (cuda.stream(), cuda.stream())
        _Batch(engine, state, batch).run()
