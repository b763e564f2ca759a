"""Integer Average is the exact mean truncated toward zero, never a wrapped sum: equal values
average to themselves at the limits of every integer dtype, and mixed values match Python's
integer arithmetic; in the cycle (small), through the ring (large), grouped and async."""
import numpy as np

import _common as c
import fastring

fastring.init()
N, R = c.SIZE, c.RANK
for dtype in (np.uint8, np.int8, np.int32, np.int64):
    info = np.iinfo(dtype)
    for n in (7, 70_000):
        for value in (info.max, info.min, info.max - 1, 200 if dtype == np.uint8 else 100):
            got = fastring.allreduce(np.full(n, value, dtype))
            c.check_close(f"{np.dtype(dtype).name} n={n} mean of {value}", got, np.full(n, value, dtype), 0)
        # mixed values near both limits: Python's exact mean truncated toward zero
        rng = np.random.default_rng([5, n])
        inputs = [rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True) for _ in range(N)]
        expected = c.exact_int_mean(np.stack(inputs)).astype(dtype)
        got = fastring.allreduce(inputs[R].copy(), name=f"mixed.{np.dtype(dtype).name}.{n}")
        c.check_close(f"{np.dtype(dtype).name} n={n} mixed", got, expected, 0)
        h = fastring.allreduce_async(inputs[R].copy())
        c.check_close(f"{np.dtype(dtype).name} n={n} mixed async", h.wait(), expected, 0)
        x = inputs[R].copy()
        fastring.allreduce(x, out=x)
        c.check_close(f"{np.dtype(dtype).name} n={n} mixed in place", x, expected, 0)
    g = fastring.grouped_allreduce([np.full(3, info.max, dtype), np.full((2, 2), info.min, dtype)])
    c.check_close(f"{np.dtype(dtype).name} grouped 0", g[0], np.full(3, info.max, dtype), 0)
    c.check_close(f"{np.dtype(dtype).name} grouped 1", g[1], np.full((2, 2), info.min, dtype), 0)
    # reducescatter: rows split over the ranks, ranks 0..(d0 % N)-1 one row more
    rows = 2 * N + 1
    inputs = [np.random.default_rng([9, r]).integers(info.min, info.max, (rows, 3), dtype=dtype, endpoint=True)
              for r in range(N)]
    mean = c.exact_int_mean(np.stack(inputs)).astype(dtype)
    bounds = np.cumsum([0] + [rows // N + (r < rows % N) for r in range(N)])
    got = fastring.reducescatter(inputs[R].copy())
    c.check_close(f"{np.dtype(dtype).name} reducescatter", got, mean[bounds[R]:bounds[R + 1]], 0)
    got = fastring.reducescatter(np.full((rows, 2), info.max, dtype))
    c.check_close(f"{np.dtype(dtype).name} reducescatter of max", got,
                  np.full((bounds[R + 1] - bounds[R], 2), info.max, dtype), 0)
c.done("integer average")
