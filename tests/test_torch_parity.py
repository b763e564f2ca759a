"""Horovod parity of fastring.torch beyond the everyday surface (tests/workers/torch_parity.py
at 2 and 3 ranks: grouped allgather/reducescatter, gradients against finite differences,
error classes, sparse gradients, broadcast_optimizer_state for every optimizer,
SyncBatchNorm) and Adasum (tests/workers/adasum.py at 2 and 4 ranks)."""
import pytest

pytest.importorskip("torch")


@pytest.mark.parametrize("n", [2, 3])
def test_torch_parity(mpirun, n):
    mpirun(n, "torch_parity")


@pytest.mark.parametrize("n", [2, 4])
def test_adasum(mpirun, n):
    mpirun(n, "adasum")
