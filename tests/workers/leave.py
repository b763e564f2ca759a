"""A rank that leaves (returns from the script, sys.exit(0), fastring.shutdown) never blocks the
others: their pending collectives fail with an error naming it, and every rank exits."""
import sys
import time

import numpy as np

import _common as c
import fastring
from fastring import FastringError

fastring.init()
N, R = c.SIZE, c.RANK
case = sys.argv[1]
fastring.allreduce(np.ones(2), op=fastring.Sum)  # everyone is up

if case == "exit_while_others_wait":
    if R == 0:
        sys.exit(0)  # atexit shuts fastring down
    try:
        fastring.allreduce(np.ones(1 << 16, np.float32), name="never")
        c.fail("the allreduce completed without rank 0")
    except FastringError as e:
        if "rank 0 shut down" not in str(e):
            c.fail(f"the error does not name rank 0: {e}")
    try:
        fastring.allreduce(np.ones(2))
        c.fail("a collective ran after a rank left")
    except FastringError:
        pass
    print(f"rank {R}: got the error", flush=True)

elif case == "pending_async_at_exit":
    # Unwaited asynchronous work, and ranks that finish a few ms apart.
    fastring.allreduce_async(np.ones(3), name="unwaited")
    if R == 0:
        fastring.allreduce_async(np.ones(3), name="only_rank_0")
    time.sleep(0.02 * R)
    print(f"rank {R}: leaving", flush=True)

elif case == "shutdown_then_wait":
    if R == N - 1:
        fastring.shutdown()
    else:
        h = fastring.allreduce_async(np.ones(4), name="late")
        try:
            h.wait()
            c.fail("completed without the last rank")
        except FastringError as e:
            if f"rank {N - 1} shut down" not in str(e):
                c.fail(f"the error does not name rank {N - 1}: {e}")
    print(f"rank {R}: done", flush=True)
