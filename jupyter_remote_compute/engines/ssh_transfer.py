"""Tar streams for the ssh engine: written by hand going out, read and checked by hand coming back.

Going out, only headers are built (``tarfile.TarInfo.tobuf``) and file data is
streamed in large chunks straight into the channel: ``tarfile``'s stream mode
re-buffers in 10 KiB records, which costs more than the encryption.

Coming back, a small reader parses each header itself (ustar, GNU long names,
pax records) so every entry is judged before anything is written: only
regular files, directories and hard links to files already extracted from the
same stream are accepted, each under an allowed top-level name, never
absolute, never through ``..``. Files are created with ``O_NOFOLLOW`` under
directories this module made itself. This works the same on Python 3.10+
(no ``tarfile`` extraction filter needed, as nothing is extracted by tarfile).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import stat
import tarfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from .base import EngineError

BLOCK = 512
CHUNK = 1 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class UnsafeArchive(EngineError):
    """The far side sent a tar entry that could write outside the destination."""


class ArchiveCut(EngineError):
    """The stream ended in the middle of an entry: the connection or the far side went away; try again."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


def check_relpath(relpath: str, what: str = "path") -> str:
    """A POSIX path inside a tree: relative, no ``..``, no empty parts, no NUL."""
    if not relpath or "\0" in relpath or relpath.startswith("/"):
        raise ValueError(f"{what}: {relpath!r} must be a relative path")
    parts = relpath.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{what}: {relpath!r} must not contain empty, '.' or '..' parts")
    return relpath


def check_digest(digest: str) -> str:
    if not _HEX64.match(digest):
        raise ValueError(f"sha256: {digest!r} is not a lowercase hex sha256 digest")
    return digest


def check_relpaths(relpaths: Sequence[str], what: str = "path") -> None:
    """``check_relpath`` of every path, and none twice; scanned as one string, not name by name.

    A 10,000-file input set is checked in 2-3 ms instead of ~25: the unchanged re-send it guards
    costs only a round trip otherwise. Where the scan finds something, the check of each name says what.
    """
    joined = "\0".join(relpaths)
    # With every separator a NUL: an empty, '.' or '..' part shows as one of three substrings.
    parts = f"\0{joined}\0".replace("/", "\0")
    if joined.count("\0") != len(relpaths) - 1 or "\0\0" in parts or "\0.\0" in parts or "\0..\0" in parts:
        for relpath in relpaths:
            check_relpath(relpath, what)
    if len(set(relpaths)) != len(relpaths):
        seen: set[str] = set()
        for relpath in relpaths:
            if relpath in seen:
                raise ValueError(f"{what}: {relpath!r} is listed twice")
            seen.add(relpath)


def check_digests(digests: Sequence[str]) -> None:
    """``check_digest`` of each, scanned together (see ``check_relpaths``)."""
    try:
        hex_only = not "".join(digests).encode("ascii").translate(None, b"0123456789abcdef")
    except UnicodeEncodeError:
        hex_only = False
    if not hex_only or any(len(d) != 64 for d in digests):
        for digest in digests:
            check_digest(digest)


# -- writing ---------------------------------------------------------------------


_USTAR_LIMIT = 8**11  # sizes and times below this fit a plain ustar header's octal fields
_USTAR_TAIL = b"ustar\x0000" + b"\0" * (32 + 32 + 8 + 8 + 155 + 12)


def tar_header(name: str, *, size: int = 0, mode: int = 0o644, mtime: float = 0, linkname: str | None = None) -> bytes:
    """One member header (pax when a name needs it); data and padding are the caller's."""
    size = 0 if linkname is not None else size
    mtime = int(mtime)
    link = linkname or ""
    if (
        len(name) <= 100
        and len(link) <= 100
        and name.isascii()
        and link.isascii()
        and 0 <= size < _USTAR_LIMIT
        and 0 <= mtime < _USTAR_LIMIT
    ):
        # The common case built directly, the same block tarfile writes for it in about a tenth of the
        # time: an unchanged re-send of a big tree is one such header per file and little else.
        block = b"".join(
            (
                name.encode("ascii").ljust(100, b"\0"),
                b"%07o\x000000000\x000000000\x00%011o\x00%011o\x00" % (mode & 0o7777, size, mtime),
                b"        ",  # the checksum field counts as spaces
                tarfile.REGTYPE if linkname is None else tarfile.LNKTYPE,
                link.encode("ascii").ljust(100, b"\0"),
                _USTAR_TAIL,
            )
        )
        return block[:148] + b"%06o\x00" % sum(block) + block[155:]
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = mode
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if linkname is not None:
        info.type = tarfile.LNKTYPE
        info.linkname = linkname
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


def padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


END_OF_ARCHIVE = b"\0" * (2 * BLOCK)


# -- reading ---------------------------------------------------------------------


class TarReader:
    """Sequential tar parsing over ``read(n)`` (which may return fewer bytes; b"" at the end)."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self._buf = b""
        self._pos = 0
        self.bytes_read = 0

    def _fill(self) -> bool:
        chunk = self._read(CHUNK)
        if not chunk:
            return False
        self.bytes_read += len(chunk)
        self._buf = self._buf[self._pos :] + chunk if self._pos < len(self._buf) else chunk
        self._pos = 0
        return True

    def read_exact(self, n: int) -> bytes:
        while len(self._buf) - self._pos < n:
            if not self._fill():
                raise ArchiveCut("the archive from the far side ended in the middle of an entry")
        out = self._buf[self._pos : self._pos + n]
        self._pos += n
        return out

    def stream(self, n: int) -> Iterable[memoryview]:
        """Yield exactly ``n`` bytes in chunks without copying them again."""
        while n > 0:
            if self._pos >= len(self._buf) and not self._fill():
                raise ArchiveCut("the archive from the far side ended in the middle of a file")
            take = min(n, len(self._buf) - self._pos)
            yield memoryview(self._buf)[self._pos : self._pos + take]
            self._pos += take
            n -= take

    def skip(self, n: int) -> None:
        for _ in self.stream(n):
            pass

    def members(self, across_archives: bool = False) -> Iterable[tarfile.TarInfo]:
        """Each real member with long names and pax records applied; data is read by the caller.

        ``across_archives``: zero blocks are skipped rather than ending the stream (``tar -i``), so
        archives written one after another read as one; the members end where the bytes end.
        """
        long_name: str | None = None
        long_link: str | None = None
        pax: dict[str, str] = {}
        while True:
            try:
                header = self.read_exact(BLOCK)
            except ArchiveCut:
                if long_name or long_link or pax:
                    raise
                return  # a stream may end without the two zero blocks
            if header == b"\0" * BLOCK:
                if across_archives and not (long_name or long_link or pax):
                    continue
                return
            try:
                info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
            except tarfile.HeaderError as e:
                raise UnsafeArchive(f"the archive from the far side has a bad header: {e}") from None
            if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
                data = self.read_exact(info.size + len(padding(info.size)))[: info.size]
                text = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
                if info.type == tarfile.GNUTYPE_LONGNAME:
                    long_name = text
                else:
                    long_link = text
                continue
            if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE):
                data = self.read_exact(info.size + len(padding(info.size)))[: info.size]
                if info.type != tarfile.XGLTYPE:
                    pax.update(_pax_records(data))
                continue
            if long_name is not None:
                info.name = long_name
            if long_link is not None:
                info.linkname = long_link
            if "path" in pax:
                info.name = pax["path"]
            if "linkpath" in pax:
                info.linkname = pax["linkpath"]
            if "size" in pax:
                info.size = int(pax["size"])
            long_name = long_link = None
            pax = {}
            yield info


def _pax_records(data: bytes) -> dict[str, str]:
    records = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space])
        if length <= 0:
            break
        record = data[space + 1 : pos + length - 1]  # without the trailing newline
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


class SafeExtractor:
    """Write accepted entries of a tar stream under ``dest``; refuse anything that could escape."""

    def __init__(self, dest: Path, allowed: Callable[[str], bool], source: str) -> None:
        self.dest = Path(dest)
        self.allowed = allowed
        self.source = source
        self.files: dict[str, int] = {}  # extracted regular files -> size
        self.digests: dict[str, str] = {}  # extracted regular files -> sha256 of the bytes written, hashed as they land
        self._dirs: set[str] = set()
        self.bytes_written = 0

    def discard(self) -> None:
        """Remove everything this extractor wrote: a refused archive leaves nothing behind."""
        for name in self.files:
            with contextlib.suppress(OSError):
                os.unlink(self.dest / name)
        for name in sorted(self._dirs, key=lambda d: d.count("/"), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(self.dest / name)
        self.files.clear()
        self.digests.clear()
        self._dirs.clear()

    def _refuse(self, name: str, why: str) -> UnsafeArchive:
        return UnsafeArchive(f"refused an entry of the archive from {self.source}: {name!r} ({why}); nothing was kept")

    def check_name(self, name: str) -> str:
        clean = name.rstrip("/")
        while clean.startswith("./"):
            clean = clean[2:]
        if not clean or clean.startswith("/") or "\0" in clean:
            raise self._refuse(name, "absolute or empty path")
        if any(p in ("", ".", "..") for p in clean.split("/")):
            raise self._refuse(name, "path with '..' or empty parts")
        if not self.allowed(clean):
            raise self._refuse(name, "not one of the requested outputs")
        return clean

    def _make_dirs(self, rel: str) -> None:
        # Walk down from dest, creating each part; an existing part must be a real directory we made
        # or found as a directory (never a symlink), so nothing can redirect a later write.
        path = self.dest
        done = ""
        for part in rel.split("/"):
            done = f"{done}/{part}" if done else part
            path = path / part
            if done in self._dirs:
                continue
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                st = os.lstat(path)
                if not stat.S_ISDIR(st.st_mode):
                    raise self._refuse(rel, "a file and a directory with the same name") from None
            self._dirs.add(done)

    def extract(
        self,
        reader: TarReader,
        info: tarfile.TarInfo,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        name = self.check_name(info.name)
        if info.type == tarfile.DIRTYPE:
            self._make_dirs(name)
            return
        if info.type == tarfile.LNKTYPE:
            # GNU tar stores a second name of the same inode as a hard link: materialise it as a copy
            # of the file already extracted from this very stream, and only then.
            target = info.linkname.rstrip("/")
            while target.startswith("./"):
                target = target[2:]
            if target not in self.files:
                raise self._refuse(name, f"hard link to {target!r}, which is not a file of this archive")
            self._write(name, 0o644, self._copy_source(target), progress=None)
            self.digests[name] = self.digests[target]  # the same bytes: no second hash
            return
        if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
            kind = {
                tarfile.SYMTYPE: "symbolic link",
                tarfile.CHRTYPE: "character device",
                tarfile.BLKTYPE: "block device",
                tarfile.FIFOTYPE: "fifo",
            }.get(info.type, f"entry type {info.type!r}")
            raise self._refuse(name, f"{kind}s are not accepted")
        mode = 0o755 if info.mode & 0o111 else 0o644
        self._write(name, mode, reader.stream(info.size), progress)
        reader.skip(len(padding(info.size)))

    def extract_file(
        self,
        name: str,
        mode: int,
        chunks: Iterable[bytes | memoryview],
        progress: Callable[[int], None] | None = None,
    ) -> str:
        """One regular file that came by itself (not in the stream), under the same checks; its sha256."""
        name = self.check_name(name)
        self._write(name, 0o755 if mode & 0o111 else 0o644, chunks, progress)
        return self.digests[name]

    def _copy_source(self, target: str) -> Iterable[bytes]:
        with open(self.dest / target, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def _write(
        self, name: str, mode: int, chunks: Iterable[bytes | memoryview], progress: Callable[[int], None] | None
    ) -> None:
        parent = posixpath.dirname(name)
        if parent:
            self._make_dirs(parent)
        path = self.dest / name
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags, mode)
        except IsADirectoryError:
            raise self._refuse(name, "a file and a directory with the same name") from None
        except OSError as e:
            raise self._refuse(name, f"cannot be written: {e.strerror}") from None
        size = 0
        digest = hashlib.sha256()
        try:
            for chunk in chunks:
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                size += len(chunk)
                if progress:
                    progress(len(chunk))
        finally:
            os.close(fd)
        self.files[name] = size
        self.digests[name] = digest.hexdigest()
        self.bytes_written += size


# -- sha256sum output --------------------------------------------------------------


def parse_sha256sum(lines: bytes) -> dict[str, str]:
    """Parse GNU ``sha256sum`` lines, including its escaping of ``\\`` and newlines in names."""
    result = {}
    for line in lines.split(b"\n"):
        if not line:
            continue
        escaped = line.startswith(b"\\")
        if escaped:
            line = line[1:]
        digest, sep, name = line[:64], line[64:66], line[66:]
        if len(digest) != 64 or sep not in (b"  ", b" *"):
            raise EngineError(f"unexpected sha256sum output from the far side: {line[:120]!r}")
        if escaped:
            name = re.sub(
                rb"\\(.)", lambda m: {b"n": b"\n", b"r": b"\r", b"\\": b"\\"}.get(m.group(1), m.group(1)), name
            )
        result[name.decode("utf-8", "surrogateescape")] = digest.decode("ascii")
    return result
