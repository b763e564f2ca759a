"""Shared-memory files by name: which of them a process maps (its /proc/<pid>/maps), and
unlinking a set of them. Used in `init` (fastring/_transport/shm.pyx, `unlink_mapped`) and by
fastring-run after a job (fastring/tools/launcher.py, `remove_unmapped_segments`)."""
from __future__ import annotations

import os
from typing import Iterable


def mapped_under(prefix: str, maps: str) -> set[str]:
    """The paths starting with `prefix` that the maps file `maps` (a /proc/<pid>/maps) lists;
    empty where it cannot be read. A name unlinked since shows as "<path> (deleted)": not
    counted.

    Example:
        >>> mapped_under("/dev/shm/mpich_shm_", "/nonexistent")
        set()
    """
    try:
        with open(maps) as f:
            fields = [line.split(None, 5) for line in f if prefix in line]
    except OSError:
        return set()
    paths = (f[5].strip() for f in fields if len(f) == 6)
    return {p for p in paths if p.startswith(prefix) and not p.endswith(" (deleted)")}


def unlink_each(paths: Iterable[str]) -> list[str]:
    """Unlink `paths`, in sorted order; return those this call removed.

    Example:
        >>> unlink_each(["/nonexistent/x"])
        []
    """
    removed = []
    for path in sorted(paths):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:  # gone already, or not ours to remove
            pass
    return removed
