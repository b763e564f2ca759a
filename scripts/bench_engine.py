"""Engine figures for BENCHMARKS.md, each against MPI_Allreduce on the same buffers in one run:
  * grouped_allreduce of 100 float32 tensors of 40 KB each vs 100 MPI_Allreduce calls;
  * 100 allreduce_async calls (fused by the engine) + waits vs the same 100 MPI calls;
  * the latency of one synchronous 4 KiB allreduce (named, so negotiation is cached) vs MPI.

usage: fastring-run -np 2 python scripts/bench_engine.py [--reps 200]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import fastring


def median_us(fn, reps: int, comm) -> float:
    times = []
    for _ in range(reps):
        comm.Barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    fastring.init()
    comm = MPI.COMM_WORLD
    tensors = [np.full(10_000, 1.0, np.float32) for _ in range(100)]  # 40 KB each
    names = [f"grad.{i}" for i in range(100)]

    def mpi_loop():
        for t in tensors:
            comm.Allreduce(MPI.IN_PLACE, t, MPI.SUM)

    def grouped():
        fastring.grouped_allreduce(tensors, op=fastring.Sum, name="grads")

    def async_fused():
        handles = [fastring.allreduce_async(t, op=fastring.Sum, name=n, out=t) for t, n in zip(tensors, names)]
        for h in handles:
            h.wait()

    small = np.ones(1024, np.float32)

    def mpi_small():
        comm.Allreduce(MPI.IN_PLACE, small, MPI.SUM)

    def fastring_small():
        fastring.allreduce(small, op=fastring.Sum, name="small", out=small)

    rows = []
    for label, ours, theirs, reps in (
            ("grouped_allreduce 100 x 40 KB", grouped, mpi_loop, args.reps),
            ("100 x allreduce_async 40 KB (fused)", async_fused, mpi_loop, args.reps),
            ("allreduce 4 KiB, synchronous", fastring_small, mpi_small, 20 * args.reps)):
        for _ in range(5):  # warm up: compile kernels, fill the response cache
            ours(), theirs()
        mpi_us = median_us(theirs, reps, comm)
        ours_us = median_us(ours, reps, comm)
        rows.append((label, ours_us, mpi_us))
    if comm.rank == 0:
        print(f"np={comm.size}, medians of {args.reps} (latency: {20 * args.reps}) runs")
        print(f"| {'case':38s} | fastring µs | MPI µs | MPI / fastring |")
        print(f"|{'-' * 40}|-------------|--------|----------------|")
        for label, ours_us, mpi_us in rows:
            print(f"| {label:38s} | {ours_us:11.1f} | {mpi_us:6.1f} | {mpi_us / ours_us:14.2f} |")


if __name__ == "__main__":
    main()
