# cython: language_level=3, boundscheck=False, wraparound=False
"""NumPy arrays as the raw addresses the transport takes: the checks and copies of the
latency path, cheaper than going through `ndarray.ctypes` or `.flags`."""

from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcpy

import numpy as np

cimport numpy as cnp
cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    # steals a reference to `descr`
    object PyArray_NewFromDescr(type subtype, cnp.dtype descr, int nd, cnp.npy_intp* dims, cnp.npy_intp* strides,
                                void* data, int flags, object obj)


def array_address(cnp.ndarray array not None):
    """Address of an array's first byte (cheaper than `ndarray.ctypes.data` on hot paths).

    Example:
        >>> import numpy as np
        >>> a = np.zeros(2)
        >>> array_address(a) == a.ctypes.data
        True
    """
    return <uintptr_t> cnp.PyArray_DATA(array)


def is_writable_c_contiguous(cnp.ndarray array not None):
    """True when the array can be reduced in place: C-contiguous and writeable."""
    return cnp.PyArray_IS_C_CONTIGUOUS(array) and cnp.PyArray_ISWRITEABLE(array)


def is_c_contiguous(cnp.ndarray array not None):
    """True when the array's elements are contiguous in C order."""
    return cnp.PyArray_IS_C_CONTIGUOUS(array)


def copy_from_array(uintptr_t dst, cnp.ndarray array not None):
    """Copy a C-contiguous array's bytes to `dst` and return True, or return False (and copy
    nothing) when the array is not contiguous. One call for the latency path."""
    if not cnp.PyArray_IS_C_CONTIGUOUS(array):
        return False
    memcpy(<void*> dst, cnp.PyArray_DATA(array), cnp.PyArray_NBYTES(array))
    return True


def copy_to_array(cnp.ndarray array not None, uintptr_t src):
    """Copy as many bytes as a C-contiguous, writeable array holds from `src` into it."""
    if not (cnp.PyArray_IS_C_CONTIGUOUS(array) and cnp.PyArray_ISWRITEABLE(array)):
        raise ValueError("copy_to_array needs a C-contiguous, writeable array")
    memcpy(cnp.PyArray_DATA(array), <void*> src, cnp.PyArray_NBYTES(array))


def scatter_to_arrays(cnp.ndarray flat not None, list arrays not None):
    """Copy `flat`'s bytes, one after another, into `arrays` (each filled whole: the unpacking
    of a fused buffer in one call). Returns False, having copied nothing, unless `flat` and
    every array are C-contiguous, every array writeable, and `flat` holds at least their
    bytes together."""
    return _copy_run(flat, arrays, True)


def gather_from_arrays(cnp.ndarray flat not None, list arrays not None):
    """Copy the bytes of `arrays`, one after another, into the start of `flat` (the packing
    of a fused buffer in one call: np.concatenate costs six times as much for a small array).
    Returns False, having copied nothing, unless `flat` and every array are C-contiguous and
    of one dtype (bytes are copied, never cast), `flat` writeable and large enough for their
    bytes together.

    Example:
        >>> import numpy as np
        >>> flat = np.zeros(3)
        >>> gather_from_arrays(flat, [np.ones(1), np.full(2, 2.0)]), flat
        (True, array([1., 2., 2.]))
    """
    return _copy_run(flat, arrays, False)


cdef bint _copy_run(cnp.ndarray flat, list arrays, bint into_arrays) except -1:
    """scatter_to_arrays (`into_arrays`) or gather_from_arrays."""
    cdef Py_ssize_t total = 0
    cdef cnp.ndarray a
    if not (cnp.PyArray_IS_C_CONTIGUOUS(flat) and (into_arrays or cnp.PyArray_ISWRITEABLE(flat))):
        return False
    cdef cnp.PyArray_Descr* dtype = cnp.PyArray_DESCR(flat)
    for item in arrays:
        a = <cnp.ndarray?> item
        if not (cnp.PyArray_IS_C_CONTIGUOUS(a) and (cnp.PyArray_ISWRITEABLE(a) or not into_arrays)):
            return False
        if (not into_arrays and cnp.PyArray_DESCR(a) is not dtype
                and not cnp.PyArray_EquivTypes(<cnp.dtype> <object> cnp.PyArray_DESCR(a), <cnp.dtype> <object> dtype)):
            return False
        total += cnp.PyArray_NBYTES(a)
    if total > cnp.PyArray_NBYTES(flat):
        return False
    cdef char* at = <char*> cnp.PyArray_DATA(flat)
    for item in arrays:
        a = <cnp.ndarray> item
        if into_arrays:
            memcpy(cnp.PyArray_DATA(a), at, cnp.PyArray_NBYTES(a))
        else:
            memcpy(at, cnp.PyArray_DATA(a), cnp.PyArray_NBYTES(a))
        at += cnp.PyArray_NBYTES(a)
    return True


def gather_strided(cnp.ndarray out not None, uintptr_t src, int64_t stride, list lengths not None):
    """Copy lengths[r] bytes from `src + r * stride`, for each r in turn, into `out`, one
    after another (an allgather's rows out of the shares of its cycle's payload). `out` must
    be C-contiguous, writeable and hold their sum exactly (ValueError otherwise)."""
    cdef Py_ssize_t total = 0, r
    cdef int64_t n
    for item in lengths:
        n = item
        if n < 0 or n > stride:
            raise ValueError(f"gather_strided: a length of {n} bytes does not fit a stride of {stride}")
        total += n
    if not (cnp.PyArray_IS_C_CONTIGUOUS(out) and cnp.PyArray_ISWRITEABLE(out) and cnp.PyArray_NBYTES(out) == total):
        raise ValueError(f"gather_strided needs a C-contiguous, writeable array of {total} bytes")
    cdef char* dst = <char*> cnp.PyArray_DATA(out)
    for r in range(len(lengths)):
        n = lengths[r]
        memcpy(dst, <char*> src + r * stride, n)
        dst += n


def pieces_of(list arrays not None):
    """(addresses, byte lengths) of `arrays`, two int64 arrays: the pieces an allreduce of
    the group reads where they lie (`SharedSegment.allreduce_pieces`); or None when any is
    not a C-contiguous numpy array (then it must be copied into one buffer first).

    Example:
        >>> import numpy as np
        >>> a, b = np.zeros(2, np.int32), np.zeros(3)
        >>> [int(n) for n in pieces_of([a, b])[1]], pieces_of([a, b[::2]])
        ([8, 24], None)
    """
    cdef Py_ssize_t n = len(arrays), i
    addresses, lengths = np.empty(n, np.int64), np.empty(n, np.int64)
    cdef int64_t[::1] at = addresses, length = lengths
    cdef cnp.ndarray a
    for i in range(n):
        item = arrays[i]
        if type(item) is not np.ndarray:
            return None
        a = <cnp.ndarray> item
        if not cnp.PyArray_IS_C_CONTIGUOUS(a):
            return None
        at[i] = <int64_t> <uintptr_t> cnp.PyArray_DATA(a)
        length[i] = cnp.PyArray_NBYTES(a)
    return addresses, lengths


def group_of(list arrays not None):
    """(dtype, shapes, total bytes) of a group of C-contiguous numpy arrays (exactly
    np.ndarray) of one dtype, as a plain grouped allreduce needs them; None when any array
    is not one (the general path checks and explains).

    Example:
        >>> import numpy as np
        >>> group_of([np.zeros((2, 3)), np.zeros(4)])
        (dtype('float64'), ((2, 3), (4,)), 80)
        >>> group_of([np.zeros(2), np.zeros(2, np.float32)]) is None
        True
    """
    cdef Py_ssize_t n = len(arrays), i, total = 0
    if n == 0 or type(arrays[0]) is not np.ndarray:
        return None
    cdef cnp.PyArray_Descr* dtype = cnp.PyArray_DESCR(<cnp.ndarray> arrays[0])
    cdef cnp.ndarray a
    shapes = PyTuple_New(n)
    for i in range(n):
        item = arrays[i]
        if type(item) is not np.ndarray:
            return None
        a = <cnp.ndarray> item
        if not cnp.PyArray_IS_C_CONTIGUOUS(a) or cnp.PyArray_DESCR(a) is not dtype:
            return None
        shape = (<object> a).shape
        Py_INCREF(shape)
        PyTuple_SET_ITEM(shapes, i, shape)
        total += cnp.PyArray_NBYTES(a)
    return <object> dtype, shapes, total


def views_of(cnp.ndarray block not None, list arrays not None):
    """Views of the C-contiguous `block`, one after another, each shaped as the array at the
    same place in `arrays` (a grouped allreduce's results, in one call).

    Example:
        >>> import numpy as np
        >>> views_of(np.arange(5.0), [np.zeros(2), np.zeros((1, 3))])
        [array([0., 1.]), array([[2., 3., 4.]])]
    """
    cdef Py_ssize_t n = len(arrays), i
    cdef cnp.ndarray a, view
    cdef cnp.dtype dtype = <cnp.dtype> cnp.PyArray_DESCR(block)
    cdef char* at = <char*> cnp.PyArray_DATA(block)
    cdef char* end = at + cnp.PyArray_NBYTES(block)
    if not cnp.PyArray_IS_C_CONTIGUOUS(block):
        raise ValueError("views_of needs a C-contiguous block")
    views = PyList_New(n)
    for i in range(n):
        a = <cnp.ndarray?> arrays[i]
        if cnp.PyArray_ITEMSIZE(a) != cnp.PyArray_ITEMSIZE(block) or at + cnp.PyArray_NBYTES(a) > end:
            raise ValueError("the arrays do not fit the block")
        Py_INCREF(dtype)  # PyArray_NewFromDescr takes a reference to the dtype
        view = PyArray_NewFromDescr(np.ndarray, dtype, cnp.PyArray_NDIM(a), cnp.PyArray_DIMS(a), NULL,
                                    at, cnp.NPY_ARRAY_CARRAY, None)
        cnp.set_array_base(view, block)
        Py_INCREF(view)
        PyList_SET_ITEM(views, i, view)
        at += cnp.PyArray_NBYTES(a)
    return views
