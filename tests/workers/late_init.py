"""A rank that calls init late or never. `late`: the last rank starts init 2 s after the
others, which warn on stderr (FASTRING_STALL_CHECK_TIME=0.5: the test reads it) and then start
with it; an allreduce after must be exact. `never`: the last rank never calls init (it sleeps 60 s, then leaves); with
FASTRING_STALL_SHUTDOWN_TIME=1 the others' init raises FastringError within 1 s + a margin,
which ends the job (the launcher's guard), long before the missing rank would have left."""
import sys
import time

import numpy as np

import _common as c
import fastring

R, N = c.RANK, c.SIZE
case = sys.argv[1]
if R == N - 1:
    time.sleep(2 if case == "late" else 60)
    if case == "never":
        sys.exit(0)
began = time.monotonic()
try:
    fastring.init()
except fastring.FastringError as e:
    waited = time.monotonic() - began
    print(f"rank {R}: init raised after {waited:.1f} s: {e}", flush=True)
    if waited > 1 + 2:
        c.CHECKS.fail(f"init gave up after {waited:.1f} s, more than FASTRING_STALL_SHUTDOWN_TIME + 2 s")
    raise
if case == "never":
    c.CHECKS.fail("init returned although a rank never called it")
got = fastring.allreduce(np.arange(100, dtype=np.int64) * (R + 1), op=fastring.Sum)
if not np.array_equal(got, np.arange(100, dtype=np.int64) * (N * (N + 1) // 2)):
    c.CHECKS.fail("the allreduce after a late init is wrong")
c.done(f"late init {case}")
