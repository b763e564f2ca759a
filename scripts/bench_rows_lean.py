"""The lean synchronous allgather and alltoall (Engine.lone_run: no Request, the row counts in
the negotiation cycle) against the same call made as a Request (Engine.run: the counts in the
segment's barrier), and MPI, alternating trial by trial in one launch (BENCHMARKS.md, "Round 2,
session 6: allgather and alltoall (issue #18)").

usage: fastring-run -np 2 python scripts/bench_rows_lean.py [--sizes 8,1M,16M]
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import fastring
from fastring._core.runtime import runtime
from fastring.api import collectives as api
from fastring.tools.bench import format_bytes, parse_bytes

from bench_shm import calls_for, compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,1M,16M", help="bytes of each rank's input")
    args = parser.parse_args()
    fastring.init()
    comm, engine = MPI.COMM_WORLD, runtime().engine
    n = comm.Get_size()
    for nbytes in [parse_bytes(s) for s in args.sizes.split(",")]:
        count = max(n, nbytes // 4)
        x, gathered = np.ones(count, np.float32), np.empty(count * n, np.float32)
        a2a_in = np.ones(count - count % n, np.float32)
        a2a_out = np.empty_like(a2a_in)
        calls, trials = calls_for(nbytes)
        cases = (("allgather", lambda: fastring.allgather(x, name="ag"),
                  lambda: engine.run(api._request_of(*api._allgather_parts(x, "ag.request", None))),
                  lambda: comm.Allgather(x, gathered)),
                 ("alltoall", lambda: fastring.alltoall(a2a_in, name="a2a"),
                  lambda: engine.run(api._request_of(*api._alltoall_parts(a2a_in, None, "a2a.request", None))),
                  lambda: comm.Alltoall(a2a_in, a2a_out)))
        for what, lean, request, mpi in cases:
            # MPI rides as compare's one "floor": its median comes back alongside, same trials
            row = compare(lean, request, calls, trials, comm, floor=(mpi,))
            theirs = row["floors_us"][0]
            if comm.Get_rank() == 0:
                print(f"{what:<10} {format_bytes(nbytes):>8}  lean {row['fastring_us']:9.1f} us  "
                      f"request {row['mpi_us']:9.1f} us ({row['ratio']:.2f}x)  "
                      f"MPI {theirs:9.1f} us (MPI / lean {theirs / row['fastring_us']:.2f}, "
                      f"MPI / request {theirs / row['mpi_us']:.2f})")

if __name__ == "__main__":
    main()
