"""The async engine: negotiation, mismatch errors, duplicate names, poll, fusion, timeline,
stall inspector (short times set through the environment)."""
import os
import re

import numpy as np
import pytest

import fastring


@pytest.mark.parametrize("n", [1, 2, 3])
def test_engine_semantics(mpirun, n, tmp_path):
    mpirun(n, "engine", tmp_path / "timeline.json")


STALL_ENV = {"FASTRING_STALL_CHECK_TIME": "1", "FASTRING_STALL_SHUTDOWN_TIME": "3"}


@pytest.mark.parametrize("n", [2, 3])
def test_stall_shutdown_when_a_rank_never_submits(mpirun, n):
    proc = mpirun(n, "stall", "silent", env=STALL_ENV, timeout=120)
    assert "stalled after" in proc.stdout
    waited = float(re.search(r"stalled after ([\d.]+)s", proc.stdout).group(1))
    assert 2.5 <= waited < 30, waited
    assert "stall" in proc.stderr and "rank 1" in proc.stderr


def test_stall_warning_then_completion(mpirun):
    proc = mpirun(2, "stall", "late", env={"FASTRING_STALL_CHECK_TIME": "1"}, timeout=120)
    assert "OK stall late" in proc.stdout
    assert re.search(r"stall: .*rank 1", proc.stderr), proc.stderr


def test_stall_report_names_missing_tensors(mpirun):
    proc = mpirun(2, "stall", "crossed", env=STALL_ENV, timeout=120)
    assert re.search(r"allreduce 'x' has waited .* ranks \[1\] have not submitted it", proc.stderr), proc.stderr
    assert re.search(r"allreduce 'y' has waited .* ranks \[0\] have not submitted it", proc.stderr), proc.stderr
    assert proc.stdout.count("error: stall") == 2, proc.stdout


def test_handles_on_one_rank():
    fastring.init()
    h = fastring.allreduce_async(np.arange(3.0), op=fastring.Sum, name="solo")
    assert fastring.synchronize(h).tolist() == [0.0, 1.0, 2.0]
    assert fastring.poll(h) and h.done()
    assert h.wait().tolist() == [0.0, 1.0, 2.0]  # waiting again returns the same result
    with pytest.raises(TypeError, match="Handle"):
        fastring.synchronize("solo")
    with pytest.raises(TypeError, match="Handle"):
        fastring.poll(None)


def test_handle_outcomes_and_finish_all():
    """The handle (fastring/_transport/handle.pyx): an error is raised on every wait, a result
    returned on every wait, waiters are told once a batch, and finish_all refuses a mismatch."""
    from conftest import check_doctests
    from fastring._transport import handle as handle_module
    from fastring._transport.handle import Handle, finish_all

    class Engine:
        notified = driven = 0

        def _notify_done(self):
            Engine.notified += 1

        def drive(self, handle):  # a cycle that finishes the handle, as Engine.drive would
            Engine.driven += 1
            handle._finish(error=RuntimeError("lost"))

    failed = Handle(Engine(), "f")
    assert not failed.done() and repr(failed) == "<fastring Handle 'f' pending>"
    for _ in range(2):
        with pytest.raises(RuntimeError, match="lost"):
            failed.wait()
    assert Engine.driven == 1 and failed.done() and "done" in repr(failed)
    handles = [Handle(Engine(), str(i)) for i in range(3)]
    finish_all(handles, [None, 0, "x"])
    assert [h.wait() for h in handles] == [None, 0, "x"] and Engine.notified == 2 and Engine.driven == 1
    with pytest.raises(ValueError, match="2 handles but 1 results"):
        finish_all(handles[:2], [1])
    fresh = Handle(Engine(), "g")
    with pytest.raises(TypeError, match="expected Handles"):
        finish_all([fresh, object()], [1, 2])
    assert not fresh.done()  # none marked where one is refused
    finish_all([], [])  # nothing to finish, nobody told
    assert Engine.notified == 2
    check_doctests((handle_module,), more_than=1)
    fastring.init()  # a name of a str subclass, as the api accepts it
    h = fastring.allreduce_async(np.arange(3.0), op=fastring.Sum, name=np.str_("numpy name"))
    assert h.name == "numpy name" and h.wait().tolist() == [0.0, 1.0, 2.0]


def test_grouped_errors():
    fastring.init()
    with pytest.raises(ValueError, match="empty"):
        fastring.grouped_allreduce([])
    with pytest.raises(TypeError, match="list"):
        fastring.grouped_allreduce(np.ones(3))
    with pytest.raises(TypeError, match="dtype"):
        fastring.grouped_allreduce([np.ones(2), np.ones(2, np.float32)])


def test_lone_allreduce_takes_plain_small_calls_only():
    """The latency path runs plain small numpy calls itself and hands everything else to the
    general path (None), which then gives the same result."""
    from fastring.api import allreduce as api

    fastring.init()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = api._lone_allreduce(x, fastring.Average, "lone", None)
    assert got is not None and got is not x and got.shape == (2, 3)
    assert np.array_equal(got, x)
    assert api._lone_allreduce(x, fastring.Sum, None, x) is x  # in place, unnamed
    into = np.empty_like(x)
    assert api._lone_allreduce(x, fastring.Sum, None, into) is into and np.array_equal(into, x)
    assert api._lone_allreduce(x, fastring.Sum, None, np.empty((3, 2), np.float32)) is None  # shape
    assert api._lone_allreduce(x, fastring.Sum, None, np.empty_like(x, np.float64)) is None  # dtype
    assert api._lone_allreduce(x, fastring.Sum, None, np.empty((2, 6), np.float32)[:, ::2]) is None
    assert api._lone_allreduce(np.ones(3, np.float16), fastring.Average, None, None) is None
    assert api._lone_allreduce(np.ones(3, bool), fastring.Average, None, None) is None
    assert api._lone_allreduce(np.ones(3, np.complex64), fastring.Sum, None, None) is None
    big = np.arange(1 << 20, dtype=np.float32)  # above SMALL_MESSAGE_BYTES: the ring, no payload
    got = api._lone_allreduce(big, fastring.Average, None, None)
    assert got is not None and got is not big and np.array_equal(got, big)
    assert api._lone_allreduce(big, fastring.Sum, None, big) is big
    strided = np.ones(8, np.float32)[::2]
    assert api._lone_allreduce(strided, fastring.Sum, None, None) is None
    frozen = np.ones(3, np.float32)
    frozen.flags.writeable = False
    assert api._lone_allreduce(frozen, fastring.Sum, None, frozen) is None
    engine = fastring._core.runtime.runtime().engine
    with engine._cycle_lock:  # a request queued here: not taken, no name consumed
        h = fastring.allreduce_async(np.ones(2), name="queued")
        before = int(engine.auto_name("allreduce").rpartition(".")[2])
        assert api._lone_allreduce(np.ones(3), fastring.Sum, None, None) is None
        assert int(engine.auto_name("allreduce").rpartition(".")[2]) == before + 1
    assert h.wait().tolist() == [1.0, 1.0]
    # the public call with everything the latency path refuses still works
    assert fastring.allreduce(strided, op=fastring.Sum).tolist() == [1.0] * 4
    with pytest.raises(TypeError, match="name"):
        fastring.allreduce(np.ones(3), name=5)


def test_duplicate_name_in_flight_single_rank():
    fastring.init()
    engine = fastring._core.runtime.runtime().engine
    with engine._cycle_lock:  # hold cycles off so that the first request stays in flight
        h = fastring.allreduce_async(np.ones(2), name="twice")
        with pytest.raises(ValueError, match="twice"):
            fastring.allreduce_async(np.ones(2), name="twice")
        with pytest.raises(ValueError, match="twice"):  # the synchronous form too, not a hang
            fastring.allreduce(np.ones(2), name="twice")
    assert h.wait().tolist() == [1.0, 1.0]

    # threads racing to queue one name: exactly one does, every other gets the error
    import sys
    import threading
    outcomes: list = []

    def race():
        try:
            outcomes.append(fastring.allreduce_async(np.ones(2), name="raced", op=fastring.Sum))
        except ValueError as e:
            outcomes.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with engine._cycle_lock:
            threads = [threading.Thread(target=race) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(interval)
    handles = [o for o in outcomes if not isinstance(o, ValueError)]
    assert len(outcomes) == 8 and len(handles) == 1
    assert handles[0].wait().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("negotiated", [False, True])
def test_a_lone_call_whose_cycle_fails_leaves_a_name_another_thread_queued(monkeypatch, negotiated):
    """A synchronous call's lone cycle that the other ranks did not agree on queues its
    request (`Engine._lone_failed`); where another thread submitted the same name meanwhile,
    that thread's request keeps the name and completes, and the call raises the duplicate's
    error instead of replacing it, or, where the cycle's full negotiation found the call's
    fields differ from the other ranks', that mismatch (the other request is not failed)."""
    from fastring._core.runtime import runtime
    from fastring._transport import SPECULATION_FAILED
    from fastring.engine.negotiation import HAS_UNCACHED

    fastring.init()
    engine = runtime().engine
    others, queued = [], []

    def disagreed(name, fields, h, payload, result, reducer):  # another rank proposed something else
        others.append(fastring.allreduce_async(np.arange(2.0), op=fastring.Sum, name=name))  # "another thread"
        return (HAS_UNCACHED if negotiated else 0, SPECULATION_FAILED, 0, 0), engine._neg.words, h

    lone_failed = engine._lone_failed

    def recorded(*args):
        try:
            return lone_failed(*args)
        finally:
            queued.append(engine._pending.get("lone.raced"))  # before any later cycle runs

    monkeypatch.setattr(engine, "_lone_payload", disagreed)
    monkeypatch.setattr(engine, "_lone_failed", recorded)
    monkeypatch.setattr(engine, "_full_negotiation", lambda pending, speculated, report: (
        [], [(r.name, f"mismatch for tensor '{r.name}': shape differs") for r in pending], 0))
    error, words = (fastring.FastringError, "shape differs") if negotiated else (ValueError, "already in flight")
    with pytest.raises(error, match=words):
        fastring.allreduce(np.ones(2), op=fastring.Sum, name="lone.raced")
    monkeypatch.undo()
    (other,) = others
    assert len(queued) == 1 and queued[0] is not None and queued[0].handle is other
    assert other.wait().tolist() == [0.0, 1.0]


def test_timeline_api_validates_path():
    fastring.init()
    with pytest.raises(ValueError, match="path"):
        fastring.start_timeline("")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_join_with_uneven_data(mpirun, n):
    mpirun(n, "join")


def test_a_registered_tensor_adapter_carries_its_framework_in_and_out():
    """A framework registered by module name gets its own type back from every collective."""
    class Box:
        def __init__(self, array):
            self.array = array

    Box.__module__ = "fastring_test_boxes"
    fastring.register_tensor_adapter("fastring_test_boxes", fastring.TensorAdapter(
        lambda t, what: t.array, lambda template, array: Box(array)))
    fastring.init()
    got = fastring.allreduce(Box(np.arange(5, dtype=np.int32)), op=fastring.Sum)
    assert isinstance(got, Box) and got.array.tolist() == [0, 1, 2, 3, 4]
    gathered = fastring.allgather(Box(np.arange(3, dtype=np.int64)))
    assert isinstance(gathered, Box) and gathered.array.tolist() == [0, 1, 2]


def test_scatter_to_arrays_fills_every_array_or_none():
    """The one-call unpacking of a fused batch: byte for byte in order, or nothing at all."""
    from fastring._transport import scatter_to_arrays

    flat = np.arange(10, dtype=np.float32)
    a, b = np.zeros(4, np.float32), np.zeros((2, 3), np.float32)
    assert scatter_to_arrays(flat, [a, b]) is True
    assert a.tolist() == [0, 1, 2, 3] and b.ravel().tolist() == [4, 5, 6, 7, 8, 9]
    frozen = np.zeros(2, np.float32)
    frozen.flags.writeable = False
    for source, targets in ((flat, [np.zeros(4, np.float32), np.zeros(8, np.float32)[::2]]),   # strided
                            (flat, [np.zeros(4, np.float32), frozen]),                        # read-only
                            (flat[:9], [np.zeros(4, np.float32), np.zeros(6, np.float32)]),    # too little
                            (np.arange(20, dtype=np.float32)[::2], [np.zeros(4, np.float32)])):  # strided source
        assert scatter_to_arrays(source, targets) is False
        assert not any(t.any() for t in targets)  # nothing was copied
    with pytest.raises(TypeError):
        scatter_to_arrays(flat, [a, [1.0]])


def test_gather_from_arrays_packs_every_array_or_none():
    """The one-call packing of a fused batch: byte for byte in order, or nothing at all; the
    engine then packs with np.concatenate, which gives the same bytes."""
    from fastring._transport import gather_from_arrays
    from fastring.engine.fusion import _gather

    a, b = np.arange(4, dtype=np.float32), np.arange(4, 10, dtype=np.float32).reshape(2, 3)
    flat = np.full(11, -1, np.float32)
    assert gather_from_arrays(flat, [a, b]) is True
    assert flat.tolist() == list(range(10)) + [-1]  # the start only
    frozen = np.zeros(10, np.float32)
    frozen.flags.writeable = False
    for target, sources in ((np.zeros(10, np.float32), [a, np.arange(12, dtype=np.float32)[::2]]),  # strided
                            (frozen, [a, b]),                                                     # read-only
                            (np.zeros(9, np.float32), [a, b]),                                    # too small
                            (np.zeros(20, np.float32)[::2], [a, b])):                             # strided target
        assert gather_from_arrays(target, sources) is False
        assert not target.any()  # nothing was copied
    with pytest.raises(TypeError):
        gather_from_arrays(flat, [a, [1.0]])
    mixed = np.zeros(10, np.float32)
    assert gather_from_arrays(mixed, [a, b.astype(np.int32)]) is False and not mixed.any()  # bytes never cast
    _gather(mixed, [a, b.astype(np.int32)])  # the fallback casts, as np.concatenate does
    assert mixed.tolist() == list(range(10))
    strided = np.arange(12, dtype=np.float32)[::2]
    out = np.zeros(10, np.float32)
    _gather(out, [a, strided])  # the fallback
    assert out.tolist() == [0, 1, 2, 3, 0, 2, 4, 6, 8, 10]


def test_cache_bits_land_in_their_words_and_read_back_in_order(monkeypatch):
    """A cycle's cache bits: each set bit in its word of the ready (AND) and pending (OR)
    vectors, and the ready ones' requests read back in increasing order of their bits, across
    word boundaries: all of them, with no bit decoded, when every rank had all that this rank
    marked ready, and only those still set when another rank lacked some (the AND words then
    differ from what this rank set) or when asked about requests it did not mark."""
    from fastring._core.runtime import runtime
    from fastring.engine import negotiation
    from fastring.engine.negotiation import HEADER_WORDS, set_bits

    fastring.init()
    engine = runtime().engine
    neg = engine._neg
    words, bits = 3, [130, 0, 63, 64, 5, 191]
    cached = {bit: f"request {bit}" for bit in bits}
    with engine._cycle_lock:  # no cycle of the engine's own in between
        neg.clear_bits(words)
        try:
            neg.set_cached(cached, words)
            block = neg.block
            assert block[HEADER_WORDS:HEADER_WORDS + words].tolist() == [
                1 | 1 << 5 | 1 << 63, 1, 1 << 2 | 1 << 63]
            assert block[HEADER_WORDS + words:HEADER_WORDS + 2 * words].tolist() == \
                block[HEADER_WORDS:HEADER_WORDS + words].tolist()
            with monkeypatch.context() as m:
                m.setattr(negotiation, "set_bits", lambda words: pytest.fail("decoded the bits"))
                assert neg.ready_requests(cached, words) == [f"request {bit}" for bit in sorted(bits)]
            assert neg.ready_requests(dict(cached), words) == [f"request {bit}" for bit in sorted(bits)]
            block[HEADER_WORDS] &= np.uint64(~(1 << 5 | 1 << 63) & (1 << 64) - 1)  # another rank lacked 5 and 63
            block[HEADER_WORDS + 2] &= np.uint64(~(1 << 2) & (1 << 64) - 1)        # ... and 130
            assert neg.ready_requests(cached, words) == ["request 0", "request 64", "request 191"]
            assert neg.ready_requests({}, words) == []
            assert set_bits(np.zeros(2, np.uint64)) == []
        finally:
            neg.clear_bits(words)


def test_the_cycle_sorts_requests_by_the_cache_and_marks_bits_in_c():
    """sort_by_cache: a request is cached when the cache holds its name with the same or
    equal fields, the speculative one is skipped but still counts for a due stall report;
    mark_bits: every bit in its word of both vectors, and nothing written when it refuses."""
    from conftest import check_doctests
    from fastring._transport import cycle, mark_bits, sort_by_cache
    from fastring.engine.negotiation import HEADER_WORDS

    class R:
        def __init__(self, name, fields, next_report=float("inf")):
            self.name, self.fields, self.next_report = name, fields, next_report

    same, equal = ("f", 1), ("f", 1)
    cache = {"a": (4, same), "b": (9, ("f", 2)), "c": (1, equal)}
    a, b, c, d = R("a", same), R("b", ("f", 1)), R("c", tuple(list(equal))), R("d", same)
    assert sort_by_cache([a, c], None, cache, 0.0) == ({4: a, 1: c}, False, False)
    assert sort_by_cache([a, b, c, d], None, cache, 0.0) == ({4: a, 1: c}, True, False)  # b differs, d unknown
    spec = R("d", same, next_report=2.0)
    assert sort_by_cache([a, spec], spec, cache, 1.0) == ({4: a}, False, False)
    assert sort_by_cache([a, spec], spec, cache, 2.0) == ({4: a}, False, True)
    assert sort_by_cache([], None, cache, 5.0) == ({}, False, False)

    block = np.zeros(HEADER_WORDS + 4, np.uint64)
    assert mark_bits(block, 2, [127, 0, 64, 0]) == [1, 1 | 1 << 63]
    assert block[HEADER_WORDS:].tolist() == [1, 1 | 1 << 63] * 2 and not block[:HEADER_WORDS].any()
    assert mark_bits(block, 0, []) == []
    frozen = np.zeros(HEADER_WORDS + 4, np.uint64)
    frozen.flags.writeable = False
    for bad_block, words, bits in ((block, 2, [128]), (block, 2, [-1]), (block, 2, [1 << 70]), (block, 3, [0]), (frozen, 2, [0]),
                                   (block.astype(np.int64), 2, [0]), (np.zeros(2 * HEADER_WORDS + 8, np.uint64)[::2], 2, [0])):
        before = bad_block.copy()
        with pytest.raises(ValueError):
            mark_bits(bad_block, words, bits)
        assert (bad_block == before).all()  # nothing written
    check_doctests((cycle,), more_than=1)


def test_a_work_derives_what_it_reduces_in_and_a_request_whether_it_rides_the_cycle():
    """AllreduceWork's derived values, computed once, against what they mean (an integer
    Average splits into int64 quotients and remainders, compression reduces in float32 or
    float64), and Request.rides_cycle's kept answer against the registry's for every size."""
    from fastring import algorithms
    from fastring._core.compression import Compression
    from fastring._core.config import SMALL_MESSAGE_BYTES
    from fastring._core.dtypes import spec_of
    from fastring._core.ops import ReduceOp
    from fastring._core.work import work_of
    from fastring.engine.request import Request

    cases = [("int32", ReduceOp.Average, Compression.none, True, "int64", ReduceOp.Sum, "int64"),
             ("bool", ReduceOp.Average, Compression.none, False, "bool", ReduceOp.Average, "bool"),
             ("int32", ReduceOp.Sum, Compression.none, False, "int32", ReduceOp.Sum, "int32"),
             ("float16", ReduceOp.Average, Compression.none, False, "float16", ReduceOp.Average, "float16"),
             ("float16", ReduceOp.Average, Compression.fp16, False, "float32", ReduceOp.Average, "float16"),
             ("float64", ReduceOp.Max, Compression.bf16, False, "float64", ReduceOp.Max, "float64")]
    for dtype, op, compression, splits, accumulator, reduce_op, reduced in cases:
        work = work_of(spec_of(dtype), op, 1.0, 1.0, compression)
        assert (work.splits_average, work.accumulator, work.reduce_op, work.reduced_spec.name) == \
            (splits, np.dtype(accumulator), reduce_op, reduced), dtype
    for work in (work_of(spec_of("float32"), ReduceOp.Sum, 1.0, 1.0),
                 work_of(spec_of("int32"), ReduceOp.Average, 1.0, 1.0),
                 work_of(spec_of("float32"), ReduceOp.Sum, 1.0, 1.0, Compression.fp16)):
        for nbytes in (4, SMALL_MESSAGE_BYTES // 2, SMALL_MESSAGE_BYTES, SMALL_MESSAGE_BYTES + 4):
            for _ in range(2):  # asked, then kept
                rides = Request("allreduce", "r", (), nbytes, None, work).rides_cycle
                assert rides == (algorithms.choose("allreduce", work.reduced_nbytes(nbytes), work.reduced_spec,
                                                   wire=work.compression.wire) is algorithms.InCycle)
    assert Request("allreduce", "r", (), 4, None).rides_cycle is False  # not an allreduce


def test_the_cache_keeps_the_fields_object_the_api_hands_out():
    """Requests first agreed by a full negotiation (their fields gathered as copies) are
    cached with this rank's own fields object, so that later cycles recognise them by
    identity; an entry holding equal fields built anew takes the object it is given."""
    from fastring._core.runtime import runtime
    from fastring.api.allreduce import _plain_plan

    fastring.init()
    neg = runtime().engine._neg
    arrays = [np.full(5, i, np.float32) for i in range(4)]
    handles = [fastring.allreduce_async(a, op=fastring.Sum, name=f"identity.{i}", out=a)
               for i, a in enumerate(arrays)]
    assert [fastring.synchronize(h).tolist() for h in handles] == [[float(i)] * 5 for i in range(4)]
    fields = _plain_plan(arrays[0], fastring.Sum)[1]
    assert all(neg.cache[f"identity.{i}"][1] is fields for i in range(4))
    bit = neg.cache["identity.0"][0]
    copy = tuple(list(fields))
    assert copy == fields and copy is not fields
    neg.remember("identity.0", copy)
    assert neg.cache["identity.0"] == (bit, fields) and neg.cache["identity.0"][1] is copy


def test_the_lean_path_makes_the_request_its_init_would(monkeypatch):
    """The queued plain allreduce's Request and Entry, made in C without their __init__, hold
    exactly what __init__ with the same values and the defaults would give (a field added to
    either class fails here and at import), are tracked by the garbage collector, and reduce."""
    import dataclasses
    import gc
    import sys

    from fastring._core.runtime import runtime
    from fastring._core.work import Entry
    from fastring.api import _lean
    from fastring.engine.request import Request

    fastring.init()
    engine = runtime().engine
    made = []
    monkeypatch.setattr(engine, "submit", lambda request: made.append(request) or request.handle)
    a = np.arange(6, dtype=np.float32)
    before = sys.getrefcount(a)
    handle = fastring.allreduce_async(a, op=fastring.Sum, name="lean.record", out=a)
    monkeypatch.undo()
    (request,) = made
    made.clear()
    assert sys.getrefcount(a) == before + 4  # the entry's src, work, target and result
    plan = _lean._plain_plan(a, fastring.Sum)
    assert type(request) is Request and type(request.entries[0]) is Entry
    # no reference leaked: each is held here (the request) or by its list (the entry) alone
    baseline = Request("x", "x", (), 0, None)
    assert sys.getrefcount(request) == sys.getrefcount(baseline)
    held = [Entry(a, a, a, a)]
    assert sys.getrefcount(request.entries[0]) == sys.getrefcount(held[0])
    del baseline, held
    expected = Request("allreduce", "lean.record", plan[1], a.nbytes, handle, plan[2], [Entry(a, a, a, a)])
    for f in dataclasses.fields(Request):
        got, want = getattr(request, f.name), getattr(expected, f.name)
        if f.name == "entries":
            assert type(got) is list and len(got) == 1
            assert all(getattr(got[0], n) is a for n in ("src", "work", "target", "result"))
        else:
            assert got == want or (got is want), f.name
    assert request.fields is plan[1] and request.allreduce is plan[2]
    del expected
    assert engine.submit(request) is handle and handle.wait() is a and a.tolist() == list(range(6))
    del request, handle
    gc.collect()
    assert sys.getrefcount(a) == before  # every reference the request took is given back


def test_a_record_refuses_a_class_it_cannot_make():
    """`_Record` is built only for a slots dataclass whose leading fields are the ones named,
    in their order, whose other fields have plain defaults, with no __post_init__: anything
    else raises when the module is imported."""
    import dataclasses

    from fastring._core.work import Entry
    from fastring.api._lean import _Record

    @dataclasses.dataclass(slots=True)
    class Checked:
        a: int

        def __post_init__(self):
            pass

    @dataclasses.dataclass
    class Unslotted:
        a: int

    @dataclasses.dataclass(slots=True)
    class Many:
        a0: int; a1: int; a2: int; a3: int; a4: int; a5: int; a6: int; a7: int  # noqa: E702
        a8: int; a9: int; a10: int; a11: int; a12: int; a13: int; a14: int; a15: int; a16: int  # noqa: E702

    @dataclasses.dataclass(slots=True)
    class Factory:
        a: int
        b: list = dataclasses.field(default_factory=list)

    class Renewed(Entry):
        __slots__ = ()

        def __new__(cls, *args):
            return super().__new__(cls)

    _Record(Entry, ("src", "work", "target", "result"))
    with pytest.raises(TypeError, match=r"fields are \('src', 'work', 'target', 'result'\)"):
        _Record(Entry, ("src", "work", "result", "target"))
    with pytest.raises(TypeError, match="fields are"):
        _Record(Entry, ("src", "work", "target"))
    with pytest.raises(TypeError, match="fields are"):
        _Record(Entry, ("src", "work", "target", "result", "extra"))
    with pytest.raises(TypeError, match="b has no plain default"):
        _Record(Factory, ("a",))
    with pytest.raises(TypeError, match="cannot be made without its __init__"):
        _Record(Checked, ("a",))
    with pytest.raises(TypeError, match=r"Unslotted\.a is not a slot"):
        _Record(Unslotted, ("a",))
    with pytest.raises(TypeError, match="more than 16 fields"):
        _Record(Many, tuple(f"a{i}" for i in range(17)))
    with pytest.raises(TypeError, match="Renewed cannot be made"):
        _Record(Renewed, ("src", "work", "target", "result"))
    with pytest.raises(TypeError, match=r"Sub\.src is not a slot"):  # the parent's slot
        _Record(type("Sub", (Entry,), {"__slots__": ()}), ("src", "work", "target", "result"))
    with pytest.raises(TypeError):
        _Record(int, ())  # not a dataclass


def test_lean_doctests():
    from conftest import check_doctests

    from fastring.api import _lean

    check_doctests((_lean,), more_than=0)


def test_automatic_names_hash_apart_alike_on_every_process():
    """An automatic name's hash (its prefix and fields digested once, XOR its number): distinct
    numbers, prefixes and fields give distinct hashes; equal fields built anew give the same;
    another process (another PYTHONHASHSEED) gets the same; names that only look automatic
    (a padded or non-ASCII number) are digested whole, so they do not alias a real one, and a
    name that spells an automatic one's prefix does not alias it either."""
    import subprocess
    import sys

    from fastring._core.runtime import runtime
    from fastring.engine.negotiation import SPECULATION_FAILED

    fastring.init()
    neg = runtime().engine._neg
    fields = (("collective", "allreduce"), ("shape", (3,)))
    hashes = [neg.signature_hash(f"allreduce.noname.{i}", fields) for i in range(2000)]
    assert len(set(hashes)) == 2000 and not {0, SPECULATION_FAILED} & set(hashes)
    assert neg.signature_hash("allreduce.noname.7", (("collective", "allreduce"), ("shape", (3,)))) == hashes[7]
    others = [neg.signature_hash("allgather.noname.7", fields), neg.signature_hash("allreduce.noname.7", fields[:1]),
              neg.signature_hash("allreduce.noname.07", fields), neg.signature_hash("allreduce.noname.\u0667", fields),
              neg.signature_hash("allreduce.noname.7a", fields), neg.signature_hash("allreduce.7", fields),
              neg.signature_hash("allreduce", fields), neg.signature_hash("allreduce.noname.", fields)]
    # ...nor does an automatic name alias a name that spells its prefix (XOR 0 keeps the base)
    assert neg.signature_hash("allreduce.noname.0", fields) not in others
    assert len(set(others)) == len(others) and not set(others) & set(hashes)
    code = ("import fastring; from fastring._core.runtime import runtime; fastring.init(); "
            "print(runtime().engine._neg.signature_hash('allreduce.noname.7', "
            "(('collective', 'allreduce'), ('shape', (3,)))))")
    elsewhere = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True)
    assert int(elsewhere.stdout.split()[-1]) == hashes[7]


def test_the_background_thread_leaves_a_burst_to_its_submitter_for_a_bounded_time():
    """The background thread's decision at each look (Gate.decide, once a cycle time): with
    nothing queued, run a cycle if another rank still has work, else look again until nothing
    was submitted for POLL_IDLE_CYCLES, then wait for a wake-up (IDLE); a queue whose
    submissions keep coming, or that a thread drives itself, is left alone until its oldest
    request has waited BURST_MOST_CYCLES cycle times (or those left after this thread's last
    cycle, since it); a quiet queue nobody drives runs now; a closed gate stops; a wait looks
    first a cycle time after its call. Its docstring example runs too."""
    from fastring._core.config import BURST_MOST_CYCLES, BURST_QUIET_CYCLES, POLL_IDLE_CYCLES
    from fastring._transport.gate import IDLE, RUN, STOP, Gate

    queue: dict = {}
    gate = Gate(queue, BURST_QUIET_CYCLES, BURST_MOST_CYCLES, POLL_IDLE_CYCLES)
    cycle, now = 0.001, 1000.0
    most, quiet = BURST_MOST_CYCLES * cycle, BURST_QUIET_CYCLES * cycle
    gate.submitted(now - 0.9 * POLL_IDLE_CYCLES * cycle)
    assert gate.decide(now, cycle) is None                       # idle, but not for long
    gate.submitted(now - 1.1 * POLL_IDLE_CYCLES * cycle)
    assert gate.decide(now, cycle) == IDLE
    gate.keep_cycling = True                                     # another rank has work
    assert gate.decide(now, cycle) == RUN

    gate.submitted(now - 0.5 * most)                             # the oldest (told, then queued)
    queue["a"] = object()
    gate.submitted(now - 0.9 * quiet)                            # still coming
    queue["b"] = object()
    assert gate.decide(now, cycle) is None
    gate.keep_cycling = False
    assert gate.decide(now, cycle) is None
    assert gate.decide(now + 1.1 * quiet, cycle) == RUN           # quiet, and nobody drives
    gate.drivers = 1                                             # quiet, but driven...
    assert gate.decide(now + 1.2 * quiet, cycle) is None         # (the run above began a new wait)
    assert gate.decide(now + 1.1 * quiet + 0.9 * most, cycle) is None
    assert gate.decide(now + 1.1 * quiet + 1.1 * most, cycle) == RUN  # ...until it waited long enough

    queue.clear()                                                # a new burst: its first request
    gate.submitted(now + 10 * most)                              # is the oldest
    queue["c"] = object()
    assert gate.decide(now + 10.9 * most, cycle) is None
    assert gate.decide(now + 11.1 * most, cycle) == RUN
    gate.close()
    assert gate.decide(now, cycle) == STOP
    assert gate.wait(cycle) == STOP

    # the first look comes a cycle time after the call: the thread's cycles come no faster
    import time
    pacing = Gate({}, BURST_QUIET_CYCLES, BURST_MOST_CYCLES, POLL_IDLE_CYCLES)
    pacing.keep_cycling = True
    start = time.monotonic()
    assert pacing.wait(0.02) == RUN
    assert time.monotonic() - start >= 0.02

    from conftest import check_doctests
    from fastring._transport import gate as gate_module
    check_doctests((gate_module,), more_than=5)


def test_a_submission_wakes_a_background_thread_idle_for_long():
    """After POLL_IDLE_CYCLES cycle times with no submission the background thread waits in
    Python for a wake-up: a request nobody waits on still completes."""
    import time

    from fastring._core.config import POLL_IDLE_CYCLES
    from fastring._core.runtime import runtime

    fastring.init()
    fastring.allreduce_async(np.ones(2), op=fastring.Sum, name="idle.first").wait()  # the thread exists
    engine = runtime().engine
    time.sleep(3 * POLL_IDLE_CYCLES * engine.config.cycle_time_ms / 1000.0)
    assert engine._asleep  # waiting to be woken
    h = fastring.allreduce_async(np.arange(3.0), op=fastring.Sum, name="idle.second")
    deadline = time.monotonic() + 10.0
    while not h.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert h.done()
    assert h.wait().tolist() == [0.0, 1.0, 2.0]


def test_a_steady_stream_of_submissions_still_completes_without_a_wait():
    """Requests nobody waits on complete while more keep coming: the background thread leaves
    a burst alone only until its oldest request has waited BURST_MOST_CYCLES cycle times (5 ms
    by default), and this stream lasts far longer."""
    import time

    fastring.init()
    first = fastring.allreduce_async(np.arange(4.0), op=fastring.Sum, name="stream.first")
    handles, deadline = [], time.monotonic() + 10.0
    while not first.done() and time.monotonic() < deadline and len(handles) < 20000:
        handles.append(fastring.allreduce_async(np.ones(2), op=fastring.Sum, name=f"stream.{len(handles)}"))
        time.sleep(0.0001)
    assert first.done(), f"not completed after {len(handles)} more submissions"
    assert fastring.synchronize(first).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert all(fastring.synchronize(h).tolist() == [1.0, 1.0] for h in handles)


def test_a_lean_allreduce_above_the_cycle_chooses_its_algorithm_once(monkeypatch):
    """`Engine._lone_algorithm`: a synchronous allreduce too large for the cycle takes the
    algorithm `algorithms.choose` gives for its size and dtype under the engine's setting,
    chosen once per (size, dtype) and then looked up, LONE_CALLS_KEPT of them; the result is
    still reduced."""
    from fastring import algorithms
    from fastring._core.config import SMALL_MESSAGE_BYTES
    from fastring._core.dtypes import spec_of
    from fastring._core.runtime import runtime
    from fastring.engine import engine as engine_module

    fastring.init()
    engine = runtime().engine
    monkeypatch.setattr(engine, "_lone_algorithms", {})
    f32, f64 = spec_of(np.float32), spec_of(np.float64)
    nbytes = SMALL_MESSAGE_BYTES + 4
    chosen = engine._lone_algorithm(nbytes, f32)
    expected = algorithms.choose("allreduce", nbytes, f32, rt=engine.rt, setting=engine.config.algorithm,
                                 may_ride_cycle=False)
    assert chosen == (expected, f"allreduce ({expected.name})")
    assert engine._lone_algorithm(nbytes, f32) is chosen and engine._lone_algorithm(nbytes, f64) is not chosen
    ran = []

    class Spy:  # the kept choice is the one that runs
        name = "spy"

        @staticmethod
        def run(rt, reduction):
            ran.append(engine._executor.running[0])
            expected.run(rt, reduction)
    engine._lone_algorithms[(nbytes, "float32")] = (Spy, "allreduce (spy)")
    x = np.arange(nbytes // 4, dtype=np.float32)
    assert np.array_equal(fastring.allreduce(x, op=fastring.Sum, name="lean.large"), x) and ran == ["allreduce (spy)"]
    assert list(engine._lone_algorithms) == [(nbytes, "float32"), (nbytes, "float64")]
    monkeypatch.setattr(engine_module, "LONE_CALLS_KEPT", 2)
    assert engine._lone_algorithm(2 * nbytes, f32)[0] is algorithms.choose(
        "allreduce", 2 * nbytes, f32, rt=engine.rt, setting=engine.config.algorithm, may_ride_cycle=False)
    assert len(engine._lone_algorithms) == 2  # full: chosen, not kept
