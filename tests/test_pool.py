"""The result-buffer pool: reuse only what nothing references any more, keep at most its caps,
free the least recently used free buffer first; and, on 2 ranks, 2,000 distinct shapes of
results leave the resident set bounded (tests/workers/bounded_memory.py)."""
import threading
import weakref

import numpy as np
import pytest

from fastring._core import config
from fastring._core import pool as _pool
from fastring._core.pool import Pool, size_class

KIB = 1024


def owner(result: np.ndarray) -> np.ndarray:
    """The pooled buffer behind a result (NumPy points every view at the owning array)."""
    return result if result.base is None else result.base


def test_released_buffer_is_reused():
    a = _pool.empty((1 << 15,), np.float32)
    address = a.ctypes.data
    del a
    assert _pool.empty((1 << 15,), np.float32).ctypes.data == address


@pytest.mark.parametrize("keep", [lambda b: b[:10], lambda b: b.reshape(-1, 2), lambda b: memoryview(b),
                                  lambda b: b, lambda b: b.view(np.uint8)[8:]])
def test_referenced_buffer_is_never_handed_out(keep):
    b = _pool.empty((1 << 15,), np.float64)
    b[:] = 7.0
    held = keep(b)
    address = b.ctypes.data
    del b
    others = [_pool.empty((1 << 15,), np.float64) for _ in range(3)]
    others += [_pool.empty((1 << 14,), np.complex128), _pool.empty((1 << 16,), np.int32)]  # same class
    assert all(o.ctypes.data != address for o in others)
    assert np.asarray(held).reshape(-1).view(np.uint8)[:8].tobytes() == np.float64(7.0).tobytes()


def test_torch_tensor_keeps_its_buffer():
    torch = pytest.importorskip("torch")
    b = _pool.empty((1 << 15,), np.float32)
    b[:] = 3.0
    t = torch.from_dlpack(b)
    address = b.ctypes.data
    del b
    assert _pool.empty((1 << 15,), np.float32).ctypes.data != address
    assert _pool.empty((1 << 14,), np.float64).ctypes.data != address
    assert float(t[0]) == 3.0


def test_pooled_buffers_are_aligned_for_zero_copy_import():
    # Every view handed out, after a reshape to another dtype too, starts on the boundary
    # XLA's CPU client needs to import it without a copy.
    pool = Pool()
    held = [pool.empty((n,), np.uint8) for n in (65536, 70000, 100_001, 1 << 20)]
    again = pool.empty((1 << 13,), np.float64)
    del held[0]
    reused = pool.empty((1 << 14,), np.int32)
    for a in held + [again, reused]:
        assert a.ctypes.data % config.POOL_ALIGN_BYTES == 0


def test_small_buffers_are_plain_allocations():
    pool = Pool()
    a = pool.empty((4,), np.float32)
    assert a.shape == (4,) and a.dtype == np.float32
    assert pool.kept() == (0, 0)


def test_object_arrays_are_plain_allocations():
    pool = Pool()
    a = pool.empty((1 << 14,), object)
    assert a.dtype == object and a[0] is None and pool.kept() == (0, 0)


def test_one_buffer_serves_every_shape_and_dtype_of_its_class():
    pool = Pool()
    a = pool.empty((100, 1000), np.float32)
    address = a.ctypes.data
    del a
    for shape, dtype in [((50, 2000), np.float32), ((49_999,), np.float64), ((400_000,), np.uint8),
                         ((10, 10, 999), np.int32), ((100, 1000), np.float32)]:
        b = pool.empty(shape, dtype)
        assert (b.ctypes.data, b.shape, b.dtype) == (address, shape, np.dtype(dtype))
        assert b.flags.c_contiguous and b.flags.writeable
        b[...] = 1  # the whole view is inside the buffer
        del b
    assert pool.kept() == (1, size_class(400_000))


def test_size_classes_waste_at_most_an_eighth():
    sizes = np.unique(np.geomspace(64 * KIB, 1 << 30, 5000).astype(np.int64))
    classes = [size_class(int(n)) for n in sizes]
    assert all(n <= c < n * (1 + 1 / config.POOL_CLASSES_PER_OCTAVE) + 1 for n, c in zip(sizes, classes))
    assert classes == sorted(classes)
    assert len(set(classes)) <= config.POOL_CLASSES_PER_OCTAVE * 14 + 1  # 64 KiB..1 GiB: 14 octaves


def test_many_distinct_shapes_stay_under_the_caps():
    pool = Pool(max_bytes=4 << 20, max_entries=8)
    rng = np.random.default_rng(0)
    held = []
    for i in range(2000):
        n = int(rng.integers(64 * KIB, 1 << 20))
        a = pool.empty((n // 4,), np.float32)
        a[:2] = i
        if i % 10 == 0:
            held.append((i, a))  # some results outlive many others
            held = held[-5:]
        del a
        entries, kept = pool.kept()
        assert entries <= 8 and kept <= 4 << 20
    assert all(a[0] == a[1] == i for i, a in held)


def test_default_pool_keeps_one_buffer_per_class_of_distinct_released_shapes():
    pool = Pool()
    classes = set()
    for i in range(2000):  # variable sequence lengths: (batch, length, 64) float32
        a = pool.empty((4, 64 + i, 64), np.float32)
        classes.add(size_class(a.nbytes))
        del a
    entries, kept = pool.kept()
    # 64 KiB to 2 MiB is five octaves and a bit
    assert entries == len(classes) <= 6 * config.POOL_CLASSES_PER_OCTAVE and kept == sum(classes)
    assert kept <= config.POOL_MAX_BYTES and entries <= config.POOL_MAX_ENTRIES


def test_buffers_over_the_byte_cap_are_not_kept():
    pool = Pool(max_bytes=1 << 20)
    a = pool.empty((1 << 19,), np.float32)  # 2 MiB
    assert a.nbytes == 2 << 20 and pool.kept() == (0, 0)


def test_per_size_cap_leaves_extra_held_results_unpooled():
    pool = Pool(per_size=2)
    held = [pool.empty((1 << 15,), np.float32) for _ in range(5)]
    assert len({a.ctypes.data for a in held}) == 5
    assert pool.kept() == (2, 2 * size_class(1 << 17))


@pytest.mark.parametrize("again", [((1 << 14,), np.float32), ((1 << 13,), np.float64)],
                         ids=["same shape", "another shape of the class"])
def test_least_recently_used_free_buffer_goes_first(again):
    pool = Pool(max_entries=3)
    shapes = [(1 << 14,), (1 << 15,), (1 << 16,), (1 << 17,)]  # four classes
    alive = {}
    for s in shapes[:3]:
        a = pool.empty(s, np.float32)
        alive[s] = weakref.ref(owner(a))
        del a
    pool.empty(*again)  # shapes[0]'s buffer used again: now the most recent, shapes[1]'s the least
    pool.empty(shapes[3], np.float32)
    assert alive[shapes[1]]() is None  # freed, not merely forgotten
    assert alive[shapes[0]]() is not None and alive[shapes[2]]() is not None
    assert pool.kept()[0] == 3


def test_held_buffers_are_passed_over_for_a_free_one():
    pool = Pool(max_entries=3)
    held = pool.empty((1 << 14,), np.float32)  # the least recently used, but held
    held[:] = 5
    others = [pool.empty((1 << 15,), np.float32), pool.empty((1 << 16,), np.float32)]
    gone = weakref.ref(owner(others[0]))
    del others
    pool.empty((1 << 17,), np.float32)
    assert gone() is None
    address = held.ctypes.data
    assert all(held == 5)
    del held
    assert pool.empty((1 << 14,), np.float32).ctypes.data == address  # still pooled


def test_when_every_buffer_is_held_the_oldest_is_forgotten_not_reused():
    pool = Pool(max_entries=2)
    held = [pool.empty((1 << 14 << k,), np.float32) for k in range(3)]
    for k, a in enumerate(held):
        a[:] = k
    assert pool.kept()[0] == 2
    assert [int(a[0]) for a in held] == [0, 1, 2] and all((a == a[0]).all() for a in held)
    first = weakref.ref(owner(held[0]))
    address = held[0].ctypes.data
    fresh = pool.empty((1 << 14,), np.float32)  # held[0] is out of the pool: a new buffer
    assert fresh.ctypes.data != address and int(held[0][0]) == 0
    del held[0]
    assert first() is None  # freed with its holder's reference, not kept by the pool


def test_clear_forgets_and_held_results_live_on():
    pool = Pool()
    a = pool.empty((1 << 16,), np.float32)
    a[:] = 2
    pool.clear()
    assert pool.kept() == (0, 0) and (a == 2).all()


def test_threads_never_share_a_live_buffer():
    pool = Pool(max_entries=6, max_bytes=1 << 20)
    errors = []

    def work(tag: int) -> None:
        rng = np.random.default_rng(tag)
        mine = []
        for i in range(3000):
            n = int(rng.integers(1 << 14, 1 << 16))
            a = pool.empty((n,), np.int32)
            a[[0, -1]] = tag * 100_000 + i
            mine.append((tag * 100_000 + i, a))
            if len(mine) > 3:
                value, old = mine.pop(0)
                if old[0] != value or old[-1] != value:
                    errors.append((tag, i))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_caps_are_what_config_says():
    assert (_pool.POOL.max_bytes, _pool.POOL.max_entries) == (config.POOL_MAX_BYTES, config.POOL_MAX_ENTRIES)


def test_distinct_shapes_leave_memory_bounded(mpirun):
    mpirun(2, "bounded_memory", timeout=120)


def test_arena_hands_out_whole_pages_and_takes_them_back_when_unreferenced():
    import mmap
    arena = _pool.Arena(mmap.mmap(-1, 64 * KIB), 8 * KIB, 40 * KIB)
    a, b = arena.take(1), arena.take(12 * KIB + 1)
    assert (a.size, b.size) == (4 * KIB, 16 * KIB)
    assert arena.holds(a) and arena.holds(b) and a.ctypes.data % 4096 == 0
    assert b.ctypes.data - a.ctypes.data == 4 * KIB  # first fit, from the start
    assert arena.take(24 * KIB) is None  # 20 KiB are left
    view = b[100:200]
    del b
    assert arena.take(24 * KIB) is None  # a view keeps its block
    del view
    c = arena.take(36 * KIB)  # b's block joined the free run after it: 4 + 16 + 20 KiB from a on
    assert c is not None and c.ctypes.data == a.ctypes.data + 4 * KIB
    assert arena.take(1) is None
    del a
    assert arena.take(4 * KIB) is not None


def test_arena_bounds_hold_its_part_only():
    import mmap
    area = mmap.mmap(-1, 64 * KIB)
    first, second = _pool.Arena(area, 0, 32 * KIB), _pool.Arena(area, 32 * KIB, 32 * KIB)
    block = second.take(8 * KIB)
    assert second.holds(block) and second.holds(block[:0]) and not first.holds(block)
    assert not second.holds(np.frombuffer(area, np.uint8)[32 * KIB - 1:32 * KIB + 1])


def test_pool_from_an_arena_keeps_held_results_and_falls_back_when_full():
    import mmap
    arena = _pool.Arena(mmap.mmap(-1, 1 << 20), 0, 1 << 20)
    pool = Pool(arena=arena)
    a = pool.empty((100_000,), np.float32)  # 400,000 bytes: a 425,984-byte class
    a[:] = 3.0
    assert arena.holds(a)
    b = pool.empty((100_000,), np.float32)  # a is held: another block
    assert arena.holds(b) and b.ctypes.data != a.ctypes.data
    c = pool.empty((100_000,), np.float32)  # no room for a third: the heap, not pooled
    assert not arena.holds(c) and pool.kept() == (2, 2 * size_class(400_000))
    assert (a == 3.0).all()
    address = a.ctypes.data
    del a
    assert pool.empty((50, 2000), np.float32).ctypes.data == address


def test_pool_from_a_full_arena_frees_its_unreferenced_buffers_for_a_new_size():
    import mmap
    arena = _pool.Arena(mmap.mmap(-1, 1 << 20), 0, 1 << 20)
    pool = Pool(arena=arena)
    b, a = pool.empty((300 * KIB,), np.uint8), pool.empty((400 * KIB,), np.uint8)
    assert arena.holds(a) and arena.holds(b)
    del a  # free in the pool, still in the arena, beside the free rest
    c = pool.empty((600 * KIB,), np.uint8)  # room only once a's buffer is dropped
    assert arena.holds(c) and pool.kept() == (2, size_class(300 * KIB) + size_class(600 * KIB))
    d = pool.empty((600 * KIB,), np.uint8)  # b and c are held: nothing to drop
    assert not arena.holds(d)


@pytest.mark.parametrize("phase", [0, 16, 48, 4096 + 16, 12 * 4096 + 60])
def test_phase_places_a_buffer_at_that_offset_modulo_its_boundary(phase):
    # A result lying as its source does (config.COPY_PHASE_BYTES): the same buffer serves each
    # phase and the default alignment in turn, and never while held.
    boundary = config.COPY_PHASE_BYTES
    pool = Pool()
    a = pool.empty((1 << 14,), np.float32, phase=phase)
    assert a.ctypes.data % boundary == phase % boundary and a.nbytes == 1 << 16
    a[:] = 5.0
    base = owner(a).ctypes.data
    held = pool.empty((1 << 14,), np.float32, phase=phase)
    assert owner(held).ctypes.data != base and held.ctypes.data % boundary == phase % boundary
    held[:] = 7.0
    assert (a == 5.0).all()
    del a
    other = (phase + 24) % boundary
    b = pool.empty((1 << 14,), np.float32, phase=other)
    assert owner(b).ctypes.data == base and b.ctypes.data % boundary == other
    del b
    c = pool.empty((1 << 14,), np.float32)
    assert owner(c).ctypes.data == base and c.ctypes.data % config.POOL_ALIGN_BYTES == 0
    assert (held == 7.0).all()


def test_phase_keeps_the_dtype_aligned():
    pool = Pool()
    assert pool.empty((1 << 13,), np.float64, phase=20).ctypes.data % 64 == 16
    assert pool.empty((1 << 16,), np.uint8, phase=21).ctypes.data % 64 == 21


def test_an_arena_block_without_room_for_the_phase_starts_on_its_page():
    import mmap
    pool = Pool(arena=_pool.Arena(mmap.mmap(-1, 1 << 20), 0, 1 << 20), min_bytes=0)  # as the results area
    fits = pool.empty((KIB - 4,), np.float32, phase=16)  # a 4,096-byte block, 16 bytes to spare
    assert pool.arena.holds(fits) and fits.ctypes.data % 4096 == 16
    whole = pool.empty((64 * KIB,), np.uint8, phase=16)  # a block of exactly that size
    assert pool.arena.holds(whole) and whole.ctypes.data % 4096 == 0 and whole.nbytes == 64 * KIB
