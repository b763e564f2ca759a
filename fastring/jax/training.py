"""Data-parallel training helpers for JAX: average a gradient pytree with one fused allreduce
per dtype (`allreduce_pytree`, and `DistributedGradients`, the same as an optax
GradientTransformation to chain before the optimizer), and start every replica from the root
rank's parameters (`broadcast_pytree`).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import fastring
from fastring import Compression, Compressor, ReduceOp

from .collectives import grouped_allreduce

PyTree = Any


def _by_dtype(leaves: list) -> dict[str, list[int]]:
    """Leaf positions grouped by dtype, in order of first appearance (the same on every rank
    for the same pytree, so every rank issues the same fused allreduces in the same order)."""
    groups: dict[str, list[int]] = {}
    for i, leaf in enumerate(leaves):
        groups.setdefault(str(jnp.result_type(leaf)), []).append(i)
    return groups


def allreduce_pytree(tree: PyTree, op: ReduceOp = ReduceOp.Average, *, name: str | None = None,
                     compression: Compressor = Compression.none) -> PyTree:
    """Allreduce every leaf of `tree`: one fused allreduce per dtype (one in all for a model
    of one dtype), outside or inside jax.jit, differentiable as `grouped_allreduce` is.

    Example:
        >>> import jax.numpy as jnp, fastring.jax as fj
        >>> fj.init()
        >>> fj.allreduce_pytree({"w": jnp.ones(2), "b": jnp.zeros(1)})   # on 1 rank
        {'b': Array([0.], dtype=float32), 'w': Array([1., 1.], dtype=float32)}
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        return tree
    out = list(leaves)
    for dtype, positions in _by_dtype(leaves).items():
        group_name = None if name is None else f"{name}.{dtype}"
        reduced = grouped_allreduce([leaves[i] for i in positions], op=op, name=group_name,
                                    compression=compression)
        for i, r in zip(positions, reduced):
            out[i] = r
    return jax.tree_util.tree_unflatten(treedef, out)


class DistributedGradientsState(NamedTuple):
    """DistributedGradients keeps no state."""


def DistributedGradients(op: ReduceOp = ReduceOp.Average, *, name: str | None = None,
                         compression: Compressor = Compression.none):
    """An optax GradientTransformation that averages (or `op`-reduces) the updates pytree over
    all ranks, one fused allreduce per dtype per step; chain it before the optimizer.

    Example:
        >>> import optax, jax.numpy as jnp, fastring.jax as fj
        >>> fj.init()
        >>> tx = optax.chain(fj.DistributedGradients(), optax.sgd(0.1))
        >>> params = {"w": jnp.ones(2)}
        >>> updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
        >>> updates["w"]
        Array([-0.1, -0.1], dtype=float32)
    """
    import optax  # the `jax` extra installs it; only this helper needs it

    def init_fn(params):
        del params
        return DistributedGradientsState()

    def update_fn(updates, state, params=None):
        del params
        return allreduce_pytree(updates, op, name=name, compression=compression), state

    return optax.GradientTransformation(init_fn, update_fn)


def broadcast_pytree(tree: PyTree, root_rank: int = 0, *, name: str | None = None) -> PyTree:
    """Every rank receives `root_rank`'s pytree (same structure, shapes and dtypes on every
    rank), as new arrays: one broadcast per dtype of all its leaves packed together. Call it
    outside jit, e.g. once after initialising the parameters.

    Example:
        >>> import jax.numpy as jnp, fastring.jax as fj
        >>> fj.init()
        >>> fj.broadcast_pytree({"w": jnp.arange(2.0)}, root_rank=0)
        {'w': Array([0., 1.], dtype=float32)}
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        raise TypeError("broadcast_pytree runs outside jax.jit; use fastring.jax.broadcast on "
                        "each array inside it")
    arrays = [np.asarray(leaf) for leaf in leaves]
    out = list(arrays)
    for dtype, positions in _by_dtype(arrays).items():
        packed = np.concatenate([arrays[i].reshape(-1) for i in positions])
        packed = fastring.broadcast(packed, root_rank,
                                    name=None if name is None else f"{name}.{dtype}")
        offset = 0
        for i in positions:
            size = arrays[i].size
            out[i] = jnp.asarray(packed[offset:offset + size].reshape(arrays[i].shape))
            offset += size
    return jax.tree_util.tree_unflatten(treedef, out)
