"""A venv with real Elyra and this package (editable), for tests/test_elyra.py, built once and cached.

Elyra pins jupyter-ai<3 and downgrades packages, so it never goes into the shared environment: the venv
lives under a cache folder, keyed by the content of what it installs, and is reused while that stays the
same. A half-built venv is never reused (its ``.complete`` marker is written last).

Building it takes minutes (about 290 packages), longer than one test may run, so ``scripts/test.sh`` runs
this module before pytest (``python tests/elyra_venv.py``); the tests' fixture then finds it cached.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: What the venv holds besides this package: the smallest package with Elyra's processor API and its server,
#: and the file keyring the tests' servers use (conftest.py).
ELYRA_REQUIREMENTS = ["elyra-server==4.1.1", "keyrings.alt>=5"]
BUILD_TIMEOUT = 40 * 60


def venv_key() -> str:
    """Changes when what the venv installs changes: Elyra's pin, this package's dependencies, the Python."""
    digest = hashlib.sha256()
    for part in (*ELYRA_REQUIREMENTS, (REPO / "pyproject.toml").read_text(), sys.version, str(REPO)):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def venv_folder() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jupyter-remote-compute"
    return cache / f"elyra-venv-{venv_key()}"


def build_elyra_venv(folder: Path) -> tuple[Path | None, str]:
    """The venv's python (built now unless cached) and what happened; None when it cannot be built.

    One builder at a time (a lock beside the folder): a second one, started meanwhile by another
    test run, would remove the folder under the first one's installer."""
    python = folder / "bin" / "python"
    if (folder / ".complete").exists():
        return python, "cached"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / ".complete").exists():
            return python, "cached (built meanwhile by another run)"
        return _build(folder, python)


def _build(folder: Path, python: Path) -> tuple[Path | None, str]:
    if folder.exists():
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    t0 = time.monotonic()
    steps = [
        [sys.executable, "-m", "venv", str(folder)],
        [str(python), "-m", "pip", "install", "-q", *ELYRA_REQUIREMENTS],
        [str(python), "-m", "pip", "install", "-q", "-e", str(REPO)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        if done.returncode != 0:
            # pip's warnings (one a missing local index folder, here) would push its error out of sight
            said = [line for line in (done.stderr or done.stdout).splitlines() if not line.startswith("WARNING:")]
            return None, f"{' '.join(step[:5])} failed: " + "\n".join(said)[-2000:]
    (folder / ".complete").write_text(f"built in {time.monotonic() - t0:.0f} s\n")
    return python, f"built in {time.monotonic() - t0:.0f} s"


if __name__ == "__main__":
    python, how = build_elyra_venv(venv_folder())
    print(f"Elyra venv for tests/test_elyra.py: {how}")
    sys.exit(0 if python else 1)
