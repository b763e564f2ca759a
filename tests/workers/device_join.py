"""join with device tensors: rank r has r + 2 steps; a rank that has joined contributes zeros to
the others' device allreduces (named, grouped, Average) by running the same device ring.

The engine builds a joined rank's zeros request from the agreed fields, device included, so
the joined rank runs the same device ring as the others.
"""
import numpy as np
from numba import cuda

import _common as c
import fastring

fastring.init()
N, R = c.SIZE, c.RANK
for step in range(R + 2):
    active = [r for r in range(N) if r + 2 > step]
    got = fastring.allreduce(cuda.to_device(np.full(5, R + 1.0, np.float32)), op=fastring.Sum,
                             name="loss")
    c.check_close(f"step {step} sum", got.copy_to_host(), np.full(5, float(sum(r + 1 for r in active))), 0)
    avg = fastring.allreduce(cuda.to_device(np.full(3, 6.0, np.float16)), name="avg")
    c.check_close(f"step {step} average", avg.copy_to_host(), np.full(3, 6.0 * len(active) / N), 1e-3)
    g = fastring.grouped_allreduce([cuda.to_device(np.ones(2, np.int32)),
                                    cuda.to_device(np.ones((2, 2), np.int32))], op=fastring.Sum, name="grp")
    c.check_close(f"step {step} grouped", g[1].copy_to_host(), np.full((2, 2), len(active)), 0)
last = fastring.join()
if last != N - 1:
    c.fail(f"join returned {last}, expected {N - 1}")
c.check_close("after join", fastring.allreduce(cuda.to_device(np.ones(2)), op=fastring.Sum).copy_to_host(),
              np.full(2, N), 0)
c.done("device join")
