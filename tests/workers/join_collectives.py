"""While ranks have joined, allgather (a joined rank adds no rows), broadcast (it receives),
barrier and allreduce work on the others, a collective a joined rank cannot take part in
raises FastringError on every rank that called it, and afterwards everything pairs again."""
import numpy as np

import _common as c
import fastring

fastring.init()
N, R = c.SIZE, c.RANK
root = N - 1  # the last to join
for step in range(R + 1):
    active = [r for r in range(N) if r + 1 > step]
    got = fastring.allgather(np.full((r_rows := R + 1, 2), R, np.int32), name="rows")
    expected = np.concatenate([np.full((r + 1, 2), r, np.int32) for r in active])
    c.check_close(f"step {step} allgather", got, expected, 0)
    got = fastring.allgather(np.full(R + 1, R, np.int64))  # unnamed
    c.check_close(f"step {step} unnamed allgather", got, np.concatenate([np.full(r + 1, r) for r in active]), 0)
    buf = np.full(5, 100 * step + R, np.float64)
    fastring.broadcast(buf, root, out=buf, name="b")
    c.check_close(f"step {step} broadcast", buf, np.full(5, 100 * step + root, np.float64), 0)
    big = fastring.broadcast(np.full(1 << 16, step + R, np.float32), root)  # 256 KiB, unnamed
    c.check_close(f"step {step} large broadcast", big, np.full(1 << 16, step + root, np.float32), 0)
    fastring.barrier()
    if len(active) < N:
        try:
            fastring.alltoall(np.zeros(N), name=f"a2a{step}")
            c.fail("alltoall ran while a rank had joined")
        except fastring.FastringError as e:
            if "joined" not in str(e):
                c.fail(f"the alltoall error does not say why: {e}")
last = fastring.join()
if last != N - 1:
    c.fail(f"join returned {last}, expected {N - 1}")
for k in range(3):  # small broadcasts after the join carry their own bytes
    x = fastring.broadcast(np.arange(5.0) * 100 + k if R == 0 else np.zeros(5), 0)
    c.check_close(f"broadcast {k} after join", x, np.arange(5.0) * 100 + k, 0)
    c.check_close(f"allgather {k} after join", fastring.allgather(np.full(1, R)), np.arange(N), 0)
c.done("join with every collective")
