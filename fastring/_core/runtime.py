"""Process-wide state: the communicator, its topology and the configuration.

The public `init`/`shutdown`/`rank`... live in `fastring.api.process`, which installs the
Runtime here; every layer reads it through `runtime()`."""
from __future__ import annotations

import logging

import numpy as np
from mpi4py import MPI

from . import config as _config
from . import pool as _pool

log = logging.getLogger("fastring")


class Runtime:
    """What `init` sets up: a private duplicate of the communicator and the rank layout."""

    def __init__(self, transport, config: _config.Config, attach_shm=None, make_transport=None):
        """`transport`: the fastring._transport.Transport over a private duplicate of the
        user's communicator (built by the layer above, which owns the transport).
        `attach_shm(transport, tile_bytes, cycle_bytes, results_bytes) -> (segment or None,
        why not)`: fastring._transport.SharedSegment.attach, tried when every rank runs on
        this host (`shm`, with a results area: `results`), and over the host level of the
        hierarchy (`host_shm`, one segment per host).
        `make_transport(comm)` builds a transport over another communicator, for the host and
        cross-host levels of a job with several hosts of several ranks each (`hierarchy`)."""
        self.config = config
        self.transport = transport
        comm = transport.comm
        self.rank = self.transport.rank
        self.size = self.transport.size
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        cross = comm.Split(color=self.local_rank, key=self.rank)
        self.cross_rank, self.cross_size = cross.Get_rank(), cross.Get_size()
        # True on every rank alike when the ranks are on more than one host
        self.crosses_hosts = self.local_size < self.size
        # (host level, cross-host level) as (transport, world rank of each of its ranks), or
        # None: only when every host has the same number of ranks, several of them, and
        # there are several hosts. The test is collective, so every rank decides alike.
        self.hierarchy = None
        fewest, most = comm.allreduce(self.local_size, MPI.MIN), comm.allreduce(self.local_size, MPI.MAX)
        if make_transport is not None and fewest == most > 1 and self.cross_size > 1:
            self.hierarchy = tuple((make_transport(c), _world_ranks(c, comm)) for c in (local, cross))
        local.Free()
        cross.Free()
        if self.local_size == self.size:
            # memory reaches across processes only on one host: on simulated hosts (network
            # namespaces of one machine) it would, and would skip the network
            self.transport.enable_single_copy()
        self.shm = self._attach_shm(config, attach_shm) if self.size > 1 else None
        # where allgather and alltoall results come from: the segment's results area, into
        # which every rank on the host can write, where it has one (alike on every rank: the
        # segment's attach agrees). Small ones too: an alltoall's result is 1/N of its bytes.
        self.results = _pool.POOL if self.shm is None or self.shm.results is None else \
            _pool.Pool(max_bytes=_config.SHM_RESULTS_BYTES, min_bytes=0, arena=self.shm.results,
                       per_size=_config.POOL_MAX_ENTRIES)  # the area's room is the limit
        if self.shm is not None and self.shm.results is None:
            log.debug("fastring: no results area (/dev/shm has no room for %d bytes a rank): allgather and "
                      "alltoall stream through the segment", _config.SHM_RESULTS_BYTES)
        # per collective, which of its ways the calls measured faster (algorithms.choice); a
        # new runtime learns afresh
        self.choices: dict = {}
        # (bytes, single copy on) -> the broadcast algorithm the registry chose for them
        # (algorithms.broadcast_bytes): what else it reads is fixed for this runtime's life
        self.broadcast_algorithms: dict = {}
        # the ranks of one host level share its memory (simulated hosts' namespaces too)
        self.host_shm = None if self.hierarchy is None else self._attach_shm(config, attach_shm,
                                                                             self.hierarchy[0][0])
        if self.hierarchy is not None and not comm.allreduce(self.host_shm is not None, MPI.LAND):
            # the hierarchical collectives cut their cross-host rings differently with a
            # segment than without: every host takes the same path, or the rings would pair
            # messages of different lengths
            if self.host_shm is not None:
                log.debug("fastring: host segment off, another host could not map one")
                self.host_shm.close()
                self.host_shm = None
        self._scratch = np.empty(0, np.uint8)
        # The engine sits above this layer: api.process builds it and hangs it here.
        self.engine = None
        # Process sets (fastring.api.process_sets): on the global Runtime, id -> (ProcessSet,
        # the set's own Runtime, None where this rank is not a member); on a set's Runtime,
        # its members' global ranks (None: this is the global Runtime).
        self.process_sets: dict = {}
        self.next_process_set_id = 0
        self.world_ranks: list[int] | None = None

    def set_stall(self, interval: float, hook) -> None:
        """`Transport.set_stall` on every transport of this runtime; the hierarchy's report
        their partners by rank in the runtime's communicator, as the main one does."""
        self.transport.set_stall(interval, hook)
        for transport, ranks in self.hierarchy or ():
            transport.set_stall(interval, None if hook is None else _in_world(hook, ranks))

    def _attach_shm(self, config: _config.Config, attach, host_level=None):
        """The host's shared segment when every rank runs on this host (or, given
        `host_level`, the transport of one host's ranks, over those), else None; why not
        is logged at debug level (the MPI paths then carry everything). Every rank takes the
        same branch: the conditions are the same everywhere, and `attach` agrees."""
        if attach is None:
            why = "no segment offered"
        elif not config.shm:
            why = "FASTRING_SHM=0"
        elif host_level is None and self.local_size != self.size:
            why = f"the ranks run on {self.cross_size} hosts"
        else:
            seg, why = attach(host_level or self.transport, _config.SHM_TILE_BYTES, _config.SHM_CYCLE_BYTES,
                              0 if host_level else _config.SHM_RESULTS_BYTES)
            if seg is not None:
                log.debug("fastring: shared-memory path on, %d bytes per rank buffer", seg.tile_bytes)
                return seg
        log.debug("fastring: shared-memory path off: %s", why)
        return None

    def scratch(self, nbytes: int) -> np.ndarray:
        """A reusable byte buffer of at least `nbytes` (grown, never shrunk)."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(max(nbytes, 2 * self._scratch.nbytes), np.uint8)
        return self._scratch

    def close(self) -> None:
        """Stop the engine (if any) and free the communicator."""
        if self.engine is not None:
            self.engine.shutdown()
        for seg in (self.shm, self.host_shm):
            if seg is not None:
                seg.close()
        for transport, _ in self.hierarchy or ():
            transport.free()
        self.transport.free()


def _world_ranks(sub: MPI.Comm, comm: MPI.Comm) -> list[int]:
    """The rank in `comm` of each rank of its sub-communicator `sub`."""
    part, whole = sub.Get_group(), comm.Get_group()
    try:
        return part.Translate_ranks(range(sub.Get_size()), whole)
    finally:
        part.Free()
        whole.Free()


def _in_world(hook, ranks):
    """`hook(partner, waited)` for a transport whose rank i is `ranks[i]` of the runtime's."""
    return lambda partner, waited: hook(ranks[partner] if partner >= 0 else partner, waited)


_runtime: Runtime | None = None


def install(rt: Runtime | None) -> None:
    """Make `rt` the live Runtime (None: there is none)."""
    global _runtime
    _runtime = rt


def current() -> Runtime | None:
    """The live Runtime, or None before init and after shutdown."""
    return _runtime


def runtime() -> Runtime:
    """The live Runtime, or ValueError telling the user to call init first."""
    if _runtime is None:
        raise ValueError("fastring has not been initialized; call fastring.init() first")
    return _runtime
