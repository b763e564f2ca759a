"""The contract's dtypes and what each maps to below the API: one table, used everywhere."""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

# Codes understood by the transport's datatype table (fastring/_transport/mpi.pyx); None: MPI
# has no such type.
_MPI_CODES = {"uint8": 0, "int8": 1, "int32": 2, "int64": 3, "float32": 4, "float64": 5, "bool": 6,
              "int16": 7, "uint16": 8, "uint32": 9, "uint64": 10}


@dataclass(frozen=True)
class DtypeSpec:
    name: str
    dtype: np.dtype
    mpi_code: int | None
    is_float: bool
    is_16bit_float: bool


BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
SUPPORTED = {
    spec.dtype: spec
    for spec in (
        DtypeSpec(name, np.dtype(dt), _MPI_CODES.get(name), kind == "f", name in ("float16", "bfloat16"))
        for name, dt, kind in (
            ("uint8", np.uint8, "i"), ("int8", np.int8, "i"), ("int16", np.int16, "i"),
            ("uint16", np.uint16, "i"), ("int32", np.int32, "i"), ("uint32", np.uint32, "i"),
            ("int64", np.int64, "i"), ("uint64", np.uint64, "i"), ("float16", np.float16, "f"), ("bfloat16", BFLOAT16, "f"),
            ("float32", np.float32, "f"), ("float64", np.float64, "f"), ("bool", np.bool_, "b"),
        )
    )
}


def spec_of(dtype) -> DtypeSpec:
    """The DtypeSpec of a numpy dtype, or TypeError naming an unsupported one.

    Example:
        >>> spec_of(np.dtype("float32")).mpi_code
        4
    """
    try:
        return SUPPORTED[np.dtype(dtype)]
    except (KeyError, TypeError):
        names = ", ".join(s.name for s in SUPPORTED.values())
        raise TypeError(f"unsupported dtype {dtype}; fastring supports {names}") from None
