"""How fastring's reducescatter should move its input on one host: through the ring, or
through the shared segment in rounds of a given size per rank's part, against
MPI_Reduce_scatter_block, alternating in one launch (what chose SHM_REDUCESCATTER_ROUND_BYTES
and SHM_REDUCESCATTER_MAX_BYTES; every way's result must be the same bits).

Run (np=2 is the performance configuration on a 2-core machine):
    fastring-run -np 2 python scripts/bench_reducescatter.py [--sizes 1M,8M,16M] [--rounds 4M,256K]
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
from mpi4py import MPI

import fastring
import fastring.algorithms.collectives as collectives
from bench_shm import timed
from fastring._core.runtime import runtime
from fastring.tools.bench import format_bytes, parse_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,2M,4M,8M,16M,32M", help="input bytes per rank, comma-separated")
    parser.add_argument("--rounds", default="4M,512K,256K", help="segment round bytes to compare, comma-separated")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10, help="calls per trial, each after a barrier")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    fastring.init()
    segment = runtime().shm
    if segment is None:
        raise SystemExit("no shared segment: run every rank on one host with FASTRING_SHM=1")
    ways = ["ring", *(f"rounds {r}" for r in args.rounds.split(",")), "MPI"]
    if comm.rank == 0:
        print(f"np={comm.size}, float32 Sum; µs per call, the slowest rank's (min / median over trials)")
        print(f"{'input':>8} " + " ".join(f"{w:>18}" for w in ways))
    saved = (collectives.SHM_REDUCESCATTER_MAX_BYTES, segment.reduce_scatter_round_bytes)
    try:
        for size in (parse_bytes(s) for s in args.sizes.split(",")):
            x = np.random.default_rng(comm.rank).standard_normal(size // 4).astype(np.float32)
            recv = np.empty(size // 4 // comm.size, np.float32)
            times: dict = {w: [] for w in ways}
            results: dict = {}

            def call(way):
                if way == "MPI":
                    comm.Reduce_scatter_block(x, recv, MPI.SUM)
                    return
                collectives.SHM_REDUCESCATTER_MAX_BYTES = 0 if way == "ring" else 1 << 62
                if way != "ring":
                    segment.reduce_scatter_round_bytes = parse_bytes(way.split()[1])
                results[way] = fastring.reducescatter(x, op=fastring.Sum)
            for _ in range(args.trials):
                for way in ways:
                    times[way].append(timed(lambda: call(way), args.calls, comm, barrier=True))
            if len({r.tobytes() for w, r in results.items() if w != "ring"}) > 1:
                raise SystemExit(f"the segment's rounds gave different results at {format_bytes(size)}")
            if comm.rank == 0:
                print(f"{format_bytes(size):>8} " + " ".join(
                    f"{min(t) * 1e6:>8.1f} / {statistics.median(t) * 1e6:<7.1f}" for t in times.values()))
    finally:
        collectives.SHM_REDUCESCATTER_MAX_BYTES, segment.reduce_scatter_round_bytes = saved


if __name__ == "__main__":
    main()
