"""Data-parallel training of a small Keras 3 classifier with `model.fit`, written the way
Horovod users write it: only the import line differs from a horovod.tensorflow.keras script.

The data are synthetic (10 classes of noisy points around random centres in 32 dimensions),
generated here from a fixed seed, so nothing is downloaded. Each rank fits its shard; the
learning rate is scaled by the number of ranks and warmed up over the first epochs
(LearningRateWarmupCallback), gradients are averaged by DistributedOptimizer, rank 0's initial
weights are broadcast (BroadcastGlobalVariablesCallback, after each rank initialised its model
from a different seed) and the epoch's metrics are averaged (MetricAverageCallback). At the end
every rank checks that its weights and optimizer state are bitwise identical to rank 0's
(exit status 1 if not).

Runs on Keras' TensorFlow backend (the default) or PyTorch backend (KERAS_BACKEND=torch).

Run:
    fastring-run -np 2 python examples/keras_train.py
"""
from __future__ import annotations

import argparse
import sys

import keras
import numpy as np

import fastring.keras as hvd  # the only change: was `import horovod.tensorflow.keras as hvd`


def make_dataset(n: int, seed: int, features: int = 32, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """`n` points: a class centre (from seed 0, shared by every split) plus noise."""
    centres = np.random.default_rng(0).normal(0.0, 1.0, (classes, features))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    x = centres[labels] + rng.normal(0.0, 2.5, (n, features))
    return x.astype(np.float32), labels.astype(np.int32)


def make_model(features: int = 32, classes: int = 10) -> keras.Model:
    """A two-hidden-layer perceptron (~22k parameters), the model of both examples."""
    return keras.Sequential([
        keras.Input((features,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(classes, activation="softmax"),
    ])


def replicas_identical(model: keras.Model) -> bool:
    """Whether every rank holds rank 0's variables (model and optimizer), bit for bit."""
    values = [np.asarray(keras.ops.convert_to_numpy(v)).astype(np.float64).ravel()
              for v in model.variables + model.optimizer.variables]
    mine = np.concatenate(values)
    root = hvd.broadcast(mine, root_rank=0, name="replica_check")
    same = np.array(int(np.array_equal(mine, root)), np.int32)
    return bool(hvd.allreduce(same, op=hvd.Min, name="replica_check.ok"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fastring.keras model.fit example")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--train-size", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=0.001, help="per rank; scaled by the number of ranks")
    parser.add_argument("--warmup-epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)

    hvd.init()
    keras.utils.set_random_seed(args.seed + hvd.rank())  # different initial weights per rank

    x, y = make_dataset(args.train_size, seed=args.seed)
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]

    model = make_model()
    scaled_lr = args.lr * hvd.size()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(scaled_lr))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    report = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: hvd.rank() == 0 and print(
        f"epoch {epoch + 1}: loss {logs['loss']:.4f} accuracy {100 * logs['accuracy']:.1f}% "
        f"lr {logs['lr']:.5f}", flush=True))
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs,
                                                 verbose=1 if hvd.rank() == 0 else 0),
        report,
    ]
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks, verbose=0)

    if not replicas_identical(model):
        print(f"rank {hvd.rank()}: the replicas differ after training", file=sys.stderr, flush=True)
        return 1
    if hvd.rank() == 0:
        print(f"replicas identical on all {hvd.size()} ranks ({keras.backend.backend()} backend)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
