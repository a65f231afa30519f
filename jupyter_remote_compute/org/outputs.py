"""What a fetch on the organization's machine brought, as the tar stream every engine's fetch reads.

manifest.sh's layout: the list first, the files, the far side's digests last; the user's server lands
and verifies it as it does any machine's.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from ..engines.farside import SUMS_SUFFIX


def write_manifest_stream(tree: Path, fetched: Mapping[str, Any], manifest: str, out: IO[bytes]) -> None:
    """``tree`` as fetched (``work/<output>``, ``mlruns/``), ``fetched`` what the fetch said of it."""
    outputs, missing = fetched["outputs"], set(fetched["missing"])
    roots = [f"work/{o}" for o in outputs if o not in missing and os.path.lexists(tree / "work" / o)]
    if (tree / "mlruns").is_dir():
        roots.append("mlruns")
    total = sum(_bytes_in(tree / root) for root in roots)
    head = [f"M {i}" for i, o in enumerate(outputs) if o in missing] + [f"T {(total + 1023) // 1024}"]
    sums = b"".join(_sum_line(digest, f"work/{rel}") for rel, digest in sorted(fetched["digests"].items()))
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, manifest, ("\n".join(head) + "\n").encode())
        for root in roots:
            tar.add(tree / root, arcname=root, recursive=True)
        _add_bytes(tar, manifest + SUMS_SUFFIX, sums)


def _bytes_in(path: Path) -> int:
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    return sum(os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(path) for n in names)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _sum_line(digest: str, path: str) -> bytes:
    """One line of sha256sum's output, with its escaping of '\\' and line breaks in names."""
    raw = os.fsencode(path)
    if b"\\" in raw or b"\n" in raw or b"\r" in raw:
        raw = raw.replace(b"\\", b"\\\\").replace(b"\n", b"\\n").replace(b"\r", b"\\r")
        return b"\\" + digest.encode() + b"  " + raw + b"\n"
    return digest.encode() + b"  " + raw + b"\n"
