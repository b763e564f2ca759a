"""fastring.keras on N ranks under the Keras backend named by KERAS_BACKEND (tensorflow or
torch), in one launch:

- `model.fit` with DistributedOptimizer on equal shards in float64 matches the
  single-process fit of the full batches (SGD: the average of the shards' mean gradients is the
  full batch's) and leaves bitwise identical weights on every rank;
- BroadcastGlobalVariablesCallback makes ranks that initialised differently start from the
  root's weights; MetricAverageCallback averages integer metrics exactly, and refuses metric
  names that differ between ranks; LearningRateWarmupCallback sets Horovod's schedule, batch by
  batch;
- the keras-level allreduce/allgather/broadcast; DistributedOptimizer over a process set; errors: XLA (jit_compile=True) refused with
  the fix on the TensorFlow backend, then training works again.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.modules.setdefault("compression", None)  # see tf_collectives.py

import keras  # noqa: E402
import numpy as np  # noqa: E402

import _common as c  # noqa: E402
import fastring  # noqa: E402
import fastring.keras as hvd  # noqa: E402

hvd.init()
N, R = c.SIZE, c.RANK
BACKEND = keras.backend.backend()
keras.config.set_floatx("float64")
B, STEPS, F = 4, 6, 5


def model_of(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((F,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])


def weights(model):
    return np.concatenate([np.asarray(keras.ops.convert_to_numpy(v), np.float64).ravel() for v in model.weights])


# Full batches of N*B rows, step by step; rank r's batch k is rows r*B..(r+1)*B of full batch k.
rng = np.random.default_rng(3)
X = rng.normal(size=(STEPS, N, B, F))
Y = rng.normal(size=(STEPS, N, B, 2))

# ----------------------------------------------------------------- fit against the full batch
model = model_of(seed=100 + R)   # a different initialisation on every rank
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=False)
seen_first = []
probe = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: batch == 0 and seen_first.append(weights(model)))
model.fit(X[:, R].reshape(-1, F), Y[:, R].reshape(-1, 2), batch_size=B, epochs=1, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), probe])
reference = model_of(seed=100)   # rank 0's initialisation
reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=False)
c.check_close("BroadcastGlobalVariablesCallback: first step starts from rank 0's weights", seen_first[0],
              weights(reference), 0)
reference.fit(X.reshape(-1, F), Y.reshape(-1, 2), batch_size=N * B, epochs=1, shuffle=False, verbose=0)
# Keras' torch backend reduces the loss in float32 even under floatx float64: without fastring,
# the mean of two half-batch gradients differs from the full batch's by ~1.5e-8 there.
FIT_TOLERANCE = 1e-12 if BACKEND == "tensorflow" else 1e-6
c.check_close("fit with DistributedOptimizer = full-batch fit", weights(model), weights(reference), FIT_TOLERANCE)
c.check_identical("fit with DistributedOptimizer: weights", weights(model))
c.check_identical("fit with DistributedOptimizer: optimizer state",
                  np.concatenate([np.asarray(keras.ops.convert_to_numpy(v), np.float64).ravel()
                                  for v in model.optimizer.variables]))
opt = model.optimizer
c.CHECKS.check(isinstance(opt, keras.optimizers.SGD) and type(opt).__name__ == "SGD",
               f"DistributedOptimizer is a {type(opt).__mro__}")

# train_on_batch and apply_gradients go through the same apply()
before = weights(model)
model.train_on_batch(X[0, R], Y[0, R])
c.check_identical("train_on_batch", weights(model))
c.CHECKS.check(not np.array_equal(before, weights(model)), "train_on_batch changed nothing")

# ----------------------------------------------------------------- MetricAverageCallback
avg = hvd.callbacks.MetricAverageCallback()
logs = {"loss": 3 * R + 1, "accuracy": R * R, "name": "text stays"}
avg.on_epoch_end(0, logs)
c.CHECKS.check(logs == {"loss": sum(3 * r + 1 for r in range(N)) / N, "accuracy": sum(r * r for r in range(N)) / N,
                        "name": "text stays"}, f"MetricAverageCallback: {logs}")
if N > 1:
    c.expect_error("MetricAverageCallback with different names",
                 lambda: avg.on_epoch_end(0, {"loss": 1.0, f"only_{R}": 2.0}), ValueError, "different metrics")

# ----------------------------------------------------------------- LearningRateWarmupCallback
model = model_of(seed=7)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=False)
seen_lr = []
record = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: seen_lr.append(
    float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))))
history = model.fit(X[:, R].reshape(-1, F), Y[:, R].reshape(-1, 2), batch_size=B // 2, epochs=3, shuffle=False, verbose=0,
                    callbacks=[hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2), record])
spe = 2 * STEPS
expected = [0.4 / N * ((e + (b + 1) / spe) * (N - 1) / 2 + 1) for e in range(2) for b in range(spe)]
expected += [expected[-1]] * spe   # after the warmup, the rate stays
c.check_close("LearningRateWarmupCallback schedule", np.array(seen_lr), np.array(expected), 1e-12)
c.check_close("LearningRateWarmupCallback logs lr", np.array(history.history["lr"]),
              np.array([expected[spe - 1], 0.4, 0.4]), 1e-12)
c.check_identical("warmup fit: weights", weights(model))

# ----------------------------------------------------------------- value collectives
c.check_close("keras allreduce", np.asarray(hvd.allreduce(np.array([R, 2.0 * R]), op=hvd.Sum)),
              np.array([1.0, 2.0]) * N * (N - 1) / 2, 0)
c.check_close("keras allreduce of a variable", np.asarray(hvd.allreduce(keras.Variable(np.full(3, float(R))))),
              np.full(3, (N - 1) / 2), 0)
c.check_close("keras allgather", hvd.allgather(np.full((1, 2), R)), np.repeat(np.arange(N), 2).reshape(N, 2), 0)
c.check_close("keras broadcast", hvd.broadcast(np.array([R]), root_rank=N - 1), np.array([N - 1]), 0)
v = keras.Variable(np.full(2, float(R)))
hvd.broadcast_variables([v], root_rank=N - 1)
c.check_close("keras broadcast_variables", np.asarray(keras.ops.convert_to_numpy(v)), np.full(2, N - 1.0), 0)

# ----------------------------------------------------------------- a process set
# DistributedOptimizer(process_set=) averages over ranks 0, 2, ... only; the others are refused
members = list(range(0, N, 2))
ps = hvd.add_process_set(members) if N > 1 else hvd.global_process_set
if R in members:
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=ps)
    var = keras.Variable(np.zeros(3))
    opt.apply_gradients([(keras.ops.convert_to_tensor(np.full(3, R + 1.0)), var)])
    c.check_close("DistributedOptimizer over a process set", np.asarray(keras.ops.convert_to_numpy(var)),
                  np.full(3, -sum(m + 1.0 for m in members) / len(members)), 0)
else:
    c.expect_error("DistributedOptimizer outside its process set",
                   lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), process_set=ps), ValueError, "not a member")
if N > 1:
    hvd.remove_process_set(ps)

# ----------------------------------------------------------------- errors
c.expect_error("backward_passes_per_step", lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=2),
             NotImplementedError, "gradient_accumulation_steps")
if N & (N - 1) == 0:   # op=Adasum (power-of-two ranks): equal gradients come back unchanged
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvd.Adasum)
    var = keras.Variable(np.zeros(3))
    opt.apply_gradients([(keras.ops.convert_to_tensor(np.array([1.0, -2.0, 0.5])), var)])
    c.check_close("DistributedOptimizer(op=Adasum)", np.asarray(keras.ops.convert_to_numpy(var)),
                  np.array([-1.0, 2.0, -0.5]), 0)
    vec = np.random.default_rng([32, R]).standard_normal(5)
    c.check_close("keras allreduce op=Adasum", np.asarray(hvd.allreduce(vec, op=hvd.Adasum)),
                  fastring.adasum_allreduce(vec.copy()), 0)
c.expect_error("wrapped twice", lambda: hvd.DistributedOptimizer(hvd.DistributedOptimizer(keras.optimizers.SGD())),
             ValueError, "already")
c.expect_error("not an optimizer", lambda: hvd.DistributedOptimizer(object()), TypeError, "keras.optimizers.Optimizer")
if BACKEND == "tensorflow" and N > 1:   # (on one rank there is nothing to reduce, and XLA runs)
    model = model_of(seed=7)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=True)
    c.expect_error("jit_compile=True", lambda: model.fit(X[:, R].reshape(-1, F), Y[:, R].reshape(-1, 2), verbose=0),
                 NotImplementedError, "jit_compile=False")
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=False)
    model.fit(X[:, R].reshape(-1, F), Y[:, R].reshape(-1, 2), batch_size=B, verbose=0)
    c.check_identical("fit after the refused XLA one", weights(model))

c.done(f"keras ({BACKEND} backend)")
