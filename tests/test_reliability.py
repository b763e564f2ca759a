"""Never silently wrong, never hung: aliasing, integer Average, unnamed calls (threads, local
errors, join), join with every collective, and ranks that leave."""
import pytest


@pytest.mark.parametrize("n", [2, 3])
def test_out_aliasing_the_input(mpirun, n):
    mpirun(n, "aliasing")
