"""Waiting on a condition with a deadline: the one way tests synchronise (never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T], timeout: float = 30.0, message: str = "condition", interval: float = 0.05
) -> T:
    """Poll ``condition`` until it returns something truthy and return that; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {message}")
        time.sleep(interval)
