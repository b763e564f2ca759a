"""scripts/gpu_check.py's measuring code in Numba's CUDA simulator: what a GPU machine runs
(scripts/gpu_check.sh), on a few KiB, so that its plumbing and result checks are tested where
CI runs. Its timings mean nothing here."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "scripts" / "gpu_check.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
SIMULATOR = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
KERNEL_ROWS = ["copy kernel", "driver copy", "reduce_into sum", "reduce_into max", "scale_into",
               "divide_into", "encode16 fp16", "decode16 bf16", "accumulate16", "accumulate16 last",
               "pack 8 parts", "unpack 8 parts"]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=SIMULATOR, cwd=ROOT)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_detect_says_the_simulator_is_not_a_gpu():
    proc = subprocess.run([sys.executable, SCRIPT, "detect"], capture_output=True, text=True,
                          timeout=60, env=SIMULATOR)
    assert proc.returncode == 1 and "simulator is not a GPU" in proc.stdout


def test_kernel_table_has_every_kernel_against_the_copy_kernel():
    out = run([sys.executable, SCRIPT, "kernels", "--tiny"]).stdout
    # the name is right-justified in the first 18 columns; the last fields are GB/s and the %
    rows = {line[:18].strip(): line.split() for line in out.splitlines()[2:] if line.strip()}
    assert [name for name in KERNEL_ROWS if name not in rows] == [], out
    assert rows["copy kernel"][-1] == "100%"
    assert all(r[-1].endswith("%") and float(r[-2]) >= 0 for r in rows.values()), out


def test_two_rank_device_allreduce_is_checked_and_right():
    out = run([MPIEXEC, "-n", "2", sys.executable, SCRIPT, "allreduce", "--tiny"]).stdout
    data = [line.split() for line in out.splitlines() if line.strip().split(" ")[0].endswith("KiB")]
    assert [row[0] for row in data] == ["4KiB", "16KiB"], out
    assert all(row[-1] == "0" for row in data), out  # the 'wrong' column: every result checked
