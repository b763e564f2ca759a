"""The ratios BENCHMARKS.md quotes for many hosts, from launches of scripts/multihost_bench.py:
per size, each ratio of two variants' median call times within one launch, then the minimum
and median of that ratio over the launches given (each file is one launch). Every ratio that
issue #15's "Done when" names is among them (the allreduce's: MPI / fastring, fp16 against
uncompressed, flat ring / hierarchical, MPI / hierarchical), and the hierarchical allgather
against the flat ring and MPI.

usage: python scripts/multihost_ratios.py run1.json run2.json ...
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict

import numpy as np

# (label, numerator mode, denominator mode): > 1 means the denominator's variant is faster.
RATIOS = (("MPI_Allreduce / fastring", "mpi", "fastring"),
          ("fastring / fastring fp16", "fastring", "fp16"),
          ("flat ring / hierarchical", "flat_ring", "hierarchical"),
          ("MPI_Allreduce / hierarchical", "mpi", "hierarchical"),
          ("allgather: flat ring / hierarchical", "allgather_flat", "allgather_hier"),
          ("allgather: MPI_Allgather / fastring.allgather", "allgather_mpi", "allgather"),
          ("allgather: MPI_Allgather / hierarchical", "allgather_mpi", "allgather_hier"))


def size_label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main(paths: list[str]) -> None:
    ratios: dict[tuple[int, str], list[float]] = defaultdict(list)
    times: dict[tuple[int, str], list[float]] = defaultdict(list)
    for path in paths:
        with open(path) as f:
            rows = {(r["bytes"], r["mode"]): r for r in json.load(f)}
        for (nbytes, mode), r in rows.items():
            times[nbytes, mode].append(r["median_s"])
        for nbytes in sorted({b for b, _ in rows}):
            for label, num, den in RATIOS:
                if (nbytes, num) in rows and (nbytes, den) in rows:
                    ratios[nbytes, label].append(rows[nbytes, num]["median_s"] / rows[nbytes, den]["median_s"])
    print(f"{len(paths)} launches; each cell: min / median over the launches\n")
    print("| size | variant | median call (ms) | algorithm |")
    print("| --- | --- | --- | --- |")
    modes = ("mpi", "fastring", "fp16", "flat_ring", "hierarchical", "allgather_mpi", "allgather", "allgather_flat",
             "allgather_hier")
    algorithms = {}
    for path in paths:
        with open(path) as f:
            algorithms.update({(r["bytes"], r["mode"]): r["algorithm"] for r in json.load(f)})
    for nbytes in sorted({b for b, _ in times}):
        for mode in modes:
            if (nbytes, mode) in times:
                t = np.array(times[nbytes, mode]) * 1e3
                print(f"| {size_label(nbytes)} | {mode} | {t.min():.3g} / {np.median(t):.3g} | "
                      f"{algorithms[nbytes, mode]} |")
    print("\n| size | ratio | min / median |")
    print("| --- | --- | --- |")
    order = {label: k for k, (label, _, _) in enumerate(RATIOS)}
    for (nbytes, label), values in sorted(ratios.items(), key=lambda kv: (kv[0][0], order[kv[0][1]])):
        print(f"| {size_label(nbytes)} | {label} | {min(values):.2f} / {float(np.median(values)):.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
