"""horovod.torch.DistributedOptimizer on fastring: gradients are averaged over ranks by
asynchronous allreduces that start, one per parameter, as soon as backward has accumulated that
parameter's gradient (`Tensor.register_post_accumulate_grad_hook`), so that communication
overlaps the rest of the backward pass; `step()` waits for them, then applies the update.
The engine fuses the allreduces that are ready together into one buffer."""
from __future__ import annotations

import functools
import warnings
import weakref
from contextlib import contextmanager
from typing import Iterable

import torch

import fastring
from fastring import Compression, ReduceOp

from fastring._horovod import (ADASUM_OPTIMIZER_UNSUPPORTED, Adasum, full_name, global_process_set, is_native,
                               lean_allreduce)

from .functions import wait_all
from .mpi_ops import Average, sparse_allreduce_async

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizer:
    """The methods a DistributedOptimizer adds to (or overrides in) the wrapped optimizer's
    class; the first base of the class `DistributedOptimizer` builds."""

    def _distribute(self, named: list, compression, backward_passes_per_step: int, op: ReduceOp,
                    gradient_predivide_factor: float, sparse_as_dense: bool, process_set) -> None:
        self._compression = compression
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.backward_passes_per_step = backward_passes_per_step
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._parameter_names = {p: name for name, p in named}
        # On one rank there is nothing to reduce: no hooks, and synchronize() has nothing to do.
        self._requires_update = [p for g in self.param_groups for p in g["params"]
                                 if p.requires_grad] if process_set.size() > 1 else []
        self._allreduce_delay = {p: backward_passes_per_step for p in self._requires_update}
        self._handles: dict = {}   # parameter -> (handle or None, compression context)
        self._synchronized = False
        self._should_synchronize = True
        me = weakref.ref(self)
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(_grad_ready, me))
                       for p in self._requires_update]

    def __del__(self):
        for hook in getattr(self, "_hooks", ()):
            hook.remove()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before the allreduce."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _grad_ready(self, p: torch.Tensor) -> None:
        if self._handles.get(p, (None,))[0] is not None and self._allreduce_delay[p] <= 0:
            raise AssertionError("Gradients were computed more than backward_passes_per_step times "
                                 "before call to step(). Increase backward_passes_per_step to "
                                 "accumulate gradients locally.")
        self._allreduce_delay[p] -= 1
        self._handles[p] = self._allreduce_grad_async(p) if self._allreduce_delay[p] == 0 else (None, None)

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple:
        """Start the allreduce of p's gradient into itself; a parameter without a gradient on
        this rank contributes zeros, so that every rank reduces the same names. A sparse
        gradient is reduced as a sparse one (`sparse_allreduce_async`, replacing p.grad at
        synchronize) unless sparse_as_dense."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse:
            if not self.sparse_as_dense:
                return sparse_allreduce_async(p.grad, self._parameter_names[p], self.op,
                                              self.process_set), _SPARSE
            p.grad = p.grad.to_dense()
        prescale, postscale = 1.0, 1.0
        if self.op == Average:  # Horovod splits the averaging around the sum
            prescale, postscale = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        tensor, ctx = p.grad, None
        compression = self._compression
        if compression is Compression.none:
            handle = lean_allreduce(tensor, self.op, self._parameter_names[p], prescale, postscale,
                                    self.process_set, tensor, asynchronous=True)
            if handle is not None:
                return handle, None
        name = full_name("allreduce", self._parameter_names[p])
        if not is_native(compression):
            tensor, ctx = compression.compress(p.grad)
            compression = None
        handle = fastring.allreduce_async(tensor, op=self.op, name=name, compression=compression,
                                          prescale_factor=prescale, postscale_factor=postscale, out=tensor,
                                          process_set=self.process_set)
        return handle, ctx

    def synchronize(self) -> None:
        """Wait until every gradient has been allreduced (starting the allreduce of those whose
        hooks did not fire: no gradient this step, or fewer backward passes than
        backward_passes_per_step). Call it before changing gradients (clipping), then call
        step() under `skip_synchronize()`."""
        for p in self._requires_update:
            if self._handles.get(p, (None,))[0] is None:
                self._handles[p] = self._allreduce_grad_async(p)
        pending = list(self._handles.items())
        self._handles.clear()
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        results = wait_all(handle for _, (handle, _) in pending)
        for (p, (_, ctx)), result in zip(pending, results):
            if ctx is _SPARSE:
                p.grad = result
            elif not is_native(self._compression):
                p.grad.copy_(self._compression.decompress(result, ctx))
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """Make step() skip its synchronize(), after an explicit one:

            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """synchronize(), then the wrapped optimizer's step."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def local_step(self, closure=None):
        """The wrapped optimizer's step alone, on this rank's gradients as they are."""
        return super().step(closure)

    # torch wraps each optimizer class's step once, to run step hooks; the wrapped class's step
    # (called above) already runs them.
    step.hooked = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped zero_grad; refused while allreduces of this step are outstanding."""
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super().zero_grad(set_to_none)

    def load_state_dict(self, state_dict) -> None:
        """The wrapped load_state_dict, after finishing outstanding allreduces."""
        pending, self._handles = list(self._handles.values()), {}
        wait_all(handle for handle, _ in pending if handle is not None)
        self.set_backward_passes_per_step(self.backward_passes_per_step)
        self._synchronized = False
        return super().load_state_dict(state_dict)


_SPARSE = object()  # the compression context of a sparse gradient's allreduce


def _grad_ready(optimizer_ref, p: torch.Tensor) -> None:
    optimizer = optimizer_ref()
    if optimizer is not None:
        optimizer._grad_ready(p)


@functools.lru_cache(maxsize=None)
def _distributed_class(base: type) -> type:
    """The class of a DistributedOptimizer over `base`: a subclass of it, of the same name."""
    return type(base.__name__, (_DistributedOptimizer, base), {"__module__": base.__module__})


def _named_parameters(optimizer, named_parameters) -> list:
    if named_parameters is None:
        return [(f"param.{g}.{i}", p) for g, group in enumerate(optimizer.param_groups)
                for i, p in enumerate(group["params"])]
    named = list(named_parameters)
    if any(not (isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)) for x in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters()")
    seen, duplicates = set(), set()
    for name, _ in named:
        (duplicates if name in seen else seen).add(name)
    if duplicates:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         + ", ".join(sorted(duplicates)))
    named_ids = {id(p) for _, p in named}
    unnamed = [f"group {g} parameter {i} (shape {tuple(p.shape)})"
               for g, group in enumerate(optimizer.param_groups)
               for i, p in enumerate(group["params"]) if id(p) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were "
                         "not named: " + ", ".join(unnamed))
    return named


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression=Compression.none, backward_passes_per_step: int = 1,
                         op=Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups=None, sparse_as_dense: bool = False,
                         process_set=global_process_set) -> torch.optim.Optimizer:
    """Wrap `optimizer` so that `step()` applies gradients averaged (by `op`) over all ranks.

    Returns an instance of a subclass of the optimizer's class (same name, same parameter
    groups, hyperparameters and state). Each parameter's allreduce starts as soon as backward
    has accumulated its gradient, overlapping the rest of backward; `step()` first waits for
    them (`synchronize()`). Gradients of `backward_passes_per_step` backward passes are summed
    locally before one allreduce. With op=Average, gradients are multiplied by
    1/gradient_predivide_factor before the sum and by gradient_predivide_factor/size after it.
    `compression=Compression.fp16`/`bf16` sends gradients as 16 bits. `num_groups` and
    `groups` are accepted for Horovod compatibility: the engine fuses whatever is ready
    anyway. Sparse gradients (`nn.Embedding(sparse=True)`) stay sparse, reduced by
    `sparse_allreduce_async` (for SparseAdam), unless `sparse_as_dense=True` densifies them
    first. Gradients are reduced over `process_set`'s ranks; only its members may wrap an
    optimizer with it.

    Raises ValueError for duplicate names in `named_parameters`, optimizer parameters
    missing from it or a process set without this rank, and NotImplementedError for
    op=Adasum.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size(), momentum=0.9)
        >>> opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        >>> model(torch.ones(8, 4)).pow(2).mean().backward()
        >>> opt.step(); type(opt).__name__, isinstance(opt, torch.optim.SGD)
        ('SGD', True)
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if op is Adasum:
        raise NotImplementedError(ADASUM_OPTIMIZER_UNSUPPORTED)
    op = ReduceOp(op)
    if not isinstance(process_set, fastring.ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    if not process_set.included():
        raise ValueError(f"rank {fastring.rank()} is not a member of {process_set!r} (or it is not "
                         "registered): only its members may wrap an optimizer with it")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step!r}")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("optimizer is already a DistributedOptimizer")
    named = _named_parameters(optimizer, named_parameters)
    cls = _distributed_class(type(optimizer))
    distributed = cls.__new__(cls)
    # Share the wrapped optimizer's parameter groups, defaults, state and hooks (not an
    # instance-level `step`, such as an LR scheduler's wrapper bound to the original).
    distributed.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k != "step"})
    distributed._distribute(named, compression, backward_passes_per_step, op, float(gradient_predivide_factor),
                            bool(sparse_as_dense), process_set)
    return distributed
