"""Helpers for tests that start jobs meant to fail, hang or be interrupted: tag a job's
processes, find the ones left running, and wait for a job's output with a deadline."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
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


def kill_survivors(mark: str) -> None:
    """After a failed test: SIGKILL, by id, what the test started (tagged `mark`) and left running."""
    for line in survivors(mark).splitlines():
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for_output(stream, words: list[str], timeout: float) -> str:
    """What the binary `stream` printed until it contained every one of `words` (hydra may
    interleave the ranks' lines, so these are substrings, not lines); AssertionError if the
    stream ends first, queue.Empty after `timeout` seconds.

    Example:
        >>> p = subprocess.Popen(["echo", "rank 0 started"], stdout=subprocess.PIPE)
        >>> wait_for_output(p.stdout, ["started"], 10)
        'rank 0 started\\n'
    """
    chunks: queue.Queue = queue.Queue()

    def read():
        while chunk := os.read(stream.fileno(), 4096):
            chunks.put(chunk.decode(errors="replace"))
        chunks.put(None)
    threading.Thread(target=read, daemon=True).start()
    text, deadline = "", time.monotonic() + timeout
    while not all(w in text for w in words):
        chunk = chunks.get(timeout=max(deadline - time.monotonic(), 0.001))
        assert chunk is not None, f"output ended before {words}: {text!r}"
        text += chunk
    return text
