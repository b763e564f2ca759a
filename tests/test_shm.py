"""The one-host shared-memory path: correctness of everything that runs through it at np 2 and 3
(3 ranks on 2 cores: oversubscribed, so the waits must give up their core), and what is left
in /dev/shm after a normal exit, an exception on one rank and a SIGKILLed rank: nothing, and
the next launch works (tests/workers/shm.py). A stalled peer during a transfer through the
segment is an error on time: tests/test_faults.py (stop_transfer, "allreduce (shm)"), and in
the negotiation cycle through it: the same file's stop_negotiation."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from conftest import run_ranks
from fastring.tools import launcher


def segments_of(output: str) -> list[str]:
    """The /dev/shm objects named after the launch's rank 0 (its pid is in `output`)."""
    pid = re.search(r"rank 0 pid (\d+)", output)
    assert pid, output
    return [f for f in os.listdir("/dev/shm") if f.startswith(f"fastring-{pid.group(1)}-")]


@pytest.mark.parametrize("n", [2, 3])
def test_everything_through_the_segment(n):
    proc = run_ranks(n, "shm", "check")
    assert f"OK shm check on {n} ranks" in proc.stdout
    assert segments_of(proc.stdout) == []


def test_ranks_agree_on_the_cores():
    """One rank pinned to one core while the other may use two: every rank runs the large
    allreduce's rounds, not some of them the pipeline (tests/workers/shm_affinity.py)."""
    proc = run_ranks(2, "shm_affinity")
    assert "OK shm affinity on 2 ranks" in proc.stdout


def test_nothing_left_after_a_failed_rank():
    """Neither fastring's segment nor MPICH's (whose name MPICH keeps until MPI_Finalize,
    which a killed or aborted job never reaches)."""
    for case in ("raise", "kill"):
        before = launcher.mpi_segments()
        proc = run_ranks(2, "shm", case, expect_rc=None)
        assert proc.returncode != 0, proc.stdout + proc.stderr
        if case == "raise":
            assert "rank 0: FastringError" in proc.stdout, proc.stdout + proc.stderr
        assert segments_of(proc.stdout) == [], proc.stdout
        assert launcher.mpi_segments() - before == set(), case
    # the next launch works
    assert "OK shm quick on 2 ranks" in run_ranks(2, "shm", "quick").stdout


def test_a_segment_left_by_a_killed_creator_is_removed_by_the_next_launch():
    """A rank 0 SIGKILLed inside attach, between creating its segment and every rank mapping
    it, leaves the name behind; the next launch's rank 0 removes every segment whose creator
    is gone (shm.remove_orphans) and keeps those of live creators."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = f"/dev/shm/fastring-{gone.pid}-{'0' * 12}"
    alive = f"/dev/shm/fastring-{os.getpid()}-{'f' * 12}"
    for path in (orphan, alive):
        open(path, "wb").close()
    try:
        assert "OK shm quick on 2 ranks" in run_ranks(2, "shm", "quick").stdout
        assert not os.path.exists(orphan)
        assert os.path.exists(alive)
    finally:
        for path in (orphan, alive):
            if os.path.exists(path):
                os.unlink(path)


def test_unlink_mapped_takes_only_mapped_names_under_the_prefix(tmp_path):
    from fastring._transport import shm

    prefix = str(tmp_path / "mpich_shm_")
    mapped, unmapped, other = (tmp_path / n for n in ("mpich_shm_a_0", "mpich_shm_b_0", "other_0"))
    for path in (mapped, unmapped, other):
        path.write_bytes(b"x")
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f0000000000-7f0000001000 rw-s 00000000 00:1a 101  {mapped}\n"
        f"7f0000001000-7f0000002000 rw-s 00000000 00:1a 101  {mapped}\n"   # mapped twice
        f"7f0000002000-7f0000003000 rw-s 00000000 00:1a 102  {prefix}gone_0 (deleted)\n"
        f"7f0000003000-7f0000004000 rw-s 00000000 00:1a 103  {other}\n"
        "7f0000004000-7f0000005000 r-xp 00000000 00:00 0    [vdso]\n")
    assert shm.unlink_mapped(prefix, str(maps)) == [str(mapped)]
    assert not mapped.exists() and unmapped.exists() and other.exists()
    assert shm.unlink_mapped(prefix, str(maps)) == []   # already gone: nothing, no error


def test_segment_call_arguments_are_derived_once_per_reduction(monkeypatch):
    """`algorithms.shm._call_args`: the cfuncs, one-step choice and finish of a reduction are
    derived once per (buffer size, dtype, op, message size, division and postscale) and handed
    out again; anything else in the key gives its own. The reduce-after cfunc only from the
    single-copy size."""
    from types import SimpleNamespace

    import numpy as np

    from fastring import kernels
    from fastring._core.config import SHM_ONE_STEP_BYTES
    from fastring._core.dtypes import spec_of
    from fastring._core.ops import KERNEL_OP, ReduceOp
    from fastring._core.work import Finish, nothing
    from fastring.algorithms import shm
    from fastring.algorithms.base import Reduction
    monkeypatch.setattr(shm, "_CALL_ARGS", {})
    seg = SimpleNamespace(tile_bytes=4 << 20, allreduce_single_copy_bytes=(4 << 20) + 1)
    f32 = spec_of(np.float32)

    def args(count, spec=f32, op=ReduceOp.Sum, finish=nothing, on=seg):
        return shm._call_args(on, Reduction(np.zeros(count, spec.dtype), spec, op, finish))
    small, large = SHM_ONE_STEP_BYTES // 4, SHM_ONE_STEP_BYTES // 4 + 1
    plain = args(small)
    assert plain == (kernels.reduce_cfunc(KERNEL_OP[ReduceOp.Sum], f32.dtype), 4, True, (), 0)
    assert args(small) is plain and args(large)[2] is False
    assert args(small, on=SimpleNamespace(tile_bytes=1 << 20, allreduce_single_copy_bytes=0))[2] is True
    assert args(small, on=SimpleNamespace(tile_bytes=small * 4 - 4, allreduce_single_copy_bytes=0))[2] is False
    single = (4 << 20) // 4 + 1
    assert args(single)[4] == kernels.reduce_after_cfunc(KERNEL_OP[ReduceOp.Sum], f32.dtype) != 0
    assert args(single, op=ReduceOp.Max)[4] == kernels.reduce_after_cfunc(KERNEL_OP[ReduceOp.Max], f32.dtype)
    assert args(single - 1)[4] == 0
    assert args(small, op=ReduceOp.Max)[0] == kernels.reduce_cfunc(KERNEL_OP[ReduceOp.Max], f32.dtype)
    f64 = args(small, spec_of(np.float64))
    assert f64[:2] == (kernels.reduce_cfunc(KERNEL_OP[ReduceOp.Sum], np.dtype(np.float64)), 8)
    average = args(small, finish=Finish(2, 1.0))
    assert average[3] == (kernels.finish_cfunc(f32.dtype), 2, 1.0)
    assert args(small, finish=Finish(2, 1.0)) is average
    assert args(small, finish=Finish(1, 3.0))[3][1:] == (1, 3.0)
    assert args(small, finish=Finish(2, 3.0))[3][1:] == (2, 3.0)
    assert args(small, finish=Finish(3, 1.0))[3][1:] == (3, 1.0)
    assert len(shm._CALL_ARGS) == 13
    monkeypatch.setattr(shm, "CALL_ARGS_KEPT", 13)
    assert args(small - 1)[:3] == plain[:3] and len(shm._CALL_ARGS) == 13  # full: derived, not kept


def test_path_times():
    """Which path a single-copy-sized allreduce takes for a buffer (algorithms.shm.PathTimes):
    single copy and the pipeline alternate, single copy first, until each was timed twice, then
    the one with the fastest of its last `kept` times, the other once in `retry` calls times
    choice.retry_every of their times (two calls a try); the table starts over past its size.
    Its docstring example runs too."""
    from fastring.algorithms import shm
    from conftest import check_doctests
    check_doctests((shm,), more_than=3)
    p = shm.PathTimes(retry=3)
    a, b = (1 << 12, 16 << 20), (2 << 12, 16 << 20)
    assert p.prefer_buffers(a) is False
    p.record(a, True, 1e-3)
    assert p.prefer_buffers(a) is True and p.prefer_buffers(b) is False  # per buffer
    p.record(a, False, 0.7e-3)  # the pipeline looks faster, but each path was timed once only
    assert p.prefer_buffers(a) is False
    p.record(a, True, 1e-3)
    assert p.prefer_buffers(a) is True
    p.record(a, False, 2e-3)  # timed twice each: the pipeline takes over, single copy once in
    assert [i for i in range(174) if not p.prefer_buffers(a)] == [86, 173]  # 3 * 29 calls
    p.record(a, False, 5e-3)  # a slower pipelined call: the fastest kept one still counts
    assert p.prefer_buffers(a) is True
    p.record(a, False, 5e-3)  # the fast one has left the kept times: single copy is faster
    assert p.prefer_buffers(a) is False
    q = shm.PathTimes(retry=3)  # a slow first pipelined call does not decide
    q.record(a, True, 1e-3)
    q.record(a, False, 9e-3)
    q.record(a, True, 1e-3)
    assert q.prefer_buffers(a) is True
    q.record(a, False, 0.6e-3)  # 1.67x faster: single copy once in 3 * 45 calls
    assert [i for i in range(270) if not q.prefer_buffers(a)] == [134, 269]
    r = shm.PathTimes(retry=3)  # single copy faster: the pipeline again once in 3 * 27 calls
    for single in (True, False, True, False):
        r.record(a, single, 1e-3 if single else 1.4e-3)
    assert [i for i in range(162) if r.prefer_buffers(a)] == [80, 161]
    r.record(a, False, 4e-3)  # the pipeline 4x slower in its kept times: once in 3 * 200 calls
    r.record(a, False, 4e-3)
    r.record(a, False, 4e-3)
    assert [i for i in range(1200) if r.prefer_buffers(a)] == [437, 1037]
    p.most = 2
    p.record(b, True, 1e-3)
    p.record((3 << 12, 16 << 20), True, 1e-3)
    assert list(p.times) == [(3 << 12, 16 << 20)]
    p.record((3 << 12, 16 << 20), True, 1e-3)
    assert len(p.times[(3 << 12, 16 << 20)][0]) == 2


def test_timed_choice():
    """algorithms.choice.TimedChoice: each way twice in turn, each timed call right after an
    untimed one of the same way, then the one with the lowest of its last times, each warmed
    and timed once more at the end of every period; a way that turns slow loses the choice
    once its last `kept` times are slow, or at once where two timings in a row are more than
    `relearn` times its lowest (the tries start afresh; one such timing alone is dropped and the
    next call timed), one that turns fast wins it at its next timing; a slower way is timed in
    one period of choice.retry_every of their times (three calls a try; here a quarter of the
    calls' time may go to tries, so that the periods stay few); sizes
    of another power of two learn on their own; a period too short to warm and time every way
    is refused. Its docstring example runs too."""
    import pytest
    from conftest import check_doctests
    from fastring.algorithms import choice
    check_doctests((choice,), more_than=1)
    c = choice.TimedChoice(("a", "b"), period=6)
    c.share = 0.25
    cost = {"a": 1.0, "b": 2.0}

    def run(calls):
        ran = []
        for _ in range(calls):
            way, timed = c.pick(1000)
            ran.append(way + ("*" if timed else ""))
            if timed:
                c.record(1000, way, cost[way])
        return ran
    assert run(8) == ["a", "a*", "b", "b*"] * 2
    # calls 8-11 of 6-call periods timed: a in every period, b (2x slower) in one of two
    assert run(12) == ["a", "a*", "a", "a", "a", "a", "a", "a*", "b", "b*", "a", "a"]
    cost["a"] = 3.0  # a turns slow: once its last `kept` timings are all slow, b runs
    ran = run(6 * c.kept)
    assert ran == ["a", "a*", "a", "a", "a", "a", "a", "a*", "b", "b*", "a", "a",
                   "a", "a*", "b", "b*", "b", "b"]
    cost["a"] = 0.5  # a turns fast: its next timing wins it back within a period
    assert run(6)[-2:] == ["a", "a"]
    assert c.pick(1 << 20) == ("a", False)  # another size starts afresh, warming a up
    # a 6x slower at once (the machine's state changed): its next timing is not kept, the
    # next call times it again, and that second slow timing starts the tries afresh; b runs
    # from the end of them, not after `kept` periods (a, 1.5x slower, is timed every period)
    cost["a"] = 3.0
    assert run(15) == ["a", "a*", "a*"] + ["a", "a*", "b", "b*"] * 3
    assert run(6) == ["b", "b", "a", "a*", "b", "b*"]
    # one slow timing alone (a preempted call) is dropped: the next is timed and the choice stays
    cost["b"] = 0.5
    run(64)
    seen, slow_once = [], True
    for _ in range(64):
        way, timed = c.pick(1000)
        seen.append(way + ("*" if timed else ""))
        if timed:
            c.record(1000, way, 5.0 if way == "b" and slow_once else cost[way])
            slow_once = slow_once and way != "b"
    first = seen.index("b*")
    assert seen[first:first + 3] == ["b*", "b*", "b"], seen
    # a way 5x slower is timed (warmed, then timed) in one period of 3 * 4 / (0.25 * 6) = 8
    c, cost = choice.TimedChoice(("a", "b"), period=6), {"a": 1.0, "b": 5.0}
    c.share = 0.25
    run(8)
    assert [i for i, way in enumerate(run(100)) if way[0] == "b"] == [44, 45, 92, 93]
    with pytest.raises(ValueError, match="period of 3 calls cannot warm up and time 2 ways"):
        choice.TimedChoice(("a", "b"), period=3)


def test_retry_every():
    """choice.retry_every: the fewest periods between tries of a slower way that keep the tries
    within `share` of the calls' time, at least one; a way no slower is tried every period."""
    from fastring.algorithms.choice import retry_every
    assert retry_every(2e-3, 1e-3, 1, 64) == 2          # 1/64 would be 1.6%, 1/128 is 0.8%
    assert retry_every(6e-3, 1e-3, 3, 64) == 24
    assert retry_every(6e-3, 1e-3, 3, 64, share=0.05) == 5
    assert retry_every(1e-3, 1e-3, 3, 64) == retry_every(5e-4, 1e-3, 3, 64) == 1
    assert retry_every(1e-3, 0.0, 1, 64) > 10 ** 6     # a chosen way timed at 0: hardly ever
    for slower in (1.01, 1.3, 2.0, 4.5, 17.0):
        for calls, period, share in ((1, 64, 0.01), (3, 64, 0.01), (2, 8, 0.2)):
            k = retry_every(slower, 1.0, calls, period, share)
            cost = lambda periods: calls * (slower - 1.0) / (periods * period * 1.0)
            assert cost(k) <= share * (1 + 1e-9) and (k == 1 or cost(k - 1) > share), (slower, calls, k)


def test_exchanges_of_one_rank():
    """allgather_rows and alltoall_rows of a segment with one rank (in this process): no peer to
    stream to or from, so the rows come back as they were (the alltoall's slot per other rank
    must not divide by none), streamed and not."""
    import numpy as np
    from mpi4py import MPI

    from fastring._transport import Transport, array_address
    from fastring._transport.shm import SharedSegment

    t = Transport(MPI.COMM_WORLD)
    seg, why = SharedSegment.attach(t, 1 << 20, 81920)
    assert why is None
    x = np.arange(15, dtype=np.int64).reshape(5, 3)
    try:
        for stream in (1 << 40, 0):
            seg.stream_exchange_bytes = stream
            counts, out = seg.allgather_rows(array_address(x), 5, 24, lambda c: np.empty((int(c.sum()), 3), np.int64))
            assert counts.tolist() == [5] and np.array_equal(out, x)
            rows, out = seg.alltoall_rows(array_address(x), np.array([5], np.int64), 24,
                                          lambda c: np.empty((int(c.sum()), 3), np.int64))
            assert rows.tolist() == [5] and np.array_equal(out, x)
    finally:
        seg.close()
        t.free()


def test_group_layout_helpers():
    """What a grouped call's lean path reads its group with (_transport.arrays): the layout
    only of C-contiguous numpy arrays of one dtype (else the general path), the pieces' byte
    lengths, and the results as views of one block, refused where they do not fit it. The
    module's docstring examples run too."""
    import numpy as np
    from fastring._transport import arrays, group_of, pieces_of, views_of
    from conftest import check_doctests
    check_doctests((arrays,), more_than=3)
    group = [np.zeros((), np.float32), np.zeros((2, 0)), np.zeros((3, 4), np.float32)]
    assert group_of(group) is None  # mixed dtypes
    assert group_of([group[0], group[2]]) == (np.dtype(np.float32), ((), (3, 4)), 52)
    assert group_of([]) is None and group_of([[1.0]]) is None
    assert group_of([np.zeros(3, np.float32), np.zeros((4, 4), np.float32).T]) is None
    addresses, lengths = pieces_of(group)
    assert lengths.tolist() == [4, 0, 48] and addresses[2] == group[2].ctypes.data
    assert pieces_of([np.zeros(4)[::2]]) is None and pieces_of([bytearray(4)]) is None
    block = np.arange(13, dtype=np.float32)
    views = views_of(block, [group[0], group[2]])
    assert views[0].shape == () and float(views[0]) == 0.0 and views[1].tolist() == block[1:].reshape(3, 4).tolist()
    assert views[1].base is block and views[1].flags.writeable
    for what, call in (("too long", lambda: views_of(block[:12], [group[0], group[2]])),
                       ("another item size", lambda: views_of(block, [np.zeros(2)])),
                       ("a strided block", lambda: views_of(np.zeros(26, np.float32)[::2], [group[0]]))):
        with pytest.raises(ValueError, match="block"):
            call()
