"""Each way a one-host broadcast, allgather and alltoall can take, forced, against MPI in the
same launch: streamed through the segment, by single copy, written straight into the results
(allgather and alltoall, whose results come from the segment's results area), and MPI_Bcast /
MPI_Allgather / MPI_Alltoall; and reducescatter (the size is each rank's part) and allreduce
(in place) with plain ("cached") or streaming stores for what the ranks read of each other,
against MPI_Reduce_scatter_block / MPI_Allreduce; above one buffer the allreduce by single
copy or pipelined through the segment (`algorithms.shm.PathTimes`'s two paths), and up to
SMALL_MESSAGE_BYTES, where it rides the negotiation cycle, with its payload written into the
cycle's slot with plain or streaming stores (the segment's `cycle_streaming_bytes`); and
fastring.barrier against MPI_Barrier. np=2, float32, trials alternating, median µs per call.
What `algorithms.choice.TimedChoice` and PathTimes choose between on the user's calls, and
what the results area saves (BENCHMARKS.md, "Round 2, sessions 8, 9, 12, 13 and 14").

usage: fastring-run -np 2 python scripts/bench_ways.py [--sizes 16K,64K,1M,16M]
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import fastring
from fastring._core.runtime import runtime
from fastring._transport.shm import EXCHANGE_DIRECT
from fastring._core.config import (SHM_CYCLE_STREAMING_BYTES, SHM_REDUCESCATTER_MAX_BYTES, SHM_STORE_WAYS,
                                   SHM_TIMED_CHOICE_MIN_BYTES, SMALL_MESSAGE_BYTES)
from fastring.algorithms import choice, collectives, shm
from fastring.tools.bench import cpu_model, format_bytes, parse_bytes

from bench_shm import calls_for, timed

_EXCHANGE_WAYS = {"direct": EXCHANGE_DIRECT, **collectives._EXCHANGE_WAYS}
_PATH_WAYS = ("single copy", "pipeline")  # a large allreduce's (PathTimes)
_CYCLE_WAYS = ("plain cycle", "streaming cycle")  # a small allreduce's payload stores in the cycle
AS_CHOSEN = "fastring"  # the call as it runs, nothing forced
_pick, _exchange, _prefer = choice.TimedChoice.pick, collectives._exchange, shm.PathTimes.prefer_buffers


def forced(way: str | None):
    """Make every one-host call that times its ways (TimedChoice), every lean allgather
    and alltoall, and every allreduce above a buffer (PathTimes), run `way` (None: choose as
    usual)."""
    choice.TimedChoice.pick, collectives._exchange, shm.PathTimes.prefer_buffers = _pick, _exchange, _prefer
    runtime().shm.cycle_streaming_bytes = SHM_CYCLE_STREAMING_BYTES
    if way in _PATH_WAYS:
        shm.PathTimes.prefer_buffers = lambda self, key: way == "pipeline"
    elif way in _CYCLE_WAYS:
        runtime().shm.cycle_streaming_bytes = 1 if way == "streaming cycle" else SMALL_MESSAGE_BYTES + 1
    elif way is not None and way != AS_CHOSEN:
        choice.TimedChoice.pick = lambda self, nbytes: (way, False)
        if way in _EXCHANGE_WAYS:
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
    time_ways(comm, "barrier", "", fastring.barrier, comm.Barrier, (AS_CHOSEN,), *calls_for(0))
    for nbytes in [parse_bytes(s) for s in args.sizes.split(",") if s]:
        count = nbytes // 4
        x, gathered = np.ones(count, np.float32), np.empty(count * n, np.float32)
        a2a_in = np.ones(count - count % n, np.float32)
        a2a_out = np.empty_like(a2a_in)
        b, b_mpi = np.ones(count, np.float32), np.ones(count, np.float32)
        parts, part = np.ones(count * n, np.float32), np.empty(count, np.float32)
        y, y_mpi = np.ones(count, np.float32), np.ones(count, np.float32)
        cases = {  # what: (fastring's call, MPI's, the ways)
            "broadcast": (lambda: fastring.broadcast(b, 0, name="bc", out=b), lambda: comm.Bcast(b_mpi, 0),
                          collectives.SharedMemoryBroadcast.ways),
            "allgather": (lambda: fastring.allgather(x, name="ag"), lambda: comm.Allgather(x, gathered),
                          tuple(_EXCHANGE_WAYS)),
            "alltoall": (lambda: fastring.alltoall(a2a_in, name="a2a"), lambda: comm.Alltoall(a2a_in, a2a_out),
                         tuple(_EXCHANGE_WAYS)),
            "reducescatter": (lambda: fastring.reducescatter(parts, op=fastring.Sum, name="rs"),
                              lambda: comm.Reduce_scatter_block(parts, part, MPI.SUM), SHM_STORE_WAYS),
            "allreduce": (lambda: fastring.allreduce(y, op=fastring.Sum, name="ar", out=y),
                          lambda: comm.Allreduce(MPI.IN_PLACE, y_mpi, MPI.SUM), SHM_STORE_WAYS),
        }
        calls, trials = calls_for(nbytes)
        segment = runtime().shm
        if nbytes >= segment.allreduce_single_copy_bytes and runtime().transport.single_copy:
            cases["allreduce"] = cases["allreduce"][:2] + (_PATH_WAYS,)
        elif y.nbytes <= SMALL_MESSAGE_BYTES:
            cases["allreduce"] = cases["allreduce"][:2] + (_CYCLE_WAYS,)
        timed_stores = {"reducescatter": SHM_TIMED_CHOICE_MIN_BYTES <= parts.nbytes <= SHM_REDUCESCATTER_MAX_BYTES,
                        "allreduce": SHM_TIMED_CHOICE_MIN_BYTES <= y.nbytes <= segment.tile_bytes
                        or cases["allreduce"][2] != SHM_STORE_WAYS}
        for what, (ours, theirs, ways) in cases.items():
            if timed_stores.get(what, True):  # else a size whose ways are not chosen: one way only
                time_ways(comm, what, format_bytes(nbytes), ours, theirs, ways, calls, trials)


def time_ways(comm, what: str, size: str, ours, theirs, ways: tuple, calls: int, trials: int) -> None:
    """Print the median time of `ours` forced to each of `ways` and of MPI's `theirs`."""
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
        print(f"{what:<10} {size:>8}  " + "  ".join(
            f"{name} {float(np.median(t)) * 1e6:.1f}" for name, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
