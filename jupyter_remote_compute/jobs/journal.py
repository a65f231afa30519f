"""The journal beside the state file: its head line, and checksummed lines framed and read back.

Each change is one line, ``<crc32> <json>``; a torn or damaged line ends a replay. The state file's
and the journal's first lines name the journal generation they belong to (``read_head``).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

JOURNAL_SUFFIX = ".journal"
JOURNAL_FORMAT = 1


def journal_head(base_id: str) -> bytes:
    return json.dumps({"journal": JOURNAL_FORMAT, "base": base_id}, separators=(",", ":")).encode() + b"\n"


def frame(text: str) -> bytes:
    """One journal line: the record's CRC-32, a space, the record, a newline. Torn or damaged lines fail it."""
    body = text.encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def unframe(data: bytes, start: int) -> tuple[list[dict[str, Any]], int]:
    """The whole, intact records at the start of ``data``, and the offset just past the last of them.

    The first line that is unfinished (no newline: a writer is still appending, or died while it did)
    or fails its checksum ends the replay; what follows is not trusted.
    """
    records: list[dict[str, Any]] = []
    pos = 0
    while (newline := data.find(b"\n", pos)) >= 0:
        line = data[pos:newline]
        body = line[9:]
        if line[8:9] != b" " or line[:8] != b"%08x" % zlib.crc32(body):
            break
        try:
            record = json.loads(body)
        except ValueError:
            break
        if not isinstance(record, dict):
            break
        records.append(record)
        pos = newline + 1
    return records, start + pos


def read_head(f: Any, limit: int = 4096) -> dict[str, Any] | None:
    """The JSON object on the first line of a file written by this module, or None (an older or other file)."""
    line = f.readline(limit)
    if not line.endswith(b"\n"):
        return None
    text = line[:-1]
    if text.startswith(b"{") and not text.endswith(b"}"):
        text += b"}"  # the state file's first line opens the object its second line continues
    try:
        head = json.loads(text)
    except ValueError:
        return None
    return head if isinstance(head, dict) else None
