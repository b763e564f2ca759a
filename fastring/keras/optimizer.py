"""horovod.tensorflow.keras.DistributedOptimizer for Keras 3, by the public optimizer API only:
the wrapper is a subclass of the optimizer's own class (built from its `get_config()`) whose
`apply(grads, trainable_variables)` (which `apply_gradients` and `model.fit`'s train step call)
first reduces the gradients over all ranks. No private Keras class or attribute is used, so
Keras releases do not break it as they broke Horovod's wrapper."""
from __future__ import annotations

import functools

import keras

import fastring
from fastring import Compression, ReduceOp
from fastring._horovod import global_process_set, gradient_scaling, member_set

from .backend import check_backend, reduce_gradients

__all__ = ["DistributedOptimizer"]

Average = ReduceOp.Average


class _DistributedOptimizer:
    """The method a DistributedOptimizer overrides in the wrapped optimizer's class; the first
    base of the class `DistributedOptimizer` builds. `_fastring_reduce` is set per instance."""

    def apply(self, grads, trainable_variables=None):
        """The wrapped optimizer's apply, on gradients reduced over all ranks."""
        if fastring.size() > 1 and len(grads):
            grads = self._fastring_reduce(list(grads))
        return super().apply(grads, trainable_variables)


@functools.lru_cache(maxsize=None)
def _distributed_class(base: type) -> type:
    """The class of a DistributedOptimizer over `base`: a subclass of it, of the same name."""
    return type(base.__name__, (_DistributedOptimizer, base), {"__module__": base.__module__})


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None,
                         device_dense: str = "", device_sparse: str = "",
                         compression=Compression.none, sparse_as_dense: bool = False,
                         gradient_predivide_factor: float = 1.0, op=Average,
                         backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups=None, process_set=global_process_set,
                         scale_local_gradients: bool = True) -> keras.optimizers.Optimizer:
    """A copy of `optimizer` (same class name and configuration, from `get_config()`) whose
    updates use gradients averaged (by `op`) over the ranks of `process_set` (all of them by default).

    Wrap the optimizer before `model.compile` (its state is not copied: the copy starts
    unbuilt, as Horovod's does). All gradients of a step are reduced together, one fused
    allreduce per dtype. With op=Average, gradients are multiplied by
    1/gradient_predivide_factor before the sum and by gradient_predivide_factor/size after it.
    `compression=Compression.fp16`/`bf16` sends them as 16 bits. Works on Keras' TensorFlow
    backend (not under XLA: compile with jit_compile=False) and PyTorch backend; the JAX
    backend raises NotImplementedError saying what to do. For gradient accumulation use the
    Keras optimizer's own `gradient_accumulation_steps` (each step's gradients are reduced
    before Keras accumulates them); backward_passes_per_step other than 1 raises. `device_*`,
    `num_groups`, `groups`, `average_aggregated_gradients` and `scale_local_gradients` are
    accepted for Horovod compatibility.

    Example:
        >>> import keras, fastring.keras as hvd
        >>> hvd.init()
        >>> opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
        >>> type(opt).__name__, isinstance(opt, keras.optimizers.SGD)
        ('SGD', True)
    """
    check_backend()
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"optimizer must be a keras.optimizers.Optimizer, got {type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("optimizer is already a DistributedOptimizer")
    op, prescale, postscale = gradient_scaling(op, gradient_predivide_factor)
    process_set = member_set(process_set)
    if backward_passes_per_step != 1:
        raise NotImplementedError(
            "backward_passes_per_step is not supported by fastring.keras: give the Keras optimizer "
            "gradient_accumulation_steps=N instead (gradients are averaged over ranks every step)")
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    distributed = _distributed_class(type(optimizer)).from_config(config)
    distributed._fastring_reduce = functools.partial(
        reduce_gradients, op=op, compression=compression, sparse_as_dense=bool(sparse_as_dense),
        prescale=prescale, postscale=postscale, process_set=process_set)
    return distributed
