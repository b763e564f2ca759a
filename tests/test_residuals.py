"""The error-feedback residual store: bounded in bytes and names, least recently used name
dropped first; and the device ring's use of it (in Numba's CUDA simulator, or on a GPU)."""
import logging

import numpy as np
import pytest

import fastring
from fastring import Compression
from fastring._core import config
from fastring._core.device import DeviceState
from fastring._core.residuals import Residuals

F32 = np.dtype(np.float32)


def test_get_gives_back_what_was_put():
    store = Residuals()
    assert store.get("w", (3,), F32) is None
    r = np.arange(3, dtype=F32)
    store.put("w", r)
    assert store.get("w", (3,), np.float32) is r
    assert store.nbytes == 12 and len(store) == 1


@pytest.mark.parametrize("shape, dtype", [((4,), F32), ((3, 1), F32), ((3,), np.float64)])
def test_a_residual_of_another_shape_or_dtype_is_dropped(shape, dtype):
    store = Residuals()
    store.put("w", np.zeros(3, F32))
    assert store.get("w", shape, dtype) is None
    assert len(store) == 0 and store.nbytes == 0
    assert store.dropped == 0  # replaced by the caller, not dropped for room


def test_put_replaces_and_counts_bytes_once():
    store = Residuals()
    store.put("w", np.zeros(3, F32))
    store.put("w", np.zeros(5, np.float64))
    assert store.nbytes == 40 and store.names() == ["w"]


def test_many_names_stay_under_both_caps():
    store = Residuals(max_bytes=1000, max_entries=6)
    rng = np.random.default_rng(0)
    sizes = {}
    for i in range(2000):
        sizes[f"step{i}"] = int(rng.integers(1, 60))
        store.put(f"step{i}", np.zeros(sizes[f"step{i}"], F32))
        assert store.nbytes <= 1000 and len(store) <= 6
        assert store.nbytes == sum(store.get(n, (sizes[n],), F32).nbytes for n in store.names())
    assert store.names()[-1] == "step1999" and store.dropped > 1900


def test_least_recently_used_name_goes_first():
    store = Residuals(max_entries=3)
    for name in "abc":
        store.put(name, np.zeros(2, F32))
    assert store.get("a", (2,), F32) is not None  # a used: b is now the least recent
    store.put("d", np.zeros(2, F32))
    assert store.names() == ["c", "a", "d"]
    store.put("c", np.zeros(2, F32))  # put is a use too
    store.put("e", np.zeros(2, F32))
    assert store.names() == ["d", "c", "e"]


def test_byte_cap_drops_as_many_as_it_takes():
    store = Residuals(max_bytes=64)
    for name in "abcd":
        store.put(name, np.zeros(4, F32))  # 16 bytes each: all four fit
    store.put("big", np.zeros(10, F32))  # 40 bytes: a, b and c go
    assert store.names() == ["d", "big"] and store.nbytes == 56


def test_one_over_the_byte_cap_is_not_kept_and_is_said_once(caplog):
    store = Residuals(max_bytes=16)
    with caplog.at_level(logging.WARNING, logger="fastring"):
        store.put("huge", np.zeros(5, F32))
        store.put("huger", np.zeros(6, F32))
    assert len(store) == 0 and store.dropped == 2
    assert len([r for r in caplog.records if "error feedback" in r.getMessage()]) == 1


def test_device_state_residuals_are_bounded_by_config():
    store = DeviceState().residuals
    assert (store.max_bytes, store.max_entries) == (config.RESIDUAL_MAX_BYTES, config.RESIDUAL_MAX_ENTRIES)


# ------------------------------------------------------------------ on the device ring

def _simulated_or_gpu() -> bool:
    try:
        from numba import config as numba_config
        from numba import cuda
    except ImportError:
        return False
    return bool(numba_config.ENABLE_CUDASIM) or cuda.is_available()


@pytest.mark.cuda
@pytest.mark.skipif(not _simulated_or_gpu(), reason="no GPU (set NUMBA_ENABLE_CUDASIM=1 for the simulator)")
def test_device_ring_drops_the_least_recent_name_and_starts_it_afresh(monkeypatch):
    """One rank: fp16 with error feedback sends 1/3 rounded; the next step of the same name
    adds what was lost and sends another value. A name dropped for room starts over."""
    from numba import cuda

    from fastring._core.device import state_of
    from fastring._core.runtime import runtime

    fastring.init()
    store = state_of(runtime()).residuals
    monkeypatch.setattr(store, "max_entries", 2)
    x = np.full(7, 1 / 3, F32)

    def step(name: str) -> np.ndarray:
        return fastring.allreduce(cuda.to_device(x), op=fastring.Sum, compression=Compression.fp16_ef,
                                  name=name).copy_to_host()

    first = step("res.a")
    assert first.tolist() == x.astype(np.float16).astype(F32).tolist()
    second = step("res.a")
    assert not np.array_equal(second, first)  # corrected by the residual kept
    assert step("res.b").tolist() == first.tolist()
    assert step("res.c").tolist() == first.tolist()  # res.a goes: the least recently used
    assert "res.a" not in store.names() and len(store) == 2
    assert step("res.a").tolist() == first.tolist()  # starts over: no residual to add
