"""Allreduce times across (simulated) hosts, every variant on the same buffers in one launch,
interleaved call by call so that a busy machine slows them alike: MPI's own MPI_Allreduce,
fastring.allreduce as chosen automatically, the same with fp16 compression, and the two
algorithms themselves on the same Reduction: the flat ring and (where the job has one) the
hierarchy. Each time is the slowest rank's, per call; median and minimum over the calls.

usage (root):
    fastring-run --sim-hosts 2 -np 4 --link-rate 5gbit python scripts/multihost_bench.py \
        --sizes 4K,1M,16M,64M --json out.json
"""
from __future__ import annotations

import argparse
import json

import numpy as np
from mpi4py import MPI

import fastring
from fastring._core.dtypes import spec_of
from fastring._core.ops import ReduceOp
from fastring._core.runtime import runtime
from fastring.algorithms import Hierarchical, Reduction, Ring, choose

# Enough calls for a stable median without one size taking more than a few seconds.
TARGET_BYTES_PER_SIZE = 256 << 20


def parse_size(text: str) -> int:
    """'4K' -> 4096, '16M' -> 16777216."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def variants(rt, comm: MPI.Comm, src: np.ndarray, out: np.ndarray) -> dict:
    """name -> (algorithm that runs, the call)."""
    spec = spec_of("float32")
    fp16 = fastring.Compression.fp16
    found = {
        "mpi": ("MPI_Allreduce", lambda: comm.Allreduce(src, out, MPI.SUM)),
        "fastring": (choose("allreduce", src.nbytes, spec, rt=rt, setting="auto").name,
                     lambda: fastring.allreduce(src, op=fastring.Sum, out=out, name="bench")),
        "fp16": (choose("allreduce", src.nbytes, spec, wire="fp16", rt=rt, setting="auto").name,
                 lambda: fastring.allreduce(src, op=fastring.Sum, out=out, compression=fp16, name="bench16")),
        "flat_ring": ("ring", lambda: Ring.run(rt, Reduction(out, spec, ReduceOp.Sum, src=src))),
    }
    if rt.hierarchy is not None:
        found["hierarchical"] = ("hierarchical", lambda: Hierarchical.run(rt, Reduction(out, spec, ReduceOp.Sum,
                                                                                          src=src)))
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4K,1M,16M", help="message sizes in bytes (K/M suffixes)")
    p.add_argument("--json", help="write the rows to this file (rank 0)")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    fastring.init()
    rt = runtime()
    rows = []
    for nbytes in map(parse_size, args.sizes.split(",")):
        src = np.random.default_rng(comm.rank).standard_normal(nbytes // 4).astype(np.float32)
        out = np.empty_like(src)
        calls = variants(rt, comm, src, out)
        iters = int(min(100, max(5, TARGET_BYTES_PER_SIZE // nbytes)))
        times = np.zeros((len(calls), iters))
        for _, call in calls.values():
            call()  # warm-up
        for i in range(iters):
            for k, (_, call) in enumerate(calls.values()):
                comm.Barrier()
                start = MPI.Wtime()
                call()
                times[k, i] = MPI.Wtime() - start
        comm.Allreduce(MPI.IN_PLACE, times, MPI.MAX)
        for k, (mode, (algorithm, _)) in enumerate(calls.items()):
            row = {"mode": mode, "algorithm": algorithm, "bytes": nbytes, "ranks": comm.size,
                   "hosts": fastring.cross_size(), "iters": iters,
                   "median_s": float(np.median(times[k])), "min_s": float(np.min(times[k]))}
            rows.append(row)
            if comm.rank == 0:
                print(json.dumps(row), flush=True)
    fastring.shutdown()
    if comm.rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
