"""allgather, broadcast, alltoall, reducescatter, barrier, broadcast_object, allgather_object:
the multi-rank matrix (tests/workers/collectives.py, numpy and torch) and every local error
path, which needs no second rank."""
import doctest
import threading

import numpy as np
import pytest

import fastring
import fastring.api.collectives

SIZES = [1, 2, 3, 4]
ROWS_OPS = {  # the collectives that work on dimension 0, called with their minimal arguments
    "allgather": fastring.allgather, "allgather_async": fastring.allgather_async,
    "alltoall": fastring.alltoall, "alltoall_async": fastring.alltoall_async,
    "reducescatter": fastring.reducescatter, "reducescatter_async": fastring.reducescatter_async,
}
TENSOR_OPS = dict(ROWS_OPS, broadcast=lambda t: fastring.broadcast(t, 0),
                  broadcast_async=lambda t: fastring.broadcast_async(t, 0))


@pytest.mark.parametrize("n", SIZES)
def test_numpy_matrix_and_cross_rank_errors(mpirun, n):
    mpirun(n, "collectives", "numpy")


@pytest.mark.parametrize("n", SIZES)
def test_torch(mpirun, n):
    pytest.importorskip("torch")
    mpirun(n, "collectives", "torch")


@pytest.fixture
def initialized():
    fastring.init()
    yield
    fastring.init()


def test_exported():
    for name in ("allgather", "allgather_async", "broadcast", "broadcast_async", "alltoall",
                 "alltoall_async", "reducescatter", "reducescatter_async", "barrier",
                 "broadcast_object", "allgather_object"):
        assert name in fastring.__all__ and callable(getattr(fastring, name))


def test_docstring_examples(initialized):
    result = doctest.testmod(fastring.api.collectives, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 10 and result.failed == 0


def test_requires_init():
    fastring.shutdown()
    try:
        for call in [lambda: fastring.allgather(np.ones(2)), lambda: fastring.broadcast(np.ones(2), 0),
                     lambda: fastring.alltoall(np.ones(2)), lambda: fastring.reducescatter(np.ones(2)),
                     fastring.barrier, lambda: fastring.broadcast_object(1),
                     lambda: fastring.allgather_object(1)]:
            with pytest.raises(ValueError, match="init"):
                call()
    finally:
        fastring.init()


@pytest.mark.parametrize("op", sorted(ROWS_OPS))
def test_zero_d_is_value_error(initialized, op):
    with pytest.raises(ValueError, match="0-d"):
        ROWS_OPS[op](np.array(1.0))


def test_zero_d_broadcast_is_fine(initialized):
    got = fastring.broadcast(np.array(2.5), 0)
    assert got.shape == () and got == 2.5


@pytest.mark.parametrize("op", sorted(TENSOR_OPS))
@pytest.mark.parametrize("bad", [np.ones(3, np.complex64), np.ones(3, np.complex128)])
def test_unsupported_dtype_is_type_error_naming_it(initialized, op, bad):
    with pytest.raises(TypeError, match=str(bad.dtype)):
        TENSOR_OPS[op](bad)


@pytest.mark.parametrize("op", sorted(TENSOR_OPS))
def test_unreadable_tensor_and_bad_name(initialized, op):
    with pytest.raises(TypeError, match="tensor"):
        TENSOR_OPS[op](3.0)
    fn = getattr(fastring, op)
    args = (np.ones(2), 0) if op.startswith("broadcast") else (np.ones(2),)
    with pytest.raises(TypeError, match="name"):
        fn(*args, name=7)


@pytest.mark.parametrize("root", [-1, 1, 10])
def test_root_outside_world_is_value_error(initialized, root):
    with pytest.raises(ValueError, match="root_rank"):
        fastring.broadcast(np.ones(2), root)
    with pytest.raises(ValueError, match="root_rank"):
        fastring.broadcast_async(np.ones(2), root)
    with pytest.raises(ValueError, match="root_rank"):
        fastring.broadcast_object("x", root_rank=root)


@pytest.mark.parametrize("root", ["0", 0.0, True, None])
def test_root_not_an_integer_is_type_error(initialized, root):
    with pytest.raises(TypeError, match="root_rank"):
        fastring.broadcast(np.ones(2), root)
    assert fastring.broadcast(np.ones(2), np.int64(0)).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("splits, message", [
    (np.array([2], np.int64), "int32"),
    (np.array([[2]], np.int32), "1-D"),
    (np.array([1, 1], np.int32), "one entry per rank"),
    ([], "one entry per rank"),
    (np.array([-1], np.int32), "negative"),
    (np.array([4], np.int32), "more than dimension 0"),
    ([4], "more than dimension 0"),
    ([1.0], "integers"),
    ([True], "integers"),
    ([2 ** 40], "int32"),
    ("1", "int32"),
    (3, "int32"),
])
def test_bad_splits_are_value_errors(initialized, splits, message):
    with pytest.raises(ValueError, match=message):
        fastring.alltoall(np.zeros(3), splits=splits)
    with pytest.raises(ValueError, match=message):
        fastring.alltoall_async(np.zeros(3), splits=splits)


def test_alltoall_on_one_rank(initialized):
    x = np.arange(12, dtype=np.int32).reshape(6, 2)
    assert np.array_equal(fastring.alltoall(x), x)
    out, received = fastring.alltoall(x, splits=np.array([4], np.int32))
    assert np.array_equal(out, x[:4]) and received.dtype == np.int32 and received.tolist() == [4]
    out, received = fastring.alltoall(np.zeros((0, 3)), splits=[0])
    assert out.shape == (0, 3) and received.tolist() == [0]


def test_reducescatter_argument_errors(initialized):
    with pytest.raises(TypeError, match="bool"):
        fastring.reducescatter(np.ones(2, bool))
    assert fastring.reducescatter(np.ones(2, bool), op=fastring.Max).tolist() == [True, True]
    with pytest.raises(ValueError, match="op must be"):
        fastring.reducescatter(np.ones(2), op="sum")
    with pytest.raises(TypeError, match="prescale_factor"):
        fastring.reducescatter(np.ones(2), prescale_factor="2")
    with pytest.raises(TypeError, match="postscale_factor"):
        fastring.reducescatter_async(np.ones(2), postscale_factor=None)


def test_reducescatter_on_one_rank(initialized):
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    got = fastring.reducescatter(x, prescale_factor=2.0, postscale_factor=0.5)
    assert np.array_equal(got, x) and got is not x
    assert np.array_equal(fastring.reducescatter(np.array([-7, 7], np.int8)), [-7, 7])
    assert fastring.reducescatter(np.zeros((0, 4), np.float16)).shape == (0, 4)


def test_one_rank_results_are_scaled_copies(initialized):
    """On one rank allgather, alltoall and reducescatter copy the rows themselves (no offsets
    or transport): a new buffer, the input left alone, the scale factors both applied."""
    x = np.arange(10, dtype=np.int64).reshape(5, 2)
    gathered = fastring.allgather(x)
    out, received = fastring.alltoall(x, splits=[3])
    assert np.array_equal(gathered, x) and np.array_equal(out, x[:3]) and received.tolist() == [3]
    assert not np.shares_memory(gathered, x) and not np.shares_memory(out, x)
    y = np.arange(6, dtype=np.float64).reshape(3, 2)
    scaled = fastring.reducescatter(y, op=fastring.Sum, prescale_factor=3.0, postscale_factor=0.5)
    assert np.array_equal(scaled, y * 1.5) and np.array_equal(y, np.arange(6.0).reshape(3, 2))
    tenths = np.full(4, 0.1, np.float32)
    assert np.array_equal(fastring.reducescatter(tenths, op=fastring.Average), tenths)
    assert np.array_equal(fastring.reducescatter(tenths, op=fastring.Average, prescale_factor=3.0),
                          tenths * np.float32(3.0))


def test_lean_broadcast_takes_numpy_in_place_calls_alone(initialized, monkeypatch):
    """An in place numpy broadcast too large to ride its cycle builds no parts
    (`_lean_broadcast`) and takes one automatic name; every other call goes the general way,
    which raises on a bad argument as before."""
    collectives = fastring.api.collectives
    engine = fastring._core.runtime.runtime().engine
    general = []
    real = collectives._broadcast_parts
    monkeypatch.setattr(collectives, "_broadcast_parts", lambda *a: general.append(a[1:3]) or real(*a))
    x = np.arange(8192, dtype=np.float32)
    number = int(engine.auto_name("broadcast").rpartition(".")[2])
    assert fastring.broadcast(x, 0, out=x) is x and fastring.broadcast(x, 0, name="w", out=x) is x
    assert fastring.broadcast(x, 0, out=x, process_set=fastring.global_process_set) is x
    assert int(engine.auto_name("broadcast").rpartition(".")[2]) == number + 3  # two calls' names, and this one
    assert general == [] and np.array_equal(x, np.arange(8192, dtype=np.float32))
    assert fastring.broadcast(x, np.int64(0), out=x) is x  # declined: the general path takes the one name
    assert int(engine.auto_name("broadcast").rpartition(".")[2]) == number + 5 and general == [(0, None)]
    general.clear()
    assert fastring.broadcast(x, np.int64(0), out=x, name="a") is x
    assert np.array_equal(fastring.broadcast(x, 0, name="b"), x)  # a new tensor: not in place
    small = np.ones(4, np.float32)  # one rank: no cycle to ride, so lean as well
    assert fastring.broadcast(small, 0, out=small, name="c") is small
    assert general == [(0, "a"), (0, "b")]
    ro = np.zeros(8192, np.float32)
    ro.flags.writeable = False
    for args, error, words in [((x, 1), ValueError, "root_rank"), ((x, True), TypeError, "root_rank"),
                               ((ro, 0), ValueError, "read-only"), ((x[::2], 0), None, ""),
                               ((np.full(8192, "a"), 0), TypeError, "dtype")]:
        general.clear()
        if error is None:  # a strided tensor: through a contiguous copy
            assert fastring.broadcast(*args, out=args[0]) is args[0]
        else:
            with pytest.raises(error, match=words):
                fastring.broadcast(*args, out=args[0])
        assert len(general) == 1, args
    with pytest.raises(TypeError, match="name"):
        fastring.broadcast(x, 0, name=5, out=x)


def test_lean_reducescatter_takes_plain_numpy_calls_alone(initialized, monkeypatch):
    """A numpy reducescatter without scale factors builds no parts (`_lean_reducescatter`), its
    checks kept per (dtype, shape, op); a scale factor, a framework tensor or a refused argument
    goes the general way, which raises as before."""
    collectives = fastring.api.collectives
    general = []
    real = collectives._reducescatter_parts
    monkeypatch.setattr(collectives, "_reducescatter_parts", lambda *a: general.append(a[1:5]) or real(*a))
    monkeypatch.setattr(collectives, "_LEAN_SCATTERS", {})
    x = np.arange(12, dtype=np.int32).reshape(6, 2)
    assert np.array_equal(fastring.reducescatter(x, op=fastring.Sum), x)
    assert np.array_equal(fastring.reducescatter(x, op=fastring.Min, name="m", process_set=fastring.global_process_set), x)
    assert general == [] and np.array_equal(x, np.arange(12, dtype=np.int32).reshape(6, 2))
    assert (x.dtype, x.shape, fastring.Sum) in collectives._LEAN_SCATTERS
    assert np.array_equal(fastring.reducescatter(x, op=fastring.Sum, postscale_factor=2.0), 2 * x)
    assert np.array_equal(fastring.reducescatter(x, op=fastring.Sum, prescale_factor=1), x)  # an int factor
    assert np.array_equal(fastring.reducescatter(bytearray(b"ab"), op=fastring.Max), [97, 98])
    assert [g[0] for g in general] == [fastring.Sum, fastring.Sum, fastring.Max]
    for args, error, words in [((np.ones(2, bool), fastring.Average), TypeError, "bool"),
                               ((np.ones(2), "sum"), ValueError, "op must be"),
                               ((np.array(1.0, np.float32), fastring.Sum), ValueError, "0-d"),
                               ((np.full(2, "a"), fastring.Sum), TypeError, "dtype")]:
        general.clear()
        with pytest.raises(error, match=words):
            fastring.reducescatter(args[0], op=args[1])
        assert len(general) == 1, args
    assert (np.dtype(bool), (2,), fastring.Average) not in collectives._LEAN_SCATTERS


def test_broadcast_out_errors(initialized):
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="shape"):
        fastring.broadcast(x, 0, out=np.zeros(5, np.float32))
    with pytest.raises(TypeError, match="dtype"):
        fastring.broadcast(x, 0, out=np.zeros(4, np.float64))
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        fastring.broadcast_async(x, 0, out=ro)
    assert x.tolist() == [1.0] * 4 and ro.tolist() == [0.0] * 4


def test_broadcast_returns_new_tensor_unless_out(initialized):
    x = np.arange(3.0)
    got = fastring.broadcast(x, 0)
    assert got is not x and np.array_equal(got, x)
    assert fastring.broadcast(x, 0, out=x) is x


def test_zero_size_everywhere(initialized):
    z = np.zeros((0, 2), np.float64)
    assert fastring.allgather(z).shape == (0, 2)
    assert fastring.broadcast(z, 0).shape == (0, 2)
    assert fastring.alltoall(z).shape == (0, 2)
    assert fastring.reducescatter(z).shape == (0, 2)
    assert fastring.allgather(np.zeros((3, 0), np.int8)).shape == (3, 0)


def test_buffer_protocol(initialized):
    assert fastring.allgather(bytearray(b"\x01\x02")).tolist() == [1, 2]
    assert fastring.broadcast(bytearray(b"\x03"), 0).tolist() == [3]


def test_duplicate_name_in_flight(initialized):
    engine = fastring._core.runtime.runtime().engine
    with engine._cycle_lock:  # hold cycles off so that the first request stays in flight
        h = fastring.allgather_async(np.ones(2), name="twice")
        with pytest.raises(ValueError, match="twice"):
            fastring.broadcast_async(np.ones(2), 0, name="twice")
    assert h.wait().tolist() == [1.0, 1.0]


def test_objects_on_one_rank(initialized):
    obj = {"f": lambda x: 2 * x}
    assert fastring.broadcast_object(obj) is obj
    (copy,) = fastring.allgather_object(obj)
    assert copy is not obj and copy["f"](3) == 6
    assert fastring.allgather_object(None) == [None]
    with pytest.raises(fastring.FastringError, match="rank 0.*pickle"):
        fastring.broadcast_object(threading.Lock())
    with pytest.raises(fastring.FastringError, match="rank 0"):
        fastring.allgather_object(threading.Lock())
    assert fastring.allgather_object(5, name="after") == [5]


def test_barrier_on_one_rank(initialized):
    assert fastring.barrier() is None


def test_torch_results_keep_their_type(initialized):
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.bfloat16).reshape(3, 2)
    for got in (fastring.allgather(t), fastring.broadcast(t, 0), fastring.alltoall(t),
                fastring.reducescatter(t, op=fastring.Sum)):
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16 and torch.equal(got, t)
    out, received = fastring.alltoall(t, splits=torch.tensor([2], dtype=torch.int32))
    assert torch.equal(out, t[:2]) and received.dtype == torch.int32 and received.tolist() == [2]
    with pytest.raises(ValueError, match="int32"):
        fastring.alltoall(t, splits=torch.tensor([2]))


def test_own_counts_are_kept_apart_by_kind():
    """The lean path's cycle payloads: an allgather's row count and an alltoall's equal split
    of as many rows each are different payloads; splits the caller gives are built afresh."""
    from types import SimpleNamespace

    import numpy as np

    from fastring.api import collectives as api
    rt = SimpleNamespace(size=3, rank=1)
    gathered = api._own_counts(rt, 5)
    split = api._own_counts(rt, api._equal_rows(5, 3))
    assert gathered[1:] == split[1:] == (api.ReduceOp.Sum, None)  # summed, into a new array
    assert gathered[0].shape == (3,) and gathered[0].tolist() == [0, 5, 0]
    assert split[0].shape == (3, 3) and split[0].tolist() == [[0, 0, 0], [5, 5, 5], [0, 0, 0]]
    assert api._own_counts(rt, 5) is gathered and api._own_counts(rt, api._equal_rows(5, 3)) is split
    given = np.array([1, 2, 3], np.int64)
    first = api._own_counts(rt, given)[0]
    assert first.tolist() == [[0, 0, 0], [1, 2, 3], [0, 0, 0]] and api._own_counts(rt, given)[0] is not first
    assert not gathered[0].flags.writeable and not split[0].flags.writeable


def test_a_reducescatter_plan_is_derived_once_per_signature(monkeypatch):
    """`reduce_scatter_rows` derives its offsets, result shape, scaling and reduction once per
    (shape, dtype, work, ranks, rank); a plan for counts the caller gives is built each call."""
    from types import SimpleNamespace

    import numpy as np

    from fastring._core.dtypes import spec_of
    from fastring._core.ops import ReduceOp
    from fastring._core.work import work_of
    from fastring.algorithms import collectives as coll
    monkeypatch.setattr(coll, "_SCATTER_PLANS", {})
    rt = SimpleNamespace(size=3, rank=1)
    arr = np.zeros((7, 2), np.float32)
    plain = work_of(spec_of(np.float32), ReduceOp.Sum, 1.0, 1.0)
    plan = coll._scatter_plan(rt, arr, plain, None)
    # rows 3, 2, 2 of 8 bytes
    assert plan.offsets.tolist() == [0, 24, 40, 56] and not plan.offsets.flags.writeable
    assert plan.out_shape == (2, 2) and not plan.need_copy and plan.finalize is None
    assert coll._scatter_plan(rt, np.ones((7, 2), np.float32), plain, None) is plan
    assert coll._scatter_plan(SimpleNamespace(size=3, rank=0), arr, plain, None).out_shape == (3, 2)
    assert coll._scatter_plan(SimpleNamespace(size=2, rank=1), arr, plain, None).offsets.tolist() == [0, 32, 56]
    scaled = coll._scatter_plan(rt, arr, work_of(spec_of(np.float32), ReduceOp.Sum, 2.0, 3.0), None)
    assert scaled.need_copy and (scaled.finalize.divisor, scaled.finalize.factor) == (1, 3.0)
    given = np.array([1, 1, 5], np.int64)
    once = coll._scatter_plan(rt, arr, plain, given)
    assert once.offsets.tolist() == [0, 8, 16, 56] and once.out_shape == (1, 2)
    assert coll._scatter_plan(rt, arr, plain, given) is not once and len(coll._SCATTER_PLANS) == 4
    monkeypatch.setattr(coll, "SCATTER_PLANS_KEPT", 4)
    assert coll._scatter_plan(rt, np.zeros(9, np.float32), plain, None).out_shape == (3,)
    assert len(coll._SCATTER_PLANS) == 4  # full: built, not kept


def test_a_reducescatter_decides_its_path_at_each_call(monkeypatch):
    """With one plan kept, each call still goes through the segment or the ring by its bytes
    against SHM_REDUCESCATTER_MAX_BYTES as it stands then; a scaled input is copied to the
    scratch buffer's start for the segment, and past the ring's two chunks for the ring."""
    from types import SimpleNamespace

    import numpy as np

    from fastring._core.dtypes import spec_of
    from fastring._core.ops import ReduceOp
    from fastring._core.work import work_of
    from fastring._transport import array_address
    from fastring.algorithms import collectives as coll
    monkeypatch.setattr(coll, "_SCATTER_PLANS", {})
    ran = []
    scratch = np.zeros(1 << 12, np.uint8)
    segment = SimpleNamespace(reduce_scatter=lambda src, offsets, dst, *rest: ran.append(("segment", src)))
    rt = SimpleNamespace(size=2, rank=1, shm=segment, crosses_hosts=False, transport=None,
                         scratch=lambda nbytes: scratch[:max(nbytes, 1)])
    monkeypatch.setattr(coll, "ring_reduce_scatter_into",
                        lambda t, src, offsets, out, work, *rest: ran.append(("ring", src, work)))
    arr = np.arange(10, dtype=np.float32).reshape(5, 2)  # rows 3 and 2 of 8 bytes
    doubled = work_of(spec_of(np.float32), ReduceOp.Sum, 2.0, 1.0)
    at = array_address(scratch)
    threshold = coll.SHM_REDUCESCATTER_MAX_BYTES
    coll.reduce_scatter_rows(rt, arr, doubled)
    monkeypatch.setattr(coll, "SHM_REDUCESCATTER_MAX_BYTES", 0)
    coll.reduce_scatter_rows(rt, arr, doubled)
    monkeypatch.setattr(coll, "SHM_REDUCESCATTER_MAX_BYTES", threshold)
    coll.reduce_scatter_rows(rt, arr, doubled)
    rt.shm = None
    coll.reduce_scatter_rows(rt, arr, doubled)
    # the ring's scratch: two chunks of 24 bytes, a line's multiple: 64
    assert ran == [("segment", at), ("ring", at + 64, at), ("segment", at), ("ring", at + 64, at)]
    assert np.array_equal(scratch[64:104].view(np.float32), 2 * arr.reshape(-1))
    assert len(coll._SCATTER_PLANS) == 1


def test_broadcast_and_reducescatter_fields_are_one_object_per_signature(monkeypatch, initialized):
    """A broadcast's and a reducescatter's fields are built once per signature and handed out
    as that object, by their parts too (the engine's caches then match them at once); every
    field that must agree across ranks tells signatures apart; a NaN scale factor's fields are
    never kept (a NaN key is never found again); FIELDS_KEPT caps what is kept."""
    from fastring._core.dtypes import spec_of
    from fastring._core.ops import ReduceOp
    from fastring.api import collectives as api
    monkeypatch.setattr(api, "_FIELDS", {})
    monkeypatch.setattr(api, "_EQUAL_SPLITS", {})
    f32 = spec_of(np.float32)
    fields = api._kept_fields(("broadcast", "float32", (4, 2), 1))
    assert fields == (("collective", "broadcast"), ("dtype", "float32"), ("shape", (4, 2)), ("root_rank", 1),
                      ("device", "cpu"))
    assert api._kept_fields(("broadcast", "float32", (4, 2), 1)) is fields
    others = [api._kept_fields(("broadcast", "float64", (4, 2), 1)),
              api._kept_fields(("broadcast", "float32", (8,), 1)),
              api._kept_fields(("broadcast", "float32", (4, 2), 0))]
    assert all(o != fields for o in others) and len(api._FIELDS) == 4
    scatter = api._kept_fields(("reducescatter", "float32", (4,), "Sum", 1.0, 2.0))
    assert scatter == (("collective", "reducescatter"), ("dtype", "float32"), ("shape", (4,)), ("op", "Sum"),
                       ("prescale_factor", 1.0), ("postscale_factor", 2.0), ("device", "cpu"))
    assert api._kept_fields(("reducescatter", "float32", (4,), "Sum", 1.0, 2.0)) is scatter
    assert api._kept_fields(("reducescatter", "float32", (4,), "Min", 1.0, 2.0)) != scatter
    assert api._kept_fields(("reducescatter", "float32", (4,), "Sum", 1.0, 3.0)) != scatter
    assert api._alltoall_parts(np.ones(3, np.float32), None, "x", None)[3] is api._kept_fields(
        ("alltoall", "float32", ()))
    x = np.arange(4, dtype=np.float32)
    assert api._broadcast_parts(x, 0, "b", None, None)[3] is api._broadcast_parts(x.copy(), 0, "b", x, None)[3]
    assert api._reducescatter_parts(x, ReduceOp.Sum, "r", 1.0, 2.0, None)[3] is scatter
    kept = len(api._FIELDS)
    nan = float("nan")
    assert np.isnan(dict(api._kept_fields(("reducescatter", "float32", (4,), "Sum", nan, 1.0)))["prescale_factor"])
    assert len(api._FIELDS) == kept
    from fastring._core.compression import Compression
    from fastring.api import _lean  # the allreduce's fields: the same rule
    monkeypatch.setattr(_lean, "_FIELDS", {})
    assert np.isnan(dict(_lean._fields("allreduce", f32, (4,), ReduceOp.Sum, 1.0, nan, Compression.none))[
        "postscale_factor"]) and _lean._FIELDS == {}
    assert _lean._fields("allreduce", f32, (4,), ReduceOp.Sum, 1.0, 2.0, Compression.none) is _lean._fields(
        "allreduce", f32, (4,), ReduceOp.Sum, 1.0, 2.0, Compression.none)
    monkeypatch.setattr(api, "FIELDS_KEPT", kept)
    full = ("broadcast", "float32", (5,), 0)
    assert api._kept_fields(full) is not api._kept_fields(full)  # full: built each call


def test_a_broadcast_chooses_its_algorithm_once_per_size_and_single_copy(monkeypatch):
    """`broadcast_bytes` asks the registry once per (bytes, single copy on) and runs the kept
    choice; a failed copy that turns single copy off is a new key, so the next call chooses
    again; BROADCAST_CHOICES_KEPT caps what a runtime keeps; one rank or no bytes move nothing."""
    from types import SimpleNamespace

    from fastring.algorithms import registry
    asked, ran = [], []

    def algorithm(name):
        return SimpleNamespace(name=name, run=lambda rt, buf, root: ran.append((name, buf.nbytes, root)))

    def choose(collective, nbytes, rt):
        asked.append((collective, nbytes, rt.transport.single_copy))
        return algorithm("single" if rt.transport.single_copy else "stream")
    monkeypatch.setattr(registry, "choose", choose)
    rt = SimpleNamespace(size=2, transport=SimpleNamespace(single_copy=True), broadcast_algorithms={})
    buf = np.zeros(16, np.uint8)
    registry.broadcast_bytes(rt, buf, 1)
    registry.broadcast_bytes(rt, buf, 0)
    rt.transport.single_copy = False
    registry.broadcast_bytes(rt, buf, 0)
    registry.broadcast_bytes(rt, buf[:8], 0)
    assert asked == [("broadcast", 16, True), ("broadcast", 16, False), ("broadcast", 8, False)]
    assert ran == [("single", 16, 1), ("single", 16, 0), ("stream", 16, 0), ("stream", 8, 0)]
    monkeypatch.setattr(registry, "BROADCAST_CHOICES_KEPT", 3)
    registry.broadcast_bytes(rt, buf[:4], 0)
    registry.broadcast_bytes(rt, buf[:4], 0)
    assert asked[-2:] == [("broadcast", 4, False)] * 2 and len(rt.broadcast_algorithms) == 3
    registry.broadcast_bytes(rt, buf[:0], 0)
    registry.broadcast_bytes(SimpleNamespace(size=1), buf, 0)
    assert len(ran) == 6


def test_an_equal_split_alltoall_derives_its_parts_once(monkeypatch, initialized):
    """`_alltoall_parts` keeps an equal split's fields, row counts and cycle ride per (dtype,
    shape, ranks, rank) and hands out those very objects; splits the caller gives, and calls
    that fail their checks, keep nothing; FIELDS_KEPT caps what is kept."""
    from fastring.api import collectives as api
    monkeypatch.setattr(api, "_EQUAL_SPLITS", {})
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    first = api._alltoall_parts(x, None, "a", None)
    assert first[3] == (("collective", "alltoall"), ("dtype", "float32"), ("trailing_shape", (2,)), ("device", "cpu"))
    assert first[6][0].tolist() == [[3]] and first[4] == x.nbytes  # the ride: this rank's rows to each rank
    assert list(api._EQUAL_SPLITS) == [(x.dtype, (3, 2), 1, 0)]
    derived = []
    for helper in ("_rows_array", "_send_rows", "_own_counts"):
        monkeypatch.setattr(api, helper, lambda *a, _f=getattr(api, helper), _n=helper: derived.append(_n) or _f(*a))
    again = api._alltoall_parts(x + 1, None, "a", None)
    assert derived == [] and again[3] is first[3] and again[6] is first[6]  # looked up, nothing derived
    assert again[5](again[0]).tolist() == (x + 1).tolist()  # this call's tensor (one rank: its own rows)
    api._alltoall_parts(x, [3], "a", None)
    api._alltoall_parts(np.ones(4, np.float64), None, "a", None)
    assert derived == ["_rows_array", "_send_rows", "_own_counts"] * 2
    with pytest.raises(ValueError):
        api._alltoall_parts(np.float32(1.0), None, "a", None)  # 0-d
    with pytest.raises(TypeError):
        api._alltoall_parts(np.ones(2, np.complex64), None, "a", None)
    assert len(api._EQUAL_SPLITS) == 2
    monkeypatch.setattr(api, "FIELDS_KEPT", 2)
    api._alltoall_parts(np.ones(5, np.float64), None, "a", None)
    assert len(api._EQUAL_SPLITS) == 2  # full: derived, not kept
