"""fastring-run: the issue's quick-start command, exit codes, flags and argument errors, what
the job does when a rank fails or dies, and Ctrl-C."""
import os
import signal
import subprocess
import sys
import time

import pytest

from fastring._core.config import MPI_SEGMENT_PREFIX
from fastring.tools import launcher
from process_tools import kill_survivors, marker, survivors, wait_for_output

RUN = os.path.join(os.path.dirname(sys.executable), "fastring-run")
GUARD = os.path.abspath(launcher.__file__)
# Every job here ends in seconds when fastring-run works; this bounds the ones that do not.
JOB_TIMEOUT = 60


def test_quick_start_two_ranks():
    code = "import fastring, numpy as np; fastring.init(); print(fastring.allreduce(np.ones(4), op=fastring.Sum))"
    proc = subprocess.run([RUN, "-np", "2", "python", "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # the two ranks' lines may interleave, but each prints exactly this
    assert proc.stdout.count("[2. 2. 2. 2.]") == 2, proc.stdout
    assert proc.stdout.replace("[2. 2. 2. 2.]", "").split() == []


def test_exit_code_of_the_job_is_returned():
    proc = subprocess.run([RUN, "-np", "2", "python", "-c", "import sys; sys.exit(3)"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3


def test_flags_become_environment():
    cmd, env = launcher.build_command(["-np", "3", "--timeline", "t.json", "--fusion-threshold-mb", "2",
                                       "--cycle-time-ms", "5", "--stall-check-time", "7", "-H", "a:2,b:1",
                                       "python", "x.py"])
    assert cmd[0] == launcher.mpiexec_path()
    assert cmd[1:] == ["-n", "3", "-hosts", "a:2,b:1", "python", GUARD, "--as-rank", "x.py"]
    assert env["FASTRING_TIMELINE"] == "t.json"
    assert env["FASTRING_FUSION_THRESHOLD"] == str(2 * 1024 * 1024)
    assert env["FASTRING_CYCLE_TIME"] == "5.0"
    assert env["FASTRING_STALL_CHECK_TIME"] == "7.0"
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def test_hostfile(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("localhost:2\n")
    cmd, _ = launcher.build_command(["-np", "2", "--hostfile", str(hf), "python", "x.py"])
    assert cmd[3:5] == ["-f", str(hf)]


@pytest.mark.parametrize("argv, message", [
    (["-np", "0", "python"], "at least 1"),
    (["-np", "2"], "no command"),
    (["-np", "2", "-H", "a:1", "--hostfile", "f", "python"], "not both"),
    (["-np", "2", "--hostfile", "/nonexistent/hosts", "python"], "does not exist"),
    (["-np", "2", "--exit-grace", "-1", "python"], "must not be negative"),
    (["-np", "2", "--"], "no command"),
])
def test_argument_errors(argv, message):
    with pytest.raises(SystemExit, match=message):
        launcher.build_command(argv)


def test_missing_np_is_usage_error():
    with pytest.raises(SystemExit):
        launcher.build_command(["python"])


# ---------------------------------------------------------------------------- the rank guard

@pytest.mark.parametrize("command, expected", [
    (["python", "x.py", "-v"], ["python", GUARD, "--as-rank", "x.py", "-v"]),
    (["/usr/bin/python3.11", "-u", "-X", "dev", "-Wignore", "x.py"],
     ["/usr/bin/python3.11", "-u", "-X", "dev", "-Wignore", GUARD, "--as-rank", "x.py"]),
    (["python3", "-c", "print(1)", "a"], ["python3", GUARD, "--as-rank", "-c", "print(1)", "a"]),
    (["python", "-uc", "print(1)"], ["python", "-u", GUARD, "--as-rank", "-c", "print(1)"]),
    (["python", "-cprint(1)"], ["python", GUARD, "--as-rank", "-c", "print(1)"]),
    (["python", "-OO", "-m", "pkg.mod"], ["python", "-OO", GUARD, "--as-rank", "-m", "pkg.mod"]),
    (["python", "-"], ["python", GUARD, "--as-rank", "-"]),
    # no program to guard, or not Python: unchanged
    (["python"], ["python"]),
    (["python", "-i", "x.py"], ["python", "-i", "x.py"]),
    (["python", "--version"], ["python", "--version"]),
    (["hostname", "-s"], ["hostname", "-s"]),
    (["pythonic.sh"], ["pythonic.sh"]),
])
def test_guard_command(command, expected):
    assert launcher.guard_command(command, path="/nonexistent") == expected


def test_guard_command_runs_python_scripts_through_their_interpreter(tmp_path):
    for name, first_line, interpreter in (("direct", "#!/opt/py/bin/python3 -s", ["/opt/py/bin/python3"]),
                                          ("env", "#!/usr/bin/env python3", ["python3"]),
                                          ("shell", "#!/bin/sh", None)):
        script = tmp_path / name
        script.write_text(first_line + "\n")
        script.chmod(0o755)
        got = launcher.guard_command([name, "--flag"], path=str(tmp_path))
        if interpreter is None:
            assert got == [name, "--flag"]
        else:
            assert got == [*interpreter, GUARD, "--as-rank", str(script), "--flag"]


def test_a_guarded_rank_sees_what_plain_python_shows(tmp_path):
    """Same sys.argv, __name__, first import directory and stdin as under `python`, on one rank."""
    script = tmp_path / "show.py"
    # python -c puts '' (the working directory) first on sys.path, the guard the directory by name
    script.write_text("import os, sys; print(sys.argv, __name__, sys.path[0] or os.getcwd(), input())\n")
    for command in (["python", str(script), "a"], ["python", "-c", script.read_text(), "a"]):
        proc = subprocess.run([RUN, "-np", "1", *command], input="from-stdin\n", capture_output=True,
                              text=True, timeout=JOB_TIMEOUT, cwd=tmp_path)
        plain = subprocess.run([sys.executable, *command[1:]], input="from-stdin\n", capture_output=True,
                               text=True, timeout=JOB_TIMEOUT, cwd=tmp_path)
        assert proc.returncode == plain.returncode == 0, proc.stderr
        assert proc.stdout == plain.stdout


def test_a_python_without_mpi4py_runs_unguarded(tmp_path):
    """The guard needs mpi4py; where the rank's Python lacks it, nothing can hang in mpi4py's
    MPI_Finalize, so the program runs as it is, interpreter options included."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "bare"], check=True,
                   timeout=JOB_TIMEOUT)
    bare = str(tmp_path / "bare" / "bin" / "python")
    code = "import sys; print(sys.argv, sys.flags.optimize); sys.exit(4)"
    proc = subprocess.run([RUN, "-np", "1", bare, "-O", "-c", code, "a"], capture_output=True, text=True,
                          timeout=JOB_TIMEOUT)
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout == "['-c', 'a'] 1\n"


# ---------------------------------------------------------------------------- a rank fails


# Rank 1 fails as `how` says; the others wait for it in a barrier, forever but for fastring-run.
FAILING_RANK = """
import os, signal, sys
how = sys.argv[1]
if how == "before-mpi" and os.environ["PMI_RANK"] == "1":
    raise RuntimeError("rank 1 failed before MPI")
from mpi4py import MPI
if MPI.COMM_WORLD.rank == 1:
    if how == "exit":
        sys.exit(3)
    if how == "raise":
        raise ValueError("rank 1 failed")
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
MPI.COMM_WORLD.Barrier()
"""


def run_failing(how: str, np_: int = 2, *flags: str) -> tuple[subprocess.CompletedProcess, float, str]:
    mark = marker()
    start = time.monotonic()
    proc = subprocess.run([RUN, "-np", str(np_), *flags, "python", "-c", FAILING_RANK, how, mark],
                          capture_output=True, text=True, timeout=JOB_TIMEOUT)
    return proc, time.monotonic() - start, mark


STOPPING = "fastring-run: rank 1 exited with code {}; stopping the job"


@pytest.mark.parametrize("how, np_, code, words", [
    ("exit", 2, 3, [STOPPING.format(3)]),
    ("exit", 3, 3, [STOPPING.format(3)]),
    # the program's own frames, not the guard's
    ("raise", 2, 1, ['Traceback (most recent call last):\n  File "<string>", line ',
                     "ValueError: rank 1 failed", STOPPING.format(1)]),
    # hydra's own doing: the signal's number is the exit code
    ("sigkill", 2, signal.SIGKILL, ["signal 9"]),
    # the others wait for rank 1 in MPI_Init, where hydra alone would leave them
    ("before-mpi", 2, 1, ["RuntimeError: rank 1 failed before MPI", STOPPING.format(1)]),
])
def test_a_failing_rank_ends_the_job(how, np_, code, words):
    segments, topology = launcher.mpi_segments(), launcher.topology_files()
    proc, took, mark = run_failing(how, np_)
    assert proc.returncode == code, proc.stderr
    for word in words:
        assert word in proc.stdout + proc.stderr
    assert took < 15, took  # startup, then the 2 s grace
    assert survivors(mark) == ""
    # MPICH keeps its segment's name until MPI_Finalize, which these ranks never reach
    assert launcher.mpi_segments() - segments == set()
    # and the process manager that hydra kills leaves its topology file (kept while another
    # job runs, which may be reading its own)
    assert launcher.topology_files() - topology == set() or launcher.another_job_runs()


def test_segments_left_unmapped_are_removed(tmp_path):
    import mmap

    prefix = str(tmp_path / "mpich_shm_")
    old, left, mapped = (tmp_path / n for n in ("mpich_shm_old_0", "mpich_shm_left_0", "mpich_shm_used_0"))
    old.write_bytes(b"x" * 4096)
    before = launcher.mpi_segments(prefix)
    assert before == {str(old)}
    for path in (left, mapped):
        path.write_bytes(b"x" * 4096)
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096):  # a live process maps it
        assert launcher.remove_unmapped_segments(before, prefix) == [str(left)]
    assert old.exists() and mapped.exists() and not left.exists()


def test_topology_files_left_are_removed_unless_another_job_runs(tmp_path, monkeypatch):
    prefix = str(tmp_path / "hydra_hwloc_xmlfile_")
    old, left = tmp_path / "hydra_hwloc_xmlfile_old", tmp_path / "hydra_hwloc_xmlfile_left"
    old.write_text("<topology/>")
    before = launcher.topology_files(prefix)
    assert before == {str(old)}
    left.write_text("<topology/>")
    proxy = str(os.getpid())  # this process plays a running proxy of the job "its job"
    environment = [b"PATH=/bin", f"{launcher.JOB_ENV}=its job".encode()]
    monkeypatch.setattr(launcher, "_comm", lambda pid: launcher.HYDRA_PROXY if str(pid) == proxy else "")
    monkeypatch.setattr(launcher, "_environment", lambda pid: environment if str(pid) == proxy else [])
    assert launcher.another_job_runs("this job") and not launcher.another_job_runs("its job")
    # another job's proxy may still be reading its file: nothing goes
    assert launcher.remove_topology_files(before, prefix, job="this job") == []
    assert launcher.remove_topology_files(before, prefix) == []
    assert left.exists()
    # the proxy is the finished job's own
    assert launcher.remove_topology_files(before, prefix, job="its job") == [str(left)]
    assert old.exists() and not left.exists()
    # one whose environment this process may not read counts as another job's
    def unreadable(pid):
        raise PermissionError(13, "Permission denied")
    left.write_text("<topology/>")
    monkeypatch.setattr(launcher, "_environment", unreadable)
    assert launcher.remove_topology_files(before, prefix, job="its job") == []
    # one that is exiting has no environment left
    monkeypatch.setattr(launcher, "_environment", lambda pid: [])
    assert launcher.remove_topology_files(before, prefix, job="this job") == [str(left)]


def test_a_rank_exiting_during_the_cleanup_does_not_keep_its_segment(tmp_path, monkeypatch):
    """A rank of the job that exits between the cleanup's read of its maps and of its
    environment (empty once its memory is gone, as its maps then are) does not count as
    mapping the job's segment: one CI run kept a 3-rank job's segment so."""
    from fastring._core import shm_files

    prefix, segment = str(tmp_path / "mpich_shm_"), tmp_path / "mpich_shm_job_0"
    segment.write_bytes(b"x" * 4096)
    mine, reads = f"/proc/{os.getpid()}/maps", []

    def mapped_under(prefix_, maps):  # this process plays the rank: it maps the segment once
        if maps != mine:
            return set()
        reads.append(maps)
        return {str(segment)} if len(reads) == 1 else set()
    monkeypatch.setattr(shm_files, "mapped_under", mapped_under)
    monkeypatch.setattr(launcher, "_in_job", lambda pid, job: False)  # its environment gone
    assert launcher.remove_unmapped_segments(set(), prefix, job="the job") == [str(segment)]
    assert not segment.exists()


def test_exit_grace_flag():
    _, env = launcher.build_command(["-np", "2", "--exit-grace", "0.25", "python", "x.py"])
    assert env[launcher.GRACE_ENV] == "0.25"
    proc, _, _ = run_failing("exit", 2, "--exit-grace", "0")
    assert proc.returncode == 3, proc.stderr


def test_ranks_failing_together_keep_all_their_output():
    """Every rank exits 1 after printing: no rank's failure cuts another's output short."""
    code = ("import sys; from mpi4py import MPI; c = MPI.COMM_WORLD; c.Barrier(); "
            "print('\\n'.join(f'rank {c.rank} line {i}' for i in range(20000))); sys.exit(1)")
    proc = subprocess.run([RUN, "-np", "2", "python", "-c", code], capture_output=True, text=True,
                          timeout=JOB_TIMEOUT)
    assert proc.returncode == 1, proc.stderr
    for rank in (0, 1):
        assert f"rank {rank} line 19999" in proc.stdout
    assert "fastring-run: rank " in proc.stderr  # each rank stops the job; the first one does


# ---------------------------------------------------------------------------- Ctrl-C

# Rank 0 waits in a barrier that rank 1, asleep, never joins: neither would ever end.
BLOCKED = """
import sys, time
from mpi4py import MPI
print(f"rank {MPI.COMM_WORLD.rank} started", flush=True)
if MPI.COMM_WORLD.rank == 0:
    MPI.COMM_WORLD.Barrier()
else:
    time.sleep(3600)
"""


@pytest.mark.parametrize("sig, code, word, group", [
    (signal.SIGINT, 130, "interrupted", False),
    (signal.SIGINT, 130, "interrupted", True),  # as a terminal sends it, to the foreground group
    (signal.SIGTERM, 143, "terminated", False),
])
def test_signal_stops_the_job(sig, code, word, group):
    mark = marker()
    proc = subprocess.Popen([RUN, "-np", "2", "python", "-c", BLOCKED, mark], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for_output(proc.stdout, ["rank 0 started", "rank 1 started"], JOB_TIMEOUT)
        start = time.monotonic()
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        assert proc.wait(timeout=10) == code
        assert time.monotonic() - start < 2
        # fastring-run's line alone: the ranks do not see the signal (no KeyboardInterrupt
        # tracebacks), and neither does mpiexec (no hydra "Sending Ctrl-C" lines)
        assert proc.stderr.read().decode() == f"fastring-run: {word}; stopped 2 ranks\n"
        assert survivors(mark) == ""
    finally:
        proc.kill()
        kill_survivors(mark)


def test_killed_launcher_takes_its_job_along():
    """SIGKILL cannot be handled: mpiexec learns of it from the kernel (parent-death signal).
    The launcher never started MPI itself, so it leaves no MPICH segment of its own (named
    after its pid) behind."""
    mark = marker()
    segments = launcher.mpi_segments()  # the killed fastring-run cannot remove its job's
    proc = subprocess.Popen([RUN, "-np", "2", "python", "-c", BLOCKED, mark], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for_output(proc.stdout, ["rank 0 started", "rank 1 started"], JOB_TIMEOUT)
        proc.kill()
        proc.wait()
        assert not os.path.exists(f"{MPI_SEGMENT_PREFIX}{proc.pid:x}_0")
        deadline = time.monotonic() + 5
        while survivors(mark) and time.monotonic() < deadline:  # no event to wait on: poll
            time.sleep(0.05)
        assert survivors(mark) == ""
    finally:
        kill_survivors(mark)
        launcher.remove_unmapped_segments(segments)


# Ignores SIGTERM, as does the child it starts in a session of its own, then says so.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[1] == "parent":
    subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", sys.argv[3]], start_new_session=True)
else:
    print("child ignores SIGTERM", flush=True)
time.sleep(3600)
"""


def test_stop_job_kills_what_ignores_sigterm():
    mark = marker()
    proc = launcher.start_job([sys.executable, "-c", STUBBORN, "parent", STUBBORN, mark],
                              stdout=subprocess.PIPE)
    try:
        wait_for_output(proc.stdout, ["child ignores SIGTERM"], JOB_TIMEOUT)
        start = time.monotonic()
        assert launcher.stop_job(proc, grace=0.2) == 0  # no hydra proxy here: no ranks
        assert time.monotonic() - start < 2
        assert proc.returncode == -signal.SIGKILL
        assert survivors(mark) == ""
    finally:
        kill_survivors(mark)
