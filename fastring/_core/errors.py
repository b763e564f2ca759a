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
