"""A stall inside a process set (run with FASTRING_STALL_SHUTDOWN_TIME=2 on 3 ranks): rank 0
calls an allreduce of the set {0, 1} that rank 1 never calls. Rank 0 gets FastringError
naming rank 1 on time; the global set is untouched and goes on working; removing the broken
set and shutting down end without hanging on any rank."""
import time

import numpy as np

import _common as c
import fastring

R = c.RANK
fastring.init()
pair = fastring.add_process_set([0, 1])
start = time.monotonic()
if R == 0:
    try:
        fastring.allreduce(np.ones(3), name="lonely", process_set=pair)
        c.fail("an allreduce that rank 1 never called completed")
    except fastring.FastringError as e:
        if "rank 1" not in str(e) or "lonely" not in str(e):
            c.fail(f"the stall error does not name rank 1 and the tensor: {e}")
        if not 2.0 <= time.monotonic() - start < 10.0:
            c.fail(f"the stall error came after {time.monotonic() - start:.1f} s, expected about 2 s")
# nobody enters the global set's next collective before rank 0 has given up, so that the
# global set itself never waits long enough to stall
time.sleep(max(0.0, 4.5 - (time.monotonic() - start)))
c.check_close("the global set after a set's stall", fastring.allreduce(np.ones(2), op=fastring.Sum),
              np.full(2, float(c.SIZE)), 0)
if not fastring.remove_process_set(pair):
    c.fail("remove_process_set of the stalled set returned False")
c.done("process set stall")
