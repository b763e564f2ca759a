"""fastring.jax: the multi-rank suite (tests/workers/jax_collectives.py) at 1, 2 and 3 ranks, the
training example under fastring-run, and the doctests. JAX comes with the `test` extra, so
nothing here skips."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import check_doctests
import fastring.jax as fj
from fastring.jax import _route, collectives, training

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "jax_train.py"


@pytest.mark.parametrize("n", [1, 2, 3])
def test_collectives_eager_jit_gradients_and_errors(mpirun, n):
    proc = mpirun(n, "jax_collectives")
    assert f"OK jax collectives on {n} ranks" in proc.stdout


def test_example_trains_with_a_jitted_step_and_ends_with_identical_replicas():
    run = os.path.join(os.path.dirname(sys.executable), "fastring-run")
    proc = subprocess.run([run, "-np", "2", sys.executable, str(EXAMPLE), "--epochs", "4", "--steps", "15"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = [float(v) for v in re.findall(r"epoch \d: loss ([\d.]+)", proc.stdout)]
    assert len(losses) == 4, proc.stdout
    assert losses[-1] < 0.8 * losses[0], proc.stdout  # it learns
    assert "replicas identical on all 2 ranks: True" in proc.stdout


def test_doctests():
    fj.init()
    check_doctests((fj, collectives, training, _route), more_than=20)
