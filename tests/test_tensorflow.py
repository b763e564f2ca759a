"""fastring.tensorflow, the drop-in replacement for horovod.tensorflow: the multi-rank suite
(tests/workers/tf_collectives.py) at 1, 2 and 3 ranks, the custom-loop example under
fastring-run, and what one process can check (Horovod's signatures, doctests)."""
import inspect
import os
import re

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")

from conftest import EXAMPLES, check_doctests, run_script  # noqa: E402
import fastring.tensorflow as hvd  # noqa: E402
from fastring.tensorflow import functions, gradient_tape, mpi_ops, tensors  # noqa: E402

@pytest.mark.parametrize("n", [1, 2, 3])
def test_collectives_tape_and_errors(mpirun, n):
    proc = mpirun(n, "tf_collectives")
    assert "OK tensorflow collectives" in proc.stdout and f"on {n} ranks" in proc.stdout


def test_example_trains_and_ends_with_identical_replicas():
    proc = run_script(EXAMPLES / "tf_gradient_tape.py", "--steps", 200)
    losses = [float(x) for x in re.findall(r"steps \d+-\d+: mean loss ([\d.]+)", proc.stdout)]
    assert len(losses) == 4, proc.stdout
    assert losses[-1] < 0.6 * losses[0], proc.stdout   # it learns
    assert "replicas identical on all 2 ranks" in proc.stdout


# Horovod's positional order, so that positional calls written for horovod.tensorflow work.
HOROVOD_SIGNATURES = {
    "allreduce": "tensor average device_dense device_sparse compression op prescale_factor "
                 "postscale_factor name process_set ignore_name_scope",
    "grouped_allreduce": "tensors average device_dense device_sparse compression op prescale_factor "
                         "postscale_factor process_set name",
    "allgather": "tensor name ignore_name_scope process_set",
    "broadcast": "tensor root_rank name ignore_name_scope process_set",
    "alltoall": "tensor splits name ignore_name_scope process_set",
    "reducescatter": "tensor device_dense compression op name ignore_name_scope process_set "
                     "prescale_factor postscale_factor",
    "broadcast_variables": "variables root_rank process_set inplace",
    "DistributedGradientTape": "gradtape device_dense device_sparse compression sparse_as_dense op "
                               "gradient_predivide_factor num_groups groups process_set scale_local_gradients",
    "broadcast_object": "obj root_rank name process_set",
}


@pytest.mark.parametrize("name", sorted(HOROVOD_SIGNATURES))
def test_horovod_positional_order(name):
    assert list(inspect.signature(getattr(hvd, name)).parameters) == HOROVOD_SIGNATURES[name].split()


def test_every_exported_name_exists():
    assert all(hasattr(hvd, n) for n in hvd.__all__)
    assert {"allreduce", "DistributedGradientTape", "broadcast_variables", "Compression", "init"} <= set(hvd.__all__)


def test_doctests():
    hvd.init()
    check_doctests((mpi_ops, functions, gradient_tape, tensors, hvd), more_than=25)


def test_tape_is_a_gradient_tape_and_forwards():
    w = tf.Variable([1.0, 2.0])
    with hvd.DistributedGradientTape(tf.GradientTape(persistent=True)) as tape:
        loss = tf.reduce_sum(w * w)
    assert isinstance(tape, tf.GradientTape)
    assert [v.name for v in tape.watched_variables()] == [w.name]
    assert tape.gradient(loss, w).numpy().tolist() == [2.0, 4.0]
    assert tape.jacobian(loss, w).numpy().tolist() == [2.0, 4.0]   # persistent: a second use
