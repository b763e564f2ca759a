"""The one-host figures of BENCHMARKS.md (issue 18), each a ratio against MPI in the same launch
on the same kind of buffer (float32, in place; ratio = MPI's time / fastring's, so above 1 is
faster than MPI):

  * allreduce at each size, called back to back, and with the caller's own mpi4py barrier
    before every call (the barrier is not timed; each call is);
  * grouped_allreduce of 100 x 40 KB vs 100 MPI_Allreduce calls;
  * allgather, reducescatter, broadcast, alltoall at 1 MiB and 16 MiB (bytes per rank's
    input; MPI_Allgather, MPI_Reduce_scatter_block, MPI_Bcast, MPI_Alltoall);
  * the 256 MiB allreduce's bus bandwidth as a percentage of the copy-once floor: every rank
    copies its 256 MiB buffer once, all at the same time (np.copyto).

Trials of fastring and MPI alternate, each trial starting at another of them, so that both
see the same state of the machine; each figure is the median over the trials. Run it several
times (separate launches) and quote the minimum and the median of the ratios.

usage: fastring-run -np 2 python scripts/bench_shm.py [--sizes 4K,64K,1M,16M,64M,256M] [--json f]
       [--collectives 1M,16M] [--only broadcast,...]
       python scripts/bench_shm.py --summarize run1.json run2.json ...   (a Markdown table of
       the minimum and the median of each figure over the launches, and the issue's target for
       each, met or missed at the minimum)
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import fastring
from fastring._transport import array_address
from fastring._transport.shm import copy_streaming
from fastring.tools.bench import cpu_model, format_bytes, parse_bytes


def timed(fn, calls: int, comm, barrier: bool) -> float:
    """Seconds per call of `fn`, `calls` calls; with `barrier`, each call is preceded by an
    untimed MPI barrier."""
    total = 0.0
    if barrier:
        for _ in range(calls):
            comm.Barrier()
            t = time.perf_counter()
            fn()
            total += time.perf_counter() - t
    else:
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        total = time.perf_counter() - t
    # the slowest rank's time: the collective is done when every rank is
    return comm.allreduce(total, op=MPI.MAX) / calls


def compare(ours, theirs, calls: int, trials: int, comm, barrier: bool = False, floor=()) -> dict:
    """fastring's and MPI's median times and their ratio; with `floor` (functions every rank
    runs at once that write the collective's whole output once: a plain copy, one with
    streaming stores), the faster one's median time too and each side's time as a percentage
    of it, all alternating trial by trial."""
    fns = [ours, theirs, *floor]
    times = [[] for _ in fns]
    for fn in fns:  # warm up: first-touch page faults, kernels compiled, caches filled
        fn()
    for trial in range(trials):
        # each trial starts at another function: what runs right after another's traffic
        # measured slower, whichever it was (BENCHMARKS.md, "Round 2, session 8")
        for i in [*range(trial % len(fns), len(fns)), *range(trial % len(fns))]:
            times[i].append(timed(fns[i], calls, comm, barrier))
    f, m = float(np.median(times[0])), float(np.median(times[1]))
    row = {"fastring_us": f * 1e6, "mpi_us": m * 1e6, "ratio": m / f}
    if floor:
        each = [float(np.median(t)) for t in times[2:]]
        w = min(each)
        row.update(floor_us=w * 1e6, fastring_floor_pct=100 * w / f, mpi_floor_pct=100 * w / m,
                   floors_us=[e * 1e6 for e in each])
    return row


def calls_for(nbytes: int) -> tuple[int, int]:
    """(calls per trial, trials): about 20 ms of work per trial for the small sizes."""
    if nbytes <= 64 << 10:
        return 200, 7
    if nbytes <= 1 << 20:
        return 40, 7
    if nbytes <= 16 << 20:
        return 5, 5
    return 1, 5


def allreduce_buffers(sizes) -> dict:
    """fastring's and MPI's buffer for each size, allocated once for both passes (without and
    with the caller's barrier), so that both measure the same memory: a buffer allocated after
    the first pass freed its large arrays came from the heap, often with fewer transparent
    huge pages, and how fast a copy between processes runs depends on that (BENCHMARKS.md,
    "Issue 18 (round 2, session 4)")."""
    return {nbytes: (np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)) for nbytes in sizes}


def allreduce_rows(buffers: dict, comm, barrier: bool) -> list[dict]:
    rows = []
    for nbytes, (x, y) in buffers.items():
        name = f"x{nbytes}"
        calls, trials = calls_for(nbytes)
        row = compare(lambda: fastring.allreduce(x, op=fastring.Sum, name=name, out=x),
                      lambda: comm.Allreduce(MPI.IN_PLACE, y, MPI.SUM), calls, trials, comm, barrier)
        row.update(what="allreduce", bytes=nbytes, barrier=barrier)
        rows.append(row)
    return rows


def grouped_row(comm) -> dict:
    tensors = [np.ones(10_000, np.float32) for _ in range(100)]
    mine = [np.ones(10_000, np.float32) for _ in range(100)]

    def mpi_loop():
        for t in tensors:
            comm.Allreduce(MPI.IN_PLACE, t, MPI.SUM)
    row = compare(lambda: fastring.grouped_allreduce(mine, op=fastring.Sum, name="grads"), mpi_loop, 10, 7, comm)
    row.update(what="grouped_allreduce 100 x 40 KB", bytes=4_000_000, barrier=False)
    return row


COLLECTIVES = ("allgather", "reducescatter", "broadcast", "alltoall")  # collective_rows' rows, in order


def collective_rows(comm, sizes, only=None) -> list[dict]:
    """The other collectives' rows at each size (`only`: those named, else all four)."""
    n = comm.Get_size()
    rows = []
    for nbytes in sizes:
        count = nbytes // 4
        x = np.ones(count, np.float32)
        gathered = np.empty(count * n, np.float32)
        big = np.ones(count * n, np.float32)
        part = np.empty(count, np.float32)
        a2a_in = np.ones(count - count % n, np.float32)
        a2a_out = np.empty_like(a2a_in)
        # The floor of each: every rank writes a buffer the size of its output once, from
        # a source of that size, all ranks at once, by np.copyto and by a copy with streaming
        # stores (which does not read the destination's lines first), the faster of the two:
        # what no collective that writes its output can beat on this machine's memory. Where
        # a rank's output is larger than what it must read (allgather: its own input; a
        # broadcast's reader: nothing of its own), also the exact traffic: its input read once
        # and the output written once, the rest from a block that stays in the cache. A
        # broadcast's root writes nothing, so the others copy alone.
        floor_src, floor_dst = np.ones(count * n, np.float32), np.empty(count * n, np.float32)

        def floor_of(items: int, reads: int | None = None, writes: bool = True):
            dst, src = array_address(floor_dst), array_address(floor_src)
            if not writes:  # a broadcast's root: its output is its input already
                return (lambda: None, lambda: None, lambda: None)
            fns = (lambda: np.copyto(floor_dst[:items], floor_src[:items]),
                   lambda: copy_streaming(dst, src, 4 * items))
            if reads is None:
                return fns

            def once():
                copy_streaming(dst, src, 4 * reads)
                for at in range(4 * reads, 4 * items, CACHED_BLOCK.nbytes):
                    copy_streaming(dst + at, array_address(CACHED_BLOCK), min(CACHED_BLOCK.nbytes, 4 * items - at))
            return fns + (once,)
        calls, trials = calls_for(nbytes)
        cases = (
            ("allgather", lambda: fastring.allgather(x, name="ag"),
             lambda: comm.Allgather(x, gathered), floor_of(count * n, count)),
            ("reducescatter", lambda: fastring.reducescatter(big, op=fastring.Sum, name="rs"),
             lambda: comm.Reduce_scatter_block(big, part, MPI.SUM), floor_of(count)),
            ("broadcast", lambda: fastring.broadcast(x, 0, name="bc", out=x),
             lambda: comm.Bcast(x, 0), floor_of(count, 0, comm.Get_rank() != 0)),
            ("alltoall", lambda: fastring.alltoall(a2a_in, name="a2a"),
             lambda: comm.Alltoall(a2a_in, a2a_out), floor_of(a2a_in.size)),
        )
        for what, ours, theirs, floor in cases:
            if only and what not in only:
                continue
            row = compare(ours, theirs, calls, trials, comm, floor=floor)
            row.update(what=what, bytes=nbytes, barrier=False)
            rows.append(row)
    return rows


CACHED_BLOCK = np.ones(256 << 10, np.uint8)  # what a floor writes that it need not read from memory


def floor_row(comm, nbytes: int = 256 << 20) -> dict:
    x = np.ones(nbytes // 4, np.float32)
    src, dst = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
    row = compare(lambda: fastring.allreduce(x, op=fastring.Sum, name="floor", out=x),
                  lambda: np.copyto(dst, src), 1, 5, comm)
    n = comm.Get_size()
    busbw = 2 * (n - 1) / n * nbytes / (row["fastring_us"] * 1e-6)
    return {"what": "256 MiB busbw / copy-once floor", "bytes": nbytes, "barrier": False,
            "fastring_us": row["fastring_us"], "copy_us": row["mpi_us"],
            "busbw_GBps": busbw / 1e9, "floor_GBps": nbytes / (row["mpi_us"] * 1e-6) / 1e9,
            "percent": 100 * busbw / (nbytes / (row["mpi_us"] * 1e-6))}


# The targets, each for the minimum over the launches: allreduce ratios by size (with
# and without the caller's barrier), the others' ratios, and the busbw percentage.
ALLREDUCE_TARGETS = {4 << 10: 1.0, 64 << 10: 1.2, 1 << 20: 1.5, 16 << 20: 2.0, 64 << 20: 3.0, 256 << 20: 3.0}
OTHER_TARGETS = {"grouped_allreduce 100 x 40 KB": 3.0, "allgather": 1.5, "reducescatter": 1.5,
                 "broadcast": 1.5, "alltoall": 1.5, "256 MiB busbw / copy-once floor": 60.0}


def target_of(row: dict) -> float | None:
    if row["what"] == "allreduce":
        return ALLREDUCE_TARGETS.get(row["bytes"])
    return OTHER_TARGETS.get(row["what"])


def summarize(paths: list[str]) -> None:
    runs = [json.load(open(p)) for p in paths]
    print(f"CPU: {', '.join(sorted({run[0].get('cpu', 'not recorded') for run in runs}))}\n")
    print(f"| figure | size | caller's barrier | min over {len(runs)} launches | median | every launch | target |")
    print("|---|---:|---|---:|---:|---|---|")
    floors = []
    for k, row in enumerate(runs[0]):
        if "floor_us" in row:
            floors.append((row, [r[k] for r in runs]))
        key = "percent" if "percent" in row else "ratio"
        values = [r[k][key] for r in runs]
        unit = "%" if key == "percent" else ""
        target = target_of(row)
        verdict = "" if target is None else f"{target:g}{unit} ({'met' if min(values) >= target else 'missed'})"
        print(f"| {row['what']} | {format_bytes(row['bytes'])} | {'yes' if row['barrier'] else 'no'} | "
              f"{min(values):.2f}{unit} | {float(np.median(values)):.2f}{unit} | "
              f"{', '.join(f'{v:.2f}' for v in values)} | {verdict} |")
    if floors:
        print("\nTime of the floor (every rank writes its output once, all at once, the fastest of a plain"
              " copy, one with streaming stores and, for allgather and broadcast, the input read once and the"
              " output written once) as a percentage of each side's time, min / median over"
              " the launches (100% = at the floor); the copies' median times:\n")
        print("| collective | size | fastring, % of floor | MPI, % of floor | the most ratio at the floor (MPI / floor), "
              "min / median | launches whose floor is below the target | copy / streaming copy / input once, µs (median) |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for row, cells in floors:
            ours, theirs = [c["fastring_floor_pct"] for c in cells], [c["mpi_floor_pct"] for c in cells]
            # fastring at the floor would be MPI's time / the floor's: about the most this machine
            # allowed in that launch (the floor is measured too), so a launch whose most is below
            # the target misses it whatever the code, give or take that measurement
            best = [c["mpi_us"] / c["floor_us"] for c in cells]
            target = target_of(row)
            below = "-" if target is None else f"{sum(b < target for b in best)} of {len(best)}"
            kinds = zip(*[c.get("floors_us", [c["floor_us"]]) for c in cells])
            print(f"| {row['what']} | {format_bytes(row['bytes'])} | {min(ours):.0f}% / {float(np.median(ours)):.0f}% | "
                  f"{min(theirs):.0f}% / {float(np.median(theirs)):.0f}% | "
                  f"{min(best):.2f} / {float(np.median(best)):.2f} | {below} | "
                  f"{' / '.join(f'{float(np.median(k)):.0f}' for k in kinds)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summarize", nargs="+", metavar="JSON", help="summarize earlier runs and exit")
    parser.add_argument("--sizes", default="4K,64K,1M,16M,64M,256M")
    parser.add_argument("--collectives", default="1M,16M", help="sizes for the other collectives ('' for none)")
    parser.add_argument("--only", default="", help=f"of the other collectives, only these (comma-separated: "
                        f"{','.join(COLLECTIVES)})")
    parser.add_argument("--no-floor", action="store_true")
    parser.add_argument("--json", help="also write the rows here (rank 0)")
    args = parser.parse_args()
    only = [w for w in args.only.split(",") if w]
    unknown = set(only) - set(COLLECTIVES)
    if unknown:
        parser.error(f"--only: unknown collectives {sorted(unknown)}")
    if args.summarize:
        summarize(args.summarize)
        return
    fastring.init()
    comm = MPI.COMM_WORLD
    sizes = [parse_bytes(s) for s in args.sizes.split(",") if s]
    buffers = allreduce_buffers(sizes)
    rows = allreduce_rows(buffers, comm, False) + allreduce_rows(buffers, comm, True) + [grouped_row(comm)]
    del buffers
    rows += collective_rows(comm, [parse_bytes(s) for s in args.collectives.split(",") if s], only)
    if not args.no_floor:
        rows.append(floor_row(comm))
    report(comm, rows, args.json, line, f"{'what':<32} {'bytes':>8} {'barrier':>7} {'fastring us':>12} "
                                        f"{'MPI us':>10} {'ratio':>6}")


def line(r: dict) -> str:
    """One row of this script's output."""
    if "percent" in r:
        return (f"{r['what']:<32} {format_bytes(r['bytes']):>8} {'':>7} {r['fastring_us']:>12.1f} "
                f"{r['copy_us']:>10.1f} {r['percent']:>5.0f}%  (busbw {r['busbw_GBps']:.2f} GB/s, "
                f"floor {r['floor_GBps']:.2f} GB/s)")
    floor = (f"  (floor {r['floor_us']:.1f} us: fastring {r['fastring_floor_pct']:.0f}%, "
             f"MPI {r['mpi_floor_pct']:.0f}% of it; copy / streaming copy / input once "
             f"{' / '.join(f'{w:.1f}' for w in r['floors_us'])} us)" if "floor_us" in r else "")
    return (f"{r['what']:<32} {format_bytes(r['bytes']):>8} {'yes' if r['barrier'] else 'no':>7} "
            f"{r['fastring_us']:>12.1f} {r['mpi_us']:>10.1f} {r['ratio']:>6.2f}{floor}")


def report(comm, rows: list[dict], json_path: str | None, line, header: str | None = None) -> None:
    """On rank 0: the job's shape, `line(row)` for every row, and the rows as JSON to
    `json_path` (what --summarize reads)."""
    if comm.Get_rank() != 0:
        return
    from fastring._core.runtime import runtime
    cpu = cpu_model()
    print(f"# np={comm.Get_size()} shm={'on' if runtime().shm is not None else 'off'} cpu={cpu}")
    for r in rows:
        r["cpu"] = cpu
    if header:
        print(header)
    for r in rows:
        print(line(r))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
