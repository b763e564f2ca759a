"""The collectives besides allreduce (README.md, "The API in brief"): allgather, broadcast,
alltoall, reducescatter, barrier and the object forms.

Each takes `process_set=` (fastring.api.process_sets; None: every rank) and is one Request
for that set's engine, whose parts one `_<op>_parts` function gives to both the synchronous
form (`_run`: the engine's lean path while nothing is queued, else the Request, waited for)
and the `_async` form (`_submit`). Arguments are
checked at call time (ValueError/TypeError on the calling rank); what only the ranks together
can check (dtype, trailing dimensions, root rank, op, scale factors) goes into the request's
fields, which the engine compares across ranks before anything moves. How the bytes move is
`fastring.algorithms.collectives`.
"""
from __future__ import annotations

import functools
import numbers
import pickle
from typing import Any, Callable

import numpy as np

from .._core import pool as _pool
from .._core.config import CYCLE_COLLECTIVE_MAX_BYTES
from .._core.dtypes import SUPPORTED, DtypeSpec, spec_of
from .._core.errors import FastringError
from .._core.ops import OP_NAMES, ReduceOp, as_reduce_op
from .._core.runtime import Runtime, runtime
from .._core.tensor import as_array, like
from .._core.work import work_of
from .._transport import is_c_contiguous, is_writable_c_contiguous
from ..algorithms import InCycle, broadcast_bytes, chunk_offsets
from ..algorithms.adasum import ADASUM_DTYPES, adasum_allreduce as _adasum
from ..algorithms.collectives import (allgather_concat, allgather_reduced, allgather_rows, alltoall_rows, byte_offsets,
                                      gather_counts, gather_fits, gather_payload, gathered_bytes, own_rows,
                                      reduce_scatter_rows, rides_cycle, row_bytes)
from ..engine import Handle, Request
from ..engine.engine import arrived
from .process_sets import global_process_set, runtime_of, set_rank
from .validation import check_op_for_dtype, entry, factor, request_name

try:
    import cloudpickle as _pickler  # lambdas, closures, classes defined in __main__
except ImportError:  # pragma: no cover - cloudpickle is a dependency, pickle the fallback
    _pickler = pickle


# ----------------------------------------------------------------- shared pieces
def _parts(rt: Runtime, kind: str, name: str, fields: tuple, nbytes: int, execute: Callable[..., Any]) -> tuple:
    """`_request_of`'s arguments for one collective named `name` (see validation.request_name):
    its kind goes first in its fields."""
    return rt, kind, name, (("collective", kind),) + fields, nbytes, execute


def _submit(parts: tuple) -> Handle:
    """The asynchronous form of a collective given as `_request_of`'s arguments."""
    return parts[0].engine.submit(_request_of(*parts))


def _rows_array(tensor, kind: str) -> tuple[np.ndarray, DtypeSpec]:
    """The tensor of a collective that splits or concatenates dimension 0."""
    arr = as_array(tensor)
    spec = spec_of(arr.dtype)
    if arr.ndim == 0:
        raise ValueError(f"{kind} needs a tensor with at least one dimension (it works on "
                         "dimension 0); got a 0-d tensor")
    return arr, spec


# (kind, the values of its fields) -> the fields of an allgather, alltoall, broadcast or
# reducescatter, one object per signature: the engine's caches then compare a call's fields
# at once (api._lean._fields); with the broadcast's kept choice that took 1-5 us off a 1 MiB
# broadcast, the old and new code alternating (BENCHMARKS.md, "Round 2, session 26")
_FIELDS: dict[tuple, tuple] = {}
FIELDS_KEPT = 4096  # distinct signatures remembered, of all four kinds together (then built each call)
# what must be equal on every rank for each kind under one name, between its kind and its device
_FIELD_NAMES = {"allgather": ("dtype", "trailing_shape"), "alltoall": ("dtype", "trailing_shape"),
                "broadcast": ("dtype", "shape", "root_rank"),
                "reducescatter": ("dtype", "shape", "op", "prescale_factor", "postscale_factor")}


def _kept_fields(key: tuple) -> tuple:
    """The fields of a collective given as `key`, (kind, the values its _FIELD_NAMES hold), one
    object per signature (`_FIELDS`)."""
    fields = _FIELDS.get(key)
    if fields is None:
        kind, values = key[0], key[1:]
        fields = (("collective", kind), *zip(_FIELD_NAMES[kind], values), ("device", "cpu"))
        # a NaN value's key (a scale factor's) is never found again: not kept
        if len(_FIELDS) < FIELDS_KEPT and all(v == v for v in values):
            _FIELDS[key] = fields
    return fields


def _is_global(process_set) -> bool:
    """Whether `process_set=` names every rank (the lean calls take only those)."""
    return process_set is None or process_set is global_process_set


def _request_of(rt: Runtime, kind: str, name: str, fields: tuple, nbytes: int, execute: Callable[..., Any],
                ride: tuple | None = None) -> Request:
    """The Request of a collective given as its parts (`fields` with its kind first; `ride`
    rides only the lean path's cycle, see `_run`)."""
    return Request(kind, name, fields, nbytes, Handle(rt.engine, name), execute=execute)


def _run(rt: Runtime, kind: str, name: str, fields: tuple, nbytes: int, execute: Callable[..., Any],
         ride: tuple | None = None):
    """The synchronous form of a collective given as its parts: by the engine's lean path
    (`Engine.lone_run`: no Request; `ride`, where given, is `lone_run`'s (payload, op[, into[,
    dtype]]): the payload reduced over the ranks in the negotiation cycle by `op` over `dtype`'s
    items (default its own), into `into` (default a new array), and handed to
    `execute(rt, reduced)`, else `execute(rt)`) when nothing is queued, otherwise as the
    Request that the `_async` form submits (`execute(rt)`), waited for."""
    def request(assigned: str) -> Request:
        return _request_of(rt, kind, assigned, fields, nbytes, execute)

    def run(assigned: str, reduced: np.ndarray | None):
        return execute(rt) if reduced is None else execute(rt, reduced)
    done = rt.engine.lone_run(kind, name, fields, run, request, *(ride or ()))
    return rt.engine.run(request(name)) if done is None else done[0]


# (ranks, rank, this rank's row count or equal split) -> their cycle's ride (read-only,
# shared: building it cost 3-4 us a call); splits given by the caller, which may change every
# call, are not kept
_OWN_COUNTS: dict[tuple, tuple | None] = {}


def _own_counts(rt: Runtime, mine) -> tuple | None:
    """This rank's row counts as what rides a lean call's cycle (`_run`'s `ride`): `mine` (an
    int, or send_rows) in row `rt.rank` of zeros for every rank, whose sum over the ranks is
    every rank's counts; None where they would not fit in a cycle."""
    kept = type(mine) is int or not mine.flags.writeable  # a row count, or _equal_rows' split
    key = (rt.size, rt.rank, mine if type(mine) is int else ("split", int(mine[0]))) if kept else None
    ride = _OWN_COUNTS.get(key, False)  # None, the key of splits not kept, is never stored
    if ride is False:
        counts = np.zeros((rt.size,) if type(mine) is int else (rt.size, rt.size), np.int64)
        ride = None
        if InCycle.fits(counts.nbytes):
            counts[rt.rank] = mine
            counts.flags.writeable = False
            ride = (counts, ReduceOp.Sum, None)
        if kept and len(_OWN_COUNTS) < FIELDS_KEPT:
            _OWN_COUNTS[key] = ride
    return ride


def _root(root_rank, rt: Runtime) -> int:
    """The root's rank in `rt`'s communicator (root_rank is global: see process_sets)."""
    if type(root_rank) is int and rt.world_ranks is None and 0 <= root_rank < rt.size:
        return root_rank  # the common case, without the checks' half microsecond
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral):
        raise TypeError(f"root_rank must be an integer, got {type(root_rank).__name__}")
    root = int(root_rank)
    if rt.world_ranks is None and not 0 <= root < rt.size:
        raise ValueError(f"root_rank {root} is outside [0, {rt.size}): there are {rt.size} ranks")
    return set_rank(rt, root, "root_rank")


# ----------------------------------------------------------------- allgather
def _allgather_parts(tensor, name, process_set) -> tuple:
    """The parts of an allgather (`_request_of`'s arguments), its arguments checked."""
    rt = runtime_of(process_set)
    name = request_name(rt, "allgather", name)
    arr, spec = _rows_array(tensor, "allgather")

    def execute(rt: Runtime, reduced: np.ndarray | None = None):
        # reduced: every rank's row count, and every rank's rows where they fit (gather_payload)
        out = allgather_concat(rt, arr)[1] if reduced is None else allgather_reduced(rt, arr, reduced)
        return like(tensor, out)
    ride = (gather_payload(rt, arr.shape[0], arr), ReduceOp.Sum) if rt.size > 1 and gather_fits(rt.size) else None
    return (rt, "allgather", name, _kept_fields(("allgather", spec.name, arr.shape[1:])), arr.nbytes, execute, ride)


def allgather_async(tensor, *, name: str | None = None, process_set=None) -> Handle:
    """Start an allgather and return its Handle; `handle.wait()` gives what `allgather` would.

    The tensor must not be modified until the handle completes.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.allgather_async(np.arange(2), name="ids").wait()   # on 1 rank
        array([0, 1])
    """
    return _submit(_allgather_parts(tensor, name, process_set))


def allgather(tensor, *, name: str | None = None, process_set=None):
    """Concatenate every rank's tensor along dimension 0, in rank order.

    Dimension 0 may differ between ranks; the other dimensions and the dtype must agree (a
    mismatch raises FastringError on every rank). Every rank receives the bitwise-identical
    result, as the caller's framework type. A 0-d tensor raises ValueError.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.allgather(np.ones((2, 3), np.float32)).shape   # (2 * size, 3)
        (2, 3)
    """
    return _run(*_allgather_parts(tensor, name, process_set))


# ----------------------------------------------------------------- broadcast
def _broadcast_parts(tensor, root_rank, name, out, process_set) -> tuple:
    rt = runtime_of(process_set)
    name = request_name(rt, "broadcast", name)
    root = _root(root_rank, rt)
    arr = as_array(tensor)
    spec = spec_of(arr.dtype)
    e = entry(tensor, arr, out)

    def execute(rt: Runtime, landed: np.ndarray | None = None):
        # landed: the root's bytes came in the cycle, into e.work already (_in_cycle)
        if landed is None and rt.rank == root and e.work is not e.src and is_c_contiguous(e.src):
            # Sent from the input, so that the others' reads leave the result's cache lines
            # to the root alone (see Transport.ring_allgather).
            broadcast_bytes(rt, e.src, root)
            np.copyto(e.work, e.src)
        elif landed is None:
            if rt.rank == root and e.work is not e.src:
                np.copyto(e.work, e.src)
            broadcast_bytes(rt, e.work, root)
        if e.target is not e.work:
            np.copyto(e.target, e.work)
        return e.result

    ride = None
    if _in_cycle(rt, arr.nbytes):
        # the root's bytes summed with the others' zeros, as unsigned integers (every bit
        # kept): every rank's e.work holds them
        src = e.src if rt.rank == root else _zeros(arr.nbytes)
        ride = (src if is_c_contiguous(src) else np.ascontiguousarray(src), ReduceOp.Sum, e.work,
                _WORDS if arr.nbytes % 8 == 0 else _BYTES)
    return rt, "broadcast", name, _broadcast_fields(spec, arr.shape, root), arr.nbytes, execute, ride


def _broadcast_fields(spec: DtypeSpec, shape: tuple, root: int) -> tuple:
    """A broadcast's fields, for the general parts and the lean call alike."""
    return _kept_fields(("broadcast", spec.name, shape, root))


def _in_cycle(rt: Runtime, nbytes: int) -> bool:
    """Whether a lean broadcast or reducescatter of `nbytes` (alike on every rank: the shape
    is agreed) rides its negotiation cycle with its data (CYCLE_COLLECTIVE_MAX_BYTES)."""
    return rt.size > 1 and 0 < nbytes <= CYCLE_COLLECTIVE_MAX_BYTES


# The integers a broadcast's bytes are summed as: 8-byte words where they divide its size
# (a sum adds 8 bytes a step), else bytes.
_WORDS, _BYTES = np.dtype(np.uint64), np.dtype(np.uint8)


@functools.lru_cache(maxsize=64)
def _zeros(nbytes: int) -> np.ndarray:
    """`nbytes` zero bytes (read-only, shared): what a broadcast's other ranks add to the root's."""
    out = np.zeros(nbytes, np.uint8)
    out.flags.writeable = False
    return out


def broadcast_async(tensor, root_rank: int, *, name: str | None = None, out=None,
                    process_set=None) -> Handle:
    """Start a broadcast and return its Handle; `handle.wait()` gives what `broadcast` would.

    The tensor (and `out`) must not be used until the handle completes.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.broadcast_async(np.arange(3.0), 0, name="w").wait()
        array([0., 1., 2.])
    """
    return _submit(_broadcast_parts(tensor, root_rank, name, out, process_set))


def broadcast(tensor, root_rank: int, *, name: str | None = None, out=None, process_set=None):
    """Every rank receives `root_rank`'s tensor, bitwise identical, as its framework's type.

    Every rank passes a tensor of the same shape and dtype (a mismatch, or different
    `root_rank`s, raise FastringError on every rank); only the root's values matter. The
    result is a new tensor on every rank, the root included; `out=` receives it instead
    (`out=tensor` broadcasts in place). A root outside [0, size) raises ValueError.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> w = np.zeros(3) + fastring.rank()
        >>> fastring.broadcast(w, root_rank=0, out=w)   # every rank now holds rank 0's w
        array([0., 0., 0.])
    """
    if out is tensor and _is_global(process_set) and _lean_broadcast(tensor, root_rank, name):
        return tensor
    return _run(*_broadcast_parts(tensor, root_rank, name, out, process_set))


def _lean_broadcast(arr, root_rank, name) -> bool:
    """`broadcast(arr, root_rank, name=name, out=arr)` of a numpy array too large to ride its
    cycle, by the engine's lean path with nothing built but its fields (one object per
    signature): the general parts, their Entry and closures and the execute's checks cost a
    1 MiB call up to 5 us, the old and new code alternating in one launch (BENCHMARKS.md,
    "Round 2, session 27"). False where the general path must take the call (anything else,
    or the engine busy): nothing has happened then, not even an automatic name taken."""
    if type(arr) is not np.ndarray or type(root_rank) is not int or not (name is None or type(name) is str):
        return False
    rt = runtime()
    spec = SUPPORTED.get(arr.dtype)
    if spec is None or not 0 <= root_rank < rt.size or _in_cycle(rt, arr.nbytes) or not is_writable_c_contiguous(arr):
        return False
    fields = _broadcast_fields(spec, arr.shape, root_rank)

    def run(assigned: str, reduced: None) -> None:
        broadcast_bytes(rt, arr, root_rank)

    def request(assigned: str) -> Request:
        return _request_of(*_broadcast_parts(arr, root_rank, assigned, arr, None))
    return rt.engine.lone_run("broadcast", name, fields, run, request) is not None


# ----------------------------------------------------------------- alltoall
@functools.lru_cache(maxsize=256)
def _equal_rows(rows: int, size: int) -> np.ndarray:
    """`rows` rows to each of `size` ranks (read-only, shared: building it cost 2 us a call)."""
    out = np.full(size, rows, np.int64)
    out.flags.writeable = False
    return out


def _send_rows(splits, dim0: int, size: int) -> np.ndarray:
    """Rows sent to each rank, from `splits` or the equal split of dimension 0."""
    if splits is None:
        if dim0 % size:
            raise ValueError(f"alltoall without splits divides dimension 0 equally, but {dim0} "
                             f"rows do not divide among {size} ranks; pass splits")
        return _equal_rows(dim0 // size, size)
    if isinstance(splits, (list, tuple)):
        if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in splits):
            raise ValueError(f"splits must hold integers, got {splits!r}")
        rows = np.array([int(s) for s in splits], np.int64)
        if rows.size and (rows.max() > np.iinfo(np.int32).max):
            raise ValueError(f"splits must fit in int32, got {splits!r}")
    else:
        try:
            arr = as_array(splits, "splits")
        except TypeError as err:
            raise ValueError(f"splits must be a 1-D int32 tensor: {err}") from None
        if arr.dtype != np.int32 or arr.ndim != 1:
            raise ValueError(f"splits must be a 1-D int32 tensor, got {arr.dtype} with shape {arr.shape}")
        rows = arr.astype(np.int64)
    if rows.shape != (size,):
        raise ValueError(f"splits needs one entry per rank ({size}), got {rows.size}")
    if (rows < 0).any():
        raise ValueError(f"splits must not be negative, got {rows.tolist()}")
    if rows.sum() > dim0:
        raise ValueError(f"splits sum to {int(rows.sum())}, more than dimension 0 of the tensor ({dim0})")
    return rows


# (dtype, shape, ranks, rank) -> (fields, send_rows, cycle ride) of an alltoall that splits
# dimension 0 equally: deriving them cost a 1 MiB call 2-9 us, the old and new code alternating
# (BENCHMARKS.md, "Round 2, session 26"); splits the caller gives are checked each call
_EQUAL_SPLITS: dict[tuple, tuple] = {}


def _alltoall_parts(tensor, splits, name, process_set) -> tuple:
    """The parts of an alltoall (`_request_of`'s arguments), its arguments checked."""
    rt = runtime_of(process_set)
    name = request_name(rt, "alltoall", name)
    arr = as_array(tensor)
    key = (arr.dtype, arr.shape, rt.size, rt.rank) if splits is None else None
    plan = _EQUAL_SPLITS.get(key)  # None, the key of given splits, is never stored
    if plan is None:
        arr, spec = _rows_array(arr, "alltoall")
        send_rows = _send_rows(splits, arr.shape[0], rt.size)
        plan = (_kept_fields(("alltoall", spec.name, arr.shape[1:])), send_rows, _own_counts(rt, send_rows))
        if key is not None and len(_EQUAL_SPLITS) < FIELDS_KEPT:
            _EQUAL_SPLITS[key] = plan
    fields, send_rows, ride = plan

    def execute(rt: Runtime, matrix: np.ndarray | None = None):
        out, recv_rows = alltoall_rows(rt, arr, send_rows, matrix)
        result = like(tensor, out)
        if splits is None:
            return result
        return result, like(tensor, recv_rows.astype(np.int32))
    return rt, "alltoall", name, fields, arr.nbytes, execute, ride


def alltoall_async(tensor, splits=None, *, name: str | None = None, process_set=None) -> Handle:
    """Start an alltoall and return its Handle; `handle.wait()` gives what `alltoall` would.

    The tensor must not be modified until the handle completes.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> out, got = fastring.alltoall_async(np.arange(3), splits=[2]).wait()   # on 1 rank
        >>> out, got
        (array([0, 1]), array([2], dtype=int32))
    """
    return _submit(_alltoall_parts(tensor, splits, name, process_set))


def alltoall(tensor, splits=None, *, name: str | None = None, process_set=None):
    """Send rows of `tensor` to every rank and receive theirs, concatenated in rank order.

    With `splits` (a 1-D int32 tensor, or a list of ints, one entry per rank, summing to at
    most dimension 0), the first splits[0] rows go to rank 0, the next splits[1] to rank 1,
    and so on; the result is `(tensor, received_splits)`, received_splits[r] being the rows
    that came from rank r (int32, the caller's framework type). Without splits, dimension 0
    is divided equally (ValueError if it does not divide) and only the tensor is returned.
    Dimension 0 may differ between ranks; the other dimensions and the dtype must agree
    (FastringError on every rank otherwise). Bad splits and 0-d tensors raise ValueError.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.alltoall(np.arange(4) + 10 * fastring.rank())   # on 1 rank
        array([0, 1, 2, 3])
    """
    return _run(*_alltoall_parts(tensor, splits, name, process_set))


# ----------------------------------------------------------------- reducescatter
def _reducescatter_parts(tensor, op, name, prescale_factor, postscale_factor, process_set) -> tuple:
    rt = runtime_of(process_set)
    op = as_reduce_op(op)
    prescale = factor(prescale_factor, "prescale_factor")
    postscale = factor(postscale_factor, "postscale_factor")
    name = request_name(rt, "reducescatter", name)
    arr, spec = _rows_array(tensor, "reducescatter")
    check_op_for_dtype(op, spec, prescale, postscale)
    fields, work = _reducescatter_signature(spec, arr.shape, op, prescale, postscale)

    def execute(rt: Runtime, reduced: np.ndarray | None = None):
        # reduced: every rank's input, reduced in the cycle (_in_cycle)
        out = reduce_scatter_rows(rt, arr, work) if reduced is None else own_rows(rt, reduced, work)
        return like(tensor, out)

    ride = None
    if _in_cycle(rt, arr.nbytes) and rides_cycle(work, rt.size):
        ride = (arr if is_c_contiguous(arr) else np.ascontiguousarray(arr), op)
    return rt, "reducescatter", name, fields, arr.nbytes, execute, ride


def _reducescatter_signature(spec: DtypeSpec, shape: tuple, op: ReduceOp, prescale: float,
                             postscale: float) -> tuple:
    """(fields, work) of a reducescatter whose arguments passed their checks, for the general
    parts and the lean call alike."""
    return (_kept_fields(("reducescatter", spec.name, shape, OP_NAMES[op], prescale, postscale)),
            work_of(spec, op, prescale, postscale))


def reducescatter_async(tensor, op: ReduceOp = ReduceOp.Average, *, name: str | None = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        process_set=None) -> Handle:
    """Start a reducescatter and return its Handle; `handle.wait()` gives what `reducescatter`
    would. The tensor must not be modified until the handle completes.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.reducescatter_async(np.ones(4), op=fastring.Sum).wait()   # on 1 rank
        array([1., 1., 1., 1.])
    """
    return _submit(_reducescatter_parts(tensor, op, name, prescale_factor, postscale_factor, process_set))


def reducescatter(tensor, op: ReduceOp = ReduceOp.Average, *, name: str | None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set=None):
    """Reduce `tensor` over all ranks and give each rank its slice of dimension 0.

    With d0 rows and N ranks, rank r receives d0 // N rows, plus one if r < d0 % N, in rank
    order. Ops, Average semantics (integers truncate; float16/bfloat16 divide before summing
    so that large values do not overflow) and the scale factors are those of `allreduce`.
    Every rank passes the same shape and dtype (FastringError on every rank otherwise); the
    input is left untouched. A 0-d tensor raises ValueError.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.reducescatter(np.arange(6.0).reshape(3, 2), op=fastring.Sum)   # on 1 rank
        array([[0., 1.],
               [2., 3.],
               [4., 5.]])
    """
    if _is_global(process_set) and type(prescale_factor) is float and prescale_factor == 1.0 and (
            type(postscale_factor) is float and postscale_factor == 1.0):
        done = _lean_reducescatter(tensor, op, name)
        if done is not None:
            return done[0]
    return _run(*_reducescatter_parts(tensor, op, name, prescale_factor, postscale_factor, process_set))


# (dtype, shape, op) -> (fields, work) of a reducescatter without scale factors that passes its
# checks: `_lean_reducescatter`'s one lookup a call
_LEAN_SCATTERS: dict[tuple, tuple] = {}


def _lean_reducescatter(arr, op, name) -> tuple | None:
    """`reducescatter(arr, op, name=name)` of a numpy array without scale factors that does not
    ride its cycle, by the engine's lean path with nothing built but its kept fields and work:
    the general parts and closures cost a 1 MiB call 4-12 us, the old and new code alternating
    in one launch (BENCHMARKS.md, "Round 2, session 27"). (The result,), or None where the
    general path must take the call (anything else, an argument it would refuse, or the engine
    busy): nothing has happened then."""
    if type(arr) is not np.ndarray or type(op) is not ReduceOp or not (name is None or type(name) is str):
        return None
    key = (arr.dtype, arr.shape, op)
    plan = _LEAN_SCATTERS.get(key)
    if plan is None:
        spec = SUPPORTED.get(arr.dtype)
        if spec is None or arr.ndim == 0:
            return None
        try:
            check_op_for_dtype(op, spec)
        except TypeError:
            return None
        plan = _reducescatter_signature(spec, arr.shape, op, 1.0, 1.0)
        if len(_LEAN_SCATTERS) < FIELDS_KEPT:
            _LEAN_SCATTERS[key] = plan
    fields, work = plan
    rt = runtime()
    if _in_cycle(rt, arr.nbytes) and rides_cycle(work, rt.size):
        return None

    def run(assigned: str, reduced: None) -> np.ndarray:
        return reduce_scatter_rows(rt, arr, work)

    def request(assigned: str) -> Request:
        return _request_of(*_reducescatter_parts(arr, op, assigned, 1.0, 1.0, None))
    return rt.engine.lone_run("reducescatter", name, fields, run, request)


# ----------------------------------------------------------------- grouped allgather and reducescatter
def _tensor_list(tensors, kind: str) -> list:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{kind} takes a list or tuple of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{kind} needs at least one tensor")
    return list(tensors)


def _grouped_allgather_parts(tensors, name, process_set) -> tuple:
    rt = runtime_of(process_set)
    name = request_name(rt, "grouped_allgather", name)
    tensors = _tensor_list(tensors, "grouped_allgather")
    arrays = [_rows_array(t, "grouped_allgather") for t in tensors]

    def execute(rt: Runtime):
        # One exchange of every tensor's row count, one of all the bytes: each rank sends its
        # tensors one after another, and every rank cuts the others' blocks apart.
        counts = np.empty((rt.size, len(arrays)), np.int64)
        allgather_rows(rt, np.array([[a.shape[0] for a, _ in arrays]], np.int64), np.ones(rt.size, np.int64),
                       counts)
        unit = np.array([row_bytes(a) for a, _ in arrays], np.int64)
        per_rank = counts @ unit
        mine = np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a, _ in arrays])
        gathered = np.empty(int(per_rank.sum()), np.uint8)
        allgather_rows(rt, mine, per_rank, gathered)
        outs = [_pool.empty((int(counts[:, j].sum()),) + a.shape[1:], a.dtype) for j, (a, _) in enumerate(arrays)]
        starts = byte_offsets(per_rank, 1)
        for r in range(rt.size):
            at = int(starts[r])
            for j, out in enumerate(outs):
                n = int(counts[r, j] * unit[j])
                first = int(counts[:r, j].sum())
                out[first:first + int(counts[r, j])].reshape(-1).view(np.uint8)[:] = gathered[at:at + n]
                at += n
        return [like(t, out) for t, out in zip(tensors, outs)]

    fields = (("dtypes", tuple(spec.name for _, spec in arrays)),
              ("trailing_shapes", tuple(a.shape[1:] for a, _ in arrays)), ("device", "cpu"))
    return _parts(rt, "grouped_allgather", name, fields, sum(a.nbytes for a, _ in arrays), execute)


def grouped_allgather_async(tensors, *, name: str | None = None, process_set=None) -> Handle:
    """Start a grouped allgather; `handle.wait()` gives what `grouped_allgather` would.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.grouped_allgather_async([np.arange(2), np.ones((1, 2))]).wait()   # on 1 rank
        [array([0, 1]), array([[1., 1.]])]
    """
    return _submit(_grouped_allgather_parts(tensors, name, process_set))


def grouped_allgather(tensors, *, name: str | None = None, process_set=None) -> list:
    """`allgather` of each tensor of a list, as one fused operation: one exchange of the row
    counts and one of all the tensors' bytes. Tensors may differ in dtype and shape; each
    tensor's dtype and trailing dimensions must agree across ranks (FastringError otherwise).

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> [a.shape for a in fastring.grouped_allgather([np.ones((2, 3)), np.ones(4)])]   # 1 rank
        [(2, 3), (4,)]
    """
    return _run(*_grouped_allgather_parts(tensors, name, process_set))


def _grouped_reducescatter_parts(tensors, op, name, prescale_factor, postscale_factor,
                                 process_set) -> tuple:
    rt = runtime_of(process_set)
    op = as_reduce_op(op)
    prescale = factor(prescale_factor, "prescale_factor")
    postscale = factor(postscale_factor, "postscale_factor")
    name = request_name(rt, "grouped_reducescatter", name)
    tensors = _tensor_list(tensors, "grouped_reducescatter")
    arrays = [_rows_array(t, "grouped_reducescatter")[0] for t in tensors]
    spec = spec_of(arrays[0].dtype)
    if len({a.dtype for a in arrays}) > 1:
        raise TypeError(f"grouped_reducescatter tensors must share one dtype, got "
                        f"{', '.join(sorted({str(a.dtype) for a in arrays}))}")
    check_op_for_dtype(op, spec, prescale, postscale)
    work = work_of(spec, op, prescale, postscale)

    def execute(rt: Runtime):
        # One reduce-scatter of all the tensors: their elements laid out by destination rank
        # (rank r's rows of every tensor, one tensor after another), cut back apart after.
        splits = [chunk_offsets(a.shape[0], rt.size, 1) for a in arrays]
        widths = [a.size // a.shape[0] if a.shape[0] else 0 for a in arrays]
        fused = np.concatenate([np.ascontiguousarray(a[s[r]:s[r + 1]]).reshape(-1)
                                for r in range(rt.size) for a, s in zip(arrays, splits)])
        counts = np.array([sum(int(s[r + 1] - s[r]) * w for s, w in zip(splits, widths))
                           for r in range(rt.size)], np.int64)
        mine = reduce_scatter_rows(rt, fused, work, counts)
        outs, at = [], 0
        for t, a, s, w in zip(tensors, arrays, splits, widths):
            rows = int(s[rt.rank + 1] - s[rt.rank])
            outs.append(like(t, mine[at:at + rows * w].reshape((rows,) + a.shape[1:])))
            at += rows * w
        return outs

    fields = (("dtype", spec.name), ("shapes", tuple(a.shape for a in arrays)), ("op", op.name),
              ("prescale_factor", prescale), ("postscale_factor", postscale), ("device", "cpu"))
    return _parts(rt, "grouped_reducescatter", name, fields, sum(a.nbytes for a in arrays), execute)


def grouped_reducescatter_async(tensors, op: ReduceOp = ReduceOp.Average, *, name: str | None = None,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                process_set=None) -> Handle:
    """Start a grouped reducescatter; `handle.wait()` gives what `grouped_reducescatter` would.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.grouped_reducescatter_async([np.ones(2), np.ones(3)], op=fastring.Sum).wait()
        [array([1., 1.]), array([1., 1., 1.])]
    """
    return _submit(_grouped_reducescatter_parts(tensors, op, name, prescale_factor, postscale_factor,
                                                process_set))


def grouped_reducescatter(tensors, op: ReduceOp = ReduceOp.Average, *, name: str | None = None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          process_set=None) -> list:
    """`reducescatter` of each tensor of a list (one dtype), as one fused reduce-scatter:
    rank r receives its rows of every tensor, split as `reducescatter` splits each.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.grouped_reducescatter([np.ones((2, 2)), np.arange(3.0)], op=fastring.Sum)[1]
        array([0., 1., 2.])
    """
    return _run(*_grouped_reducescatter_parts(tensors, op, name, prescale_factor, postscale_factor,
                                              process_set))


# ----------------------------------------------------------------- Adasum
def _adasum_parts(tensor, name, process_set) -> tuple:
    rt = runtime_of(process_set)
    name = request_name(rt, "adasum", name)
    arr = as_array(tensor)
    if arr.dtype not in ADASUM_DTYPES:
        raise TypeError(f"Adasum reduces float32 and float64 tensors on the CPU, got {arr.dtype}")
    if rt.size & (rt.size - 1):
        raise ValueError(f"Adasum needs a power-of-two number of ranks (its recursive halving "
                         f"pairs rank r with r ^ 2**k), got {rt.size}")

    def execute(rt: Runtime):
        return like(tensor, _adasum(rt, arr))

    fields = (("dtype", arr.dtype.name), ("shape", arr.shape), ("device", "cpu"))
    return _parts(rt, "adasum", name, fields, arr.nbytes, execute)


def adasum_allreduce_async(tensor, *, name: str | None = None, process_set=None) -> Handle:
    """Start an Adasum reduction; `handle.wait()` gives what `adasum_allreduce` would.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.adasum_allreduce_async(np.ones(2)).wait()   # on 1 rank
        array([1., 1.])
    """
    return _submit(_adasum_parts(tensor, name, process_set))


def adasum_allreduce(tensor, *, name: str | None = None, process_set=None):
    """The Adasum (adaptive sum) of every rank's tensor (fastring.algorithms.adasum): the sum
    of orthogonal tensors, the average of equal ones. float32/float64 on the CPU, on a
    power-of-two number of ranks (ValueError otherwise). Every rank receives the result.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.adasum_allreduce(np.array([3.0, 4.0]))   # on 1 rank: the tensor itself
        array([3., 4.])
    """
    return _run(*_adasum_parts(tensor, name, process_set))


# ----------------------------------------------------------------- barrier and objects
def barrier(process_set=None) -> None:
    """Return only once every rank (of `process_set`) has called barrier; a rank that has
    joined (`fastring.join`) stands in for it, as in any collective.

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> fastring.barrier()
    """
    rt = runtime_of(process_set)
    name = request_name(rt, "barrier", None)
    _run(*_parts(rt, "barrier", name, (), 0, arrived))


def _serialize(obj) -> tuple[np.ndarray, int]:
    """(bytes, header word): the pickled object and its length, or, when it cannot be
    pickled, the error message and -1 - its length, so that every rank learns of it."""
    try:
        data = _pickler.dumps(obj)
        return np.frombuffer(data, np.uint8), len(data)
    except Exception as err:  # noqa: BLE001 - reported on every rank below
        message = f"{type(err).__name__}: {err}".encode("utf-8", "replace")
        return np.frombuffer(message, np.uint8), -1 - len(message)


def _length(word: int) -> int:
    return word if word >= 0 else -1 - word


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set=None) -> Any:
    """Every rank receives a copy of `root_rank`'s picklable object (cloudpickle when it is
    installed, else pickle); the root gets `obj` itself. Its size travels first (with its
    bytes, where they are few, in the negotiation cycle), then its bytes. If the root cannot
    pickle it, every rank raises FastringError with the reason.

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> fastring.broadcast_object({"epoch": 3} if fastring.rank() == 0 else None)
        {'epoch': 3}
    """
    rt = runtime_of(process_set)
    name = request_name(rt, "broadcast_object", name)
    root = _root(root_rank, rt)
    data, word = _serialize(obj) if rt.rank == root else (_NOTHING, 0)

    def execute(rt: Runtime, reduced: np.ndarray | None = None):
        # reduced: the root's size, and its bytes where they fit (gather_payload; the others' 0)
        if reduced is None:
            header = np.array([word], np.int64)
            broadcast_bytes(rt, header, root)
            got = int(header[0])
        else:
            got = int(reduced[root])
        lengths = [_length(got) if r == root else 0 for r in range(rt.size)]
        pieces = None if reduced is None else gathered_bytes(rt, reduced, lengths)
        mine = data if rt.rank == root else np.empty(_length(got), np.uint8)
        if pieces is None:
            broadcast_bytes(rt, mine, root)
        else:
            mine = pieces[root]
        if got < 0:
            raise FastringError(f"broadcast_object: rank {root} could not pickle the object: "
                                f"{mine.tobytes().decode('utf-8', 'replace')}")
        return obj if rt.rank == root else pickle.loads(mine)

    return _run(*_parts(rt, "broadcast_object", name, (("root_rank", root),), 0, execute), _object_ride(rt, word, data))


_NOTHING = np.empty(0, np.uint8)  # a broadcast_object's bytes on the ranks that only receive


def _object_ride(rt: Runtime, word: int, data: np.ndarray) -> tuple | None:
    """What rides an object collective's lean cycle: this rank's header word and, where they
    fit, its pickled bytes (`gather_payload`)."""
    return (gather_payload(rt, word, data), ReduceOp.Sum) if rt.size > 1 and gather_fits(rt.size) else None


def allgather_object(obj: Any, name: str | None = None, process_set=None) -> list:
    """A list of every rank's picklable object (copies), in rank order. Sizes travel first,
    then the bytes (cloudpickle when installed, else pickle). If any rank cannot pickle its
    object, every rank raises FastringError naming those ranks and the reasons.

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> fastring.allgather_object({"rank": fastring.rank()})   # on 1 rank
        [{'rank': 0}]
    """
    rt = runtime_of(process_set)
    name = request_name(rt, "allgather_object", name)
    data, word = _serialize(obj)

    def execute(rt: Runtime, reduced: np.ndarray | None = None):
        # reduced: every rank's size, and every rank's bytes where they fit (gather_payload)
        words = (gather_counts(rt, word) if reduced is None else reduced[:rt.size]).tolist()
        lengths = [_length(w) for w in words]
        pieces = None if reduced is None else gathered_bytes(rt, reduced, lengths)
        if pieces is None:
            counts = np.array(lengths, np.int64)
            out = np.empty(sum(lengths), np.uint8)
            allgather_rows(rt, data, counts, out)
            bounds = byte_offsets(counts, 1)
            pieces = [out[bounds[r]:bounds[r + 1]] for r in range(rt.size)]
        failed = [r for r in range(rt.size) if words[r] < 0]
        if failed:
            raise FastringError("allgather_object: could not pickle the object on " + "; ".join(
                f"rank {r}: {pieces[r].tobytes().decode('utf-8', 'replace')}" for r in failed))
        return [pickle.loads(p) for p in pieces]

    return _run(*_parts(rt, "allgather_object", name, (), 0, execute), _object_ride(rt, word, data))
