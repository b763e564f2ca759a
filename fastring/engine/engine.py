"""The engine: queued requests, cross-rank negotiation, tensor fusion, handles, stall inspector.

Every collective is a Request submitted here; the synchronous API is submit + wait, one path.

Negotiation runs in cycles. A cycle is one small allreduce (`Transport.cycle_exchange`) of
  [flags | speculative request hash, bytes | ready bits (AND) | pending bits (OR) | payload]
where bit i stands for entry i of the response cache, a table of (name, signature) pairs that
every rank fills identically from agreed outcomes. So in steady state a cycle costs one tiny
message exchange. Requests the cache does not know, or a stall report, make every rank gather
the full metadata of its pending requests (`_full_negotiation`), which also explains every
mismatch by field and rank. Besides, each rank may put its oldest small allreduce into the
cycle as a speculative payload: when every rank chose the same request the cycle itself
reduces it, so a lone synchronous small allreduce costs one exchange and no cycle timer.

All ranks derive the same decisions from the same cycle result, so they execute the same
collectives in the same order. Cycles run on the thread that waits on a handle (no wake-up
latency for synchronous calls) or on one background thread for asynchronous work; one lock
makes them take turns, and the transport releases the GIL while bytes move.
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from .. import algorithms, kernels
from .._core import pool as _pool
from .._core.compression import Compression
from .._core.config import SMALL_MESSAGE_BYTES
from .._core.dtypes import SUPPORTED, DtypeSpec
from .._core.errors import FastringError
from .._core.ops import KERNEL_OP, ReduceOp
from .._core.work import (AllreduceWork, Entry, divider, finalizer, nothing, pack, predivides,
                          prescale)
from .._transport import (SPECULATION_FAILED, array_address, copy_from_array, copy_to_array,
                          is_c_contiguous)
from .request import Handle, Request
from .timeline import Timeline

log = logging.getLogger("fastring")

HAS_UNCACHED = 1  # some rank has a request the cache does not know (or knows differently)
WANT_REPORT = 2   # some rank has waited past FASTRING_STALL_CHECK_TIME: gather everything
CACHE_CAPACITY = 1 << 14
HEADER_WORDS = 3
# Byte offset of the speculative payload in a cycle block with w bit-vector words.
PAYLOAD_OFFSET = [8 * (HEADER_WORDS + 2 * w) for w in range(CACHE_CAPACITY // 64 + 1)]


def _describe_mismatch(name: str, by_rank: dict[int, tuple]) -> str:
    ranks = sorted(by_rank)
    parts = []
    for i, (fname, _) in enumerate(by_rank[ranks[0]]):
        groups: dict[Any, list[int]] = {}
        for r in ranks:
            groups.setdefault(by_rank[r][i][1], []).append(r)
        if len(groups) > 1:
            parts.append(f"{fname} differs: " + "; ".join(
                f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {value}"
                for value, rs in groups.items()))
        if fname == "collective" and len(groups) > 1:
            break  # other fields mean different things for different collectives
    return f"mismatch for tensor '{name}': " + "; ".join(parts)


class Engine:
    """Owner of one runtime's queued collectives (see the module docstring)."""

    def __init__(self, rt):
        self.rt = rt
        self.config = rt.config
        self.timeline = Timeline(rt.rank, rt.transport.comm, self.config.timeline)
        self._queue_lock = threading.Lock()   # guards _pending and _noname
        self._cycle_lock = threading.Lock()   # one cycle at a time, on any thread
        self._wake = threading.Condition()
        self._done_cv = threading.Condition()  # threads waiting on a handle another runs
        self._waiters = 0
        self._completed = 0  # requests finished so far: tells a waiting thread about progress
        self._join_handle: Handle | None = None  # set while this rank has joined
        self._join_order: list[int] = []
        self._pending: dict[str, Request] = {}
        self._noname: dict[str, itertools.count] = {}
        self._cache: dict[str, tuple[int, tuple]] = {}   # name -> (bit, fields)
        self._cache_names: list[str] = []
        self._field_digests: dict[tuple, bytes] = {}
        self._hashes: dict[str, tuple[tuple, int]] = {}  # name -> (fields, hash)
        self._keep_cycling = False   # some rank still had work after the last cycle
        self._speculate = True
        self._broken: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._running = True
        self._fusion = np.empty(0, np.uint8)
        self._residuals: dict[str, np.ndarray] = {}  # error feedback, by tensor name
        self._payload_reducers: dict[tuple, tuple[int, int]] = {}
        self._bits_dirty = True  # bit words in the cycle block may be nonzero
        self._clean_words = 0    # ...unless this many words were left zero by a clean cycle
        self._stall_check_time = self.config.stall_check_time
        self._transport = rt.transport
        self._stall_reporter = _StallReporter(self.config.stall_shutdown_time)
        self._block = np.empty(0, np.uint64)
        self._block_tmp = np.empty(0, np.uint64)
        self._block_address = self._block_tmp_address = 0

    # ----------------------------------------------------------------- submission
    def auto_name(self, kind: str) -> str:
        """Deterministic names for unnamed requests: the n-th unnamed `kind` on every rank."""
        counter = self._noname.get(kind)
        if counter is None:
            counter = self._noname.setdefault(kind, itertools.count())
        return f"{kind}.noname.{next(counter)}"  # next() on a count is atomic under the GIL

    def submit(self, request: Request, background: bool = True) -> Handle:
        if self._broken is not None:
            raise FastringError(f"fastring cannot run collectives after: {self._broken}")
        h = self._signature_hash(request.name, request.fields)
        request.signature_hash = h
        request.submitted = time.monotonic()
        request.next_report = request.submitted + self._stall_interval(0.0)
        with self._queue_lock:
            if request.name in self._pending:
                raise ValueError(f"a collective named '{request.name}' is already in flight; "
                                 "wait for it before submitting the name again")
            self._pending[request.name] = request
        self.timeline.begin(request.name, "queued")
        if background:
            self._start_background()
        return request.handle

    def _stall_interval(self, waited: float) -> float:
        """Seconds until a request that has waited `waited` s is next inspected."""
        check = self.config.stall_check_time or float("inf")
        limit = self.config.stall_shutdown_time
        return min(check, limit - waited) if limit > waited else check

    def _signature_hash(self, name: str, fields: tuple) -> int:
        """A 64-bit digest of (name, fields), equal on every rank for equal requests; never 0
        (no speculation) nor SPECULATION_FAILED."""
        known = self._hashes.get(name)
        if known is not None and known[0] == fields:
            return known[1]
        fields_digest = self._field_digests.get(fields)
        if fields_digest is None:
            fields_digest = hashlib.blake2b(repr(fields).encode(), digest_size=16).digest()
            if len(self._field_digests) < CACHE_CAPACITY:
                self._field_digests[fields] = fields_digest
        digest = hashlib.blake2b(name.encode(), digest_size=8, key=fields_digest).digest()
        h = int.from_bytes(digest, "little") % (SPECULATION_FAILED - 1) + 1
        if ".noname." not in name and len(self._hashes) < CACHE_CAPACITY:
            self._hashes[name] = (fields, h)
        return h

    def run(self, req: Request):
        """Submit `req` and wait for it: the synchronous form of every collective.

        When nothing else is queued here, the cycle that proposes `req` as the speculative
        request is run inline on this thread, without queueing it; only if the ranks
        disagree does the request join the queue like any other.
        """
        if (not self._pending and not self._keep_cycling and self._speculate and self._broken is None
                and self._join_handle is None and not self.timeline.recording
                and self._cycle_lock.acquire(blocking=False)):
            try:
                if not self._pending and not self._keep_cycling:
                    req.signature_hash = self._signature_hash(req.name, req.fields)
                    self._lone_cycle(req)
            except BaseException as e:  # noqa: BLE001 - delivered to every waiter
                self._fail_all(e)
                if not req.handle._done:
                    req.handle._finish(error=e)
            finally:
                self._cycle_lock.release()
        return self._wait_queued(req)

    # ----------------------------------------------------------------- driving cycles
    def drive(self, handle: Handle) -> None:
        """Run cycles on this thread until `handle` completes (or wait if another thread is)."""
        idle_pause = self.config.cycle_time_ms / 1000.0
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
                    self._fail_all(e)
                finally:
                    self._cycle_lock.release()
            else:
                with self._done_cv:
                    self._waiters += 1
                    if not handle.done():
                        self._done_cv.wait(0.001)
                    self._waiters -= 1
        if self._keep_cycling or self._pending:
            self._start_background()

    def _notify_done(self) -> None:
        if self._waiters:
            with self._done_cv:
                self._done_cv.notify_all()

    def _start_background(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._background, name="fastring-engine", daemon=True)
            self._thread.start()
        with self._wake:
            self._wake.notify()

    def _background(self) -> None:
        cycle_s = self.config.cycle_time_ms / 1000.0
        while True:
            with self._wake:
                while self._running and not (self._pending or self._keep_cycling):
                    self._wake.wait()
                if not self._running:
                    return
            # Let a burst of asynchronous submissions gather so that they fuse.
            time.sleep(cycle_s)
            with self._cycle_lock:
                if self._running and (self._pending or self._keep_cycling) and self._broken is None:
                    try:
                        self._cycle()
                    except BaseException as e:  # noqa: BLE001 - delivered to every waiter
                        self._fail_all(e)

    def shutdown(self) -> None:
        """Finish the cycles other ranks still expect, fail what cannot finish, stop."""
        with self._cycle_lock:
            while self._keep_cycling and not self._pending and self._broken is None:
                self._cycle()
            self._running = False
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._fail_all(FastringError("fastring was shut down before this collective ran"), broken=False)
        self.timeline.close()

    def _fail_all(self, error: BaseException, broken: bool = True) -> None:
        if broken:
            self._broken = error
        with self._queue_lock:
            pending, self._pending = list(self._pending.values()), {}
        for r in pending:
            r.handle._finish(error=error if isinstance(error, FastringError) else FastringError(str(error)))

    def _lone_cycle(self, req: Request) -> None:
        """One cycle proposing `req` (not queued) when nothing else is queued here: the
        commonest case, whose cost is the latency of every synchronous collective."""
        words = self._words
        payload = self._write_payload(req, words)
        h = req.signature_hash
        outcome = self._propose(h, words, *(self._spec_reduce(req) if payload else (0, 1)), req.name)
        if _clean(outcome, h):
            self._speculate, self._keep_cycling = True, False
            self._remember(req.name, req.fields)
            if payload:
                self._finish_speculation(req, words)
            else:
                self._execute([req])
            return
        self._lone_failed(req, outcome, words)

    def _propose(self, h: int, words: int, reduce_fn: int, itemsize: int, name: str) -> tuple:
        """Exchange a cycle block in which this rank proposes only request hash `h` (its
        payload, if any, already written) and returns the combined outcome."""
        if words and (self._bits_dirty or words != self._clean_words):
            # the words may hold last cycle's bits, or payload bytes if the cache just grew
            self._block[HEADER_WORDS:HEADER_WORDS + 2 * words] = 0
        self._clean_words = words
        header = self._header
        header[0] = 0
        header[1] = h
        self._stall_reporter.names = (name,)
        outcome = self._transport.cycle_exchange(
            self._block_address, words, SMALL_MESSAGE_BYTES, self._block_tmp_address, reduce_fn,
            itemsize, self._stall_check_time, self._stall_reporter)
        # A clean outcome leaves every bit word zero (nothing ready, nothing left over).
        self._bits_dirty = bool(outcome[2] or outcome[3])
        return outcome

    def _lone_failed(self, req: Request, outcome: tuple, words: int) -> None:
        """Another rank proposed something else: queue `req` (unless the cycle ran it) and
        act on the outcome like any cycle's."""
        if outcome[1] != req.signature_hash:
            req.submitted = time.monotonic()
            req.next_report = req.submitted + self._stall_interval(0.0)
            with self._queue_lock:
                self._pending[req.name] = req
        self._after_exchange(outcome, words, [req], {}, req)

    def _wait_queued(self, req: Request):
        # Queue it unless a lone cycle already did; submit() refuses a name another request
        # holds in flight.
        if not req.handle._done and self._pending.get(req.name) is not req:
            self.submit(req, background=False)
        return req.handle.wait()

    def lone_allreduce(self, arr: np.ndarray, spec: DtypeSpec, op: ReduceOp, name: str | None,
                       fields: tuple, out: np.ndarray | None, request: Callable[[str], Request]):
        """A synchronous plain host allreduce (no compression, no scale factors, `fields` as
        the general path would build them) while nothing is queued here: one speculative
        cycle, carrying the data itself when it is small, then the reduction, without
        building a Request unless the ranks disagree (`request(name)` builds it then). The
        result goes to `out` (`arr` itself: in place), or to a new array when it is None.
        Returns the result, or None when the general path must take the call; nothing has
        happened then."""
        if not (not self._pending and not self._keep_cycling and self._speculate and self._broken is None
                and self._join_handle is None and not self.timeline.recording
                and arr.flags.c_contiguous
                and (out is None or (out.flags.writeable and out.flags.c_contiguous
                                     and out.shape == arr.shape and out.dtype == arr.dtype))):
            return None
        # Nothing is queued, so whoever holds the lock (the background thread looking for
        # work, another thread's own lone cycle) lets go within one cycle.
        self._cycle_lock.acquire()
        try:
            try:
                if self._pending or self._keep_cycling:
                    return None
                name = name or self.auto_name("allreduce")
                h = self._signature_hash(name, fields)
                words = self._words
                small = arr.nbytes <= SMALL_MESSAGE_BYTES
                if small:
                    copy_from_array(self._block_address + PAYLOAD_OFFSET[words], arr)
                    self._header[2] = arr.nbytes
                    outcome = self._propose(h, words, *self._payload_reducer(op, arr.dtype), name)
                else:
                    self._header[2] = 0
                    outcome = self._propose(h, words, 0, 1, name)
                clean = _clean(outcome, h)
                if clean:
                    self._speculate, self._keep_cycling = True, False
                    self._remember(name, fields)
                    self._completed += 1
                else:
                    req = request(name)
                    req.signature_hash = h
                    self._lone_failed(req, outcome, words)
            except BaseException as e:  # noqa: BLE001 - every waiter must hear of it
                self._fail_all(e)
                raise
            if clean:
                # as in _execute, an error of the reduction itself is the caller's alone
                result = _pool.empty(arr.shape, arr.dtype) if out is None else out
                flat = result.reshape(-1)
                divide = divider(self.rt.size) if op == ReduceOp.Average and self.rt.size > 1 else nothing
                if small:
                    copy_to_array(result, self._block_address + PAYLOAD_OFFSET[words])
                    divide(flat)
                else:
                    self._run_plain(flat, spec, op, divide, algorithms.no_phase,
                                    None if result is arr else arr.reshape(-1))
                return result
        finally:
            self._cycle_lock.release()
        return self._wait_queued(req)

    # ----------------------------------------------------------------- one cycle
    def _cycle(self) -> None:
        """One negotiation cycle over the queued requests."""
        with self._queue_lock:
            pending = list(self._pending.values())
        words = self._words
        spec_req = pending[0] if self._speculate and pending else None
        cached = self._write_header(pending, spec_req, words)
        names = [r.name for r in pending]
        self._stall_reporter.names = names
        with self.timeline.span(names, "negotiate"):
            outcome = self.rt.transport.cycle_exchange(
                self._block_address, words, SMALL_MESSAGE_BYTES, self._block_tmp_address,
                *self._spec_reduce(spec_req), self._stall_check_time, self._stall_reporter)
        self._bits_dirty = True
        self._after_exchange(outcome, words, pending, cached, spec_req)

    def _write_header(self, pending: list[Request], spec_req, words: int) -> dict[int, Request]:
        """Fill the cycle block: flags, the speculative request (and its payload), the bits of
        the cached requests. Returns bit -> request for the cached ones."""
        header = self._header
        cached: dict[int, Request] = {}
        flags = HAS_UNCACHED if self._join_handle is not None else 0
        if words:
            self._block[HEADER_WORDS:HEADER_WORDS + 2 * words] = 0
        if len(pending) > 1 or spec_req is None:
            now = time.monotonic()
            for r in pending:
                if now >= r.next_report:
                    flags |= WANT_REPORT
                if r is spec_req:
                    continue
                entry = self._cache.get(r.name)
                if entry is not None and entry[1] == r.fields:
                    bit = entry[0]
                    header[HEADER_WORDS + (bit >> 6)] |= 1 << (bit & 63)
                    header[HEADER_WORDS + words + (bit >> 6)] |= 1 << (bit & 63)
                    cached[bit] = r
                else:
                    flags |= HAS_UNCACHED
        elif time.monotonic() >= spec_req.next_report:
            flags |= WANT_REPORT
        header[0] = flags
        if spec_req is None:
            header[1] = header[2] = 0
            return cached
        header[1] = spec_req.signature_hash
        self._write_payload(spec_req, words)
        return cached

    def _write_payload(self, req: Request, words: int) -> bool:
        """Header word 2 and the payload of the speculative request: its bytes when it is a
        small host allreduce (prescaled, packed), else nothing. Returns whether it has one."""
        if not _carries_payload(req):
            self._header[2] = 0
            return False
        self._header[2] = req.nbytes
        work = req.allreduce
        if not (len(work.entries) == 1 and work.prescale == 1.0 and not predivides(work, self.rt.size)
                and copy_from_array(self._block_address + PAYLOAD_OFFSET[words], work.entries[0].src)):
            pack(work, self._payload(words, req.nbytes, work.spec.dtype), self.rt.size)
        return True

    def _after_exchange(self, outcome: tuple, words: int, pending: list[Request],
                        cached: dict[int, Request], spec_req) -> None:
        """Act on a cycle's combined header: identical on every rank, so every rank decides
        the same completions, errors and order of execution."""
        out_flags, spec_hash, leftover, any_ready = outcome
        if spec_req is not None and spec_hash == spec_req.signature_hash and not (
                out_flags or leftover or any_ready) and _carries_payload(spec_req):
            # the commonest outcome: every rank proposed this request and nothing else waits
            self._speculate, self._keep_cycling = True, False
            self._remember(spec_req.name, spec_req.fields)
            self._finish_speculation(spec_req, words)
            return
        speculated = spec_req is not None and spec_hash == spec_req.signature_hash
        self._speculate = spec_hash != SPECULATION_FAILED
        agreed = []
        if speculated:
            self._remember(spec_req.name, spec_req.fields)
            if _carries_payload(spec_req):
                self._finish_speculation(spec_req, words)
            else:
                agreed = [spec_req]
        if out_flags & (HAS_UNCACHED | WANT_REPORT):
            ready, errors, leftover = self._full_negotiation(pending, spec_req if speculated else None,
                                                              bool(out_flags & WANT_REPORT))
        elif any_ready:
            ready = [cached[bit] for bit in _bits(self._block[HEADER_WORDS:HEADER_WORDS + words]) if bit in cached]
            errors = []
        else:
            ready, errors = [], []
        ready = agreed + ready
        self._keep_cycling = leftover or spec_hash == SPECULATION_FAILED
        for name, message in errors:
            local = self._pending.get(name)
            if local is not None:
                self._complete(local, error=FastringError(message))
        if ready:
            self._execute(ready)

    @property
    def _words(self) -> int:
        """Bit-vector words per cycle; the cache grows identically on every rank."""
        words = (len(self._cache_names) + 63) // 64
        total = HEADER_WORDS + 2 * words + SMALL_MESSAGE_BYTES // 8
        if self._block.size < total:
            self._block = np.zeros(total + 64, np.uint64)
            self._block_tmp = np.zeros(total + 64, np.uint64)
            self._block_address = array_address(self._block)
            self._block_tmp_address = array_address(self._block_tmp)
            # item writes through a memoryview cost a tenth of numpy scalar assignment
            self._header = memoryview(self._block).cast("B").cast("Q")
        return words

    def _payload(self, words: int, nbytes: int, dtype) -> np.ndarray:
        start = HEADER_WORDS + 2 * words
        return self._block[start:].view(np.uint8)[:nbytes].view(dtype)

    def _spec_reduce(self, spec_req) -> tuple[int, int]:
        """(reduction cfunc, item size) for the speculative payload, or (0, 1) for none."""
        if spec_req is None or not _carries_payload(spec_req):
            return 0, 1
        return self._payload_reducer(spec_req.allreduce.op, spec_req.allreduce.spec.dtype)

    def _payload_reducer(self, op: ReduceOp, dtype: np.dtype) -> tuple[int, int]:
        found = self._payload_reducers.get((op, dtype))
        if found is None:
            found = self._payload_reducers[op, dtype] = (kernels.reduce_cfunc(KERNEL_OP[op], dtype),
                                                         dtype.itemsize)
        return found

    def _finish_speculation(self, req: Request, words: int) -> None:
        """The cycle reduced `req`'s payload: finalize it and hand it out."""
        work = req.allreduce
        e = work.entries[0]
        if len(work.entries) == 1 and e.target is e.work and finalizer(work, self.rt.size) is None:
            copy_to_array(e.work, self._block_address + PAYLOAD_OFFSET[words])
            self._complete(req, [e.result] if work.grouped else e.result)
            return
        flat = self._payload(words, req.nbytes, work.spec.dtype)
        finalize = finalizer(work, self.rt.size)
        if finalize is not None:
            finalize(flat)
        self._unpack_and_finish(req, flat)

    def _remember(self, name: str, fields: tuple) -> None:
        """Cache an agreed (name, fields); called in the same order on every rank."""
        entry = self._cache.get(name)
        if entry is not None:
            if entry[1] != fields:
                self._cache[name] = (entry[0], fields)
        elif len(self._cache_names) < CACHE_CAPACITY and ".noname." not in name:
            self._cache[name] = (len(self._cache_names), fields)
            self._cache_names.append(name)

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
        """What a joined rank contributes to a collective it never submitted."""
        f = dict(fields)
        if f["collective"] not in ("allreduce", "grouped_allreduce"):
            raise ValueError(f"{f['collective']} '{name}' cannot run while a rank has joined: "
                             "only allreduce takes zeros from joined ranks")
        spec = next(s for s in SUPPORTED.values() if s.name == f["dtype"])
        grouped = f["collective"] == "grouped_allreduce"
        shapes = f["shape"] if grouped else (f["shape"],)
        entries = []
        for shape in shapes:
            work = np.empty(shape, spec.dtype)
            entries.append(Entry(np.zeros(shape, spec.dtype), work, work, work))
        work = AllreduceWork(spec, ReduceOp[f["op"]], f["prescale_factor"], f["postscale_factor"],
                             entries, grouped, getattr(Compression, f["compression"]), device=f["device"])
        nbytes = sum(e.src.nbytes for e in entries)
        return Request(f["collective"], name, fields, nbytes, Handle(self, name), allreduce=work)

    def _full_negotiation(self, pending: list[Request], speculated, report: bool):
        mine = [(r.name, r.fields) for r in pending if r is not speculated]
        gathered = self.rt.transport.comm.allgather((mine, self._join_handle is not None))
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
                errors.append((name, _describe_mismatch(name, per_rank)))
                continue
            self._remember(name, first)
            if name in local:
                ready.append(local[name])
            else:
                try:
                    ready.append(self._zeros_request(name, first))
                except ValueError as e:
                    errors.append((name, str(e)))
        if len(joined) == size:
            self._finish_join()
        return ready, errors, leftover

    def _report_stall(self, req: Request, missing: list[int]) -> None:
        waited = time.monotonic() - req.submitted
        log.warning("stall: %s '%s' has waited %.1f s; ranks %s have not submitted it",
                    req.kind, req.name, waited, missing)
        req.next_report = time.monotonic() + self._stall_interval(waited)
        shutdown_after = self.config.stall_shutdown_time
        if shutdown_after > 0 and waited >= shutdown_after:
            self._complete(req, error=FastringError(
                f"stall: {req.kind} '{req.name}' waited {waited:.1f} s (FASTRING_STALL_SHUTDOWN_TIME="
                f"{shutdown_after:g}); ranks {missing} never submitted it"))

    # ----------------------------------------------------------------- execution
    def _complete(self, req: Request, result=None, error: BaseException | None = None) -> None:
        if self._pending.get(req.name) is req:
            with self._queue_lock:
                if self._pending.get(req.name) is req:
                    del self._pending[req.name]
        self.timeline.end(req.name, "queued")
        self._completed += 1
        req.handle._finish(result, error)

    def _execute(self, ready: list[Request]) -> None:
        groups: dict[tuple, list[Request]] = {}
        order: list[tuple] = []
        for r in ready:
            key = ("allreduce",) + r.allreduce.key() if r.allreduce is not None else ("single", r.name)
            if key not in groups:
                groups[key] = []
                order.append(key)
            groups[key].append(r)
        for key in order:
            reqs = groups[key]
            try:
                if key[0] == "allreduce":
                    self._run_allreduce(reqs)
                else:
                    with self.timeline.span(reqs[0].name, reqs[0].kind):
                        result = reqs[0].execute(self.rt)
                    self._complete(reqs[0], result)
            except Exception as e:  # noqa: BLE001 - the error belongs to these handles
                for r in reqs:
                    self._complete(r, error=e)

    def _run_allreduce(self, reqs: list[Request]) -> None:
        """Fuse requests of one key into batches of at most the fusion threshold and reduce
        each batch with one algorithm run; a request alone is reduced in its own buffer."""
        threshold = max(self.config.fusion_threshold, 1)
        batch: list[Request] = []
        batch_bytes = 0
        for r in reqs + [None]:
            if r is None or (batch and batch_bytes + r.nbytes > threshold):
                self._reduce_batch(batch)
                batch, batch_bytes = [], 0
            if r is not None:
                batch.append(r)
                batch_bytes += r.nbytes

    def _reduce_batch(self, batch: list[Request]) -> None:
        if not batch:
            return
        work = batch[0].allreduce
        if work.device != "cpu":
            names = [r.name for r in batch]
            results = algorithms.device.reduce_batch(self.rt, names, [r.allreduce for r in batch],
                                                     lambda what: self.timeline.span(names, what))
            for r, result in zip(batch, results):
                self._complete(r, result)
            return
        rt = self.rt
        names = [r.name for r in batch]
        own = work.own_buffer() if len(batch) == 1 else None
        if own is not None and own.dtype == work.accumulator:
            src = self._ring_source(work, own)
            if src is not None:
                # the ring reads the input where it is: no copy into the output first
                self._reduce(names, own, work, src)
            else:
                with self.timeline.span(names, "pack"):
                    if work.block is not None:
                        # one memcpy-speed call; a loop of np.copyto costs twice as much at 100 tensors
                        np.concatenate([e.src for e in work.entries], axis=None, out=own)
                    elif work.entries[0].src is not work.entries[0].work:
                        np.copyto(work.entries[0].work, work.entries[0].src)
                    prescale(work, own, rt.size)
                    self._feed_back_error(batch[0], own)
                self._reduce(names, own, work)
            for e in work.entries:
                if e.target is not e.work:
                    np.copyto(e.target, e.work)
            results = [e.result for e in work.entries]
            self._complete(batch[0], results if work.grouped else results[0])
            return
        acc = work.accumulator
        counts = [r.nbytes // work.spec.dtype.itemsize for r in batch]
        flat = self._fusion_view(sum(counts), acc)
        with self.timeline.span(names, "pack"):
            offset = 0
            for r, n in zip(batch, counts):
                pack(r.allreduce, flat[offset:offset + n], rt.size)
                self._feed_back_error(r, flat[offset:offset + n])
                offset += n
        self._reduce(names, flat, work)
        offset = 0
        for r, n in zip(batch, counts):
            self._unpack_and_finish(r, flat[offset:offset + n])
            offset += n

    def _fusion_view(self, count: int, dtype: np.dtype) -> np.ndarray:
        """The persistent fusion buffer as `count` elements of `dtype` (grown, never shrunk)."""
        nbytes = count * dtype.itemsize
        if self._fusion.nbytes < nbytes:
            self._fusion = np.empty(nbytes, np.uint8)
        return self._fusion[:nbytes].view(dtype)

    def _ring_source(self, work: AllreduceWork, own: np.ndarray) -> np.ndarray | None:
        """The unscaled input a lone allreduce can be reduced from into its output (the rings
        read it where it lies, the other algorithms copy it first), or None when it must be
        copied and scaled into the output before the reduction."""
        e = work.entries[0]
        if len(work.entries) != 1 or not is_c_contiguous(e.src):
            return None
        if work.compression.wire is not None:
            # the compressed ring scales its input as it reads it, and may write over it;
            # error feedback must change the input first
            return None if work.compression.error_feedback else e.src.reshape(-1)
        if e.src is e.work or work.prescale != 1.0 or predivides(work, self.rt.size):
            return None
        return e.src.reshape(-1)

    def _reduce(self, names, flat: np.ndarray, work: AllreduceWork,
                src: np.ndarray | None = None) -> None:
        phase = lambda name: self.timeline.span(names, name)  # noqa: E731
        if work.compression.wire is not None:
            # Under compression Average always divides first (_predivides), so what is left
            # after the reduction is the postscale; an input packed into `flat` is scaled.
            size = self.rt.size
            scale = ((work.prescale, float(size) if predivides(work, size) else 1.0, work.postscale)
                     if src is not None else (1.0, 1.0, work.postscale))
            algorithms.CompressedRing.run(self.rt, flat, flat if src is None else src,
                                          work.compression.wire, work.op, scale, phase)
            return
        self._run_plain(flat, work.spec, work.op, finalizer(work, self.rt.size) or nothing, phase, src)

    def _run_plain(self, flat: np.ndarray, spec: DtypeSpec, op: ReduceOp, finalize, phase,
                   src: np.ndarray | None = None) -> None:
        """Allreduce `flat` (from `src`, unscaled, if given) with the configured algorithm;
        the ring reads `src` where it lies, the others get a copy first."""
        algorithm = algorithms.choose(self.config.algorithm, flat.nbytes, spec)
        if src is not None and algorithm is algorithms.Ring:
            algorithm.run(self.rt, flat, spec, op, finalize, phase, src=src)
            return
        if src is not None:
            np.copyto(flat, src)
        algorithm.run(self.rt, flat, spec, op, finalize, phase)

    def _feed_back_error(self, req: Request, flat: np.ndarray) -> None:
        """Error feedback: add what this name lost to 16-bit rounding last time, and keep
        what it loses now, so that rounding errors do not pile up over steps."""
        compression = req.allreduce.compression
        if not compression.error_feedback:
            return
        residual = self._residuals.get(req.name)
        if residual is not None and residual.shape == flat.shape and residual.dtype == flat.dtype:
            flat += residual
        bits = np.empty(flat.size, np.uint16)
        kernels.encode16(flat, bits, compression.wire)
        sent = np.empty_like(flat)
        kernels.decode16(bits, sent, compression.wire)
        self._residuals[req.name] = flat - sent
        flat[...] = sent

    def _unpack_and_finish(self, req: Request, flat: np.ndarray) -> None:
        with self.timeline.span(req.name, "unpack"):
            offset = 0
            for e in req.allreduce.entries:
                n = e.work.size
                np.copyto(e.target, flat[offset:offset + n].reshape(e.target.shape), casting="unsafe")
                offset += n
        entries = req.allreduce.entries
        self._complete(req, [e.result for e in entries] if req.allreduce.grouped else entries[0].result)


class _StallReporter:
    """Called by the transport when a cycle partner has not answered for a while."""

    def __init__(self, shutdown_after: float):
        self.names: tuple | list = ()  # what this rank has pending in the current cycle
        self.shutdown_after = shutdown_after

    def __call__(self, partner: int, waited: float) -> None:
        names = self.names or ["(none: this rank is finishing others' work)"]
        log.warning("stall: waited %.1f s for rank %d to join negotiation; pending here: %s",
                    waited, partner, ", ".join(names))
        limit = self.shutdown_after
        if limit > 0 and waited >= limit:
            raise FastringError(f"stall: rank {partner} did not join negotiation within {waited:.1f} s "
                                f"(FASTRING_STALL_SHUTDOWN_TIME={limit:g}); pending here: {', '.join(names)}")


def _carries_payload(req: Request) -> bool:
    return (req.allreduce is not None and req.nbytes <= SMALL_MESSAGE_BYTES
            and req.allreduce.compression.wire is None and req.allreduce.device == "cpu")


def _clean(outcome: tuple, h: int) -> bool:
    """Every rank proposed request hash `h` alone and nothing else waits anywhere."""
    return outcome[1] == h and not (outcome[0] or outcome[2] or outcome[3])


def _bits(words: np.ndarray):
    for i, w in enumerate(words.tolist()):
        while w:
            low = w & -w
            yield i * 64 + low.bit_length() - 1
            w ^= low


