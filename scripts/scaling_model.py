"""The allreduce cost model of docs/scaling.md: fit, check, predict, plot.

Each link is latency + bytes x per-byte cost (alpha + beta B). With N ranks, H hosts of L
ranks each (placed host by host) and a buffer of B bytes:
  flat ring     2 (N - 1) steps of B / N bytes, each crossing a host link when H > 1:
                T = 2 (N - 1) (alpha_x + beta_x B / N)
  hierarchical  in k = ceil(B / S) slices of b = B / k bytes (S: hierarchical.slice_bytes):
                host reduce-scatter and allgather of a slice through the host's shared
                segment, which costs what the segment's allreduce of b bytes over L ranks
                costs, written like a ring's for the fit,
                    host(b) = 2 (L - 1) (alpha_h + beta_h b / L),
                and L cross-host rings at once, 2 (H - 1) steps, whose chunks of b / (L H)
                share the host link, b / H per step in all,
                    cross(b) = 2 (H - 1) (alpha_x + beta_x b / H);
                the host work on the neighbouring slices runs beside each slice's crossing:
                T = host(b) + k max(cross(b), host(b))
alpha_h, beta_h are fitted on one host (2 ranks, fastring.allreduce through the segment, 1 MiB
and up), alpha_x, beta_x across 2 simulated hosts of one rank at the measured link rate. At another rate R the wire's share of beta_x, 8 / R s/B,
changes and the rest (the CPU's and TCP's per-byte cost) stays.

Every point of 1 MiB and up with several hosts, other than the 2 x 1 fit, checks the model;
smaller ones (below tc's burst, and run in the negotiation cycle or by MPI in practice) are
shown but not checked. Simulated hosts
share one machine's cores, so the links must be slow enough for the wire, not the CPU, to set
the pace (docs/scaling.md uses 1 Gbit/s on a 2-core machine).

usage:
    python scripts/scaling_model.py DIR [DIR ...] [--stat min_s|median_s] [--plot docs/scaling.png]
where each DIR holds the JSON rows of scripts/multihost_bench.py, one file per launch, and
rate.txt, the link rate of the simulated hosts in bit/s (docs/scaling.md gives the launches);
each point counts with its least time over the DIRs' launches.
The fit and the check use one statistic of each row's calls: `min_s` (the default) is the
cost on an idle machine as nearly as a busy one shows it; `median_s` includes what other
processes take from the ranks. Exits 1 if the model misses a point outside the fit by more
than 25%.
"""
from __future__ import annotations

import argparse
import glob
import json
import os

import numpy as np

from fastring.algorithms.hierarchical import slice_bytes
from fastring.tools.simcluster import TBF_MIN_BURST

RANKS_PER_HOST = 8
PREDICT_RANKS = (8, 16, 32, 64, 128, 256, 512, 1024)
PREDICT_RATES_GBIT = (10, 25, 100)
PREDICT_BYTES = 64 << 20
TOLERANCE = 0.25
FIT_FROM_BYTES = 1 << 20


def load(directories: list[str], stat: str) -> tuple[list[dict], float]:
    """One row per variant, hosts x ranks and size: the one whose `stat` is the least over
    the launches in `directories` (each holds one JSON file per launch, and rate.txt, the link
    rate in bit/s, the same in all); and that rate."""
    best: dict[tuple, dict] = {}
    rates = set()
    for directory in directories:
        for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
            with open(path) as f:
                for r in json.load(f):
                    key = (r["mode"], r["hosts"], r["ranks"], r["bytes"])
                    if key not in best or r[stat] < best[key][stat]:
                        best[key] = r
        with open(os.path.join(directory, "rate.txt")) as f:
            rates.add(float(f.read().strip()))
    if len(rates) != 1:
        raise SystemExit(f"the directories were measured at different link rates: {sorted(rates)}")
    return list(best.values()), rates.pop()


def fit_link(rows: list[dict], stat: str) -> tuple[float, float]:
    """(alpha, beta) of T = 2 (N - 1) (alpha + beta B / N) over `rows`: beta by least squares
    on the messages of FIT_FROM_BYTES and more, alpha from the smallest message's steps: all
    of its time per step where a step's bytes fit in tc's token bucket (TBF_MIN_BURST), which
    lets them through at memory speed, so that they show latency but no rate; otherwise what
    is left after the per-byte cost."""
    def per_step(r):
        return r[stat] / (2 * (r["ranks"] - 1))
    large = [r for r in rows if r["bytes"] >= FIT_FROM_BYTES]
    beta, _ = np.polyfit([r["bytes"] / r["ranks"] for r in large], [per_step(r) for r in large], 1)
    smallest = min(rows, key=lambda r: r["bytes"])
    if smallest["bytes"] / smallest["ranks"] <= TBF_MIN_BURST:
        return per_step(smallest), beta
    return max(per_step(smallest) - beta * smallest["bytes"] / smallest["ranks"], 0.0), beta


class Model:
    """The fitted links; `flat` and `hierarchical` predict seconds for one allreduce."""

    def __init__(self, host: tuple[float, float], cross: tuple[float, float], rate: float):
        self.alpha_h, self.beta_h = host
        self.alpha_x, self.beta_x = cross
        self.overhead_x = max(self.beta_x - 8 / rate, 0.0)  # per byte beyond the wire

    def predict(self, algorithm: str, nbytes: float, hosts: int, per_host: int) -> float:
        """A measured point's prediction, at the measured link rate."""
        run = self.hierarchical if algorithm == "hierarchical" else self.flat
        return run(nbytes, hosts, per_host)

    def cross_beta(self, rate: float | None) -> float:
        return self.beta_x if rate is None else 8 / rate + self.overhead_x

    def flat(self, nbytes: float, hosts: int, per_host: int, rate: float | None = None) -> float:
        n = hosts * per_host
        alpha, beta = (self.alpha_x, self.cross_beta(rate)) if hosts > 1 else (self.alpha_h, self.beta_h)
        return 2 * (n - 1) * (alpha + beta * nbytes / n)

    def hierarchical(self, nbytes: float, hosts: int, per_host: int, rate: float | None = None) -> float:
        slices = max(1, -(-int(nbytes) // slice_bytes(hosts)))
        b = nbytes / slices
        host = 2 * (per_host - 1) * (self.alpha_h + self.beta_h * b / per_host)
        cross = 2 * (hosts - 1) * (self.alpha_x + self.cross_beta(rate) * b / hosts)
        return host + slices * max(cross, host)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directories", nargs="+", help="directories of launches (the least time of each point counts)")
    p.add_argument("--stat", default="min_s", choices=("min_s", "median_s"), help="statistic of each row's calls")
    p.add_argument("--plot", help="write the prediction plot (PNG) here")
    args = p.parse_args()
    stat = args.stat
    rows, rate = load(args.directories, stat)
    # the algorithms themselves, run on the same Reduction (scripts/multihost_bench.py)
    fastring_rows = [r for r in rows if r["mode"] in ("flat_ring", "hierarchical")]
    # the host's shared segment: fastring.allreduce on one host takes it from 1 MiB up
    host = fit_link([r for r in rows if r["hosts"] == 1 and r["mode"] == "fastring" and r["algorithm"] == "shm"],
                    stat)
    cross = fit_link([r for r in fastring_rows if r["hosts"] == 2 and r["ranks"] == 2], stat)
    model = Model(host, cross, rate)
    print(f"host link:  alpha {model.alpha_h * 1e6:.1f} us, beta {model.beta_h * 1e9:.3f} ns/B "
          f"({8 / model.beta_h / 1e9:.1f} Gbit/s)")
    print(f"cross link: alpha {model.alpha_x * 1e6:.1f} us, beta {model.beta_x * 1e9:.3f} ns/B "
          f"({8 / model.beta_x / 1e9:.2f} Gbit/s at a {rate / 1e9:g} Gbit/s link)\n")

    print(f"| hosts x ranks | algorithm | size | measured ms ({stat}) | model ms | error |")
    print("| --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    for r in sorted(fastring_rows, key=lambda r: (r["hosts"], r["ranks"], r["algorithm"], r["bytes"])):
        hosts, per_host = r["hosts"], r["ranks"] // r["hosts"]
        if hosts == 1:
            continue
        want = model.predict(r["algorithm"], r["bytes"], hosts, per_host)
        error = want / r[stat] - 1
        fitted = hosts == 2 and per_host == 1
        checked = not fitted and r["bytes"] >= FIT_FROM_BYTES
        worst = max(worst, abs(error)) if checked else worst
        size = f"{r['bytes'] >> 20} MiB" if r["bytes"] >= 1 << 20 else f"{r['bytes'] >> 10} KiB"
        print(f"| {hosts} x {per_host} | {r['algorithm']}{' (fit)' if fitted else '' if checked else ' (not checked)'} | {size} | "
              f"{r[stat] * 1e3:.1f} | {want * 1e3:.1f} | {error:+.0%} |")
    print(f"\nlargest error of the checked points (outside the fit, {FIT_FROM_BYTES >> 20} MiB and up): "
          f"{worst:.0%} (target {TOLERANCE:.0%})\n")

    print(f"Predicted allreduce of {PREDICT_BYTES >> 20} MiB, {RANKS_PER_HOST} ranks per host (ms):\n")
    print("| ranks | hosts | " + " | ".join(f"{g} Gbit/s flat | {g} Gbit/s hier." for g in PREDICT_RATES_GBIT) + " |")
    print("| --- | --- | " + " | ".join("--- | ---" for _ in PREDICT_RATES_GBIT) + " |")
    curves = {g: ([], []) for g in PREDICT_RATES_GBIT}
    for n in PREDICT_RANKS:
        hosts = n // RANKS_PER_HOST
        cells = []
        for g in PREDICT_RATES_GBIT:
            flat = model.flat(PREDICT_BYTES, hosts, RANKS_PER_HOST, g * 1e9)
            hier = (model.hierarchical(PREDICT_BYTES, hosts, RANKS_PER_HOST, g * 1e9) if hosts > 1
                    else flat)
            curves[g][0].append(flat)
            curves[g][1].append(hier)
            cells.append(f"{flat * 1e3:.0f} | {hier * 1e3:.0f}")
        print(f"| {n} | {hosts} | " + " | ".join(cells) + " |")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for g, (flat, hier) in curves.items():
            line, = ax.plot(PREDICT_RANKS, np.array(hier) * 1e3, marker="o", label=f"hierarchical, {g} Gbit/s")
            ax.plot(PREDICT_RANKS, np.array(flat) * 1e3, ls="--", color=line.get_color(), label=f"flat ring, {g} Gbit/s")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"ranks ({RANKS_PER_HOST} per host)")
        ax.set_ylabel(f"allreduce of {PREDICT_BYTES >> 20} MiB (ms, model)")
        ax.set_title("fastring allreduce: flat ring vs hierarchical (fitted cost model)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    raise SystemExit(main())
