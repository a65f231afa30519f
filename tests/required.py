"""Real parts the tests need: on a developer's machine a missing one skips, in CI it fails the run."""

from __future__ import annotations

import os

import pytest


def require(present: bool, what: str) -> None:
    """Skip without ``what`` locally; in CI (CI=true) a missing part is a failure, never a skip."""
    if present:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI needs {what}; scripts/setup.sh installs it", pytrace=False)
    pytest.skip(f"{what} is missing")
