"""Process sets (Horovod's): collectives over a subset of the ranks.

Each registered set that this rank belongs to gets its own Runtime: a duplicate of a
communicator split from fastring's, with its own transport, Engine (queue, negotiation, response
cache, fusion, stall inspector) and rank layout. A collective given `process_set=` is submitted
to that Engine, so sets negotiate and fuse independently and never wait on each other.

Adding and removing a set are collectives over every rank, negotiated by the global Engine
like any other: the ranks must pass the same set (FastringError on every rank otherwise), and
every rank runs the communicator split at the same point of its collective order. Ranks are
global (fastring's communicator) everywhere a process set collective takes one: a broadcast's
root, the rank `join` returns; results are in the set's rank order (its ranks sorted).
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import Sequence

from mpi4py import MPI

from .._core import config as _config
from .._core.runtime import Runtime, runtime
from .._transport import Transport
from ..engine import Engine, Handle, Request
from .validation import request_name


class ProcessSet:
    """A set of ranks that can run collectives among themselves (`process_set=` of every
    collective). Build it from global ranks or from an mpi4py communicator whose ranks are a
    subset of fastring's, then register it on every rank with `add_process_set` (or
    `init(process_sets=[...])`).

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> ps = fastring.add_process_set([0])
        >>> ps.ranks, ps.size(), ps.rank(), ps.included()
        ([0], 1, 0, True)
        >>> fastring.remove_process_set(ps)
        True
    """

    def __init__(self, ranks_or_comm: Sequence[int] | MPI.Comm = ()):
        self.process_set_id: int | None = None
        self.mpi_comm: MPI.Comm | None = None
        if isinstance(ranks_or_comm, MPI.Comm):
            self.mpi_comm, self._ranks = ranks_or_comm, None
        else:
            self._ranks = _checked_ranks(ranks_or_comm)

    @property
    def ranks(self) -> list[int]:
        """The set's global ranks, sorted (every rank for the global set)."""
        if self is global_process_set:
            return list(range(runtime().size))
        if self._ranks is None:  # from a communicator: known once registered
            self._ranks = _comm_ranks(self.mpi_comm, runtime())
        return list(self._ranks)

    def size(self) -> int | None:
        """The number of ranks in the set (None while it is not registered)."""
        if self.process_set_id is None:
            return None
        return len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within the set (None if it is not a member or the set is not
        registered)."""
        if self.process_set_id is None or not self.included():
            return None
        return self.ranks.index(runtime().rank)

    def included(self) -> bool | None:
        """Whether this process belongs to the set (None while it is not registered)."""
        if self.process_set_id is None:
            return None
        return runtime().rank in self.ranks

    def __eq__(self, other) -> bool:
        if not isinstance(other, ProcessSet):
            return NotImplemented
        return self.process_set_id == other.process_set_id and self.ranks == other.ranks

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        if self is global_process_set:
            return "ProcessSet(process_set_id=0, global)"
        ranks = self._ranks if self._ranks is not None else self.mpi_comm
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={ranks})"


def _checked_ranks(ranks) -> list[int]:
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise TypeError(f"a process set takes a sequence of ranks or an mpi4py communicator, "
                        f"got {type(ranks).__name__}")
    out = []
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, numbers.Integral):
            raise TypeError(f"process set ranks must be integers, got {r!r}")
        out.append(int(r))
    if len(set(out)) != len(out):
        raise ValueError(f"process set ranks must not repeat, got {out}")
    return sorted(out)


def _comm_ranks(comm: MPI.Comm, rt: Runtime) -> list[int]:
    """The global ranks of `comm`'s members, or ValueError if some are outside fastring's."""
    if comm == MPI.COMM_NULL:
        raise ValueError("a process set's communicator must not be MPI.COMM_NULL")
    group, world = comm.Get_group(), rt.transport.comm.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
    finally:
        group.Free()
        world.Free()
    if any(r == MPI.UNDEFINED for r in ranks):
        raise ValueError("the process set's communicator has ranks outside fastring's communicator")
    return sorted(ranks)


global_process_set = ProcessSet()
global_process_set.process_set_id = 0


def runtime_of(process_set) -> Runtime:
    """The Runtime that runs collectives on `process_set` (None: the global one), or an error
    that says why this rank cannot use it.

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> runtime_of(None) is runtime_of(global_process_set)
        True
    """
    rt = runtime()
    if process_set is None or process_set is global_process_set:
        return rt
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a fastring.ProcessSet, got {type(process_set).__name__}")
    set_id = process_set.process_set_id
    if set_id == 0:
        return rt
    entry = rt.process_sets.get(set_id) if set_id is not None else None
    if entry is None or entry[0] is not process_set:
        raise ValueError(f"{process_set!r} is not registered: call fastring.add_process_set on every "
                         "rank first (or it was removed)")
    if entry[1] is None:
        raise ValueError(f"rank {rt.rank} is not a member of process set {set_id} (ranks "
                         f"{process_set.ranks}); only its members may call collectives on it")
    return entry[1]


def set_rank(rt: Runtime, global_rank: int, what: str) -> int:
    """The rank within `rt`'s process set of the global rank `global_rank` (ValueError if it
    is not a member)."""
    ranks = rt.world_ranks
    if ranks is None:
        return global_rank
    try:
        return ranks.index(global_rank)
    except ValueError:
        raise ValueError(f"{what} {global_rank} is not in the process set (ranks {ranks})") from None


def global_rank(rt: Runtime, rank_in_set: int) -> int:
    """The global rank of `rt`'s process set's rank `rank_in_set`."""
    return rank_in_set if rt.world_ranks is None else rt.world_ranks[rank_in_set]


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set (a ProcessSet, or a sequence of global ranks) and return it.

    Collective: every rank must call it, in the same order relative to its other collectives,
    with the same ranks (FastringError on every rank otherwise), whether or not it belongs to
    the set. A set with the same ranks as a registered one raises ValueError.

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> import numpy as np
        >>> first = fastring.add_process_set([0])
        >>> fastring.allreduce(np.ones(2), op=fastring.Sum, process_set=first)   # rank 0 only
        array([1., 1.])
    """
    rt = runtime()
    name = request_name(rt, "add_process_set", None)
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps is global_process_set or ps.process_set_id is not None:
        raise ValueError(f"{ps!r} is already registered")
    ranks = ps.ranks

    def execute(rt: Runtime) -> ProcessSet:
        # Checked once every rank has passed the same ranks, so that all raise alike.
        if not ranks:
            raise ValueError("a process set needs at least one rank")
        if ranks[0] < 0 or ranks[-1] >= rt.size:
            raise ValueError(f"process set ranks must lie in [0, {rt.size}), got {ranks}")
        for set_id, (other, _) in rt.process_sets.items():
            if other.ranks == ranks:
                raise ValueError(f"process set {set_id} already has ranks {ranks}")
        if ranks == list(range(rt.size)):
            raise ValueError(f"ranks {ranks} are every rank: that is global_process_set")
        member = rt.rank in ranks
        comm = rt.transport.comm.Split(0 if member else MPI.UNDEFINED, key=rt.rank)
        sub = None
        if member:
            try:
                sub = Runtime(Transport(comm), _set_config(rt.config))
            finally:
                comm.Free()
            sub.world_ranks = ranks
            sub.engine = Engine(sub)
        rt.next_process_set_id += 1
        ps.process_set_id = rt.next_process_set_id
        rt.process_sets[ps.process_set_id] = (ps, sub)
        return ps

    return _run_global(rt, "add_process_set", name, (("ranks", tuple(ranks)),), execute)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set: its members shut down its Engine (collectives still pending
    on it fail), every rank forgets it. Returns False (and does nothing) for the global set or
    a set that is not registered. Collective over every rank, like `add_process_set`.

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> fastring.remove_process_set(fastring.add_process_set([0]))
        True
    """
    rt = runtime()
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a fastring.ProcessSet, got {type(process_set).__name__}")
    set_id = process_set.process_set_id
    entry = rt.process_sets.get(set_id) if set_id else None
    if entry is None or entry[0] is not process_set:
        return False
    name = request_name(rt, "remove_process_set", None)

    def execute(rt: Runtime) -> bool:
        _ps, sub = rt.process_sets.pop(set_id)
        process_set.process_set_id = None
        if sub is not None:
            sub.close()
        return True

    return _run_global(rt, "remove_process_set", name, (("process_set_id", set_id),), execute)


def _run_global(rt: Runtime, kind: str, name: str, fields: tuple, execute):
    engine = rt.engine
    request = Request(kind, name, (("collective", kind),) + fields, 0, Handle(engine, name),
                      execute=execute)
    return engine.run(request)


def _set_config(config: _config.Config) -> _config.Config:
    """A process set's Engine records no timeline of its own (the global one's file is one
    per job)."""
    return dataclasses.replace(config, timeline=None)


def register_initial(process_sets) -> None:
    """`init(process_sets=[...])`: register each set, in order, on every rank."""
    if process_sets is None or process_sets == "dynamic":
        return
    if not isinstance(process_sets, (list, tuple)):
        raise TypeError(f"process_sets must be a list of ProcessSet or 'dynamic', got {process_sets!r}")
    bad = [ps for ps in process_sets if not isinstance(ps, ProcessSet)]
    if bad:
        raise TypeError(f"process_sets must hold ProcessSet objects, got {type(bad[0]).__name__}")
    for ps in process_sets:
        if ps is not global_process_set:
            add_process_set(ps)


def forget_all(rt: Runtime) -> None:
    """At shutdown: every set's Engine stops, and the ProcessSet objects are unregistered."""
    for ps, sub in rt.process_sets.values():
        ps.process_set_id = None
        if sub is not None:
            sub.close()
    rt.process_sets.clear()


__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]
