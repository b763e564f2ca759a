"""Process-wide state: the communicator, its topology and the configuration.

The public `init`/`shutdown`/`rank`... live in `fastring.api.process`, which installs the
Runtime here; every layer reads it through `runtime()`."""
from __future__ import annotations

import logging

import numpy as np
from mpi4py import MPI

from . import config as _config

log = logging.getLogger("fastring")


class Runtime:
    """What `init` sets up: a private duplicate of the communicator and the rank layout."""

    def __init__(self, transport, config: _config.Config):
        """`transport`: the fastring._transport.Transport over a private duplicate of the
        user's communicator (built by the layer above, which owns the transport)."""
        self.config = config
        self.transport = transport
        comm = transport.comm
        self.rank = self.transport.rank
        self.size = self.transport.size
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        cross = comm.Split(color=self.local_rank, key=self.rank)
        self.cross_rank, self.cross_size = cross.Get_rank(), cross.Get_size()
        local.Free()
        cross.Free()
        self.transport.enable_single_copy()
        self._scratch = np.empty(0, np.uint8)
        # The engine sits above this layer: api.process builds it and hangs it here.
        self.engine = None
        # Process sets (fastring.api.process_sets): on the global Runtime, id -> (ProcessSet,
        # the set's own Runtime, None where this rank is not a member); on a set's Runtime,
        # its members' global ranks (None: this is the global Runtime).
        self.process_sets: dict = {}
        self.next_process_set_id = 0
        self.world_ranks: list[int] | None = None

    def scratch(self, nbytes: int) -> np.ndarray:
        """A reusable byte buffer of at least `nbytes` (grown, never shrunk)."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(max(nbytes, 2 * self._scratch.nbytes), np.uint8)
        return self._scratch

    def close(self) -> None:
        """Stop the engine (if any) and free the communicator."""
        if self.engine is not None:
            self.engine.shutdown()
        self.transport.free()


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
