"""Process sets on N ranks: every collective of the core and of fastring.torch restricted to a
set, sets running side by side and beside the global set, the optimizer and the broadcasts
of a set, and every error (a rank outside the set, mismatches inside it, a set that the
ranks register differently, removed or unregistered sets)."""
import numpy as np
import torch
from mpi4py import MPI

import _common as c
import fastring
import fastring.torch as hvd
from torch_common import close, expect_error, regression_data

N, R = c.SIZE, c.RANK
fastring.init()

evens = fastring.add_process_set(range(0, N, 2))
odds = fastring.add_process_set(range(1, N, 2))
mine, other = (evens, odds) if R % 2 == 0 else (odds, evens)
ranks = mine.ranks
n, me = len(ranks), ranks.index(R)
if (mine.size(), mine.rank(), mine.included(), other.included()) != (n, me, True, False):
    c.fail(f"ProcessSet queries: {mine.size()}, {mine.rank()}, {mine.included()}, {other.included()}")
if evens.process_set_id != 1 or odds.process_set_id != 2:
    c.fail(f"process set ids {evens.process_set_id}, {odds.process_set_id}")

# ----------------------------------------------------------------- core collectives in a set
x = np.arange(5, dtype=np.int64) + 10 * R
c.check_close("allreduce Sum", fastring.allreduce(x, op=fastring.Sum, process_set=mine),
              sum(np.arange(5) + 10 * r for r in ranks), 0)
big = np.full(40000, float(R + 1))  # above the in-cycle size: the ring of the set
c.check_close("allreduce large Average", fastring.allreduce(big, op=fastring.Average, process_set=mine),
              np.full(40000, sum(r + 1.0 for r in ranks) / n), 1e-12)
# async requests of a set fuse with each other while the global set has its own in flight
handles = [fastring.allreduce_async(np.full(7, float(R * i)), op=fastring.Sum, name=f"s{i}", process_set=mine)
           for i in range(6)]
world = fastring.allreduce_async(np.ones(3), op=fastring.Sum, name="w")
for i, h in enumerate(handles):
    c.check_close(f"async allreduce {i}", h.wait(), np.full(7, float(sum(r * i for r in ranks))), 0)
c.check_close("global allreduce beside the sets", world.wait(), np.full(3, float(N)), 0)
got = fastring.grouped_allreduce([np.full(2, R, np.int32), np.full(3, 2 * R, np.int32)], op=fastring.Sum,
                                 process_set=mine)
c.check_close("grouped_allreduce", got[1], np.full(3, 2 * sum(ranks), np.int32), 0)
rows = fastring.allgather(np.full((R + 1, 2), R, np.float32), process_set=mine)
c.check_close("allgather (set rank order)", rows,
              np.concatenate([np.full((r + 1, 2), r, np.float32) for r in ranks]), 0)
for root in ranks:  # roots are global ranks
    c.check_close(f"broadcast root {root}", fastring.broadcast(np.full(4, R * 1.5), root, process_set=mine),
                  np.full(4, root * 1.5), 0)
splits = [k + 1 for k in range(n)]
out, received = fastring.alltoall(np.full(sum(splits), R, np.int64), splits=splits, process_set=mine)
c.check_close("alltoall", out, np.repeat(np.array(ranks, np.int64), me + 1), 0)
c.check_close("alltoall received splits", received, np.full(n, me + 1, np.int32), 0)
scattered = fastring.reducescatter(np.arange(2 * n, dtype=np.float64).reshape(n, 2) + R, op=fastring.Sum,
                                   process_set=mine)
c.check_close("reducescatter", scattered, (np.arange(2 * n, dtype=np.float64).reshape(n, 2)[me:me + 1]
                                           * n + sum(ranks)), 0)
fastring.barrier(process_set=mine)
if fastring.broadcast_object({"from": R}, ranks[-1], process_set=mine) != {"from": ranks[-1]}:
    c.fail("broadcast_object in a set")
if fastring.allgather_object(R, process_set=mine) != ranks:
    c.fail("allgather_object in a set")
# join in a set: the set's last rank keeps reducing; the rank join returns is global
if R == ranks[-1]:
    c.check_close("allreduce while the rest of the set joined",
                  fastring.allreduce(np.ones(2), op=fastring.Sum, name="late", process_set=mine),
                  np.ones(2), 0)
last = fastring.join(process_set=mine)
if last != ranks[-1]:
    c.fail(f"join in a set returned {last}, expected {ranks[-1]}")

# ----------------------------------------------------------------- errors
expect_error("a rank outside the set", lambda: fastring.allreduce(x, process_set=other), ValueError,
             f"rank {R}", "not a member")
expect_error("a broadcast root outside the set", lambda: fastring.broadcast(x, other.ranks[0], process_set=mine),
             ValueError, "root_rank", str(other.ranks[0]))
expect_error("an unregistered set", lambda: fastring.allreduce(x, process_set=fastring.ProcessSet([R])),
             ValueError, "not registered")
expect_error("a duplicate set", lambda: fastring.add_process_set(evens.ranks), ValueError, "already")
expect_error("every rank is the global set", lambda: fastring.add_process_set(range(N)), ValueError, "global")
expect_error("ranks out of range", lambda: fastring.add_process_set([N]), ValueError, "[0,")
if n > 1:  # a mismatch inside the set reaches every member, and the set goes on working
    expect_error("shape mismatch in a set", lambda: fastring.allreduce(np.ones(2 + me), name="bad", process_set=mine),
                 fastring.FastringError, "shape")
    c.check_close("after the mismatch", fastring.allreduce(np.ones(1), op=fastring.Sum, process_set=mine),
                  np.full(1, float(n)), 0)
# the ranks must register the same set (a collective of every rank)
expect_error("ranks register different sets", lambda: fastring.add_process_set([0] if R == 0 else [N - 1, 0]),
             fastring.FastringError, "ranks")

# ----------------------------------------------------------------- fastring.torch in a set
t = torch.full((3,), float(R + 1), dtype=torch.float64, requires_grad=True)
y = hvd.allreduce(t, op=hvd.Sum, process_set=mine)
close("torch allreduce", y, torch.full((3,), sum(r + 1.0 for r in ranks)), 0)
y.backward(torch.full((3,), float(R)))
close("torch allreduce grad (an allreduce in the set)", t.grad, torch.full((3,), float(sum(ranks))), 0)
g = hvd.allgather(torch.full((1, 2), float(R)), process_set=mine)
close("torch allgather", g, torch.tensor([[float(r)] * 2 for r in ranks]), 0)
b = torch.full((2,), float(R))
hvd.broadcast_(b, ranks[0], process_set=mine)
close("torch broadcast_", b, torch.full((2,), float(ranks[0])), 0)

# each set trains its own model with its own optimizer; the set's replicas stay identical and
# match a local reference over the set's ranks' data alone
torch.manual_seed(0)
model = torch.nn.Linear(6, 3).double()
with torch.no_grad():
    for p in model.parameters():
        p.add_(R)  # differs per rank until broadcast_parameters
hvd.broadcast_parameters(model.state_dict(), root_rank=ranks[0], process_set=mine)
reference = torch.nn.Linear(6, 3).double()
reference.load_state_dict(model.state_dict())
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters(), process_set=mine)
hvd.broadcast_optimizer_state(opt, root_rank=ranks[0], process_set=mine)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
for step in range(3):
    opt.zero_grad()
    xb, yb = regression_data(4, seed=100 * step + R)
    torch.nn.functional.mse_loss(model(xb), yb).backward()
    opt.step()
    ref_opt.zero_grad()
    (sum(torch.nn.functional.mse_loss(reference(*regression_data(4, seed=100 * step + r)[:1]),
                                      regression_data(4, seed=100 * step + r)[1]) for r in ranks) / n).backward()
    ref_opt.step()
close("DistributedOptimizer in a set", torch.cat([p.detach().view(-1) for p in model.parameters()]),
      torch.cat([p.detach().view(-1) for p in reference.parameters()]), 1e-12)
expect_error("an optimizer over a set without this rank",
             lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), process_set=other),
             ValueError, "not a member")

# ----------------------------------------------------------------- removal, communicator sets
if not (hvd.remove_process_set(odds) and hvd.remove_process_set(evens)):
    c.fail("remove_process_set returned False for registered sets")
if fastring.remove_process_set(odds) or fastring.remove_process_set(fastring.global_process_set):
    c.fail("remove_process_set returned True for a removed set or the global set")
expect_error("a removed set", lambda: fastring.allreduce(x, process_set=mine), ValueError, "not registered")
# a set of the first N - 1 ranks given by its members as their communicator, by the last as ranks
head = list(range(N - 1))
low = MPI.COMM_WORLD.Split(0 if R < N - 1 else 1, key=R)
first = fastring.ProcessSet(low if R < N - 1 else head)
tail = fastring.ProcessSet([N - 1])
fastring.shutdown()
fastring.init(process_sets=[first, tail])  # sets given to init are registered in order
if (first.process_set_id, tail.process_set_id, first.ranks) != (1, 2, head):
    c.fail(f"sets given to init: ids {first.process_set_id}, {tail.process_set_id}, ranks {first.ranks}")
if R < N - 1:
    c.check_close("allreduce in a set made from a communicator",
                  fastring.allreduce(np.ones(1), op=fastring.Sum, process_set=first), np.full(1, N - 1.0), 0)
low.Free()
fastring.shutdown()
if first.process_set_id is not None or tail.process_set_id is not None:
    c.fail("shutdown left a process set registered")
c.done("process sets")
