"""Fault injection: one rank fails in a given way while the others run collectives; the test
(tests/test_faults.py) checks how the job ends. usage: faults.py CASE

Every rank prints `rank R pid P` first. The failing rank is the last one (V = size - 1).

raise, exit0, exit3: V raises, exits 0 or exits 3 instead of calling the allreduce the others
    call; the others print `rank R: FastringError after X s: ...` when theirs fails.
stop_negotiation: after 50 small allreduces back to back, V stops itself (SIGSTOP) instead of
    calling the next, so the others wait in the negotiation cycle (the lean path's).
stop_broadcast: as stop_transfer, over 1 MiB broadcasts from V (streamed through the segment).
stop_allgather: as stop_transfer, over 4 MiB allgathers (streamed through every rank's ring).
stop_transfer, kill_transfer: the ranks loop over 64 MiB allreduces; after the second, a
    thread of V stops (SIGSTOP) or kills (SIGKILL) its own process, almost surely while the
    bytes move (the loop is nearly all transfer).
late_transfer: V arrives 6 s late at a 64 MiB allreduce.
interrupt_transfer: the ranks loop over 64 MiB allreduces (the lean path's); in the third, V's
    data phase raises KeyboardInterrupt before it moves a byte (as a Ctrl-C between the agreed
    cycle and the transfer would), V prints `rank V: interrupted` and calls the next
    allreduce, which must fail at once instead of pairing with the others' wait.
join_cpu: rank 0 joins while the others are busy (asleep) for 5 s; rank 0 prints the CPU time
    (utime + stime) its process used over those 5 s as `join cpu: F` (F: fraction of a core)
    and how often its threads slept and woke in them (`wakeups: W`, voluntary switches).
A survivor prints its error, then leaves as the job's other ranks allow (see `leave`)."""
import os
import resource
import signal
import sys
import threading
import time

import numpy as np

import _common as c
import fastring

case = sys.argv[1]
fastring.init()
N, R = c.SIZE, c.RANK
V = N - 1
print(f"rank {R} pid {os.getpid()}", flush=True)
fastring.allreduce(np.ones(2), name="warmup")  # everyone is up
big = np.ones((64 << 20) // 4, np.float32)


def stop_self_after(done: threading.Event, sig: int) -> None:
    """From a thread: send this process `sig` once `done` is set (the main thread is then in
    its next allreduce, whose transfer takes nearly all of each iteration)."""
    def run():
        done.wait()
        time.sleep(0.01)  # into the transfer, not at its first message
        os.kill(os.getpid(), sig)
    threading.Thread(target=run, daemon=True).start()


def cpu_seconds() -> float:
    """utime + stime of this process so far (/proc/self/stat, clock ticks)."""
    with open("/proc/self/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if case == "join_cpu":
    if R == 0:
        def measure():
            time.sleep(0.5)  # join's wait has begun; what follows is measured
            used, woke = cpu_seconds(), resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
            time.sleep(5)  # the window measured, not a synchronisation
            woke = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - woke
            print(f"join cpu: {(cpu_seconds() - used) / 5:.3f} wakeups: {woke}", flush=True)
        meter = threading.Thread(target=measure)
        meter.start()
        fastring.join()
        meter.join()
    else:
        time.sleep(6.5)  # busy elsewhere while rank 0 waits in join
        fastring.join()
    c.done("join cpu")
    sys.exit(0)

began = time.monotonic()
try:
    if R == V and case == "raise":
        raise ValueError(f"rank {R} failed on purpose")
    if R == V and case in ("exit0", "exit3"):
        sys.exit(0 if case == "exit0" else 3)
    if case == "stop_negotiation":
        # back to back first: the waits that then find V gone spin as in a run of calls
        # (SHM_ACTIVE_SPIN_SECONDS) and must still give up on time
        for i in range(50):  # with a stall deadline: the result waits in the block for the abandon check
            got = fastring.allreduce(np.full(4, R + 1.0), op=fastring.Sum, name="warm")
            if not np.array_equal(got, np.full(4, N * (N + 1) / 2)):
                c.fail(f"warm {i}: {got}")
        began = time.monotonic()
    if R == V and case == "stop_negotiation":
        print(f"rank {R}: stopping", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    if case in ("stop_transfer", "kill_transfer"):
        second = threading.Event()
        if R == V:
            stop_self_after(second, signal.SIGSTOP if case == "stop_transfer" else signal.SIGKILL)
        for i in range(1000):
            began = time.monotonic()
            fastring.allreduce(big, out=big, op=fastring.Max, name=f"big.{i}")
            if i == 1:
                second.set()
        c.fail("1000 allreduces completed although a rank stopped")
    elif case == "stop_broadcast":
        second = threading.Event()
        if R == V:
            stop_self_after(second, signal.SIGSTOP)
        streamed = big[:(1 << 20) // 4]  # streamed through V's ring in the segment
        for i in range(1_000_000):
            began = time.monotonic()
            fastring.broadcast(streamed, root_rank=V, out=streamed, name=f"bc.{i}")
            if i == 1:
                second.set()
        c.fail("a million broadcasts completed although their root stopped")
    elif case == "stop_allgather":
        second = threading.Event()
        if R == V:
            stop_self_after(second, signal.SIGSTOP)
        rows = big[:(4 << 20) // 4]  # every rank's rows streamed through its ring in the segment
        for i in range(1_000_000):
            began = time.monotonic()
            fastring.allgather(rows, name=f"ag.{i}")
            if i == 1:
                second.set()
        c.fail("a million allgathers completed although a rank stopped")
    elif case == "interrupt_transfer":
        from fastring._core.runtime import runtime
        if runtime().shm is None:
            c.fail("the shared segment is off: the interrupt is injected into its allreduce")
        if R == V:
            from fastring.algorithms import shm as shm_algorithm
            calls, real_run = [], shm_algorithm.SharedMemory.run

            def interrupted_third(rt, r):
                calls.append(1)
                if len(calls) == 3:
                    raise KeyboardInterrupt
                real_run(rt, r)
            shm_algorithm.SharedMemory.run = staticmethod(interrupted_third)
        for i in range(5):
            began = time.monotonic()
            try:
                fastring.allreduce(big, out=big, op=fastring.Max, name=f"big.{i}")
            except KeyboardInterrupt:
                print(f"rank {R}: interrupted", flush=True)
        c.fail("5 allreduces completed although a rank was interrupted in one")
    elif case == "late_transfer":
        if R == V:
            time.sleep(6)  # the lateness itself is what is tested
        began = time.monotonic()
        fastring.allreduce(big, out=big, name="late_big")
        c.fail("the allreduce completed although a rank was late")
    else:
        fastring.allreduce(np.ones(4), name="small")
        c.fail("the allreduce completed although a rank failed")
except fastring.FastringError as e:
    print(f"rank {R}: FastringError after {time.monotonic() - began:.1f} s: {e}", flush=True)
