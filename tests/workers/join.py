"""join: rank r has r + 2 batches; after its last batch it joins and contributes zeros to the
others' allreduces (named, unnamed-async, grouped); Average divides by the full size; every
rank gets the last rank to join."""
import numpy as np

import _common as c
import fastring

fastring.init()
N, R = c.SIZE, c.RANK
batches = R + 2
for step in range(batches):
    # ranks still in the loop at this step: those with more than `step` batches
    active = [r for r in range(N) if r + 2 > step]
    got = fastring.allreduce(np.full(5, float(R + 1)), op=fastring.Sum, name="loss")
    c.check_close(f"step {step} sum", got, np.full(5, float(sum(r + 1 for r in active))), 0)
    avg = fastring.allreduce(np.full(3, 6.0, np.float32), name=f"avg{step % 2}")
    c.check_close(f"step {step} average", avg, np.full(3, 6.0 * len(active) / N), 1e-6)
    g = fastring.grouped_allreduce([np.ones(2, np.int64), np.ones((2, 2), np.int64)], op=fastring.Sum, name="grp")
    c.check_close(f"step {step} grouped", g[1], np.full((2, 2), len(active)), 0)
last = fastring.join()
if last != N - 1:
    c.fail(f"join returned {last}, expected the last rank to join, {N - 1}")
# after everyone joined, collectives work normally again
c.check_close("after join", fastring.allreduce(np.ones(2), op=fastring.Sum), np.full(2, N), 0)
c.done("join")
