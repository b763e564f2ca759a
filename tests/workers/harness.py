"""Workers that fail on purpose, for the harness's own tests (tests/test_harness.py).
usage: harness.py MODE MARKER  (MARKER only tags the processes, for pgrep)
hang:       every rank prints 'ready', then rank 0 waits in a barrier that rank 1 never joins;
            rank 1 ignores SIGTERM and SIGINT, and first starts a process in a session of its
            own that ignores them too and holds the output pipes, as a data-loading worker
            might: hydra stops the ranks, but not that one.
checks:     rank 1 fails two check_close calls and rank 0 none; done() must report both.
unreported: rank 1 records a failed check and the worker ends without done().
assert:     rank 1 fails a plain assert while rank 0 waits in a barrier."""
import signal
import subprocess
import sys

import numpy as np

import _common as c

mode = sys.argv[1]
if mode == "hang":
    if c.RANK == 0:
        print(f"rank {c.RANK} ready", flush=True)
        c.COMM.Barrier()
    else:
        stubborn = "import signal; [signal.signal(s, signal.SIG_IGN) for s in (2, 15)]; signal.pause()"
        subprocess.Popen([sys.executable, "-c", stubborn, *sys.argv[2:]], start_new_session=True)
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        print(f"rank {c.RANK} ready", flush=True)
        signal.pause()
elif mode == "checks":
    wrong = c.RANK  # rank 1 gets every element wrong by one
    c.check_close("first sum", np.full(3, 2 + wrong), np.full(3, 2), 0)
    c.check_close("second sum", np.full(2, 0.5 + wrong), np.full(2, 0.5), 1e-6)
    c.done("harness checks")
elif mode == "unreported":
    c.check_close("never reported", np.arange(2) + c.RANK, np.arange(2), 0)
    c.COMM.Barrier()
elif mode == "assert":
    print(f"rank {c.RANK} ready", flush=True)
    if c.RANK == 1:
        assert 1 + 1 == 3, "arithmetic is broken on rank 1"
    c.COMM.Barrier()
    c.done("harness assert")
else:
    raise SystemExit(f"unknown mode {mode!r}")
