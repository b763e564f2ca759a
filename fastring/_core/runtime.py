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

    def __init__(self, transport, config: _config.Config, attach_shm=None):
        """`transport`: the fastring._transport.Transport over a private duplicate of the
        user's communicator (built by the layer above, which owns the transport).
        `attach_shm(transport, tile_bytes, cycle_bytes) -> (segment or None, why not)`:
        fastring._transport.SharedSegment.attach, tried when every rank runs on this host."""
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
        self.shm = self._attach_shm(config, attach_shm) if self.size > 1 else None
        self._scratch = np.empty(0, np.uint8)
        # The engine sits above this layer: api.process builds it and hangs it here.
        self.engine = None

    def _attach_shm(self, config: _config.Config, attach):
        """The host's shared segment when every rank runs on this host, else None; why not
        is logged at debug level (the MPI paths then carry everything). Every rank takes the
        same branch: the conditions are the same everywhere, and `attach` agrees."""
        if attach is None:
            why = "no segment offered"
        elif not config.shm:
            why = "FASTRING_SHM=0"
        elif self.local_size != self.size:
            why = f"the ranks run on {self.cross_size} hosts"
        else:
            seg, why = attach(self.transport, _config.SHM_TILE_BYTES, _config.SHM_CYCLE_BYTES)
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
        if self.shm is not None:
            self.shm.close()
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
