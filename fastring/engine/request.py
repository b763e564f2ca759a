"""A submitted collective (`Request`) and the future its caller holds (`Handle`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .. import algorithms
from .._core.work import AllreduceWork, Entry


class Handle:
    """The future of one asynchronous collective; `wait()` returns its result.

    Example:
        >>> import numpy as np, fastring
        >>> fastring.init()
        >>> h = fastring.allreduce_async(np.ones(2), op=fastring.Sum)
        >>> h.wait()
        array([1., 1.])
    """

    __slots__ = ("name", "_engine", "_done", "_result", "_error")

    def __init__(self, engine: Any, name: str):
        # engine: the Engine that drives this handle's cycles when a caller waits on it
        self.name = name
        self._engine = engine
        self._done = False
        self._result = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True once the collective finished (successfully or not); never blocks."""
        return self._done

    def wait(self):
        """Block until the collective finishes; return its result or raise its error."""
        if not self._done:
            self._engine.drive(self)
        if self._error is not None:
            raise self._error
        return self._result

    def _finish(self, result=None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._done = True
        self._engine._notify_done()


def finish_all(handles: list[Handle], results: list) -> None:
    """`Handle._finish` of each handle with its result, waiters notified once for all."""
    for handle, result in zip(handles, results):
        handle._result = result
        handle._done = True
    if handles:
        handles[0]._engine._notify_done()


@dataclass(eq=False, slots=True)
class Request:
    """A submitted collective. `fields` must be equal on every rank under one name."""
    kind: str
    name: str
    fields: tuple
    nbytes: int
    handle: Handle
    allreduce: AllreduceWork | None = None  # an allreduce: how it reduces...
    entries: list[Entry] | tuple = ()       # ...which tensors...
    grouped: bool = False                   # ...whether the handle returns a list...
    block: Any = None                       # ...and the flat buffer their work arrays tile, if any
    execute: Callable | None = None  # other collectives: execute(runtime) -> result
    submitted: float = 0.0
    signature_hash: int = 0
    next_report: float = float("inf")  # when the stall inspector looks at it next
    _rides_cycle: bool | None = None

    def own_buffer(self):
        """The contiguous buffer this allreduce can be reduced in without a fusion buffer:
        its block, or its single entry's work array; None if it must be packed."""
        if self.block is not None:
            return self.block
        if len(self.entries) == 1:
            return self.entries[0].work.reshape(-1)
        return None

    @property
    def rides_cycle(self) -> bool:
        """Whether this request's bytes travel inside the negotiation cycle that proposes it
        (the registry's in-cycle algorithm accepts it)."""
        if self._rides_cycle is None:
            work = self.allreduce
            self._rides_cycle = work is not None and algorithms.choose(
                "allreduce", work.reduced_nbytes(self.nbytes), work.reduced_spec, device=work.device,
                wire=work.compression.wire) is algorithms.InCycle
        return self._rides_cycle


