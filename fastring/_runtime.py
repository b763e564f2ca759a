"""Process-wide state: the communicator, its topology and the configuration."""
from __future__ import annotations

import atexit
import logging

import numpy as np
from mpi4py import MPI

from . import _config
from ._transport import Transport

log = logging.getLogger("fastring")


class Runtime:
    """What `init` sets up: a private duplicate of the communicator and the rank layout."""

    def __init__(self, comm: MPI.Comm, config: _config.Config):
        self.config = config
        self.transport = Transport(comm)
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
        from .engine import Engine  # the engine sits above the runtime

        self.engine = Engine(self)

    def scratch(self, nbytes: int) -> np.ndarray:
        """A reusable byte buffer of at least `nbytes` (grown, never shrunk)."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(max(nbytes, 2 * self._scratch.nbytes), np.uint8)
        return self._scratch

    def close(self) -> None:
        self.engine.shutdown()
        self.transport.free()


_runtime: Runtime | None = None
_atexit_registered = False


def init(comm: MPI.Comm | None = None) -> None:
    """Start fastring on `comm` (default MPI.COMM_WORLD). Calling it again does nothing.

    A plain `python script.py` is a world of size 1; under `fastring-run -np N` (or any MPI
    launcher) every rank must call init.

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> fastring.size() >= 1
        True
    """
    global _runtime, _atexit_registered
    if _runtime is not None:
        return
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
    config = _config.from_environment()
    logging.basicConfig()
    log.setLevel(config.log_level.upper())
    _runtime = Runtime(comm, config)
    if not _atexit_registered:
        # Runs before mpi4py finalizes MPI (atexit is last-in, first-out): ranks finish the
        # cycles their peers still expect and write the timeline.
        atexit.register(shutdown)
        _atexit_registered = True


def shutdown() -> None:
    """Release fastring's communicator; `init` may be called again afterwards.

    Example:
        >>> import fastring
        >>> fastring.init(); fastring.shutdown(); fastring.is_initialized()
        False
    """
    global _runtime
    if _runtime is not None:
        _runtime.close()
        _runtime = None


def is_initialized() -> bool:
    """Whether `init` has run (and `shutdown` has not since).

    Example:
        >>> import fastring
        >>> fastring.init(); fastring.is_initialized()
        True
    """
    return _runtime is not None


def runtime() -> Runtime:
    """The live Runtime, or ValueError telling the user to call init first."""
    if _runtime is None:
        raise ValueError("fastring has not been initialized; call fastring.init() first")
    return _runtime


def rank() -> int:
    """This process's rank in the communicator given to init.

    Example:
        >>> import fastring; fastring.init(); fastring.rank()
        0
    """
    return runtime().rank


def size() -> int:
    """The number of ranks.

    Example:
        >>> import fastring; fastring.init(); fastring.size()
        1
    """
    return runtime().size


def local_rank() -> int:
    """Rank among the processes on this host (for picking a GPU).

    Example:
        >>> import fastring; fastring.init(); fastring.local_rank()
        0
    """
    return runtime().local_rank


def local_size() -> int:
    """Number of ranks on this host.

    Example:
        >>> import fastring; fastring.init(); fastring.local_size()
        1
    """
    return runtime().local_size


def cross_rank() -> int:
    """Index of this host among the hosts (rank in the communicator of equal local ranks).

    Example:
        >>> import fastring; fastring.init(); fastring.cross_rank()
        0
    """
    return runtime().cross_rank


def cross_size() -> int:
    """Number of hosts (size of the communicator of equal local ranks).

    Example:
        >>> import fastring; fastring.init(); fastring.cross_size()
        1
    """
    return runtime().cross_size
