"""horovod.torch's collectives on fastring: Horovod's names, positional order and defaults,
adapted onto the framework-agnostic core (`fastring.allreduce(..., out=)`, `_async` handles).

What this module adds to the core, and nothing else:
- Horovod's arguments: the deprecated `average=` beside `op=`, `process_set=` (passed to the
  core), in-place `_` variants (the core's `out=tensor`), Horovod-shaped custom compressors;
- names prefixed by the collective's kind, as Horovod does ("allreduce.<name>"), so that one
  user name may be used by different collectives at the same time;
- autograd: allreduce, grouped_allreduce, allgather, broadcast, alltoall and reducescatter are
  differentiable, with Horovod's gradients.
"""
from __future__ import annotations

from typing import Sequence

import torch

import fastring
from fastring import Compression, FastringError, Handle, ReduceOp
from fastring._horovod import (Adasum, Average, Max, Min, Product, Sum, cross_rank, cross_size, is_initialized,
                               local_rank, local_size, rank, shutdown, size, ProcessSet, add_process_set, ccl_built, compressed, cuda_built, ddl_built, full_name, gloo_built, gloo_enabled,
                               global_process_set, horovod_op, init, is_native, lean_allreduce, mpi_built, mpi_enabled,
                               mpi_threads_supported, nccl_built, remove_process_set, rocm_built, start_adasum)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    "Average", "Sum", "Min", "Max", "Product", "Adasum", "ReduceOp", "Compression", "FastringError",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "barrier", "join",
    "grouped_allgather", "grouped_allgather_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "synchronize", "poll", "start_timeline", "stop_timeline", "sparse_allreduce_async",
    "HorovodInternalError", "HostsUpdatedInterrupt",
]

# Horovod's error names: `except hvd.HorovodInternalError` catches fastring's cross-rank errors.
HorovodInternalError = fastring.FastringError
HostsUpdatedInterrupt = fastring.HostsUpdatedInterrupt


class _Deferred:
    """A handle whose result is made from core handles' results once they complete."""

    __slots__ = ("handles", "finish")

    def __init__(self, handles: list, finish):
        self.handles, self.finish = handles, finish  # finish(results) -> the result

    def done(self) -> bool:
        return all(h.done() for h in self.handles)

    def wait(self):
        return self.finish([h.wait() for h in self.handles])

    __call__ = wait  # Horovod's sparse_allreduce_async returns a function to call

    def then_first(self) -> "_Deferred":
        """The same handle, giving the first of its results (a list of one)."""
        return _Deferred(self.handles, lambda results: self.finish(results)[0])


def _copy_back(handle: Handle, targets: list) -> _Deferred:
    """The handle of an in-place grouped collective: the results are written into `targets`,
    which are returned."""
    def finish(results):
        for target, result in zip(targets, results[0]):
            target.copy_(result)
        return targets
    return _Deferred([handle], finish)


def synchronize(handle):
    """Wait for an asynchronous operation and return its result (or raise its error).

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.allreduce_async(torch.ones(2), op=hvd.Sum))   # on 1 rank
        tensor([1., 1.])
    """
    if type(handle) is Handle or isinstance(handle, _Deferred):
        return handle.wait()
    return fastring.synchronize(handle)


def poll(handle) -> bool:
    """True once the operation behind `handle` has finished; `synchronize` then returns at
    once. Never blocks.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> h = hvd.allreduce_async(torch.ones(2)); hvd.synchronize(h) is not None and hvd.poll(h)
        True
    """
    if isinstance(handle, _Deferred):
        return handle.done()
    return fastring.poll(handle)


# ----------------------------------------------------------------- Adasum
def _adasum(tensors: list, name, prescale_factor: float, postscale_factor: float, process_set,
            compression, targets: list | None = None) -> _Deferred:
    """op=Adasum in any allreduce: one `fastring.adasum_allreduce` per tensor, the scale
    factors applied around it; the results are written into `targets` when given."""
    if not is_native(compression):
        raise ValueError("op=Adasum takes no compression")
    handles = start_adasum(tensors, full_name("allreduce", name), compression, prescale_factor, process_set)

    def finish(results):
        results = [r * postscale_factor if postscale_factor != 1.0 else r for r in results]
        if targets is None:
            return results
        for target, result in zip(targets, results):
            target.copy_(result)
        return targets
    return _Deferred(handles, finish)


class _Adasum(torch.autograd.Function):
    """Forward: the Adasum of the ranks' tensors. Backward: the Adasum of the gradients, as
    Horovod's allreduce defines its gradient (the same reduction of the output's gradient)."""

    @staticmethod
    def forward(ctx, tensor, name, prescale_factor, postscale_factor, process_set):
        ctx.scaling = (prescale_factor, postscale_factor, process_set)
        return _adasum([tensor.detach()], name, prescale_factor, postscale_factor, process_set, None).wait()[0]

    @staticmethod
    def backward(ctx, grad_output):
        pre, post, process_set = ctx.scaling
        return _adasum([grad_output], None, pre, post, process_set, None).wait()[0], None, None, None, None


# ----------------------------------------------------------------- allreduce
class _Allreduce(torch.autograd.Function):
    """Forward: the core's allreduce. Backward: the same allreduce (op and scales) of the
    gradient, as Horovod."""

    @staticmethod
    def forward(ctx, tensor, op, name, compression, prescale_factor, postscale_factor, process_set):
        ctx.scaling = (op, prescale_factor, postscale_factor, process_set)
        return fastring.allreduce(tensor, op=op, name=name, compression=compression,
                                  prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                  process_set=process_set)

    @staticmethod
    def backward(ctx, grad_output):
        op, prescale, postscale, process_set = ctx.scaling
        grad = allreduce(grad_output, op=op, prescale_factor=prescale, postscale_factor=postscale,
                         process_set=process_set)
        return grad, None, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression=Compression.none, op=None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set=global_process_set) -> torch.Tensor:
    """Average (default) or otherwise reduce `tensor` over all ranks; the input is unchanged.

    Differentiable: the gradient is the same allreduce of the output's gradient. Every rank
    must pass the same shape and dtype under one name (FastringError on every rank otherwise).
    `compression=Compression.fp16` / `bf16` sends floating tensors as 16 bits.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.allreduce(torch.tensor([1.0, 3.0]), op=hvd.Sum)   # on 1 rank
        tensor([1., 3.])
    """
    op = horovod_op(op, average)
    if op is Adasum:
        if not is_native(compression) or getattr(compression, "wire", None) is not None:
            raise ValueError("op=Adasum takes no compression")
        return _Adasum.apply(tensor, name, prescale_factor, postscale_factor, process_set)
    no_graph = not (tensor.requires_grad and torch.is_grad_enabled())  # then skip autograd's cost
    if no_graph and compression is Compression.none:
        result = lean_allreduce(tensor, op, name, prescale_factor, postscale_factor, process_set, None,
                                asynchronous=False)
        if result is not None:
            return result
    name = full_name("allreduce", name)
    if no_graph:
        return compressed(compression, tensor, lambda t, c: fastring.allreduce(
            t, op=op, name=name, compression=c, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=process_set))
    return compressed(compression, tensor, lambda t, c: _Allreduce.apply(
        t, op, name, c, prescale_factor, postscale_factor, process_set))


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op=None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set=global_process_set) -> Handle:
    """Start an allreduce; `synchronize(handle)` returns the reduced tensor. Do not modify
    `tensor` until then.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> h = hvd.allreduce_async(torch.ones(3), name="w")
        >>> hvd.synchronize(h)
        tensor([1., 1., 1.])
    """
    op = horovod_op(op, average)
    if op is Adasum:
        return _adasum([tensor], name, prescale_factor, postscale_factor, process_set, None, None).then_first()
    handle = lean_allreduce(tensor, op, name, prescale_factor, postscale_factor, process_set, None,
                            asynchronous=True)
    if handle is not None:
        return handle
    return fastring.allreduce_async(tensor, op=op, name=full_name("allreduce", name),
                                    prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                    process_set=process_set)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op=None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set=global_process_set) -> torch.Tensor:
    """In-place allreduce: `tensor` receives the result and is returned.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> t = torch.ones(2)
        >>> hvd.allreduce_(t, op=hvd.Sum) is t
        True
    """
    op = horovod_op(op, average)
    if op is Adasum:
        return _adasum([tensor], name, prescale_factor, postscale_factor, process_set, None, [tensor]).wait()[0]
    if lean_allreduce(tensor, op, name, prescale_factor, postscale_factor, process_set, tensor,
                      asynchronous=False) is not None:
        return tensor
    return fastring.allreduce(tensor, op=op, name=full_name("allreduce", name),
                              prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                              out=tensor, process_set=process_set)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op=None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set=global_process_set) -> Handle:
    """Start an in-place allreduce; `synchronize(handle)` returns `tensor`, reduced.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> t = torch.ones(2)
        >>> hvd.synchronize(hvd.allreduce_async_(t, name="t")) is t
        True
    """
    if type(op) is not ReduceOp or average is not None:  # a plain op needs no translating
        op = horovod_op(op, average)
        if op is Adasum:
            return _adasum([tensor], name, prescale_factor, postscale_factor, process_set, None,
                           [tensor]).then_first()
    handle = lean_allreduce(tensor, op, name, prescale_factor, postscale_factor, process_set, tensor,
                            asynchronous=True)
    if handle is not None:
        return handle
    return fastring.allreduce_async(tensor, op=op, name=full_name("allreduce", name),
                                    prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                    out=tensor, process_set=process_set)


# ----------------------------------------------------------------- grouped allreduce
class _GroupedAllreduce(torch.autograd.Function):
    """Forward: the core's grouped (fused) allreduce. Backward: the same of the gradients."""

    @staticmethod
    def forward(ctx, op, name, compression, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.scaling = (op, prescale_factor, postscale_factor, process_set)
        return tuple(fastring.grouped_allreduce(
            list(tensors), op=op, name=name, compression=compression,
            prescale_factor=prescale_factor, postscale_factor=postscale_factor, process_set=process_set))

    @staticmethod
    def backward(ctx, *grad_outputs):
        op, prescale, postscale, process_set = ctx.scaling
        grads = grouped_allreduce(list(grad_outputs), op=op, prescale_factor=prescale,
                                  postscale_factor=postscale, process_set=process_set)
        return (None,) * 6 + tuple(grads)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression=Compression.none, op=None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set=global_process_set) -> list[torch.Tensor]:
    """Allreduce a list of tensors of one dtype as one fused operation; returns a list.
    Differentiable like `allreduce`.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.grouped_allreduce([torch.ones(2), torch.zeros(1)], op=hvd.Sum)
        [tensor([1., 1.]), tensor([0.])]
    """
    op = horovod_op(op, average)
    if op is Adasum:
        return _adasum(list(tensors), name, prescale_factor, postscale_factor, process_set, compression).wait()
    qualified = full_name("grouped_allreduce", name)
    if is_native(compression):
        return list(_GroupedAllreduce.apply(op, qualified, compression, prescale_factor,
                                            postscale_factor, process_set, *tensors))
    packed, ctxs = zip(*(compression.compress(t) for t in tensors))
    reduced = _GroupedAllreduce.apply(op, qualified, None, prescale_factor, postscale_factor, process_set,
                                      *packed)
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op=None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set=global_process_set) -> Handle:
    """Start a grouped allreduce; `synchronize(handle)` returns the list of results.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(1), torch.ones(2)]))
        [tensor([1.]), tensor([1., 1.])]
    """
    op = horovod_op(op, average)
    if op is Adasum:
        return _adasum(list(tensors), name, prescale_factor, postscale_factor, process_set, None)
    return fastring.grouped_allreduce_async(tensors, op=op,
                                            name=full_name("grouped_allreduce", name),
                                            prescale_factor=prescale_factor,
                                            postscale_factor=postscale_factor, process_set=process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op=None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set=global_process_set) -> _Deferred:
    """Start an in-place grouped allreduce; `synchronize(handle)` returns `tensors`, reduced.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> ts = [torch.ones(1), torch.ones(2)]
        >>> hvd.synchronize(hvd.grouped_allreduce_async_(ts, op=hvd.Sum))[1] is ts[1]
        True
    """
    handle = grouped_allreduce_async(tensors, None, name, horovod_op(op, average), prescale_factor,
                                     postscale_factor, process_set)
    return _copy_back(handle, list(tensors))


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op=None, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, process_set=global_process_set) -> list[torch.Tensor]:
    """In-place grouped allreduce: every tensor of `tensors` receives its result.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.grouped_allreduce_([torch.ones(1), torch.ones(2)], op=hvd.Sum)
        [tensor([1.]), tensor([1., 1.])]
    """
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ----------------------------------------------------------------- allgather
class _Allgather(torch.autograd.Function):
    """Backward (as Horovod): average the output's gradient over ranks, keep this rank's rows."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        result = fastring.allgather(tensor, name=name, process_set=process_set)
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return result

    @staticmethod
    def backward(ctx, grad_output):
        process_set = ctx.process_set
        reduced = allreduce(grad_output, op=Average, process_set=process_set)
        rows = fastring.allgather(torch.tensor([ctx.rows], dtype=torch.int64), process_set=process_set)
        offset = int(rows[:process_set.rank()].sum())
        return reduced.narrow(0, offset, ctx.rows), None, None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set=global_process_set) -> torch.Tensor:
    """Concatenate every rank's tensor along dimension 0 (which may differ between ranks).
    Differentiable (gradient: the averaged output gradient's rows of this rank).

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.allgather(torch.ones(2, 3)).shape   # (2 * size, 3)
        torch.Size([2, 3])
    """
    return _Allgather.apply(tensor, full_name("allgather", name), process_set)


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set=global_process_set) -> Handle:
    """Start an allgather; `synchronize(handle)` returns the concatenated tensor.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.allgather_async(torch.arange(2)))
        tensor([0, 1])
    """
    return fastring.allgather_async(tensor, name=full_name("allgather", name), process_set=process_set)


# ----------------------------------------------------------------- broadcast
class _Broadcast(torch.autograd.Function):
    """Backward (as Horovod): the averaged gradient on the root, zeros elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return fastring.broadcast(tensor, root_rank, name=name, process_set=process_set)

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set=global_process_set) -> torch.Tensor:
    """A new tensor holding `root_rank`'s `tensor` on every rank. Differentiable.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.broadcast(torch.tensor([1.0, 2.0]), root_rank=0)
        tensor([1., 2.])
    """
    return _Broadcast.apply(tensor, root_rank, full_name("broadcast", name), process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set=global_process_set) -> torch.Tensor:
    """In-place broadcast: `tensor` receives `root_rank`'s values and is returned.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> w = torch.zeros(2)
        >>> hvd.broadcast_(w, 0) is w
        True
    """
    return fastring.broadcast(tensor, root_rank, name=full_name("broadcast", name), out=tensor,
                              process_set=process_set)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set=global_process_set) -> Handle:
    """Start a broadcast; `synchronize(handle)` returns a new tensor with the root's values.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.broadcast_async(torch.ones(1), 0))
        tensor([1.])
    """
    return fastring.broadcast_async(tensor, root_rank, name=full_name("broadcast", name),
                                    process_set=process_set)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set=global_process_set) -> Handle:
    """Start an in-place broadcast; `synchronize(handle)` returns `tensor`.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> w = torch.ones(1)
        >>> hvd.synchronize(hvd.broadcast_async_(w, 0)) is w
        True
    """
    return fastring.broadcast_async(tensor, root_rank, name=full_name("broadcast", name), out=tensor,
                                    process_set=process_set)


# ----------------------------------------------------------------- alltoall
def _explicit_splits(tensor, splits, process_set):
    """Without splits, Horovod divides dimension 0 equally and still reports the received
    splits; pass the equal splits explicitly when they exist (else the core raises)."""
    if splits is not None or not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        return splits
    n, rows = process_set.size() or size(), tensor.shape[0]
    return [rows // n] * n if rows % n == 0 else None


class _Alltoall(torch.autograd.Function):
    """Backward (as Horovod): the alltoall of the gradient back along the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = fastring.alltoall(tensor, _explicit_splits(tensor, splits, process_set), name=name,
                                             process_set=process_set)
        ctx.received, ctx.rows, ctx.process_set = received, tensor.shape[0], process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = alltoall(grad_output, splits=ctx.received, process_set=ctx.process_set)
        if grad.shape[0] < ctx.rows:  # rows beyond sum(splits) were not sent
            grad = torch.cat([grad, grad.new_zeros((ctx.rows - grad.shape[0],) + grad.shape[1:])])
        return grad, None, None, None


def alltoall(tensor: torch.Tensor, splits=None, name: str | None = None,
             process_set=global_process_set):
    """Send rows of `tensor` to every rank and receive theirs, in rank order.

    `splits` (a 1-D int32 tensor or list, one entry per rank) says how many rows go to each
    rank; without it dimension 0 is divided equally. Returns the received tensor, and with
    `splits` also the received splits. Differentiable.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.alltoall(torch.arange(4), splits=torch.tensor([4], dtype=torch.int32))   # 1 rank
        (tensor([0, 1, 2, 3]), tensor([4], dtype=torch.int32))
    """
    return _Alltoall.apply(tensor, splits, full_name("alltoall", name), process_set)


def alltoall_async(tensor: torch.Tensor, splits=None, name: str | None = None,
                   process_set=global_process_set) -> Handle:
    """Start an alltoall; `synchronize(handle)` returns (tensor, received_splits), as Horovod.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.alltoall_async(torch.arange(2)))   # on 1 rank
        (tensor([0, 1]), tensor([2], dtype=torch.int32))
    """
    return fastring.alltoall_async(tensor, _explicit_splits(tensor, splits, process_set),
                                   name=full_name("alltoall", name), process_set=process_set)


# ----------------------------------------------------------------- reducescatter
class _Reducescatter(torch.autograd.Function):
    """Backward, as Horovod defines it: the allgather of the slices' gradients, times the
    scale factors, and times the set's size for Sum (Average: times 1). That is size times
    the gradient of the ranks' summed losses, whatever the op."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.scaling = (op, prescale_factor * postscale_factor, process_set)
        return fastring.reducescatter(tensor, op=op, name=name, prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor, process_set=process_set)

    @staticmethod
    def backward(ctx, grad_output):
        scale = _reducescatter_grad_scale(*ctx.scaling)
        return allgather(grad_output, process_set=ctx.scaling[2]) * scale, None, None, None, None, None


def _reducescatter_grad_scale(op, scale: float, process_set) -> float:
    """What multiplies the gathered gradient of a reducescatter (see _Reducescatter)."""
    if op not in (Sum, Average):
        raise NotImplementedError(f"the gradient of reducescatter is defined for Sum and "
                                  f"Average, not {ReduceOp(op).name}")
    return scale * process_set.size() if op == Sum else scale


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression=Compression.none,
                  op=Average, process_set=global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce `tensor` over all ranks and return this rank's slice of dimension 0 (ranks
    0..(d0 % size)-1 get one extra row). Differentiable for Sum and Average.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.reducescatter(torch.ones(4, 2), op=hvd.Sum).shape   # (4 / size, 2)
        torch.Size([4, 2])
    """
    op = horovod_op(op)
    qualified = full_name("reducescatter", name)

    def reduce(t, core_compression):
        # The core's reducescatter takes no compression: cast to the wire format around it.
        wire = _WIRE.get(getattr(core_compression, "wire", None)) if t.is_floating_point() else None
        result = _Reducescatter.apply(t if wire is None else t.to(wire), qualified, op,
                                      prescale_factor, postscale_factor, process_set)
        return result if wire is None else result.to(t.dtype)
    return compressed(compression, tensor, reduce)


_WIRE = {"fp16": torch.float16, "bf16": torch.bfloat16}


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op=Average,
                        process_set=global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Handle:
    """Start a reducescatter; `synchronize(handle)` returns this rank's slice.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.reducescatter_async(torch.ones(2), op=hvd.Sum))   # on 1 rank
        tensor([1., 1.])
    """
    return fastring.reducescatter_async(tensor, op=horovod_op(op), name=full_name("reducescatter", name),
                                        prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                        process_set=process_set)


# ----------------------------------------------------------------- grouped allgather, reducescatter
class _GroupedAllgather(torch.autograd.Function):
    """Backward (as `allgather`'s, per tensor): the averaged output gradients, this rank's rows."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(fastring.grouped_allgather(list(tensors), name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, *grad_outputs):
        process_set = ctx.process_set
        reduced = grouped_allreduce(list(grad_outputs), op=Average, process_set=process_set)
        rows = fastring.allgather(torch.tensor([ctx.rows], dtype=torch.int64), process_set=process_set)
        offsets = rows[:process_set.rank()].sum(0).tolist()
        return (None, None) + tuple(g.narrow(0, o, n) for g, o, n in zip(reduced, offsets, ctx.rows))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set=global_process_set) -> list[torch.Tensor]:
    """`allgather` of each tensor of a list as one fused operation; returns a list.
    Differentiable like `allgather`.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> [t.shape for t in hvd.grouped_allgather([torch.ones(2, 3), torch.ones(1)])]   # 1 rank
        [torch.Size([2, 3]), torch.Size([1])]
    """
    return list(_GroupedAllgather.apply(full_name("grouped_allgather", name), process_set, *tensors))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set=global_process_set) -> Handle:
    """Start a grouped allgather; `synchronize(handle)` returns the list of results.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.grouped_allgather_async([torch.arange(2)]))   # on 1 rank
        [tensor([0, 1])]
    """
    return fastring.grouped_allgather_async(list(tensors), name=full_name("grouped_allgather", name),
                                            process_set=process_set)


class _GroupedReducescatter(torch.autograd.Function):
    """Backward: `reducescatter`'s, per tensor, through one grouped allgather."""

    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.scaling = (op, prescale_factor * postscale_factor, process_set)
        return tuple(fastring.grouped_reducescatter(list(tensors), op=op, name=name, prescale_factor=prescale_factor,
                                                    postscale_factor=postscale_factor, process_set=process_set))

    @staticmethod
    def backward(ctx, *grad_outputs):
        scale = _reducescatter_grad_scale(*ctx.scaling)
        grads = grouped_allgather(list(grad_outputs), process_set=ctx.scaling[2])
        return (None,) * 5 + tuple(g * scale for g in grads)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression=Compression.none, op=Average, process_set=global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """`reducescatter` of each tensor of a list (one dtype) as one fused operation; returns
    a list. Differentiable for Sum and Average, like `reducescatter`.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.grouped_reducescatter([torch.ones(2), torch.ones(3, 1)], op=hvd.Sum)[0]   # 1 rank
        tensor([1., 1.])
    """
    op = horovod_op(op)
    qualified = full_name("grouped_reducescatter", name)
    if is_native(compression) and getattr(compression, "wire", None) is None:
        return list(_GroupedReducescatter.apply(qualified, op, prescale_factor, postscale_factor, process_set,
                                                *tensors))
    return [reducescatter(t, f"{name}.{i}" if name else None, compression, op, process_set, prescale_factor,
                          postscale_factor) for i, t in enumerate(tensors)]


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None, op=Average,
                                process_set=global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Start a grouped reducescatter; `synchronize(handle)` returns the list of slices.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.grouped_reducescatter_async([torch.ones(2)], op=hvd.Sum))   # 1 rank
        [tensor([1., 1.])]
    """
    return fastring.grouped_reducescatter_async(list(tensors), op=horovod_op(op),
                                                name=full_name("grouped_reducescatter", name),
                                                prescale_factor=prescale_factor,
                                                postscale_factor=postscale_factor, process_set=process_set)


# ----------------------------------------------------------------- sparse allreduce
def sparse_allreduce_async(tensor: torch.Tensor, name: str, op, process_set=global_process_set) -> _Deferred:
    """Start the allreduce of a sparse COO tensor as Horovod does it: an allgather of every
    rank's indices and one of its values; `synchronize(handle)` (or `handle()`) returns the
    sparse tensor holding them all (duplicate indices are summed when it is coalesced),
    divided by the set's size for Average. Sum and Average only.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> g = torch.sparse_coo_tensor([[1, 3]], [2.0, 4.0], (5,), check_invariants=True)
        >>> hvd.synchronize(hvd.sparse_allreduce_async(g, "g", hvd.Sum)).to_dense()   # 1 rank
        tensor([0., 2., 0., 4., 0.])
    """
    if not (isinstance(tensor, torch.Tensor) and tensor.is_sparse):
        raise TypeError(f"sparse_allreduce_async takes a sparse COO tensor, got "
                        f"{type(tensor).__name__ if not isinstance(tensor, torch.Tensor) else tensor.layout}")
    op = horovod_op(op)
    if op not in (Sum, Average):
        raise ValueError(f"sparse_allreduce_async supports Sum and Average, not {ReduceOp(op).name}")
    # Allgather concatenates dimension 0: the indices travel transposed, one row per entry.
    indices = fastring.allgather_async(tensor._indices().t().contiguous(), name=f"sparse.{name}.indices",
                                       process_set=process_set)
    values = fastring.allgather_async(tensor._values().contiguous(), name=f"sparse.{name}.values",
                                      process_set=process_set)

    def finish(results):
        gathered_indices, gathered_values = results
        if op == Average:
            gathered_values = gathered_values / process_set.size()
        return torch.sparse_coo_tensor(gathered_indices.t(), gathered_values, tensor.shape, check_invariants=True)
    return _Deferred([indices, values], finish)


# ----------------------------------------------------------------- synchronization points
def barrier(process_set=global_process_set) -> None:
    """Return once every rank has called barrier.

    Example:
        >>> import fastring.torch as hvd
        >>> hvd.init(); hvd.barrier()
    """
    fastring.barrier(process_set=process_set)


def join(device: int = -1, *, process_set=global_process_set) -> int:
    """Declare that this rank has run out of data; return the rank that joined last.

    Until every rank has joined, a joined rank takes part in the others' allreduces with
    zeros (Average still divides by the full size), so ranks with more batches can go on
    training. `device` is accepted for Horovod compatibility (fastring works on the CPU).

    Example:
        >>> import fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.join()   # on 1 rank
        0
    """
    return int(fastring.join(process_set=process_set))


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record a Chrome-trace timeline of every collective into `file_path` (written by rank 0
    at `stop_timeline`). Call on every rank. `mark_cycles` is accepted for Horovod
    compatibility; fastring's timeline marks no negotiation cycles.

    Example:
        >>> import fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.start_timeline("/tmp/hvd-timeline.json"); hvd.stop_timeline()
        >>> import os; os.remove("/tmp/hvd-timeline.json")
    """
    fastring.start_timeline(file_path)


def stop_timeline() -> None:
    """Stop recording the timeline and write it. Call on every rank.

    Example:
        >>> import fastring.torch as hvd
        >>> hvd.init(); hvd.stop_timeline()
    """
    fastring.stop_timeline()
