"""A rank that arrives late: with FASTRING_STALL_SHUTDOWN_TIME=2 (and the default 60 s check
time) the waiting rank's collective fails within the shutdown time plus 2 s, naming the late
rank; the late rank, finding nobody, fails the same way; both exit cleanly."""
import sys
import time

import numpy as np

import _common as c
import fastring

fastring.init()
N, R = c.SIZE, c.RANK
late = N - 1
nbytes = int(sys.argv[1])
fastring.allreduce(np.ones(2))  # everyone is up
if R == late:
    time.sleep(6)
began = time.monotonic()
try:
    fastring.allreduce(np.ones(nbytes // 8), name="late_one")
    c.fail("the allreduce completed although a rank was late")
except fastring.FastringError as e:
    waited = time.monotonic() - began
    if R != late and str(late) not in str(e):
        c.fail(f"the error does not name rank {late}: {e}")
    if waited > 2 + 2:
        c.fail(f"the error came after {waited:.1f} s, more than FASTRING_STALL_SHUTDOWN_TIME + 2 s")
    print(f"rank {R}: FastringError after {waited:.1f} s", flush=True)
