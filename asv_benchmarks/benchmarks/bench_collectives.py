"""Collectives on 2 ranks, launched as `mpiexec -n 2 python -m fastring.tools.bench` (the mpiexec
beside this Python), tracked as busbw in GB/s (nccl-tests' definition), with MPI's own
collective measured in the same run on the same buffers, and their ratio.

One launch per class (asv's setup_cache) measures every size; each track_ picks its row.
Collectives this fastring lacks, and compression before fastring.Compression exists, are
skipped (NotImplementedError in setup)."""
from __future__ import annotations

from .common import KIB, MIB, bench_rows

OPS = ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]  # fastring.tools.bench.OPS
RANKS = 2
SIZES = [64 * KIB, 16 * MIB]
SWEEP = ["--min-bytes", str(SIZES[0]), "--max-bytes", str(SIZES[-1]), "--factor", "256",
         "--iters", "20", "--warmup", "3", "--check", "--vs-mpi"]


def _pick(rows: list[dict] | None, op: str, nbytes: int) -> dict:
    for row in rows or ():
        if row["op"] == op and row["bytes"] == nbytes:
            return row
    raise NotImplementedError(f"no {op} row of {nbytes} bytes: not available in this fastring")


class _Tracks:
    """busbw of fastring and MPI, and the time ratio, for the row that setup picked."""

    timeout = 600

    def track_busbw(self, *_) -> float:
        return self.row["fastring"]["busbw"]

    track_busbw.unit = "GB/s"

    def track_mpi_busbw(self, *_) -> float:
        return self.row["mpi"]["busbw"]

    track_mpi_busbw.unit = "GB/s"

    def track_ratio(self, *_) -> float:
        return self.row["ratio"]

    track_ratio.unit = "MPI time / fastring time"


class Collectives(_Tracks):
    params = (OPS, SIZES)
    param_names = ["op", "bytes"]

    def setup_cache(self) -> list[dict]:
        return bench_rows(RANKS, ["--op", "all", *SWEEP])

    def setup(self, rows: list[dict], op: str, nbytes: int) -> None:
        self.row = _pick(rows, op, nbytes)


class CompressedAllreduce(_Tracks):
    params = (["fp16", "bf16"], SIZES)
    param_names = ["compression", "bytes"]

    def setup_cache(self) -> dict[str, list[dict]] | None:
        import fastring

        if getattr(fastring, "Compression", None) is None:
            return None
        return {c: bench_rows(RANKS, ["--op", "allreduce", "--compression", c, *SWEEP])
                for c in self.params[0]}

    def setup(self, rows: dict[str, list[dict]] | None, compression: str, nbytes: int) -> None:
        if rows is None:
            raise NotImplementedError("fastring.Compression is not available in this fastring")
        self.row = _pick(rows[compression], "allreduce", nbytes)
