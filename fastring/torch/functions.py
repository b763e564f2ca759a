"""Model and optimizer state helpers of horovod.torch: broadcast_parameters,
broadcast_optimizer_state, broadcast_object, allgather_object."""
from __future__ import annotations

from typing import Iterable

import torch


from fastring._horovod import allgather_object, broadcast_object, global_process_set, wait_all

from .mpi_ops import broadcast_async_, rank

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object"]


def broadcast_parameters(params, root_rank: int, *, process_set=global_process_set) -> None:
    """Overwrite parameters (and buffers) on every rank (of `process_set`) with `root_rank`'s,
    in place.

    `params` is a `model.state_dict()` (broadcast in key order), a list or iterator of
    `(name, tensor)` pairs such as `model.named_parameters()`, or of plain tensors.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> model = torch.nn.Linear(3, 2)
        >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, Iterable) and not isinstance(params, (str, bytes, torch.Tensor)):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params).__name__}")
    wait_all([broadcast_async_(p, root_rank, name, process_set) for name, p in items])


class _TensorSlot:
    """A tensor of the root's optimizer state, described by its shape and dtype only."""

    __slots__ = ("shape", "dtype")

    def __init__(self, tensor: torch.Tensor):
        self.shape, self.dtype = tuple(tensor.shape), tensor.dtype

    def fits(self, value) -> bool:
        return torch.is_tensor(value) and tuple(value.shape) == self.shape and value.dtype == self.dtype


def _layout(optimizer) -> tuple:
    """(group options, params per group, {param index: {key: value or _TensorSlot}})."""
    options = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    counts = [len(g["params"]) for g in optimizer.param_groups]
    state = {}
    for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"]):
        entries = optimizer.state.get(p)
        if entries:
            state[i] = {k: _TensorSlot(v) if torch.is_tensor(v) else v for k, v in entries.items()}
    return options, counts, state


def _initialize_state(optimizer: torch.optim.Optimizer) -> None:
    """As Horovod: an optimizer without state yet takes one step of zero gradients (every
    parameter that requires one gets a zero gradient if it has none), so that its state exists
    and has its shapes. The parameters are put back as they were (a zero gradient still moves
    them under weight decay). The wrapped class's own step runs, never a DistributedOptimizer's
    (whose allreduces the other ranks would not join). An optimizer whose step cannot run so
    (L-BFGS wants a closure) keeps no state: it still receives the root's."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for p in params:
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
    saved = [p.detach().clone() for p in params]
    try:
        getattr(optimizer, "local_step", optimizer.step)()
    except Exception:  # noqa: BLE001 - e.g. L-BFGS needs a closure: the root's state still comes
        pass
    finally:
        with torch.no_grad():
            for p, value in zip(params, saved):
                p.copy_(value)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, *,
                              process_set=global_process_set) -> None:
    """Make every rank's optimizer state and hyperparameters those of `root_rank`.

    Tensor state (momentum buffers, Adam's moments and step, ...) is broadcast tensor by
    tensor into place; everything else (learning rates, betas, scalar or nested state such
    as L-BFGS's history) travels with one `broadcast_object`. Ranks whose optimizer has no
    state yet (a fresh optimizer) get the root's; state the root does not have is dropped.
    Every rank must have the same parameter groups, with as many parameters each.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> opt = torch.optim.Adam(torch.nn.Linear(3, 2).parameters())
        >>> hvd.broadcast_optimizer_state(opt, root_rank=0)
    """
    if not optimizer.state:
        _initialize_state(optimizer)
    root = rank() == root_rank
    options, counts, state = broadcast_object(_layout(optimizer) if root else None, root_rank,
                                              name="optimizer_state.layout", process_set=process_set)
    local_counts = [len(g["params"]) for g in optimizer.param_groups]
    problems = allgather_object(None if local_counts == counts else local_counts,
                                name="optimizer_state.check", process_set=process_set)
    if any(problems):
        raise ValueError("broadcast_optimizer_state: the parameter groups differ between ranks: "
                         + "; ".join(f"rank {r}: {c}" for r, c in enumerate(problems) if c)
                         + f"; rank {root_rank}: {counts}")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    tensors = []
    for i, p in enumerate(params):
        slots = state.get(i)
        if not root:
            if slots is None:
                optimizer.state.pop(p, None)
                continue
            old = optimizer.state.get(p, {})
            optimizer.state[p] = {
                k: (old[k] if v.fits(old.get(k)) else torch.empty(v.shape, dtype=v.dtype))
                if isinstance(v, _TensorSlot) else v
                for k, v in slots.items()}
        for k, v in (slots or {}).items():
            if isinstance(v, _TensorSlot):
                tensors.append((f"optimizer_state.{i}.{k}", optimizer.state[p][k]))
    if not root:
        for group, opts in zip(optimizer.param_groups, options):
            for k in [k for k in group if k != "params" and k not in opts]:
                del group[k]
            group.update(opts)
    wait_all([broadcast_async_(t, root_rank, name, process_set) for name, t in tensors])
