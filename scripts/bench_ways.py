"""Each way a one-host broadcast, allgather and alltoall can take, forced, against MPI in the
same launch: streamed through the segment, by single copy, written straight into the results
(allgather and alltoall, whose results come from the segment's results area), and MPI_Bcast /
MPI_Allgather / MPI_Alltoall; np=2, float32, trials alternating, median µs per call. What
`algorithms.choice.TimedChoice` chooses between on the user's calls, and what the results area
saves (BENCHMARKS.md, "Round 2, sessions 8 and 9").

usage: fastring-run -np 2 python scripts/bench_ways.py [--sizes 1M,16M]
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import fastring
from fastring._core.runtime import runtime
from fastring._transport.shm import EXCHANGE_DIRECT
from fastring.algorithms import choice, collectives
from fastring.tools.bench import cpu_model, format_bytes, parse_bytes

from bench_shm import calls_for, timed

_EXCHANGE_WAYS = {"direct": EXCHANGE_DIRECT, **collectives._EXCHANGE_WAYS}
_pick, _exchange = choice.TimedChoice.pick, collectives._exchange


def forced(way: str | None):
    """Make every one-host broadcast (its TimedChoice), allgather and alltoall run `way`
    (None: choose as usual)."""
    if way is None:
        choice.TimedChoice.pick, collectives._exchange = _pick, _exchange
    else:
        choice.TimedChoice.pick = lambda self, nbytes: (way, False)
        collectives._exchange = lambda rt, collective, nbytes, call: call(_EXCHANGE_WAYS[way])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1M,16M")
    args = parser.parse_args()
    fastring.init()
    comm = MPI.COMM_WORLD
    if runtime().shm is None:
        raise SystemExit("the shared segment is off: run every rank on one host")
    n = comm.Get_size()
    if comm.Get_rank() == 0:
        print(f"# np={n} cpu={cpu_model()}; median us per call")
    for nbytes in [parse_bytes(s) for s in args.sizes.split(",") if s]:
        count = nbytes // 4
        x, gathered = np.ones(count, np.float32), np.empty(count * n, np.float32)
        a2a_in = np.ones(count - count % n, np.float32)
        a2a_out = np.empty_like(a2a_in)
        b, b_mpi = np.ones(count, np.float32), np.ones(count, np.float32)
        cases = {
            "broadcast": (lambda: fastring.broadcast(b, 0, name="bc", out=b), lambda: comm.Bcast(b_mpi, 0)),
            "allgather": (lambda: fastring.allgather(x, name="ag"), lambda: comm.Allgather(x, gathered)),
            "alltoall": (lambda: fastring.alltoall(a2a_in, name="a2a"), lambda: comm.Alltoall(a2a_in, a2a_out)),
        }
        calls, trials = calls_for(nbytes)
        for what, (ours, theirs) in cases.items():
            ways = collectives.SharedMemoryBroadcast.ways if what == "broadcast" else tuple(_EXCHANGE_WAYS)
            times: dict[str, list] = {name: [] for name in [*ways, "MPI"]}
            order = list(times)
            for trial in range(-(-trials // len(order)) * len(order)):  # each order alike often
                # each trial in another order: what runs right after another way's traffic
                # ran measurably slower, whichever it was
                for name in order[trial % len(order):] + order[:trial % len(order)]:
                    forced(None if name == "MPI" else name)
                    fn = theirs if name == "MPI" else ours
                    fn()
                    times[name].append(timed(fn, calls, comm, False))
                forced(None)
            if comm.Get_rank() == 0:
                print(f"{what:<10} {format_bytes(nbytes):>8}  " + "  ".join(
                    f"{name} {float(np.median(t)) * 1e6:.1f}" for name, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
