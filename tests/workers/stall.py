"""Stall inspector. usage: stall.py silent|late|crossed
silent: rank 1.. never submit; rank 0's allreduce must fail with FastringError naming rank 1.
late: rank 1.. submit after 2.5 s; rank 0 logs a stall warning, then completes.
crossed: rank 0 submits 'x', the others 'y'; each logs which ranks lack its name and fails."""
import os
import sys
import time

import numpy as np

import _common as c
import fastring

mode = sys.argv[1]


def leave():
    """Exit all ranks together, skipping MPI_Finalize: the cycle that rank 0 abandoned
    after its stall error still has a request outstanding."""
    c.COMM.Barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)



fastring.init()
R, N = c.RANK, c.SIZE
start = time.monotonic()
if mode == "silent":
    if R == 0:
        try:
            fastring.allreduce(np.ones(4), name="lonely")
            c.fail("no FastringError for a stalled allreduce")
        except fastring.FastringError as e:
            if "rank" not in str(e):
                c.fail(f"stall error does not name ranks: {e}")
            print(f"stalled after {time.monotonic() - start:.1f}s: {e}", flush=True)
    else:
        time.sleep(6)
    leave()
elif mode == "late":
    if R != 0:
        time.sleep(2.5)
    got = fastring.allreduce(np.ones(4), op=fastring.Sum, name="slow")
    c.check_close("late", got, np.full(4, N), 0)
elif mode == "crossed":
    name = "x" if R == 0 else "y"
    try:
        fastring.allreduce(np.ones(4), name=name)
        c.fail("no FastringError for crossed names")
    except fastring.FastringError as e:
        print(f"rank {R} error: {e}", flush=True)
    leave()
c.done(f"stall {mode}")
