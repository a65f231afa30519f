"""Waiting on a condition with a deadline: the one way tests synchronise (never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T],
    timeout: float = 30.0,
    message: str | Callable[[], str] = "condition",
    interval: float = 0.05,
) -> T:
    """Poll ``condition`` until it returns something truthy and return that; fail at the deadline.

    ``message`` says what was awaited; a callable one is asked at the deadline, to say what was found."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            said = message() if callable(message) else message
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {said}")
        time.sleep(interval)
