"""The parts of scripts/gpu_check.sh (see there). Each subcommand prints one short table.

    python scripts/gpu_check.py detect                 # exit 0 and name the GPU, or exit 1
    python scripts/gpu_check.py kernels [--mib 256]    # kernel bandwidth vs device copy bandwidth
    mpiexec -n 2 python scripts/gpu_check.py allreduce [--max-mib 256]   # device vs host allreduce

With ``--tiny`` (and NUMBA_ENABLE_CUDASIM=1 on a machine without a GPU) the same code runs on a
few KiB in Numba's simulator: it checks the plumbing and results; its timings mean nothing.

Example:
    >>> python scripts/gpu_check.py kernels --mib 64    # doctest: +SKIP
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import numpy as np
from numba import cuda  # a global: the simulator swaps it inside kernels defined here


def detect() -> int:
    """Print the GPU Numba sees (exit 0) or why there is none (exit 1).

    Example:
        >>> detect()   # doctest: +SKIP
        GPU 0: NVIDIA H200 (compute capability 9.0)
        0
    """
    from numba import config

    if config.ENABLE_CUDASIM:
        print("NUMBA_ENABLE_CUDASIM=1 is set: the simulator is not a GPU")
        return 1
    try:
        if not cuda.is_available():
            print("numba.cuda finds no usable CUDA driver or GPU")
            return 1
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
        print(f"GPU {dev.id}: {name} (compute capability {'.'.join(map(str, dev.compute_capability))})")
        return 0
    except Exception as e:  # noqa: BLE001 - any driver failure means: no GPU to check
        print(f"numba.cuda cannot use a GPU: {e}")
        return 1


def _timed(fn: Callable[[], None], reps: int, trials: int = 5) -> float:
    """Median seconds per call of `fn` (device work synchronized around each trial)."""
    fn()  # compile / warm up
    cuda.synchronize()
    samples = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        cuda.synchronize()
        samples.append((time.perf_counter() - t0) / reps)
    return statistics.median(samples)


def _row(cells: list, widths: list[int]) -> str:
    return "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))


def _copy_kernel():
    @cuda.jit
    def copy(dst, src):
        for i in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
            dst[i] = src[i]

    return copy


def kernels(mib: float, reps: int) -> int:
    """Each CUDA kernel's bandwidth (bytes it reads + writes per second) as a fraction of a
    copy kernel's (read + write), launched alike and measured in the same run.

    Example:
        >>> kernels(64, 10)   # doctest: +SKIP
    """
    from numba import config

    from fastring._core.dtypes import BFLOAT16
    from fastring.kernels import KernelOp, cuda_kernels

    kc = cuda_kernels()
    n = max(1024, int(mib * 2**20) // 4)  # float32 elements
    rng = np.random.default_rng(0)
    host = rng.standard_normal(n).astype(np.float32)
    f32, f32b = cuda.to_device(host), cuda.to_device(host[::-1].copy())
    f16, f16b = cuda.to_device(host.astype(np.float16)), cuda.to_device(host.astype(np.float16))
    bits, bits2 = cuda.to_device(np.zeros(n, np.uint16)), cuda.to_device(np.zeros(n, np.uint16))
    kc.encode16(f32, bits, "bf16")
    kc.encode16(f32b, bits2, "bf16")
    i32, i32b = cuda.to_device(np.ones(n, np.int32)), cuda.to_device(np.ones(n, np.int32))
    u8 = cuda.to_device(np.zeros(4 * n, np.uint8))
    parts = [cuda.to_device(np.ones(4 * n // 8, np.uint8)) for _ in range(8)]
    offsets = [k * (4 * n // 8) for k in range(8)]
    # The reference is a kernel that only copies, launched as fastring's kernels are: what that
    # launch shape allows. The driver's device-to-device copy gets a row of its own (on an H200
    # it ran at 0.2x the copy kernel's speed with 64 MiB operands and 1.3x with 256 MiB).
    copy_kernel = _copy_kernel()
    copy_s = _timed(lambda: copy_kernel[kc._blocks(n), kc.THREADS_PER_BLOCK](f32b, f32), reps)
    copy_bw = 2 * 4 * n / copy_s
    driver_s = _timed(lambda: f32b.copy_to_device(f32), reps)
    cases = [  # (kernel, dtype, bytes read + written, call)
        ("reduce_into sum", "float32", 12 * n, lambda: kc.reduce_into(f32, f32b, KernelOp.SUM)),
        ("reduce_into max", "float32", 12 * n, lambda: kc.reduce_into(f32, f32b, KernelOp.MAX)),
        ("reduce_into sum", "float16", 6 * n, lambda: kc.reduce_into(f16, f16b, KernelOp.SUM)),
        ("reduce_into sum", "bfloat16", 6 * n,
         lambda: kc.reduce_into(bits, bits2, KernelOp.SUM, dtype=BFLOAT16)),
        ("reduce_into sum", "int32", 12 * n, lambda: kc.reduce_into(i32, i32b, KernelOp.SUM)),
        ("scale_into", "float32", 8 * n, lambda: kc.scale_into(f32, 1.0)),
        ("divide_into", "float32", 8 * n, lambda: kc.divide_into(f32, 1)),
        ("encode16 fp16", "float32", 6 * n, lambda: kc.encode16(f32, bits, "fp16")),
        ("decode16 bf16", "float32", 6 * n, lambda: kc.decode16(bits2, f32b, "bf16")),
        ("accumulate16", "fp16 wire", 12 * n, lambda: kc.accumulate16(f32, bits2, bits, "fp16")),
        ("accumulate16 last", "fp16 wire", 10 * n, lambda: kc.accumulate16(f32, bits2, None, "fp16")),
        ("pack 8 parts", "uint8", 8 * n, lambda: kc.pack(u8, parts, offsets)),
        ("unpack 8 parts", "uint8", 8 * n, lambda: kc.unpack(u8, parts, offsets)),
    ]
    widths = [18, 10, 10, 10, 9, 8]
    print(f"kernel bandwidth, {_size(4 * n)} float32 operands"
          + (" (SIMULATOR: timings meaningless)" if config.ENABLE_CUDASIM else ""))
    print(_row(["kernel", "dtype", "moved", "time ms", "GB/s", "of copy"], widths))
    print(_row(["copy kernel", "float32", _size(8 * n), f"{copy_s * 1e3:.3f}",
                f"{copy_bw / 1e9:.1f}", "100%"], widths))
    print(_row(["driver copy", "bytes", _size(8 * n), f"{driver_s * 1e3:.3f}",
                f"{8 * n / driver_s / 1e9:.1f}", f"{copy_s / driver_s:.0%}"], widths))
    for name, dtype, moved, call in cases:
        s = _timed(call, reps)
        print(_row([name, dtype, _size(moved), f"{s * 1e3:.3f}", f"{moved / s / 1e9:.1f}",
                    f"{moved / s / copy_bw:.0%}"], widths))
    return 0


def allreduce(max_mib: float, reps: int) -> int:
    """2-rank (any N) allreduce of device arrays, every rank on GPU local_rank % count, against
    the same allreduce of host arrays; checks every result and prints busbw.

    Example:
        >>> allreduce(256, 5)   # doctest: +SKIP   (under mpiexec -n 2)
    """
    from numba import config

    import fastring
    from fastring._core import device

    fastring.init()
    rank, size = fastring.rank(), fastring.size()
    if not config.ENABLE_CUDASIM:
        cuda.select_device(fastring.local_rank() % len(cuda.gpus))
    mode = "CUDA-aware MPI" if device.cuda_aware_mpi() else "staged through pinned host memory"
    widths = [10, 10, 10, 10, 10, 10, 8]
    if rank == 0:
        print(f"allreduce float32 Sum on {size} ranks, device path {mode}"
              + (" (SIMULATOR: timings meaningless)" if config.ENABLE_CUDASIM else ""))
        print(_row(["bytes", "device ms", "busbw GB/s", "host ms", "busbw GB/s", "dev/host",
                    "wrong"], widths))
    nbytes, failures = 4096, 0
    while nbytes <= max_mib * 2**20:
        n = nbytes // 4
        x = cuda.to_device(np.full(n, rank + 1.0, np.float32))
        h = np.full(n, rank + 1.0, np.float32)
        out, hout = cuda.device_array(n, np.float32), np.empty(n, np.float32)
        expected = size * (size + 1) / 2
        got = fastring.allreduce(x, op=fastring.Sum, out=out).copy_to_host()
        wrong = int(np.count_nonzero(got != expected))
        wrong += int(np.count_nonzero(fastring.allreduce(h, op=fastring.Sum, out=hout) != expected))
        dev_s = _timed(lambda: fastring.allreduce(x, op=fastring.Sum, out=out), reps, trials=3)
        host_s = _timed(lambda: fastring.allreduce(h, op=fastring.Sum, out=hout), reps, trials=3)
        wrong = fastring.allreduce(np.array([wrong], np.int64), op=fastring.Sum)[0]
        failures += int(wrong)
        bus = 2 * (size - 1) / size * nbytes
        if rank == 0:
            print(_row([_size(nbytes), f"{dev_s * 1e3:.3f}", f"{bus / dev_s / 1e9:.2f}",
                        f"{host_s * 1e3:.3f}", f"{bus / host_s / 1e9:.2f}", f"{host_s / dev_s:.2f}x",
                        wrong], widths))
        nbytes *= 4
    fastring.shutdown()
    return 1 if failures else 0


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes}B"


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (see the module docstring).

    Example:
        >>> main(["detect"])   # doctest: +SKIP
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["detect", "kernels", "allreduce"])
    parser.add_argument("--mib", type=float, default=256.0, help="kernels: MiB per float32 operand")
    parser.add_argument("--max-mib", type=float, default=256.0, help="allreduce: largest message")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="a few KiB, one repetition (simulator)")
    args = parser.parse_args(argv)
    if args.what == "detect":
        return detect()
    if args.tiny:
        args.mib, args.max_mib, args.reps = 1 / 64, 1 / 64, 1
    if args.what == "kernels":
        return kernels(args.mib, args.reps)
    return allreduce(args.max_mib, args.reps)


if __name__ == "__main__":
    sys.exit(main())
