"""The framework-agnostic allreduce, grouped allreduce, synchronize, poll, join and timeline
(README.md, "The API in brief"). Each builds a Request for the engine; the synchronous form is
the asynchronous one plus a wait."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import device
from ._lean import _fields, _plain_plan, _plan
from ._lean import plain_allreduce_async as _plain_allreduce_async
from .._core import pool as _pool
from .._core.compression import Compression, Compressor, as_compressor
from .._core.device import is_device_tensor
from .._core.dtypes import SUPPORTED, spec_of
from .._core.ops import ReduceOp, as_reduce_op
from .._core.runtime import Runtime, runtime
from .._core.tensor import as_array, host_view, like
from .._core.work import Entry, work_of
from .._transport import group_of
from ..algorithms import InCycle
from ..engine import Handle, Request
from .process_sets import global_rank, runtime_of
from .validation import check_op_for_dtype, entry, factor, is_automatic, request_name

Average, Sum, Min, Max, Product = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Min,
                                   ReduceOp.Max, ReduceOp.Product)


def _grouped_entries(tensors, arrays: list[np.ndarray], dtype) -> tuple[list[Entry], np.ndarray]:
    """A group's results are views into one block, which the engine reduces in place: no
    fusion-buffer copy and no unpacking."""
    block = _pool.empty((sum([a.size for a in arrays]),), dtype)
    entries, offset = [], 0
    for t, a in zip(tensors, arrays):
        end = offset + a.size
        view = block[offset:end] if a.ndim == 1 else block[offset:end].reshape(a.shape)
        entries.append(Entry(a, view, view, view if type(t) is np.ndarray else like(t, view)))
        offset = end
    return entries, block


def _plain_args(op, name, compression, prescale_factor, postscale_factor) -> bool:
    """Whether a call's arguments are those of a plain allreduce (a ReduceOp, no compression,
    no scale factors) that passes their checks as they are: the lean paths may take it."""
    return (type(op) is ReduceOp and compression is Compression.none and (name is None or type(name) is str)
            and type(prescale_factor) is float and prescale_factor == 1.0
            and type(postscale_factor) is float and postscale_factor == 1.0)


def _lone_allreduce(arr: np.ndarray, op: ReduceOp, name: str | None, out: np.ndarray | None, process_set=None):
    """The lean path of a plain (no compression, no scale factors) allreduce of host array
    `arr` (a numpy array, or a framework tensor's memory viewed as one) into `out` (None: a
    new array): the engine runs it without building a Request when nothing else is queued.
    Returns None where the general path must take the call (it also raises any errors)."""
    plan = _plain_plan(arr, op)
    if plan is None:
        return None
    rt = runtime() if process_set is None else runtime_of(process_set)
    return rt.engine.lone_allreduce(arr, plan[0], op, name, plan[1], out, _lone_request)


def _lone_request(rt: Runtime, arr: np.ndarray, out: np.ndarray | None, op: ReduceOp, name: str) -> Request:
    """The Request of a lean allreduce the ranks disagreed on (`Engine.lone_allreduce`); a
    module function, not a closure per call, which would cost a lean call about 7% of its time."""
    return _allreduce_request(rt, "allreduce", [arr], [out], op, name, Compression.none, 1.0, 1.0,
                              grouped=False)[1]


def _lone_grouped(tensors: list, op: ReduceOp, name: str | None, process_set=None) -> list | None:
    """The lean path of a plain grouped allreduce of numpy arrays (`Engine.lone_grouped`: no
    Request, no entry per tensor, the arrays reduced where they lie). Returns None where the
    general path must take the call: other tensor types, mixed dtypes, a group small enough
    to ride its negotiation cycle, anything the checks must look at."""
    group = group_of(tensors)
    if group is None or InCycle.fits(group[2]):
        return None
    dtype, shapes, nbytes = group
    plan = _plan("grouped_allreduce", dtype, shapes, op)
    if plan is None:
        return None
    rt = runtime_of(process_set)

    def request(assigned: str) -> Request:
        return _allreduce_request(rt, "grouped_allreduce", tensors, [None] * len(tensors), op, assigned,
                                  Compression.none, 1.0, 1.0, grouped=True)[1]
    return rt.engine.lone_grouped(tensors, plan[0], op, name, plan[1], nbytes, request)


def _host_view(tensor) -> np.ndarray | None:
    """A host tensor's memory as a numpy array for the lean path; None where the general path
    must take it (a device tensor, or one it cannot read, which the general path explains)."""
    view = host_view(tensor)
    if view is not None:
        return view
    try:
        return None if is_device_tensor(tensor) else as_array(tensor)
    except (TypeError, NotImplementedError):
        return None


def _allreduce_request(rt: Runtime, kind: str, tensors: Sequence, outs: Sequence, op, name, compression,
                       prescale_factor, postscale_factor, grouped: bool) -> tuple:
    # the common arguments pass the checks inline: a call each costs per tensor
    name = name if type(name) is str else request_name(rt, kind, name)
    compressor = compression if compression is Compression.none else as_compressor(compression)
    op = op if type(op) is ReduceOp else as_reduce_op(op)
    prescale = prescale_factor if type(prescale_factor) is float else factor(prescale_factor, "prescale_factor")
    postscale = postscale_factor if type(postscale_factor) is float else factor(postscale_factor, "postscale_factor")
    first = tensors[0] if type(tensors[0]) is np.ndarray else host_view(tensors[0])
    if first is None and is_device_tensor(tensors[0]):
        return device.allreduce_request(rt, kind, tensors, outs, op, name, compressor, prescale,
                                        postscale, grouped)
    plan = None
    if grouped:
        arrays = [t if type(t) is np.ndarray else as_array(t) for t in tensors]
        spec = spec_of(arrays[0].dtype)
        dtypes = {a.dtype for a in arrays}
        if len(dtypes) > 1:
            raise TypeError(f"grouped tensors must share one dtype, got {', '.join(sorted(map(str, dtypes)))}")
        shapes = tuple([a.shape for a in arrays])
        nbytes = sum([a.nbytes for a in arrays])
    else:
        arrays = [first if first is not None else as_array(tensors[0])]
        if compressor is Compression.none and prescale == 1.0 and postscale == 1.0:
            plan = _plain_plan(arrays[0], op)  # then every check below passes as it is
        spec = plan[0] if plan is not None else SUPPORTED.get(arrays[0].dtype) or spec_of(arrays[0].dtype)
        shapes = arrays[0].shape
        nbytes = arrays[0].nbytes
    if plan is None:
        if not spec.is_float:
            check_op_for_dtype(op, spec, prescale, postscale)
            compressor = Compression.none  # integers and bools travel as they are
        if compressor.error_feedback and is_automatic(name):
            raise ValueError(f"{compressor!r} keeps a residual per tensor name; give the tensor a name")
    if grouped:
        entries, block = _grouped_entries(tensors, arrays, spec.dtype)
    else:
        entries, block = [entry(tensors[0], arrays[0], outs[0])], None
    engine = rt.engine
    if plan is not None:
        fields, work = plan[1], plan[2]
    else:
        fields = _fields(kind, spec, shapes, op, prescale, postscale, compressor)
        work = work_of(spec, op, prescale, postscale, compressor)
    return engine, Request(kind, name, fields, nbytes, Handle(engine, name), work, entries, grouped, block)


def allreduce_async(tensor, op: ReduceOp = ReduceOp.Average, *, name: str | None = None,
                    compression: Compressor = Compression.none, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, out=None, process_set=None) -> Handle:
    """Start an allreduce and return its Handle; `handle.wait()` gives what `allreduce` would.

    The tensor (and `out`) must not be modified until the handle completes.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> h = fastring.allreduce_async(np.ones(3), op=fastring.Sum, name="w")
        >>> fastring.synchronize(h)
        array([1., 1., 1.])
    """
    if (out is None or out is tensor) and _plain_args(op, name, compression, prescale_factor, postscale_factor):
        handle = _plain_allreduce_async(tensor, tensor if type(tensor) is np.ndarray else host_view(tensor),
                                       op, name, out, process_set)
        if handle is not None:
            return handle
    engine, request = _allreduce_request(runtime_of(process_set), "allreduce", [tensor], [out], op, name,
                                         compression, prescale_factor, postscale_factor, grouped=False)
    return engine.submit(request)


def allreduce(tensor, op: ReduceOp = ReduceOp.Average, *, name: str | None = None,
              compression: Compressor = Compression.none, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, out=None, process_set=None):
    """Reduce `tensor` over all ranks (of `process_set`, default every rank); every rank receives the bitwise-identical result.

    The result has the caller's framework type, dtype and shape. `out=` writes into the given
    tensor (in place when `out is tensor`); the input is otherwise left untouched.
    `prescale_factor` multiplies each rank's input before the reduction, `postscale_factor`
    the result after it. Average on float16/bfloat16 divides before summing, so that values
    near the format's maximum do not overflow. A mismatch across ranks under one name (shape,
    dtype, op, scale factors) raises FastringError on every rank and leaves tensors untouched.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.allreduce(np.ones(4), op=fastring.Sum)   # on 1 rank
        array([1., 1., 1., 1.])
    """
    if _plain_args(op, name, compression, prescale_factor, postscale_factor):
        # numpy arrays, and host tensors of any framework viewed as numpy arrays
        arr = tensor if type(tensor) is np.ndarray else _host_view(tensor)
        dst = out if out is None or type(out) is np.ndarray else arr if out is tensor else _host_view(out)
        if (arr is not None and (out is None or dst is not None)
                and (out is None or out is tensor or not np.may_share_memory(dst, arr))):
            result = _lone_allreduce(arr, op, name, dst if out is not tensor else arr, process_set)
            if result is not None:
                return result if arr is tensor else (out if out is not None else like(tensor, result))
    engine, request = _allreduce_request(runtime_of(process_set), "allreduce", [tensor], [out], op, name,
                                         compression, prescale_factor, postscale_factor, grouped=False)
    return engine.run(request)


def grouped_allreduce_async(tensors: Sequence, op: ReduceOp = ReduceOp.Average, *,
                            name: str | None = None, compression: Compressor = Compression.none,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set=None) -> Handle:
    """Start one fused allreduce of a list of tensors (one dtype); the handle returns a list.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.grouped_allreduce_async([np.ones(2), np.zeros(3)], op=fastring.Sum).wait()
        [array([1., 1.]), array([0., 0., 0.])]
    """
    tensors = _tensor_list(tensors)
    engine, request = _allreduce_request(runtime_of(process_set), "grouped_allreduce", tensors,
                                         [None] * len(tensors), op, name, compression, prescale_factor,
                                         postscale_factor, grouped=True)
    return engine.submit(request)


def grouped_allreduce(tensors: Sequence, op: ReduceOp = ReduceOp.Average, *, name: str | None = None,
                      compression: Compressor = Compression.none, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set=None) -> list:
    """Allreduce a list of tensors (one dtype) as one fused operation; returns a list.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.grouped_allreduce([np.ones(2), np.ones(1)], op=fastring.Sum)
        [array([1., 1.]), array([1.])]
    """
    tensors = _tensor_list(tensors)
    if _plain_args(op, name, compression, prescale_factor, postscale_factor):
        results = _lone_grouped(tensors, op, name, process_set)
        if results is not None:
            return results
    engine, request = _allreduce_request(runtime_of(process_set), "grouped_allreduce", tensors,
                                         [None] * len(tensors), op, name, compression, prescale_factor,
                                         postscale_factor, grouped=True)
    return engine.run(request)


def _tensor_list(tensors) -> list:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list or tuple, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError("tensors must not be empty")
    return list(tensors)


def synchronize(handle: Handle):
    """Wait for an asynchronous collective and return its result (or raise its error).

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> fastring.synchronize(fastring.allreduce_async(np.ones(1), op=fastring.Sum))
        array([1.])
    """
    if not isinstance(handle, Handle):
        raise TypeError(f"expected a fastring Handle, got {type(handle).__name__}")
    return handle.wait()


def poll(handle: Handle) -> bool:
    """True when the collective behind `handle` has finished; never blocks.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> h = fastring.allreduce_async(np.ones(1)); h.wait() is not None and fastring.poll(h)
        True
    """
    if not isinstance(handle, Handle):
        raise TypeError(f"expected a fastring Handle, got {type(handle).__name__}")
    return handle.done()


def join(process_set=None) -> int:
    """Declare that this rank has no more data: until every rank (of `process_set`) has
    called join, it takes part in the other ranks' allreduces with zeros (Average still
    divides by the full size). Returns the (global) rank that joined last.

    Example:
        >>> import fastring
        >>> fastring.init(); fastring.join()   # on 1 rank
        0
    """
    rt = runtime_of(process_set)
    return global_rank(rt, rt.engine.join())


def start_timeline(path: str) -> None:
    """Start recording a Chrome-trace timeline of every collective's phases into `path`
    (written by rank 0 at `stop_timeline` or shutdown). Call it on every rank.

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> fastring.start_timeline("/tmp/fastring-timeline.json"); fastring.stop_timeline()
    """
    runtime_of(None).engine.timeline.start(path)


def stop_timeline() -> None:
    """Stop recording and write the timeline file. Collective: call it on every rank.

    Example:
        >>> import fastring
        >>> fastring.init(); fastring.stop_timeline()   # nothing recorded: writes nothing
    """
    runtime_of(None).engine.timeline.stop()
