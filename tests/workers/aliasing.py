"""allreduce and broadcast whose `out` is the input's memory through another view (in place),
or overlaps it partially (the result must be as if the input had been read first)."""
import numpy as np

import _common as c
import fastring

fastring.init()
N, R = c.SIZE, c.RANK
for n in (5, 40_000):  # in the cycle, and through the ring (160 KB of int32)
    base = np.arange(2 * n, dtype=np.int32) + R
    x0 = base.copy()
    buf = base.reshape(2, n)
    fastring.allreduce(buf[0], op=fastring.Sum, out=buf[0])   # a new view of the same memory each time
    expected = sum(x0[:n] - R + r for r in range(N))
    c.check_close(f"n={n} in place through a view", buf[0], expected, 0)
    c.check_close(f"n={n} rest untouched", buf[1], x0[n:], 0)

    # out starts one element after the input: writing out[i] overwrites input[i + 1]
    base = np.arange(n + 1, dtype=np.int64) * 3 + R
    inputs = [base[:n] - R + r for r in range(N)]
    fastring.allreduce(base[:n], op=fastring.Sum, out=base[1:])
    c.check_close(f"n={n} partial overlap, out after input", base[1:], sum(inputs), 0)
    base = np.arange(n + 1, dtype=np.int64) * 3 + R
    inputs = [base[1:] - R + r for r in range(N)]
    fastring.allreduce(base[1:], op=fastring.Sum, out=base[:n])
    c.check_close(f"n={n} partial overlap, out before input", base[:n], sum(inputs), 0)

    # broadcast into an overlapping out
    src = np.arange(n + 1, dtype=np.float64) + 10 * R
    root_input = np.arange(n, dtype=np.float64)  # rank 0's src[:n]
    fastring.broadcast(src[:n], 0, out=src[1:])
    c.check_close(f"n={n} broadcast, partial overlap", src[1:], root_input, 0)
c.done("aliasing")
