"""The result-buffer pool: reuse only what nothing references any more."""
import numpy as np
import pytest

from fastring._core import pool as _pool


def test_released_buffer_is_reused():
    a = _pool.empty((1 << 15,), np.float32)
    address = a.ctypes.data
    del a
    assert _pool.empty((1 << 15,), np.float32).ctypes.data == address


@pytest.mark.parametrize("keep", [lambda b: b[:10], lambda b: b.reshape(-1, 2), lambda b: memoryview(b),
                                  lambda b: b])
def test_referenced_buffer_is_never_handed_out(keep):
    b = _pool.empty((1 << 15,), np.float64)
    b[:] = 7.0
    held = keep(b)
    address = b.ctypes.data
    del b
    others = [_pool.empty((1 << 15,), np.float64) for _ in range(3)]
    assert all(o.ctypes.data != address for o in others)
    assert np.asarray(held).reshape(-1)[0] == 7.0


def test_torch_tensor_keeps_its_buffer():
    torch = pytest.importorskip("torch")
    b = _pool.empty((1 << 15,), np.float32)
    b[:] = 3.0
    t = torch.from_dlpack(b)
    address = b.ctypes.data
    del b
    assert _pool.empty((1 << 15,), np.float32).ctypes.data != address
    assert float(t[0]) == 3.0


def test_small_buffers_are_plain_allocations():
    a = _pool.empty((4,), np.float32)
    assert a.shape == (4,) and a.dtype == np.float32
