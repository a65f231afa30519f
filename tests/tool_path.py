"""A PATH that holds only the named tools, for tests of a machine that lacks the others."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest


def only_these_tools(folder: Path, tools: Iterable[str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make ``folder`` a bin folder of links to ``tools`` and the whole PATH; returns the folder.

    The local engine puts its own interpreter's folder first on PATH, so ``sys.executable`` is moved
    into this folder too: without ``python3`` among ``tools`` the far side then has no Python at all.
    """
    folder.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found, f"{tool} is not installed"
        (folder / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setattr(sys, "executable", str(folder / "python3"))
    return folder
