"""Allreduce inside jax.jit: fastring.jax against mpi4jax (when installed), and fastring's
own allreduce on numpy, on the same buffers in one launch.

Each timed call is one jitted function running `--reps` allreduces (Sum, float32) in a
lax.fori_loop, so that jit dispatch is paid once per call, not once per allreduce; the ranks
meet at an MPI barrier before every call. A size's time is the median over `--iters` calls,
divided by the reps. Run under fastring-run (np=2 is the performance configuration):

    fastring-run -np 2 python scripts/jax_bench.py --json out.json
    python scripts/jax_bench.py --summarize out1.json out2.json ...   # min and median ratios
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import os

import numpy as np
from mpi4py import MPI

# XLA's CPU thread pool spins between computations; with one rank per core that steals the
# cores the collectives wait on. One thread, as every rank runs its collectives on one anyway.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def reps_for(nbytes: int) -> int:
    return max(2, min(50, (8 << 20) // nbytes))


def time_calls(fn, x, iters: int, comm) -> float:
    """Median seconds of one call of `fn(x)` over `iters` calls, ranks started together."""
    fn(x).block_until_ready()  # compile and warm up
    times = []
    for _ in range(iters):
        comm.Barrier()
        t0 = time.perf_counter()
        fn(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    # each call counts as long as its slowest rank took
    slowest = np.empty(len(times))
    comm.Allreduce(np.array(times), slowest, op=MPI.MAX)
    return float(np.median(slowest))


def measure(args) -> dict:
    import jax
    import jax.numpy as jnp

    import fastring
    import fastring.jax as fj

    fj.init()
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    try:
        import mpi4jax
    except ImportError as e:
        mpi4jax = None
        if comm.Get_rank() == 0:
            print(f"mpi4jax not importable ({e}); comparing against fastring.allreduce on numpy only")

    def looped(allreduce, reps):
        scale = 1.0 / size

        @jax.jit
        def run(x):
            return jax.lax.fori_loop(0, reps, lambda i, v: allreduce(v) * scale, x)
        return run

    rows = []
    for nbytes in SIZES:
        if nbytes > args.max_bytes:
            break
        reps = reps_for(nbytes)
        x = jnp.ones(nbytes // 4, jnp.float32)
        row = {"bytes": nbytes, "reps": reps}
        row["fastring_jax"] = time_calls(looped(lambda v: fj.allreduce(v, op=fj.Sum), reps), x, args.iters, comm) / reps
        if mpi4jax is not None:
            row["mpi4jax"] = time_calls(looped(lambda v: mpi4jax.allreduce(v, op=MPI.SUM, comm=comm), reps),
                                        x, args.iters, comm) / reps
        host = np.ones(nbytes // 4, np.float32)
        out = np.empty_like(host)

        class _Numpy:  # the same protocol as a jitted call: one call, `reps` allreduces
            def __call__(self, a):
                for _ in range(reps):
                    fastring.allreduce(a, op=fastring.Sum, out=out)
                return self

            def block_until_ready(self):
                return self
        row["fastring_numpy"] = time_calls(_Numpy(), host, args.iters, comm) / reps
        rows.append(row)
        if comm.Get_rank() == 0:
            print(_line(row), flush=True)
    return {"size": size, "rows": rows}


def _line(row: dict) -> str:
    parts = [f"{row['bytes']:>10d} B", f"fastring.jax {row['fastring_jax'] * 1e6:10.1f} us"]
    if "mpi4jax" in row:
        parts.append(f"mpi4jax {row['mpi4jax'] * 1e6:10.1f} us")
        parts.append(f"mpi4jax/fastring.jax {row['mpi4jax'] / row['fastring_jax']:6.2f}")
    parts.append(f"fastring numpy {row['fastring_numpy'] * 1e6:10.1f} us")
    return " | ".join(parts)


def summarize(paths: list[str]) -> None:
    """Per size, min and median over launches of the ratios (>1: fastring.jax is faster)."""
    runs = [json.load(open(p)) for p in paths]
    print(f"{len(runs)} launches, np={runs[0]['size']}; ratio = peer time / fastring.jax time "
          "(above 1: fastring.jax faster)")
    print("| size | fastring.jax median us | mpi4jax median us | mpi4jax / fastring.jax min | median "
          "| fastring numpy median us | numpy / jax min | median |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, row in enumerate(runs[0]["rows"]):
        rows = [r["rows"][i] for r in runs if i < len(r["rows"])]
        jx = [r["fastring_jax"] for r in rows]
        npy = [r["fastring_numpy"] for r in rows]
        cells = [_size(row["bytes"]), f"{statistics.median(jx) * 1e6:.1f}"]
        if all("mpi4jax" in r for r in rows):
            peer = [r["mpi4jax"] / r["fastring_jax"] for r in rows]
            cells += [f"{statistics.median(r['mpi4jax'] for r in rows) * 1e6:.1f}",
                      f"{min(peer):.2f}", f"{statistics.median(peer):.2f}"]
        else:
            cells += ["-", "-", "-"]
        own = [r["fastring_numpy"] / r["fastring_jax"] for r in rows]
        cells += [f"{statistics.median(npy) * 1e6:.1f}", f"{min(own):.2f}", f"{statistics.median(own):.2f}"]
        print("| " + " | ".join(cells) + " |")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--json", help="write the measurements here (rank 0)")
    parser.add_argument("--summarize", nargs="+", metavar="JSON", help="aggregate earlier launches")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    result = measure(args)
    if args.json and MPI.COMM_WORLD.Get_rank() == 0:
        with open(args.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
