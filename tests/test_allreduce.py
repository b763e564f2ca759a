"""allreduce: the multi-rank matrix (dtype x op x length x algorithm, numpy and torch) and
every local error path, which needs no second rank."""
import numpy as np
import pytest

import fastring

SIZES = [1, 2, 3, 4]


@pytest.mark.parametrize("n", SIZES)
def test_numpy_every_algorithm(mpirun, n):
    mpirun(n, "allreduce", "numpy", "auto", "ring", "recursive_doubling", "mpi")


@pytest.mark.parametrize("n", SIZES)
def test_torch(mpirun, n):
    pytest.importorskip("torch")
    mpirun(n, "allreduce", "torch", "auto")


@pytest.mark.parametrize("n", [2, 3])
def test_hypothesis_property(mpirun, n):
    pytest.importorskip("hypothesis")
    mpirun(n, "hypothesis_allreduce")


def test_single_process_world_without_launcher():
    fastring.init()
    assert (fastring.rank(), fastring.size()) == (0, 1)
    assert fastring.allreduce(np.ones(4), op=fastring.Sum).tolist() == [1.0] * 4


@pytest.fixture
def initialized():
    fastring.init()
    yield
    fastring.init()


def test_requires_init():
    fastring.shutdown()
    try:
        with pytest.raises(ValueError, match="init"):
            fastring.rank()
        with pytest.raises(ValueError, match="init"):
            fastring.allreduce(np.ones(2))
        assert not fastring.is_initialized()
    finally:
        fastring.init()
    assert fastring.is_initialized()
    fastring.init()  # idempotent
    assert fastring.is_initialized()


@pytest.mark.parametrize("bad", [np.ones(3, np.complex64), np.ones(3, np.complex128), np.array(["a"])])
def test_unsupported_dtype_is_type_error_naming_it(initialized, bad):
    with pytest.raises(TypeError, match=str(bad.dtype)):
        fastring.allreduce(bad)


def test_bad_op(initialized):
    with pytest.raises(ValueError, match="op must be"):
        fastring.allreduce(np.ones(2), op=17)
    with pytest.raises(ValueError, match="op must be"):
        fastring.allreduce(np.ones(2), op="sum")


def test_average_of_bool_is_type_error(initialized):
    with pytest.raises(TypeError, match="bool"):
        fastring.allreduce(np.ones(2, bool))
    assert fastring.allreduce(np.ones(2, bool), op=fastring.Sum).tolist() == [True, True]


def test_unreadable_tensor(initialized):
    with pytest.raises(TypeError, match="tensor"):
        fastring.allreduce(3.0)
    with pytest.raises(TypeError, match="object"):
        fastring.allreduce(object())


def test_bad_scale_factors_and_name(initialized):
    with pytest.raises(TypeError, match="prescale_factor"):
        fastring.allreduce(np.ones(2), prescale_factor="2")
    with pytest.raises(TypeError, match="postscale_factor"):
        fastring.allreduce(np.ones(2), postscale_factor=None)
    with pytest.raises(TypeError, match="name"):
        fastring.allreduce(np.ones(2), name=3)


def test_out_errors(initialized):
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="shape"):
        fastring.allreduce(x, out=np.zeros(5, np.float32))
    with pytest.raises(TypeError, match="dtype"):
        fastring.allreduce(x, out=np.zeros(4, np.float64))
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        fastring.allreduce(x, out=ro)
    assert x.tolist() == [1.0] * 4


def test_buffer_protocol_and_zero_size(initialized):
    got = fastring.allreduce(bytearray(b"\x01\x02"), op=fastring.Sum)
    assert got.tolist() == [1, 2]
    assert fastring.allreduce(np.zeros((0, 3), np.float32)).shape == (0, 3)


def test_bad_algorithm_setting(monkeypatch):
    fastring.shutdown()
    monkeypatch.setenv("FASTRING_ALGORITHM", "butterfly")
    try:
        with pytest.raises(ValueError, match="FASTRING_ALGORITHM"):
            fastring.init()
    finally:
        monkeypatch.delenv("FASTRING_ALGORITHM")
        fastring.init()


def test_init_rejects_non_communicator():
    fastring.shutdown()
    try:
        with pytest.raises(TypeError, match="communicator"):
            fastring.init(comm="world")
    finally:
        fastring.init()
