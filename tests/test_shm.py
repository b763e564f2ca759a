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
