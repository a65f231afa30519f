"""Small file-system primitives shared by every part: atomic writes, digests and lock files."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

import filelock

CHUNK = 1 << 20


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never half of one.

    temp file in the same directory, fsync, rename, fsync the directory.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


_THREAD_LOCKS: dict[str, threading.RLock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


class SharedFileLock:
    """A lock file that other processes share, which threads of this process queue for on a thread lock.

    filelock makes a thread wait for another thread of its own process as it waits for another process:
    by trying the file again every 50 ms. A job's short transactions in the server's threads then held a
    submit beside them for 50-100 ms at a time. Here the threads of one process wait on one ``RLock``
    per lock file, woken the moment it is let go; only the thread at its head tries the file, every
    ``POLL`` seconds, while another process holds it. Re-entrant within a thread, as filelock's is.
    Raises ``filelock.Timeout`` when both waits together last longer than ``timeout`` seconds.
    """

    POLL = 0.005

    def __init__(self, path: str | os.PathLike[str], timeout: float) -> None:
        self.lock_file = os.path.abspath(path)
        self.timeout = timeout
        with _THREAD_LOCKS_GUARD:
            self._threads = _THREAD_LOCKS.setdefault(self.lock_file, threading.RLock())
        self._file = filelock.FileLock(self.lock_file, timeout=timeout)

    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout
        if not self._threads.acquire(timeout=self.timeout):
            raise filelock.Timeout(self.lock_file)
        try:
            self._file.acquire(timeout=max(0.0, deadline - time.monotonic()), poll_interval=self.POLL)
        except BaseException:
            self._threads.release()
            raise

    def release(self) -> None:
        try:
            self._file.release()
        finally:
            self._threads.release()

    def __enter__(self) -> SharedFileLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()
