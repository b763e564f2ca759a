"""Multi-rank test harness: `mpirun(n, worker, *args)` runs tests/workers/<worker>.py on n
ranks through the mpiexec installed beside this Python and fails with every rank's output.

Time is bounded twice: a job that outlives its `timeout` (RANKS_TIMEOUT by default) is
stopped, every rank with it, and fails its test with the output so far; pytest-timeout (the
`timeout` ini option, longer than RANKS_TIMEOUT) fails any test, single-process ones included,
that hangs longer still. Workers run under fastring-run's rank guard, so a rank that fails
(exit code, uncaught exception) ends its job in seconds instead of leaving the other ranks
waiting for it until the timeout."""
from __future__ import annotations

import doctest
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastring.tools import launcher

WORKERS = Path(__file__).parent / "workers"
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
# Longest legitimate job: about 20 s (--durations on a shared 2-core machine); well under the
# pytest-timeout in pyproject.toml, so that a hung job fails here, with its output.
RANKS_TIMEOUT = 120.0
# After a job is stopped: how long to wait for the rest of its output.
_DRAIN_TIMEOUT = 10.0


def run_ranks(n: int, worker: str, *args: str, env: dict | None = None, timeout: float = RANKS_TIMEOUT,
              expect_rc: int | None = 0) -> subprocess.CompletedProcess:
    """Run tests/workers/`worker`.py with `args` on `n` ranks; fail the test, with every
    rank's output, if it exits other than `expect_rc` (None: any code) or outlives `timeout`
    seconds, in which case all its ranks are stopped first.

    Example:
        def test_allreduce(mpirun):
            proc = mpirun(2, "allreduce", "numpy", "auto")
            assert "OK" in proc.stdout
    """
    program = [sys.executable, str(WORKERS / f"{worker}.py"), *map(str, args)]
    cmd = [MPIEXEC, "-n", str(n), *launcher.guard_command(program)]
    # MPICH's segment outlives ranks that end without MPI_Finalize and before fastring's init
    # unlinks it (MPI_Abort, killed): removed after the job, as fastring-run does (_run).
    segments, topology = launcher.mpi_segments(), launcher.topology_files()
    job = f"run_ranks-{os.getpid()}-{time.monotonic_ns()}"
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    full_env[launcher.JOB_ENV] = job
    proc = launcher.start_job(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stopped = launcher.stop_job(proc)
        out, err = _rest_of_output(proc)
        pytest.fail(f"{worker} {' '.join(map(str, args))} on {n} ranks timed out after {timeout}s; "
                    f"stopped {stopped} ranks\n--- stdout\n{out}\n--- stderr\n{err}")
    except BaseException:  # pytest-timeout's failure, KeyboardInterrupt: leave no rank behind
        launcher.stop_job(proc)
        raise
    finally:
        launcher.remove_unmapped_segments(segments, job=job)
        launcher.remove_topology_files(topology, job=job)
    if expect_rc is not None and proc.returncode != expect_rc:
        pytest.fail(f"{worker} {' '.join(map(str, args))} on {n} ranks exited {proc.returncode} "
                    f"(expected {expect_rc})\n--- stdout\n{out}\n--- stderr\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FASTRING_RUN = os.path.join(os.path.dirname(sys.executable), "fastring-run")


def run_script(script: Path, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`fastring-run -np 2 python script args`, as a user launches a training script (an
    example, a Horovod script); fails the test with its output unless it exits 0.

    Example:
        proc = run_script(EXAMPLES / "jax_train.py", "--epochs", 4)
        assert "replicas identical" in proc.stdout
    """
    proc = subprocess.run([FASTRING_RUN, "-np", "2", sys.executable, str(script), *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _rest_of_output(proc: subprocess.Popen) -> tuple[str, str]:
    """All of a stopped job's output (communicate keeps what it read before the timeout); what
    was read so far if a process outside the job still holds the pipes open."""
    try:
        return proc.communicate(timeout=_DRAIN_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        return _text(e.stdout), _text(e.stderr)


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


# MPICH's process manager writes the host's topology into a file for each job and removes it
# as the job ends; a job whose launcher or proxy the tests kill leaves it (about twenty a run of
# the suite, which piled up by the hundred). `run_ranks` removes its jobs', fastring-run its
# own; those of the other jobs (simulated hosts' hydra) go when the session ends.
@pytest.fixture(scope="session", autouse=True)
def remove_topology_files():
    before = launcher.topology_files()
    yield
    launcher.remove_topology_files(before)


@pytest.fixture
def mpirun():
    """Run a worker on n ranks; fails the test with the workers' output unless it exits 0."""
    return run_ranks


def check_doctests(modules, more_than: int) -> None:
    """Run the docstring examples of every module in `modules`: none may fail, and more than
    `more_than` must run in all (so that a module losing its examples is noticed)."""
    attempted = 0
    for module in modules:
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, module.__name__
        attempted += result.attempted
    assert attempted > more_than
