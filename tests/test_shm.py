"""The one-host shared-memory path: correctness of everything that runs through it at np 2 and 3
(3 ranks on 2 cores: oversubscribed, so the waits must give up their core), and what is left
in /dev/shm after a normal exit, an exception on one rank and a SIGKILLed rank: nothing, and
the next launch works (tests/workers/shm.py). A stalled peer during a transfer through the
segment is an error on time: tests/test_faults.py (stop_transfer, "allreduce (shm)"), and in
the negotiation cycle through it: the same file's stop_negotiation."""
from __future__ import annotations

import os
import re

import pytest

from conftest import run_ranks


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


def test_nothing_left_after_a_failed_rank():
    for case in ("raise", "kill"):
        proc = run_ranks(2, "shm", case, expect_rc=None)
        assert proc.returncode != 0, proc.stdout + proc.stderr
        if case == "raise":
            assert "rank 0: FastringError" in proc.stdout, proc.stdout + proc.stderr
        assert segments_of(proc.stdout) == [], proc.stdout
    # the next launch works
    assert "OK shm quick on 2 ranks" in run_ranks(2, "shm", "quick").stdout


def test_path_times():
    """Which path a single-copy-sized allreduce takes for a buffer (algorithms.shm.PathTimes):
    single copy and the pipeline alternate, single copy first, until each was timed twice, then
    the one with the fastest of its last `kept` times, the other every `retry` calls; the table
    starts over past its size. Its docstring example runs too."""
    from fastring.algorithms import shm
    from conftest import check_doctests
    check_doctests((shm,), more_than=3)
    p = shm.PathTimes(retry=3)
    a, b = (1 << 12, 16 << 20), (2 << 12, 16 << 20)
    assert p.prefer_buffers(a) is False
    p.record(a, True, 1e-3)
    assert p.prefer_buffers(a) is True and p.prefer_buffers(b) is False  # per buffer
    p.record(a, False, 0.5e-3)  # the pipeline looks faster, but each path was timed once only
    assert p.prefer_buffers(a) is False
    p.record(a, True, 1e-3)
    assert p.prefer_buffers(a) is True
    p.record(a, False, 2e-3)  # timed twice each: the pipeline takes over, single copy every third call
    assert [p.prefer_buffers(a) for _ in range(6)] == [True, True, False, True, True, False]
    p.record(a, False, 5e-3)  # a slower pipelined call: the fastest kept one still counts
    assert p.prefer_buffers(a) is True
    p.record(a, False, 5e-3)  # the fast one has left the kept times: single copy is faster
    assert p.prefer_buffers(a) is False
    q = shm.PathTimes(retry=3)  # a slow first pipelined call does not decide
    q.record(a, True, 1e-3)
    q.record(a, False, 9e-3)
    q.record(a, True, 1e-3)
    assert q.prefer_buffers(a) is True
    q.record(a, False, 0.6e-3)
    assert [q.prefer_buffers(a) for _ in range(3)] == [True, True, False]
    r = shm.PathTimes(retry=3)  # single copy faster: the pipeline again every third call
    for single in (True, False, True, False):
        r.record(a, single, 1e-3 if single else 2e-3)
    assert [r.prefer_buffers(a) for _ in range(6)] == [False, False, True, False, False, True]
    p.most = 2
    p.record(b, True, 1e-3)
    p.record((3 << 12, 16 << 20), True, 1e-3)
    assert list(p.times) == [(3 << 12, 16 << 20)]
    p.record((3 << 12, 16 << 20), True, 1e-3)
    assert len(p.times[(3 << 12, 16 << 20)][0]) == 2
