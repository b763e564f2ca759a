"""horovod.torch's collectives on fastring: Horovod's names, positional order and defaults,
adapted onto the framework-agnostic core (`fastring.allreduce(..., out=)`, `_async` handles).

What this module adds to the core, and nothing else:
- Horovod's arguments: the deprecated `average=` beside `op=`, `process_set=` (the global one
  only), in-place `_` variants (the core's `out=tensor`), Horovod-shaped custom compressors;
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
from fastring._horovod import (Adasum, ProcessSet, ccl_built, check_process_set,
                               compressed, cuda_built, ddl_built, full_name, gloo_built, gloo_enabled,
                               global_process_set, horovod_op, init, is_native, mpi_built, mpi_enabled,
                               mpi_threads_supported, nccl_built, rocm_built)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    "Average", "Sum", "Min", "Max", "Product", "Adasum", "ReduceOp", "Compression", "FastringError",
    "ProcessSet", "global_process_set",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "barrier", "join",
    "synchronize", "poll", "start_timeline", "stop_timeline",
]

Average, Sum, Min, Max, Product = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max,
                                   ReduceOp.Product)
shutdown = fastring.shutdown
is_initialized = fastring.is_initialized
rank = fastring.rank
size = fastring.size
local_rank = fastring.local_rank
local_size = fastring.local_size
cross_rank = fastring.cross_rank
cross_size = fastring.cross_size


class _CopyBack:
    """The handle of an in-place grouped allreduce: waits for the core's grouped allreduce,
    then writes its results into the caller's tensors and returns them."""

    __slots__ = ("handle", "targets")

    def __init__(self, handle: Handle, targets: list):
        self.handle, self.targets = handle, targets

    def done(self) -> bool:
        return self.handle.done()

    def wait(self) -> list:
        for target, result in zip(self.targets, self.handle.wait()):
            target.copy_(result)
        return self.targets


def synchronize(handle):
    """Wait for an asynchronous operation and return its result (or raise its error).

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.allreduce_async(torch.ones(2), op=hvd.Sum))   # on 1 rank
        tensor([1., 1.])
    """
    if isinstance(handle, _CopyBack):
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
    if isinstance(handle, _CopyBack):
        return handle.done()
    return fastring.poll(handle)


# ----------------------------------------------------------------- allreduce
class _Allreduce(torch.autograd.Function):
    """Forward: the core's allreduce. Backward: the same allreduce (op and scales) of the
    gradient, as Horovod."""

    @staticmethod
    def forward(ctx, tensor, op, name, compression, prescale_factor, postscale_factor):
        ctx.scaling = (op, prescale_factor, postscale_factor)
        return fastring.allreduce(tensor, op=op, name=name, compression=compression,
                                  prescale_factor=prescale_factor, postscale_factor=postscale_factor)

    @staticmethod
    def backward(ctx, grad_output):
        op, prescale, postscale = ctx.scaling
        grad = allreduce(grad_output, op=op, prescale_factor=prescale, postscale_factor=postscale)
        return grad, None, None, None, None, None


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
    check_process_set(process_set)
    name = full_name("allreduce", name)
    if not (tensor.requires_grad and torch.is_grad_enabled()):  # no graph to record: skip autograd's cost
        return compressed(compression, tensor, lambda t, c: fastring.allreduce(
            t, op=op, name=name, compression=c, prescale_factor=prescale_factor, postscale_factor=postscale_factor))
    return compressed(compression, tensor, lambda t, c: _Allreduce.apply(
        t, op, name, c, prescale_factor, postscale_factor))


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
    check_process_set(process_set)
    return fastring.allreduce_async(tensor, op=horovod_op(op, average), name=full_name("allreduce", name),
                                    prescale_factor=prescale_factor, postscale_factor=postscale_factor)


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
    check_process_set(process_set)
    return fastring.allreduce(tensor, op=horovod_op(op, average), name=full_name("allreduce", name),
                              prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                              out=tensor)


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
    check_process_set(process_set)
    return fastring.allreduce_async(tensor, op=horovod_op(op, average), name=full_name("allreduce", name),
                                    prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                    out=tensor)


# ----------------------------------------------------------------- grouped allreduce
class _GroupedAllreduce(torch.autograd.Function):
    """Forward: the core's grouped (fused) allreduce. Backward: the same of the gradients."""

    @staticmethod
    def forward(ctx, op, name, compression, prescale_factor, postscale_factor, *tensors):
        ctx.scaling = (op, prescale_factor, postscale_factor)
        return tuple(fastring.grouped_allreduce(
            list(tensors), op=op, name=name, compression=compression,
            prescale_factor=prescale_factor, postscale_factor=postscale_factor))

    @staticmethod
    def backward(ctx, *grad_outputs):
        op, prescale, postscale = ctx.scaling
        grads = grouped_allreduce(list(grad_outputs), op=op, prescale_factor=prescale,
                                  postscale_factor=postscale)
        return (None,) * 5 + tuple(grads)


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
    check_process_set(process_set)
    qualified = full_name("grouped_allreduce", name)
    if is_native(compression):
        return list(_GroupedAllreduce.apply(op, qualified, compression, prescale_factor,
                                            postscale_factor, *tensors))
    packed, ctxs = zip(*(compression.compress(t) for t in tensors))
    reduced = _GroupedAllreduce.apply(op, qualified, None, prescale_factor, postscale_factor, *packed)
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
    check_process_set(process_set)
    return fastring.grouped_allreduce_async(tensors, op=horovod_op(op, average),
                                            name=full_name("grouped_allreduce", name),
                                            prescale_factor=prescale_factor,
                                            postscale_factor=postscale_factor)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op=None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set=global_process_set) -> _CopyBack:
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
    return _CopyBack(handle, list(tensors))


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
    def forward(ctx, tensor, name):
        result = fastring.allgather(tensor, name=name)
        ctx.rows = tensor.shape[0]
        return result

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output, op=Average)
        rows = fastring.allgather(torch.tensor([ctx.rows], dtype=torch.int64))
        offset = int(rows[:rank()].sum())
        return reduced.narrow(0, offset, ctx.rows), None


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
    check_process_set(process_set)
    return _Allgather.apply(tensor, full_name("allgather", name))


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set=global_process_set) -> Handle:
    """Start an allgather; `synchronize(handle)` returns the concatenated tensor.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.allgather_async(torch.arange(2)))
        tensor([0, 1])
    """
    check_process_set(process_set)
    return fastring.allgather_async(tensor, name=full_name("allgather", name))


# ----------------------------------------------------------------- broadcast
class _Broadcast(torch.autograd.Function):
    """Backward (as Horovod): the averaged gradient on the root, zeros elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return fastring.broadcast(tensor, root_rank, name=name)

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output, op=Average)
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set=global_process_set) -> torch.Tensor:
    """A new tensor holding `root_rank`'s `tensor` on every rank. Differentiable.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.broadcast(torch.tensor([1.0, 2.0]), root_rank=0)
        tensor([1., 2.])
    """
    check_process_set(process_set)
    return _Broadcast.apply(tensor, root_rank, full_name("broadcast", name))


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
    check_process_set(process_set)
    return fastring.broadcast(tensor, root_rank, name=full_name("broadcast", name), out=tensor)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set=global_process_set) -> Handle:
    """Start a broadcast; `synchronize(handle)` returns a new tensor with the root's values.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.broadcast_async(torch.ones(1), 0))
        tensor([1.])
    """
    check_process_set(process_set)
    return fastring.broadcast_async(tensor, root_rank, name=full_name("broadcast", name))


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
    check_process_set(process_set)
    return fastring.broadcast_async(tensor, root_rank, name=full_name("broadcast", name), out=tensor)


# ----------------------------------------------------------------- alltoall
def _explicit_splits(tensor, splits):
    """Without splits, Horovod divides dimension 0 equally and still reports the received
    splits; pass the equal splits explicitly when they exist (else the core raises)."""
    if splits is not None or not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        return splits
    n, rows = size(), tensor.shape[0]
    return [rows // n] * n if rows % n == 0 else None


class _Alltoall(torch.autograd.Function):
    """Backward (as Horovod): the alltoall of the gradient back along the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name):
        output, received = fastring.alltoall(tensor, _explicit_splits(tensor, splits), name=name)
        ctx.received, ctx.rows = received, tensor.shape[0]
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = alltoall(grad_output, splits=ctx.received)
        if grad.shape[0] < ctx.rows:  # rows beyond sum(splits) were not sent
            grad = torch.cat([grad, grad.new_zeros((ctx.rows - grad.shape[0],) + grad.shape[1:])])
        return grad, None, None


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
    check_process_set(process_set)
    return _Alltoall.apply(tensor, splits, full_name("alltoall", name))


def alltoall_async(tensor: torch.Tensor, splits=None, name: str | None = None,
                   process_set=global_process_set) -> Handle:
    """Start an alltoall; `synchronize(handle)` returns (tensor, received_splits), as Horovod.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.synchronize(hvd.alltoall_async(torch.arange(2)))   # on 1 rank
        (tensor([0, 1]), tensor([2], dtype=torch.int32))
    """
    check_process_set(process_set)
    return fastring.alltoall_async(tensor, _explicit_splits(tensor, splits), name=full_name("alltoall", name))


# ----------------------------------------------------------------- reducescatter
class _Reducescatter(torch.autograd.Function):
    """Backward: each rank's slice gradient, gathered and scaled as the forward scaled it."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.scaling = (op, prescale_factor * postscale_factor)
        return fastring.reducescatter(tensor, op=op, name=name, prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor)

    @staticmethod
    def backward(ctx, grad_output):
        op, scale = ctx.scaling
        if op not in (Sum, Average):
            raise NotImplementedError(f"the gradient of reducescatter is defined for Sum and "
                                      f"Average, not {ReduceOp(op).name}")
        if op == Average:
            scale /= size()
        return allgather(grad_output) * scale, None, None, None, None


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
    check_process_set(process_set)
    qualified = full_name("reducescatter", name)

    def reduce(t, core_compression):
        # The core's reducescatter takes no compression: cast to the wire format around it.
        wire = _WIRE.get(getattr(core_compression, "wire", None)) if t.is_floating_point() else None
        result = _Reducescatter.apply(t if wire is None else t.to(wire), qualified, op,
                                      prescale_factor, postscale_factor)
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
    check_process_set(process_set)
    return fastring.reducescatter_async(tensor, op=horovod_op(op), name=full_name("reducescatter", name),
                                        prescale_factor=prescale_factor, postscale_factor=postscale_factor)


# ----------------------------------------------------------------- synchronization points
def barrier(process_set=global_process_set) -> None:
    """Return once every rank has called barrier.

    Example:
        >>> import fastring.torch as hvd
        >>> hvd.init(); hvd.barrier()
    """
    check_process_set(process_set)
    fastring.barrier()


def join(device: int = -1) -> int:
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
    return int(fastring.join())


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record a Chrome-trace timeline of every collective into `file_path` (written by rank 0
    at `stop_timeline`). Call on every rank. `mark_cycles` is accepted for Horovod
    compatibility; fastring's timeline marks no negotiation cycles.

    Example:
        >>> import fastring.torch as hvd
        >>> hvd.init()
        >>> hvd.start_timeline("/tmp/hvd-timeline.json"); hvd.stop_timeline()
    """
    fastring.start_timeline(file_path)


def stop_timeline() -> None:
    """Stop recording the timeline and write it. Call on every rank.

    Example:
        >>> import fastring.torch as hvd
        >>> hvd.init(); hvd.stop_timeline()
    """
    fastring.stop_timeline()
