"""Horovod parity of fastring.torch on N ranks: grouped allgather and reducescatter (core and
torch), the gradients of allgather, broadcast, alltoall and reducescatter against finite
differences of the ranks' summed losses, Horovod's error classes, sparse gradients,
broadcast_optimizer_state for every torch.optim optimizer, and SyncBatchNorm against
BatchNorm on the concatenated batch."""
import hashlib
import pickle

import numpy as np
import torch

import _common as c
import fastring
import fastring.torch as hvd
from torch_common import close, expect_error

N, R = c.SIZE, c.RANK
F64 = torch.float64
hvd.init()

# ----------------------------------------------------------------- grouped allgather / reducescatter
mine = [np.full((R + 1, 2), R, np.int16), np.arange(3.0) + R, np.zeros((0, 4), np.uint8)]
got = fastring.grouped_allgather(mine)
expected = [np.concatenate([np.full((r + 1, 2), r, np.int16) for r in range(N)]),
            np.concatenate([np.arange(3.0) + r for r in range(N)]), np.zeros((0, 4), np.uint8)]
for i, (g, e) in enumerate(zip(got, expected)):
    c.check_close(f"grouped_allgather tensor {i}", g, e, 0)
    if g.dtype != e.dtype:
        c.fail(f"grouped_allgather tensor {i}: dtype {g.dtype}")
handle = fastring.grouped_allgather_async([np.array([R])], name="ga")
c.check_close("grouped_allgather_async", handle.wait()[0], np.arange(N), 0)
shapes = [(2 * N + 1, 3), (N,), (1, 2)]  # uneven splits, one row per rank, fewer rows than ranks
inputs = [[np.random.default_rng([r, i]).integers(-50, 50, s).astype(np.int32) for i, s in enumerate(shapes)]
          for r in range(N)]
for op in (fastring.Sum, fastring.Average, fastring.Max):
    got = fastring.grouped_reducescatter(inputs[R], op=op)
    for i, s in enumerate(shapes):
        whole = [fastring.reducescatter(inputs[R][i], op=op)]  # the ungrouped collective
        c.check_close(f"grouped_reducescatter {op.name} tensor {i}", got[i], whole[0], 0)
floats = [x.astype(np.float64) / 3 for x in inputs[R]]
got = fastring.grouped_reducescatter_async(floats, op=fastring.Average, prescale_factor=2.0, name="gr").wait()
for i, g in enumerate(got):
    c.check_close(f"grouped_reducescatter float Average prescaled {i}", g,
                  fastring.reducescatter(floats[i], op=fastring.Average, prescale_factor=2.0), 1e-12)
expect_error("grouped_reducescatter mixed dtypes",
             lambda: fastring.grouped_reducescatter([np.ones(2), np.ones(2, np.float32)]), TypeError, "dtype")
expect_error("grouped_allgather no tensors", lambda: fastring.grouped_allgather([]), ValueError, "at least one")
if N > 1:
    expect_error("grouped_allgather trailing shape mismatch",
                 lambda: fastring.grouped_allgather([np.ones((1, 2 + (R == 0)))]), fastring.FastringError, "shape")
# torch: results, async, and the gradients match the ungrouped collectives'
ts = [torch.arange(6, dtype=F64).reshape(3, 2) + R, torch.full((R + 1,), float(R), dtype=F64)]
got = hvd.synchronize(hvd.grouped_allgather_async(ts))
close("torch grouped_allgather_async", got[1], torch.cat([torch.full((r + 1,), float(r)) for r in range(N)]), 0)
for grouped, single in ((hvd.grouped_allgather, hvd.allgather),
                        (lambda xs: hvd.grouped_reducescatter(xs, op=hvd.Sum), lambda x: hvd.reducescatter(x, op=hvd.Sum))):
    xs = [t.clone().requires_grad_() for t in ts[:1]] + [torch.ones(N + 1, 2, dtype=F64, requires_grad=True)]
    ys = [t.clone().requires_grad_() for t in ts[:1]] + [torch.ones(N + 1, 2, dtype=F64, requires_grad=True)]
    outs = grouped(xs)
    sum(((o * (k + R + 1)) ** 2).sum() for k, o in enumerate(outs)).backward()
    sum(((single(y) * (k + R + 1)) ** 2).sum() for k, y in enumerate(ys)).backward()
    for k in range(2):
        close(f"grouped gradient {k} ({single.__name__ if hasattr(single, '__name__') else 'reducescatter'})",
              xs[k].grad, ys[k].grad, 1e-9)

# ----------------------------------------------------------------- gradients vs finite differences
# The loss of rank k is L_k = sum(w_k * y_k); the finite difference of sum_k L_k in one input
# element of rank r is computed by every rank together. Horovod's gradients are that true
# gradient times a constant per op: allgather 1/N (it averages), broadcast 1/N on the root,
# alltoall 1, reducescatter N for Sum and for Average (Horovod's definition).
def finite_difference(forward, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """d(sum over ranks of sum(w * forward(x)))/dx of every rank's x, this rank's part."""
    total = torch.zeros_like(x)
    h = 0.5
    sizes = hvd.allgather_object(x.numel())  # every rank perturbs each rank's elements in turn
    for r in range(N):
        for i in range(sizes[r]):
            losses = []
            for sign in (1.0, -1.0):
                xp = x.detach().clone()
                if r == R:
                    xp.view(-1)[i] += sign * h
                losses.append(hvd.allreduce((w * forward(xp)).sum(), op=hvd.Sum))
            if r == R:
                total.view(-1)[i] = (losses[0] - losses[1]) / (2 * h)
    return total


splits = [(k + R) % 2 + 1 for k in range(N)]
cases = [
    ("allgather", lambda x: hvd.allgather(x), (R + 1, 2), 1.0 / N),
    ("broadcast root last", lambda x: hvd.broadcast(x, N - 1), (2, 2), 1.0 / N),
    ("alltoall", lambda x: hvd.alltoall(x, splits=splits)[0], (sum(splits) + 1, 2), 1.0),
    ("reducescatter Sum", lambda x: hvd.reducescatter(x, op=hvd.Sum), (N + 1, 2), float(N)),
    ("reducescatter Average", lambda x: hvd.reducescatter(x, op=hvd.Average), (N + 1, 2), float(N)),
]
for name, forward, shape, factor in cases:
    x = (torch.arange(int(np.prod(shape)), dtype=F64).reshape(shape) / 7 + R).requires_grad_()
    y = forward(x)
    w = torch.linspace(-1, 1, y.numel(), dtype=F64).reshape(y.shape) * (R + 1)
    (w * y).sum().backward()
    fd = finite_difference(forward, x, w)
    close(f"{name} gradient = {factor:g} x finite difference", x.grad, factor * fd, 1e-9)

# ----------------------------------------------------------------- Horovod's error classes
if hvd.HorovodInternalError is not fastring.FastringError or not issubclass(hvd.HostsUpdatedInterrupt, RuntimeError):
    c.fail("HorovodInternalError / HostsUpdatedInterrupt are not fastring's classes")
if N > 1:
    try:
        hvd.allreduce(torch.ones(2 + R), name="mismatch")
        c.fail("a shape mismatch raised nothing")
    except hvd.HorovodInternalError as e:
        if "shape" not in str(e):
            c.fail(f"HorovodInternalError does not say what differed: {e}")

# ----------------------------------------------------------------- sparse
g = torch.sparse_coo_tensor([[R, N]], [1.0 + R, 10.0], (N + 1, ), check_invariants=True)
for op in (hvd.Sum, hvd.Average):
    got = hvd.synchronize(hvd.sparse_allreduce_async(g, f"sp.{op.name}", op))
    dense = hvd.allreduce(g.to_dense(), op=op)
    if not got.is_sparse:
        c.fail("sparse_allreduce_async returned a dense tensor")
    close(f"sparse_allreduce_async {op.name}", got.to_dense(), dense, 1e-12)
expect_error("sparse_allreduce_async of a dense tensor", lambda: hvd.sparse_allreduce_async(torch.ones(2), "d", hvd.Sum),
             TypeError, "sparse")


def embedding_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Embedding(10, 3, sparse=True).double()


def batch(step, r):
    return torch.tensor([[(step + r) % 10, (2 * r + 1) % 10, 4], [r % 10, 9, (step * 3) % 10]])


for sparse_as_dense, optimizer in ((False, lambda p: torch.optim.SparseAdam(list(p), lr=0.1)),
                                   (True, lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.5))):
    model, ref = embedding_model(1), embedding_model(1)
    opt = hvd.DistributedOptimizer(optimizer(model.parameters()), named_parameters=model.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    ref_opt = optimizer(ref.parameters())
    for step in range(3):
        opt.zero_grad()
        (model(batch(step, R)) ** 2).sum().backward()
        opt.step()
        ref_opt.zero_grad()
        (sum((ref(batch(step, r)) ** 2).sum() for r in range(N)) / N).backward()
        if sparse_as_dense:
            ref.weight.grad = ref.weight.grad.to_dense()
        ref_opt.step()
    close(f"nn.Embedding(sparse=True) sparse_as_dense={sparse_as_dense}", model.weight, ref.weight, 1e-12)


# ----------------------------------------------------------------- broadcast_optimizer_state
def digest(opt):
    def plain(o):
        if torch.is_tensor(o):
            return ("tensor", str(o.dtype), tuple(o.shape), o.detach().double().numpy().tobytes())
        if isinstance(o, dict):
            return sorted((repr(k), plain(v)) for k, v in o.items())
        if isinstance(o, (list, tuple)):
            return [plain(v) for v in o]
        return repr(o)
    params = [p for group in opt.param_groups for p in group["params"]]
    return hashlib.sha256(pickle.dumps(plain(([{k: v for k, v in group.items() if k != "params"}
                                                for group in opt.param_groups],
                                              [opt.state.get(p, {}) for p in params])))).hexdigest()


class NoGrad(torch.nn.Module):
    """Horovod's test model: an integer parameter without gradient, an unused parameter (its
    gradient stays None), and a used one."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
        self.unused = torch.nn.Parameter(torch.ones(2, 2))
        self.b = torch.nn.Parameter(torch.linspace(0, 1, 4) + R)
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(torch.index_select(self.b, 0, self.a.long()).repeat(2) * x)


optimizers = sorted((cls for cls in torch.optim.Optimizer.__subclasses__() if cls.__module__.startswith("torch.optim")),
                    key=lambda cls: cls.__name__)
tried = []
for cls in optimizers:
    for tensor_lr in (False, True):
        model = NoGrad()
        try:
            lr = torch.tensor(0.01 * (R + 1)) if tensor_lr else 0.01 * (R + 1)
            opt = cls([p for p in model.parameters() if p.requires_grad], lr=lr)
        except (TypeError, ValueError):
            continue  # this optimizer does not accept the model (or a tensor lr)
        data = [torch.linspace(-1, 1, 4) * (R + 1)]  # rank-dependent until the broadcasts

        def closure():
            opt.zero_grad()
            loss = model(data[0]).pow(2).sum()
            loss.backward()
            return loss
        try:
            opt.step(closure)
        except (RuntimeError, ValueError):
            continue  # e.g. an optimizer that refuses a 1-D parameter only at its first step
        tried.append(f"{cls.__name__}{' (tensor lr)' if tensor_lr else ''}")
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        if len(set(hvd.allgather_object(digest(opt)))) != 1:
            c.fail(f"broadcast_optimizer_state {cls.__name__}: state differs across ranks")
        lr_now = opt.param_groups[0]["lr"]
        if abs(float(lr_now) - 0.01) > 1e-8 or torch.is_tensor(lr_now) != tensor_lr:
            c.fail(f"broadcast_optimizer_state {cls.__name__}: lr {lr_now!r}")
        data[0] = torch.linspace(-1, 1, 4)
        opt.step(closure)  # the same step everywhere keeps the replicas identical
        if len(set(hvd.allgather_object(digest(opt)))) != 1:
            c.fail(f"broadcast_optimizer_state {cls.__name__}: a step after it diverged")
if not {"Adam", "SGD", "RMSprop", "Adagrad", "LBFGS"} <= {t.split()[0] for t in tried}:
    c.fail(f"broadcast_optimizer_state covered only {tried}")
# Horovod's no-grad case: a fresh DistributedOptimizer, then broadcasts; the gradient of a
# parameter without one stays None, the others get zeros (one zero step made the state)
model = NoGrad()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9,
                                               nesterov=True), named_parameters=model.named_parameters())
before = [p.detach().clone() for p in model.parameters()]
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
if model.a.grad is not None or model.b.grad is None:
    c.fail("broadcast_optimizer_state: the gradients of the no-grad model are not Horovod's")
close("the zero step leaves the root's parameters alone", model.b.detach(), before[2] if R == 0 else model.b, 0)
close("broadcast of a zero gradient", hvd.broadcast(model.b.grad, root_rank=0), torch.zeros(4), 0)

# ----------------------------------------------------------------- SyncBatchNorm
for dtype, shape, momentum in ((F64, (3, 4, 5), 0.1), (torch.float32, (2, 4), None)):
    torch.manual_seed(5)
    full = torch.randn((shape[0] * N,) + shape[1:], dtype=dtype) * 3 + 1
    weights = torch.randn(full.shape, dtype=dtype)
    sync = hvd.SyncBatchNorm(4, momentum=momentum).to(dtype)
    local = torch.nn.BatchNorm1d(4, momentum=momentum).to(dtype)
    with torch.no_grad():
        for m in (sync, local):
            m.weight.copy_(torch.linspace(0.5, 2, 4))
            m.bias.copy_(torch.linspace(-1, 1, 4))
    rows = slice(shape[0] * R, shape[0] * (R + 1))
    tol = 1e-12 if dtype == F64 else 2e-5
    for step in range(2):
        x1, x2 = full[rows].clone().requires_grad_(), full.clone().requires_grad_()
        y1, y2 = sync(x1), local(x2)
        close(f"SyncBatchNorm {dtype} {shape} output", y1, y2[rows], tol)
        (y1 * weights[rows]).sum().backward()
        (y2 * weights).sum().backward()
        close(f"SyncBatchNorm {dtype} input gradient", x1.grad, x2.grad[rows], tol)
        close(f"SyncBatchNorm {dtype} weight gradient (summed over ranks)",
              hvd.allreduce(sync.weight.grad, op=hvd.Sum), local.weight.grad, 10 * tol)
        sync.weight.grad = local.weight.grad = sync.bias.grad = local.bias.grad = None
        full = full * 0.5 + 1
    close(f"SyncBatchNorm {dtype} running_mean", sync.running_mean, local.running_mean, tol)
    close(f"SyncBatchNorm {dtype} running_var", sync.running_var, local.running_var, tol)
    sync.eval()
    local.eval()
    close(f"SyncBatchNorm {dtype} eval", sync(full[rows]), local(full)[rows], tol)
expect_error("SyncBatchNorm 1-D input", lambda: hvd.SyncBatchNorm(4)(torch.ones(4)), ValueError, "2D")
c.done("fastring.torch Horovod parity")
