"""`fastring-bench`: an nccl-tests-style size sweep of fastring's collectives, with the MPI
library's own collective measured in the same run on the same buffers.

Run it under `fastring-run` (or any MPI launcher; a plain run is a world of size 1)::

    fastring-run -np 2 fastring-bench --op allreduce --min-bytes 4K --max-bytes 256M --check --vs-mpi

Rank 0 prints one row per message size: size in bytes, element count, dtype, the median time
in µs, algbw (size / time) and busbw as nccl-tests defines it (allreduce algbw*2(n-1)/n;
allgather, reducescatter and alltoall algbw*(n-1)/n; broadcast algbw) and the number of wrong
elements; with --vs-mpi the same columns for MPI's collective (Allreduce, Allgatherv, Bcast,
Alltoallv, Reduce_scatter) and the ratio MPI time / fastring time (above 1: fastring is faster).

Sizes follow nccl-tests: for allgather the size is the gathered (output) buffer, for
reducescatter the input buffer, for alltoall each rank's whole buffer; each rank's share
(count / n elements) is what it contributes or receives.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import shlex
import socket
import sys
import time
import timeit
from typing import Callable, Sequence, TextIO

import numpy as np
from mpi4py import MPI

import fastring

OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
DTYPES = ("uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
COMPRESSIONS = ("none", "fp16", "bf16")
MPI_NAMES = {"allreduce": "MPI_Allreduce", "allgather": "MPI_Allgatherv", "broadcast": "MPI_Bcast",
             "alltoall": "MPI_Alltoallv", "reducescatter": "MPI_Reduce_scatter"}
REDUCING = ("allreduce", "reducescatter")
PARTITIONED = ("allgather", "alltoall", "reducescatter")   # the count is split into n equal parts
COMPRESSIBLE = ("allreduce",)                               # ops that take compression=
# The largest integer each format (element or 16-bit wire format) holds exactly: sums of the
# integer-valued inputs must stay below it for --check to be exact.
EXACT_LIMIT = {"uint8": 255, "int8": 127, "int32": 2**31 - 1, "int64": 2**63 - 1,
               "float16": 2048, "bfloat16": 256, "float32": 2**24, "float64": 2**53,
               "fp16": 2048, "bf16": 256}
SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
SEED = 1234
TARGET_BYTES = 1 << 30      # default iterations: about this many bytes per size and library
MIN_ITERS, MAX_ITERS = 6, 200


# ---------------------------------------------------------------------------- pure helpers

def parse_bytes(text: str) -> int:
    """A byte count from `4096`, `4K`, `256M`, `1G` (binary multiples; `KB`/`KiB` also accepted).

    Raises ValueError with a readable message for anything else, or for a count below 1.

    Example:
        >>> parse_bytes("4K"), parse_bytes("256M"), parse_bytes("100")
        (4096, 268435456, 100)
    """
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(text))
    if not m:
        raise ValueError(f"invalid size {text!r}: expected an integer with an optional "
                         "K, M or G suffix, e.g. 4K or 256M")
    value = int(m.group(1)) * SUFFIXES[m.group(2).upper()]
    if value < 1:
        raise ValueError(f"invalid size {text!r}: must be at least 1 byte")
    return value


def format_bytes(n: int) -> str:
    """A short binary-unit label for a byte count, used in progress lines and plots.

    Example:
        >>> format_bytes(4096), format_bytes(3 << 20), format_bytes(1000)
        ('4 KiB', '3 MiB', '1000 B')
    """
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def message_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Sizes from `min_bytes` multiplied by `factor` (doubling by default), ending with
    `max_bytes` (added if the steps skip it).

    Example:
        >>> message_sizes(4096, 32768)
        [4096, 8192, 16384, 32768]
        >>> message_sizes(3, 10), message_sizes(1024, 1 << 20, 1024)
        ([3, 6, 10], [1024, 1048576])
    """
    if min_bytes > max_bytes:
        raise ValueError(f"--min-bytes ({min_bytes}) is larger than --max-bytes ({max_bytes})")
    if factor < 2:
        raise ValueError(f"--factor must be at least 2, got {factor}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    if sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    return sizes


def element_count(op: str, nbytes: int, itemsize: int, nranks: int) -> int:
    """Elements of an `nbytes` message: rounded down to whole elements and, for ops that split
    the buffer among ranks, to a multiple of the rank count (at least one element per rank).

    Example:
        >>> element_count("allreduce", 4096, 4, 3), element_count("allgather", 4096, 4, 3)
        (1024, 1023)
    """
    count = nbytes // itemsize
    if op in PARTITIONED:
        count = max(nranks, count - count % nranks)
    return count


def bus_factor(op: str, nranks: int) -> float:
    """busbw / algbw as nccl-tests defines it (0 for reducing and exchanging ops on one rank).

    Example:
        >>> bus_factor("allreduce", 2), bus_factor("allgather", 4), bus_factor("broadcast", 4)
        (1.0, 0.75, 1.0)
    """
    if op == "broadcast":
        return 1.0
    if op == "allreduce":
        return 2.0 * (nranks - 1) / nranks
    if op in PARTITIONED:
        return (nranks - 1) / nranks
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def default_iters(nbytes: int) -> int:
    """Timed iterations for a size when --iters is not given: about TARGET_BYTES per size,
    between MIN_ITERS and MAX_ITERS, so a 4K..256M sweep stays short.

    Example:
        >>> default_iters(4096), default_iters(256 << 20)
        (200, 6)
    """
    return max(MIN_ITERS, min(MAX_ITERS, math.ceil(TARGET_BYTES / max(nbytes, 1))))


def value_bound(dtype: str, nranks: int, compression: str = "none") -> int:
    """Inputs are integers in [-bound, bound] ([0, bound] unsigned), small enough that every
    sum over `nranks` ranks is exact in the dtype and in the wire format.

    Example:
        >>> value_bound("float32", 2), value_bound("bfloat16", 64), value_bound("int8", 1000)
        (8, 4, 1)
    """
    limit = EXACT_LIMIT[dtype]
    if compression != "none" and dtype.startswith("float"):
        limit = min(limit, EXACT_LIMIT[compression])
    return max(1, min(8, limit // nranks))


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a --dtype name (bfloat16 through ml_dtypes).

    Example:
        >>> numpy_dtype("float16"), numpy_dtype("bfloat16").itemsize
        (dtype('float16'), 2)
    """
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def available_ops() -> list[str]:
    """The collectives this fastring provides, among the ones the bench knows.

    Example:
        >>> "allreduce" in available_ops()
        True
    """
    return [op for op in OPS if callable(getattr(fastring, op, None))]


# ---------------------------------------------------------------------------- arguments

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastring-bench",
        description="nccl-tests-style sweep of fastring collectives, optionally against MPI's own "
                    "collective on the same buffers. Run under fastring-run -np N.",
        epilog="example: fastring-run -np 2 fastring-bench --min-bytes 4K --max-bytes 256M --check --vs-mpi")
    p.add_argument("--op", default="allreduce",
                   help="collective(s): allreduce, allgather, broadcast, alltoall, reducescatter, "
                        "a comma-separated list of them, or 'all' (every one this fastring has); "
                        "default allreduce")
    p.add_argument("--min-bytes", default="4K", help="smallest message, e.g. 4K (default 4K)")
    p.add_argument("--max-bytes", default="256M", help="largest message, e.g. 256M (default 256M)")
    p.add_argument("--factor", type=int, default=2,
                   help="multiply the size by this between steps (default 2: doubling)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="element type (default float32)")
    p.add_argument("--compression", default="none", choices=COMPRESSIONS,
                   help="allreduce wire compression (fastring.Compression.fp16/bf16); default none")
    p.add_argument("--check", action="store_true",
                   help="verify every result against a NumPy reference (integer-valued inputs: exact)")
    p.add_argument("--vs-mpi", action="store_true",
                   help="also time the MPI library's own collective on the same buffers and print "
                        "the ratio MPI time / fastring time")
    p.add_argument("--in-place", action="store_true",
                   help="allreduce with out=tensor (input restored before each call, untimed) "
                        "instead of into a separate out= buffer")
    p.add_argument("--root", type=int, default=0, help="broadcast root rank (default 0)")
    p.add_argument("--iters", type=int, default=None,
                   help=f"timed iterations per size (default: by size, {MIN_ITERS}..{MAX_ITERS})")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed iterations per size before timing (default: iters/10, 1..5)")
    p.add_argument("--seed", type=int, default=SEED, help="seed of the inputs (same on every rank)")
    p.add_argument("--json", metavar="F", help="write every row and the run's metadata to F (rank 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress indicator on stderr")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate fastring-bench's arguments; usage errors exit with status 2.

    Adds `ops` (list), `sizes` (bytes) and `np_dtype` to the namespace. Checks that need only
    this process (op names, what this fastring provides, sizes, counts) are done here, so
    every rank fails the same way before any communication.

    Example:
        >>> a = parse_args(["--min-bytes", "4K", "--max-bytes", "16K"])
        >>> a.ops, a.sizes
        (['allreduce'], [4096, 8192, 16384])
    """
    p = _parser()
    args = p.parse_args(argv)
    args.ops = _select_ops(p, args.op)
    try:
        args.sizes = message_sizes(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes),
                                   args.factor)
    except ValueError as e:
        p.error(str(e))
    args.np_dtype = numpy_dtype(args.dtype)
    if args.sizes[0] < args.np_dtype.itemsize:
        p.error(f"--min-bytes {args.min_bytes} is smaller than one {args.dtype} element "
                f"({args.np_dtype.itemsize} bytes)")
    for flag in ("iters", "warmup"):
        value = getattr(args, flag)
        if value is not None and value < (1 if flag == "iters" else 0):
            p.error(f"--{flag} must be at least {1 if flag == 'iters' else 0}, got {value}")
    if args.compression != "none":
        if getattr(fastring, "Compression", None) is None:
            p.error(f"--compression {args.compression}: this fastring ({fastring.__version__}) has "
                    "no fastring.Compression")
        other = [op for op in args.ops if op not in COMPRESSIBLE]
        if other:
            p.error(f"--compression applies to {', '.join(COMPRESSIBLE)} only, not {', '.join(other)}")
    if args.in_place and args.ops != ["allreduce"]:
        p.error("--in-place applies to --op allreduce only (broadcast always runs in place)")
    if args.vs_mpi and args.dtype == "bfloat16":
        reducing = [op for op in args.ops if op in REDUCING]
        if reducing:
            p.error(f"--vs-mpi: MPI has no bfloat16 type to reduce in {', '.join(reducing)}; "
                    "use --dtype float16 or float32, or drop --vs-mpi")
    return args


def _select_ops(p: argparse.ArgumentParser, text: str) -> list[str]:
    have = available_ops()
    if text.strip() == "all":
        return have
    ops = [o.strip() for o in text.split(",") if o.strip()]
    for op in ops:
        if op not in OPS:
            p.error(f"--op: unknown collective {op!r}; choose from {', '.join(OPS)} or 'all'")
        if op not in have:
            p.error(f"--op {op}: fastring.{op} is not available in this fastring "
                    f"({fastring.__version__}); available: {', '.join(have)}")
    if not ops:
        p.error("--op: no collective given")
    return list(dict.fromkeys(ops))


# ---------------------------------------------------------------------------- one op, one size

@dataclasses.dataclass
class Case:
    """The buffers and calls of one op at one size on this rank.

    `run` maps "fastring" / "mpi" to a call returning the array to verify; `reset` (if any)
    runs before each call, untimed: when checking (to poison outputs) or always (`always_reset`,
    to restore an in-place input); `expected` is this rank's reference result (when checking).
    """

    op: str
    count: int
    run: dict[str, Callable[[], np.ndarray]]
    reset: Callable[[], None] | None = None
    always_reset: bool = False
    expected: np.ndarray | None = None
    _differs: np.ndarray | None = None   # scratch: no allocation per check

    def wrong(self, result: np.ndarray) -> int:
        """Elements of `result` that differ (bitwise) from the reference.

        Example:
            >>> c = Case("allreduce", 3, {}, expected=np.arange(3.0))
            >>> c.wrong(np.array([0.0, 1.0, 5.0])), c.wrong(np.zeros(2))
            (1, 3)
        """
        got = np.asarray(result)
        ref = self.expected
        if got.shape != ref.shape or got.dtype != ref.dtype:
            return int(ref.size)
        if self._differs is None:
            self._differs = np.empty(ref.size, np.bool_)
        bits = np.dtype(f"u{ref.dtype.itemsize}")
        np.not_equal(got.reshape(-1).view(bits), ref.reshape(-1).view(bits), out=self._differs)
        return int(np.count_nonzero(self._differs))


def rank_input(rank: int, count: int, dtype: np.dtype, bound: int, seed: int) -> np.ndarray:
    """Rank `rank`'s integer-valued input as int8 (every rank can rebuild every rank's input).

    Example:
        >>> x = rank_input(1, 5, np.dtype("float32"), 8, 0)
        >>> x.dtype, bool(np.all(np.abs(x) <= 8)), bool(np.all(x == rank_input(1, 5, np.dtype("float32"), 8, 0)))
        (dtype('int8'), True, True)
    """
    rng = np.random.default_rng([seed, rank])
    low = 0 if dtype.kind == "u" else -bound
    return rng.integers(low, bound + 1, count, dtype=np.int8)


def _poison(a: np.ndarray) -> Callable[[], None]:
    """A reset that fills `a` with a byte pattern no correct result here contains."""
    raw = a.reshape(-1).view(np.uint8)
    return lambda: raw.fill(0xA5)


def _mpi_buffer(a: np.ndarray) -> np.ndarray:
    """The array as mpi4py can send it: bfloat16 travels as its 16-bit patterns."""
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def build_case(op: str, count: int, args: argparse.Namespace, comm: MPI.Comm) -> Case:
    """Buffers, fastring and MPI calls and (with --check) the reference for `op` at `count`.

    Example (one rank):
        >>> a = parse_args(["--check"]); fastring.init()
        >>> c = build_case("allreduce", 8, a, MPI.COMM_WORLD); c.wrong(c.run["fastring"]())
        0
    """
    rank, n = comm.Get_rank(), comm.Get_size()
    dtype = args.np_dtype
    bound = value_bound(args.dtype, n, args.compression)
    part = count // n if op in PARTITIONED else count
    length = part if op == "allgather" else count          # of each rank's input
    # with --check every rank rebuilds every rank's input for the reference
    inputs = [rank_input(r, length, dtype, bound, args.seed)
              for r in (range(n) if args.check else [rank])]
    x = inputs[rank if args.check else 0].astype(dtype)
    name = f"fastring-bench.{op}"
    kw = {}
    if args.compression != "none":
        kw["compression"] = getattr(fastring.Compression, args.compression)
    counts, displs = [part] * n, [part * r for r in range(n)]

    def total(rows: slice = slice(None)) -> np.ndarray:
        acc = inputs[0][rows].astype(np.int32)
        for a in inputs[1:]:
            acc += a[rows]
        return acc.astype(dtype)

    if op == "allreduce":
        if args.in_place:
            pristine = x.copy()
            case = Case(op, count, {
                "fastring": lambda: fastring.allreduce(x, op=fastring.Sum, out=x, name=name, **kw),
                "mpi": lambda: (comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM), x)[1]},
                reset=lambda: np.copyto(x, pristine), always_reset=True)
        else:
            y = np.empty_like(x)
            case = Case(op, count, {
                "fastring": lambda: fastring.allreduce(x, op=fastring.Sum, out=y, name=name, **kw),
                "mpi": lambda: (comm.Allreduce(x, y, op=MPI.SUM), y)[1]}, reset=_poison(y))
        expected = total() if args.check else None
    elif op == "broadcast":
        root = args.root
        poison = _poison(x) if rank != root else None
        case = Case(op, count, {
            "fastring": lambda: fastring.broadcast(x, root, out=x, name=name),
            "mpi": lambda: (comm.Bcast(_mpi_buffer(x), root=root), x)[1]}, reset=poison)
        expected = inputs[root].astype(dtype) if args.check else None
    elif op == "allgather":
        y = np.empty(count, dtype)
        case = Case(op, count, {
            "fastring": lambda: fastring.allgather(x, name=name),
            "mpi": lambda: (comm.Allgatherv(_mpi_buffer(x), [_mpi_buffer(y), (counts, displs)]), y)[1]},
            reset=_poison(y))
        expected = np.concatenate(inputs).astype(dtype) if args.check else None
    elif op == "alltoall":
        y = np.empty(count, dtype)
        case = Case(op, count, {
            "fastring": lambda: fastring.alltoall(x, name=name),
            "mpi": lambda: (comm.Alltoallv([_mpi_buffer(x), (counts, displs)],
                                           [_mpi_buffer(y), (counts, displs)]), y)[1]},
            reset=_poison(y))
        mine = slice(rank * part, (rank + 1) * part)
        expected = np.concatenate([a[mine] for a in inputs]).astype(dtype) if args.check else None
    elif op == "reducescatter":
        y = np.empty(part, dtype)
        case = Case(op, count, {
            "fastring": lambda: fastring.reducescatter(x, op=fastring.Sum, name=name),
            "mpi": lambda: (comm.Reduce_scatter(x, y, recvcounts=counts, op=MPI.SUM), y)[1]},
            reset=_poison(y))
        expected = total(slice(rank * part, (rank + 1) * part)) if args.check else None
    else:
        raise ValueError(f"unknown op {op!r}")
    case.expected = expected
    return case


# ---------------------------------------------------------------------------- measuring

class Progress:
    """Progress of a sweep on rank 0's stderr: a line rewritten in place on a terminal, one
    line per size otherwise; silent when disabled.

    Example:
        >>> p = Progress(enabled=False); p.size("allreduce", 1, 17, 4096); p.clear()
    """

    def __init__(self, enabled: bool, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self._label = ""
        self._last = 0.0
        self._shown = False

    def size(self, op: str, index: int, total: int, nbytes: int) -> None:
        """Announce the `index`-th (1-based) of `total` sizes."""
        self._label = f"fastring-bench: {op} [{index}/{total}] {format_bytes(nbytes)}"
        if self.tty:
            self._write(self._label)
        elif self.enabled:
            print(self._label, file=self.stream, flush=True)

    def iteration(self, done: int, total: int) -> None:
        """On a terminal, show iterations done within the current size (at most 10 times a s)."""
        now = time.monotonic()
        if self.tty and now - self._last > 0.1:
            self._last = now
            self._write(f"{self._label}  iteration {done}/{total}")

    def clear(self) -> None:
        """Erase the progress line (before other output reaches the terminal)."""
        if self._shown:
            self._write("")

    def _write(self, text: str) -> None:
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()
        self._shown = bool(text)


def measure(case: Case, iters: int, warmup: int, check: bool, libraries: Sequence[str],
            comm: MPI.Comm, progress: Progress | None = None) -> dict[str, dict]:
    """Time each library's call on `case`: a barrier before every call, the libraries
    alternating in order each iteration; returns per library the median over iterations of
    the slowest rank's time (s) and the wrong elements summed over calls and ranks (None
    without check).

    Example (one rank):
        >>> a = parse_args(["--check"]); fastring.init()
        >>> r = measure(build_case("allreduce", 8, a, MPI.COMM_WORLD), 3, 1, True, ["fastring"], MPI.COMM_WORLD)
        >>> r["fastring"]["wrong"], r["fastring"]["time"] > 0
        (0, True)
    """
    times = {lib: np.empty(iters) for lib in libraries}
    wrong = {lib: 0 for lib in libraries}
    order = list(libraries)
    total = warmup + iters
    for i in range(total):
        for lib in order:
            if case.reset is not None and (check or case.always_reset):
                case.reset()
            comm.Barrier()
            t0 = time.perf_counter()
            result = case.run[lib]()
            elapsed = time.perf_counter() - t0
            if i >= warmup:
                times[lib][i - warmup] = elapsed
            if check:
                wrong[lib] += case.wrong(result)
        order.reverse()
        if progress is not None:
            progress.iteration(i + 1, total)
    out = {}
    for lib in libraries:
        comm.Allreduce(MPI.IN_PLACE, times[lib], op=MPI.MAX)
        out[lib] = {"time": float(np.median(times[lib])),
                    "wrong": comm.allreduce(wrong[lib]) if check else None}
    return out


def make_row(op: str, nbytes: int, count: int, dtype: str, nranks: int, iters: int, warmup: int,
             results: dict[str, dict]) -> dict:
    """One JSON row: size, count, and per library time (µs), algbw and busbw (GB/s, 1e9 B/s)
    and wrong elements; `ratio` is MPI time / fastring time when MPI was measured.

    Example:
        >>> r = make_row("allreduce", 4000, 1000, "float32", 2, 5, 1, {"fastring": {"time": 1e-6, "wrong": 0}})
        >>> r["fastring"]["algbw"], r["fastring"]["busbw"], r["mpi"], r["ratio"]
        (4.0, 4.0, None, None)
    """
    row = {"op": op, "bytes": nbytes, "count": count, "dtype": dtype, "iters": iters,
           "warmup": warmup, "fastring": None, "mpi": None, "ratio": None}
    for lib, res in results.items():
        algbw = nbytes / res["time"] / 1e9 if res["time"] > 0 else 0.0
        row[lib] = {"time_us": res["time"] * 1e6, "algbw": algbw,
                    "busbw": algbw * bus_factor(op, nranks), "wrong": res["wrong"]}
    if row["mpi"] is not None and row["fastring"]["time_us"] > 0:
        row["ratio"] = row["mpi"]["time_us"] / row["fastring"]["time_us"]
    return row


# ---------------------------------------------------------------------------- table

_LIB_HEAD = ("{:>10} {:>7} {:>7} {:>7}".format("time", "algbw", "busbw", "#wrong"),
             "{:>10} {:>7} {:>7} {:>7}".format("(us)", "(GB/s)", "(GB/s)", ""))


def _fmt_time(us: float) -> str:
    return f"{us:.0f}" if us >= 10000 else f"{us:.1f}" if us >= 1000 else f"{us:.2f}"


def _fmt_lib(res: dict) -> str:
    wrong = "N/A" if res["wrong"] is None else str(res["wrong"])
    return f"{_fmt_time(res['time_us']):>10} {res['algbw']:7.2f} {res['busbw']:7.2f} {wrong:>7}"


def table_header(op: str, with_mpi: bool) -> list[str]:
    """The column header lines of one op's table (each starts with '#').

    Example:
        >>> table_header("allreduce", False)[1].split()[:4]
        ['#', 'size', 'count', 'type']
    """
    lead = "#{:>12} {:>12} {:>9}".format("", "", "")
    title = lead + " {:^34}".format("fastring")
    names = "#{:>12} {:>12} {:>9} ".format("size", "count", "type") + _LIB_HEAD[0]
    units = "#{:>12} {:>12} {:>9} ".format("(B)", "(elements)", "") + _LIB_HEAD[1]
    if with_mpi:
        title += " {:^34}".format(MPI_NAMES[op])
        names += " " + _LIB_HEAD[0] + " {:>7}".format("ratio")
        units += " " + _LIB_HEAD[1] + " {:>7}".format("MPI/fr")
    return [title.rstrip(), names, units.rstrip()]


def table_row(row: dict) -> str:
    """One data line of the table.

    Example:
        >>> r = make_row("broadcast", 4096, 1024, "float32", 2, 5, 1, {"fastring": {"time": 2e-6, "wrong": 0}})
        >>> table_row(r).split()
        ['4096', '1024', 'float32', '2.00', '2.05', '2.05', '0']
    """
    line = f" {row['bytes']:>12} {row['count']:>12} {row['dtype']:>9} " + _fmt_lib(row["fastring"])
    if row["mpi"] is not None:
        line += " " + _fmt_lib(row["mpi"]) + f" {row['ratio']:7.2f}"
    return line


def table_footer(rows: list[dict], check: bool) -> list[str]:
    """Summary lines: average busbw per library (as nccl-tests) and the wrong-result count.

    Example:
        >>> r = make_row("allreduce", 4000, 1000, "float32", 2, 5, 1, {"fastring": {"time": 1e-6, "wrong": 0}})
        >>> table_footer([r], True)
        ['# Avg bus bandwidth    : fastring 4.000 GB/s', '# Wrong results        : 0 (every result checked)']
    """
    libs = ["fastring"] + (["mpi"] if rows and rows[0]["mpi"] is not None else [])
    avg = ", ".join(f"{'MPI' if lib == 'mpi' else lib} {np.mean([r[lib]['busbw'] for r in rows]):.3f} GB/s"
                    for lib in libs)
    lines = [f"# Avg bus bandwidth    : {avg}"]
    if check:
        wrong = sum(r[lib]["wrong"] for r in rows for lib in libs)
        lines.append(f"# Wrong results        : {wrong} (every result checked)")
    else:
        lines.append("# Wrong results        : not checked (use --check)")
    return lines


# ---------------------------------------------------------------------------- metadata

def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), which the benchmarks record: this project's
    figures moved with it (BENCHMARKS.md, "Round 2, session 8").

    Example:
        >>> isinstance(cpu_model(), str)
        True
    """
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def memory_ceiling(nbytes: int = 256 << 20, repeat: int = 5) -> dict[str, float]:
    """This core's array bandwidth (GB/s of one array's bytes, medians): np.copyto and
    np.add(a, b, out=a), the ceilings BENCHMARKS.md gives beside the results ("Machine and
    versions").

    Example:
        >>> sorted(memory_ceiling(1 << 20, 2))
        ['add_gbs', 'copy_gbs']
    """
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    np.copyto(a, b)  # touch every page before timing
    calls = {"copy_gbs": lambda: np.copyto(a, b), "add_gbs": lambda: np.add(a, b, out=a)}
    return {key: nbytes / float(np.median(timeit.repeat(fn, number=1, repeat=repeat))) / 1e9
            for key, fn in calls.items()}


def run_metadata(args: argparse.Namespace, comm: MPI.Comm, argv: Sequence[str]) -> dict:
    """What a reader needs to reproduce or judge a run: command, ranks and hosts, versions,
    fastring configuration, options. Collective (gathers host names).

    Example (one rank):
        >>> m = run_metadata(parse_args([]), MPI.COMM_WORLD, [])
        >>> m["np"], m["command"]
        (1, 'fastring-bench')
    """
    import numba

    hosts = comm.allgather(socket.gethostname())
    return {
        "command": shlex.join(["fastring-bench", *argv]),
        "np": comm.Get_size(),
        "hosts": {h: hosts.count(h) for h in dict.fromkeys(hosts)},
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                 "machine": platform.machine(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
                 "python": platform.python_version()},
        "versions": {"fastring": fastring.__version__, "numpy": np.__version__,
                     "numba": numba.__version__, "mpi4py": sys.modules["mpi4py"].__version__,
                     "mpi_library": " ".join(MPI.Get_library_version().splitlines()[0].split()),
                     "mpi_standard": "{}.{}".format(*MPI.Get_version())},
        "config": {k: v for k, v in sorted(os.environ.items()) if k.startswith("FASTRING_")},
        "options": {"ops": args.ops, "dtype": args.dtype, "compression": args.compression,
                    "check": args.check, "vs_mpi": args.vs_mpi, "in_place": args.in_place,
                    "root": args.root, "iters": args.iters, "warmup": args.warmup,
                    "seed": args.seed, "min_bytes": args.sizes[0], "max_bytes": args.sizes[-1],
                    "factor": args.factor},
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ---------------------------------------------------------------------------- main

def _ranks(n: int) -> str:
    return f"{n} rank" + ("s" if n != 1 else "")


def run_op(op: str, args: argparse.Namespace, comm: MPI.Comm, progress: Progress,
           emit: Callable[[str], None]) -> list[dict]:
    """Sweep one op over args.sizes, emitting the table as it goes; returns the rows.

    Example (one rank):
        >>> a = parse_args(["--max-bytes", "4K"]); fastring.init()
        >>> [r["bytes"] for r in run_op("allreduce", a, MPI.COMM_WORLD, Progress(False), lambda s: None)]
        [4096]
    """
    n = comm.Get_size()
    libraries = ["fastring"] + (["mpi"] if args.vs_mpi else [])
    detail = {"allreduce": "sum, " + ("in place (out=tensor)" if args.in_place else "out= buffer"),
              "reducescatter": "sum, returns a new tensor", "allgather": "returns a new tensor",
              "alltoall": "equal splits, returns a new tensor",
              "broadcast": f"root {args.root}, in place"}[op]
    emit(f"#\n# {op}: {detail}; dtype {args.dtype}, compression {args.compression}, {_ranks(n)}")
    for line in table_header(op, args.vs_mpi):
        emit(line)
    rows = []
    for index, nbytes in enumerate(args.sizes, 1):
        progress.size(op, index, len(args.sizes), nbytes)
        count = element_count(op, nbytes, args.np_dtype.itemsize, n)
        iters = args.iters or default_iters(nbytes)
        warmup = args.warmup if args.warmup is not None else max(1, min(5, iters // 10))
        case = build_case(op, count, args, comm)
        results = measure(case, iters, warmup, args.check, libraries, comm, progress)
        del case
        row = make_row(op, count * args.np_dtype.itemsize, count, args.dtype, n, iters, warmup, results)
        rows.append(row)
        emit(table_row(row))
    for line in table_footer(rows, args.check):
        emit(line)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `fastring-bench` console script; returns the exit status
    (0, or 1 when --check found a wrong result).

    Example:
        fastring-run -np 2 fastring-bench --op all --min-bytes 4K --max-bytes 1M --check --vs-mpi --json run.json
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    size = MPI.COMM_WORLD.Get_size()
    if not 0 <= args.root < size:
        _parser().error(f"--root {args.root} is not a rank of this {size}-rank job")
    fastring.init()
    comm = MPI.COMM_WORLD.Dup()
    rank = comm.Get_rank()
    meta = run_metadata(args, comm, argv)
    if args.json and rank == 0:
        meta["ceiling"] = memory_ceiling()
    comm.Barrier()

    progress = Progress(enabled=rank == 0 and not args.no_progress)

    def emit(line: str) -> None:
        if rank == 0:
            progress.clear()
            print(line, flush=True)

    emit(f"# fastring-bench: fastring {fastring.__version__}, {_ranks(meta['np'])} on "
         f"{len(meta['hosts'])} host(s), {meta['versions']['mpi_library']}")
    emit(f"# {meta['command']}")
    rows = []
    try:
        for op in args.ops:
            rows += run_op(op, args, comm, progress, emit)
    finally:
        progress.clear()
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=1)
    wrong = sum((r[lib] or {}).get("wrong") or 0 for r in rows for lib in ("fastring", "mpi"))
    comm.Free()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
