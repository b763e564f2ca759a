"""Error classes of the public contract."""


class FastringError(RuntimeError):
    """A failure that only the ranks together can see (a mismatch across ranks, a stall,
    an MPI error). Raised on every rank involved, never leaving a rank hanging.

    Example:
        >>> try:
        ...     raise FastringError("shape differs: rank 0 has (4,), rank 1 has (5,)")
        ... except RuntimeError as e:
        ...     print(type(e).__name__)
        FastringError
    """


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal, in elastic training, that the set of hosts changed. fastring runs a
    fixed set of ranks and never raises it; it exists so that code written for Horovod
    (`except hvd.HostsUpdatedInterrupt:`) runs unchanged.

    Example:
        >>> issubclass(HostsUpdatedInterrupt, RuntimeError)
        True
    """

    def __init__(self, skip_sync: bool = False):
        super().__init__("the hosts of the job were updated")
        self.skip_sync = skip_sync
