"""Multi-rank test harness: `mpirun(n, worker, *args)` runs tests/workers/<worker>.py on n
ranks through the mpiexec installed beside this Python and fails with every rank's output."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def run_ranks(n: int, worker: str, *args: str, env: dict | None = None, timeout: float = 600,
              expect_rc: int | None = 0) -> subprocess.CompletedProcess:
    cmd = [MPIEXEC, "-n", str(n), sys.executable, str(WORKERS / f"{worker}.py"), *map(str, args)]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"{worker} on {n} ranks timed out after {timeout}s\n--- stdout\n{out}\n--- stderr\n{err}")
    if expect_rc is not None and proc.returncode != expect_rc:
        pytest.fail(f"{worker} {' '.join(map(str, args))} on {n} ranks exited {proc.returncode} "
                    f"(expected {expect_rc})\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


@pytest.fixture
def mpirun():
    """Run a worker on n ranks; fails the test with the workers' output unless it exits 0."""
    return run_ranks
