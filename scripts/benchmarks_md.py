#!/usr/bin/env python
"""Write BENCHMARKS.md (and a PNG plot of busbw against message size) from `fastring-bench
--json` output, so that every figure in it comes with the command that produced it.

    fastring-run -np 2 fastring-bench --op all --min-bytes 4K --max-bytes 256M --check --vs-mpi --json bench.json
    python scripts/benchmarks_md.py bench.json -o BENCHMARKS.md      # also writes benchmarks.png

Several JSON files (other dtypes, compression, rank counts) make several sections. The plot
needs matplotlib (`pip install matplotlib`); without it the Markdown is written alone and the
script says so.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from fastring.tools.bench import format_bytes

LIBS = (("fastring", "fastring"), ("mpi", "MPI"))


def load_runs(paths: Sequence[str]) -> list[dict]:
    """The runs in `paths`, each a fastring-bench --json document; ValueError names a file
    that is not one.

    Example:
        >>> load_runs([])
        []
    """
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                run = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read {path}: {e}") from None
        if not isinstance(run, dict) or not isinstance(run.get("rows"), list) or "command" not in run:
            raise ValueError(f"{path} is not fastring-bench --json output (no 'rows' and 'command')")
        run["source"] = path
        runs.append(run)
    return runs


def sections(runs: Sequence[dict]) -> list[tuple[dict, str, list[dict]]]:
    """(run, op, rows) for every op of every run, in order.

    Example:
        >>> run = {"rows": [{"op": "allreduce"}, {"op": "broadcast"}, {"op": "allreduce"}]}
        >>> [(op, len(rows)) for _, op, rows in sections([run])]
        [('allreduce', 2), ('broadcast', 1)]
    """
    out = []
    for run in runs:
        ops = list(dict.fromkeys(r["op"] for r in run["rows"]))
        out += [(run, op, [r for r in run["rows"] if r["op"] == op]) for op in ops]
    return out


def variant(run: dict, op: str) -> str:
    """A section's label: op, dtype, compression (if any), ranks.

    Example:
        >>> variant({"np": 2, "options": {"dtype": "float32", "compression": "fp16"}}, "allreduce")
        'allreduce, float32, fp16 compression, 2 ranks'
    """
    opts = run.get("options", {})
    parts = [op, opts.get("dtype", "?")]
    if opts.get("compression", "none") != "none":
        parts.append(f"{opts['compression']} compression")
    parts.append(f"{run.get('np', '?')} ranks")
    return ", ".join(parts)


def reproduce(run: dict) -> str:
    """The command line that reproduces a run: fastring-run with the run's rank count.

    Example:
        >>> reproduce({"np": 2, "command": "fastring-bench --check"})
        'fastring-run -np 2 fastring-bench --check'
    """
    return f"fastring-run -np {run.get('np', '?')} {run['command']}"


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def summary(rows: Sequence[dict], ceiling: dict | None) -> str:
    """One sentence of facts about a section: peaks, where fastring is faster, smallest size.

    Example:
        >>> rows = [{"bytes": 4096, "ratio": 0.5, "fastring": {"busbw": 1.0, "time_us": 10.0},
        ...          "mpi": {"busbw": 2.0, "time_us": 5.0}}]
        >>> summary(rows, {"copy_gbs": 10.0})
        'Peak busbw: fastring 1.00 GB/s at 4 KiB (10% of np.copyto), MPI 2.00 GB/s at 4 KiB. fastring is faster at 0 of 1 sizes. At 4 KiB: fastring 10.00 µs, MPI 5.00 µs.'
    """
    parts = []
    for key, name in LIBS:
        if rows[0].get(key) is None:
            continue
        best = max(rows, key=lambda r: r[key]["busbw"])
        text = f"{name} {best[key]['busbw']:.2f} GB/s at {format_bytes(best['bytes'])}"
        if key == "fastring" and ceiling and ceiling.get("copy_gbs"):
            text += f" ({100 * best[key]['busbw'] / ceiling['copy_gbs']:.0f}% of np.copyto)"
        parts.append(text)
    out = "Peak busbw: " + ", ".join(parts) + "."
    if rows[0].get("mpi") is not None:
        faster = sum(1 for r in rows if (r.get("ratio") or 0) > 1)
        small = rows[0]
        out += (f" fastring is faster at {faster} of {len(rows)} sizes. At {format_bytes(small['bytes'])}: "
                f"fastring {small['fastring']['time_us']:.2f} µs, MPI {small['mpi']['time_us']:.2f} µs.")
    return out


def markdown(runs: Sequence[dict], png: str | None) -> str:
    """The text of BENCHMARKS.md; `png` is the plot's path relative to it (None: no plot).

    Example:
        >>> run = {"command": "fastring-bench", "np": 1, "options": {"dtype": "float32"},
        ...        "rows": [{"op": "allreduce", "bytes": 4096, "count": 1024, "ratio": None, "mpi": None,
        ...                  "fastring": {"time_us": 9.0, "algbw": 0.45, "busbw": 0.0, "wrong": 0}}]}
        >>> "| 4 KiB | 1,024 | 9.00 | 0.45 | 0.00 |" in markdown([run], None)
        True
    """
    lines = ["# fastring benchmarks", "",
             "Generated by `scripts/benchmarks_md.py` from `fastring-bench --json` output; rerun "
             "the commands below and the script to update it. Times are medians over iterations "
             "of the slowest rank (a barrier before each call); busbw as nccl-tests defines it "
             "(allreduce algbw·2(n−1)/n; allgather, reducescatter, alltoall algbw·(n−1)/n; "
             "broadcast algbw); ratio = MPI time / fastring time (above 1: fastring is faster); "
             "GB = 10⁹ bytes.", ""]
    lines += ["## Commands", ""]
    for run in runs:
        lines.append(f"- `{reproduce(run)}` ({run.get('timestamp', 'time not recorded')})")
    lines += ["", "## Machine and versions", ""]
    seen = set()
    for run in runs:
        host, ver, ceiling = run.get("host", {}), run.get("versions", {}), run.get("ceiling")
        desc = (f"- {host.get('cpu', '?')}, {host.get('cpu_count', '?')} cores, {host.get('platform', '?')}, "
                f"Python {host.get('python', '?')}; fastring {ver.get('fastring', '?')}, "
                f"{ver.get('mpi_library', 'MPI ?')}, mpi4py {ver.get('mpi4py', '?')}, "
                f"NumPy {ver.get('numpy', '?')}, Numba {ver.get('numba', '?')}")
        if ceiling:
            desc += (f"; one core's ceiling: np.copyto {ceiling['copy_gbs']:.1f} GB/s, "
                     f"np.add {ceiling['add_gbs']:.1f} GB/s (256 MiB arrays)")
        if run.get("config"):
            desc += "; " + ", ".join(f"{k}={v}" for k, v in run["config"].items())
        if desc not in seen:
            seen.add(desc)
            lines.append(desc)
    if png:
        lines += ["", f"![busbw against message size]({png})"]
    for run, op, rows in sections(runs):
        with_mpi = rows[0].get("mpi") is not None
        head = ["size", "count", "fastring time (µs)", "fastring algbw (GB/s)", "fastring busbw (GB/s)"]
        if with_mpi:
            head += ["MPI time (µs)", "MPI busbw (GB/s)", "ratio MPI/fastring"]
        head.append("#wrong")
        lines += ["", f"## {variant(run, op)}", "", f"`{reproduce(run)}`", "",
                  summary(rows, run.get("ceiling")), "",
                  "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        for r in rows:
            cells = [format_bytes(r["bytes"]), f"{r['count']:,}", _fmt(r["fastring"]["time_us"]),
                     _fmt(r["fastring"]["algbw"]), _fmt(r["fastring"]["busbw"])]
            if with_mpi:
                cells += [_fmt(r["mpi"]["time_us"]), _fmt(r["mpi"]["busbw"]), _fmt(r["ratio"])]
            wrong = [r[k]["wrong"] for k, _ in LIBS if r.get(k) is not None]
            cells.append("not checked" if None in wrong else str(sum(wrong)))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[dict], path: str) -> bool:
    """Draw busbw against message size (one panel per op; fastring solid, MPI dashed) into
    `path`; False, writing nothing, when matplotlib cannot be imported.

    Example:
        >>> plot([], "/tmp/none.png") in (True, False)
        True
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = sections(runs)
    ops = list(dict.fromkeys(op for _, op, _ in groups))
    ncols = min(3, max(1, len(ops)))
    nrows = max(1, -(-len(ops) // ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(ops):]:
        ax.set_visible(False)
    for ax, op in zip(axes.flat, ops):
        labels = [variant(run, op).split(", ", 1)[1] for run, o, _ in groups if o == op]
        for i, (run, _, rows) in enumerate(g for g in groups if g[1] == op):
            color = f"C{i}"
            label = labels[i] if labels.count(labels[i]) == 1 else f"{labels[i]}, run {i + 1}"
            for key, name in LIBS:
                if rows[0].get(key) is None:
                    continue
                ax.plot([r["bytes"] for r in rows], [r[key]["busbw"] for r in rows],
                        "-o" if key == "fastring" else "--s", color=color, markersize=3,
                        label=f"{name} ({label})")
        ax.set_xscale("log", base=2)
        ticks = sorted({r["bytes"] for g in groups if g[1] == op for r in g[2]})[::2]
        ax.set_xticks(ticks, [format_bytes(t).replace(" ", "") for t in ticks], rotation=60, fontsize=7)
        ax.set_title(op)
        ax.set_xlabel("message size")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: JSON files in, BENCHMARKS.md (and the PNG) out; returns the exit status.

    Example:
        python scripts/benchmarks_md.py bench.json -o BENCHMARKS.md --png benchmarks.png
    """
    p = argparse.ArgumentParser(description="Write BENCHMARKS.md and a busbw plot from "
                                            "fastring-bench --json output.")
    p.add_argument("json", nargs="+", help="fastring-bench --json output file(s)")
    p.add_argument("-o", "--output", default="BENCHMARKS.md", help="Markdown file (default BENCHMARKS.md)")
    p.add_argument("--png", help="plot file (default: benchmarks.png beside the Markdown)")
    p.add_argument("--no-plot", action="store_true", help="write the Markdown only")
    args = p.parse_args(argv)
    try:
        runs = load_runs(args.json)
    except ValueError as e:
        p.error(str(e))
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    png = None
    if not args.no_plot:
        png_path = args.png or os.path.join(out_dir, "benchmarks.png")
        if plot(runs, png_path):
            png = os.path.relpath(png_path, out_dir)
            print(f"wrote {png_path}")
        else:
            print("matplotlib is not installed: no plot written (pip install matplotlib)")
    with open(args.output, "w") as f:
        f.write(markdown(runs, png))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
