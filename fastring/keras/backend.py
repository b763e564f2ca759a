"""What fastring.keras does differently per Keras backend: reduce a train step's gradients, and
move variable values in and out. Keras 3 runs one backend per process (KERAS_BACKEND, read
when keras is first imported).

- tensorflow: gradients are tf tensors, symbolic inside Keras' compiled train step; they are
  reduced by fastring.tensorflow (one ordered graph op; not under XLA).
- torch: Keras' train step runs eagerly and gradients are torch tensors, which the core reads
  through DLPack directly.
- jax: Keras applies gradients through the stateless optimizer API inside `jax.jit`, out of
  reach of a wrapper around `apply`; refused with what to do instead (JAX_UNSUPPORTED).
"""
from __future__ import annotations

import keras
import numpy as np

import fastring
from fastring._horovod import compressed_all, reduce_by_dtype, wait_all

BACKEND = keras.backend.backend()
SUPPORTED_BACKENDS = ("tensorflow", "torch")
JAX_UNSUPPORTED = (
    "fastring.keras supports Keras' TensorFlow and PyTorch backends (set KERAS_BACKEND="
    "tensorflow or KERAS_BACKEND=torch before importing keras). On the JAX backend Keras applies "
    "gradients with optimizer.stateless_apply inside jax.jit, which an optimizer wrapper cannot "
    "reach: write the train step in JAX and average the gradients there with fastring.jax's "
    "allreduce (usable inside jax.jit) before stateless_apply")


def check_backend() -> None:
    """NotImplementedError naming the fix unless Keras runs on a backend fastring.keras serves."""
    if BACKEND == "jax":
        raise NotImplementedError(JAX_UNSUPPORTED)
    if BACKEND not in SUPPORTED_BACKENDS:
        raise NotImplementedError(f"fastring.keras supports Keras' TensorFlow and PyTorch backends, "
                                  f"not {BACKEND!r}: set KERAS_BACKEND=tensorflow or torch")


def reduce_gradients(grads: list, op, compression, sparse_as_dense: bool, prescale: float,
                     postscale: float, process_set) -> list:
    """The gradients of one train step reduced over the ranks of `process_set` (None stays None)."""
    if BACKEND == "tensorflow":
        from fastring.tensorflow import allreduce_gradients
        return allreduce_gradients(grads, op, compression, sparse_as_dense, prescale, postscale, process_set)
    present = [i for i, g in enumerate(grads) if g is not None]
    reduced = compressed_all([grads[i] for i in present], compression, lambda ts, c: reduce_by_dtype(
        ts, op, "DistributedOptimizer", c, prescale, postscale, process_set))
    out = list(grads)
    for i, r in zip(present, reduced):
        out[i] = r
    return out


def to_numpy(value) -> np.ndarray:
    """A Keras variable's or backend tensor's value as a numpy array of its own."""
    return np.array(keras.ops.convert_to_numpy(value))


def broadcast_values(variables: list, root_rank: int, name: str) -> None:
    """Assign `root_rank`'s values to every variable: all broadcasts in flight together."""
    arrays = [to_numpy(v) for v in variables]
    wait_all([fastring.broadcast_async(a, root_rank, name=f"{name}.{i}", out=a) for i, a in enumerate(arrays)])
    for v, a in zip(variables, arrays):
        v.assign(a)
