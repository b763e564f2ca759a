"""The collectives besides allreduce (API.md, core module): allgather, broadcast, alltoall,
reducescatter, barrier and the object forms.

Each is one Request for the engine, built by one `_<op>_request` function that both the
synchronous form (`engine.run`) and the `_async` form (`engine.submit`) use. Arguments are
checked at call time (ValueError/TypeError on the calling rank); what only the ranks together
can check (dtype, trailing dimensions, root rank, op, scale factors) goes into the request's
fields, which the engine compares across ranks before anything moves. The data movement is
fastring's own, in the Cython transport with the GIL released:

- allgather: dim-0 sizes are gathered first, then the ring (`ring_allgather`) circulates the
  rows: (N-1)/N of the result's bytes cross each link once.
- broadcast: when every rank is on one host, large messages are copied straight between
  the ranks' memories (`single_copy_broadcast`): the root writes the leading part of the
  bytes into each rank while every rank reads the rest, so the root copies too instead of
  waiting. Otherwise a binomial tree for small messages and on two ranks; above that a
  chain, pipelined in segments, whose time hardly grows with N.
- alltoall: the row counts are exchanged first, then N-1 pairwise exchange steps.
- reducescatter: a ring reduce-scatter that receives partial results straight into scratch
  and reduces this rank's input into them, so the input is neither copied nor modified and
  the last step lands in the result.
"""
from __future__ import annotations

import functools
import itertools
import math
import numbers
import os
import pickle
from typing import Any, Callable

import numpy as np

from . import _pool, kernels
from ._config import (BROADCAST_CHAIN_BYTES, BROADCAST_SEGMENT_BYTES, BROADCAST_SINGLE_COPY_BYTES,
                      RING_SEGMENT_BYTES)
from ._dtypes import DtypeSpec, spec_of
from ._errors import FastringError
from ._ops import KERNEL_OP, ReduceOp, as_reduce_op
from ._runtime import Runtime, log, runtime
from ._tensor import as_array, like
from ._transport import (array_address, chain_broadcast, is_c_contiguous, pairwise_alltoall,
                         ring_reduce_scatter_into, single_copy_broadcast, tree_broadcast)
from .algorithms import chunk_offsets
from .api import _check_op_for_dtype, _entry, _factor, _name
from .engine import AllreduceWork, Engine, Handle, Request, _finalizer, _predivides, _prescale

try:
    import cloudpickle as _pickler  # lambdas, closures, classes defined in __main__
except ImportError:  # pragma: no cover - cloudpickle is a dependency, pickle the fallback
    _pickler = pickle


# ----------------------------------------------------------------- shared pieces
def _request(rt: Runtime, kind: str, name: str | None, fields: tuple, nbytes: int,
             execute: Callable[[Runtime], Any]) -> tuple[Engine, Request]:
    """The Request of one collective; call it last, after every local check has passed, so
    that the automatic name (counted per kind) advances alike on every rank."""
    engine = rt.engine
    name = name or engine.auto_name(kind)
    fields = (("collective", kind),) + fields
    return engine, Request(kind, name, fields, nbytes, Handle(engine, name), execute=execute)


def _rows_array(tensor, kind: str) -> tuple[np.ndarray, DtypeSpec]:
    """The tensor of a collective that splits or concatenates dimension 0."""
    arr = as_array(tensor)
    spec = spec_of(arr.dtype)
    if arr.ndim == 0:
        raise ValueError(f"{kind} needs a tensor with at least one dimension (it works on "
                         "dimension 0); got a 0-d tensor")
    return arr, spec


def _row_bytes(arr: np.ndarray) -> int:
    return arr.dtype.itemsize * math.prod(arr.shape[1:])


def _offsets(counts: np.ndarray, unit: int) -> np.ndarray:
    """Byte offsets of consecutive blocks of counts[i] units of `unit` bytes."""
    # Python ints: for a few ranks, NumPy's per-call overhead would dominate
    return np.array([0, *itertools.accumulate(c * unit for c in counts.tolist())], np.int64)


@functools.lru_cache(maxsize=None)
def _one_word_each(size: int) -> np.ndarray:
    """Offsets for exchanging one int64 with every rank (read-only, shared)."""
    offsets = _offsets(np.ones(size, np.int64), 8)
    offsets.flags.writeable = False
    return offsets


def _root(root_rank, size: int) -> int:
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral):
        raise TypeError(f"root_rank must be an integer, got {type(root_rank).__name__}")
    root = int(root_rank)
    if not 0 <= root < size:
        raise ValueError(f"root_rank {root} is outside [0, {size}): there are {size} ranks")
    return root


def _gather_counts(rt: Runtime, value: int) -> np.ndarray:
    """Every rank's `value`, in rank order (a ring allgather of one int64 each)."""
    counts = np.zeros(rt.size, np.int64)
    counts[rt.rank] = value
    if rt.size > 1:
        rt.transport.ring_allgather(array_address(counts), _one_word_each(rt.size))
    return counts


def _allgather_rows(rt: Runtime, src: np.ndarray, counts: np.ndarray, out: np.ndarray) -> None:
    """Concatenate every rank's rows into `out` (C-contiguous; counts[r] rows from rank r)."""
    offsets = _offsets(counts, _row_bytes(out))
    start = sum(counts.tolist()[:rt.rank])
    np.copyto(out[start:start + src.shape[0]], src)
    if rt.size > 1 and offsets[-1]:
        # The others read this rank's rows from its input, not from `out`, which stays
        # quick to write the next time it is handed out (see Transport.ring_allgather).
        own = array_address(src) if src.size and is_c_contiguous(src) else 0
        rt.transport.ring_allgather(array_address(out), offsets, own=own)


def _broadcast_bytes(rt: Runtime, buf: np.ndarray, root: int) -> None:
    """Broadcast a C-contiguous array's bytes from `root` into the same array elsewhere."""
    if rt.size == 1 or buf.nbytes == 0:
        return
    if rt.transport.single_copy and buf.nbytes >= BROADCAST_SINGLE_COPY_BYTES:
        failed = single_copy_broadcast(rt.transport, array_address(buf), buf.nbytes, root)
        if failed:
            log.warning("single-copy broadcast failed (%s); it was sent as MPI messages "
                        "instead, as every broadcast will be from now on", os.strerror(failed))
    elif rt.size > 2 and buf.nbytes > BROADCAST_CHAIN_BYTES:
        chain_broadcast(rt.transport, array_address(buf), buf.nbytes, root, BROADCAST_SEGMENT_BYTES)
    else:
        tree_broadcast(rt.transport, array_address(buf), buf.nbytes, root)


# ----------------------------------------------------------------- allgather
def _allgather_request(tensor, name) -> tuple[Engine, Request]:
    rt = runtime()
    name = _name(name)
    arr, spec = _rows_array(tensor, "allgather")

    def execute(rt: Runtime):
        counts = _gather_counts(rt, arr.shape[0])
        out = _pool.empty((int(counts.sum()),) + arr.shape[1:], arr.dtype)
        _allgather_rows(rt, arr, counts, out)
        return like(tensor, out)

    fields = (("dtype", spec.name), ("trailing_shape", arr.shape[1:]), ("device", "cpu"))
    return _request(rt, "allgather", name, fields, arr.nbytes, execute)


def allgather_async(tensor, *, name: str | None = None) -> Handle:
    """Start an allgather and return its Handle; `handle.wait()` gives what `allgather` would.

    The tensor must not be modified until the handle completes.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.allgather_async(np.arange(2), name="ids").wait()   # on 1 rank
        array([0, 1])
    """
    engine, request = _allgather_request(tensor, name)
    return engine.submit(request)


def allgather(tensor, *, name: str | None = None):
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
    engine, request = _allgather_request(tensor, name)
    return engine.run(request)


# ----------------------------------------------------------------- broadcast
def _broadcast_request(tensor, root_rank, name, out) -> tuple[Engine, Request]:
    rt = runtime()
    name = _name(name)
    root = _root(root_rank, rt.size)
    arr = as_array(tensor)
    spec = spec_of(arr.dtype)
    e = _entry(tensor, arr, out)

    def execute(rt: Runtime):
        if rt.rank == root and e.work is not e.src and is_c_contiguous(e.src):
            # Sent from the input, so that the others' reads leave the result's cache lines
            # to the root alone (see Transport.ring_allgather).
            _broadcast_bytes(rt, e.src, root)
            np.copyto(e.work, e.src)
        else:
            if rt.rank == root and e.work is not e.src:
                np.copyto(e.work, e.src)
            _broadcast_bytes(rt, e.work, root)
        if e.target is not e.work:
            np.copyto(e.target, e.work)
        return e.result

    fields = (("dtype", spec.name), ("shape", arr.shape), ("root_rank", root), ("device", "cpu"))
    return _request(rt, "broadcast", name, fields, arr.nbytes, execute)


def broadcast_async(tensor, root_rank: int, *, name: str | None = None, out=None) -> Handle:
    """Start a broadcast and return its Handle; `handle.wait()` gives what `broadcast` would.

    The tensor (and `out`) must not be used until the handle completes.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.broadcast_async(np.arange(3.0), 0, name="w").wait()
        array([0., 1., 2.])
    """
    engine, request = _broadcast_request(tensor, root_rank, name, out)
    return engine.submit(request)


def broadcast(tensor, root_rank: int, *, name: str | None = None, out=None):
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
    engine, request = _broadcast_request(tensor, root_rank, name, out)
    return engine.run(request)


# ----------------------------------------------------------------- alltoall
def _send_rows(splits, dim0: int, size: int) -> np.ndarray:
    """Rows sent to each rank, from `splits` or the equal split of dimension 0."""
    if splits is None:
        if dim0 % size:
            raise ValueError(f"alltoall without splits divides dimension 0 equally, but {dim0} "
                             f"rows do not divide among {size} ranks; pass splits")
        return np.full(size, dim0 // size, np.int64)
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


def _alltoall_request(tensor, splits, name) -> tuple[Engine, Request]:
    rt = runtime()
    name = _name(name)
    arr, spec = _rows_array(tensor, "alltoall")
    send_rows = _send_rows(splits, arr.shape[0], rt.size)

    def execute(rt: Runtime):
        recv_rows = np.empty(rt.size, np.int64)
        unit = _one_word_each(rt.size)
        pairwise_alltoall(rt.transport, array_address(send_rows), unit, array_address(recv_rows), unit)
        out = _pool.empty((int(recv_rows.sum()),) + arr.shape[1:], arr.dtype)
        row_bytes = _row_bytes(arr)
        if row_bytes:  # equal on every rank: the trailing shape is negotiated
            src = arr if is_c_contiguous(arr) else np.ascontiguousarray(arr[:int(send_rows.sum())])
            pairwise_alltoall(rt.transport, array_address(src), _offsets(send_rows, row_bytes),
                              array_address(out), _offsets(recv_rows, row_bytes))
        result = like(tensor, out)
        if splits is None:
            return result
        return result, like(tensor, recv_rows.astype(np.int32))

    fields = (("dtype", spec.name), ("trailing_shape", arr.shape[1:]), ("device", "cpu"))
    return _request(rt, "alltoall", name, fields, arr.nbytes, execute)


def alltoall_async(tensor, splits=None, *, name: str | None = None) -> Handle:
    """Start an alltoall and return its Handle; `handle.wait()` gives what `alltoall` would.

    The tensor must not be modified until the handle completes.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> out, got = fastring.alltoall_async(np.arange(3), splits=[2]).wait()   # on 1 rank
        >>> out, got
        (array([0, 1]), array([2], dtype=int32))
    """
    engine, request = _alltoall_request(tensor, splits, name)
    return engine.submit(request)


def alltoall(tensor, splits=None, *, name: str | None = None):
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
    engine, request = _alltoall_request(tensor, splits, name)
    return engine.run(request)


# ----------------------------------------------------------------- reducescatter
def _reducescatter_request(tensor, op, name, prescale_factor, postscale_factor) -> tuple[Engine, Request]:
    rt = runtime()
    op = as_reduce_op(op)
    prescale = _factor(prescale_factor, "prescale_factor")
    postscale = _factor(postscale_factor, "postscale_factor")
    name = _name(name)
    arr, spec = _rows_array(tensor, "reducescatter")
    _check_op_for_dtype(op, spec)
    work = AllreduceWork(spec, op, prescale, postscale, [], False)

    def execute(rt: Runtime):
        itemsize = spec.dtype.itemsize
        offsets = chunk_offsets(arr.shape[0], rt.size, _row_bytes(arr))
        rows = chunk_offsets(arr.shape[0], rt.size, 1)
        out = _pool.empty((int(rows[rt.rank + 1] - rows[rt.rank]),) + arr.shape[1:], arr.dtype)
        largest = int(offsets[1] - offsets[0])  # chunk 0 is never shorter than another
        segment = max(itemsize, RING_SEGMENT_BYTES - RING_SEGMENT_BYTES % itemsize)
        # Scratch: two chunks for the ring, then (when the input must be scaled first) a copy
        # of the input.
        scaled_at = -(-2 * largest // 64) * 64
        need_copy = prescale != 1.0 or _predivides(work, rt.size)
        scratch = rt.scratch(scaled_at + (arr.nbytes if need_copy else 0))
        src = arr
        if need_copy:
            src = scratch[scaled_at:scaled_at + arr.nbytes].view(arr.dtype).reshape(arr.shape)
            np.copyto(src, arr)
            _prescale(work, src.reshape(-1), rt.size)
        elif not is_c_contiguous(arr):
            src = np.ascontiguousarray(arr)
        if offsets[-1]:
            ring_reduce_scatter_into(rt.transport, array_address(src), offsets, array_address(out),
                                     array_address(scratch), segment,
                                     kernels.reduce_cfunc(KERNEL_OP[op], spec.dtype), itemsize)
        finalize = _finalizer(work, rt.size)
        if finalize is not None:
            finalize(out.reshape(-1))
        return like(tensor, out)

    fields = (("dtype", spec.name), ("shape", arr.shape), ("op", op.name),
              ("prescale_factor", prescale), ("postscale_factor", postscale), ("device", "cpu"))
    return _request(rt, "reducescatter", name, fields, arr.nbytes, execute)


def reducescatter_async(tensor, op: ReduceOp = ReduceOp.Average, *, name: str | None = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start a reducescatter and return its Handle; `handle.wait()` gives what `reducescatter`
    would. The tensor must not be modified until the handle completes.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.reducescatter_async(np.ones(4), op=fastring.Sum).wait()   # on 1 rank
        array([1., 1., 1., 1.])
    """
    engine, request = _reducescatter_request(tensor, op, name, prescale_factor, postscale_factor)
    return engine.submit(request)


def reducescatter(tensor, op: ReduceOp = ReduceOp.Average, *, name: str | None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0):
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
    engine, request = _reducescatter_request(tensor, op, name, prescale_factor, postscale_factor)
    return engine.run(request)


# ----------------------------------------------------------------- barrier and objects
def barrier() -> None:
    """Return only once every rank has called barrier (after the collectives each submitted
    before it have been negotiated).

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> fastring.barrier()
    """
    rt = runtime()
    engine, request = _request(rt, "barrier", None, (), 0, lambda r: r.transport.barrier())
    engine.run(request)


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


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """Every rank receives a copy of `root_rank`'s picklable object (cloudpickle when it is
    installed, else pickle); the root gets `obj` itself. Its size travels first, then its
    bytes. If the root cannot pickle it, every rank raises FastringError with the reason.

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> fastring.broadcast_object({"epoch": 3} if fastring.rank() == 0 else None)
        {'epoch': 3}
    """
    rt = runtime()
    name = _name(name)
    root = _root(root_rank, rt.size)

    def execute(rt: Runtime):
        header = np.zeros(1, np.int64)
        data = None
        if rt.rank == root:
            data, header[0] = _serialize(obj)
        _broadcast_bytes(rt, header, root)
        word = int(header[0])
        if rt.rank != root:
            data = np.empty(_length(word), np.uint8)
        _broadcast_bytes(rt, data, root)
        if word < 0:
            raise FastringError(f"broadcast_object: rank {root} could not pickle the object: "
                                f"{data.tobytes().decode('utf-8', 'replace')}")
        return obj if rt.rank == root else pickle.loads(data)

    engine, request = _request(rt, "broadcast_object", name, (("root_rank", root),), 0, execute)
    return engine.run(request)


def allgather_object(obj: Any, name: str | None = None) -> list:
    """A list of every rank's picklable object (copies), in rank order. Sizes travel first,
    then the bytes (cloudpickle when installed, else pickle). If any rank cannot pickle its
    object, every rank raises FastringError naming those ranks and the reasons.

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> fastring.allgather_object({"rank": fastring.rank()})   # on 1 rank
        [{'rank': 0}]
    """
    rt = runtime()
    name = _name(name)

    def execute(rt: Runtime):
        data, word = _serialize(obj)
        words = _gather_counts(rt, word)
        lengths = np.array([_length(int(w)) for w in words], np.int64)
        out = np.empty(int(lengths.sum()), np.uint8)
        _allgather_rows(rt, data, lengths, out)
        bounds = _offsets(lengths, 1)
        pieces = [out[bounds[r]:bounds[r + 1]] for r in range(rt.size)]
        failed = [r for r in range(rt.size) if words[r] < 0]
        if failed:
            raise FastringError("allgather_object: could not pickle the object on " + "; ".join(
                f"rank {r}: {pieces[r].tobytes().decode('utf-8', 'replace')}" for r in failed))
        return [pickle.loads(p) for p in pieces]

    engine, request = _request(rt, "allgather_object", name, (), 0, execute)
    return engine.run(request)
