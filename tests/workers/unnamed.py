"""Unnamed calls stay paired across ranks: from several threads per rank, after a local
argument error on one rank only, and after a rank has joined (sync and async)."""
import sys
import threading

import numpy as np

import _common as c
import fastring

fastring.init()
N, R = c.SIZE, c.RANK
case = sys.argv[1]

if case == "threads":
    # Each thread's k-th unnamed call must meet the same thread's k-th call on the others,
    # however the threads are scheduled.
    errors = []

    def work(t: int) -> None:
        for k in range(60):
            value = 1000 * t + k
            got = fastring.allreduce(np.full(3, value + R, np.int64), op=fastring.Sum)
            expected = N * value + sum(range(N))
            if got.tolist() != [expected] * 3:
                errors.append(f"thread {t} step {k}: got {got.tolist()}, expected {expected}")
            if (k + R) % 7 == 0:
                h = fastring.allreduce_async(np.full(2, value, np.int32), op=fastring.Max)
                if h.wait().tolist() != [value, value]:
                    errors.append(f"thread {t} step {k} async: wrong result")
    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        c.fail(f"{len(errors)} wrong: " + "; ".join(errors[:5]))

elif case == "local_error":
    # Rank 0 makes a mistake only it can see; everyone's next unnamed call still pairs right.
    fastring.allreduce(np.ones(2), op=fastring.Sum)
    if R == 0:
        try:
            fastring.allreduce(np.ones(2, np.complex64), op=fastring.Sum)  # unsupported dtype
            c.fail("complex64 was accepted")
        except TypeError:
            pass
    else:
        h = fastring.allreduce_async(np.ones(2), op=fastring.Sum)  # never matched on rank 0
    got = fastring.allreduce(np.full(2, R + 1.0), op=fastring.Sum)
    c.check_close("after a local error on rank 0", got, np.full(2, N * (N + 1) / 2), 0)

elif case == "join":
    # Rank r has r + 1 steps of unnamed sync and async allreduces, then joins; afterwards
    # unnamed calls pair step for step again.
    for step in range(R + 1):
        got = fastring.allreduce(np.full(2, step + 1, np.int64), op=fastring.Sum)
        active = [r for r in range(N) if r + 1 > step]
        c.check_close(f"step {step}", got, np.full(2, (step + 1) * len(active)), 0)
        h = fastring.allreduce_async(np.full(2, 100 + step, np.int64), op=fastring.Sum)
        c.check_close(f"step {step} async", h.wait(), np.full(2, (100 + step) * len(active)), 0)
    fastring.join()
    for k in range(3):
        h = fastring.allreduce_async(np.full(2, 600 * k + R, np.int64), op=fastring.Sum)
        got = fastring.allreduce(np.full(2, k + 1, np.int64), op=fastring.Sum)
        c.check_close(f"after join {k}", got, np.full(2, N * (k + 1)), 0)
        c.check_close(f"after join {k} async", h.wait(), np.full(2, N * 600 * k + sum(range(N))), 0)
c.done(f"unnamed {case}")
