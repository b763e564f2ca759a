"""int16, uint16, uint32 and uint64 (argv[1]: numpy or torch) through every collective and
every allreduce algorithm on N ranks: exact results, including sums and products that wrap
around the type's range as NumPy's do, the exact truncated integer mean, and the clear errors
where uint64 cannot be computed exactly (Average, scale factors)."""
import sys

import numpy as np

import _common as c
import fastring

N, R = c.SIZE, c.RANK
to_fw, from_fw = c.converters(sys.argv[1])
NEW = [np.dtype(d) for d in (np.int16, np.uint16, np.uint32, np.uint64)]
fastring.init()


def rank_values(dt: np.dtype, count: int, rank: int) -> np.ndarray:
    """Values spread over the whole range of `dt`, so that sums and products wrap."""
    info = np.iinfo(dt)
    rng = np.random.default_rng([7, rank, dt.num])
    return rng.integers(info.min, info.max, count, dtype=dt, endpoint=True)


def wrapped(reduce, stack, dt):
    """The reduction in Python integers, wrapped into `dt` as two's complement does."""
    bits = 8 * dt.itemsize
    out = []
    for column in stack.astype(object).T:
        v = reduce(column) % (1 << bits)
        if dt.kind == "i" and v >= 1 << (bits - 1):
            v -= 1 << bits
        out.append(v)
    return np.array(out, dtype=object).astype(dt)


def product(col):
    p = 1
    for v in col:
        p *= int(v)
    return p


for algorithm in ("auto", "ring", "recursive_doubling", "mpi"):
    c.reinit(algorithm)
    for dt in NEW:
        for count in (5, 20000):  # in the negotiation cycle, and through the algorithm
            inputs = [rank_values(dt, count, r) for r in range(N)]
            stack = np.stack(inputs)
            expected = {fastring.Sum: wrapped(sum, stack, dt), fastring.Product: wrapped(product, stack, dt),
                        fastring.Min: stack.min(0), fastring.Max: stack.max(0)}
            if dt != np.uint64:
                expected[fastring.Average] = c.exact_int_mean(stack).astype(dt)
            for op, want in expected.items():
                got = from_fw(fastring.allreduce(to_fw(inputs[R]), op=op))
                c.check_close(f"{algorithm} allreduce {op.name} {dt} x{count}", got, want, 0)
            got = fastring.grouped_allreduce([to_fw(inputs[R][:3]), to_fw(inputs[R][3:])], op=fastring.Sum)
            c.check_close(f"{algorithm} grouped_allreduce {dt} x{count}",
                          np.concatenate([from_fw(g) for g in got]), expected[fastring.Sum], 0)

for dt in NEW:
    mine = rank_values(dt, 6 * N, R).reshape(2 * N, 3)
    every = [rank_values(dt, 6 * N, r).reshape(2 * N, 3) for r in range(N)]
    c.check_close(f"allgather {dt}", from_fw(fastring.allgather(to_fw(mine))), np.concatenate(every), 0)
    c.check_close(f"broadcast {dt}", from_fw(fastring.broadcast(to_fw(mine), N - 1)), every[N - 1], 0)
    got = from_fw(fastring.alltoall(to_fw(mine)))
    c.check_close(f"alltoall {dt}", got, np.concatenate([e[2 * R:2 * R + 2] for e in every]), 0)
    got = from_fw(fastring.reducescatter(to_fw(mine), op=fastring.Max))
    c.check_close(f"reducescatter Max {dt}", got, np.stack(every).max(0)[2 * R:2 * R + 2], 0)
    got = from_fw(fastring.reducescatter(to_fw(mine), op=fastring.Sum))
    c.check_close(f"reducescatter Sum {dt}", got,
                  wrapped(sum, np.stack(every).reshape(N, -1), dt).reshape(2 * N, 3)[2 * R:2 * R + 2], 0)

# uint64 cannot be averaged or scaled exactly: refused on the calling rank, before anything moves
u = to_fw(np.full(3, np.iinfo(np.uint64).max, np.uint64))
for call in (lambda: fastring.allreduce(u, op=fastring.Average), lambda: fastring.reducescatter(u),
             lambda: fastring.allreduce(u, op=fastring.Sum, prescale_factor=2.0)):
    try:
        call()
        c.fail("uint64 Average or scale factor: no TypeError")
    except TypeError as e:
        if "uint64" not in str(e):
            c.fail(f"the uint64 error does not name the dtype: {e}")
c.done(f"int16/uint16/uint32/uint64 ({sys.argv[1]})")
