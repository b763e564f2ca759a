"""Data-parallel training with a custom TensorFlow 2 loop (`tf.GradientTape` inside
`tf.function`), written the way Horovod users write it: only the import line differs from a
horovod.tensorflow script.

The model and the synthetic data are those of examples/keras_train.py (10 classes of noisy
points in 32 dimensions, generated from a fixed seed). Each rank trains on its shard with the
learning rate scaled by the number of ranks; DistributedGradientTape averages the gradients;
after the first step, rank 0's model and optimizer variables are broadcast (each rank
initialised its model from a different seed). Rank 0 prints the loss averaged over ranks and
over 50 steps; at
the end every rank checks that its variables are bitwise identical to rank 0's (exit status 1
if not).

Run:
    fastring-run -np 2 python examples/tf_gradient_tape.py
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import tensorflow as tf

import fastring.tensorflow as hvd  # the only change: was `import horovod.tensorflow as hvd`

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from keras_train import make_dataset, make_model  # noqa: E402 - the same model and data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fastring.tensorflow DistributedGradientTape example")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.001, help="per rank; scaled by the number of ranks")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)

    hvd.init()
    tf.keras.utils.set_random_seed(args.seed + hvd.rank())  # different initial weights per rank

    x, y = make_dataset(8192, seed=args.seed)
    dataset = (tf.data.Dataset.from_tensor_slices((x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]))
               .repeat().shuffle(1024, seed=args.seed + hvd.rank()).batch(args.batch_size))

    model = make_model()
    loss = tf.keras.losses.SparseCategoricalCrossentropy()
    opt = tf.keras.optimizers.Adam(args.lr * hvd.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = model(images, training=True)
            loss_value = loss(labels, probs)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        # Broadcast after the first step, once the optimizer has created its variables.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return hvd.allreduce(loss_value, name="loss")

    recent = []
    for batch, (images, labels) in enumerate(dataset.take(args.steps)):
        recent.append(float(training_step(images, labels, batch == 0)))
        if len(recent) == 50 or batch == args.steps - 1:
            if hvd.rank() == 0:
                print(f"steps {batch + 1 - len(recent)}-{batch}: mean loss {np.mean(recent):.4f}", flush=True)
            recent = []

    mine = tf.concat([tf.reshape(tf.cast(v, tf.float64), [-1]) for v in model.variables + opt.variables], 0)
    root = hvd.broadcast(mine, root_rank=0, name="replica_check")
    same = tf.constant(int(bool(tf.reduce_all(mine == root))), tf.int32)
    if not int(hvd.allreduce(same, op=hvd.Min, name="replica_check.ok")):
        print(f"rank {hvd.rank()}: the replicas differ after training", file=sys.stderr, flush=True)
        return 1
    if hvd.rank() == 0:
        print(f"replicas identical on all {hvd.size()} ranks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
