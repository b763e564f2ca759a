"""Horovod's Keras example (horovod/examples/tensorflow2/tensorflow2_keras_mnist.py) as it
reads for Keras 3, on synthetic MNIST-shaped data, with one line changed:
`import horovod.tensorflow.keras as hvd` became `import fastring.keras as hvd`.

(Keras 3 itself dropped `compile(experimental_run_tf_function=...)`, and its optimizers take
`learning_rate=`; those lines follow Keras 3, not fastring.) The test checks that the loss
falls and that every rank ends with rank 0's weights.
"""
import sys

sys.modules.setdefault("compression", None)  # see tf_collectives.py

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fastring.keras as hvd  # noqa: E402

# Horovod: initialize Horovod.
hvd.init()

rng = np.random.default_rng(1)
templates = rng.normal(size=(10, 28, 28))
labels = rng.integers(0, 10, 2048)
images = (templates[labels] + rng.normal(scale=2.0, size=(2048, 28, 28))).astype(np.float32)

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(images[..., tf.newaxis], tf.float32), tf.cast(labels, tf.int64))
)
dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(64)

mnist_model = tf.keras.Sequential([
    tf.keras.Input((28, 28, 1)),
    tf.keras.layers.Conv2D(8, [3, 3], activation='relu'),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation='relu'),
    tf.keras.layers.Dense(10, activation='softmax')
])

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(learning_rate=scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(
    opt, backward_passes_per_step=1, average_aggregated_gradients=True)

mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                    optimizer=opt,
                    metrics=['accuracy'])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),

    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),

    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first three epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
]

# Horovod: write logs on worker 0.
verbose = 2 if hvd.rank() == 0 else 0

# Train the model.
# Horovod: adjust number of steps based on number of GPUs.
history = mnist_model.fit(dataset, steps_per_epoch=64 // hvd.size(), callbacks=callbacks, epochs=4,
                          verbose=verbose)

# (The test's own checks.)
losses = history.history["loss"]
mine = np.concatenate([np.ravel(w) for w in mnist_model.get_weights()])
root = hvd.broadcast(mine, root_rank=0, name="check")
identical = int(hvd.allreduce(np.array(int(np.array_equal(mine, root))), op=hvd.Min, name="check.ok"))
if hvd.rank() == 0:
    print(f"losses {' '.join(f'{x:.4f}' for x in losses)}; identical {identical}", flush=True)
