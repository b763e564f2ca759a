"""Helpers shared by the benchmark modules (no names here start with time_ or track_, so asv
collects nothing from this module). Only the collectives need fastring.tools.bench; the kernel,
fusion and compression benchmarks use fastring's library API alone, so that history runs
reach back to commits before fastring-bench existed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import timeit
from typing import Callable, Sequence

import ml_dtypes
import numpy as np

KIB, MIB = 1 << 10, 1 << 20


def gbps(fn: Callable[[], object], nbytes: int, repeat: int = 7) -> float:
    """GB/s (1e9 bytes/s) of `nbytes` handled by `fn`: the median of `repeat` timed calls
    after one untimed call (which also compiles any Numba kernel it calls).

    Example:
        >>> a = np.ones(1 << 20, np.uint8); b = np.empty_like(a)
        >>> gbps(lambda: np.copyto(b, a), a.nbytes) > 0
        True
    """
    fn()
    return nbytes / float(np.median(timeit.repeat(fn, number=1, repeat=repeat))) / 1e9


def numpy_dtype(name: str) -> np.dtype:
    """A dtype by name, bfloat16 from ml_dtypes.

    Example:
        >>> numpy_dtype("bfloat16").itemsize, numpy_dtype("int32").itemsize
        (2, 4)
    """
    return np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name)


def small_ints(nbytes: int, dtype, seed: int = 0) -> np.ndarray:
    """`nbytes` of `dtype` holding small integers (exact in every format, no denormals).

    Example:
        >>> small_ints(16, np.float32).tolist() == [int(v) for v in small_ints(16, np.float32)]
        True
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    return rng.integers(1, 9, nbytes // dtype.itemsize, dtype=np.int8).astype(dtype)


def bench_rows(ranks: int, args: Sequence[str], timeout: float = 600) -> list[dict]:
    """Run `fastring-bench ARGS --json F` on `ranks` ranks through the mpiexec beside this
    Python and return its JSON rows; raises RuntimeError with the output if it fails.

    Example:
        >>> rows = bench_rows(2, ["--min-bytes", "4K", "--max-bytes", "4K", "--iters", "3"])  # doctest: +SKIP
        >>> rows[0]["fastring"]["busbw"]  # doctest: +SKIP
        0.5
    """
    from fastring.tools.launcher import mpiexec_path

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "fastring.tools.bench",
               *args, "--no-progress", "--json", out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        with open(out) as f:
            return json.load(f)["rows"]
