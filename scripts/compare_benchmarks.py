"""Two launches of scripts/run_benchmarks.sh side by side, as markdown for BENCHMARKS.md: every
fastring-bench row (fastring time and MPI / fastring ratio, each run's MPI measured in that
run), then each script's table from both runs.

usage: python scripts/compare_benchmarks.py BEFORE_DIR AFTER_DIR [--label-before X] [--label-after Y]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastring.tools.bench import format_bytes

TABLES = ("sweep", "inplace", "collectives")
SCRIPTS = ("engine", "compression", "bfloor", "ddp")


def rows(folder: Path, table: str) -> dict[tuple, dict]:
    """(op, bytes) -> the fastring-bench row of `table` in a run's folder."""
    path = folder / f"{table}.json"
    if not path.exists():
        return {}
    return {(r["op"], r["bytes"]): r for r in json.loads(path.read_text())["rows"]}


def compare(before: Path, after: Path, labels: tuple[str, str]) -> str:
    """The markdown comparison of two runs' folders."""
    out = []
    for table in TABLES:
        b, a = rows(before, table), rows(after, table)
        if not (a or b):
            continue
        out += [f"`{table}` (fastring µs; MPI / fastring in the same run)", "",
                f"| op | size | {labels[0]} µs | {labels[1]} µs | {labels[0]} ratio | {labels[1]} ratio |",
                "| --- | --- | --- | --- | --- | --- |"]
        for key in sorted(set(a) | set(b), key=lambda k: (k[0], k[1])):
            cells = []
            for run in (b, a):
                r = run.get(key)
                cells.append(f"{r['fastring']['time_us']:.1f}" if r else "-")
            for run in (b, a):
                r = run.get(key)
                cells.append(f"{r['ratio']:.2f}" if r and r["ratio"] else "-")
            out.append(f"| {key[0]} | {format_bytes(key[1])} | " + " | ".join(cells) + " |")
        out.append("")
    for script in SCRIPTS:
        for label, folder in zip(labels, (before, after)):
            path = folder / f"{script}.txt"
            if path.exists():
                out += [f"`{script}`, {label}:", "", "```", path.read_text().rstrip(), "```", ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--label-before", default="before")
    parser.add_argument("--label-after", default="after")
    args = parser.parse_args()
    print(compare(args.before, args.after, (args.label_before, args.label_after)))


if __name__ == "__main__":
    main()
