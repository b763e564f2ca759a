"""Allreduce inside jax.jit: fastring.jax against mpi4jax (when installed), and fastring's
own allreduce on numpy, on the same buffers in one launch.

Each timed call is one jitted function running `--reps` allreduces (Sum, float32) in a
lax.fori_loop, so that jit dispatch is paid once per call, not once per allreduce; the ranks
meet at an MPI barrier before every call, and the three methods take turns in every
iteration. A size's time is the median over `--iters` calls, divided by the reps; its ratio
the median of the per-iteration ratios. Run under fastring-run (np=2 is the performance configuration):

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


def call_seconds(fn, x, comm) -> float:
    """Seconds one call of `fn(x)` took on the slowest rank, the ranks started together."""
    comm.Barrier()
    t0 = time.perf_counter()
    fn(x).block_until_ready()
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


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
        host = np.ones(nbytes // 4, np.float32)
        out = np.empty_like(host)

        class _Numpy:  # the protocol of a jitted call: one call, `reps` allreduces
            def __call__(self, a):
                for _ in range(reps):
                    fastring.allreduce(a, op=fastring.Sum, out=out)
                return self

            def block_until_ready(self):
                return self

        methods = {"fastring_jax": (looped(lambda v: fj.allreduce(v, op=fj.Sum), reps), x),
                   "fastring_numpy": (_Numpy(), host)}
        if mpi4jax is not None:
            methods["mpi4jax"] = (looped(lambda v: mpi4jax.allreduce(v, op=MPI.SUM, comm=comm), reps), x)
        for fn, arg in methods.values():
            fn(arg).block_until_ready()  # compile and warm up
        # The methods take turns within every iteration, so that a change of the machine's
        # load during the launch falls on all of them alike.
        times = {key: [] for key in methods}
        for _ in range(args.iters):
            for key, (fn, arg) in methods.items():
                times[key].append(call_seconds(fn, arg, comm) / reps)
        row = {"bytes": nbytes, "reps": reps}
        row.update({key: float(np.median(t)) for key, t in times.items()})
        if mpi4jax is not None:
            row["mpi4jax_ratio"] = float(np.median(np.array(times["mpi4jax"]) / np.array(times["fastring_jax"])))
        row["numpy_ratio"] = float(np.median(np.array(times["fastring_numpy"]) / np.array(times["fastring_jax"])))
        rows.append(row)
        if comm.Get_rank() == 0:
            print(_line(row), flush=True)
    return {"size": size, "rows": rows}


def _line(row: dict) -> str:
    parts = [f"{row['bytes']:>10d} B", f"fastring.jax {row['fastring_jax'] * 1e6:10.1f} us"]
    if "mpi4jax" in row:
        parts.append(f"mpi4jax {row['mpi4jax'] * 1e6:10.1f} us")
        parts.append(f"mpi4jax/fastring.jax {row['mpi4jax_ratio']:6.2f}")
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
            peer = [r["mpi4jax_ratio"] for r in rows]
            cells += [f"{statistics.median(r['mpi4jax'] for r in rows) * 1e6:.1f}",
                      f"{min(peer):.2f}", f"{statistics.median(peer):.2f}"]
        else:
            cells += ["-", "-", "-"]
        own = [r["numpy_ratio"] for r in rows]
        cells += [f"{statistics.median(npy) * 1e6:.1f}", f"{min(own):.2f}", f"{statistics.median(own):.2f}"]
        print("| " + " | ".join(cells) + " |")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=9)
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
