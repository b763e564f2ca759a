"""fastring's collectives on jax.Array: outside jax.jit, inside it, and under differentiation.

Outside jit a collective takes the array's host memory as a numpy view (no copy; JAX's CPU
arrays are never written to) and returns a new jax.Array over the core's result, which the
core's pool allocates 64-byte aligned so that XLA's CPU client takes it without a copy.

Inside jit each collective is one XLA FFI custom call of the compiled program (`_route`),
ordered after every one before it, so that every rank runs its collectives in program order
and XLA can neither drop nor reorder them; the core reads XLA's input buffers and writes its
output buffers in place. Shapes inside jit are static, so the collectives whose
result shape depends on other ranks' inputs (allgather, alltoall) require the same dimension 0
on every rank there, checked on every rank before any data moves.

Gradients (jax.custom_vjp): allreduce's is the same allreduce (op and scale factors) of the
cotangent, for Sum and Average; grouped_allreduce's likewise; allgather's is the cotangent's
reducescatter (Sum), each rank getting back the slice its rows went to; broadcast's is the
Sum of the cotangents on the root rank and zero elsewhere; alltoall's is the alltoall of the
cotangent; reducescatter's the allgather of the cotangent, scaled as the forward was.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import fastring
from fastring import Compression, Compressor, FastringError, ReduceOp

from ._route import custom_call

Average, Sum, Min, Max, Product = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max,
                                   ReduceOp.Product)
_LINEAR_OPS = (ReduceOp.Sum, ReduceOp.Average)
_BFLOAT16 = np.dtype(jnp.bfloat16)


# ----------------------------------------------------------------- arrays in and out
# The core is given numpy views of the inputs and returns numpy results, which become jax
# Arrays only once complete: an adapter that let the core build the jax.Array when the
# request is made would only be right if XLA aliased the result's memory, which it does only
# for 64-byte aligned buffers of DLPack dtypes (bfloat16 is not one).
def _host_view(array, what: str = "tensor") -> np.ndarray:
    """A read-only numpy view of a CPU jax.Array's memory (JAX hands its CPU buffers to numpy
    without a copy, bfloat16 included)."""
    if isinstance(array, np.ndarray):
        return array
    platforms = {d.platform for d in array.devices()}
    if platforms != {"cpu"}:
        raise NotImplementedError(f"{what} lives on {sorted(platforms)}: fastring.jax takes CPU "
                                  "arrays only")
    return np.asarray(array)


def _as_jax(array):
    """A complete numpy result as a jax.Array: DLPack aliases the pool's 64-byte aligned
    buffers, and the capsule keeps the numpy array referenced, so the pool never hands the
    buffer out while the jax.Array lives. numpy exports no bfloat16 by DLPack: those bits
    travel as uint16."""
    if isinstance(array, (list, tuple)):
        return type(array)(_as_jax(a) for a in array)
    if array.dtype == _BFLOAT16:
        return jax.lax.bitcast_convert_type(jax.dlpack.from_dlpack(array.view(np.uint16)), jnp.bfloat16)
    return jax.dlpack.from_dlpack(array)


def _array(tensor, what: str = "tensor") -> jax.Array:
    if isinstance(tensor, jax.Array):
        return tensor
    if isinstance(tensor, (np.ndarray, np.generic)):
        return jnp.asarray(tensor)
    raise TypeError(f"{what} must be a jax.Array or numpy array, got {type(tensor).__name__}")


def _traced(*arrays) -> bool:
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def _spec(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


class _Names:
    """Names for the unnamed collectives of compiled programs, `jax.<kind>.noname.<n>`,
    numbered in the order they run. The core numbers unnamed collectives per calling thread,
    and XLA runs a program on whichever of its threads is free; the ordered custom calls run
    one at a time in program order, so this one count is the same on every rank. The
    `.noname.` marks them automatic to the core (never cached by name, refused where a
    residual needs a real name)."""

    def __init__(self) -> None:
        self._count = itertools.count()

    def next(self, kind: str) -> str:
        return f"jax.{kind}.noname.{next(self._count)}"


_NAMES = _Names()

# core(name, inputs, outputs) -> results: a collective of numpy `inputs` on every rank, whose
# results are written into `outputs` where the core takes `out=` (and returned), or returned
# as new arrays; `outputs` is None outside jit.
Core = Callable[[Any, tuple, Any], list]


def _run(kind: str, static: tuple, core: Core, specs, name: str | None, *arrays, in_place: bool = False) -> list:
    """`core` now if the arrays are concrete (new jax.Arrays), else as one ordered FFI custom
    call of the compiled program, with results shaped as `specs`, named when it runs if the
    caller gave no name. `static` is every argument `core` closes over: with `kind` and
    `name` it keys the custom call. With `in_place` (see `custom_call`), `core` is given
    outputs that already hold the inputs, and works in them."""
    if not _traced(*arrays):
        return [_as_jax(r) for r in core(name, tuple(_host_view(x) for x in arrays), None)]

    def runner(inputs: tuple, outputs: tuple) -> None:
        results = core(name or _NAMES.next(kind), inputs, outputs)
        for out, result in zip(outputs, results):
            if result is not out:
                if result.shape != out.shape:  # only a broken caller of this module gets here
                    raise FastringError(f"{kind} gave shape {result.shape} where {out.shape} was expected")
                np.copyto(out, result)
    return custom_call(f"{kind}{static!r}:{name!r}", runner, specs, *arrays, in_place=in_place)


def _check_op(op) -> ReduceOp:
    if not isinstance(op, ReduceOp):
        raise TypeError(f"op must be a fastring.ReduceOp (Sum, Average, Min, Max, Product), got {op!r}")
    return op


def _check_differentiable(op: ReduceOp, kind: str) -> None:
    if op not in _LINEAR_OPS:
        raise NotImplementedError(f"the gradient of {kind} with op={op.name} is not defined by "
                                  "fastring.jax; only Sum and Average are differentiable")


def _check_rows(kind: str, name: str | None, rows: int) -> None:
    """Raise FastringError on every rank unless every rank passed `rows` (one tiny allreduce,
    named after the collective it guards)."""
    high, neg_low = fastring.allreduce(np.array([rows, -rows], np.int64), op=ReduceOp.Max,
                                       name=None if name is None else name + ".rows")
    if high != -neg_low:
        raise FastringError(f"{kind} inside jax.jit (or differentiated) needs the same dimension 0 "
                            f"on every rank, but the ranks passed from {-neg_low} to {high} rows")


@dataclasses.dataclass(frozen=True)
class _Reduction:
    """The static arguments of a reduction: what the compiled custom call closes over."""
    op: ReduceOp
    name: str | None
    compression: Compressor
    prescale_factor: float
    postscale_factor: float

    def factor(self) -> float:
        """The reduction's derivative with respect to one rank's input."""
        scale = self.prescale_factor * self.postscale_factor
        return scale / fastring.size() if self.op == ReduceOp.Average else scale

    def kwargs(self) -> dict:
        return dict(op=self.op, prescale_factor=self.prescale_factor,
                    postscale_factor=self.postscale_factor)

    def for_gradient(self) -> "_Reduction":
        return dataclasses.replace(self, name=None)


def _reduction(op, name, compression, prescale_factor, postscale_factor) -> _Reduction:
    if not isinstance(compression, Compressor):
        raise TypeError(f"compression must be a fastring.Compression member, got {compression!r}")
    return _Reduction(_check_op(op), name, compression, float(prescale_factor), float(postscale_factor))


# ----------------------------------------------------------------- allreduce
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _allreduce(how: _Reduction, x):
    kwargs = dict(how.kwargs(), compression=how.compression)  # once per trace, not per call

    def core(name, ins, outs):
        if outs is None:
            return [fastring.allreduce(ins[0], name=name, **kwargs)]
        return [fastring.allreduce(outs[0], name=name, out=outs[0], **kwargs)]  # in place
    return _run("allreduce", (how,), core, [_spec(x.shape, x.dtype)], how.name, x, in_place=True)[0]


def _allreduce_fwd(how, x):
    return _allreduce(how, x), None


def _allreduce_bwd(how, _, g):
    _check_differentiable(how.op, "allreduce")
    return (_allreduce(how.for_gradient(), g),)


_allreduce.defvjp(_allreduce_fwd, _allreduce_bwd)


def allreduce(tensor: jax.Array, op: ReduceOp = Average, *, name: str | None = None,
              compression: Compressor = Compression.none, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0) -> jax.Array:
    """Reduce `tensor` over all ranks; returns a new jax.Array, bitwise identical on every rank.

    Works outside and inside `jax.jit`; differentiable for Sum and Average (the gradient is
    the same allreduce of the cotangent). Arguments are those of `fastring.allreduce`. A
    mismatch across ranks (shape, dtype, op, scale factors) raises FastringError on every
    rank (inside jit: the jitted call's runtime error carries it).

    Example:
        >>> import jax, jax.numpy as jnp, fastring.jax as fj
        >>> fj.init()
        >>> jax.jit(lambda x: fj.allreduce(x, op=fj.Sum))(jnp.ones(3))   # on 1 rank
        Array([1., 1., 1.], dtype=float32)
    """
    return _allreduce(_reduction(op, name, compression, prescale_factor, postscale_factor),
                      _array(tensor))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _grouped_allreduce(how: _Reduction, xs: tuple):
    def core(name, ins, outs):
        return fastring.grouped_allreduce(list(ins), name=name, compression=how.compression, **how.kwargs())
    return tuple(_run("grouped_allreduce", (how,), core, [_spec(x.shape, x.dtype) for x in xs], how.name, *xs))


def _grouped_fwd(how, xs):
    return _grouped_allreduce(how, xs), None


def _grouped_bwd(how, _, gs):
    _check_differentiable(how.op, "grouped_allreduce")
    return (_grouped_allreduce(how.for_gradient(), tuple(gs)),)


_grouped_allreduce.defvjp(_grouped_fwd, _grouped_bwd)


def grouped_allreduce(tensors: Sequence[jax.Array], op: ReduceOp = Average, *, name: str | None = None,
                      compression: Compressor = Compression.none, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> list[jax.Array]:
    """Allreduce a list of arrays of one dtype as one fused operation; returns a list.

    Inside jit the whole list is one custom call and one fused allreduce. Differentiable for
    Sum and Average.

    Example:
        >>> import jax.numpy as jnp, fastring.jax as fj
        >>> fj.init()
        >>> fj.grouped_allreduce([jnp.ones(2), jnp.zeros(1)], op=fj.Sum)   # on 1 rank
        [Array([1., 1.], dtype=float32), Array([0.], dtype=float32)]
    """
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise TypeError(f"tensors must be a non-empty list or tuple, got {tensors!r}")
    xs = tuple(_array(t, f"tensors[{i}]") for i, t in enumerate(tensors))
    dtypes = sorted({str(x.dtype) for x in xs})
    if len(dtypes) > 1:
        raise TypeError(f"grouped_allreduce takes arrays of one dtype, got {dtypes}")
    how = _reduction(op, name, compression, prescale_factor, postscale_factor)
    return list(_grouped_allreduce(how, xs))


# ----------------------------------------------------------------- allgather
def _gather_rows(x, name: str | None, total: int, check_equal: bool):
    """Allgather whose result has `total` rows (static); with `check_equal`, every rank first
    confirms that every rank passed the same rows."""
    def core(name, ins, outs):
        if check_equal:
            _check_rows("allgather", name, ins[0].shape[0])
        return [fastring.allgather(ins[0], name=name)]
    return _run("allgather", (check_equal,), core, [_spec((total,) + x.shape[1:], x.dtype)], name, x)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _allgather_equal(name, x):
    return _gather_rows(x, name, fastring.size() * x.shape[0], check_equal=True)


def _allgather_fwd(name, x):
    return _allgather_equal(name, x), None


def _allgather_bwd(name, _, g):
    return (_reducescatter(_Reduction(ReduceOp.Sum, None, Compression.none, 1.0, 1.0), g),)


_allgather_equal.defvjp(_allgather_fwd, _allgather_bwd)


def allgather(tensor: jax.Array, *, name: str | None = None) -> jax.Array:
    """Concatenate every rank's `tensor` along dimension 0, in rank order.

    Outside jit dimension 0 may differ between ranks. Inside jit, and when differentiated,
    it must be the same on every rank (FastringError on every rank otherwise), since the
    result's shape is fixed when the program is compiled. The gradient is the cotangent's
    reducescatter (Sum): each rank gets back the sum over ranks of its own rows' cotangents.

    Example:
        >>> import jax.numpy as jnp, fastring.jax as fj
        >>> fj.init()
        >>> fj.allgather(jnp.arange(2))   # on 1 rank
        Array([0, 1], dtype=int32)
    """
    x = _array(tensor)
    if x.ndim == 0:
        raise ValueError("allgather needs at least one dimension, got a 0-d array")
    if _traced(x):
        return _allgather_equal(name, x)
    return _run("allgather", (), lambda name, ins, _: [fastring.allgather(ins[0], name=name)], None, name, x)[0]


# ----------------------------------------------------------------- broadcast
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _broadcast(root_rank: int, name, x):
    def core(name, ins, outs):
        if outs is None:
            return [fastring.broadcast(ins[0], root_rank, name=name)]
        return [fastring.broadcast(outs[0], root_rank, name=name, out=outs[0])]  # in place
    return _run("broadcast", (root_rank,), core, [_spec(x.shape, x.dtype)], name, x, in_place=True)[0]


def _broadcast_fwd(root_rank, name, x):
    return _broadcast(root_rank, name, x), None


def _broadcast_bwd(root_rank, name, _, g):
    total = _allreduce(_Reduction(ReduceOp.Sum, None, Compression.none, 1.0, 1.0), g)
    return (total if fastring.rank() == root_rank else jnp.zeros_like(g),)


_broadcast.defvjp(_broadcast_fwd, _broadcast_bwd)


def broadcast(tensor: jax.Array, root_rank: int, *, name: str | None = None) -> jax.Array:
    """Every rank receives `root_rank`'s `tensor` (a new array). Differentiable: the root's
    gradient is the sum of every rank's cotangent, the others' zero.

    Example:
        >>> import jax.numpy as jnp, fastring.jax as fj
        >>> fj.init()
        >>> fj.broadcast(jnp.arange(3.0), root_rank=0)
        Array([0., 1., 2.], dtype=float32)
    """
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)):
        raise TypeError(f"root_rank must be an int, got {root_rank!r}")
    if not 0 <= root_rank < fastring.size():
        raise ValueError(f"root_rank {root_rank} is not a rank of this job (size {fastring.size()})")
    return _broadcast(int(root_rank), name, _array(tensor))


# ----------------------------------------------------------------- alltoall
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _alltoall_equal(name, x):
    def core(name, ins, outs):
        _check_rows("alltoall", name, ins[0].shape[0])
        return [fastring.alltoall(ins[0], name=name)]
    return _run("alltoall", (), core, [_spec(x.shape, x.dtype)], name, x)[0]


def _alltoall_fwd(name, x):
    return _alltoall_equal(name, x), None


def _alltoall_bwd(name, _, g):
    return (_alltoall_equal(None, g),)


_alltoall_equal.defvjp(_alltoall_fwd, _alltoall_bwd)


def alltoall(tensor: jax.Array, splits=None, *, name: str | None = None):
    """Send rows of `tensor` to every rank and receive theirs, concatenated in rank order.

    Without `splits` dimension 0 is divided equally; inside jit and when differentiated this
    is the only form, and dimension 0 must be the same on every rank (the result then has the
    input's shape; the gradient is the cotangent's alltoall). With `splits` (outside jit only:
    the received rows are known only at run time) it returns `(tensor, received_splits)` as
    `fastring.alltoall` does.

    Example:
        >>> import jax.numpy as jnp, fastring.jax as fj
        >>> fj.init()
        >>> fj.alltoall(jnp.arange(4))   # on 1 rank
        Array([0, 1, 2, 3], dtype=int32)
    """
    x = _array(tensor)
    if x.ndim == 0:
        raise ValueError("alltoall needs at least one dimension, got a 0-d array")
    if splits is not None:
        if _traced(x) or _traced(splits):
            raise NotImplementedError("alltoall with splits cannot run inside jax.jit: the rows "
                                      "each rank receives are known only at run time; call it "
                                      "outside jit, or use equal splits (splits=None)")
        return _as_jax(fastring.alltoall(_host_view(x), splits, name=name))
    if x.shape[0] % fastring.size():
        raise ValueError(f"alltoall without splits divides dimension 0 equally, but {x.shape[0]} "
                         f"rows do not divide among {fastring.size()} ranks")
    if _traced(x):
        return _alltoall_equal(name, x)
    return _run("alltoall", (), lambda name, ins, _: [fastring.alltoall(ins[0], name=name)], None, name, x)[0]


# ----------------------------------------------------------------- reducescatter
def _scattered_rows(rows: int) -> int:
    n, r = fastring.size(), fastring.rank()
    return rows // n + (r < rows % n)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _reducescatter(how: _Reduction, x):
    shape = (_scattered_rows(x.shape[0]),) + x.shape[1:]
    def core(name, ins, outs):
        return [fastring.reducescatter(ins[0], name=name, **how.kwargs())]
    return _run("reducescatter", (how,), core, [_spec(shape, x.dtype)], how.name, x)[0]


def _reducescatter_fwd(how, x):
    return _reducescatter(how, x), x.shape[0]


def _reducescatter_bwd(how, rows, g):
    _check_differentiable(how.op, "reducescatter")
    gathered = _gather_rows(g, None, rows, check_equal=False)
    return (gathered * jnp.asarray(how.factor(), g.dtype),)


_reducescatter.defvjp(_reducescatter_fwd, _reducescatter_bwd)


def reducescatter(tensor: jax.Array, op: ReduceOp = Average, *, name: str | None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> jax.Array:
    """Reduce `tensor` over all ranks and give each rank its slice of dimension 0: with d0 rows
    and N ranks, rank r gets d0 // N rows, plus one if r < d0 % N. Differentiable for Sum and
    Average (the gradient is the cotangent's allgather, scaled as the forward was).

    Example:
        >>> import jax.numpy as jnp, fastring.jax as fj
        >>> fj.init()
        >>> fj.reducescatter(jnp.arange(4.0), op=fj.Sum)   # on 1 rank
        Array([0., 1., 2., 3.], dtype=float32)
    """
    x = _array(tensor)
    if x.ndim == 0:
        raise ValueError("reducescatter needs at least one dimension, got a 0-d array")
    return _reducescatter(_reduction(op, name, Compression.none, prescale_factor, postscale_factor), x)


def barrier() -> None:
    """Return once every rank has called barrier (outside jit).

    Example:
        >>> import fastring.jax as fj
        >>> fj.init(); fj.barrier()
    """
    fastring.barrier()


__all__: list[Any] = ["Average", "Sum", "Min", "Max", "Product", "allreduce", "grouped_allreduce",
                      "allgather", "broadcast", "alltoall", "reducescatter", "barrier"]
