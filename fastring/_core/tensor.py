"""Tensors in and out: any DLPack exporter (numpy, torch, JAX, ...) or buffer-protocol object
becomes a numpy view of the same memory, and a numpy result goes back as the caller's type.

A framework whose tensors need more than plain DLPack (torch's bfloat16, which numpy's DLPack
importer does not know; TensorFlow, whose eager tensors export DLPack only through a
function) registers a `TensorAdapter` under its top-level module name.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .dtypes import BFLOAT16


def _module_of(obj) -> str:
    return type(obj).__module__.partition(".")[0]


@dataclass(frozen=True)
class TensorAdapter:
    """How one framework's host tensors become numpy views and results come back.

    `to_array(tensor, what)` returns a numpy view of the tensor's memory (TypeError naming
    `what` if it cannot); `like(template, array)` returns `array` as a tensor of the
    template's framework, zero-copy where the framework allows.
    """
    to_array: Callable[[Any, str], np.ndarray]
    like: Callable[[Any, np.ndarray], Any]
    # quick(tensor): the numpy view of a plain host tensor, or None where `to_array` must look
    # (another device, autograd, a dtype numpy lacks); the hot path's first try
    quick: Callable[[Any], np.ndarray | None] | None = None


_ADAPTERS: dict[str, TensorAdapter] = {}
# tensor type -> its adapter (None: none registered); looked up on every call of the hot paths
_BY_TYPE: dict[type, TensorAdapter | None] = {}


def _adapter(tensor) -> TensorAdapter | None:
    kind = type(tensor)
    try:
        return _BY_TYPE[kind]
    except KeyError:
        found = _ADAPTERS.get(_module_of(tensor))
        if len(_BY_TYPE) < 256:  # types made at run time must not pile up
            _BY_TYPE[kind] = found
        return found


# tensor type -> its adapter's quick view (None: none); looked up on every call of the hot paths
_QUICK: dict[type, Callable[[Any], np.ndarray | None] | None] = {}


def host_view(tensor) -> np.ndarray | None:
    """The numpy view of a plain host tensor whose framework's adapter has a quick view, or
    None: then `as_array` (and the device check before it) must look at it.

    Example:
        >>> host_view(bytearray(b"ab")) is None   # no adapter: as_array reads it
        True
    """
    kind = type(tensor)
    try:
        quick = _QUICK[kind]
    except KeyError:
        adapter = _adapter(tensor)
        quick = adapter.quick if adapter is not None else None
        if len(_QUICK) < 256:  # types made at run time must not pile up
            _QUICK[kind] = quick
    return quick(tensor) if quick is not None else None


def register_adapter(module: str, adapter: TensorAdapter) -> None:
    """Use `adapter` for every tensor whose type is defined in top-level module `module`.

    Example:
        >>> class Box:
        ...     def __init__(self, a): self.a = a
        >>> Box.__module__ = "boxes"
        >>> register_adapter("boxes", TensorAdapter(lambda t, what: t.a, lambda t, a: Box(a)))
        >>> like(Box(np.zeros(2)), as_array(Box(np.ones(2)))).a
        array([1., 1.])
    """
    _ADAPTERS[module] = adapter
    _BY_TYPE.clear()
    _QUICK.clear()


def as_array(tensor, what: str = "tensor") -> np.ndarray:
    """A numpy view (no copy) of `tensor`'s memory, or TypeError if it cannot be read.

    Example:
        >>> as_array(bytearray(b"ab")).dtype
        dtype('uint8')
    """
    if isinstance(tensor, np.ndarray):
        return tensor
    if isinstance(tensor, np.generic):  # a NumPy scalar is a 0-d array
        return np.asarray(tensor)
    adapter = _adapter(tensor)
    if adapter is not None:
        return adapter.to_array(tensor, what)
    if hasattr(tensor, "__dlpack__"):
        try:
            return np.from_dlpack(tensor)
        except (BufferError, TypeError, RuntimeError, ValueError) as e:
            raise TypeError(f"{what} of type {type(tensor).__name__} cannot be read as a host array: {e}") from None
    if isinstance(tensor, (int, float, bool, complex, str)) or tensor is None:
        raise TypeError(f"{what} must be a tensor or array, got {type(tensor).__name__}")
    try:
        return np.asarray(memoryview(tensor))
    except TypeError:
        raise TypeError(f"{what} of type {type(tensor).__name__} exports neither __dlpack__ "
                        "nor the buffer protocol") from None


def _torch_as_array(tensor, what: str) -> np.ndarray:
    if not tensor.is_cpu:
        raise NotImplementedError(f"{what} is on device {tensor.device}: of the collectives, only "
                                  "allreduce and grouped_allreduce take device tensors so far")
    t = tensor.detach() if tensor.requires_grad else tensor
    # Tensor.numpy() shares the memory as DLPack would, at a fifth of the cost per call. numpy
    # knows no bfloat16 (numpy() refuses it): move the bits as int16 and relabel them.
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as e:
        import torch

        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(BFLOAT16)
        raise TypeError(f"{what} of torch dtype {t.dtype} cannot be read as an array: {e}") from None


def like(template, array: np.ndarray):
    """`array` as the framework type of `template` (zero copy where the framework allows).

    Example:
        >>> like(np.zeros(2), np.ones(2))
        array([1., 1.])
    """
    if isinstance(template, np.ndarray):
        return array
    adapter = _adapter(template)
    if adapter is not None:
        return adapter.like(template, array)
    if hasattr(template, "__dlpack__"):
        fw = sys.modules.get(_module_of(template))
        from_dlpack = getattr(fw, "from_dlpack", None) or getattr(getattr(fw, "numpy", None), "from_dlpack", None)
        if from_dlpack is not None:
            return from_dlpack(array)
    return array


def _torch_quick(tensor) -> np.ndarray | None:
    # Tensor.numpy() itself refuses what this view must not take (a device tensor, one that
    # requires grad, bfloat16, a conjugate view), faster than testing for each first;
    # _torch_as_array decides those.
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError):
        return None


def _torch_like(template, array: np.ndarray):
    torch = sys.modules["torch"]  # imported: `template` is one of its tensors

    if array.dtype == BFLOAT16:
        return _torch_like(template, array.view(np.int16)).view(torch.bfloat16)
    if array.flags.writeable:  # from_numpy costs a third of from_dlpack, and warns on read-only arrays
        try:
            return torch.from_numpy(array)
        except TypeError:  # a dtype torch has no tensor type for
            pass
    return torch.from_dlpack(array)


register_adapter("torch", TensorAdapter(_torch_as_array, _torch_like, _torch_quick))
