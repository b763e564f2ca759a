"""fastring.tensorflow on N ranks, in one launch (TensorFlow's import costs seconds a process):

- every collective on tf tensors and variables for every dtype TensorFlow and fastring share,
  eagerly and inside tf.function, against NumPy references of every rank's input;
- gradients of allreduce, allgather and broadcast;
- DistributedGradientTape against the single-process full-batch gradient (float64, equal
  shards: the average of the shards' mean gradients is the full batch's), dense and
  IndexedSlices, eagerly and in tf.function, and a few steps of training;
- broadcast_variables; errors: a shape that differs between ranks raises on every rank (eager
  and graph) and the next collective works; local argument errors; XLA refused.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# urllib3 (imported by TensorFlow) probes for Python 3.14's stdlib package `compression`; from
# this folder it would find and run the worker compression.py instead. Make the probe fail.
sys.modules.setdefault("compression", None)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import _common as c  # noqa: E402
import fastring  # noqa: E402
import fastring.tensorflow as hvd  # noqa: E402
from fastring._core.dtypes import SUPPORTED  # noqa: E402

hvd.init()
N, R = c.SIZE, c.RANK
CANDIDATES = (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.uint32, tf.int32, tf.uint64, tf.int64, tf.float16,
              tf.bfloat16, tf.float32, tf.float64, tf.bool)
TF_DTYPES = [d for d in CANDIDATES if np.dtype(d.as_numpy_dtype) in SUPPORTED]


def eager(fn, *args):
    return fn(*args)


def graph(fn, *args):
    return tf.function(fn)(*args)


MODES = {"eager": eager, "tf.function": graph}


def same(name, got, expected, bound=0, dtype=None):
    """`got` is a tf tensor of `dtype` (default: `expected`'s) and `expected`'s shape, within
    `bound` of its values."""
    if not isinstance(got, tf.Tensor):
        c.CHECKS.fail(f"{name}: result is a {type(got).__name__}, not a tf.Tensor")
        return
    got = got.numpy()
    expected = np.asarray(expected)
    dtype = expected.dtype if dtype is None else dtype
    if got.dtype != dtype or got.shape != expected.shape:
        c.CHECKS.fail(f"{name}: result {got.dtype}{got.shape}, expected {dtype}{expected.shape}")
        return
    c.check_close(name, got, expected, bound)


# ----------------------------------------------------------------- collectives, every dtype
def inputs_of(npdt, shape, seed):
    return [c.rank_input(npdt, shape, r, seed) for r in range(N)]


for dt in TF_DTYPES:
    npdt = np.dtype(dt.as_numpy_dtype)
    # the core refuses Average on uint64 (its averaging is int64 arithmetic): checked below
    ops = [hvd.Sum, hvd.Max, hvd.Min] + ([hvd.Average] if npdt not in (np.bool_, np.uint64) else [])
    for mode, call in MODES.items():
        where = f"{dt.name} {mode}"
        xs = inputs_of(npdt, (5, 3), seed=1)
        x, v = tf.constant(xs[R]), tf.Variable(xs[R])
        for op in ops:
            expected, bound = c.reference(xs, op, N)
            same(f"allreduce {op.name} {where}", call(lambda t: hvd.allreduce(t, op=op), x),
                 expected, bound, npdt)
            same(f"allreduce {op.name} of a variable {where}", call(lambda: hvd.allreduce(v, op=op)),
                 expected, bound, npdt)
        rows = [c.rank_input(npdt, (r + 1, 2), r, 2) for r in range(N)]
        same(f"allgather {where}", call(lambda t: hvd.allgather(t), tf.constant(rows[R])), np.concatenate(rows))
        same(f"broadcast {where}", call(lambda: hvd.broadcast(v, root_rank=N - 1)), xs[N - 1])
        # alltoall: rank r sends (r + j) % 3 rows to rank j
        sends = [[(r + j) % 3 for j in range(N)] for r in range(N)]
        blocks = [c.rank_input(npdt, (sum(sends[r]), 2), r, 3) for r in range(N)]
        out, received = call(lambda t, s: hvd.alltoall(t, splits=s), tf.constant(blocks[R]),
                             tf.constant(sends[R], tf.int32))
        offsets = [np.cumsum([0] + sends[r]) for r in range(N)]
        same(f"alltoall {where}", out, np.concatenate([blocks[r][offsets[r][R]:offsets[r][R + 1]] for r in range(N)]))
        same(f"alltoall received splits {where}", received, np.array([sends[r][R] for r in range(N)], np.int32))
        if npdt != np.bool_:
            tall = inputs_of(npdt, (2 * N + 1, 3), seed=4)
            expected, bound = c.reference(tall, hvd.Sum, N)
            base, extra = divmod(2 * N + 1, N)
            start, rows_r = R * base + min(R, extra), base + (R < extra)
            same(f"reducescatter {where}", call(lambda t: hvd.reducescatter(t, op=hvd.Sum), tf.constant(tall[R])),
                 expected[start:start + rows_r], bound if np.isscalar(bound) else bound[start:start + rows_r], npdt)
        # grouped: this dtype beside float32, one call
        f32 = inputs_of(np.dtype(np.float32), (4,), seed=5)
        got = call(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Max), x, tf.constant(f32[R]))
        same(f"grouped_allreduce {where} [0]", got[0], c.reference(xs, hvd.Max, N)[0], 0, npdt)
        same(f"grouped_allreduce {where} [1]", got[1], c.reference(f32, hvd.Max, N)[0], 0, np.float32)

for mode, call in MODES.items():
    # zero-element and 0-d tensors
    same(f"allreduce of an empty tensor {mode}", call(lambda: hvd.allreduce(tf.zeros((0, 3)), op=hvd.Sum)),
         np.zeros((0, 3), np.float32))
    same(f"allreduce 0-d {mode}", call(lambda: hvd.allreduce(tf.constant(float(R)), op=hvd.Sum)),
         np.float32(N * (N - 1) / 2))
    # default splits divide dimension 0 equally and are reported
    out, received = call(lambda: hvd.alltoall(tf.fill([2 * N], R)))
    same(f"alltoall without splits {mode}", out, np.repeat(np.arange(N, dtype=np.int32), 2))
    same(f"alltoall without splits: received {mode}", received, np.full(N, 2, np.int32))
    # scale factors, a Horovod-shaped compressor, the core's fp16 compression
    ones = tf.ones(6, tf.float64) * (R + 1)
    same(f"prescale/postscale {mode}", call(lambda: hvd.allreduce(ones, op=hvd.Sum, prescale_factor=2.0,
                                                                 postscale_factor=0.25)),
         np.full(6, 0.5 * N * (N + 1) / 2))

    class HalfCompressor:
        @staticmethod
        def compress(t):
            return tf.cast(t, tf.float16), t.dtype

        @staticmethod
        def decompress(t, ctx):
            return tf.cast(t, ctx)
    same(f"Horovod-shaped compressor {mode}", call(lambda: hvd.allreduce(ones, compression=HalfCompressor)),
         np.full(6, (N + 1) / 2))
    # float16 on the wire: each of the N divided inputs and the N-1 partial sums rounds once
    fp16_bound = 2 * N * 2.0 ** -11 * (N + 1) / 2
    same(f"Compression.fp16 {mode}", call(lambda: hvd.allreduce(ones, compression=hvd.Compression.fp16)),
         np.full(6, (N + 1) / 2), fp16_bound)
    same(f"reducescatter Compression.fp16 {mode}",
         call(lambda: hvd.reducescatter(tf.ones((N, 2)) * (R + 1), compression=hvd.Compression.fp16)),
         np.full((1, 2), (N + 1) / 2, np.float32), fp16_bound)
    # named collectives, the same name used twice in a row
    same(f"named allreduce {mode}", call(lambda: [hvd.allreduce(ones, name="w"), hvd.allreduce(ones, name="w")][1]),
         np.full(6, (N + 1) / 2))

# ----------------------------------------------------------------- gradients of the collectives
for mode, call in MODES.items():
    def grads_of(fn, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x)
    x = tf.constant(np.arange(4.0) + R)
    w = tf.constant([1.0, -2.0, 3.0, 0.5], tf.float64)
    same(f"d allreduce(Sum) {mode}", call(grads_of, lambda t: tf.reduce_sum(hvd.allreduce(t, op=hvd.Sum) * w), x),
         N * w.numpy())
    same(f"d allreduce(Average) {mode}", call(grads_of, lambda t: tf.reduce_sum(hvd.allreduce(t) * w), x), w.numpy())
    rows = tf.constant(np.full((R + 1, 2), float(R)))
    total = N * (N + 1) // 2
    coef = tf.constant(np.arange(2.0 * total).reshape(total, 2))
    offset = R * (R + 1) // 2
    same(f"d allgather {mode}", call(grads_of, lambda t: tf.reduce_sum(hvd.allgather(t) * coef), rows),
         coef.numpy()[offset:offset + R + 1])
    same(f"d broadcast {mode}", call(grads_of, lambda t: tf.reduce_sum(hvd.broadcast(t, 0) * w), x),
         w.numpy() if R == 0 else np.zeros(4))
    grads = call(grads_of, lambda ts: tf.reduce_sum(hvd.grouped_allreduce(ts, op=hvd.Sum)[1]),
                 [x, tf.ones(3, tf.float64)])
    same(f"d grouped_allreduce {mode}", grads[1], np.full(3, float(N)))

# ----------------------------------------------------------------- DistributedGradientTape
B = 4
MINE = slice(R * B, (R + 1) * B)
rng = np.random.default_rng(7)
X = tf.constant(rng.normal(size=(N * B, 6)))
Y = tf.constant(rng.normal(size=(N * B, 3)))
IDS = tf.constant(rng.integers(0, 10, N * B))
W0, E0 = rng.normal(size=(6, 3)), rng.normal(size=(10, 6))


def loss_fn(w, e, b, unused, x, y, ids):
    del unused
    h = x + tf.gather(e, ids)   # IndexedSlices gradient for e
    return tf.reduce_mean((h @ w + b - y) ** 2)


def tape_grads(distributed, variables, x, y, ids, **kwargs):
    with tf.GradientTape() as tape:
        loss = loss_fn(*variables, x, y, ids)
    if distributed:
        tape = hvd.DistributedGradientTape(tape, **kwargs)
    return tape.gradient(loss, variables)


def fresh():
    return [tf.Variable(W0), tf.Variable(E0), tf.Variable(tf.zeros(3, tf.float64)), tf.Variable(tf.ones(2, tf.float64))]


reference = tape_grads(False, fresh(), X, Y, IDS)
for mode, call in MODES.items():
    for kwargs in ({}, {"sparse_as_dense": True}, {"gradient_predivide_factor": 2.0 * N + 1}, {"op": hvd.Sum}):
        where = f"DistributedGradientTape {kwargs} {mode}"
        variables = fresh()
        got = call(lambda x, y, ids: tape_grads(True, variables, x, y, ids, **kwargs), X[MINE], Y[MINE], IDS[MINE])
        scale = N if kwargs.get("op") == hvd.Sum else 1
        for i, (g, ref) in enumerate(zip(got[:3], reference[:3])):
            sparse = isinstance(g, tf.IndexedSlices)
            c.CHECKS.check(sparse == (i == 1 and not kwargs.get("sparse_as_dense")),
                           f"{where}: gradient {i} is {type(g).__name__}")
            dense = tf.convert_to_tensor(g).numpy()
            c.check_close(f"{where}: gradient {i}", dense, scale * tf.convert_to_tensor(ref).numpy(),
                          1e-12 * (1 + np.abs(dense)))
            c.check_identical(f"{where}: gradient {i}", dense)
        c.CHECKS.check(got[3] is None, f"{where}: an unconnected variable's gradient is {got[3]}, not None")

# A few steps of SGD in tf.function, against the single-process full-batch trajectory.
mine_vars, ref_vars = fresh(), fresh()
opt, ref_opt = tf.keras.optimizers.SGD(0.1), tf.keras.optimizers.SGD(0.1)


@tf.function
def train_step(x, y, ids):
    grads = tape_grads(True, mine_vars, x, y, ids)
    opt.apply_gradients(zip(grads[:3], mine_vars[:3]))


for step in range(3):
    train_step(X[MINE], Y[MINE], IDS[MINE])
    ref_opt.apply_gradients(zip(tape_grads(False, ref_vars, X, Y, IDS)[:3], ref_vars[:3]))
for i, (a, b) in enumerate(zip(mine_vars[:3], ref_vars[:3])):
    c.check_close(f"3 SGD steps: variable {i}", a.numpy(), b.numpy(), 1e-12)
    c.check_identical(f"3 SGD steps: variable {i}", a.numpy())

# ----------------------------------------------------------------- broadcast_variables
for mode in MODES:
    vs = [tf.Variable(np.full((2, 2), R, np.float32)), tf.Variable(np.arange(3) * (R + 1))]
    if mode == "eager":
        hvd.broadcast_variables(vs, root_rank=N - 1)
    else:
        @tf.function
        def broadcast_step():
            hvd.broadcast_variables(vs, root_rank=N - 1)
        broadcast_step()
    same(f"broadcast_variables {mode} [0]", tf.convert_to_tensor(vs[0]), np.full((2, 2), N - 1, np.float32))
    same(f"broadcast_variables {mode} [1]", tf.convert_to_tensor(vs[1]), np.arange(3) * N)

# ----------------------------------------------------------------- errors
if N > 1:
    c.expect_error("shapes differ between ranks (eager)", lambda: hvd.allreduce(tf.ones(R + 1), name="bad"),
                 fastring.FastringError, "shape")
    same("the next allreduce (eager)", hvd.allreduce(tf.ones(2), op=hvd.Sum), np.full(2, N, np.float32))
    bad_step = tf.function(lambda t: hvd.allreduce(t, name="bad_graph"))
    c.expect_error("shapes differ between ranks (tf.function)", lambda: bad_step(tf.ones(R + 1)),
                 tf.errors.OpError, "FastringError", "shape")
    same("the next allreduce (tf.function)", tf.function(lambda: hvd.allreduce(tf.ones(2), op=hvd.Sum))(),
         np.full(2, N, np.float32))
c.expect_error("unsupported dtype", lambda: hvd.allreduce(tf.constant([1 + 2j])), TypeError, "complex")
c.expect_error("uint64 Average", lambda: hvd.allreduce(tf.constant([1], tf.uint64), op=hvd.Average), TypeError,
               "uint64")
c.expect_error("bad splits", lambda: hvd.alltoall(tf.ones(3), splits=[5] * N), ValueError, "splits")
c.expect_error("undividable alltoall", lambda: hvd.alltoall(tf.ones(N + 1)) if N > 1 else hvd.alltoall(tf.ones(())),
             ValueError)
c.expect_error("sparse Max", lambda: hvd.allreduce(tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0])), op=hvd.Max),
             NotImplementedError, "Sum")
c.expect_error("grouped IndexedSlices", lambda: hvd.grouped_allreduce([tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0]))]),
             TypeError, "IndexedSlices")
# ---- op=Adasum: the core's fastring.adasum_allreduce of each tensor, bit for bit (the core's
# own tests hold it to the formula), its gradient the Adasum of the output's gradient; the tape's
# gradients, equal on every rank, come back unchanged (Adasum of equal vectors is the vector)
if N & (N - 1) == 0:
    vecs = [np.random.default_rng([31, r]).standard_normal(n) for r, n in ((R, 7), (R + 50, 3))]
    core = [fastring.adasum_allreduce(v.copy()) for v in vecs]
    same("Adasum", hvd.allreduce(tf.constant(vecs[0]), op=hvd.Adasum), core[0])
    same("Adasum postscaled in a graph", graph(lambda t: hvd.allreduce(t, op=hvd.Adasum, postscale_factor=2.0),
                                             tf.constant(vecs[0])), core[0] * 2.0)
    for k, got in enumerate(hvd.grouped_allreduce([tf.constant(v) for v in vecs], op=hvd.Adasum)):
        same(f"grouped Adasum {k}", got, core[k])
    t = tf.constant(vecs[1])
    with tf.GradientTape() as tape:
        tape.watch(t)
        loss = tf.reduce_sum(hvd.allreduce(t, op=hvd.Adasum) * tf.constant([1.0, 2.0, 3.0], tf.float64))
    same("Adasum gradient", tape.gradient(loss, t), np.array([1.0, 2.0, 3.0]))
    w = tf.Variable([1.0, -2.0, 0.5], dtype=tf.float64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w)
    same("Adasum tape", hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [w])[0],
         np.array([2.0, -4.0, 1.0]))
else:
    c.expect_error("Adasum on ranks not a power of two", lambda: hvd.allreduce(tf.ones(2, tf.float64), op=hvd.Adasum),
                   ValueError, "power-of-two")
c.expect_error("Adasum of integers", lambda: hvd.allreduce(tf.ones(2, tf.int32), op=hvd.Adasum), TypeError, "float32")
c.expect_error("Adasum compressed", lambda: hvd.allreduce(tf.ones(2), op=hvd.Adasum, compression=hvd.Compression.fp16),
               ValueError, "compression")
c.expect_error("Adasum reducescatter", lambda: hvd.reducescatter(tf.ones(2), op=hvd.Adasum), NotImplementedError,
               "Adasum")
c.expect_error("Adasum of IndexedSlices", lambda: hvd.allreduce(tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0])),
                                                               op=hvd.Adasum), NotImplementedError, "Sum")
c.expect_error("Adasum tape with a predivide factor",
               lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Adasum, gradient_predivide_factor=2.0),
               ValueError, "gradient_predivide_factor")
c.expect_error("predivide with Sum", lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum,
                                                                        gradient_predivide_factor=2.0),
             ValueError, "gradient_predivide_factor")
c.expect_error("not a tape", lambda: hvd.DistributedGradientTape(object()), TypeError, "GradientTape")
c.expect_error("process set of another type", lambda: hvd.allreduce(tf.ones(1), process_set=object()), TypeError,
               "ProcessSet")
# ---- a process set: every collective, the tape and broadcast_variables over ranks 0, 2, ...
# only (the others call nothing of it, and are refused if they do); on one rank, the global set
members = list(range(0, N, 2))
ps = hvd.add_process_set(members) if N > 1 else hvd.global_process_set
k = len(members)
if R in members:
    me = members.index(R)
    rows = [np.arange((m + 1) * 2, dtype=np.float32).reshape(m + 1, 2) + 100 * m for m in members]
    same("set allreduce Sum", hvd.allreduce(tf.constant(rows[me][:1]), op=hvd.Sum, process_set=ps),
         sum(r[:1] for r in rows))
    same("set allreduce Average", graph(lambda t: hvd.allreduce(t, process_set=ps), tf.constant(rows[me][:1])),
         sum(r[:1] for r in rows) / k)
    same("set grouped", hvd.grouped_allreduce([tf.constant([R], tf.int64)], op=hvd.Sum, process_set=ps)[0],
         np.array([sum(members)], np.int64))
    same("set allgather", hvd.allgather(tf.constant(rows[me]), process_set=ps), np.concatenate(rows))
    same("set broadcast", hvd.broadcast(tf.constant(rows[me][:1]), root_rank=members[-1], process_set=ps),
         rows[-1][:1])
    sent = tf.constant(np.arange(2 * k, dtype=np.int32) + 10 * R)
    got, received = hvd.alltoall(sent, process_set=ps)
    same("set alltoall", got, np.concatenate([np.arange(2 * me, 2 * me + 2, dtype=np.int32) + 10 * m for m in members]))
    same("set alltoall splits", received, np.full(k, 2, np.int32))
    same("set reducescatter", hvd.reducescatter(tf.ones((k, 3)), op=hvd.Sum, process_set=ps), np.full((1, 3), k, np.float32))
    hvd.barrier(process_set=ps)
    # gradients through the set: allgather's takes this rank's rows (offset by its rank in the
    # set) of the set's averaged output gradient
    t = tf.constant(rows[me])
    coef = tf.constant(np.arange(sum(len(r) for r in rows) * 2, dtype=np.float32).reshape(-1, 2))
    with tf.GradientTape() as tape:
        tape.watch(t)
        loss = tf.reduce_sum(hvd.allgather(t, process_set=ps) * coef)
    start = sum(len(r) for r in rows[:me])
    same("set allgather gradient", tape.gradient(loss, t), coef.numpy()[start:start + len(rows[me])])
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * float(R + 1))
    same("set tape", hvd.DistributedGradientTape(tape, process_set=ps).gradient(loss, [w])[0],
         np.full(2, sum(m + 1 for m in members) / k, np.float32))
    v = tf.Variable([float(R)])
    hvd.broadcast_variables([v], root_rank=members[-1], process_set=ps)
    same("set broadcast_variables", tf.convert_to_tensor(v), np.array([members[-1]], np.float32))
else:
    c.expect_error("set not joined", lambda: hvd.allreduce(tf.ones(1), process_set=ps), ValueError, "not a member")
    c.expect_error("set tape not joined", lambda: hvd.DistributedGradientTape(tf.GradientTape(), process_set=ps),
                   ValueError, "not a member")
if N > 1:
    hvd.remove_process_set(ps)
    c.expect_error("set removed", lambda: hvd.allgather(tf.ones(1), process_set=ps), ValueError, "not registered")
c.expect_error("XLA", lambda: tf.function(lambda t: hvd.allreduce(t), jit_compile=True)(tf.ones(2)),
             NotImplementedError, "jit_compile")
same("after the refused ones", hvd.allreduce(tf.ones(2), op=hvd.Sum), np.full(2, N, np.float32))
c.CHECKS.check(set(hvd.__all__) <= set(dir(hvd)), "__all__ names something missing")

c.done(f"tensorflow collectives ({', '.join(d.name for d in TF_DTYPES)})")
