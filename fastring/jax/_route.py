"""How a collective runs inside a compiled JAX program: one host call, ordered.

`host_call(fn, specs, *arrays)` stages `fn` into the program being traced as
`jax.experimental.io_callback(..., ordered=True)`: XLA keeps it (it has side effects) and runs
it after every ordered host call staged before it, so every rank runs its collectives in
program order, which the core's negotiation needs. `pure_callback` would let XLA drop or
reorder it.
"""
from __future__ import annotations

from typing import Callable

from jax.experimental import io_callback


def host_call(fn: Callable, specs, *arrays):
    """Stage `fn(*arrays)` (numpy in, numpy out, shaped as `specs`) as an ordered host call.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> jax.jit(lambda x: host_call(np.negative, jax.ShapeDtypeStruct((2,), x.dtype), x))(jnp.ones(2))
        Array([-1., -1.], dtype=float32)
    """
    return io_callback(fn, specs, *arrays, ordered=True)
