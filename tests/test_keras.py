"""fastring.keras for Keras 3: the multi-rank suite (tests/workers/keras_training.py) on the
TensorFlow backend at 1 and 3 ranks and on the PyTorch backend at 2, Horovod's Keras example
with only its import line changed, examples/keras_train.py under fastring-run, the JAX
backend's error, Horovod's signatures and the doctests."""
import inspect
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
keras = pytest.importorskip("keras")

from conftest import EXAMPLES, check_doctests, run_script  # noqa: E402
import fastring.keras as hvd  # noqa: E402
from fastring.keras import backend, callbacks, optimizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("keras_backend,n", [("tensorflow", 1), ("tensorflow", 3), ("torch", 2)])
def test_fit_callbacks_and_errors(mpirun, keras_backend, n):
    proc = mpirun(n, "keras_training", env={"KERAS_BACKEND": keras_backend})
    assert f"OK keras ({keras_backend} backend) on {n} ranks" in proc.stdout


def test_horovod_keras_script_runs_with_only_the_import_changed():
    script = ROOT / "tests" / "workers" / "horovod_keras_script.py"
    text = script.read_text()
    assert "import fastring.keras as hvd" in text and "horovod" not in text.split("import fastring.keras")[1].split("\n")[0]
    proc = run_script(script, env={"KERAS_BACKEND": "tensorflow"})
    found = re.search(r"losses ([\d. ]+); identical (\d)", proc.stdout)
    assert found, proc.stdout
    losses = [float(x) for x in found.group(1).split()]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], proc.stdout
    assert found.group(2) == "1", proc.stdout
    assert "finished gradual learning rate warmup" in proc.stdout


def test_example_trains_and_ends_with_identical_replicas():
    proc = run_script(EXAMPLES / "keras_train.py", "--epochs", 3, env={"KERAS_BACKEND": "tensorflow"})
    epochs = re.findall(r"epoch (\d): loss ([\d.]+) accuracy ([\d.]+)% lr ([\d.]+)", proc.stdout)
    assert [e for e, *_ in epochs] == ["1", "2", "3"], proc.stdout
    losses = [float(loss) for _, loss, _, _ in epochs]
    assert losses[0] > losses[1] > losses[2], proc.stdout
    assert "replicas identical on all 2 ranks (tensorflow backend)" in proc.stdout


@pytest.mark.parametrize("name", ["jax", "numpy"])
def test_other_backends_are_refused_with_the_way_out(monkeypatch, name):
    monkeypatch.setattr(backend, "BACKEND", name)
    with pytest.raises(NotImplementedError, match="KERAS_BACKEND=tensorflow"):
        hvd.DistributedOptimizer(keras.optimizers.SGD())
    with pytest.raises(NotImplementedError, match="KERAS_BACKEND"):
        hvd.broadcast_variables([], 0)
    if name == "jax":
        with pytest.raises(NotImplementedError, match="fastring.jax"):
            hvd.DistributedOptimizer(keras.optimizers.SGD())


HOROVOD_SIGNATURES = {
    "DistributedOptimizer": "optimizer name device_dense device_sparse compression sparse_as_dense "
                            "gradient_predivide_factor op backward_passes_per_step average_aggregated_gradients "
                            "num_groups groups process_set scale_local_gradients",
    "allreduce": "value name average prescale_factor postscale_factor op compression",
    "allgather": "value name",
    "broadcast": "value root_rank name",
}


@pytest.mark.parametrize("name", sorted(HOROVOD_SIGNATURES))
def test_horovod_positional_order(name):
    assert list(inspect.signature(getattr(hvd, name)).parameters) == HOROVOD_SIGNATURES[name].split()


def test_callback_signatures_are_horovods():
    def params(cls):
        return list(inspect.signature(cls).parameters)
    assert params(hvd.callbacks.BroadcastGlobalVariablesCallback) == ["root_rank", "device"]
    assert params(hvd.callbacks.MetricAverageCallback) == ["device"]
    assert params(hvd.callbacks.LearningRateWarmupCallback) == [
        "initial_lr", "warmup_epochs", "momentum_correction", "steps_per_epoch", "verbose"]
    assert params(hvd.callbacks.LearningRateScheduleCallback) == [
        "initial_lr", "multiplier", "start_epoch", "end_epoch", "staircase", "momentum_correction",
        "steps_per_epoch"]


def test_schedule_refuses_a_learning_rate_schedule():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)),
                  loss="mse")
    cb = hvd.callbacks.LearningRateWarmupCallback(0.1)
    cb.set_model(model)
    with pytest.raises(ValueError, match="LearningRateSchedule"):
        cb.on_train_begin()


def test_doctests():
    hvd.init()
    check_doctests((optimizer, callbacks, backend, hvd), more_than=10)
