"""What Average costs over Sum: fastring.allreduce in place, float32, the same buffer, Sum and
Average timed in alternation in one launch (Average's division runs where each piece is reduced,
so it should cost next to nothing over the sum).

Run (np=2 is the performance configuration on a 2-core machine):
    fastring-run -np 2 python scripts/bench_average.py [--sizes 1M,16M,96M] [--iters 10]
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
from mpi4py import MPI

import fastring
from bench_shm import timed
from fastring.tools.bench import format_bytes, parse_bytes


def per_call(comm, x: np.ndarray, op, iters: int) -> list[float]:
    """Seconds per call, the slowest rank's, after one untimed call."""
    def call():
        fastring.allreduce(x, op=op, out=x)
    call()
    return [timed(call, 1, comm, barrier=True) for _ in range(iters)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,16M,96M", help="message sizes, comma-separated")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per op per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    fastring.init()
    if comm.rank == 0:
        print(f"np={comm.size}, float32, in place; ms per call, the slowest rank's (median / min)")
        print(f"{'size':>8} {'Sum':>16} {'Average':>16} {'Average / Sum':>14}")
    for size in (parse_bytes(s) for s in args.sizes.split(",")):
        x = np.ones(size // 4, np.float32)
        times: dict = {fastring.Sum: [], fastring.Average: []}
        for _ in range(args.rounds):
            for op in times:
                times[op] += per_call(comm, x, op, args.iters)
        if comm.rank == 0:
            s, a = (statistics.median(times[op]) * 1e3 for op in times)
            print(f"{format_bytes(size):>8} {s:>9.3f} / {min(times[fastring.Sum]) * 1e3:.3f} "
                  f"{a:>9.3f} / {min(times[fastring.Average]) * 1e3:.3f} {a / s:>14.2f}")


if __name__ == "__main__":
    main()
