"""The stall inspector: warnings after FASTRING_STALL_CHECK_TIME, errors after
FASTRING_STALL_SHUTDOWN_TIME, for requests other ranks never submit (`stall_error`), for
a negotiation partner that does not answer (`StallReporter`, called by the transport) and for
a partner that stops answering while the bytes move (`DataStallReporter`, the transport's
hook for every other wait)."""
from __future__ import annotations

import logging
from typing import Callable

from .._core.config import Config
from .._core.errors import FastringError

log = logging.getLogger("fastring")


def stall_interval(config: Config, waited: float) -> float:
    """Seconds until a request that has waited `waited` s is next inspected.

    Example:
        >>> from fastring._core.config import Config
        >>> stall_interval(Config(stall_check_time=60.0, stall_shutdown_time=5.0), 1.0)
        4.0
    """
    check = config.stall_check_time or float("inf")
    limit = config.stall_shutdown_time
    return min(check, limit - waited) if limit > waited else check


def stall_error(config: Config, kind: str, name: str, waited: float, missing: list[int]) -> FastringError | None:
    """Warn that `name` has waited `waited` s for ranks `missing`; the error to fail it with
    once FASTRING_STALL_SHUTDOWN_TIME has passed, else None.

    Example:
        >>> from fastring._core.config import Config
        >>> stall_error(Config(stall_shutdown_time=5.0), "allreduce", "w", 6.0, [1]) is not None
        True
    """
    log.warning("stall: %s '%s' has waited %.1f s; ranks %s have not submitted it", kind, name, waited, missing)
    limit = config.stall_shutdown_time
    if limit > 0 and waited >= limit:
        return FastringError(f"stall: {kind} '{name}' waited {waited:.1f} s (FASTRING_STALL_SHUTDOWN_TIME="
                             f"{limit:g}); ranks {missing} never submitted it")
    return None


class StallReporter:
    """Called by the transport every `interval` seconds while a cycle partner has not
    answered: warns every FASTRING_STALL_CHECK_TIME, raises once FASTRING_STALL_SHUTDOWN_TIME
    has passed (checked at a quarter of it, so the error comes on time)."""

    def __init__(self, check_after: float, shutdown_after: float):
        self.names: tuple | list = ()  # what this rank has pending in the current cycle
        self.check_after = check_after
        self.shutdown_after = shutdown_after
        periods = [t for t in (check_after, shutdown_after / 4) if t > 0]
        self.interval = min(periods) if periods else 0.0
        self._warned = 0.0  # how long the current wait had lasted at its last warning

    def __call__(self, partner: int, waited: float) -> None:
        names = self.names or ["(none: this rank is finishing others' work)"]
        if self._should_warn(waited):
            log.warning("stall: waited %.1f s for rank %d to join negotiation; pending here: %s",
                        waited, partner, ", ".join(names))
        limit = self.shutdown_after
        if limit > 0 and waited >= limit:
            raise FastringError(f"stall: rank {partner} did not join negotiation within {waited:.1f} s "
                                f"(FASTRING_STALL_SHUTDOWN_TIME={limit:g}); pending here: {', '.join(names)}")

    def _should_warn(self, waited: float) -> bool:
        """Whether a wait that has lasted `waited` s is due a warning (every check time)."""
        if waited < self._warned:  # a new wait
            self._warned = 0.0
        if self.check_after > 0 and waited >= self._warned + self.check_after:
            self._warned = waited
            return True
        return False


class DataStallReporter(StallReporter):
    """The transport's hook (`Transport.set_stall`) for every wait outside the negotiation
    cycle: the ring, recursive doubling, broadcasts, alltoall, barrier, MPI's allreduce.
    Warns "stall: waited X s for rank P during <what> of <names>" every
    FASTRING_STALL_CHECK_TIME and raises FastringError naming the rank and the tensors once
    FASTRING_STALL_SHUTDOWN_TIME has passed (0: only warns).

    `running()` says what runs now, (what, tensor names), read only when a wait is slow, so
    the executor merely keeps it up to date. `check_abandoned()` raises if another rank gave
    up (its notice arrives while this rank still waits for it). On giving up, `give_up(error)`
    (the engine's abandon: fail everything, tell the others) runs before the error is raised;
    from then on the hook raises at once at the first pause of any wait, so that whatever
    the executor still runs fails in milliseconds instead of each waiting out the deadline.

    Example:
        >>> r = DataStallReporter(60.0, 2.0, lambda: ("allreduce (ring)", ["w"]))
        >>> r(1, 2.5)
        Traceback (most recent call last):
        fastring._core.errors.FastringError: stall: waited 2.5 s for rank 1 during allreduce (ring) of w; it has stopped answering or failed (FASTRING_STALL_SHUTDOWN_TIME=2)
    """

    def __init__(self, check_after: float, shutdown_after: float,
                 running: Callable[[], tuple[str, list]],
                 check_abandoned: Callable[[], None] | None = None,
                 give_up: Callable[[BaseException], None] | None = None,
                 set_interval: Callable[[float], None] | None = None):
        super().__init__(check_after, shutdown_after)
        self._running = running
        self._check_abandoned = check_abandoned
        self._give_up = give_up
        self._set_interval = set_interval
        self.error: FastringError | None = None  # set once this rank gave up

    def __call__(self, partner: int, waited: float) -> None:
        if self.error is not None:
            raise FastringError(f"fastring gave up after a stall: {self.error}")
        try:
            if self._check_abandoned is not None:
                self._check_abandoned()
            if self._should_warn(waited):
                log.warning("stall: %s", self._describe(partner, waited))
            limit = self.shutdown_after
            if limit > 0 and waited >= limit:
                raise FastringError(f"stall: {self._describe(partner, waited)} "
                                    f"(FASTRING_STALL_SHUTDOWN_TIME={limit:g})")
        except FastringError as e:
            self.error = e
            if self._set_interval is not None:
                self._set_interval(1e-3)  # see the class docstring: the rest fails at once
            if self._give_up is not None:
                self._give_up(e)
            raise

    def _describe(self, partner: int, waited: float) -> str:
        what, names = self._running()
        who = f"rank {partner}" if partner >= 0 else "a rank (inside MPI's own collective)"
        return (f"waited {waited:.1f} s for {who} during {what or 'a collective'} of "
                f"{', '.join(names) or '(unnamed)'}; it has stopped answering or failed")
