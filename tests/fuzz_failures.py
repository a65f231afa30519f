"""What the schemathesis hooks of both APIs share: a server error that is a documented upstream failure."""

from __future__ import annotations

from typing import Any


def kept(failure: Any, response: Any, upstream: set[tuple[int, str]]) -> bool:
    """Keep every failure except a server error (ST101) whose status and JSON ``code`` are in ``upstream``."""
    if getattr(failure, "code", None) != "ST101":
        return True
    try:
        code = response.json().get("code")
    except Exception:  # not JSON: a real server error
        return True
    return (response.status_code, code) not in upstream
