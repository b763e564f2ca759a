# cython: language_level=3
"""The plain allreduce's plans (`_plan`: what a plain allreduce of a dtype, shape and op
sends and how it reduces, kept per signature) and the queued plain allreduce's lean path in
C (`plain_allreduce_async`).

A backward pass queues a burst of small gradients, one Request each. In Python that path
cost about 1.9 µs a tensor at np=1, a quarter of it in the dataclass `__init__`s of the
Request and its Entry (about 310 and 180 ns). Here their slots are filled directly
(`_Record`), and the plan lookup and the in-place checks run without a Python frame.
"""
import dataclasses
import types

cimport numpy as cnp
from cpython.ref cimport Py_INCREF, PyObject, PyTypeObject

from .._core import runtime as _runtime
from .._core.compression import Compression
from .._core.dtypes import SUPPORTED
from .._core.ops import OP_NAMES, ReduceOp
from .._core.work import Entry, work_of
from .._transport.handle import Handle
from ..engine.request import Request
from .process_sets import global_process_set, runtime_of
from .validation import entry

cnp.import_array()

cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    object PyType_GenericAlloc(PyTypeObject* kind, Py_ssize_t items)

cdef extern from "structmember.h":
    enum:
        T_OBJECT_EX  # a slot holding any object, AttributeError while unset: a dataclass's slots
        READONLY

# (kind, dtype, shapes, op, scale factors, compressor) -> the fields tuple, one object per
# signature: building it costs a microsecond a call, and the engine compares a request's
# fields with the cached ones, at once when they are the same object.
_FIELDS = {}
FIELDS_KEPT = 4096  # distinct signatures remembered (shapes vary: bounded, then rebuilt each call)
# (dtype, shape, op), and for a grouped allreduce (dtype, shapes, op, kind) -> (spec, fields,
# work) of a plain allreduce
cdef dict _PLANS = {}
PLANS_KEPT = 1024


def _fields(kind, spec, shapes, op, prescale, postscale, compressor):
    """What must be equal on every rank for an allreduce under one name (`kind`, a DtypeSpec,
    the shape or a group's shapes, a ReduceOp, the scale factors, a Compressor)."""
    key = (kind, spec.name, shapes, op, prescale, postscale, compressor.name)
    fields = _FIELDS.get(key)
    if fields is None:
        fields = (("collective", kind), ("dtype", spec.name), ("shape", shapes), ("op", OP_NAMES[op]),
                  ("prescale_factor", prescale), ("postscale_factor", postscale), ("device", "cpu"),
                  ("compression", compressor.name))
        # a NaN factor's key is never found again: not kept
        if len(_FIELDS) < FIELDS_KEPT and prescale == prescale and postscale == postscale:
            _FIELDS[key] = fields
    return fields


def _plain_plan(arr, op):
    """(spec, fields, work) of a plain (no compression, no scale factors) allreduce of numpy
    array `arr` that passes every check as it is, or None where the general path must look
    (an error, or an Average that is not a plain sum then division). One lookup per call on
    the hot paths."""
    plan = _PLANS.get((arr.dtype, arr.shape, op))
    return plan if plan is not None else _plan("allreduce", arr.dtype, arr.shape, op)


def _plan(kind, dtype, shape, op):
    """`_plain_plan` of a `kind` of allreduce (a grouped one: `shape` holds every shape)."""
    key = (dtype, shape, op) if kind == "allreduce" else (dtype, shape, op, kind)
    plan = _PLANS.get(key)
    if plan is None:
        spec = SUPPORTED.get(dtype)
        if spec is None or (op == ReduceOp.Average and (not spec.is_float or spec.is_16bit_float)):
            return None
        plan = (spec, _fields(kind, spec, shape, op, 1.0, 1.0, Compression.none), work_of(spec, op, 1.0, 1.0))
        if len(_PLANS) < PLANS_KEPT:
            _PLANS[key] = plan
    return plan

cdef enum:
    MAX_RECORD_FIELDS = 16


cdef class _Record:
    """Makes instances of a slots dataclass from the values of its leading fields `given`,
    in declaration order, the others taking their defaults, without running `__init__`.
    Refuses, when built, a class whose leading fields are not `given`, a later field with no
    plain default (none, or a default_factory), or a class that runs code in `__post_init__`
    or its own `__new__`, so that a change to the class fails at import, not in a cycle."""
    cdef PyTypeObject* kind
    cdef object cls  # keeps `kind` alive
    cdef tuple defaults  # the values of the fields after `given`
    cdef Py_ssize_t given, count
    cdef Py_ssize_t offsets[MAX_RECORD_FIELDS]

    def __init__(self, cls, tuple given):
        fields = dataclasses.fields(cls)
        declared = tuple([f.name for f in fields])
        if declared[:len(given)] != given:
            raise TypeError(f"{cls.__name__}'s fields are {declared}, not {given} first")
        for f in fields[len(given):]:
            if f.default is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}'s fields are {declared}: {f.name} has no plain default")
        if hasattr(cls, "__post_init__") or "__new__" in cls.__dict__:
            raise TypeError(f"{cls.__name__} cannot be made without its __init__")
        if len(declared) > MAX_RECORD_FIELDS:
            raise TypeError(f"{cls.__name__} has more than {MAX_RECORD_FIELDS} fields")
        cdef PyMemberDef* member
        for i, name in enumerate(declared):
            slot = cls.__dict__.get(name)
            if type(slot) is not types.MemberDescriptorType or slot.__objclass__ is not cls:
                raise TypeError(f"{cls.__name__}.{name} is not a slot")
            member = (<PyMemberDescrObject*><PyObject*>slot).d_member
            if member.type != T_OBJECT_EX or member.flags & READONLY:
                raise TypeError(f"{cls.__name__}.{name} is not a writable object slot")
            self.offsets[i] = member.offset
        self.cls, self.kind = cls, <PyTypeObject*>cls
        self.given, self.count = len(given), len(declared)
        self.defaults = tuple([f.default for f in fields[len(given):]])

    cdef object make(self, tuple values):
        if len(values) != self.given:
            raise TypeError(f"{self.cls.__name__} takes {self.given} values, got {len(values)}")
        record = PyType_GenericAlloc(self.kind, 0)  # zeroed: every slot empty
        cdef char* at = <char*><PyObject*>record
        cdef Py_ssize_t i
        cdef object value
        for i in range(self.count):
            value = values[i] if i < self.given else self.defaults[i - self.given]
            Py_INCREF(value)
            (<PyObject**>(at + self.offsets[i]))[0] = <PyObject*>value
        return record


cdef _Record _ENTRY = _Record(Entry, ("src", "work", "target", "result"))
cdef _Record _REQUEST = _Record(Request, ("kind", "name", "fields", "nbytes", "handle", "allreduce", "entries"))


def plain_allreduce_async(tensor, arr, op, name, out, process_set=None):
    """`allreduce_async` of arguments already known plain (a ReduceOp, a str name or None, no
    compression, no scale factors; `out` None or `tensor`) whose host memory `arr` views (None:
    not viewed): its Handle, or None, having queued nothing, where the general path must take
    the call (and raise any error). `entry` still decides where a tensor that is not reduced
    in place is read and written. The api's and the framework modules' lean path.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> a = np.ones(3)
        >>> plain_allreduce_async(a, a, fastring.Sum, "lean.doc", a).wait() is a   # on 1 rank
        True
    """
    if not isinstance(arr, cnp.ndarray):  # None: not viewed
        return None
    cdef cnp.ndarray array = <cnp.ndarray>arr
    plan = _plain_plan(arr, op)
    if plan is None:
        return None
    rt = (_runtime.runtime() if process_set is None or process_set is global_process_set
          else runtime_of(process_set))
    engine = rt.engine
    if not name:
        name = engine.auto_name("allreduce")  # taken first, as the general path does
    if out is tensor and cnp.PyArray_IS_C_CONTIGUOUS(array) and cnp.PyArray_ISWRITEABLE(array):
        work = _ENTRY.make((arr, arr, arr, out))  # in place: nothing else to check
    else:
        work = entry(tensor, arr, out)
    return engine.submit(_REQUEST.make(("allreduce", name, plan[1], cnp.PyArray_NBYTES(array),
                                        Handle(engine, name), plan[2], [work])))
