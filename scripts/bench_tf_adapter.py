"""The cost of fastring.tensorflow around a training step, in one launch (BENCHMARKS.md, issue
#16), for the examples' model (examples/keras_train.py: 32-128-128-10 perceptron, 22,026
float32 parameters in 6 tensors, batch 64 per rank), medians over steps of the slowest rank:

- step: one `tf.function` training step of examples/tf_gradient_tape.py (forward, backward,
  DistributedGradientTape, Adam), and the same step with a plain tf.GradientTape (no
  reduction; on one rank the two are the same program);
- gradient allreduce alone, on the step's 6 gradient tensors: inside a tf.function (the graph
  op DistributedGradientTape adds), eagerly, and as `fastring.grouped_allreduce` on numpy
  arrays of the same shapes (the core call both make), and as one `fastring.allreduce` per
  array: the adapter's overhead is the difference.

usage: fastring-run -np 2 python scripts/bench_tf_adapter.py [--steps 300]
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.modules.setdefault("compression", None)  # urllib3's probe for Python 3.14's stdlib package

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import fastring  # noqa: E402
import fastring.tensorflow as hvd  # noqa: E402
from bench_engine import median_us  # noqa: E402 - scripts/ is on sys.path when a script in it runs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from keras_train import make_dataset, make_model  # noqa: E402


def slowest_median_us(fn, reps: int, comm) -> float:
    """median_us (a barrier before each call) on the rank where it is largest."""
    return comm.allreduce(median_us(fn, reps, comm), op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)  # one core per rank
    comm = MPI.COMM_WORLD
    tf.keras.utils.set_random_seed(1)
    x, y = make_dataset(args.batch_size * hvd.size(), seed=1)
    images, labels = tf.constant(x[hvd.rank()::hvd.size()]), tf.constant(y[hvd.rank()::hvd.size()])
    model = make_model()
    loss = tf.keras.losses.SparseCategoricalCrossentropy()
    opt = tf.keras.optimizers.Adam(0.001)

    def step(distributed: bool):
        @tf.function
        def training_step(images, labels):
            with tf.GradientTape() as tape:
                loss_value = loss(labels, model(images, training=True))
            if distributed:
                tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss_value, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        return lambda: training_step(images, labels)

    grads = [tf.random.normal(v.shape) for v in model.trainable_variables]
    arrays = [g.numpy() for g in grads]
    graph_reduce = tf.function(lambda *gs: hvd.allreduce_gradients(list(gs)))
    cases = {
        "step, DistributedGradientTape": step(True),
        "step, plain GradientTape": step(False),
        "gradient allreduce in tf.function": lambda: graph_reduce(*grads),
        "gradient allreduce, eager": lambda: hvd.allreduce_gradients(grads),
        "fastring.grouped_allreduce, numpy": lambda: fastring.grouped_allreduce(arrays),
        "fastring.allreduce per array, numpy": lambda: [fastring.allreduce(a) for a in arrays],
    }
    results = {}
    for name, fn in cases.items():
        for _ in range(20):  # trace, build the optimizer, fill the pool
            fn()
        results[name] = slowest_median_us(fn, args.steps, comm)
    if hvd.rank() == 0:
        sizes = [int(np.prod(v.shape)) for v in model.trainable_variables]
        print(f"{hvd.size()} ranks; {sum(sizes)} float32 parameters in {len(sizes)} tensors {sizes}; "
              f"batch {args.batch_size} per rank; median of {args.steps} steps, slowest rank")
        for name, us in results.items():
            print(f"{name:40s} {us:9.1f} us")


if __name__ == "__main__":
    main()
