"""The one place that decides how a collective's bytes move.

`REGISTRY` lists, per collective, its algorithms in order of preference; `choose` returns the
first that accepts the message. FASTRING_ALGORITHM=<name> forces a host allreduce algorithm
marked `selectable` wherever it can run (one that cannot, e.g. MPI's own on a dtype MPI
lacks, gives way to recursive doubling); algorithms that are not selectable (the cycle, the
device ring, the compressed ring) still take the messages only they can carry.

To add an algorithm: write its class (`name`, `selectable`, `accepts(message)`,
`available(message)`, `run(rt, reduction)`) in a module of this package and list it here.
An allreduce algorithm's `accepts` and `available` may read only the message and what its
runtime fixes at `init` (its segments, its hierarchy, its settings): the engine keeps a
synchronous allreduce's choice per size and dtype (`Engine._lone_algorithm`). A broadcast
algorithm's `accepts` may read those and whether single copy is on (`transport.single_copy`,
which a failed copy turns off): `broadcast_bytes` keeps its choice per size and that.
"""
from __future__ import annotations

import numpy as np

from .._core.dtypes import DtypeSpec
from .allreduce import CompressedRing, InCycle, MpiNative, RecursiveDoubling, Ring
from .base import Message
from .collectives import ChainBroadcast, SharedMemoryBroadcast, SingleCopyBroadcast, TreeBroadcast
from .device import DeviceRing
from .hierarchical import Hierarchical
from .shm import SharedMemory

REGISTRY: dict[str, tuple] = {
    "allreduce": (InCycle, DeviceRing, Hierarchical, CompressedRing, SharedMemory, MpiNative, RecursiveDoubling, Ring),
    "broadcast": (SharedMemoryBroadcast, SingleCopyBroadcast, ChainBroadcast, TreeBroadcast),
}
# (size, single copy on) pairs whose broadcast algorithm a runtime remembers (`broadcast_bytes`):
# the choice cost a 1 MiB broadcast 3-5 us, layer by layer (BENCHMARKS.md, "Round 2, session 26")
BROADCAST_CHOICES_KEPT = 1024
_BY_NAME = {a.name: a for algorithms in REGISTRY.values() for a in algorithms if getattr(a, "selectable", False)}
SELECTABLE = ("auto", *_BY_NAME)


def check_setting(setting: str) -> None:
    """ValueError naming FASTRING_ALGORITHM unless `setting` is 'auto' or a selectable name.

    Example:
        >>> check_setting("ring")
    """
    if setting not in SELECTABLE:
        raise ValueError(f"FASTRING_ALGORITHM={setting!r} is not one of {', '.join(SELECTABLE)}")


def choose(collective: str, nbytes: int, spec: DtypeSpec | None = None, *, device: str = "cpu",
           wire: str | None = None, rt=None, setting: str = "auto", may_ride_cycle: bool = True):
    """The algorithm for one collective: the first in REGISTRY[collective] that accepts the
    message, or for a host allreduce under a forced `setting`, the algorithm it names.

    Example:
        >>> from fastring._core.dtypes import spec_of
        >>> choose("allreduce", 1 << 30, spec_of("float32")).name
        'ring'
        >>> choose("allreduce", 4096, spec_of("float32")).name
        'in_cycle'
        >>> choose("allreduce", 4096, spec_of("float16"), setting="mpi", may_ride_cycle=False).name
        'recursive_doubling'
    """
    m = Message(collective, nbytes, spec, device, wire, rt, may_ride_cycle)
    for algorithm in REGISTRY[collective]:
        if not getattr(algorithm, "selectable", False):
            if algorithm.accepts(m):
                return algorithm
        elif setting == "auto":
            if algorithm.accepts(m):
                return algorithm
        else:
            forced = _BY_NAME[setting]
            return forced if forced.available(m) else RecursiveDoubling
    raise LookupError(f"no algorithm accepts {m}")


def broadcast_bytes(rt, buf: np.ndarray, root: int) -> None:
    """Broadcast a C-contiguous array's bytes from `root` into the same array on every rank,
    with the broadcast algorithm `choose` picks.

    Example:
        >>> import fastring, numpy as np
        >>> fastring.init()
        >>> from fastring._core.runtime import runtime
        >>> broadcast_bytes(runtime(), np.ones(3), 0)   # one rank: nothing moves
    """
    if rt.size == 1 or buf.nbytes == 0:
        return
    key = (buf.nbytes, rt.transport.single_copy)
    algorithm = rt.broadcast_algorithms.get(key)
    if algorithm is None:
        algorithm = choose("broadcast", buf.nbytes, rt=rt)
        if len(rt.broadcast_algorithms) < BROADCAST_CHOICES_KEPT:
            rt.broadcast_algorithms[key] = algorithm
    algorithm.run(rt, buf, root)
