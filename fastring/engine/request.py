"""A submitted collective (`Request`) and the future its caller holds (`Handle`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .. import algorithms
from .._core.work import AllreduceWork, Entry
from .._transport.handle import Handle  # in C: a burst of tensors makes one each

RIDES_KEPT = 4096  # distinct (signature, size) remembered, then asked of the registry each time
# (AllreduceWork.key, bytes) -> whether such a request rides in its cycle (Request.rides_cycle)
_RIDES: dict[tuple[tuple, int], bool] = {}


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
            if work is None:
                self._rides_cycle = False
            else:
                # asked of each cycle's first request: the registry's answer (a microsecond or
                # two) is kept by signature (the fusion key: dtype, op, factors, compression,
                # device) and size, which alone decide it
                key = (work.key, self.nbytes)
                rides = _RIDES.get(key)
                if rides is None:
                    rides = algorithms.choose("allreduce", work.reduced_nbytes(self.nbytes), work.reduced_spec,
                                              device=work.device, wire=work.compression.wire) is algorithms.InCycle
                    if len(_RIDES) < RIDES_KEPT:
                        _RIDES[key] = rides
                self._rides_cycle = rides
        return self._rides_cycle


