"""horovod.torch.SyncBatchNorm on fastring: batch normalization whose statistics are those of
the batch of every rank together, on CPU tensors as on any other."""
from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from fastring._horovod import global_process_set

from .mpi_ops import Sum, allreduce

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over the ranks' batches together: in training, the mean and variance are
    those of the concatenation of every rank's batch (of `process_set`), so each rank's output
    and the running statistics equal `torch.nn.BatchNorm` on the concatenated batch.

    The statistics are two differentiable allreduces (Sum) of per-channel sums: the count and
    sum, then the sum of squared deviations from the global mean (two passes, as accurate as
    BatchNorm's own). Autograd differentiates through them, and an allreduce's gradient is the
    allreduce of the gradients, so each rank's input gradient is that of the sum of the ranks'
    losses. Parameter gradients stay local (DistributedOptimizer averages them). In eval mode,
    or with batch statistics off, it is plain BatchNorm. Every rank of the set must run
    forward (and backward) the same number of times.

    Example:
        >>> import torch, fastring.torch as hvd
        >>> hvd.init()
        >>> bn = hvd.SyncBatchNorm(3)
        >>> bn(torch.ones(4, 3)).shape
        torch.Size([4, 3])
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, *, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        use_batch = self.training or not self.track_running_stats
        if not use_batch:
            return torch.nn.functional.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                                  self.bias, False, 0.0, self.eps)
        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        local_count = input.numel() // input.shape[1]
        totals = allreduce(torch.cat([input.sum(dims), input.new_full((1,), float(local_count))]), op=Sum,
                           process_set=self.process_set)
        count = totals[-1].detach()
        if count <= 1:
            raise ValueError(f"expected more than 1 value per channel when training, got {int(count)} "
                             "over every rank")
        mean = totals[:-1] / count
        centered = input - mean.view(shape)
        var = allreduce((centered * centered).sum(dims), op=Sum, process_set=self.process_set) / count
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
                self.running_var.mul_(1 - factor).add_(var.detach() * (count / (count - 1)), alpha=factor)
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
