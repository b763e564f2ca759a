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
import fastring
from fastring import Compression, FastringError, ReduceOp

from . import collectives
from .collectives import *  # noqa: F401,F403 - the names of its __all__
from .training import DistributedGradients, allreduce_pytree, broadcast_pytree

init = fastring.init
shutdown = fastring.shutdown
is_initialized = fastring.is_initialized
rank = fastring.rank
size = fastring.size
local_rank = fastring.local_rank
local_size = fastring.local_size
cross_rank = fastring.cross_rank
cross_size = fastring.cross_size

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "ReduceOp", "Compression", "FastringError", *collectives.__all__,
    "DistributedGradients", "allreduce_pytree", "broadcast_pytree",
]
