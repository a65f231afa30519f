"""What a job is asked to do: ``JobSpec`` (defined in ``schema/spec.py``), validated once for every
entry point, and the checks of durations and paths the faces share with it."""

from __future__ import annotations

from ..schema import values
from ..schema.base import checked
from ..schema.resources import NO_RESOURCES
from ..schema.spec import ENV_NAME, RESERVED_ENV, JobSpec

__all__ = [
    "ENV_NAME",
    "NO_RESOURCES",
    "RESERVED_ENV",
    "JobSpec",
    "check_relative_path",
    "format_duration",
    "parse_duration",
]


def parse_duration(value: str | float | int | None, field: str) -> float | None:
    """Seconds from ``3600``, ``"90s"``, ``"30m"``, ``"1h30m"`` or ``"2d"``; None stays None."""
    return checked(values.duration, value, field)


def check_relative_path(path: str, field: str) -> str:
    """A workspace-relative POSIX path: no absolute path, no ``..``, no control characters."""
    return checked(values.relative_path, path, field)


def format_duration(seconds: float) -> str:
    seconds = round(seconds)
    out = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not out):
            n, seconds = divmod(seconds, size)
            out.append(f"{n}{unit}")
    return "".join(out)
