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
