"""Processes as /proc shows them, read independently of every engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """Every process as (pid, the fields of /proc/<pid>/stat after the command name)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        yield int(entry.name), fields


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group (fields: state, parent, group)."""
    return [pid for pid, fields in proc_stats() if int(fields[2]) == pgid and fields[0] not in ("Z", "X")]
