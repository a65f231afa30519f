"""Ports for the servers the tests start: always from the OS, never fixed numbers."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reserved_port() -> int:
    """A free port for a server that binds it long after the port is chosen.

    ``free_port`` hands out a port from the kernel's ephemeral range, which every ``bind(0)`` and
    every outgoing connection of the run draws from too: minutes later another socket may hold it.
    This one comes from below that range, where the kernel never assigns a port on its own, so only a
    server started on that very number could take it (and the tests start none on a fixed port).
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    below = range(max(1024, low // 3), low)
    for port in random.sample(below, min(200, len(below))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {below.start} and {low}")
