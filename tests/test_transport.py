"""The Cython transport: point-to-point calls and broadcasts at np 1-4, a message over 2 GiB,
and MPI errors surfacing as FastringError with MPI's own message."""
import numpy as np
import pytest
from mpi4py import MPI

import fastring
from fastring._transport import Requests, Transport, array_address, is_writable_c_contiguous
from fastring._transport import testing


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_point_to_point(mpirun, n):
    mpirun(n, "transport")


def test_message_larger_than_2_gib(mpirun):
    mpirun(2, "transport", "big", timeout=300)


def test_mpi_error_becomes_fastring_error():
    t = Transport(MPI.COMM_WORLD)
    buf = np.zeros(4, np.uint8)
    with pytest.raises(fastring.FastringError, match="MPI call failed: .*rank"):
        testing.send(t, array_address(buf), buf.nbytes, 7)
    with pytest.raises(fastring.FastringError, match="MPI call failed"):
        testing.irecv(t, Requests(), array_address(buf), buf.nbytes, -5)
    with pytest.raises(ValueError, match="no MPI datatype"):
        t.mpi_allreduce(array_address(buf), array_address(buf), 4, 42, 0)
    t.free()


def test_array_helpers():
    a = np.arange(6.0)
    assert array_address(a) == a.ctypes.data
    assert is_writable_c_contiguous(a) and not is_writable_c_contiguous(a[::2])
    a.flags.writeable = False
    assert not is_writable_c_contiguous(a)


@pytest.mark.parametrize("n", [2, 3])
def test_same_bits_on_every_rank(mpirun, n):
    mpirun(n, "bitwise", "auto", "recursive_doubling")
