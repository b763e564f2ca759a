"""fastring.jax on N ranks, in one launch (importing JAX costs seconds): every collective
outside and inside jax.jit against NumPy references, the gradients against what a single
process computes for the same sums, the training helpers (one fused allreduce per dtype per
step), the cross-rank mismatches (an error on every rank, and the next jitted step works)
and the local argument errors."""
import jax

jax.config.update("jax_enable_x64", True)  # int64 and float64 stay what they are

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import _common as c  # noqa: E402
import fastring  # noqa: E402
import fastring.jax as fj  # noqa: E402

R, N = c.RANK, c.SIZE
DTYPES = [np.dtype(d) for d in (np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64)] + [c.BF16]
OPS = [fj.Sum, fj.Average, fj.Min, fj.Max, fj.Product]
SHAPE = (6, 3)


def inputs(dt, shape, seed):
    return [c.rank_input(dt, shape, r, seed) for r in range(N)]


def host(x) -> np.ndarray:
    c.CHECKS.check(isinstance(x, jax.Array), f"result is a {type(x).__name__}, not a jax.Array")
    return np.asarray(x)


def check(name, got, expected, bound=0, dtype=None, shape=None):
    got = host(got)
    want_dtype = np.dtype(dtype) if dtype is not None else None
    if want_dtype is not None and got.dtype != want_dtype:
        c.CHECKS.fail(f"{name}: dtype {got.dtype}, expected {want_dtype}")
        return
    if shape is not None and got.shape != tuple(shape):
        c.CHECKS.fail(f"{name}: shape {got.shape}, expected {tuple(shape)}")
        return
    c.check_close(name, got, expected, bound)


def expect_error(name, error, fn, text):
    """fn() must raise `error` whose message contains `text`."""
    try:
        out = fn()
        jax.block_until_ready(out)
    except error as e:
        c.CHECKS.check(text in str(e), f"{name}: message {str(e)[:300]!r} lacks {text!r}")
    except Exception as e:  # noqa: BLE001 - the wrong kind of error is a failure to report
        c.CHECKS.fail(f"{name}: raised {type(e).__name__}: {str(e)[:300]}, expected {error.__name__}")
    else:
        c.CHECKS.fail(f"{name}: no error")


def rows_of(rank, d0):
    return d0 // N + (rank < d0 % N)


fj.init()

# ----------------------------------------------------------------- allreduce, eager and jit
for dt in DTYPES:
    for op in OPS:
        xs = inputs(dt, SHAPE, 10 + int(op))
        expected, bound = c.reference(xs, op, N)
        x = jnp.asarray(xs[R])
        check(f"allreduce {dt} {op.name}", fj.allreduce(x, op=op), expected, bound, dt, SHAPE)
        c.CHECKS.check(np.array_equal(np.asarray(x), xs[R]), f"allreduce {dt} {op.name}: input changed")
        if dt in (np.float32, np.int32) or op == fj.Sum:
            got = jax.jit(lambda a, op=op: fj.allreduce(a, op=op))(x)
            check(f"jit allreduce {dt} {op.name}", got, expected, bound, dt, SHAPE)
            # inside jit the core works in XLA's output buffer, which aliases the input's
            c.CHECKS.check(np.array_equal(np.asarray(x), xs[R]), f"jit allreduce {dt} {op.name}: input changed")
            c.check_identical(f"jit allreduce {dt} {op.name}", host(got))

# scale factors and 16-bit compression, inside jit
xs = inputs(np.dtype(np.float32), (40,), 3)
expected, bound = c.reference(xs, fj.Average, N)
got = jax.jit(lambda a: fj.allreduce(a, op=fj.Average, prescale_factor=0.5, postscale_factor=4.0))(jnp.asarray(xs[R]))
check("jit allreduce scaled", got, 2.0 * expected, 2.0 * bound + 1e-6)
got = jax.jit(lambda a: fj.allreduce(a, op=fj.Sum, compression=fj.Compression.fp16))(jnp.asarray(xs[R]))
exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
# Inputs on a 1/64 grid in [-2, 2] are exact in fp16; the ring's partial sums round once each.
check("jit allreduce fp16", got, exact, N * 2.0 ** -11 * np.sum(np.abs(xs), axis=0) + 1e-7)

# A large result (pooled, 64-byte aligned) is a new array that later collectives never touch.
big = [c.rank_input(np.dtype(np.float32), (1 << 16,), r, 5) for r in range(N)]
first = fj.allreduce(jnp.asarray(big[R]), op=fj.Sum)
first_bytes = np.asarray(first).copy()
for _ in range(3):
    fj.allreduce(jnp.asarray(big[R]) * 2, op=fj.Sum)
c.CHECKS.check(np.array_equal(np.asarray(first), first_bytes), "a held result was overwritten")
c.CHECKS.check(first.unsafe_buffer_pointer() % 64 == 0, "large result not 64-byte aligned")

# ----------------------------------------------------------------- grouped_allreduce
for dt in (np.dtype(np.float32), c.BF16, np.dtype(np.int64)):
    xs_a, xs_b = inputs(dt, (5,), 20), inputs(dt, (2, 3), 21)
    (ea, ba), (eb, bb) = c.reference(xs_a, fj.Sum, N), c.reference(xs_b, fj.Sum, N)
    for label, fn in (("", fj.grouped_allreduce), ("jit ", jax.jit(fj.grouped_allreduce, static_argnames="op"))):
        ga, gb = fn([jnp.asarray(xs_a[R]), jnp.asarray(xs_b[R])], op=fj.Sum)
        check(f"{label}grouped {dt} [0]", ga, ea, ba, dt, (5,))
        check(f"{label}grouped {dt} [1]", gb, eb, bb, dt, (2, 3))

# ----------------------------------------------------------------- allgather
for dt in (np.dtype(np.int32), c.BF16, np.dtype(np.float64)):
    xs = inputs(dt, (2, 3), 30)
    expected = np.concatenate(xs)
    check(f"allgather {dt}", fj.allgather(jnp.asarray(xs[R])), expected, 0, dt, (2 * N, 3))
    check(f"jit allgather {dt}", jax.jit(fj.allgather)(jnp.asarray(xs[R])), expected, 0, dt, (2 * N, 3))
# outside jit dimension 0 may differ per rank
uneven = [np.full((r + 1, 2), r, np.int32) for r in range(N)]
check("allgather uneven", fj.allgather(jnp.asarray(uneven[R])), np.concatenate(uneven), 0, np.int32)

# ----------------------------------------------------------------- broadcast
for root in range(N):
    xs = inputs(np.dtype(np.float32), (4, 2), 40 + root)
    check(f"broadcast root {root}", fj.broadcast(jnp.asarray(xs[R]), root), xs[root], 0, np.float32)
    got = jax.jit(lambda a, root=root: fj.broadcast(a, root))(jnp.asarray(xs[R]))
    check(f"jit broadcast root {root}", got, xs[root], 0, np.float32)

# ----------------------------------------------------------------- alltoall
xs = [np.arange(2 * N * 3, dtype=np.int64).reshape(2 * N, 3) + 1000 * r for r in range(N)]
expected = np.concatenate([xs[r][2 * R:2 * R + 2] for r in range(N)])
check("alltoall", fj.alltoall(jnp.asarray(xs[R])), expected, 0, np.int64, (2 * N, 3))
check("jit alltoall", jax.jit(fj.alltoall)(jnp.asarray(xs[R])), expected, 0, np.int64, (2 * N, 3))
splits = np.array([(R + r) % 2 + 1 for r in range(N)], np.int32)  # rows sent to each rank
send = jnp.asarray(np.arange(int(splits.sum()), dtype=np.int32) + 100 * R)
got, received = fj.alltoall(send, splits=splits)
want_received = np.array([(r + R) % 2 + 1 for r in range(N)], np.int32)
check("alltoall splits received", received, want_received, 0, np.int32)
want = np.concatenate([np.arange(sum((r + q) % 2 + 1 for q in range(R)),
                                 sum((r + q) % 2 + 1 for q in range(R + 1)), dtype=np.int32) + 100 * r
                       for r in range(N)])
check("alltoall splits", got, want, 0, np.int32)

# ----------------------------------------------------------------- reducescatter
for d0 in (N, 2 * N + 1):
    for op in (fj.Sum, fj.Average, fj.Max):
        xs = inputs(np.dtype(np.float64), (d0, 2), 50 + d0 + int(op))
        expected, bound = c.reference(xs, op, N)
        lo = sum(rows_of(r, d0) for r in range(R))
        want, wbound = expected[lo:lo + rows_of(R, d0)], (bound[lo:lo + rows_of(R, d0)] if np.ndim(bound) else bound)
        check(f"reducescatter {d0} {op.name}", fj.reducescatter(jnp.asarray(xs[R]), op=op), want, wbound)
        got = jax.jit(lambda a, op=op: fj.reducescatter(a, op=op))(jnp.asarray(xs[R]))
        check(f"jit reducescatter {d0} {op.name}", got, want, wbound, np.float64, (rows_of(R, d0), 2))

# ----------------------------------------------------------------- gradients
# Each rank's loss is sum(w_r * f(x_r)) with its own weights w_r; the gradient every rank must
# get is what one process computes knowing every rank's x and w (float64, exact here).
ws = [c.rank_input(np.dtype(np.float64), SHAPE, r, 60) for r in range(N)]
xs = inputs(np.dtype(np.float64), SHAPE, 61)
w, x = jnp.asarray(ws[R]), jnp.asarray(xs[R])
total_w = np.sum(ws, axis=0)
for label, grad in (("", jax.grad), ("jit ", lambda f: jax.jit(jax.grad(f)))):
    g = grad(lambda a: jnp.sum(w * fj.allreduce(a, op=fj.Sum)))(x)
    check(f"{label}grad allreduce Sum", g, total_w)
    g = grad(lambda a: jnp.sum(w * fj.allreduce(a, op=fj.Average, prescale_factor=3.0, postscale_factor=0.5)))(x)
    check(f"{label}grad allreduce Average scaled", g, total_w * 1.5 / N, 1e-12)
    g = grad(lambda a: jnp.sum(w * fj.grouped_allreduce([a, 2 * a], op=fj.Sum)[1]))(x)
    check(f"{label}grad grouped_allreduce", g, 2 * total_w)
    g = grad(lambda a: jnp.sum(jnp.tile(w, (N, 1)) * jnp.arange(1, N + 1.0).repeat(SHAPE[0])[:, None]
                               * fj.allgather(a)))(x)
    # rank r's rows of the gather are weighted (r+1) on every rank
    check(f"{label}grad allgather", g, total_w * (R + 1))
    for root in range(N):
        g = grad(lambda a, root=root: jnp.sum(w * fj.broadcast(a, root)))(x)
        check(f"{label}grad broadcast root {root}", g, total_w if R == root else np.zeros(SHAPE))
    d0 = 2 * N + 1
    wr = [c.rank_input(np.dtype(np.float64), (rows_of(r, d0), 3), r, 62) for r in range(N)]
    xr = jnp.asarray(inputs(np.dtype(np.float64), (d0, 3), 63)[R])
    g = grad(lambda a: jnp.sum(jnp.asarray(wr[R]) * fj.reducescatter(a, op=fj.Average)))(xr)
    check(f"{label}grad reducescatter Average", g, np.concatenate(wr) / N, 1e-15)
    xa = jnp.asarray(np.arange(2 * N * 2, dtype=np.float64).reshape(2 * N, 2) + R)
    wa = [c.rank_input(np.dtype(np.float64), (2 * N, 2), r, 64) for r in range(N)]
    g = grad(lambda a: jnp.sum(jnp.asarray(wa[R]) * fj.alltoall(a)))(xa)
    # rows 2q..2q+1 of my input went to rank q, which weighted them by its rows 2R..2R+1
    check(f"{label}grad alltoall", g, np.concatenate([wa[q][2 * R:2 * R + 2] for q in range(N)]))

# A finite-difference check of a non-linear function around the allreduce.
def loss(a):
    return jnp.sum(jnp.sin(fj.allreduce(a * a, op=fj.Average)) * w)


eps = 1e-6
g = np.asarray(jax.jit(jax.grad(loss))(x))
direction = jnp.asarray(c.rank_input(np.dtype(np.float64), SHAPE, R, 65))
# every rank moves its own input along its own direction; the change of the sum over ranks
# of the losses is the sum over ranks of <grad, direction>
up = float(fj.allreduce(jax.jit(loss)(x + eps * direction), op=fj.Sum))
down = float(fj.allreduce(jax.jit(loss)(x - eps * direction), op=fj.Sum))
predicted = float(fj.allreduce(jnp.sum(jnp.asarray(g) * direction), op=fj.Sum))
c.CHECKS.check(abs((up - down) / (2 * eps) - predicted) < 1e-6 * max(1.0, abs(predicted)),
               f"finite difference {(up - down) / (2 * eps)} vs gradient {predicted}")

# ----------------------------------------------------------------- training helpers
tree = {"w": jnp.asarray(c.rank_input(np.dtype(np.float32), (3, 4), R, 70)),
        "b": jnp.asarray(c.rank_input(np.dtype(np.float32), (4,), R, 71)),
        "step": jnp.asarray(np.array([R + 1], np.int32))}
calls = []
original = fastring.grouped_allreduce


def counting(tensors, *args, **kwargs):
    calls.append(len(tensors))
    return original(tensors, *args, **kwargs)


fastring.grouped_allreduce = counting
try:
    got = jax.jit(fj.allreduce_pytree, static_argnames="op")(tree, op=fj.Sum)
    jax.block_until_ready(got)
finally:
    fastring.grouped_allreduce = original
c.CHECKS.check(sorted(calls) == [1, 2], f"allreduce_pytree: fused calls of sizes {calls}, expected one per dtype")
for key, seed in (("w", 70), ("b", 71)):
    e, b = c.reference([c.rank_input(np.dtype(np.float32), tree[key].shape, r, seed) for r in range(N)], fj.Sum, N)
    check(f"allreduce_pytree {key}", got[key], e, b, np.float32)
check("allreduce_pytree step", got["step"], [N * (N + 1) // 2], 0, np.int32)

tx = optax.chain(fj.DistributedGradients(), optax.sgd(1.0))
params = {"w": jnp.zeros((3, 4), jnp.float32), "b": jnp.zeros(4, jnp.float32)}
grads = {"w": tree["w"], "b": tree["b"]}
updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
for key, seed in (("w", 70), ("b", 71)):
    e, b = c.reference([c.rank_input(np.dtype(np.float32), tree[key].shape, r, seed) for r in range(N)], fj.Average, N)
    check(f"DistributedGradients {key}", updates[key], -e, b, np.float32)

mine = {"a": jnp.full((2, 2), float(R)), "n": [jnp.arange(3) + R, jnp.asarray(np.float16(R))]}
for root in range(N):
    got = fj.broadcast_pytree(mine, root_rank=root)
    check(f"broadcast_pytree {root} a", got["a"], np.full((2, 2), float(root)), 0, np.float64)
    check(f"broadcast_pytree {root} n0", got["n"][0], np.arange(3) + root, 0, np.int64)
    check(f"broadcast_pytree {root} n1", got["n"][1], np.float16(root), 0, np.float16)

# ----------------------------------------------------------------- the route: ordered FFI custom calls
lowered = jax.jit(lambda a: fj.allreduce(a, op=fj.Sum)).lower(jnp.ones(4)).as_text()
c.CHECKS.check("fastring_collective" in lowered and "callback" not in lowered,
               "allreduce inside jit is not the fastring_collective custom call")
# Several collectives of one shape and dtype in one program, independent of each other: only
# the ordered effect keeps XLA from running them in a different order on different ranks.
xs = inputs(np.dtype(np.float64), (5,), 80)
several = jax.jit(lambda a: [fj.allreduce(a * (k + 1) + k * R, op=op)
                             for k, op in enumerate((fj.Sum, fj.Max, fj.Sum, fj.Min, fj.Product))])
for k, (op, got) in enumerate(zip((fj.Sum, fj.Max, fj.Sum, fj.Min, fj.Product), several(jnp.asarray(xs[R])))):
    expected, bound = c.reference([xs[r] * (k + 1) + k * r for r in range(N)], op, N)
    check(f"jit ordered collective {k} {op.name}", got, expected, bound)
# Successive programs dispatched without waiting (JAX runs them asynchronously), then read.
first, second = jax.jit(lambda a: fj.allreduce(a, op=fj.Sum)), jax.jit(lambda a: fj.allreduce(a, op=fj.Max))
pending = [(f, k) for k in range(3) for f in (first, second)]
results = [f(jnp.asarray(xs[R] + k)) for f, k in pending]
for (f, k), got in zip(pending, results):
    op = fj.Sum if f is first else fj.Max
    expected, bound = c.reference([xs[r] + k for r in range(N)], op, N)
    check(f"async programs {op.name} {k}", got, expected, bound)
# Inside a compiled loop: the same custom call runs once per iteration.
looped = jax.jit(lambda a: jax.lax.fori_loop(0, 4, lambda i, v: fj.allreduce(v, op=fj.Average) * 2 + R, a))
want = [x.copy() for x in xs]
for _ in range(4):
    mean = np.mean(want, axis=0)
    want = [mean * 2 + r for r in range(N)]
check("jit fori_loop allreduce", looped(jnp.asarray(xs[R])), want[R], 1e-12 * np.abs(want[R]) + 1e-12)
# An input the program still needs after the in-place collective keeps its value.
both = jax.jit(lambda a: (fj.allreduce(a, op=fj.Sum), a * 1, fj.broadcast(a, 0), a + 0))(jnp.asarray(xs[R]))
expected, bound = c.reference(xs, fj.Sum, N)
check("jit allreduce, input used after", both[0], expected, bound)
check("jit input after allreduce", both[1], xs[R])
check("jit broadcast, input used after", both[2], xs[0])
check("jit input after broadcast", both[3], xs[R])
# The output buffer XLA hands the core is written in place: a held result stays intact.
held = jax.jit(lambda a: fj.allreduce(a, op=fj.Sum))(jnp.asarray(big[R]))
held_bytes = np.asarray(held).copy()
for _ in range(2):
    jax.jit(lambda a: fj.allreduce(a, op=fj.Sum))(jnp.asarray(big[R]) * 3).block_until_ready()
c.CHECKS.check(np.array_equal(np.asarray(held), held_bytes), "a held jit result was overwritten")

# ----------------------------------------------------------------- cross-rank errors
step = jax.jit(lambda a: fj.allreduce(a, op=fj.Sum))
if N > 1:
    # the core's error reaches the caller of the jitted step with its type and message
    expect_error("jit allreduce shape mismatch", jax.errors.JaxRuntimeError, lambda: step(jnp.ones(3 + R)),
                 "FastringError: ")
    expect_error("jit allreduce shape mismatch text", jax.errors.JaxRuntimeError, lambda: step(jnp.ones(3 + R)),
                 "shape differs")
    # a program whose first collective fails runs none of the rest, on every rank alike
    two = jax.jit(lambda a, b: (fj.allreduce(a, op=fj.Sum), fj.allgather(b)))
    expect_error("jit mismatch then allgather", jax.errors.JaxRuntimeError,
                 lambda: two(jnp.ones(2, jnp.float32 if R else jnp.float64), jnp.ones(2)), "dtype")
    ok_a, ok_b = two(jnp.ones(2), jnp.ones(2))
    check("jit program after a failed one [0]", ok_a, np.full(2, N), 0, np.float64)
    check("jit program after a failed one [1]", ok_b, np.ones(2 * N), 0, np.float64)
    expect_error("eager allreduce dtype mismatch", fastring.FastringError,
                 lambda: fj.allreduce(jnp.ones(3, jnp.float32 if R else jnp.float64)), "dtype")
    expect_error("jit allgather unequal rows", Exception, lambda: jax.jit(fj.allgather)(jnp.ones((R + 1, 2))),
                 "same dimension 0 on every rank")
    expect_error("jit alltoall unequal rows", Exception, lambda: jax.jit(fj.alltoall)(jnp.ones((N * (R + 1), 2))),
                 "same dimension 0 on every rank")
# after the errors the same jitted step runs and is right
check("jit allreduce after errors", step(jnp.ones(4)), np.full(4, N), 0, np.float64)

# any error of the core inside jit reaches the caller with its type and message: here a
# residual-keeping compressor without a name, refused on every rank alike
expect_error("jit error feedback unnamed", jax.errors.JaxRuntimeError,
             lambda: jax.jit(lambda a: fj.allreduce(a, compression=fj.Compression.fp16_ef))(jnp.ones(3)),
             "ValueError: ")
check("jit allreduce after a local error", step(jnp.ones(4)), np.full(4, N), 0, np.float64)

# ----------------------------------------------------------------- local argument errors
expect_error("bad op", TypeError, lambda: fj.allreduce(jnp.ones(2), op="sum"), "ReduceOp")
expect_error("bad compression", TypeError, lambda: fj.allreduce(jnp.ones(2), compression="fp16"), "compression")
expect_error("not an array", TypeError, lambda: fj.allreduce([1.0, 2.0]), "jax.Array")
expect_error("grouped mixed dtypes", TypeError,
             lambda: fj.grouped_allreduce([jnp.ones(2), jnp.ones(2, jnp.int32)]), "one dtype")
expect_error("grouped empty", TypeError, lambda: fj.grouped_allreduce([]), "non-empty")
expect_error("gradient of Max", NotImplementedError,
             lambda: jax.grad(lambda a: jnp.sum(fj.allreduce(a, op=fj.Max)))(jnp.ones(2)), "Sum and Average")
expect_error("splits inside jit", NotImplementedError,
             lambda: jax.jit(lambda a: fj.alltoall(a, splits=[1] * N))(jnp.ones(N)), "inside jax.jit")
if N > 1:
    expect_error("alltoall rows not divisible", ValueError, lambda: fj.alltoall(jnp.ones(N + 1)), "divide")
expect_error("root out of range", ValueError, lambda: fj.broadcast(jnp.ones(2), N), "not a rank")
expect_error("0-d allgather", ValueError, lambda: fj.allgather(jnp.ones(())), "0-d")
expect_error("broadcast_pytree in jit", TypeError, lambda: jax.jit(fj.broadcast_pytree)({"a": jnp.ones(2)}),
             "outside jax.jit")

c.done("jax collectives")
