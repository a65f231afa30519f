"""Small file-system primitives shared by every part: atomic writes, digests and lock files.

What the product keeps for itself is this user's only, whatever the umask and however open the
folders around it are (Debian's homes are 0755): its folders are made 0700 (``private_dir``), its files
0600 (``atomic_write``'s default, ``private_open``, the lock files); ``tighten`` strips group and other
bits from what an earlier version made more open.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

import filelock

CHUNK = 1 << 20
#: A file or folder of the product's own: no group or other permission bits.
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def private_dir(path: Path) -> Path:
    """Make the folder ``path`` and every missing folder above it, each 0700 (the umask cannot open
    them further); a folder that exists is left as it is."""
    missing = []
    here = Path(path)
    while not here.is_dir():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, PRIVATE_DIR)
    return Path(path)


def socket_folder() -> Path:
    """The folder of this user's Unix sockets (the recorder's, MLflow's UI): ``<temporary folder>/
    jupyter-remote-compute-<uid>/``, 0700, or under ``/tmp`` when the temporary folder's path is too
    long for a socket's. PermissionError when what is there is not a folder only this user can open."""
    temporary = tempfile.gettempdir()
    if len(os.fsencode(temporary)) > 50:  # a Unix socket's path holds about 100 bytes in all
        temporary = "/tmp"
    folder = Path(temporary) / f"jupyter-remote-compute-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=PRIVATE_DIR)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{folder} is not a folder only you can open: remove it, then try again")
    return folder


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags, PRIVATE_FILE)


def private_open(path: Path, mode: str = "ab") -> io.BufferedWriter:
    """``open(path, mode)`` for writing, a new file being made 0600 (a log, a counter); its missing
    folders are made as ``private_dir`` makes them."""
    private_dir(path.parent)
    return open(path, mode, opener=_private_opener)


def tighten(root: Path) -> None:
    """Strip group and other permission bits from ``root`` and everything under it that this user
    owns (links are not followed): what an earlier version left readable by other local users."""
    me = os.getuid()

    def strip(path: str) -> None:
        with contextlib.suppress(FileNotFoundError, PermissionError):
            info = os.lstat(path)
            if info.st_uid == me and not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o077:
                os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o077)

    strip(str(root))
    for folder, folders, files in os.walk(root):
        for name in (*folders, *files):
            strip(os.path.join(folder, name))


def atomic_write(path: Path, data: bytes, mode: int = PRIVATE_FILE) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never half of one.

    temp file in the same directory, fsync, rename, fsync the directory. The file is 0600 unless the
    caller gives its mode (a file of the user's own, in the workspace); the folders a private file
    needs are made 0700.
    """
    if mode & 0o077:
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        private_dir(path.parent)
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
        self._file = filelock.FileLock(self.lock_file, timeout=timeout, mode=PRIVATE_FILE)

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
