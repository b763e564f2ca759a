"""int16, uint16, uint32 and uint64 through every collective and allreduce algorithm, numpy
and torch tensors, at 2 and 3 ranks (tests/workers/wide_int_dtypes.py)."""
import pytest


@pytest.mark.parametrize("n,framework", [(2, "numpy"), (3, "torch")])
def test_wide_int_dtypes(mpirun, n, framework):
    if framework == "torch":
        pytest.importorskip("torch")
    mpirun(n, "wide_int_dtypes", framework)
