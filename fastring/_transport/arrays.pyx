# cython: language_level=3, boundscheck=False, wraparound=False
"""NumPy arrays as the raw addresses the transport takes: the checks and copies of the
latency path, cheaper than going through `ndarray.ctypes` or `.flags`."""

from libc.stdint cimport uintptr_t
from libc.string cimport memcpy

cimport numpy as cnp
cnp.import_array()


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
    cdef Py_ssize_t total = 0
    cdef cnp.ndarray a
    if not cnp.PyArray_IS_C_CONTIGUOUS(flat):
        return False
    for item in arrays:
        a = <cnp.ndarray?> item
        if not (cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISWRITEABLE(a)):
            return False
        total += cnp.PyArray_NBYTES(a)
    if total > cnp.PyArray_NBYTES(flat):
        return False
    cdef char* src = <char*> cnp.PyArray_DATA(flat)
    for item in arrays:
        a = <cnp.ndarray> item
        memcpy(cnp.PyArray_DATA(a), src, cnp.PyArray_NBYTES(a))
        src += cnp.PyArray_NBYTES(a)
    return True
