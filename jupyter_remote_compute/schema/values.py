"""The checks of single values a boundary type holds: paths, durations, amounts, names, image references.

Each raises ``problem`` (the setting is named by whoever reads it: ``base.validate`` from where the
value sits, ``base.checked`` from the name it is given) and returns the value as it is kept.
"""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath
from typing import Any

from ..secrets import is_secret_name
from .base import problem

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)", re.IGNORECASE)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SCHEDULER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}$")  # a partition, an account, a qos
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_MEMORY_UNIT_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}
# A registry reference: [host[:port]/]path[:tag][@sha256:hex]; no spaces, no shell metacharacters.
_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")
#: The runtimes an image may be run with (``auto``: podman where installed, else docker).
RUNTIMES = ("auto", "podman", "docker")


def given_or(default: Any) -> Any:
    """A validator that reads null (or "") as not given; any other falsy value ({}, 0, false) is a
    wrong type, not the default."""

    def read(value: Any) -> Any:
        return default if value is None or value == "" else value

    return read


def duration(value: Any) -> float | None:
    """Seconds from ``3600``, ``"90s"``, ``"30m"``, ``"1h30m"`` or ``"2d"``; None (or "") stays None."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise problem("expected a duration such as 3600, '30m' or '2h'")
    if isinstance(value, (int, float)):
        seconds = float(value) if value < 1e300 else math.inf  # float() of a huge int would raise
    else:
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or _DURATION.sub("", text).strip():
                raise problem(f"{value!r} is not a duration; write seconds or e.g. '30m', '2h', '1h30m'") from None
            seconds = sum(float(n) * _UNIT_SECONDS[u.lower()] for n, u in parts)
    if seconds <= 0:
        raise problem("must be longer than zero")
    if not math.isfinite(seconds):
        raise problem("must be a finite duration")
    return seconds


def relative_path(path: Any) -> str:
    """A workspace-relative POSIX path: no absolute path, no ``..``, no control characters."""
    if not isinstance(path, str) or not path.strip():
        raise problem("expected a workspace-relative path")
    if any(ord(c) < 32 or c == "\x7f" for c in path):
        raise problem(f"{path!r} contains a control character (newline, tab, …)")
    if path.startswith(("/", "~")) or re.match(r"^[A-Za-z]:[\\/]", path) or "\\" in path:
        raise problem(f"{path!r} must be relative to the workspace, not absolute")
    parts = PurePosixPath(path).parts
    if ".." in parts:
        raise problem(f"{path!r} leads out of the workspace ('..' is not allowed)")
    normalised = str(PurePosixPath(*[p for p in parts if p != "."])) if parts else "."
    if normalised in (".", "") or normalised.startswith(".punica"):
        raise problem(f"{path!r} names the workspace itself or its .punica folder")
    return normalised


def path_list(value: Any) -> Any:
    """None is no path, one string is one path; anything else but a list of strings is refused."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise problem("expected a list of paths")
    return value


def machine_names(value: Any) -> tuple[str, ...]:
    """A list of machine names (one as a string), none twice: a job's fallback machines, a pool's machines."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise problem("expected a list of machine names")
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name:
            raise problem("expected a machine name", at=i)
        if name in value[:i]:
            raise problem(f"names {name!r} twice", at=i)
    return tuple(value)


def memory_mb(value: Any) -> int:
    """MiB from ``"32G"``, ``"512M"``, ``"1.5G"``, ``"2T"`` or a plain number of MiB (Slurm's default unit)."""
    if isinstance(value, bool):
        raise problem("expected an amount such as '32G' or '512M'")
    if isinstance(value, int):
        mb = float(value)
    else:
        found = _MEMORY.match(str(value))
        if not found:
            raise problem(f"{value!r} is not an amount of memory; write e.g. '32G' or '512M'")
        mb = float(found.group(1)) * _MEMORY_UNIT_MB[found.group(2).upper()]
    if mb <= 0:
        raise problem("must be more than zero")
    return math.ceil(mb)


def format_memory(mb: int) -> str:
    """Slurm's spelling: whole gibibytes as ``32G``, anything else as ``1536M``."""
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def at_least(minimum: int) -> Any:
    """A validator of a whole number of at least ``minimum`` (digits in a string count)."""

    def read(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value.strip())
            else:
                raise problem(f"expected a whole number, got {value!r}")
        if value < minimum:
            raise problem(f"must be at least {minimum}, got {value}")
        return value

    return read


def scheduler_name(value: Any) -> str:
    if not isinstance(value, str) or not _SCHEDULER_NAME.match(value):
        raise problem(f"{value!r} is not a Slurm name (letters, digits and _ . : + -, at most 64)")
    return value


def image_ref(ref: Any) -> str:
    if not isinstance(ref, str) or not _REFERENCE.fullmatch(ref):
        raise problem(f"{ref!r} is not an image reference (registry/name:tag or name@sha256:…)")
    return ref


def runtime(value: Any) -> str:
    """None or "" is ``auto``; {} or 0 are no runtime's name."""
    value = "auto" if value is None or value == "" else value
    if not isinstance(value, str) or value not in RUNTIMES:
        raise problem(f"{value!r} is not one of {', '.join(RUNTIMES)}")
    return value


def registry_secret(value: Any) -> str | None:
    """The name of a Secret Manager entry, or None when not given."""
    if value is None:
        return None
    if not isinstance(value, str) or value.startswith("secret:") or not is_secret_name(value):
        raise problem("expected the plain name of a Secret Manager entry holding user:password")
    return value
