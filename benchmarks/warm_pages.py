"""Start every measured transfer from the same state of this VM's memory and disk.

This machine is a Firecracker VM that hands free memory back to its host (the kernel's free page
reporting, ``page_reporting.page_reporting_order=11`` on its command line). A page the guest takes
that the host has not backed costs a host fault when first touched: writing 256 MiB into a new file
here took 0.55 s while the page cache grew, and 0.05 s into pages freed a moment before. A transfer
that writes its result over a file it just truncated (a reference tool run in a loop) would recycle
warm pages, and one that writes a new file would pay the faults: a tenfold difference in the copy
into the page cache that has nothing to do with either tool. So before each measured transfer the
benchmarks write and delete a file as big as what the transfer writes, on both ends alike: each then
starts from freshly freed pages, as on a machine whose memory stays its own.

The same VM also pages out file data nobody touched for a minute (DAMON's ``pageout`` scheme on
physical memory: age >= 12 intervals of 5 s, up to 128 MiB/s; 10.9 GB paged out in the 3.4 hours
since it booted). A source file made at a benchmark's start may be read from memory by one transfer
and from disk by the next. ``read_through`` reads every file a transfer may read just before it, so
each one starts from a warm page cache, the usual condition of such measurements.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_BLOCK = b"\0" * (1 << 20)


def read_through(*roots: Path) -> None:
    """Read every regular file under ``roots`` (each inode once), so that the page cache holds it."""
    seen: set[tuple[int, int]] = set()
    buf = bytearray(1 << 20)
    for root in roots:
        for folder, _dirs, names in os.walk(root) if root.is_dir() else [(str(root.parent), [], [root.name])]:
            for name in names:
                path = os.path.join(folder, name)
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen or not os.access(path, os.R_OK):
                    continue
                seen.add((st.st_dev, st.st_ino))
                with open(path, "rb", buffering=0) as f:
                    while f.readinto(buf):
                        pass


def recycle(scratch: Path, nbytes: int) -> None:
    """Write ``nbytes`` to a scratch file under ``scratch`` and delete it: its pages are freed, warm."""
    path = scratch / f".warm-pages-{os.getpid()}"
    with open(path, "wb") as f:
        for _ in range(-(-nbytes // len(_BLOCK))):
            f.write(_BLOCK)
    path.unlink()


def before_transfer(scratch: Path, nbytes: int, reads: list[Path]) -> None:
    """What each measured transfer is given first: the files it may read read, ``nbytes`` recycled."""
    read_through(*reads)
    recycle(scratch, nbytes)
