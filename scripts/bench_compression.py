"""Compressed against uncompressed allreduce, in one launch on the same buffers (BENCHMARKS.md):
float32 Average of 1, 16, 64 and 256 MiB with Compression.none, fp16 and bf16, interleaved per
iteration so that machine noise hits all three alike; medians of the slowest rank's times.
The "copy once" column is every rank copying its buffer once (np.copyto, all ranks at the
same time), in the same loop: a floor for any allreduce that reads its input and writes its
output, on a host where the wire is memory.

usage: fastring-run -np 2 python scripts/bench_compression.py [--sizes-mib 1 16 64 256]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import fastring
from fastring import Compression


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 64, 256])
    args = parser.parse_args()
    fastring.init()
    comm = MPI.COMM_WORLD
    compressions = (Compression.none, Compression.fp16, Compression.bf16)
    if comm.rank == 0:
        print(f"np={comm.size}, float32 Average, times in ms (median of the slowest rank)")
        print("| size | none | fp16 | bf16 | copy once | none / fp16 | none / bf16 | none / copy once "
              "| max rel. error fp16 | bf16 |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    for mib in args.sizes_mib:
        count = mib * 2**20 // 4
        x = np.random.default_rng(comm.rank).standard_normal(count).astype(np.float32)
        # Each case writes its own output: a buffer the other rank has just copied out of
        # (uncompressed, it reads this rank's finished chunk) is slow to overwrite, so a
        # shared output would charge one case for what the previous one left behind.
        outs = {name: np.empty_like(x) for name in [c.name for c in compressions] + ["copy"]}
        reps = max(5, min(50, 2048 // mib))
        cases = {c.name: (lambda c=c: fastring.allreduce(x, compression=c, out=outs[c.name],
                                                         name=f"c{mib}"))
                 for c in compressions}
        cases["copy"] = lambda: np.copyto(outs["copy"], x)
        times = {name: [] for name in cases}
        for i in range(reps + 2):
            for name, run in cases.items():
                comm.Barrier()
                t = time.perf_counter()
                run()
                dt = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
                if i >= 2:  # warm-up: compile kernels, fill caches
                    times[name].append(dt)
        exact = fastring.allreduce(x, out=np.empty_like(x))
        scale = float(np.max(np.abs(exact))) or 1.0
        errors = {c.name: float(np.max(np.abs(fastring.allreduce(x, compression=c) - exact))) / scale
                  for c in compressions[1:]}
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        if comm.rank == 0:
            print(f"| {mib} MiB | {med['none']:.2f} | {med['fp16']:.2f} | {med['bf16']:.2f} | "
                  f"{med['copy']:.2f} | {med['none'] / med['fp16']:.2f} | {med['none'] / med['bf16']:.2f} | "
                  f"{med['none'] / med['copy']:.2f} | {errors['fp16']:.1e} | {errors['bf16']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
