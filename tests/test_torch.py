"""fastring.torch, the drop-in replacement for horovod.torch: the multi-rank suites ported from
Horovod's test_torch.py (tests/workers/torch_*.py) at 2 and 3 ranks, the training example under
fastring-run, and what a single process can check (API surface, Horovod's signatures, local
errors, the optimizer subclass, doctests)."""
import inspect
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import check_doctests  # noqa: E402
import fastring  # noqa: E402
from fastring import _horovod  # noqa: E402
import fastring.torch as hvd  # noqa: E402
from fastring.torch import compression, functions, mpi_ops, optimizer  # noqa: E402

SIZES = [2, 3]
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_mnist_like.py"


@pytest.mark.parametrize("n", SIZES)
def test_collectives(mpirun, n):
    mpirun(n, "torch_collectives")


@pytest.mark.parametrize("n", SIZES)
def test_autograd(mpirun, n):
    mpirun(n, "torch_autograd")


@pytest.mark.parametrize("n", SIZES)
def test_optimizer_broadcasts_join(mpirun, n):
    mpirun(n, "torch_optimizer")


def test_example_trains_and_ends_with_identical_replicas():
    run = os.path.join(os.path.dirname(sys.executable), "fastring-run")
    proc = subprocess.run([run, "-np", "2", sys.executable, str(EXAMPLE), "--epochs", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    epochs = re.findall(r"epoch (\d): train loss [\d.]+ accuracy [\d.]+% \| test loss [\d.]+ accuracy ([\d.]+)%",
                        proc.stdout)
    assert [e for e, _ in epochs] == ["1", "2"], proc.stdout
    assert float(epochs[-1][1]) > 80.0, proc.stdout  # it learns
    assert "replicas identical on all 2 ranks" in proc.stdout


API_MD_NAMES = """init shutdown rank size local_rank local_size cross_rank cross_size Average Sum Min
Max Product Compression allreduce allreduce_ allreduce_async allreduce_async_ grouped_allreduce
grouped_allreduce_ grouped_allreduce_async grouped_allreduce_async_ allgather allgather_async
broadcast broadcast_ broadcast_async broadcast_async_ alltoall reducescatter barrier join
synchronize poll broadcast_object allgather_object broadcast_parameters broadcast_optimizer_state
DistributedOptimizer start_timeline stop_timeline Adasum is_initialized alltoall_async
reducescatter_async""".split()


def test_every_name_of_the_contract_exists():
    missing = [n for n in API_MD_NAMES if not hasattr(hvd, n)]
    assert not missing
    assert set(hvd.__all__) >= set(API_MD_NAMES)
    assert all(hasattr(hvd, n) for n in hvd.__all__)
    assert hvd.Compression is fastring.Compression and compression.Compression is fastring.Compression


# Horovod's positional order, so that positional calls written for horovod.torch work.
HOROVOD_SIGNATURES = {
    "allreduce": "tensor average name compression op prescale_factor postscale_factor process_set",
    "allreduce_async": "tensor average name op prescale_factor postscale_factor process_set",
    "allreduce_": "tensor average name op prescale_factor postscale_factor process_set",
    "allreduce_async_": "tensor average name op prescale_factor postscale_factor process_set",
    "grouped_allreduce": "tensors average name compression op prescale_factor postscale_factor process_set",
    "grouped_allreduce_async_": "tensors average name op prescale_factor postscale_factor process_set",
    "allgather": "tensor name process_set",
    "broadcast": "tensor root_rank name process_set",
    "broadcast_async_": "tensor root_rank name process_set",
    "alltoall": "tensor splits name process_set",
    "reducescatter": "tensor name compression op process_set prescale_factor postscale_factor",
    "reducescatter_async": "tensor name op process_set prescale_factor postscale_factor",
    "broadcast_object": "obj root_rank name process_set",
    "allgather_object": "obj name process_set",
    "broadcast_parameters": "params root_rank",
    "broadcast_optimizer_state": "optimizer root_rank",
    "join": "device",
    "start_timeline": "file_path mark_cycles",
    "DistributedOptimizer": "optimizer named_parameters compression backward_passes_per_step op "
                            "gradient_predivide_factor num_groups groups sparse_as_dense process_set",
}


@pytest.mark.parametrize("name", sorted(HOROVOD_SIGNATURES))
def test_horovod_positional_order(name):
    # keyword-only extras (process_set= where Horovod has none) leave the positional order alone
    params = inspect.signature(getattr(hvd, name)).parameters.values()
    assert [p.name for p in params if p.kind != p.KEYWORD_ONLY] == HOROVOD_SIGNATURES[name].split()


def test_defaults_are_horovods():
    sig = inspect.signature(hvd.DistributedOptimizer).parameters
    assert sig["compression"].default is hvd.Compression.none
    assert sig["op"].default == hvd.Average and sig["backward_passes_per_step"].default == 1
    assert sig["gradient_predivide_factor"].default == 1.0
    assert inspect.signature(hvd.allreduce).parameters["op"].default is None  # None means Average
    assert inspect.signature(hvd.broadcast_object).parameters["root_rank"].default == 0


def test_doctests():
    hvd.init()
    check_doctests((mpi_ops, functions, optimizer, compression, hvd, _horovod), more_than=60)


@pytest.fixture
def one_rank():
    hvd.init()
    yield
    hvd.init()


def test_adasum_is_a_distinct_op(one_rank):
    assert all(hvd.Adasum != op for op in fastring.ReduceOp)
    model = torch.nn.Linear(2, 1)
    # on one rank the Adasum of a tensor is the tensor (tests/workers/adasum.py: N ranks)
    assert torch.equal(hvd.allreduce(torch.tensor([1.0, 2.0]), op=hvd.Adasum), torch.tensor([1.0, 2.0]))
    assert torch.equal(hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(2)], op=hvd.Adasum))[0], torch.ones(2))
    with pytest.raises(ValueError, match="compression"):
        hvd.allreduce(torch.ones(2), op=hvd.Adasum, compression=hvd.Compression.fp16)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)


def test_local_argument_errors(one_rank):
    with pytest.raises(TypeError, match="complex64"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(torch.ones(2), 1)
    with pytest.raises(ValueError, match="average"):
        hvd.allreduce_(torch.ones(2), average=True, op=hvd.Sum)
    with pytest.raises(TypeError, match="process_set"):
        hvd.barrier(process_set="evens")
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(2), process_set=hvd.ProcessSet([0]))
    with pytest.raises(NotImplementedError):
        hvd.init(comm=[0, 1])
    model = torch.nn.Linear(2, 2)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="duplicates: a"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("a", p) for _, p in named])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named[1:])


def test_quick_host_view_and_the_async_path_of_every_kind_of_tensor(one_rank):
    """The hot path's quick view (fastring._core.tensor.host_view) shares a plain CPU tensor's
    memory and leaves every other tensor to the general path, which still gets each right."""
    from fastring._core.tensor import host_view

    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    view = host_view(t)
    assert view is not None and view.ctypes.data == t.data_ptr() and view.shape == (2, 3)
    grad = torch.ones(3, requires_grad=True)
    bf16 = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    conj = torch.tensor([1 + 2j, 3 - 1j]).conj()
    for other in (grad, bf16, conj, t.to("meta"), bytearray(b"ab")):
        assert host_view(other) is None, other
    # through allreduce_async_ + synchronize: in place, exact on one rank
    for x in (torch.arange(-5, 5, dtype=torch.int64), bf16.clone(), torch.ones(4, dtype=torch.float16) / 3):
        expected = x.clone()
        assert hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Sum)) is x
        assert torch.equal(x, expected) and x.dtype == expected.dtype
    assert torch.equal(hvd.synchronize(hvd.allreduce_async(grad.detach() * 2, op=hvd.Sum)), torch.full((3,), 2.0))
    assert torch.equal(hvd.allreduce(grad, op=hvd.Sum), torch.ones(3))  # requires_grad: the general path
    with pytest.raises(TypeError, match="complex"):
        hvd.allreduce_async_(conj.resolve_conj(), op=hvd.Sum)
    with pytest.raises(NotImplementedError, match="meta"):
        hvd.synchronize(hvd.allreduce_async_(t.to("meta"), op=hvd.Sum))


def test_the_lean_path_takes_plain_calls_and_leaves_every_other_to_the_general_path(one_rank, monkeypatch):
    """_horovod.lean_allreduce: a plain allreduce (a ReduceOp, no scale factors, a host tensor
    numpy can view) skips the rest of Horovod's translation; anything else returns None,
    having done nothing, and the general path gets it right or raises. Every plain entry
    point of fastring.torch, the optimizer's hook included, takes it."""
    from fastring import Handle
    from fastring._core.runtime import runtime

    lean = _horovod.lean_allreduce
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    handle = lean(t, hvd.Sum, "lean", 1.0, 1.0, hvd.global_process_set, t, asynchronous=True)
    assert type(handle) is Handle and handle.name == "allreduce.lean" and hvd.synchronize(handle) is t
    unnamed = lean(t, hvd.Sum, None, 1.0, 1.0, None, None, asynchronous=True)
    assert type(unnamed) is Handle and ".noname." in unnamed.name
    assert torch.equal(hvd.synchronize(unnamed), t) and hvd.synchronize(unnamed) is not t
    assert lean(t, hvd.Sum, "sync", 1.0, 1.0, None, t, asynchronous=False) is t
    assert "allreduce.sync" in runtime().engine._lone_calls  # the lean call's name, prefixed
    copy = lean(t, hvd.Sum, "sync", 1.0, 1.0, None, None, asynchronous=False)
    assert type(copy) is torch.Tensor and torch.equal(copy, t) and copy.data_ptr() != t.data_ptr()
    bf16 = torch.ones(2, dtype=torch.bfloat16)
    for args in ((t, 0, "n", 1.0, 1.0), (t, hvd.Sum, 7, 1.0, 1.0), (t, hvd.Sum, "n", 2.0, 1.0),
                 (t, hvd.Sum, "n", 1, 1.0), (t, hvd.Sum, "n", 1.0, 0.5), (bf16, hvd.Sum, "n", 1.0, 1.0),
                 (torch.ones(2, requires_grad=True), hvd.Sum, "n", 1.0, 1.0), (t.to("meta"), hvd.Sum, "n", 1.0, 1.0)):
        for out in (None, args[0], torch.empty_like(args[0])):  # another out: not the lean path's
            for asynchronous in (True, False):
                assert lean(*args, None, out, asynchronous=asynchronous) is None, (args, out, asynchronous)
    # what the lean path leaves, the general path does: scale factors, an int op, bfloat16 ...
    x = torch.tensor([1.0, -3.0])
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, name="scaled"), torch.tensor([2.0, -6.0]))
    assert torch.equal(hvd.allreduce(x, op=int(hvd.Sum), name="int op"), x)
    assert torch.equal(hvd.synchronize(hvd.allreduce_async(bf16, op=hvd.Sum, name="bf16")), bf16)
    assert torch.equal(hvd.allreduce(torch.arange(5), name="int mean"), torch.arange(5))  # exact integer mean
    with pytest.raises(TypeError, match="name must be a string"):
        hvd.allreduce_async_(x, name=7)
    with pytest.raises(TypeError, match="name must be a string"):
        hvd.allreduce(x, name=7)
    # the result of an out-of-place call is the caller's own: the input changed later leaves it
    y = torch.tensor([0.1, 0.2], dtype=torch.float64)
    result = hvd.allreduce(y, op=hvd.Sum, name="own")
    y += 1
    assert torch.equal(result, torch.tensor([0.1, 0.2], dtype=torch.float64))
    # every plain entry point goes through it (the optimizer's hook: called directly, as one
    # rank registers none)
    taken = []

    def counted(*args, **kwargs):
        taken.append(args[2])
        return lean(*args, **kwargs)
    monkeypatch.setattr(mpi_ops, "lean_allreduce", counted)
    monkeypatch.setattr(optimizer, "lean_allreduce", counted)
    z = torch.ones(3)
    hvd.allreduce(z, name="a")
    hvd.allreduce_(z, name="b")
    hvd.synchronize(hvd.allreduce_async(z, name="c"))
    hvd.synchronize(hvd.allreduce_async_(z, name="d"))
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()
    hvd.synchronize(opt._allreduce_grad_async(model.weight)[0])
    assert taken == ["a", "b", "c", "d", "weight"]


def test_distributed_optimizer_is_the_wrapped_class_and_shares_its_state(one_rank):
    model = torch.nn.Linear(3, 1)
    base = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(2, 3)).sum().backward()
    base.step()  # state before wrapping is kept
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.Adam) and type(opt).__name__ == "Adam" and type(opt) is not torch.optim.Adam
    assert opt.param_groups is base.param_groups and opt.state is base.state and opt.defaults is base.defaults
    assert type(opt) is type(hvd.DistributedOptimizer(torch.optim.Adam(model.parameters())))  # one class per base
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. the scheduler's "step() before optimizer.step()"
        opt.step()
        scheduler.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    state = opt.state_dict()
    opt.load_state_dict(state)
    assert int(opt.state[next(model.parameters())]["step"]) == 2


def test_one_rank_training_equals_the_plain_optimizer(one_rank):
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 2).double(), torch.nn.Linear(4, 2).double()
    b.load_state_dict(a.state_dict())
    opt_a = hvd.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9),
                                     named_parameters=a.named_parameters(), backward_passes_per_step=2)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(8, 4, dtype=torch.float64)
    for _ in range(3):
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            model(x[:4]).pow(2).mean().backward()
            model(x[4:]).pow(2).mean().backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
