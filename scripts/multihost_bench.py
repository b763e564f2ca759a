"""Collective times across (simulated) hosts, every variant on the same buffers in one launch,
interleaved call by call so that a busy machine slows them alike. Allreduce: MPI's own
MPI_Allreduce, fastring.allreduce as chosen automatically, the same with fp16 compression,
and the two algorithms themselves on the same Reduction: the flat ring and (where the job has
one) the hierarchy. With --collectives allreduce,allgather also the allgather (a size is its
result, each rank giving 1/N of it): MPI_Allgather, fastring.allgather as chosen, the flat ring
and (where there is a host segment) the hierarchical one. Each time is the slowest rank's, per call; median and minimum over the calls.

usage (root):
    fastring-run --sim-hosts 2 -np 4 --link-rate 5gbit python scripts/multihost_bench.py \
        --sizes 4K,1M,16M,64M [--collectives allreduce,allgather] --json out.json
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
from fastring._transport import array_address
from fastring.algorithms import Hierarchical, Reduction, Ring, choose, hierarchical

# Enough calls for a stable median without one size taking more than a few seconds.
TARGET_BYTES_PER_SIZE = 256 << 20


def parse_size(text: str) -> int:
    """'4K' -> 4096, '16M' -> 16777216."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def variants(rt, comm: MPI.Comm, src: np.ndarray, out: np.ndarray) -> dict:
    """Allreduce: name -> (algorithm that runs, the call)."""
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


def allgather_variants(rt, comm: MPI.Comm, nbytes: int) -> dict:
    """Allgather of an nbytes result, 1/N from each rank: name -> (algorithm, the call)."""
    rows = max(1, nbytes // 4 // comm.size)
    mine = np.full(rows, comm.rank, np.float32)
    out = np.empty(rows * comm.size, np.float32)
    offsets = np.arange(comm.size + 1, dtype=np.int64) * mine.nbytes
    own = array_address(mine)

    def flat():
        out[comm.rank * rows:(comm.rank + 1) * rows] = mine
        rt.transport.ring_allgather(array_address(out), offsets, own=own)

    def hier():
        out[comm.rank * rows:(comm.rank + 1) * rows] = mine
        hierarchical.allgather(rt, out, offsets)

    pays = hierarchical.allgather_pays(rt, out.nbytes)
    found = {
        "allgather_mpi": ("MPI_Allgather", lambda: comm.Allgather(mine, out)),
        "allgather": ("hierarchical" if pays else "ring", lambda: fastring.allgather(mine, name="bench ag")),
        "allgather_flat": ("ring", flat),
    }
    if pays:
        found["allgather_hier"] = ("hierarchical", hier)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4K,1M,16M", help="message sizes in bytes (K/M suffixes)")
    p.add_argument("--collectives", default="allreduce", help="allreduce, allgather or both")
    p.add_argument("--json", help="write the rows to this file (rank 0)")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    fastring.init()
    rt = runtime()
    rows = []
    for nbytes in map(parse_size, args.sizes.split(",")):
        calls = {}
        for collective in args.collectives.split(","):
            if collective == "allreduce":
                src = np.random.default_rng(comm.rank).standard_normal(nbytes // 4).astype(np.float32)
                calls.update(variants(rt, comm, src, np.empty_like(src)))
            elif collective == "allgather":
                calls.update(allgather_variants(rt, comm, nbytes))
            else:
                p.error(f"unknown collective {collective!r}")
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
