"""Allreduce requests for device (CUDA) tensors: validation at call time, on this rank only,
as the host path does; the reduction itself is `fastring.algorithms.device`."""
from __future__ import annotations

from typing import Any, Sequence

from .._core.compression import Compression, Compressor
from .._core.device import (NUMBA_ADAPTER, DeviceEntry, adapter_of, export_like, flat_view, import_dlpack,
                            on_device, state_of, DeviceState, is_device_tensor)
from .._core.dtypes import DtypeSpec
from .._core.ops import ReduceOp
from .._core.work import work_of
from ..engine import Handle, Request
from .validation import check_op_for_dtype, is_automatic


def _device_entry(state: DeviceState, tensor: Any, out: Any) -> tuple[DeviceEntry, DtypeSpec, tuple]:
    """View one tensor (and its `out`) for the device ring; allocate its result."""
    if not is_device_tensor(tensor):
        raise TypeError(f"cannot mix device and host tensors: got {type(tensor).__name__}")
    original = tensor
    adapter = adapter_of(tensor)
    if adapter is NUMBA_ADAPTER and not getattr(tensor, "__cuda_ndarray__", False) \
            and not hasattr(tensor, "__cuda_array_interface__"):
        tensor = import_dlpack(tensor)
        adapter = adapter_of(tensor)
    device = adapter.device_id(tensor)
    state.claim(device)
    with on_device(device):
        tensor = adapter.contiguous(tensor)
        arr, spec = adapter.view(tensor)
        shape = tuple(arr.shape)
        src = flat_view(arr, spec, "tensor")
        if out is None:
            result = adapter.empty_like(tensor, shape, spec, device)
            work = flat_view(adapter.view(result)[0], spec, "out")
            if original is not tensor and adapter is not adapter_of(original):
                result = export_like(original, result)
        elif out is original and tensor is original:  # in place
            work, result = src, out
        else:
            if not is_device_tensor(out) or adapter_of(out) is not adapter:
                raise TypeError(f"out must be a device tensor of the same framework as the "
                                f"tensor, got {type(out).__name__}")
            if adapter.device_id(out) != device:
                raise ValueError(f"out is on cuda:{adapter.device_id(out)}, the tensor on cuda:{device}")
            out_arr, out_spec = adapter.view(out)
            if tuple(out_arr.shape) != shape:
                raise ValueError(f"out has shape {tuple(out_arr.shape)}, the tensor {shape}")
            if out_spec != spec:
                raise TypeError(f"out has dtype {out_spec.name}, the tensor {spec.name}")
            work, result = flat_view(out_arr, spec, "out"), out
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
    engine = rt.engine
    state = state_of(rt)
    built = [_device_entry(state, t, o) for t, o in zip(tensors, outs)]
    entries = [e for e, _, _ in built]
    spec = built[0][1]
    for _, s, _ in built[1:]:
        if s != spec:
            raise TypeError(f"grouped tensors must share one dtype, got {spec.dtype} and {s.dtype}")
    check_op_for_dtype(op, spec)
    if not spec.is_float:
        compressor = Compression.none  # integers and bools travel as they are
    if compressor.error_feedback and is_automatic(name):
        raise ValueError(f"{compressor!r} keeps a residual per tensor name; give the tensor a name")
    shapes = tuple(shape for _, _, shape in built) if grouped else built[0][2]
    nbytes = sum(e.src.size for e in entries) * spec.dtype.itemsize
    fields = (("collective", kind), ("dtype", spec.name), ("shape", shapes), ("op", op.name),
              ("prescale_factor", prescale), ("postscale_factor", postscale), ("device", "cuda"),
              ("compression", compressor.name))
    work = work_of(spec, op, prescale, postscale, compressor, "cuda")
    return engine, Request(kind, name, fields, nbytes, Handle(engine, name), work, entries, grouped)

