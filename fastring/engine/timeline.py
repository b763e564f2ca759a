"""Chrome-trace timeline of every collective's phases, from every rank (pid = rank).

Each tensor name gets its own track (tid); its phases (queued, pack, reduce-scatter,
allgather, unpack, ...) are complete ("X") events. Events stay in memory on each rank and are
gathered to rank 0, which writes one JSON file that chrome://tracing and Perfetto open.
"""
from __future__ import annotations

import contextlib
import json
import logging
import threading
import time

_NOT_RECORDING = contextlib.nullcontext()
log = logging.getLogger("fastring")


class _Span:
    __slots__ = ("timeline", "names", "phase", "start")

    def __init__(self, timeline: "Timeline", names, phase: str):
        self.timeline, self.names, self.phase = timeline, names, phase

    def __enter__(self):
        self.start = self.timeline._now_us()

    def __exit__(self, *exc) -> None:
        t = self.timeline
        end = t._now_us()
        with t._lock:
            for name in [self.names] if isinstance(self.names, str) else self.names:
                t._add(name, self.phase, self.start, end)


class Timeline:
    """Collects events while recording; `close()` writes the file (collective over ranks).

    Example:
        >>> from mpi4py import MPI
        >>> t = Timeline(0, MPI.COMM_SELF, None)
        >>> t.recording
        False
    """

    def __init__(self, rank: int, comm, path: str | None):
        self.rank = rank
        # A private communicator: the gather at close must not interleave with the engine's
        # own collectives on another thread.
        self._comm = comm.Dup()
        self._lock = threading.Lock()
        self._path: str | None = None
        self.recording = False  # _path is set: an attribute, read on every lean call
        self._events: list[dict] = []
        self._open: dict[tuple, float] = {}
        self._tids: dict[str, int] = {}
        self._comm.Barrier()  # ranks share a time origin, to within one barrier's skew
        self._origin = time.perf_counter()
        if path:
            self.start(path)

    def start(self, path: str) -> None:
        if not isinstance(path, str) or not path:
            raise ValueError(f"timeline path must be a non-empty string, got {path!r}")
        with self._lock:
            self._path, self.recording = path, True
            self._events, self._open = [], {}

    def _now_us(self) -> float:
        return (time.perf_counter() - self._origin) * 1e6

    def _tid(self, name: str) -> int:
        tid = self._tids.get(name)
        if tid is None:
            tid = self._tids[name] = len(self._tids) + 1
        return tid

    def _add(self, name: str, phase: str, start_us: float, end_us: float) -> None:
        self._events.append({"name": phase, "cat": "fastring", "ph": "X", "ts": start_us,
                             "dur": max(end_us - start_us, 0.0), "pid": self.rank,
                             "tid": self._tid(name), "args": {"tensor": name}})

    def begin(self, name: str, phase: str) -> None:
        if self._path is not None:
            with self._lock:
                self._open[(name, phase)] = self._now_us()

    def end(self, name: str, phase: str) -> None:
        if self._path is not None:
            with self._lock:
                start = self._open.pop((name, phase), None)
                if start is not None:
                    self._add(name, phase, start, self._now_us())

    def span(self, names, phase: str):
        """A context manager recording `phase` for one tensor name or a list of them (a
        fused batch); a shared no-op while not recording, since it sits on hot paths."""
        if self._path is None or not names:
            return _NOT_RECORDING
        return _Span(self, names, phase)

    def stop(self) -> None:
        """Gather every rank's events to rank 0 and write the file. Collective."""
        with self._lock:
            path, events, tids = self._path, self._events, dict(self._tids)
            self._path, self._events, self._open = None, [], {}
            self.recording = False
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": {"name": name}}
                 for name, tid in tids.items()]
        gathered = self._comm.gather((path, meta + events), root=0)
        if self.rank == 0:
            paths = {p for p, _ in gathered if p}
            if paths:
                target = sorted(paths)[0]
                with open(target, "w") as f:
                    json.dump({"traceEvents": [e for _, evs in gathered for e in evs],
                               "displayTimeUnit": "ms"}, f)

    def close(self, together: bool = True) -> None:
        """Write a recording timeline (`together`: every rank is closing too, so the gather
        can run) and release the communicator. Recording is started and stopped on every rank
        alike, so each rank knows without asking whether the others will gather."""
        if self._path is not None:
            if together:
                self.stop()
            else:
                log.warning("timeline %s not written: other ranks were not shutting down too", self._path)
                self._path = None
                self.recording = False
        self._comm.Free()
