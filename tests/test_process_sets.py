"""Process sets (fastring.add_process_set, process_set= on every collective, core and
fastring.torch): the multi-rank suite at 2 and 3 ranks, and a stall inside one set."""
import pytest

pytest.importorskip("torch")


@pytest.mark.parametrize("n", [2, 3])
def test_process_sets(mpirun, n):
    mpirun(n, "process_sets")


def test_stall_inside_a_set(mpirun):
    mpirun(3, "process_set_stall", env={"FASTRING_STALL_CHECK_TIME": "1", "FASTRING_STALL_SHUTDOWN_TIME": "2"})
