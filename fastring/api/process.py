"""Starting and stopping fastring, and the rank layout: the public process functions."""
from __future__ import annotations

import atexit
import logging
import time

from mpi4py import MPI

from .._core import config as _config
from .._core.errors import FastringError
from .._core.runtime import Runtime, current, install, log, runtime
from .._transport import SharedSegment, Transport, exit_unless_gone_within
from ..algorithms import check_setting
from ..engine import Engine
from .process_sets import forget_all, register_initial


_atexit_registered = False


def init(comm: MPI.Comm | None = None, process_sets=None) -> None:
    """Start fastring on `comm` (default MPI.COMM_WORLD). Calling it again does nothing.

    A plain `python script.py` is a world of size 1; under `fastring-run -np N` (or any MPI
    launcher) every rank must call init. `process_sets`: a list of `ProcessSet` to register
    at once (as `add_process_set` would, in order, on every rank); Horovod's "dynamic" is
    accepted too (fastring's sets may always be added later).

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> fastring.size() >= 1
        True
    """
    global _atexit_registered
    if current() is not None:
        return
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
    config = _agreed_config(comm)
    logging.basicConfig()
    log.setLevel(config.log_level.upper())
    rt = Runtime(Transport(comm), config, SharedSegment.attach, make_transport=Transport)
    rt.engine = Engine(rt)
    install(rt)
    if not _atexit_registered:
        # Runs before mpi4py finalizes MPI (atexit is last-in, first-out): ranks finish the
        # cycles their peers still expect and write the timeline.
        atexit.register(shutdown)
        _atexit_registered = True
    register_initial(process_sets)


def _agreed_config(comm: MPI.Comm) -> _config.Config:
    """This rank's Config from the environment, once every rank of `comm` has read its own
    and they agree on `config.AGREED_SETTINGS` (and the ranks of each host on
    `config.HOST_AGREED_SETTINGS`). A bad value raises ValueError on its rank and
    FastringError naming that rank on the others; settings that differ raise FastringError
    on every rank, naming the variable and each rank's value. Nothing is left waiting."""
    try:
        config = _config.from_environment()
        check_setting(config.algorithm)
        problem = None
    except ValueError as e:
        config, problem = None, e
    _await_every_rank(comm, config or _config.Config())
    settings = {**_config.AGREED_SETTINGS, **_config.HOST_AGREED_SETTINGS}
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        host = local.bcast(comm.Get_rank(), root=0)  # the host's first rank names it
    finally:
        local.Free()
    everyone = comm.allgather((None if problem is None else str(problem), host,
                               None if config is None else tuple(getattr(config, f) for f in settings)))
    if problem is not None:
        raise problem
    for r, (why, _, _) in enumerate(everyone):
        if why is not None:
            raise FastringError(f"fastring could not start: rank {r}: {why}")
    for i, (field, variable) in enumerate(settings.items()):
        per_host = field in _config.HOST_AGREED_SETTINGS
        groups: dict = {}  # host (or the job) -> value -> ranks
        for r, (_, where, values) in enumerate(everyone):
            groups.setdefault(where if per_host else None, {}).setdefault(values[i], []).append(r)
        for ranks_by_value in groups.values():
            if len(ranks_by_value) > 1:
                each = "; ".join(f"{_shown(value)} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
                                 for value, ranks in ranks_by_value.items())
                where = "the ranks of one host" if per_host else "ranks"
                raise FastringError(f"{variable} differs between {where}: {each}; they must use the same value")
    return config


def _await_every_rank(comm: MPI.Comm, config: _config.Config) -> None:
    """Return once every rank of `comm` has called init, as the stall inspector waits for a
    collective: a warning every FASTRING_STALL_CHECK_TIME, and FastringError once
    FASTRING_STALL_SHUTDOWN_TIME has passed (0: wait as long as it takes, as MPI_Init does).
    A rank that takes another path and never calls init, or is still busy before it, would
    otherwise leave the others waiting in init's first exchange for ever.

    The barrier is nonblocking, so the wait can be bounded; one that gave up stays posted, so
    at exit this rank does not wait in MPI_Finalize for the missing rank for longer than
    FINALIZE_WAIT_SECONDS, as after any stall."""
    arrived = comm.Ibarrier()
    start = warned = time.monotonic()
    pause = _config.WAIT_PAUSE_STEP_SECONDS
    while not arrived.Test():
        now = time.monotonic()
        waited = now - start
        if config.stall_check_time > 0 and now - warned >= config.stall_check_time:
            warned = now
            log.warning("stall: fastring.init on rank %d has waited %.1f s for the other ranks to call init",
                        comm.Get_rank(), waited)
        limit = config.stall_shutdown_time
        if limit > 0 and waited >= limit:
            error = FastringError(f"fastring.init on rank {comm.Get_rank()} waited {waited:.1f} s "
                                  f"(FASTRING_STALL_SHUTDOWN_TIME={limit:g}) and not every one of the "
                                  f"{comm.Get_size()} ranks called init; every rank must call fastring.init")
            atexit.register(exit_unless_gone_within, limit + _config.FINALIZE_WAIT_SECONDS,
                            f"fastring: rank {comm.Get_rank()} gave up waiting in init ({error})")
            raise error
        time.sleep(pause)  # an init waits for other processes to start: seconds, not microseconds
        pause = min(2 * pause, _config.WAIT_LONG_PAUSE_SECONDS)


def _shown(value) -> str:
    """A setting's value as its variable spells it (FASTRING_SHM is 1 or 0)."""
    return str(int(value)) if isinstance(value, bool) else repr(value)


def shutdown() -> None:
    """Release fastring's communicator; `init` may be called again afterwards.

    Example:
        >>> import fastring
        >>> fastring.init(); fastring.shutdown(); fastring.is_initialized()
        False
    """
    rt = current()
    if rt is not None:
        forget_all(rt)
        rt.close()
        install(None)


def is_initialized() -> bool:
    """Whether `init` has run (and `shutdown` has not since).

    Example:
        >>> import fastring
        >>> fastring.init(); fastring.is_initialized()
        True
    """
    return current() is not None


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
