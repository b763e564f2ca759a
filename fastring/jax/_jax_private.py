"""The private JAX API that fastring.jax needs, in one place (checked with jax 0.10).

Why private: JAX's public `jax.ffi.ffi_call(..., has_side_effect=True)` keeps a custom call
from being dropped, but does not order it: two collectives of one program, or of two
compiled programs in flight at once (JAX dispatches asynchronously), could run in a
different order on different ranks, and collectives of one shape would then pair up wrongly
without any error. JAX orders calls only through an *ordered effect*: a token threaded from
one effectful operation to the next inside a program, and from each program to the next at
run time. Declaring one takes JAX's effect registries (`jax._src.effects`), and threading its
token through a custom call takes the lowering context's token set, which the public
`jax.interpreters.mlir` exposes, and the abstract token, which jax 0.10 keeps in
`jax._src.core` (jax.core's copy is deprecated there; later releases export it from jax.ffi).
"""
from __future__ import annotations

from jax._src import effects as _effects
from jax.interpreters import mlir

try:  # where later releases export it
    from jax.ffi import abstract_token  # type: ignore[attr-defined]
except ImportError:
    from jax._src.core import abstract_token

TokenSet = mlir.TokenSet
__all__ = ["ORDERED_EFFECT", "abstract_token", "token_in", "set_token_out"]


class FastringCollectiveEffect(_effects.Effect):
    """The effect of a fastring collective: ordered, so that every rank runs its collectives
    in program order; allowed inside control flow (lax.fori_loop, lax.cond) and
    custom_vjp rules."""

    def __repr__(self) -> str:  # JAX's error messages list effects by repr
        return "FastringCollective"


ORDERED_EFFECT = FastringCollectiveEffect()
_effects.lowerable_effects.add_type(FastringCollectiveEffect)
_effects.ordered_effects.add_type(FastringCollectiveEffect)
_effects.control_flow_allowed_effects.add_type(FastringCollectiveEffect)
_effects.custom_derivatives_allowed_effects.add_type(FastringCollectiveEffect)


def token_in(ctx):
    """The effect's token entering this operation, in a lowering rule."""
    return ctx.tokens_in.get(ORDERED_EFFECT)


def set_token_out(ctx, token) -> None:
    """The effect's token leaving this operation, in a lowering rule (other effects' tokens
    pass through unchanged)."""
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(TokenSet({ORDERED_EFFECT: token})))
