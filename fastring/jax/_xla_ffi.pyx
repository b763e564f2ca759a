# cython: language_level=3, boundscheck=False, wraparound=False
"""fastring's XLA FFI handler: one custom-call target, `fastring_collective`, that runs a
collective of the core from inside a compiled JAX program.

XLA calls the handler through the FFI C API (xla_ffi.h beside this file declares the part of it
used here). The handler answers XLA's metadata query (which API version it was built for),
and on execution takes the GIL and calls the Python function given to `set_dispatch` as
`dispatch(key, inputs, outputs)`: `key` is the call's `key` string attribute (what to run),
`inputs` and `outputs` are tuples of numpy arrays over XLA's own buffers, no copy (inputs
read-only; token operands left out). An exception raised there becomes the custom call's
error, its type and message intact, which the jitted call's caller then sees.

Example:
    >>> from fastring.jax import _xla_ffi
    >>> type(_xla_ffi.handler_capsule()).__name__
    'PyCapsule'
"""
from cpython.pycapsule cimport PyCapsule_New
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint32_t
from libc.string cimport memcmp

cimport numpy as cnp
import numpy as np
import ml_dtypes

cnp.import_array()

cdef extern from "xla_ffi.h" nogil:
    int FASTRING_FFI_API_MAJOR
    int FASTRING_FFI_API_MINOR
    size_t FASTRING_FFI_CALL_FRAME_SIZE
    size_t FASTRING_FFI_BUFFER_SIZE
    size_t FASTRING_FFI_API_SIZE
    size_t FASTRING_FFI_METADATA_SIZE
    size_t FASTRING_FFI_METADATA_WITH_STATE_SIZE
    size_t FASTRING_FFI_METADATA_EXTENSION_SIZE
    size_t FASTRING_FFI_ERROR_CREATE_ARGS_SIZE
    size_t FASTRING_FFI_API_VERSION_SIZE

    ctypedef enum XLA_FFI_Extension_Type:
        XLA_FFI_Extension_Metadata

    ctypedef struct XLA_FFI_Extension_Base:
        size_t struct_size
        XLA_FFI_Extension_Type type
        XLA_FFI_Extension_Base* next

    ctypedef struct XLA_FFI_Api_Version:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        int major_version
        int minor_version

    ctypedef struct XLA_FFI_Error:
        pass

    ctypedef enum XLA_FFI_Error_Code:
        XLA_FFI_Error_Code_OK
        XLA_FFI_Error_Code_CANCELLED
        XLA_FFI_Error_Code_UNKNOWN
        XLA_FFI_Error_Code_INVALID_ARGUMENT
        XLA_FFI_Error_Code_FAILED_PRECONDITION
        XLA_FFI_Error_Code_INTERNAL

    ctypedef struct XLA_FFI_Error_Create_Args:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        const char* message
        XLA_FFI_Error_Code errc

    ctypedef XLA_FFI_Error* (*XLA_FFI_Error_Create_Ptr)(XLA_FFI_Error_Create_Args*) noexcept nogil

    ctypedef enum XLA_FFI_DataType:
        XLA_FFI_DataType_PRED
        XLA_FFI_DataType_S8
        XLA_FFI_DataType_S16
        XLA_FFI_DataType_S32
        XLA_FFI_DataType_S64
        XLA_FFI_DataType_U8
        XLA_FFI_DataType_U16
        XLA_FFI_DataType_U32
        XLA_FFI_DataType_U64
        XLA_FFI_DataType_F16
        XLA_FFI_DataType_F32
        XLA_FFI_DataType_F64
        XLA_FFI_DataType_C64
        XLA_FFI_DataType_BF16
        XLA_FFI_DataType_TOKEN
        XLA_FFI_DataType_C128

    ctypedef struct XLA_FFI_Buffer:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        XLA_FFI_DataType dtype
        void* data
        int64_t rank
        int64_t* dims

    ctypedef enum XLA_FFI_ArgType:
        XLA_FFI_ArgType_BUFFER
    ctypedef enum XLA_FFI_RetType:
        XLA_FFI_RetType_BUFFER
    ctypedef enum XLA_FFI_AttrType:
        XLA_FFI_AttrType_ARRAY
        XLA_FFI_AttrType_DICTIONARY
        XLA_FFI_AttrType_SCALAR
        XLA_FFI_AttrType_STRING

    ctypedef struct XLA_FFI_ByteSpan:
        const char* ptr
        size_t len

    ctypedef struct XLA_FFI_TypeId:
        int64_t type_id

    ctypedef enum XLA_FFI_ExecutionStage:
        XLA_FFI_ExecutionStage_INSTANTIATE
        XLA_FFI_ExecutionStage_PREPARE
        XLA_FFI_ExecutionStage_INITIALIZE
        XLA_FFI_ExecutionStage_EXECUTE

    ctypedef struct XLA_FFI_Args:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        int64_t size
        XLA_FFI_ArgType* types
        void** args

    ctypedef struct XLA_FFI_Rets:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        int64_t size
        XLA_FFI_RetType* types
        void** rets

    ctypedef struct XLA_FFI_Attrs:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        int64_t size
        XLA_FFI_AttrType* types
        XLA_FFI_ByteSpan** names
        void** attrs

    ctypedef struct XLA_FFI_Api:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        XLA_FFI_Api_Version api_version
        const void* internal_api
        XLA_FFI_Error_Create_Ptr XLA_FFI_Error_Create

    ctypedef struct XLA_FFI_CallFrame:
        size_t struct_size
        XLA_FFI_Extension_Base* extension_start
        const XLA_FFI_Api* api
        void* ctx
        XLA_FFI_ExecutionStage stage
        XLA_FFI_Args args
        XLA_FFI_Rets rets
        XLA_FFI_Attrs attrs
        void* future

    ctypedef uint32_t XLA_FFI_Handler_Traits

    ctypedef struct XLA_FFI_Metadata:
        size_t struct_size
        XLA_FFI_Api_Version api_version
        XLA_FFI_Handler_Traits traits
        XLA_FFI_TypeId state_type_id

    ctypedef struct XLA_FFI_Metadata_Extension:
        XLA_FFI_Extension_Base extension_base
        XLA_FFI_Metadata* metadata


TARGET = "fastring_collective"
"""The custom-call target's name, as registered with XLA."""

cdef extern from "Python.h" nogil:
    ctypedef struct PyThreadState
    ctypedef int PyGILState_STATE
    PyThreadState* PyGILState_GetThisThreadState()
    PyGILState_STATE PyGILState_Ensure()
    PyThreadState* PyEval_SaveThread()

cdef object _dispatch = None
cdef object _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
cdef bytes _KEY_ATTR = b"key"

# Every offset, size and enum value the handler relies on, as C expressions over xla_ffi.h:
# `layout()` returns them, and tests/test_jax.py evaluates the same expressions against the
# installed jaxlib's header (which names the sizes XLA_FFI_STRUCT_SIZE and the version
# XLA_FFI_API_MAJOR/MINOR).
cdef extern from *:
    """
    #include "xla_ffi.h"
    typedef struct { const char* expr; long long value; } fastring_layout_entry;
    #define FASTRING_LAYOUT(e) {#e, (long long)(e)}
    static const fastring_layout_entry fastring_layout[] = {
      FASTRING_LAYOUT(offsetof(XLA_FFI_Extension_Base, type)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Extension_Base, next)),
      FASTRING_LAYOUT(sizeof(XLA_FFI_Api_Version)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Api_Version, major_version)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Api_Version, minor_version)),
      FASTRING_LAYOUT(FASTRING_FFI_SIZE_TO(XLA_FFI_Api_Version, minor_version)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Error_Create_Args, message)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Error_Create_Args, errc)),
      FASTRING_LAYOUT(FASTRING_FFI_SIZE_TO(XLA_FFI_Error_Create_Args, errc)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Buffer, dtype)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Buffer, data)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Buffer, rank)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Buffer, dims)),
      FASTRING_LAYOUT(FASTRING_FFI_SIZE_TO(XLA_FFI_Buffer, dims)),
      FASTRING_LAYOUT(sizeof(XLA_FFI_ByteSpan)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_ByteSpan, len)),
      FASTRING_LAYOUT(sizeof(XLA_FFI_Args)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Args, size)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Args, args)),
      FASTRING_LAYOUT(sizeof(XLA_FFI_Rets)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Rets, rets)),
      FASTRING_LAYOUT(sizeof(XLA_FFI_Attrs)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Attrs, types)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Attrs, names)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Attrs, attrs)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Api, api_version)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Api, XLA_FFI_Error_Create)),
      FASTRING_LAYOUT(FASTRING_FFI_SIZE_TO(XLA_FFI_Api, XLA_FFI_Error_Create)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_CallFrame, api)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_CallFrame, stage)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_CallFrame, args)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_CallFrame, rets)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_CallFrame, attrs)),
      FASTRING_LAYOUT(FASTRING_FFI_SIZE_TO(XLA_FFI_CallFrame, attrs)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Metadata, api_version)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Metadata, traits)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Metadata, state_type_id)),
      FASTRING_LAYOUT(FASTRING_FFI_SIZE_TO(XLA_FFI_Metadata, traits)),
      FASTRING_LAYOUT(offsetof(XLA_FFI_Metadata_Extension, metadata)),
      FASTRING_LAYOUT(FASTRING_FFI_SIZE_TO(XLA_FFI_Metadata_Extension, metadata)),
      FASTRING_LAYOUT(FASTRING_FFI_API_MAJOR),
      FASTRING_LAYOUT(FASTRING_FFI_API_MINOR),
      FASTRING_LAYOUT(XLA_FFI_Extension_Metadata),
      FASTRING_LAYOUT(XLA_FFI_ExecutionStage_EXECUTE),
      FASTRING_LAYOUT(XLA_FFI_AttrType_STRING),
      FASTRING_LAYOUT(XLA_FFI_Error_Code_UNKNOWN),
      FASTRING_LAYOUT(XLA_FFI_Error_Code_INVALID_ARGUMENT),
      FASTRING_LAYOUT(XLA_FFI_Error_Code_FAILED_PRECONDITION),
      FASTRING_LAYOUT(XLA_FFI_DataType_PRED), FASTRING_LAYOUT(XLA_FFI_DataType_S8),
      FASTRING_LAYOUT(XLA_FFI_DataType_S16), FASTRING_LAYOUT(XLA_FFI_DataType_S32),
      FASTRING_LAYOUT(XLA_FFI_DataType_S64), FASTRING_LAYOUT(XLA_FFI_DataType_U8),
      FASTRING_LAYOUT(XLA_FFI_DataType_U16), FASTRING_LAYOUT(XLA_FFI_DataType_U32),
      FASTRING_LAYOUT(XLA_FFI_DataType_U64), FASTRING_LAYOUT(XLA_FFI_DataType_F16),
      FASTRING_LAYOUT(XLA_FFI_DataType_F32), FASTRING_LAYOUT(XLA_FFI_DataType_F64),
      FASTRING_LAYOUT(XLA_FFI_DataType_C64), FASTRING_LAYOUT(XLA_FFI_DataType_BF16),
      FASTRING_LAYOUT(XLA_FFI_DataType_TOKEN), FASTRING_LAYOUT(XLA_FFI_DataType_C128),
    };
    static const int fastring_layout_count = (int)(sizeof(fastring_layout) / sizeof(fastring_layout[0]));
    """
    ctypedef struct fastring_layout_entry:
        const char* expr
        long long value
    const fastring_layout_entry* fastring_layout
    const int fastring_layout_count


def set_dispatch(fn) -> None:
    """Make `fn(key: str, inputs: tuple, outputs: tuple)` what every call of the target runs."""
    global _dispatch
    _dispatch = fn


def handler_capsule():
    """The handler's address as the PyCapsule that `jax.ffi.register_ffi_target` takes."""
    return PyCapsule_New(<void*>_handler, NULL, NULL)


cdef XLA_FFI_Error* _error(const XLA_FFI_Api* api, XLA_FFI_Error_Code code, const char* message) noexcept nogil:
    cdef XLA_FFI_Error_Create_Args args
    args.struct_size = FASTRING_FFI_ERROR_CREATE_ARGS_SIZE
    args.extension_start = NULL
    args.message = message
    args.errc = code
    return api.XLA_FFI_Error_Create(&args)


cdef XLA_FFI_Error* _metadata(const XLA_FFI_Api* api, XLA_FFI_Metadata_Extension* extension) noexcept nogil:
    """Answer XLA's query, made once when the target is registered: the API version this
    handler was built against, no traits, no state."""
    if extension.extension_base.struct_size < FASTRING_FFI_METADATA_EXTENSION_SIZE or extension.metadata == NULL \
            or extension.metadata.struct_size < FASTRING_FFI_METADATA_SIZE:
        return _error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                      b"fastring_collective: XLA's FFI metadata structs are smaller than expected")
    cdef XLA_FFI_Metadata* metadata = extension.metadata
    metadata.api_version.struct_size = FASTRING_FFI_API_VERSION_SIZE
    metadata.api_version.extension_start = NULL
    metadata.api_version.major_version = FASTRING_FFI_API_MAJOR
    metadata.api_version.minor_version = FASTRING_FFI_API_MINOR
    metadata.traits = 0
    if metadata.struct_size >= FASTRING_FFI_METADATA_WITH_STATE_SIZE:
        metadata.state_type_id.type_id = 0  # no state
    return NULL


cdef XLA_FFI_Error* _handler(XLA_FFI_CallFrame* frame) noexcept nogil:
    if frame.api.struct_size < FASTRING_FFI_API_SIZE:
        return _error(frame.api, XLA_FFI_Error_Code_FAILED_PRECONDITION,
                      b"fastring_collective: this XLA's FFI API is older than the one fastring was built for")
    if frame.extension_start != NULL and frame.extension_start.type == XLA_FFI_Extension_Metadata:
        return _metadata(frame.api, <XLA_FFI_Metadata_Extension*>frame.extension_start)
    if frame.struct_size < FASTRING_FFI_CALL_FRAME_SIZE:
        return _error(frame.api, XLA_FFI_Error_Code_FAILED_PRECONDITION,
                      b"fastring_collective: XLA's FFI call frame is smaller than expected")
    if frame.stage != XLA_FFI_ExecutionStage_EXECUTE:
        return NULL  # registered for execution only; nothing to prepare
    if PyGILState_GetThisThreadState() == NULL:
        # A Python thread state for this XLA thread, kept for the thread's life (XLA's pool
        # threads run every collective): `with gil` would otherwise make and destroy one per
        # call, which costs more than a small collective.
        PyGILState_Ensure()
        PyEval_SaveThread()
    with gil:
        return _execute(frame)


cdef XLA_FFI_Error* _execute(XLA_FFI_CallFrame* frame) noexcept:
    try:
        _dispatch(_key(&frame.attrs), _views(frame.args.size, frame.args.args, False),
                  _views(frame.rets.size, frame.rets.rets, True))
    except BaseException as e:  # every error must reach XLA, or the step would look fine
        return _raised(frame.api, e)
    return NULL


cdef XLA_FFI_Error* _raised(const XLA_FFI_Api* api, e) noexcept:
    """`e` as an XLA error: its type's name and message (which XLA copies)."""
    cdef bytes message
    try:
        message = f"{type(e).__name__}: {e}".encode("utf-8", "replace")
    except BaseException:
        message = b"fastring_collective: an error whose message could not be formatted"
    return _error(api, XLA_FFI_Error_Code_UNKNOWN, message)


cdef str _key(XLA_FFI_Attrs* attrs):
    cdef int64_t i
    cdef XLA_FFI_ByteSpan* name
    cdef XLA_FFI_ByteSpan* value
    for i in range(attrs.size):
        name = attrs.names[i]
        if (attrs.types[i] == XLA_FFI_AttrType_STRING and name.len == 3
                and memcmp(name.ptr, <const char*>_KEY_ATTR, 3) == 0):
            value = <XLA_FFI_ByteSpan*>attrs.attrs[i]
            return PyUnicode_DecodeUTF8(value.ptr, value.len, NULL)
    raise ValueError("fastring_collective: the custom call has no string attribute 'key'")


cdef tuple _views(int64_t count, void** buffers, bint writeable):
    cdef list views = []
    cdef int64_t i
    cdef XLA_FFI_Buffer* buf
    for i in range(count):
        buf = <XLA_FFI_Buffer*>buffers[i]
        if buf.struct_size < FASTRING_FFI_BUFFER_SIZE:
            raise ValueError("fastring_collective: XLA's FFI buffer struct is smaller than expected")
        if buf.dtype != XLA_FFI_DataType_TOKEN:
            views.append(_view(buf, writeable))
    return tuple(views)


cdef int _typenum(XLA_FFI_DataType dtype) except -1:
    if dtype == XLA_FFI_DataType_F32: return cnp.NPY_FLOAT32
    if dtype == XLA_FFI_DataType_F64: return cnp.NPY_FLOAT64
    if dtype == XLA_FFI_DataType_F16: return cnp.NPY_FLOAT16
    if dtype == XLA_FFI_DataType_BF16: return cnp.NPY_UINT16  # viewed as bfloat16 below
    if dtype == XLA_FFI_DataType_S32: return cnp.NPY_INT32
    if dtype == XLA_FFI_DataType_S64: return cnp.NPY_INT64
    if dtype == XLA_FFI_DataType_S8: return cnp.NPY_INT8
    if dtype == XLA_FFI_DataType_S16: return cnp.NPY_INT16
    if dtype == XLA_FFI_DataType_U8: return cnp.NPY_UINT8
    if dtype == XLA_FFI_DataType_U16: return cnp.NPY_UINT16
    if dtype == XLA_FFI_DataType_U32: return cnp.NPY_UINT32
    if dtype == XLA_FFI_DataType_U64: return cnp.NPY_UINT64
    if dtype == XLA_FFI_DataType_PRED: return cnp.NPY_BOOL
    if dtype == XLA_FFI_DataType_C64: return cnp.NPY_COMPLEX64
    if dtype == XLA_FFI_DataType_C128: return cnp.NPY_COMPLEX128
    raise TypeError(f"fastring_collective: XLA dtype code {<int>dtype} has no numpy equivalent here")


cdef object _view(XLA_FFI_Buffer* buf, bint writeable):
    """A numpy array over the buffer's memory (row-major, as the lowering asks XLA for)."""
    cdef cnp.npy_intp dims[32]
    cdef int64_t d
    if buf.rank > 32:
        raise ValueError(f"fastring_collective: a buffer of rank {buf.rank} (at most 32)")
    for d in range(buf.rank):
        dims[d] = <cnp.npy_intp>buf.dims[d]
    cdef cnp.ndarray array = cnp.PyArray_SimpleNewFromData(<int>buf.rank, dims, _typenum(buf.dtype), buf.data)
    if not writeable:
        cnp.PyArray_CLEARFLAGS(array, cnp.NPY_ARRAY_WRITEABLE)
    return array.view(_BFLOAT16) if buf.dtype == XLA_FFI_DataType_BF16 else array


def layout() -> dict:
    """The offsets, sizes and enum values this module was compiled with, keyed by the C
    expression over xla_ffi.h that gives each (what tests/test_jax.py checks against the
    installed jaxlib's own header)."""
    return {fastring_layout[i].expr.decode(): fastring_layout[i].value for i in range(fastring_layout_count)}
