"""fastring-run: the issue's quick-start command, exit codes, flags and argument errors."""
import os
import subprocess
import sys

import pytest

from fastring.tools import launcher

RUN = os.path.join(os.path.dirname(sys.executable), "fastring-run")


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
    assert cmd[1:] == ["-n", "3", "-hosts", "a:2,b:1", "python", "x.py"]
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
])
def test_argument_errors(argv, message):
    with pytest.raises(SystemExit, match=message):
        launcher.build_command(argv)


def test_missing_np_is_usage_error():
    with pytest.raises(SystemExit):
        launcher.build_command(["python"])
