"""DistributedOptimizer, broadcast_parameters, broadcast_optimizer_state and join on N ranks.

Training checks run in float64 on equal shards of a batch that every rank generates, so each
rank also computes the single-process full-batch reference locally; after several steps of SGD
with momentum the distributed replicas must match it to 1e-9 and be bitwise identical."""
import pickle
import hashlib
import warnings

import torch

import _common as c
import fastring.torch as hvd
from torch_common import (N, R, HalfCompressor, close, expect_error, flat, identical, regression_data,
                          small_model)

B = 4                                   # rows per rank
MINE = slice(R * B, (R + 1) * B)
F64 = torch.float64


def mse(model, x, y, *extra):
    return ((model(x, *extra) - y) ** 2).mean()


def sgd(params, **kwargs):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, **kwargs)


def matches_reference(name, local_step, ref_loss=mse, steps=4, tol=1e-9, model_fn=small_model, **kwargs):
    """Train with DistributedOptimizer(**kwargs) through `local_step(opt, model, x, y)` on this
    rank's shard, and the same model single-process on the full batch with `ref_loss`."""
    model, ref = model_fn(), model_fn()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(), **kwargs)
    ref_opt = sgd(ref.parameters())
    for step in range(steps):
        x, y = regression_data(N * B, seed=step)
        local_step(opt, model, x[MINE], y[MINE])
        ref_opt.zero_grad()
        ref_loss(ref, x, y).backward()
        ref_opt.step()
    close(name, flat(model.parameters()), flat(ref.parameters()), tol)
    identical(name, flat(model.parameters()))
    return opt


def plain_step(opt, model, x, y):
    opt.zero_grad()
    mse(model, x, y).backward()
    opt.step()


# ----------------------------------------------------------------- DistributedOptimizer
opt = matches_reference("SGD momentum", plain_step)
if not isinstance(opt, torch.optim.SGD) or type(opt).__name__ != "SGD":
    c.fail(f"DistributedOptimizer returned a {type(opt).__mro__}")
matches_reference("gradient_predivide_factor", plain_step, gradient_predivide_factor=float(N) + 0.5)
if N > 1:  # the predivision happens before the sum: float16 gradients near the maximum stay finite
    p = torch.nn.Parameter(torch.zeros(8, dtype=torch.float16))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=0.0), gradient_predivide_factor=4.0)
    p.grad = torch.full((8,), 40000.0, dtype=torch.float16)
    opt.synchronize()
    close("gradient_predivide_factor in float16", p.grad, torch.full((8,), 40000.0), 0)
matches_reference("op=Sum", plain_step, ref_loss=lambda m, x, y: N * mse(m, x, y), op=hvd.Sum)


def two_passes(opt, model, x, y):
    opt.zero_grad()
    for half in (slice(0, B // 2), slice(B // 2, B)):
        (0.5 * mse(model, x[half], y[half])).backward()
        if half.start == 0 and any(h is not None for h, _ in opt._handles.values()):
            c.fail("backward_passes_per_step=2: an allreduce started after the first pass")
    opt.step()


matches_reference("backward_passes_per_step=2", two_passes, backward_passes_per_step=2)


def clipped(opt, model, x, y):
    opt.zero_grad()
    mse(model, x, y).backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    with opt.skip_synchronize():
        opt.step()


# skip_synchronize: the reference clips the full-batch gradient the same way
model, ref = small_model(), small_model()
opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
ref_opt = sgd(ref.parameters())
for step in range(4):
    x, y = regression_data(N * B, seed=step)
    clipped(opt, model, x[MINE], y[MINE])
    ref_opt.zero_grad()
    mse(ref, x, y).backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
    ref_opt.step()
close("skip_synchronize + clipping", flat(model.parameters()), flat(ref.parameters()), 1e-9)
identical("skip_synchronize + clipping", flat(model.parameters()))
mse(model, x[MINE], y[MINE]).backward()
opt.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt.step()
if not any("skip_synchronize" in str(w.message) for w in caught):
    c.fail("step() after synchronize() without skip_synchronize() did not warn")


# a parameter used on rank 0 only still takes part (zeros elsewhere): same names everywhere
class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = small_model()
        self.extra = torch.nn.Parameter(torch.linspace(-1, 1, 3, dtype=F64))

    def forward(self, x, use_extra=None):
        out = self.body(x)
        return out * self.extra if (R == 0 if use_extra is None else use_extra) else out


def branchy_reference(model, x, y):
    return sum(mse(model, x[r * B:(r + 1) * B], y[r * B:(r + 1) * B], r == 0) for r in range(N)) / N


matches_reference("parameter without gradient on some ranks", plain_step, ref_loss=branchy_reference,
                  model_fn=Branchy)

# gradient compression: fp16 wire, and a Horovod-shaped custom compressor class
matches_reference("Compression.fp16", plain_step, tol=1e-3, compression=hvd.Compression.fp16)


matches_reference("custom compressor", plain_step, tol=1e-3, compression=HalfCompressor)
if N > 1 and HalfCompressor.calls != 4 * 4:
    c.fail(f"the custom compressor compressed {HalfCompressor.calls} gradients, expected 16")

# errors
model = small_model()
params = list(model.named_parameters())
expect_error("duplicate names", lambda: hvd.DistributedOptimizer(
    sgd(model.parameters()), named_parameters=[("w", p) for _, p in params]), ValueError, "duplicates", "w")
expect_error("missing names", lambda: hvd.DistributedOptimizer(
    sgd(model.parameters()), named_parameters=params[:1]), ValueError, "not named")
expect_error("not (name, parameter)", lambda: hvd.DistributedOptimizer(
    sgd(model.parameters()), named_parameters=model.parameters()), ValueError, "tuples")
expect_error("Adasum", lambda: hvd.DistributedOptimizer(sgd(model.parameters()), op=hvd.Adasum),
             NotImplementedError, "Adasum")
expect_error("predivide with Sum", lambda: hvd.DistributedOptimizer(
    sgd(model.parameters()), op=hvd.Sum, gradient_predivide_factor=2.0), ValueError, "gradient_predivide_factor")
expect_error("backward_passes_per_step=0", lambda: hvd.DistributedOptimizer(
    sgd(model.parameters()), backward_passes_per_step=0), ValueError, "backward_passes_per_step")
expect_error("not an optimizer", lambda: hvd.DistributedOptimizer(model), TypeError, "Optimizer")
opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=params)
expect_error("wrapped twice", lambda: hvd.DistributedOptimizer(opt), ValueError, "already")
x, y = regression_data(B, seed=R)
if N > 1:
    mse(model, x, y).backward()
    expect_error("zero_grad before step", opt.zero_grad, AssertionError, "zero_grad")
    opt.synchronize()
    opt.zero_grad()
    mse(model, x, y).backward()
    expect_error("too many backward passes", lambda: mse(model, x, y).backward(), AssertionError,
                 "backward_passes_per_step")
    opt.synchronize()
del opt

# ----------------------------------------------------------------- broadcast_parameters
def bn_model(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3)).double()
    m(regression_data(5, seed)[0])  # running statistics and num_batches_tracked differ too
    return m


root = N - 1
model = bn_model(R)
hvd.broadcast_parameters(model.state_dict(), root_rank=root)
for (key, got), want in zip(model.state_dict().items(), bn_model(root).state_dict().values()):
    if got.dtype != want.dtype or not torch.equal(got, want):
        c.fail(f"broadcast_parameters(state_dict): {key} differs from rank {root}'s")
model = small_model(R)
hvd.broadcast_parameters(model.named_parameters(), root_rank=0)
close("broadcast_parameters(named_parameters)", flat(model.parameters()), flat(small_model(0).parameters()), 0)
model = small_model(R)
hvd.broadcast_parameters(list(model.parameters()), root_rank=root)
close("broadcast_parameters(parameters)", flat(model.parameters()), flat(small_model(root).parameters()), 0)
expect_error("broadcast_parameters bad root", lambda: hvd.broadcast_parameters(model.state_dict(), N),
             ValueError, "root_rank")
expect_error("broadcast_parameters bad params", lambda: hvd.broadcast_parameters(3, 0), ValueError, "int")


# ----------------------------------------------------------------- broadcast_optimizer_state
def digest(obj):
    """A hash of nested optimizer state (tensors by dtype, shape and bytes)."""
    def plain(o):
        if torch.is_tensor(o):
            return ("tensor", str(o.dtype), tuple(o.shape), o.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        if isinstance(o, dict):
            return sorted((repr(k), plain(v)) for k, v in o.items())
        if isinstance(o, (list, tuple)):
            return [plain(v) for v in o]
        return repr(o)
    return hashlib.sha256(pickle.dumps(plain(obj))).hexdigest()


def optimizer_digest(opt):
    params = [p for g in opt.param_groups for p in g["params"]]
    return digest(([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
                   [opt.state.get(p, {}) for p in params]))


def same_everywhere(name, opt):
    digests = hvd.allgather_object(optimizer_digest(opt))
    if len(set(digests)) != 1:
        c.fail(f"{name}: optimizer state differs across ranks")


def adam(stepped: bool, seed=0):
    model = small_model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (R + 1), betas=(0.8, 0.9 + 0.01 * R))
    if stepped:
        for step in range(2):
            opt.zero_grad()
            mse(model, *regression_data(B, seed=100 * R + step)).backward()
            opt.step()
        opt.state[next(model.parameters())]["custom"] = R + 7  # a scalar entry
    return model, opt


for root in sorted({0, N - 1}):
    for root_stepped, other_stepped in ((True, True), (True, False), (False, True)):
        name = f"broadcast_optimizer_state root {root} stepped {root_stepped}/{other_stepped}"
        model, opt = adam(root_stepped if R == root else other_stepped)
        before, params_before = optimizer_digest(opt), flat(model.parameters()).clone()
        hvd.broadcast_optimizer_state(opt, root_rank=root)
        same_everywhere(name, opt)
        if R == root and root_stepped and optimizer_digest(opt) != before:
            c.fail(f"{name}: the root's state changed")
        if not root_stepped:  # as Horovod, a fresh optimizer's state is made by a zero step
            states = [opt.state.get(p, {}) for p in model.parameters()]
            if not all(int(s.get("step", 0)) == 1 and not s["exp_avg"].any() for s in states):
                c.fail(f"{name}: a fresh root's state was not initialized by one zero step")
        if R == root:
            close(f"{name}: the root's parameters", flat(model.parameters()), params_before, 0)
        if opt.param_groups[0]["lr"] != 0.01 * (root + 1):
            c.fail(f"{name}: lr {opt.param_groups[0]['lr']}")
        # the broadcast state is usable: one more identical step keeps the replicas identical
        hvd.broadcast_parameters(model.state_dict(), root_rank=root)
        opt.zero_grad()
        mse(model, *regression_data(B, seed=7)).backward()
        opt.step()
        identical(name + " after a step", flat(model.parameters()))
        same_everywhere(name + " after a step", opt)

# nested state (L-BFGS's history lists) travels too
model = small_model()
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
x, y = regression_data(B, seed=R)


def closure():
    opt.zero_grad()
    loss = mse(model, x, y)
    loss.backward()
    return loss


opt.step(closure)
hvd.broadcast_optimizer_state(opt, root_rank=0)
same_everywhere("broadcast_optimizer_state L-BFGS", opt)

# a DistributedOptimizer before its first step, as training scripts call it
model = small_model(R)
opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
plain_step(opt, model, *regression_data(B, seed=R))
identical("DistributedOptimizer after broadcasts", flat(model.parameters()))
if N > 1:
    model = small_model()
    mine = list(model.parameters())[:3 if R == 0 else 4]
    expect_error("different parameter groups", lambda: hvd.broadcast_optimizer_state(sgd(mine), 0),
                 ValueError, "differ")

# ----------------------------------------------------------------- join with uneven data
# Rank r has r + 1 batches. After a rank joins, the others' gradient allreduces take zeros from
# it and still divide by N; every rank's model must match that reference after its own steps.
model, ref = small_model(), small_model()
opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
ref_opt = sgd(ref.parameters())


def batch(step, r):
    return regression_data(B, seed=1000 + 10 * step + r)


for step in range(R + 1):
    plain_step(opt, model, *batch(step, R))
    ref_opt.zero_grad()
    (sum(mse(ref, *batch(step, r)) for r in range(N) if step < r + 1) / N).backward()
    ref_opt.step()
last = hvd.join()
if last != N - 1:
    c.fail(f"join returned {last}, expected {N - 1}")
close("join: uneven data", flat(model.parameters()), flat(ref.parameters()), 1e-9)
hvd.broadcast_parameters(model.state_dict(), root_rank=last)
identical("after join and broadcast", flat(model.parameters()))
c.done("fastring.torch DistributedOptimizer, broadcasts, join")
