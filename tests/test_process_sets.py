"""Process sets (fastring.add_process_set, process_set= on every collective, core and
fastring.torch): the multi-rank suite at 2 and 3 ranks, and a stall inside one set."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "process_sets_torch.py"


@pytest.mark.parametrize("n", [2, 3])
def test_process_sets(mpirun, n):
    mpirun(n, "process_sets")


def test_stall_inside_a_set(mpirun):
    mpirun(3, "process_set_stall", env={"FASTRING_STALL_CHECK_TIME": "1", "FASTRING_STALL_SHUTDOWN_TIME": "2"})


def test_example_two_sets_train_side_by_side():
    run = os.path.join(os.path.dirname(sys.executable), "fastring-run")
    proc = subprocess.run([run, "-np", "3", sys.executable, str(EXAMPLE), "--steps", "60"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "regression (ranks [0, 2]) step 60" in proc.stdout and "classifier (ranks [1]) step 60" in proc.stdout
    losses = re.search(r"final losses: regression ([\d.]+), classifier ([\d.]+); replicas identical", proc.stdout)
    assert losses, proc.stdout
    assert float(losses.group(1)) < 0.05 and float(losses.group(2)) < 0.5, proc.stdout  # both learn
