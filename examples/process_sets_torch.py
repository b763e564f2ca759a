"""Two groups of ranks training two different models side by side with Horovod process sets,
written as a horovod.torch script: only the import line differs.

The even ranks fit a linear regression, the odd ranks a small classifier. Each group is a
process set: its parameters are broadcast within the set, its DistributedOptimizer averages
gradients over the set only, and its metric is an allreduce over the set; the two sets never
wait for each other. At the end one global allreduce reports both groups' losses to every
rank, and each set checks that its replicas are bitwise identical (exit status 1 if not).

Run (any number of ranks from 2):
    fastring-run -np 4 python examples/process_sets_torch.py
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from mpi4py import MPI

import fastring.torch as hvd

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=200)
steps = parser.parse_args().steps

world = MPI.COMM_WORLD.Get_size()
even_set = hvd.ProcessSet(list(range(0, world, 2)))
odd_set = hvd.ProcessSet(list(range(1, world, 2)))
hvd.init(process_sets=[even_set, odd_set])

rank = hvd.rank()
my_set = even_set if rank % 2 == 0 else odd_set
torch.manual_seed(1234 + rank)  # every rank starts differently: broadcast_parameters fixes that

if my_set is even_set:  # regression: y = x @ w_true + noise
    model = torch.nn.Linear(8, 1)
    w_true = torch.linspace(-1, 1, 8).unsqueeze(1)

    def batch(step):
        g = torch.Generator().manual_seed(10_000 * my_set.rank() + step)
        x = torch.randn(32, 8, generator=g)
        return x, x @ w_true + 0.01 * torch.randn(32, 1, generator=g)
    loss_fn = F.mse_loss
else:  # classification of which half-space a point lies in
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    def batch(step):
        g = torch.Generator().manual_seed(20_000 * my_set.rank() + step)
        x = torch.randn(32, 4, generator=g)
        return x, (x.sum(1) > 0).long()
    loss_fn = F.cross_entropy

hvd.broadcast_parameters(model.state_dict(), root_rank=my_set.ranks[0], process_set=my_set)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * my_set.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     process_set=my_set)
hvd.broadcast_optimizer_state(optimizer, root_rank=my_set.ranks[0], process_set=my_set)

for step in range(steps):
    x, y = batch(step)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    if step % 50 == 49 or step == steps - 1:
        mean_loss = hvd.allreduce(loss.detach(), name="loss", process_set=my_set)
        if my_set.rank() == 0:
            print(f"{'regression' if my_set is even_set else 'classifier'} (ranks {my_set.ranks}) "
                  f"step {step + 1}: loss {mean_loss.item():.4f}", flush=True)

# one global collective: every rank learns both groups' final losses
final = torch.zeros(2)
final[rank % 2] = loss.detach() / my_set.size()
both = hvd.allreduce(final, op=hvd.Sum, name="final")
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
identical = bool((hvd.allgather(flat.unsqueeze(0), process_set=my_set) == flat).all())
ok = hvd.allreduce(torch.tensor([int(identical)]), op=hvd.Min, name="ok").item() == 1
if rank == 0:
    print(f"final losses: regression {both[0]:.4f}, classifier {both[1]:.4f}; "
          f"replicas {'identical' if ok else 'DIFFERENT'} within each set", flush=True)
sys.exit(0 if ok else 1)
