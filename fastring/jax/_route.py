"""How a collective runs inside a compiled JAX program: one XLA FFI custom call, ordered.

`custom_call(key, runner, specs, *arrays)` stages the custom call `fastring_collective` (the
handler of `_xla_ffi`, registered with XLA below) with `key` as its one attribute. When the
compiled program reaches it, the handler calls `runner(inputs, outputs)` with numpy arrays
over XLA's own input and output buffers (no copy), which runs the core's collective with the
outputs as its `out=` (or copies into them). An exception there fails the program's
execution with the exception's type and message.

The call carries fastring's ordered effect (`_jax_private`): its token enters every such call
and leaves it, in program order, and JAX passes it from each compiled program to the next at
run time, so every rank runs its collectives one at a time in the order the program states,
which the core's negotiation needs. XLA never drops the call (it has side effects).
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
from jax.extend.core import Primitive
from jax.interpreters import mlir, xla

from . import _xla_ffi
from ._jax_private import ORDERED_EFFECT, abstract_token, set_token_out, token_in

# key -> runner. A key names what its runner does completely (the collective and its static
# arguments), so one key always means one runner, whichever trace registered it first.
_RUNNERS: dict[str, Callable] = {}


def _dispatch(key: str, inputs: tuple, outputs: tuple) -> None:
    _RUNNERS[key](inputs, outputs)


_xla_ffi.set_dispatch(_dispatch)
jax.ffi.register_ffi_target(_xla_ffi.TARGET, _xla_ffi.handler_capsule(), platform="cpu")

_collective_p = Primitive("fastring_collective")
_collective_p.multiple_results = True
# Bound outside a trace (jax.disable_jit, eager evaluation of a jaxpr): compile it alone.
_collective_p.def_impl(functools.partial(xla.apply_primitive, _collective_p))


@_collective_p.def_effectful_abstract_eval
def _abstract_eval(*avals, key: str, out_avals: tuple, in_place: bool):
    del avals, key, in_place
    return out_avals, {ORDERED_EFFECT}


def _lowering(ctx, *args, key: str, out_avals: tuple, in_place: bool):
    del out_avals
    with_token = ctx.replace(avals_in=(*ctx.avals_in, abstract_token),
                             avals_out=(*ctx.avals_out, abstract_token))
    aliases = {i: i for i in range(len(args))} if in_place else None
    *results, token = jax.ffi.ffi_lowering(_xla_ffi.TARGET, has_side_effect=True, operand_output_aliases=aliases)(
        with_token, *args, token_in(ctx), key=key)
    set_token_out(ctx, token)
    return results


mlir.register_lowering(_collective_p, _lowering, platform="cpu")


def custom_call(key: str, runner: Callable, specs: Sequence[jax.ShapeDtypeStruct], *arrays,
                in_place: bool = False) -> list:
    """Stage `runner(inputs, outputs)` (tuples of numpy arrays; outputs shaped as `specs`) as
    one ordered FFI custom call of the program being traced; returns its results.

    With `in_place`, output i is input i's buffer (specs must be the inputs' shapes and
    dtypes): it holds the input when the runner starts, and the runner works there. XLA
    copies an input into a fresh buffer first only if the program still needs it afterwards.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> negate = lambda ins, outs: np.negative(ins[0], out=outs[0])
        >>> spec = jax.ShapeDtypeStruct((2,), jnp.float32)
        >>> jax.jit(lambda x: custom_call("doctest.negate", negate, [spec], x)[0])(jnp.ones(2))
        Array([-1., -1.], dtype=float32)
    """
    _RUNNERS.setdefault(key, runner)
    out_avals = tuple(jax.core.ShapedArray(tuple(s.shape), s.dtype) for s in specs)
    return _collective_p.bind(*arrays, key=key, out_avals=out_avals, in_place=in_place)
