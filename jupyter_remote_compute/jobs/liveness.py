"""Who holds a job's lease, and whether that process still runs (lease liveness)."""

from __future__ import annotations

import os
import socket
import time
from typing import Any


def _process_start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The command name may hold spaces and parentheses: split after the last ')'.
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def process_identity() -> dict[str, Any]:
    """Who holds a lease: host, pid and the process's start time (so a reused pid is not mistaken)."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _process_start_ticks(pid)}


#: A lease taken on another host (a workspace on shared storage, a pod that came back under a new
#: name) is alive only while its holder keeps renewing it; on this host the process table decides.
FOREIGN_LEASE_TTL = 600.0


def holder_alive(holder: dict[str, Any] | None) -> bool:
    """Whether the process that took a lease still runs (another host's: whether it renewed lately)."""
    if not holder:
        return False
    if holder.get("host") != socket.gethostname():
        renewed = holder.get("renewed")
        return isinstance(renewed, (int, float)) and time.time() - renewed < FOREIGN_LEASE_TTL
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = _process_start_ticks(pid)
    return start is None or holder.get("start") in (None, start)
