"""Simulated hosts (`fastring-run --sim-hosts`, fastring/tools/simcluster.py): every collective,
compression, mismatches and the stall inspector across 2 hosts x 2 ranks and 3 x 1, the
hierarchy through each host's shared segment and without it, the bytes really crossing the
links, nothing left behind in namespaces or /dev/shm (also after a failing or interrupted
job), and the one-line errors. Needs root (network namespaces); CI runs as root, so there they must run."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import RANKS_TIMEOUT, WORKERS, _rest_of_output
from fastring.tools import launcher, simcluster

LAUNCHER = [sys.executable, "-m", "fastring_run"]  # what the fastring-run command runs
STALL_ENV = {"FASTRING_STALL_CHECK_TIME": "1", "FASTRING_STALL_SHUTDOWN_TIME": "3"}
IS_ROOT = os.geteuid() == 0 and shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin:/bin") is not None
needs_root = pytest.mark.skipif(not IS_ROOT and os.environ.get("CI") != "true",
                                reason="--sim-hosts needs root and iproute2 (CI runs as root)")


def leftovers(pid: int) -> list[str]:
    """Namespaces and interfaces of the launch whose launcher had process id `pid` that still exist."""
    ip = simcluster.tool("ip")
    names = subprocess.run([ip, "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    links = re.findall(r"^\d+: ([^:@]+)", subprocess.run([ip, "-o", "link", "show"], capture_output=True, text=True,
                                                         check=True).stdout, re.M)
    return ([n for n in names if n.startswith(f"fastring-{pid}-")]
            + [n for n in links if re.fullmatch(rf"fr{pid}[bh]\d*", n)])


def sim_run(args: list[str], env: dict | None = None, timeout: float = RANKS_TIMEOUT,
            interrupt_after: float | None = None) -> subprocess.CompletedProcess:
    """fastring-run `args`; returns its exit code and output after checking that it left
    nothing behind. With `interrupt_after`, Ctrl-C reaches it that many seconds after start."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = launcher.start_job([*LAUNCHER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=full_env)
    try:
        if interrupt_after is not None:
            time.sleep(interrupt_after)
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the launcher stops the job and removes the cluster
        out, err = _rest_of_output(proc)
        pytest.fail(f"fastring-run {' '.join(args)} timed out after {timeout}s\n--- stdout\n{out}\n--- stderr\n{err}")
    except BaseException:
        proc.terminate()
        proc.wait(30)
        raise
    left = leftovers(proc.pid)
    assert not left, f"fastring-run left {left} behind\n--- stderr\n{err}"
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@needs_root
@pytest.mark.parametrize("hosts,per_host", [(2, 2), (3, 1)])
def test_collectives_across_simulated_hosts(hosts, per_host):
    n = hosts * per_host
    proc = sim_run(["--sim-hosts", str(hosts), "-np", str(n), "--link-rate", "5gbit", "--link-stats",
                    sys.executable, str(WORKERS / "multihost.py"), str(hosts)], env=STALL_ENV)
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert f"OK multihost on {hosts} hosts on {n} ranks" in proc.stdout, proc.stdout
    # the stall inspector: every rank but the silent one gave up after 3 s, naming a rank
    assert len(re.findall(r"rank \d stalled after 3\.\ds: stall: rank \d", proc.stdout)) == n - 1, proc.stdout
    assert f"rank {n - 1}" in proc.stdout
    # every host's link carried the traffic: at least the large allreduces' share of
    # 10 x 300,001 float32 values that cross hosts, well over a megabyte
    sent = [int(b) for b in re.findall(r"host \d+ \([\d.]+\) sent (\d+) bytes", proc.stderr)]
    assert len(sent) == hosts and min(sent) > 10 * 4 * 300_001 * (hosts - 1) // hosts, proc.stderr
    # the host segments (named after a host's first rank's pid) are gone from /dev/shm
    assert not shm_kept(proc.stdout, n)


def shm_kept(stdout: str, ranks: int) -> list[str]:
    """Names in /dev/shm of segments named after the pids the ranks printed (`rank R pid P`)."""
    pids = re.findall(r"rank \d+ pid (\d+)", stdout)  # lines of ranks may interleave
    assert len(pids) == ranks, stdout
    return [f for f in os.listdir("/dev/shm") if any(f.startswith(f"fastring-{pid}-") for pid in pids)]


@needs_root
def test_a_rank_stopped_inside_the_hierarchy_is_an_error_on_time():
    """2 x 2: the last rank stops (SIGSTOP) while 64 MiB allreduces run hierarchically, its
    host's segment and its cross-host ring both waiting on it: every other rank fails within
    FASTRING_STALL_SHUTDOWN_TIME + 2 s and the job ends, leaving nothing behind."""
    proc = sim_run(["--sim-hosts", "2", "-np", "4", "--link-rate", "5gbit", sys.executable,
                    str(WORKERS / "faults.py"), "stop_transfer"], env=STALL_ENV)
    assert proc.returncode != 0, proc.stdout
    got = {int(r): float(t) for r, t in re.findall(r"rank (\d+): FastringError after ([\d.]+) s", proc.stdout)}
    assert sorted(got) == [0, 1, 2] and max(got.values()) < 3 + 2, proc.stdout
    assert "allreduce (hierarchical)" in proc.stdout and "rank 3" in proc.stdout, proc.stdout
    assert not shm_kept(proc.stdout, 4)


@needs_root
def test_failing_job_leaves_nothing_behind():
    proc = sim_run(["--sim-hosts", "2", "-np", "2", sys.executable, "-c",
                    "import sys; from mpi4py import MPI; sys.exit(3 if MPI.COMM_WORLD.rank else 0)"])
    assert proc.returncode == 3, proc.stderr
    assert "rank 1 exited with code 3" in proc.stderr


@needs_root
def test_interrupted_job_leaves_nothing_behind():
    proc = sim_run(["--sim-hosts", "2", "-np", "2", "--link-rate", "1gbit", "sleep", "60"], interrupt_after=3.0,
                   timeout=30)
    assert proc.returncode == 130, proc.stderr
    assert "interrupted" in proc.stderr


@needs_root
def test_one_line_errors():
    def error_of(args, **kw):
        proc = sim_run(args, **kw)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(lines) == 1, proc.stderr
        return lines[0]

    assert "-np 3 must be a positive multiple of --sim-hosts 2" in error_of(["--sim-hosts", "2", "-np", "3", "true"])
    assert "not a rate" in error_of(["--sim-hosts", "2", "-np", "2", "--link-rate", "fast", "true"])
    assert "need --sim-hosts" in error_of(["-np", "2", "--link-rate", "1gbit", "true"])
    assert "drop -H" in error_of(["--sim-hosts", "2", "-np", "2", "-H", "a:1,b:1", "true"])


@needs_root
def test_taken_name_missing_tools_and_no_root_in_one_line(monkeypatch, capsys):
    ip = simcluster.tool("ip")
    taken = f"fastring-{os.getpid()}-0"
    subprocess.run([ip, "netns", "add", taken], check=True)
    try:
        assert launcher.main(["--sim-hosts", "2", "-np", "2", "true"]) == 2
        err = capsys.readouterr().err
        assert err == f"fastring-run: network namespace {taken} already exists; remove it with `ip netns del {taken}`\n"
        assert leftovers(os.getpid()) == [taken]  # the user's namespace stays, nothing of ours was made
    finally:
        subprocess.run([ip, "netns", "del", taken], check=True)
    monkeypatch.setattr(simcluster, "_TOOL_DIRS", ())
    monkeypatch.setenv("PATH", "/nonexistent")
    assert launcher.main(["--sim-hosts", "2", "-np", "2", "true"]) == 2
    assert capsys.readouterr().err == ("fastring-run: --sim-hosts needs the `ip` command (package iproute2), "
                                       "and it is not installed\n")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # a user (a real one may not read CI's venv)
    assert launcher.main(["--sim-hosts", "2", "-np", "2", "true"]) == 2
    assert capsys.readouterr().err == ("fastring-run: --sim-hosts needs root (it creates network namespaces); "
                                       "run it as root\n")


def test_doctests_and_option_checks():
    import doctest

    from fastring.algorithms import base, hierarchical
    for module in (simcluster, base, hierarchical):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
    with pytest.raises(simcluster.SimClusterError, match="not a time"):
        simcluster.SimCluster(2, delay="soon")
    with pytest.raises(simcluster.SimClusterError, match="at least 1"):
        simcluster.SimCluster(0)
