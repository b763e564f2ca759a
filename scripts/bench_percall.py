"""The cost per call (BENCHMARKS.md, issue 18, small messages): what a small collective costs
over the bytes it moves, each figure from one launch.

  * allreduce of 4 KiB (float32, in place) against MPI_Allreduce on the same kind of buffer,
    back to back and with the caller's own mpi4py barrier before every call (not timed);
    ratio = MPI's time / fastring's (above 1: faster than MPI);
  * an unnamed allreduce of 4 KiB, and barrier against MPI_Barrier (ratio as above);
  * the other collectives of 64 B and 4 KiB a rank (float32; reducescatter: its part)
    against MPI_Bcast, MPI_Allgather, MPI_Reduce_scatter_block and MPI_Alltoall;
  * grouped_allreduce of 100 x 40 KB against 100 MPI_Allreduce calls (ratio as above);
  * fastring.torch: `allreduce_async` + `synchronize` of 100 small tensors (100 float32),
    microseconds per tensor, beside the same through the numpy API, a batch at a time and
    BATCHES batches back to back (as a training loop runs them); a synchronous
    `fastring.torch.allreduce` of one such tensor beside the numpy one.

Trials of the compared calls alternate, so that both see the same state of the machine; each
figure is the median over the trials. Run it several times (separate launches) and quote the
minimum and median of the ratios (the maximum and median of the microseconds).

usage: fastring-run -np 2 python scripts/bench_percall.py [--json f]
       fastring-run -np 1 python scripts/bench_percall.py [--json f]     (the torch figures at np=1)
       python scripts/bench_percall.py --summarize run1.json run2.json ...
"""
from __future__ import annotations

import argparse
import json

import numpy as np
from mpi4py import MPI

import fastring
from bench_shm import compare, grouped_row, report, timed
from fastring.tools.bench import format_bytes

TENSORS = 100     # tensors per async batch
ELEMENTS = 100    # float32 per tensor of the batch
BATCHES = 50      # batches a trial of the back-to-back row


def small_rows(comm) -> list[dict]:
    rows = []
    x, y = np.ones(1024, np.float32), np.ones(1024, np.float32)
    for barrier in (False, True):
        row = compare(lambda: fastring.allreduce(x, op=fastring.Sum, name="x4K", out=x),
                      lambda: comm.Allreduce(MPI.IN_PLACE, y, MPI.SUM), 200, 7, comm, barrier)
        row.update(what="allreduce", bytes=4096, barrier=barrier)
        rows.append(row)
    row = compare(lambda: fastring.allreduce(x, op=fastring.Sum, out=x),
                  lambda: comm.Allreduce(MPI.IN_PLACE, y, MPI.SUM), 200, 7, comm)
    rows.append(dict(row, what="allreduce, unnamed", bytes=4096, barrier=False))
    row = compare(fastring.barrier, comm.Barrier, 200, 7, comm)
    rows.append(dict(row, what="barrier", bytes=0, barrier=False))
    return rows + collective_rows(comm)


def collective_rows(comm) -> list[dict]:
    """The other collectives of 64 B and 4 KiB a rank against MPI's."""
    n = comm.Get_size()
    rows = []
    for nbytes in (64, 4096):
        x = np.ones(nbytes // 4, np.float32)
        whole, gathered = np.ones(n * x.size, np.float32), np.empty(n * x.size, np.float32)
        cases = (("broadcast", lambda: fastring.broadcast(x, 0, name="bc", out=x), lambda: comm.Bcast(x, 0)),
                 ("allgather", lambda: fastring.allgather(x, name="ag"), lambda: comm.Allgather(x, gathered)),
                 ("reducescatter", lambda: fastring.reducescatter(whole, op=fastring.Sum, name="rs"),
                  lambda: comm.Reduce_scatter_block(whole, x, MPI.SUM)),
                 ("alltoall", lambda: fastring.alltoall(whole, name="a2a"), lambda: comm.Alltoall(whole, gathered)))
        for what, ours, theirs in cases:
            rows.append(dict(compare(ours, theirs, 200, 7, comm), what=what, bytes=nbytes, barrier=False))
    return rows


def per_tensor(fn, trials: int, comm, batches: int = 1) -> float:
    """Microseconds per tensor of `fn` (which handles TENSORS tensors) called `batches` times
    back to back, the median of `trials`, the slowest rank's."""
    fn()
    return float(np.median([timed(fn, batches, comm, barrier=batches == 1) for _ in range(trials)])) * 1e6 / TENSORS


def torch_rows(comm) -> list[dict]:
    import torch
    import fastring.torch as hvd

    torch.set_num_threads(1)
    tensors = [torch.ones(ELEMENTS) for _ in range(TENSORS)]
    arrays = [np.ones(ELEMENTS, np.float32) for _ in range(TENSORS)]

    def torch_async():
        handles = [hvd.allreduce_async_(t, name=f"t{i}", op=hvd.Sum) for i, t in enumerate(tensors)]
        for h in handles:
            hvd.synchronize(h)

    def numpy_async():
        handles = [fastring.allreduce_async(a, name=f"a{i}", op=fastring.Sum, out=a) for i, a in enumerate(arrays)]
        for h in handles:
            fastring.synchronize(h)

    def torch_sync():
        for t in tensors:
            hvd.allreduce(t, name="one", op=hvd.Sum)

    def numpy_sync():
        for a in arrays:
            fastring.allreduce(a, name="one_np", op=fastring.Sum)

    rows = []
    for what, ours, peer, batches in (
            ("allreduce_async + synchronize, 100 x 100 float32", torch_async, numpy_async, 1),
            # as a training loop runs them: the background thread finds the queue busy between batches
            (f"the same, {BATCHES} batches back to back", torch_async, numpy_async, BATCHES),
            ("synchronous allreduce, 100 float32", torch_sync, numpy_sync, 1)):
        mine, theirs = [], []
        for _ in range(5):  # alternate: both see the same machine
            mine.append(per_tensor(ours, 5, comm, batches))
            theirs.append(per_tensor(peer, 5, comm, batches))
        rows.append({"what": what, "bytes": 4 * ELEMENTS, "barrier": False,
                     "torch_us": float(np.median(mine)), "numpy_us": float(np.median(theirs))})
    return rows


def summarize(paths: list[str]) -> None:
    runs = [json.load(open(p)) for p in paths]
    print(f"| figure | size | caller's barrier | over {len(runs)} launches: worst | median | every launch |")
    print("|---|---:|---|---:|---:|---|")
    for k, row in enumerate(runs[0]):
        keys = ("ratio",) if "ratio" in row else ("torch_us", "numpy_us")
        for key in keys:
            values = [r[k][key] for r in runs]
            worst = min(values) if key == "ratio" else max(values)
            label = row["what"] + ("" if key == "ratio" else f", {key.split('_')[0]} (µs per tensor)")
            print(f"| {label} | {format_bytes(row['bytes'])} | {'yes' if row['barrier'] else 'no'} | "
                  f"{worst:.2f} | {float(np.median(values)):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summarize", nargs="+", metavar="JSON", help="summarize earlier runs and exit")
    parser.add_argument("--json", help="also write the rows here (rank 0)")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    fastring.init()
    comm = MPI.COMM_WORLD
    rows = small_rows(comm) + [grouped_row(comm)] + torch_rows(comm)
    report(comm, rows, args.json, line)


def line(r: dict) -> str:
    """One row of this script's output."""
    if "ratio" in r:
        return (f"{r['what']:<52} {format_bytes(r['bytes']):>8} barrier={'yes' if r['barrier'] else 'no':<3} "
                f"fastring {r['fastring_us']:9.1f} us  MPI {r['mpi_us']:9.1f} us  ratio {r['ratio']:5.2f}")
    return (f"{r['what']:<52} {format_bytes(r['bytes']):>8} torch {r['torch_us']:6.2f} us/tensor  "
            f"numpy {r['numpy_us']:6.2f} us/tensor")

if __name__ == "__main__":
    main()
