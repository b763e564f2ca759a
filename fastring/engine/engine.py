"""The engine: queued requests, the cycles that negotiate them, join, and their execution.

Every collective is a Request submitted here; the synchronous API is submit + wait, or the
shortcut below.
How a cycle works is `negotiation`; how agreed requests run is `fusion`; stalls are `stall`.

All ranks derive the same decisions from the same cycle result, so they execute the same
collectives in the same order. Cycles run on the thread that waits on a handle (no wake-up
latency for synchronous calls) or on one background thread for asynchronous work; one lock
makes them take turns, and the transport releases the GIL while bytes move.

A synchronous call made while nothing is queued here takes one shortcut, `_speculate_alone`:
the cycle that proposes it is run inline on the caller's thread, and only if the ranks
disagree does the request join the queue like any other. The lean numpy allreduce
(`lone_allreduce`, `lone_grouped`) and every other synchronous collective (`lone_run`) take
the same step without building a Request first.
"""
from __future__ import annotations

import atexit
import logging
import pickle
import threading
import time
from typing import Callable

import numpy as np

from .. import algorithms
from ..algorithms import broadcast_bytes
from ..algorithms.collectives import allgather_bytes, allgather_concat
from .._core import pool as _pool
from .._core.compression import Compression
from .._core.config import (BURST_MOST_CYCLES, BURST_QUIET_CYCLES, FINALIZE_WAIT_SECONDS, POLL_IDLE_CYCLES,
                            SMALL_MESSAGE_BYTES)
from .._core.dtypes import SUPPORTED, DtypeSpec
from .._core.errors import FastringError
from .._core.ops import ReduceOp
from .._core.work import Entry, Finish, finalizer, nothing, pack, predivides, work_of
from .._transport import (SPECULATION_FAILED, copy_from_array, copy_to_array, exit_unless_gone_within,
                          is_c_contiguous, is_writable_c_contiguous, sort_by_cache, views_of)
from .._transport.gate import IDLE, STOP, Gate
from .._transport.handle import finish_all
from .fusion import Executor
from .negotiation import (HAS_UNCACHED, LEAVING, LEFT_RANK_SHIFT, NO_PAYLOAD, WANT_REPORT, Negotiation,
                          describe_mismatch, is_clean, leaving_flags, ranks_leaving)
from .request import Handle, Request
from .stall import DataStallReporter, StallReporter, stall_error, stall_interval
from .timeline import Timeline

log = logging.getLogger("fastring")
# a class attribute of an enum costs a lean call 60 ns to look up; a module global does not
_AVERAGE = ReduceOp.Average
# named lean allreduces (Engine._lone_calls), and the sizes' algorithms (_lone_algorithms), remembered
LONE_CALLS_KEPT = 4096
_NOT_CACHED = (None, None)


def _no_payload(words: int) -> tuple[int, tuple[int, int]]:
    """The payload writer of a cycle that carries no data."""
    return 0, NO_PAYLOAD


class Engine:
    """Owner of one runtime's queued collectives (see the module docstring)."""

    def __init__(self, rt):
        self.rt = rt
        self.config = rt.config
        self.timeline = Timeline(rt.rank, rt.transport.comm, self.config.timeline)
        # guards _noname, the gate's drivers, and the steps on _pending that must not be split
        # (submit queues a name in one step of its own, which needs no lock)
        self._queue_lock = threading.Lock()
        self._cycle_lock = threading.Lock()   # one cycle at a time, on any thread
        self._wake = threading.Condition()
        self._done_cv = threading.Condition()  # threads waiting on a handle another runs
        self._waiters = 0
        self._completed = 0  # requests finished so far: tells a waiting thread about progress
        self._join_handle: Handle | None = None  # set while this rank has joined
        self._join_order: list[int] = []
        self._pending: dict[str, Request] = {}
        # name -> (fields, signature hash, reducer) of a lean allreduce: one lookup a call when
        # the name comes back with the very same fields object (the api's plans hand it out)
        self._lone_calls: dict[str, tuple] = {}
        # (bytes, dtype name) -> (algorithm, its stall label) of a lean allreduce above the
        # cycle: the rest of the choice (the runtime, config.algorithm) is fixed for this
        # engine's life
        self._lone_algorithms: dict[tuple, tuple] = {}
        self._noname: dict = {}  # kind (main thread) or (thread name, kind) -> next number
        self._keep_cycling = False   # some rank still had work after the last cycle
        self._speculate = True
        self._first_report = stall_interval(self.config, 0.0)  # a new request's first inspection
        self._broken: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._asleep = False  # the background thread waits in Python (or is about to) for work
        # where the background thread waits with the GIL released: it reads the queue, the
        # latest submission's time, the threads in drive() and _keep_cycling's copy
        self._gate = Gate(self._pending, BURST_QUIET_CYCLES, BURST_MOST_CYCLES, POLL_IDLE_CYCLES)
        self._running = True
        self._neg = Negotiation(rt.transport, StallReporter(self.config.stall_check_time,
                                                            self.config.stall_shutdown_time),
                                getattr(rt, "shm", None))
        self._executor = Executor(rt, self.timeline, self._complete, self._complete_all)
        # Every wait of the data phase warns and gives up on time too (stall.DataStallReporter);
        # only a rank with a deadline abandons, so only then can an abandon notice come.
        self._data_stall = DataStallReporter(
            self.config.stall_check_time, self.config.stall_shutdown_time, lambda: self._executor.running,
            self._neg.check_abandoned if self.config.stall_shutdown_time > 0 and rt.size > 1 else None,
            self._abandon, lambda interval: rt.set_stall(interval, self._data_stall))
        rt.set_stall(self._data_stall.interval, self._data_stall)

    # ----------------------------------------------------------------- submission
    def auto_name(self, kind: str) -> str:
        """Deterministic names for unnamed requests: the n-th unnamed `kind` of this thread.

        Counted per thread (by thread name), so that threads that make collectives in the
        same order on every rank pair up correctly whatever order they are scheduled in.
        """
        thread = threading.current_thread()
        if thread is threading.main_thread():
            key, prefix = kind, kind
        else:
            key, prefix = (thread.name, kind), f"{kind}.{thread.name}"
        n = self._noname.get(key, 0)
        self._noname[key] = n + 1  # only this thread writes this key (join aside, see below)
        return f"{prefix}.noname.{n}"

    def _note_automatic_name(self, name: str) -> None:
        """A joined rank takes part in `name` without having called it: count it as called,
        so that this rank's next unnamed call of that kind pairs with the other ranks'."""
        prefix, sep, number = name.rpartition(".noname.")
        if not sep or not number.isdigit():
            return
        kind, _, thread = prefix.partition(".")
        key = (thread, kind) if thread else kind
        with self._queue_lock:
            self._noname[key] = max(self._noname.get(key, 0), int(number) + 1)

    def submit(self, request: Request, background: bool = True) -> Handle:
        """Queue `request` for the next cycles; returns its handle."""
        if self._broken is not None:
            raise FastringError(f"fastring cannot run collectives after: {described(self._broken)}")
        # (its signature hash is taken when a cycle proposes it: most queued requests never are)
        request.submitted = now = time.monotonic()
        request.next_report = now + self._first_report
        name = request.name
        self._gate.submitted(now)
        # one step under the GIL, which two threads cannot both take for one name: a lock here
        # cost a fifth of a µs a request
        if self._pending.setdefault(name, request) is not request:
            raise already_in_flight(name)
        if self.timeline.recording:
            self.timeline.begin(name, "queued")
        # Wake the background thread only if it waits in Python, idle for long (the gate finds
        # the request otherwise): it raises _asleep before it looks at the queue, so one that
        # did not see this request yet will.
        if background and (self._asleep or self._thread is None):
            self._start_background()
        return request.handle

    def _idle(self) -> bool:
        """Nothing queued or owed here: a synchronous call may speculate alone."""
        return (not self._pending and not self._keep_cycling and self._speculate and self._broken is None
                and self._join_handle is None and not self.timeline.recording)

    def run(self, req: Request):
        """Submit `req` and wait for it: the synchronous form of every collective."""
        if self._idle() and self._cycle_lock.acquire(blocking=False):
            try:
                if not self._pending and not self._keep_cycling:
                    clean, outcome, words, req.signature_hash = self._speculate_alone(
                        req.name, req.fields, lambda words: self._write_payload(req, words))
                    if not clean:
                        self._lone_failed(req, outcome, words)
                    elif req.rides_cycle:
                        self._finish_speculation(req, words)
                    else:
                        self._executor.execute([req])
            except BaseException as e:  # noqa: BLE001 - delivered to every waiter
                self._abandon(e)
                if not req.handle._done:
                    req.handle._finish(error=e)
            finally:
                self._cycle_lock.release()
        return self._wait_queued(req)

    def lone_allreduce(self, arr: np.ndarray, spec: DtypeSpec, op: ReduceOp, name: str | None,
                       fields: tuple, out: np.ndarray | None,
                       request: Callable[[object, np.ndarray, np.ndarray | None, ReduceOp, str], Request]):
        """A synchronous plain host allreduce (no compression, no scale factors, `fields` as
        the general path would build them) while nothing is queued here: `_speculate_alone`,
        carrying the data itself when it is small (one transport call, `Negotiation.lone_exchange`),
        then the reduction, without building a Request unless the ranks disagree
        (`request(rt, arr, out, op, name)` builds it then). The result goes to `out` (`arr`
        itself: in place), or to a new array when it is None. Returns the result, or None when
        the general path must take the call; nothing has happened then."""
        if not (self._idle() and (is_writable_c_contiguous(arr) if out is arr else is_c_contiguous(arr) and (
                out is None or (is_writable_c_contiguous(out) and out.shape == arr.shape and out.dtype == arr.dtype)))):
            return None
        # Nothing is queued, so whoever holds the lock (the background thread looking for
        # work, another thread's own lone cycle) lets go within one cycle.
        self._cycle_lock.acquire()
        try:
            try:
                if self._pending or self._keep_cycling:
                    return None
                name = name or self.auto_name("allreduce")
                small = arr.nbytes <= SMALL_MESSAGE_BYTES  # InCycle.fits, for a host array
                result = _pool.empty(arr.shape, arr.dtype) if out is None else out
                if small:
                    known = self._lone_calls.get(name)
                    if known is None or known[0] is not fields:
                        known = self._lone_signature(name, fields, op, arr.dtype)
                    failed = self._lone_payload(name, fields, known[1], arr, result, known[2])
                else:
                    failed = self._speculate_lone(name, fields)
                if failed is not None:
                    req = self._lone_failed(request(self.rt, arr, out, op, name), *failed)
            except BaseException as e:  # noqa: BLE001 - every waiter must hear of it
                self._abandon(e)
                raise
            if failed is None:
                # as in execution, an error of the reduction itself is the caller's alone
                if small:
                    if op is _AVERAGE and self.rt.size > 1:
                        self._average_finish(op)(result.reshape(-1))
                    return result
                try:
                    divide = self._average_finish(op)
                    flat = result.reshape(-1)
                    algorithm, label = self._lone_algorithm(arr.nbytes, spec)
                    self._executor.running = (label, [name])  # for a stall's message
                    algorithm.run(self.rt, algorithms.Reduction(flat, spec, op, divide,
                                                                src=None if result is arr else arr.reshape(-1)))
                except BaseException as e:  # noqa: BLE001 - see _interrupted
                    self._interrupted(e)
                    raise
                return result
        finally:
            self._cycle_lock.release()
        return self._wait_queued(req)

    def _lone_algorithm(self, nbytes: int, spec: DtypeSpec) -> tuple:
        """(the algorithm, its label in a stall's message) of a lean allreduce of `nbytes` of
        `spec`, chosen once per size and dtype (LONE_CALLS_KEPT of them), the rest of the
        choice being this engine's runtime and settings."""
        key = (nbytes, spec.name)
        known = self._lone_algorithms.get(key)
        if known is None:
            algorithm = algorithms.choose("allreduce", nbytes, spec, rt=self.rt, setting=self.config.algorithm,
                                          may_ride_cycle=False)
            known = (algorithm, f"allreduce ({algorithm.name})")
            if len(self._lone_algorithms) < LONE_CALLS_KEPT:
                self._lone_algorithms[key] = known
        return known

    def lone_grouped(self, arrays: list, spec: DtypeSpec, op: ReduceOp, name: str | None, fields: tuple,
                     nbytes: int, request: Callable[[str], Request]) -> list | None:
        """A synchronous plain grouped host allreduce (`arrays`: C-contiguous numpy arrays of
        `spec`'s dtype, `nbytes` in all, too many to ride a cycle; `fields` as the general
        path would build them) by `lone_run`: the group reduced from where its arrays lie
        into one block whose views are the results, with no entry per tensor. Returns the
        results, or None when the general path must take the call."""
        def run(assigned: str, _) -> list:
            block = _pool.empty((nbytes // spec.dtype.itemsize,), spec.dtype)
            self._executor.reduce_group(assigned, arrays, block, spec, op, self._average_finish(op))
            return views_of(block, arrays)
        done = self.lone_run("grouped_allreduce", name, fields, run, request)
        return None if done is None else done[0]

    def lone_run(self, kind: str, name: str | None, fields: tuple, run: Callable[[str, np.ndarray | None], object],
                 request: Callable[[str], Request], payload: np.ndarray | None = None,
                 op: ReduceOp = ReduceOp.Sum, into: np.ndarray | None = None, dtype: np.dtype | None = None):
        """A synchronous collective (`fields` as the general path would build them) while
        nothing is queued here: `_speculate_alone`, then `run(name, reduced)` on this thread,
        without building a Request unless the ranks disagree (`request(name)` builds it then,
        and the call waits for it like any other). `payload` (C-contiguous, at most a cycle's
        payload, of a size every rank derives alike from `fields`) rides the cycle, and
        `reduced` is its reduction by `op` over the ranks as `dtype`'s items (None: its own),
        in `into` (C-contiguous, writeable, as many bytes; None: a new array like `payload`):
        what every rank would otherwise
        exchange first, or the collective's whole data. A rank whose proposal carries another
        payload size (the general path: none) makes the cycle fail on every rank, so the
        reduction is never partial. `reduced` is None without a payload. `name` None: the
        next automatic name of `kind`. Returns (the call's result,) (of run, or of the queued
        request), or None when the general path must take the call; nothing has happened
        then. An error of `run` itself is the caller's alone, as in execution."""
        if not self._idle():
            return None
        self._cycle_lock.acquire()  # nothing is queued: whoever holds it lets go within a cycle
        try:
            if self._pending or self._keep_cycling:
                return None
            name = name or self.auto_name(kind)
            reduced = None
            try:
                if payload is None:
                    failed = self._speculate_lone(name, fields)
                else:
                    reduced = np.empty(payload.shape, payload.dtype) if into is None else into
                    _, h, reducer = self._lone_signature(name, fields, op, payload.dtype if dtype is None else dtype)
                    failed = self._lone_payload(name, fields, h, payload, reduced, reducer)
                if failed is not None:
                    req = self._lone_failed(request(name), *failed)
            except BaseException as e:  # noqa: BLE001 - every waiter must hear of it
                self._abandon(e)
                raise
            if failed is None:
                self._executor.running = (kind, [name])  # for a stall's message
                try:
                    return (run(name, reduced),)
                except BaseException as e:  # noqa: BLE001 - see _interrupted
                    self._interrupted(e)
                    raise
        finally:
            self._cycle_lock.release()
        return (self._wait_queued(req),)

    def _interrupted(self, error: BaseException) -> None:
        """A lean call's data phase raised `error`. An Exception is the caller's alone, as in
        execution (which hands it to the call's handle): raised alike on every rank, or by a
        transport or segment that has failed the others' wait too; where one rank alone
        raised it part-way (a MemoryError), the others' wait ends as a stall does. Anything
        else (a KeyboardInterrupt, SystemExit) may leave the others waiting in the data
        phase, and this rank's next cycle would pair with their wait: abandon, as `run` does
        for the general path."""
        if not isinstance(error, Exception):
            self._abandon(error)

    def _lone_signature(self, name: str, fields: tuple, op: ReduceOp, dtype: np.dtype) -> tuple:
        """(`fields`, the request's hash, the reducer of its payload: `op` over `dtype`) of a
        lean call, remembered in `_lone_calls` per name while its fields are these very ones
        (which fix the op and dtype)."""
        known = self._lone_calls.get(name)
        if known is not None and known[0] is fields:
            return known
        neg = self._neg
        known = (fields, neg.signature_hash(name, fields), neg.reducer(op, dtype))
        if ".noname." not in name and len(self._lone_calls) < LONE_CALLS_KEPT:
            self._lone_calls[name] = known
        return known

    def _lone_payload(self, name: str, fields: tuple, h: int, payload: np.ndarray, result: np.ndarray,
                      reducer) -> tuple | None:
        """A lean call's cycle carrying `payload` (`Negotiation.lone_exchange`: reduced over the
        ranks into `result` by `reducer` where the outcome is clean). Clean, the call is
        counted done and the cache learns (name, fields) unless it holds these very fields:
        `_settle`, whose flags the call found as it leaves them (under the cycle lock); returns
        None. Otherwise returns (outcome, words, hash) for `_lone_failed`."""
        neg = self._neg
        words = neg.words
        outcome, clean = neg.lone_exchange(h, payload, result, reducer, name)
        if not clean:
            return outcome, words, h
        if neg.cache.get(name, _NOT_CACHED)[1] is not fields:
            neg.remember(name, fields)
        self._completed += 1
        return None

    def _speculate_lone(self, name: str, fields: tuple) -> tuple | None:
        """A lean call's speculation cycle, with no payload; returns as `_lone_payload`."""
        clean, outcome, words, h = self._speculate_alone(name, fields, _no_payload)
        if not clean:
            return outcome, words, h
        self._completed += 1
        return None

    def _average_finish(self, op: ReduceOp):
        """What a lean call runs on its reduced values: Average's division, or nothing."""
        return Finish(self.rt.size, 1.0) if op is _AVERAGE and self.rt.size > 1 else nothing

    def _speculate_alone(self, name: str, fields: tuple, write_payload) -> tuple[bool, tuple, int, int]:
        """The one speculation step: a cycle in which this rank proposes (name, fields) and
        nothing else, its payload written by `write_payload(words) -> (nbytes, reducer)`.
        Returns (clean, outcome, words, the request's hash): clean when every rank proposed
        the same and nothing else waits anywhere, which the cache then remembers."""
        neg = self._neg
        h = neg.signature_hash(name, fields)
        words = neg.words
        nbytes, reducer = write_payload(words)
        outcome = neg.exchange(0, h, nbytes, reducer, (name,), words, bits_written=False)
        return self._settled_alone(outcome, h, name, fields), outcome, words, h

    def _settled_alone(self, outcome: tuple, h: int, name: str, fields: tuple) -> bool:
        """Whether a cycle's outcome agrees on request `h` alone; if so the cache remembers it
        and speculation goes on. The same step for every kind of cycle."""
        if not is_clean(outcome, h):
            return False
        self._settle(name, fields)
        return True

    def _settle(self, name: str, fields: tuple) -> None:
        """A cycle agreed on (name, fields) alone: the cache remembers it, speculation goes on."""
        self._speculate = True
        self._keep_cycling = self._gate.keep_cycling = False
        self._neg.remember(name, fields)

    def _lone_failed(self, req: Request, outcome: tuple, words: int, h: int | None = None) -> Request:
        """Another rank proposed something else: queue `req` (its hash `h`, where given: it
        proposed that) unless the cycle ran it, act on the outcome like any cycle's, and
        return `req`. Where another thread submitted the name meanwhile, its request keeps it
        and `req` fails as `submit` would fail it, unless the cycle ran it."""
        if h is not None:
            req.signature_hash = h
        held = req
        if outcome[1] != req.signature_hash:
            req.submitted = time.monotonic()
            req.next_report = req.submitted + stall_interval(self.config, 0.0)
            self._gate.submitted(req.submitted)
            with self._queue_lock:
                held = self._pending.setdefault(req.name, req)
        # the other ranks act on this outcome whatever this rank's queue holds, so this rank must too
        self._after_exchange(outcome, words, [req], {}, req)
        if held is not req and not req.handle._done:
            req.handle._finish(error=already_in_flight(req.name))  # raised by _wait_queued's wait
        return req

    def _wait_queued(self, req: Request):
        # Queue it unless a lone cycle already did; submit() refuses a name another request
        # holds in flight.
        if not req.handle._done and self._pending.get(req.name) is not req:
            self.submit(req, background=False)
        return req.handle.wait()

    # ----------------------------------------------------------------- driving cycles
    def drive(self, handle: Handle) -> None:
        """Run cycles on this thread until `handle` completes (or wait if another thread is)."""
        idle_pause = self.config.cycle_time_ms / 1000.0
        with self._queue_lock:
            self._gate.drivers += 1
        try:
            self._drive(handle, idle_pause)
        finally:
            with self._queue_lock:
                self._gate.drivers -= 1
            if self._keep_cycling or self._pending:
                self._start_background()

    def _drive(self, handle: Handle, idle_pause: float) -> None:
        while not handle.done():
            if self._cycle_lock.acquire(blocking=False):
                try:
                    if not handle.done() and self._broken is None:
                        completed = self._completed
                        self._cycle()
                        if self._completed == completed and not handle.done():
                            # Nothing could run yet: other ranks are behind. Pace the cycles
                            # instead of spinning them.
                            time.sleep(idle_pause)
                except BaseException as e:  # noqa: BLE001 - delivered to every waiter
                    self._abandon(e)
                finally:
                    self._cycle_lock.release()
            else:
                with self._done_cv:
                    self._waiters += 1
                    if not handle.done():
                        self._done_cv.wait(0.001)
                    self._waiters -= 1

    def _notify_done(self) -> None:
        if self._waiters:
            with self._done_cv:
                self._done_cv.notify_all()

    def _start_background(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._background, name="fastring-engine", daemon=True)
            self._thread.start()
        with self._wake:
            self._asleep = False  # woken: later submissions need not wake it again
            self._wake.notify()

    def _background(self) -> None:
        cycle_s = self.config.cycle_time_ms / 1000.0
        gate = self._gate
        while True:
            decision = gate.wait(cycle_s)  # GIL released until there is something to do
            if decision == STOP:
                return
            if decision == IDLE:
                with self._wake:
                    while True:
                        self._asleep = True  # before looking: see submit
                        if not (self._running and not (self._pending or self._keep_cycling)):
                            break
                        self._wake.wait()
                    self._asleep = False
                    if not self._running:
                        return
                continue  # the gate lets a burst that woke the thread gather
            with self._cycle_lock:
                if self._running and (self._pending or self._keep_cycling) and self._broken is None:
                    try:
                        self._cycle()
                    except BaseException as e:  # noqa: BLE001 - delivered to every waiter
                        self._abandon(e)

    def shutdown(self) -> None:
        """Leave: one last cycle tells every other rank that this one is shutting down (their
        pending collectives fail with an error naming it instead of waiting forever), then
        fail what is pending here and stop. Never waits for a collective to complete."""
        together = True
        self._gate.close()
        with self._cycle_lock:
            self._running = False
            if self._broken is None and self.rt.size > 1:
                neg = self._neg
                names = [r.name for r in self._pending.values()]
                try:
                    outcome = neg.exchange(leaving_flags(self.rt.rank), 0, 0, NO_PAYLOAD, names, neg.words,
                                           bits_written=False)
                    together = len(ranks_leaving(outcome[0])) >= min(self.rt.size, 64 - LEFT_RANK_SHIFT)
                except BaseException as e:  # noqa: BLE001 - a peer that never answers: leave anyway
                    log.warning("fastring shut down without hearing from every rank: %s", e)
                    together = False
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._fail_all(FastringError("fastring was shut down before this collective ran"), broken=False)
        self.timeline.close(together)

    def _others_left(self, flags: int) -> None:
        """A cycle said that ranks are shutting down: nothing can complete any more."""
        left = ranks_leaving(flags)
        who = f"rank{'s' if len(left) != 1 else ''} {', '.join(map(str, left))}" if left else "a rank"
        with self._queue_lock:
            names = list(self._pending)
        self._fail_all(FastringError(f"{who} shut down (exited or called fastring.shutdown) while this "
                                     f"rank still had collectives to run: {', '.join(names) or 'none'}"))

    def _abandon(self, error: BaseException) -> None:
        """A cycle failed here (a stall, an MPI error): fail everything, and tell the other
        ranks, so that one arriving late cannot complete a cycle with what this rank left
        posted (see Negotiation.check_abandoned). Also called by the data phase's stall hook."""
        first = self._broken is None  # one notice per rank, however many waits give up
        self._fail_all(error)
        if first:
            self._neg.abandon()
            if self.rt.size > 1:  # at exit, MPI_Finalize must not wait forever for a stopped rank
                wait = self.config.stall_shutdown_time + FINALIZE_WAIT_SECONDS
                atexit.register(exit_unless_gone_within, wait,
                                f"fastring: rank {self.rt.rank} gave up its collectives ({described(error)})")

    def _fail_all(self, error: BaseException, broken: bool = True) -> None:
        if broken:
            self._broken = error
            # nothing can run any more: the background thread stops, not cycles in vain
            self._keep_cycling = self._gate.keep_cycling = False
            self._gate.close()
        pending = []
        with self._queue_lock:
            while True:  # one request at a time: one submitted meanwhile is failed too
                try:
                    pending.append(self._pending.popitem()[1])  # (in place: the gate reads this dict)
                except KeyError:
                    break
        for r in pending:
            r.handle._finish(error=error if isinstance(error, FastringError) else FastringError(described(error)))

    # ----------------------------------------------------------------- one cycle
    def _cycle(self) -> None:
        """One negotiation cycle over the queued requests."""
        with self._queue_lock:
            pending = list(self._pending.values())
        neg = self._neg
        words = neg.words
        spec_req = pending[0] if self._speculate and pending else None
        flags, cached = self._write_bits(pending, spec_req, words)
        h = nbytes = 0
        reducer = NO_PAYLOAD
        if spec_req is not None:
            h = spec_req.signature_hash
            if not h:  # never 0 once taken
                h = spec_req.signature_hash = neg.signature_hash(spec_req.name, spec_req.fields)
            nbytes, reducer = self._write_payload(spec_req, words)
        names = [r.name for r in pending]
        with self.timeline.span(names, "negotiate"):
            outcome = neg.exchange(flags, h, nbytes, reducer, names, words, bits_written=True)
        self._after_exchange(outcome, words, pending, cached, spec_req)

    def _write_bits(self, pending: list[Request], spec_req, words: int) -> tuple[int, dict[int, Request]]:
        """The cycle's flags, and the cache bits of the queued requests other than the
        speculative one written into the block. Returns (flags, bit -> request)."""
        flags = HAS_UNCACHED if self._join_handle is not None else 0
        neg = self._neg
        neg.clear_bits(words)
        if len(pending) > 1 or spec_req is None:
            cached, uncached, due = sort_by_cache(pending, spec_req, neg.cache, time.monotonic())
            flags |= (HAS_UNCACHED if uncached else 0) | (WANT_REPORT if due else 0)
            neg.set_cached(cached, words)
            return flags, cached
        if time.monotonic() >= spec_req.next_report:
            flags |= WANT_REPORT
        return flags, {}

    def _write_payload(self, req: Request, words: int) -> tuple[int, tuple[int, int]]:
        """The speculative request's payload: its bytes when it rides in the cycle (prescaled,
        packed). Returns (payload bytes, reducer), (0, NO_PAYLOAD) for none."""
        if not req.rides_cycle:
            return 0, NO_PAYLOAD
        work = req.allreduce
        nbytes = work.reduced_nbytes(req.nbytes)
        if not (len(req.entries) == 1 and work.prescale == 1.0 and not predivides(work, self.rt.size)
                and not work.splits_average
                and copy_from_array(self._neg.payload_address(words), req.entries[0].src)):
            pack(work, req.entries, self._neg.payload(words, nbytes, work.accumulator), self.rt.size)
        return nbytes, self._neg.reducer(work.reduce_op, work.accumulator)

    def _after_exchange(self, outcome: tuple, words: int, pending: list[Request],
                        cached: dict[int, Request], spec_req) -> None:
        """Act on a cycle's combined header: identical on every rank, so every rank decides
        the same completions, errors and order of execution."""
        out_flags, spec_hash, leftover, any_ready = outcome
        if out_flags & LEAVING:
            self._others_left(out_flags)
            return
        if spec_req is not None and spec_req.rides_cycle and self._settled_alone(
                outcome, spec_req.signature_hash, spec_req.name, spec_req.fields):
            # the commonest outcome: every rank proposed this request and nothing else waits
            self._finish_speculation(spec_req, words)
            return
        speculated = spec_req is not None and spec_hash == spec_req.signature_hash
        self._speculate = spec_hash != SPECULATION_FAILED
        agreed = []
        if speculated:
            self._neg.remember(spec_req.name, spec_req.fields)
            if spec_req.rides_cycle:
                self._finish_speculation(spec_req, words)
            else:
                agreed = [spec_req]
        if out_flags & (HAS_UNCACHED | WANT_REPORT):
            ready, errors, leftover = self._full_negotiation(pending, spec_req if speculated else None,
                                                              bool(out_flags & WANT_REPORT))
        elif any_ready:
            ready = self._neg.ready_requests(cached, words)
            errors = []
        else:
            ready, errors = [], []
        ready = agreed + ready
        self._keep_cycling = self._gate.keep_cycling = leftover or spec_hash == SPECULATION_FAILED
        if errors:
            # the request this cycle proposed under the name: a lone call's is not queued where
            # another thread's request holds the name (`_lone_failed`)
            proposed = {r.name: r for r in pending}
            for name, message in errors:
                local = proposed.get(name)
                if local is None:
                    local = self._pending.get(name)
                if local is not None:
                    self._complete(local, error=FastringError(message))
        if ready:
            self._executor.execute(ready)

    def _finish_speculation(self, req: Request, words: int) -> None:
        """The cycle reduced `req`'s payload: finalize it and hand it out."""
        work = req.allreduce
        e = req.entries[0]
        finalize = finalizer(work, self.rt.size)
        if len(req.entries) == 1 and e.target is e.work and finalize is None and not work.splits_average:
            copy_to_array(e.work, self._neg.payload_address(words))
            self._complete(req, [e.result] if req.grouped else e.result)
            return
        flat = self._neg.payload(words, work.reduced_nbytes(req.nbytes), work.accumulator)
        if finalize is not None:
            finalize(flat)
        self._executor.unpack_and_finish(req, flat)

    def _full_negotiation(self, pending: list[Request], speculated, report: bool):
        mine = [(r.name, r.fields) for r in pending if r is not speculated]
        self._executor.running = ("negotiation", [name for name, _ in mine])  # for a stall's message
        gathered = [pickle.loads(b) for b in allgather_bytes(
            self.rt, pickle.dumps((mine, self._join_handle is not None)))]
        size = self.rt.size
        joined = {rank for rank, (_, has_joined) in enumerate(gathered) if has_joined}
        self._note_joins(joined)
        by_name: dict[str, dict[int, tuple]] = {}
        for rank, (items, _) in enumerate(gathered):
            for name, fields in items:
                by_name.setdefault(name, {})[rank] = fields
        local = {r.name: r for r in pending}
        everyone = set(range(size))
        ready, errors, leftover = [], [], False
        for name, per_rank in by_name.items():
            # A rank that has joined takes part in every collective it lacks, with zeros.
            if set(per_rank) | joined != everyone:
                leftover = True
                if report and name in local:
                    self._report_stall(local[name], sorted(everyone - set(per_rank) - joined))
                continue
            first = next(iter(per_rank.values()))
            if not all(f == first for f in per_rank.values()):
                errors.append((name, describe_mismatch(name, per_rank)))
                continue
            # decided alike on every rank, from what every rank sees
            absent = joined - set(per_rank)
            refused = _refused_while_joined(name, first, absent) if absent else None
            if refused is not None:
                errors.append((name, refused))
                continue
            own = local.get(name)
            # this rank's own fields object, equal to the gathered copies: see remember
            self._neg.remember(name, first if own is None else own.fields)
            ready.append(own if own is not None else self._zeros_request(name, first))
        if len(joined) == size:
            self._finish_join()
        return ready, errors, leftover

    def _report_stall(self, req: Request, missing: list[int]) -> None:
        waited = time.monotonic() - req.submitted
        req.next_report = time.monotonic() + stall_interval(self.config, waited)
        error = stall_error(self.config, req.kind, req.name, waited, missing)
        if error is not None:
            self._complete(req, error=error)

    def _complete(self, req: Request, result=None, error: BaseException | None = None) -> None:
        if self._pending.get(req.name) is req:
            with self._queue_lock:
                if self._pending.get(req.name) is req:
                    del self._pending[req.name]
        self.timeline.end(req.name, "queued")
        self._completed += 1
        req.handle._finish(result, error)

    def _complete_all(self, reqs: list[Request], results: list) -> None:
        """`_complete` of each of `reqs` with its result, the queue locked once for the whole
        batch rather than once per request."""
        pending = self._pending
        with self._queue_lock:
            for req in reqs:
                if pending.get(req.name) is req:
                    del pending[req.name]
        if self.timeline.recording:
            for req in reqs:
                self.timeline.end(req.name, "queued")
        self._completed += len(reqs)
        finish_all([req.handle for req in reqs], results)

    # ----------------------------------------------------------------- join
    def join(self) -> int:
        """Take part in the other ranks' allreduces with zeros until every rank has joined;
        return the rank that joined last."""
        if self._join_handle is not None:
            raise ValueError("join() is already in progress on this rank")
        handle = self._join_handle = Handle(self, "join")
        self.drive(handle)
        return handle.wait()

    def _note_joins(self, joined: set[int]) -> None:
        # Every rank sees the same gathered flags, so the order of joins is the same too.
        self._join_order += sorted(joined - set(self._join_order))

    def _finish_join(self) -> None:
        handle, last = self._join_handle, self._join_order[-1]
        self._join_handle, self._join_order = None, []
        if handle is not None:
            self._completed += 1
            handle._finish(last)

    def _zeros_request(self, name: str, fields: tuple) -> Request:
        """What a joined rank contributes to a collective it never submitted: zeros to an
        allreduce, no rows to an allgather, a receiver to a broadcast, itself to a barrier."""
        self._note_automatic_name(name)
        f = dict(fields)
        kind = f["collective"]
        spec = next((s for s in SUPPORTED.values() if s.name == f.get("dtype")), None)
        if kind in ("allreduce", "grouped_allreduce"):
            grouped = kind == "grouped_allreduce"
            shapes = f["shape"] if grouped else (f["shape"],)
            entries = []
            for shape in shapes:
                work = np.empty(shape, spec.dtype)
                entries.append(Entry(np.zeros(shape, spec.dtype), work, work, work))
            work = work_of(spec, ReduceOp[f["op"]], f["prescale_factor"], f["postscale_factor"],
                           getattr(Compression, f["compression"]), f["device"])
            nbytes = sum(e.src.nbytes for e in entries)
            return Request(kind, name, fields, nbytes, Handle(self, name), work, entries, grouped)
        if kind == "allgather":
            rows = np.empty((0,) + tuple(f["trailing_shape"]), spec.dtype)

            def execute(rt):
                allgather_concat(rt, rows)  # the others' protocol, with no rows of its own
        elif kind == "broadcast":
            def execute(rt):
                broadcast_bytes(rt, np.empty(f["shape"], spec.dtype), f["root_rank"])
        else:  # barrier: _refused_while_joined let nothing else through
            execute = arrived
        return Request(kind, name, fields, 0, Handle(self, name), execute=execute)


def already_in_flight(name: str) -> ValueError:
    """The error of a request submitted under a name another request holds in flight.

    Example:
        >>> str(already_in_flight("x"))
        "a collective named 'x' is already in flight; wait for it before submitting the name again"
    """
    return ValueError(f"a collective named '{name}' is already in flight; "
                      "wait for it before submitting the name again")


def described(error: BaseException) -> str:
    """`error`'s message, or its type's name where it has none (a KeyboardInterrupt).

    Example:
        >>> described(KeyboardInterrupt()), described(ValueError("bad"))
        ('KeyboardInterrupt', 'bad')
    """
    return str(error) or type(error).__name__


def arrived(rt) -> None:
    """What a barrier runs once the ranks agree on it: nothing. A collective runs only after a
    negotiation cycle in which every rank proposed it (a joined rank stands in for it), and a
    cycle ends on a rank only once every rank has entered it: every rank that has not joined
    has called the barrier by then. A barrier of the transport after it only cost a second
    round trip.

    Example:
        >>> arrived(None)
    """


# What a joined rank can take part in without data of its own (see Engine._zeros_request).
JOINABLE = ("allreduce", "grouped_allreduce", "allgather", "broadcast", "barrier")


def _refused_while_joined(name: str, fields: tuple, absent: set[int]) -> str | None:
    """Why collective `name` cannot run while ranks `absent` have joined instead of calling it
    (the same answer on every rank), or None when it can.

    Example:
        >>> _refused_while_joined("x", (("collective", "alltoall"),), {1}) is not None
        True
    """
    f = dict(fields)
    kind = f["collective"]
    if kind not in JOINABLE:
        return (f"{kind} '{name}' cannot run while ranks {sorted(absent)} have joined: a joined rank "
                f"takes part only in {', '.join(JOINABLE)}")
    if kind == "broadcast" and f["root_rank"] in absent:
        return (f"broadcast '{name}' cannot run: its root, rank {f['root_rank']}, has joined and has "
                "no data to send")
    return None
