"""A small real file system of its own, mounted where a test needs the disk to fill up or differ."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from required import require


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (e.g. "4m") on ``where`` for the block; root only (else skip, in CI fail)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = os.geteuid() == 0 and shutil.which("mount") is not None
    if mounted:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
        mounted = done.returncode == 0
    require(mounted, f"permission to mount a tmpfs on {where} (run as root)")
    try:
        yield where
    finally:
        # Lazy: a job process of the test may still hold a file there for a moment.
        subprocess.run(["umount", "-l", str(where)], check=False)
