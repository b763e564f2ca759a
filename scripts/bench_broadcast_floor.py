"""What a broadcast on two ranks of one host costs, in one launch on the same buffer; medians
of the slowest rank (BENCHMARKS.md, issue #4):

- one MPI point-to-point message of the whole buffer, or the buffer split into 2, 4 or 16
  concurrent messages: on two ranks that is all a broadcast made of messages can do;
- MPI_Bcast;
- fastring.broadcast in place, which on one host copies straight between the two processes
  (`single_copy_broadcast`): the root writes part of the bytes into the other rank while that
  rank reads the rest, where with messages only the receiver copies.

usage: fastring-run -np 2 python scripts/bench_broadcast_floor.py [--sizes-mib 1 16]
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import fastring
from bench_engine import median_us  # scripts/ is on sys.path when a script in it runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--reps", type=int, default=100)
    args = parser.parse_args()
    fastring.init()
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        raise SystemExit("run on exactly 2 ranks")
    if comm.rank == 0:
        print("| size | 1 message | 2 messages | 4 messages | 16 messages | MPI_Bcast | fastring.broadcast |")
        print("|---|---|---|---|---|---|---|")
    for mib in args.sizes_mib:
        buf = np.ones(mib << 20, np.uint8)
        row = []
        for parts in (1, 2, 4, 16):
            chunks = np.array_split(buf, parts)

            def p2p(chunks=chunks):
                if comm.rank == 0:
                    MPI.Request.Waitall([comm.Isend(c, 1, tag=i) for i, c in enumerate(chunks)])
                else:
                    MPI.Request.Waitall([comm.Irecv(c, 0, tag=i) for i, c in enumerate(chunks)])
            row.append(comm.allreduce(median_us(p2p, args.reps, comm), op=MPI.MAX))
        row.append(comm.allreduce(median_us(lambda: comm.Bcast(buf, 0), args.reps, comm), op=MPI.MAX))
        row.append(comm.allreduce(median_us(lambda: fastring.broadcast(buf, 0, out=buf, name="b"),
                                            args.reps, comm), op=MPI.MAX))
        if comm.rank == 0:
            print(f"| {mib} MiB | " + " | ".join(f"{t:.1f} µs" for t in row) + " |", flush=True)


if __name__ == "__main__":
    main()
