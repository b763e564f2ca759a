"""Never silently wrong, never hung: aliasing, integer Average, unnamed calls (threads, local
errors, join), join with every collective, and ranks that leave."""
import pytest


@pytest.mark.parametrize("n", [2, 3])
def test_out_aliasing_the_input(mpirun, n):
    mpirun(n, "aliasing")


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", ["threads", "local_error", "join"])
def test_unnamed_calls_stay_paired(mpirun, n, case):
    env = {"FASTRING_STALL_CHECK_TIME": "1", "FASTRING_STALL_SHUTDOWN_TIME": "3"} if case == "local_error" else {}
    mpirun(n, "unnamed", case, env=env, timeout=120)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", ["exit_while_others_wait", "pending_async_at_exit", "shutdown_then_wait"])
def test_a_rank_leaving_never_blocks_the_others(mpirun, n, case):
    proc = mpirun(n, "leave", case, timeout=60)
    if case == "exit_while_others_wait":
        assert proc.stdout.count("got the error") == n - 1, proc.stdout
    elif case == "pending_async_at_exit":
        assert proc.stdout.count("leaving") == n, proc.stdout
    else:
        assert proc.stdout.count("done") == n, proc.stdout


@pytest.mark.parametrize("n", [1, 2, 3])
def test_integer_average_is_exact(mpirun, n):
    mpirun(n, "int_average", timeout=120)


@pytest.mark.parametrize("n", [2, 3])
def test_join_with_allgather_broadcast_barrier(mpirun, n):
    mpirun(n, "join_collectives", timeout=120)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("nbytes", [64, 1 << 20])
def test_a_late_rank_is_an_error_on_time(mpirun, n, nbytes):
    proc = mpirun(n, "late", nbytes, env={"FASTRING_STALL_SHUTDOWN_TIME": "2"}, timeout=60)
    assert proc.stdout.count("FastringError after") == n, proc.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_late_to_init_is_warned_about(mpirun, n):
    """init's first exchange waits like any collective: a warning every
    FASTRING_STALL_CHECK_TIME while a rank has not called init, then a normal start."""
    proc = mpirun(n, "late_init", "late", env={"FASTRING_STALL_CHECK_TIME": "0.5"}, timeout=60)
    assert f"OK late init late on {n} ranks" in proc.stdout, proc.stdout
    for r in range(n - 1):
        assert f"fastring.init on rank {r} has waited" in proc.stderr, proc.stderr
    assert f"rank {n - 1} has waited" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_that_never_calls_init_is_an_error_on_time(mpirun, n):
    """A rank that never calls init used to leave the others in init for ever (here: until it
    left 60 s later); with FASTRING_STALL_SHUTDOWN_TIME=1 their init raises FastringError
    within 3 s, and the launcher's guard ends the job."""
    proc = mpirun(n, "late_init", "never", env={"FASTRING_STALL_SHUTDOWN_TIME": "1"}, timeout=40,
                  expect_rc=None)
    assert proc.returncode != 0
    assert proc.stdout.count("init raised after") == n - 1, proc.stdout + proc.stderr
    assert "not every one of the" in proc.stdout and "FAIL" not in proc.stdout, proc.stdout
