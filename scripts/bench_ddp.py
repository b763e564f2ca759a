"""Time per training step of the example's model (examples/train_mnist_like.py): fastring.torch's
DistributedOptimizer against torch.nn.parallel.DistributedDataParallel over gloo, in one launch.

Run (np=2 is the performance configuration on a 2-core machine):
    fastring-run -np 2 python scripts/bench_ddp.py [--steps 200] [--rounds 5] [--json out.json]
    fastring-run -np 2 python scripts/bench_ddp.py --wide --batch-size 4 --steps 10
    fastring-run -np 2 python scripts/bench_ddp.py --model embedding --reuse-memory --batch-size 4 --steps 10

--model picks the model (--wide is --model wide):
  example    the example's Net;
  wide       an MLP of about 25M float32 parameters (784-4096-4096-1024-10) on the same data.
             At a tiny batch its step is still mostly compute: forward and backward each read
             the 97 MB of weights, and backward writes 97 MB of gradients;
  embedding  a bag-of-ids classifier: a 242,000 x 100 embedding table (24.2M float32
             parameters, a dense gradient, as recommendation models train) and a linear layer,
             each sample 16 ids drawn per rank; its compute is small, so the step is
             communication-bound: 97 MB of gradients to average every step.
--reuse-memory makes glibc's malloc keep freed memory for reuse (no mmap, no trim), what
PyTorch's CPU tuning guide gets from jemalloc or tcmalloc. Without it every step maps each
large gradient afresh and takes a page fault per 4 KiB touched (16-24 thousand a step), which
this sandboxed machine makes expensive; the table's "faults" column counts them.

A step is zero_grad + forward + loss + backward + optimizer step (SGD with momentum), on a fixed
batch of --batch-size samples per rank, one torch thread per rank. Both methods start from
the same weights; they run in alternating rounds (fastring, DDP, fastring, ...) after warm-up,
so drift in the machine's load affects both alike. A step's time is the slowest rank's; the
table gives its median and quartiles over all timed steps, and "local" is the same step with
no communication at all (what the gradient exchange costs is the difference).

--floors adds what the communication alone costs on the same gradient buffers (after the
steps, medians of --steps repetitions, the slowest rank's): fastring's allreduce of every
gradient in place (one per parameter, started together as the optimizer's hooks do, then
waited for), gloo's allreduce of the same, and the copy-once floor (every rank copies its
gradients once, all at the same time). With one core per rank, backward and the reduction
share that core, so the local step plus the allreduce alone is about as fast as a step can
be; "floor step" prints that sum.
--summarize A.json B.json ... prints, for launches written with --json, each launch's median
ms/step and the ratio DDP / fastring, then that ratio's minimum and median over the launches.

gloo is initialised with env:// on MASTER_ADDR=127.0.0.1 and a free port chosen by rank 0;
rank and world size come from MPI.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import resource
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI

import fastring.torch as hvd
from bench_shm import timed

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_mnist_like.py"


def load_example():
    spec = importlib.util.spec_from_file_location("train_mnist_like", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_gloo(comm) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(comm.bcast(free_port() if comm.rank == 0 else None, root=0))
    dist.init_process_group("gloo", init_method="env://", rank=comm.rank, world_size=comm.size)


def wide_mlp() -> torch.nn.Module:
    """About 25M float32 parameters on the example's 1x28x28 inputs."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 4096), torch.nn.ReLU(),
                               torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 10), torch.nn.LogSoftmax(dim=1))


class BagOfIds(torch.nn.Module):
    """A 242,000 x 100 embedding table (24.2M float32 parameters, dense gradient) averaged
    over each sample's ids, then a linear layer to the 10 classes."""

    ROWS, WIDTH, IDS = 242_000, 100, 16

    def __init__(self):
        super().__init__()
        self.table = torch.nn.EmbeddingBag(self.ROWS, self.WIDTH, mode="mean")
        self.head = torch.nn.Linear(self.WIDTH, 10)

    def forward(self, ids):
        return F.log_softmax(self.head(self.table(ids)), dim=1)


def reuse_freed_memory() -> None:
    """glibc malloc: serve every allocation from the heap and never give memory back, so a
    step reuses the pages the last one freed instead of faulting fresh ones in."""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_max = -1, -4  # malloc.h
    if not (libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1)):
        raise RuntimeError("mallopt refused the settings")


def timed_steps(model, optimizer, data, target, steps: int, comm) -> tuple[list[float], list[int]]:
    """Per-step seconds of the slowest rank, and page faults per step, summed over ranks."""
    times, faults = [], []
    comm.Barrier()
    for _ in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        optimizer.zero_grad()
        F.nll_loss(model(data), target).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return ([max(per_rank) for per_rank in zip(*comm.allgather(times))],
            [sum(per_rank) for per_rank in zip(*comm.allgather(faults))])


def floors(model, steps: int, comm) -> dict[str, float]:
    """Milliseconds (median over `steps`, slowest rank) of the gradient exchange alone on
    `model`'s gradients: fastring, gloo, and every rank copying its gradients once."""
    grads = [p.grad for p in model.parameters()]
    copies = [torch.empty_like(g) for g in grads]
    names = [f"floor.{i}" for i in range(len(grads))]

    def fastring_alone():
        handles = [hvd.allreduce_async_(g, name=n, op=hvd.Average) for g, n in zip(reversed(grads), reversed(names))]
        for h in handles:
            hvd.synchronize(h)

    def gloo_alone():
        works = [dist.all_reduce(g, async_op=True) for g in reversed(grads)]
        for w in works:
            w.wait()

    def copy_once():
        for c, g in zip(copies, grads):
            c.copy_(g)

    result = {}
    for what, fn in (("fastring allreduce alone", fastring_alone), ("gloo allreduce alone", gloo_alone),
                     ("copy once (floor)", copy_once)):
        fn()
        result[what] = 1e3 * statistics.median(timed(fn, 1, comm, barrier=True) for _ in range(steps))
    return result


def summarize(paths: list[str]) -> None:
    runs = [json.load(open(p)) for p in paths]
    print("| launch | model | freed memory | fastring ms | DDP ms | local ms | DDP / fastring |")
    print("|---|---|---|---:|---:|---:|---:|")
    ratios = []
    for path, run in zip(paths, runs):
        ms = {m: r["median_ms"] for m, r in run["results"].items()}
        ratios.append(ms["ddp"] / ms["fastring"])
        print(f"| {Path(path).name} | {run['model']} | {'reused' if run['reuse_memory'] else 'unmapped'} | "
              f"{ms['fastring']:.1f} | {ms['ddp']:.1f} | {ms['local']:.1f} | {ratios[-1]:.2f} |")
    print(f"\nDDP / fastring over {len(runs)} launches: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--summarize", nargs="+", metavar="JSON", help="summarize earlier launches and exit")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per method per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--json", help="also write the results to this file (rank 0)")
    parser.add_argument("--model", choices=("example", "wide", "embedding"), default="example")
    parser.add_argument("--wide", dest="model", action="store_const", const="wide", help="--model wide")
    parser.add_argument("--reuse-memory", action="store_true",
                        help="glibc malloc keeps freed memory for reuse (see the module docstring)")
    parser.add_argument("--floors", action="store_true", help="also time the gradient exchange alone")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return

    comm = MPI.COMM_WORLD
    if args.reuse_memory:
        reuse_freed_memory()
    torch.set_num_threads(1)
    hvd.init()
    init_gloo(comm)
    example = load_example()
    data, target = example.make_dataset(args.batch_size, seed=100 + comm.rank).tensors
    if args.model == "embedding":
        data = torch.randint(BagOfIds.ROWS, (args.batch_size, BagOfIds.IDS),
                             generator=torch.Generator().manual_seed(200 + comm.rank))
    models = {"example": example.Net, "wide": wide_mlp, "embedding": BagOfIds}

    def build(method: str):
        torch.manual_seed(0)
        model = models[args.model]()
        if method == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
        if method == "fastring":
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        return model, optimizer

    methods = ["fastring", "ddp", "local"]
    built = {m: build(m) for m in methods}
    for m in methods:
        timed_steps(*built[m], data, target, args.warmup, comm)
    times: dict[str, list[float]] = {m: [] for m in methods}
    faults: dict[str, list[int]] = {m: [] for m in methods}
    for _ in range(args.rounds):
        for m in methods:
            t, f = timed_steps(*built[m], data, target, args.steps, comm)
            times[m] += t
            faults[m] += f

    alone = floors(built["local"][0], args.steps, comm) if args.floors else {}

    if comm.rank == 0:
        rows = {}
        for m in methods:
            q1, median, q3 = statistics.quantiles(times[m], n=4)
            rows[m] = {"median_ms": 1e3 * median, "q1_ms": 1e3 * q1, "q3_ms": 1e3 * q3,
                       "steps": len(times[m]), "faults": statistics.median(faults[m])}
        what = {"wide": "wide MLP (784-4096-4096-1024-10)",
                "embedding": f"bag of ids ({BagOfIds.ROWS} x {BagOfIds.WIDTH} embedding, linear)",
                "example": "example model (examples/train_mnist_like.py Net)"}[args.model]
        params = sum(p.numel() for p in built["local"][0].parameters())
        print(f"{what}, {params / 1e6:.1f}M parameters, np={comm.size}, batch "
              f"{args.batch_size}/rank, {args.rounds}x{args.steps} steps per method, torch "
              f"{torch.__version__}, freed memory {'reused' if args.reuse_memory else 'unmapped'}")
        print(f"{'method':<34} {'median ms/step':>15} {'q1':>8} {'q3':>8} {'vs DDP':>8} {'faults':>8}")
        labels = {"fastring": "fastring DistributedOptimizer", "ddp": "DDP (gloo)",
                  "local": "local step, no communication"}
        for m in methods:
            r = rows[m]
            print(f"{labels[m]:<34} {r['median_ms']:>15.3f} {r['q1_ms']:>8.3f} {r['q3_ms']:>8.3f} "
                  f"{r['median_ms'] / rows['ddp']['median_ms']:>8.3f} {r['faults']:>8.0f}")
        for what, ms in alone.items():
            print(f"{what:<34} {ms:>15.3f}")
        if alone:
            print(f"{'floor step: local + fastring alone':<34} "
                  f"{rows['local']['median_ms'] + alone['fastring allreduce alone']:>15.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"np": comm.size, "model": args.model, "reuse_memory": args.reuse_memory,
                           "batch_size": args.batch_size, "results": rows, "alone_ms": alone}, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
