"""The test harness itself: a hung job is stopped with all its ranks, a failing rank ends its
job quickly, and a worker reports every failed check, not only the first."""
import pytest

import conftest
from process_tools import kill_survivors, marker, survivors


def test_pytest_timeout_is_longer_than_the_job_timeout(request):
    """A hung job must fail in run_ranks, which stops its ranks and shows their output, before
    pytest-timeout fails the test with neither."""
    assert request.config.getini("timeout") == "300"
    assert conftest.RANKS_TIMEOUT < float(request.config.getini("timeout"))


def test_hung_job_is_stopped_with_all_its_ranks():
    """Rank 1 and a process it started in a session of its own ignore SIGTERM (see harness.py)."""
    mark = marker()
    try:
        with pytest.raises(pytest.fail.Exception) as failed:
            conftest.run_ranks(2, "harness", "hang", mark, timeout=10)
        message = str(failed.value)
        assert "harness hang" in message and "timed out after 10" in message
        assert "stopped 2 ranks" in message
        assert "rank 0 ready" in message and "rank 1 ready" in message  # the output so far
        assert survivors(mark) == ""
    finally:
        kill_survivors(mark)


def test_every_failed_check_is_reported():
    proc = conftest.run_ranks(2, "harness", "checks", marker(), expect_rc=1, timeout=60)
    out = proc.stdout
    assert "[rank 1/2] FAIL first sum: 3 wrong elements" in out
    assert "[rank 1/2] FAIL second sum: error 1.0 > bound" in out
    assert "[rank 1/2] 2 failed checks:\n  first sum" in out
    assert "FAILED harness checks on 2 ranks: failed checks per rank [0, 2]" in out
    assert "[rank 0/2] FAIL" not in out and "OK" not in out


def test_failures_not_reported_by_done_still_fail_the_job():
    proc = conftest.run_ranks(2, "harness", "unreported", marker(), expect_rc=1, timeout=60)
    assert "[rank 1/2] 1 failed check:\n  never reported: 2 wrong elements" in proc.stdout


def test_failed_assert_ends_the_job_without_waiting_for_the_timeout():
    proc = conftest.run_ranks(2, "harness", "assert", marker(), expect_rc=1, timeout=60)
    assert "AssertionError: arithmetic is broken on rank 1" in proc.stderr
    assert "fastring-run: rank 1 exited with code 1; stopping the job" in proc.stderr
