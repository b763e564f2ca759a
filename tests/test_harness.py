"""The test harness itself: a hung job is stopped with all its ranks, and a failing rank ends
its job quickly."""
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


def test_failed_assert_ends_the_job_without_waiting_for_the_timeout():
    proc = conftest.run_ranks(2, "harness", "assert", marker(), expect_rc=1, timeout=60)
    assert "AssertionError: arithmetic is broken on rank 1" in proc.stderr
    assert "fastring-run: rank 1 exited with code 1; stopping the job" in proc.stderr
