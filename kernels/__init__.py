"""Numba reduction and compression kernels of fastring (shipped as ``fastring.kernels``).

The CPU kernels are re-exported here.  The CUDA kernels live in ``.cuda`` and are
imported only on request (``from fastring.kernels import cuda`` or
:func:`cuda_kernels`), so importing this package never touches ``numba.cuda``
and works on machines without a GPU.

>>> import numpy as np
>>> from fastring.kernels import KernelOp, reduce_into
>>> a = np.ones(4, np.float32); reduce_into(a, np.ones(4, np.float32), KernelOp.SUM); a
array([2., 2., 2., 2.], dtype=float32)
"""
from __future__ import annotations

import importlib
from types import ModuleType

from .cpu import (accumulate16, decode16, divide_into, encode16, pack, reduce_into,
                  scale_into, unpack)
from .cfuncs import WIRE_STEPS, finish_cfunc, reduce_after_cfunc, reduce_cfunc, wire_cfunc
from .ops import KernelOp, WireFormat

__all__ = ["KernelOp", "WireFormat", "reduce_into", "scale_into", "divide_into",
           "encode16", "decode16", "accumulate16", "pack", "unpack", "cuda_kernels",
           "finish_cfunc", "reduce_after_cfunc", "reduce_cfunc", "wire_cfunc", "WIRE_STEPS"]


def cuda_kernels() -> ModuleType:
    """Import and return the CUDA kernel module (same function names, device arrays).

    Raises ImportError if numba.cuda cannot be imported; whether a GPU (or the
    simulator, ``NUMBA_ENABLE_CUDASIM=1``) is usable is ``numba.cuda.is_available()``.

    >>> kc = cuda_kernels()  # doctest: +SKIP
    >>> kc.reduce_into(d_dst, d_src, KernelOp.SUM)  # doctest: +SKIP
    """
    return importlib.import_module(".cuda", __name__)
