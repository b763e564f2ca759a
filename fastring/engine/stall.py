"""The stall inspector: warnings after FASTRING_STALL_CHECK_TIME, errors after
FASTRING_STALL_SHUTDOWN_TIME, for requests other ranks never submit (`stall_error`) and for
a negotiation partner that does not answer (`StallReporter`, called by the transport)."""
from __future__ import annotations

import logging

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
        if waited < self._warned:  # a new wait
            self._warned = 0.0
        if self.check_after > 0 and waited >= self._warned + self.check_after:
            self._warned = waited
            log.warning("stall: waited %.1f s for rank %d to join negotiation; pending here: %s",
                        waited, partner, ", ".join(names))
        limit = self.shutdown_after
        if limit > 0 and waited >= limit:
            raise FastringError(f"stall: rank {partner} did not join negotiation within {waited:.1f} s "
                                f"(FASTRING_STALL_SHUTDOWN_TIME={limit:g}); pending here: {', '.join(names)}")
