"""Which files a job sends, and their digests.

``build_manifest`` expands the spec's ``send`` entries (files, directories,
globs) into regular files that stay inside the workspace once symlinks are
followed, and hashes each. Hashing a large dataset on every submit would make
re-submitting slow, so a digest cache keyed by (path, size, mtime_ns, inode)
skips files that have not changed since they were last read.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from ..engines.base import InputFile
from ..errors import InvalidSettings
from ..fsutil import atomic_write, sha256_file
from ..workspace import relative_to_note

_SKIP_DIRS = {".punica", ".git", "__pycache__", ".ipynb_checkpoints"}


class DigestCache:
    """sha256 by (path, size, mtime_ns, inode), kept in a JSON file; a cache, so losing it is harmless."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: dict[str, list] = {}
        self._dirty = False
        if path is not None:
            try:
                self._entries = json.loads(path.read_text())
            except (OSError, ValueError):
                self._entries = {}

    def digest(self, path: Path, st: os.stat_result) -> str:
        token = [st.st_size, st.st_mtime_ns, st.st_ino]
        key = str(path)
        with self._lock:
            entry = self._entries.get(key)
            if entry and entry[:3] == token:
                return entry[3]
        value = sha256_file(path)
        with self._lock:
            self._entries[key] = [*token, value]
            self._dirty = True
        return value

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        with self._lock:
            data = json.dumps(self._entries, separators=(",", ":")).encode()
            self._dirty = False
        atomic_write(self.path, data)


def _inside(root: Path, path: Path) -> bool:
    return path == root or root in path.parents


def _regular_file(root: Path, rel: str, field: str) -> tuple[Path, os.stat_result]:
    path = root / rel
    real = path.resolve()
    if not _inside(root, real):
        raise InvalidSettings(f"{field}: {rel!r} is a link that leads out of the workspace", field=field)
    st = real.stat()
    if not stat.S_ISREG(st.st_mode):
        raise InvalidSettings(f"{field}: {rel!r} is not a regular file (device, pipe or socket)", field=field)
    return real, st


def expand_send(root: Path, patterns: Sequence[str]) -> list[tuple[str, str]]:
    """(relative path, field) for every file the patterns name, in a stable order, without repeats."""
    root = root.resolve()
    seen: dict[str, str] = {}
    for i, pattern in enumerate(patterns):
        field = f"send[{i}]"
        if any(c in pattern for c in "*?["):
            matches = sorted(root.glob(pattern))
        else:
            matches = [root / pattern] if os.path.lexists(root / pattern) else []
        if not matches:
            raise InvalidSettings(
                f"{field}: {pattern!r} matches no file in the workspace; {relative_to_note(root)}", field=field
            )
        for match in matches:
            real = match.resolve()
            if not _inside(root, real):
                raise InvalidSettings(
                    f"{field}: {match.relative_to(root).as_posix()!r} leads out of the workspace", field=field
                )
            if real.is_dir():
                for dirpath, dirnames, filenames in os.walk(match, followlinks=False):
                    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
                    for name in sorted(filenames):
                        rel = (Path(dirpath) / name).relative_to(root).as_posix()
                        seen.setdefault(rel, field)
            else:
                seen.setdefault(match.relative_to(root).as_posix(), field)
    return list(seen.items())


def build_manifest(root: Path, patterns: Sequence[str], cache: DigestCache) -> list[InputFile]:
    """Expand, check and hash every input. Blocking: call it off the event loop."""
    root = root.resolve()
    files = []
    for rel, field in expand_send(root, patterns):
        real, st = _regular_file(root, rel, field)
        files.append(
            InputFile(
                relpath=rel,
                source=real,
                size=st.st_size,
                sha256=cache.digest(real, st),
                mode=0o755 if st.st_mode & 0o111 else 0o644,
            )
        )
    cache.save()
    return files


def manifest_json(files: Sequence[InputFile]) -> list[dict[str, object]]:
    return [{"path": f.relpath, "size": f.size, "sha256": f.sha256} for f in files]
