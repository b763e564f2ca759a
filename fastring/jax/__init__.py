"""fastring.jax: fastring's collectives on jax.Array, outside and inside `jax.jit`,
differentiable, and the helpers of data-parallel training with optax.

Example:
    >>> import jax, jax.numpy as jnp
    >>> import fastring.jax as fj
    >>> fj.init()
    >>> params = fj.broadcast_pytree({"w": jnp.zeros(3)}, root_rank=0)
    >>> step = jax.jit(lambda g: fj.allreduce_pytree(g))       # one fused allreduce per step
    >>> step({"w": jnp.ones(3) * (fj.rank() + 1)})["w"]          # on 1 rank
    Array([1., 1., 1.], dtype=float32)
"""
from fastring import (Compression, FastringError, ReduceOp, cross_rank, cross_size, init, is_initialized,
                      local_rank, local_size, rank, shutdown, size)

from . import collectives
from .collectives import *  # noqa: F401,F403 - the names of its __all__
from .training import DistributedGradients, allreduce_pytree, broadcast_pytree

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "ReduceOp", "Compression", "FastringError", *collectives.__all__,
    "DistributedGradients", "allreduce_pytree", "broadcast_pytree",
]
