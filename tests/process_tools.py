"""Helpers for tests that start jobs meant to fail, hang or be interrupted: tag a job's
processes and find the ones left running."""
from __future__ import annotations

import subprocess
import uuid


def marker() -> str:
    """A word to put on a job's command line, so that pgrep finds its processes and nobody
    else's (other jobs run tests/workers too on a shared machine).

    Example:
        >>> marker().startswith("fastring-test-")
        True
    """
    return f"fastring-test-{uuid.uuid4().hex}"


def survivors(mark: str) -> str:
    """`pgrep -af` lines of the processes whose command line contains `mark` ('' if none).

    Example:
        >>> survivors(marker())
        ''
    """
    return subprocess.run(["pgrep", "-af", mark], capture_output=True, text=True).stdout
