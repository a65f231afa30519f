"""A venv with real Elyra and this package (editable), for tests/test_elyra.py, built once and cached.

Elyra pins jupyter-ai<3 and downgrades packages, so it never goes into the shared environment: the venv
lives under a cache folder outside the clone, keyed by what it installs (Elyra's pin, this package's
dependencies, the Python), and is reused while that stays the same, by every clone on the machine. Only
this package itself is the clone's: it is installed editable, with no dependencies, from whichever clone
runs the tests. uv (a dependency of this package) builds it: 18 to 26 s here, where pip's resolver took
442 s over the same 290 packages. A half-built venv is never reused (its ``.complete``
marker is written last).

``scripts/test.sh`` runs this module before pytest (``python tests/elyra_venv.py``), so no test waits on a
build; the tests' fixture then finds it cached.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import time
from importlib.metadata import requires
from pathlib import Path

from uv import find_uv_bin

REPO = Path(__file__).resolve().parent.parent
#: What the venv holds besides this package: the smallest package with Elyra's processor API and its server,
#: and the file keyring the tests' servers use (conftest.py).
ELYRA_REQUIREMENTS = ["elyra-server==4.1.1", "keyrings.alt>=5"]
BUILD_TIMEOUT = 40 * 60


def venv_key() -> str:
    """Changes when what the venv installs changes: Elyra's pin, this package's dependencies, the Python.

    Not the clone's path nor the rest of pyproject.toml: a new clone, or a new test extra, reuses the venv."""
    dependencies = [r for r in requires("jupyter-remote-compute") or [] if "extra ==" not in r]
    digest = hashlib.sha256()
    for part in ("uv", "bytecode", *ELYRA_REQUIREMENTS, *sorted(dependencies), sys.version):
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
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".complete").exists():
            return _build(folder, python)
        # As scripts/test.sh does for the suite's own venv: 3 s of CPU at each Elyra server's start.
        _run([find_uv_bin(), "pip", "uninstall", "--quiet", "--python", str(python), "rfc3987-syntax"])
        if _installed_from(python) == REPO:
            return python, "cached"
        failed = _run(_uv_install(python, "--no-deps", "-e", str(REPO)))
        if failed:
            return None, failed
        return python, f"cached, {REPO} installed into it"


def _installed_from(python: Path) -> Path | None:
    """The clone whose jupyter_remote_compute the venv imports (None when it imports none)."""
    done = subprocess.run(
        [str(python), "-c", "import jupyter_remote_compute as p; print(p.__file__)"],
        capture_output=True,
        text=True,
        cwd="/",  # not a clone's folder: `python -c` imports from its working directory first
    )
    return Path(done.stdout.strip()).parent.parent if done.returncode == 0 else None


def _uv_install(python: Path, *args: str) -> list[str]:
    # The system's certificates, as pip here uses them: a TLS-inspecting proxy's CA is among them. The
    # bytecode too, as pip writes it: where the environment sets PYTHONDONTWRITEBYTECODE (this CI machine's
    # does), every Elyra server's start compiled its packages from source (2.2 s of CPU to import
    # jupyter_server, JupyterLab and Elyra; 1.0 s with their bytecode there).
    return [find_uv_bin(), "pip", "install", "--quiet", "--system-certs", "--compile-bytecode", "--python",
            str(python), *args]  # fmt: skip


def _run(step: list[str]) -> str:
    """Run one build step; what went wrong, or "" when it worked."""
    done = subprocess.run(step, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    if done.returncode == 0:
        return ""
    return f"{' '.join(step[:6])} failed: " + (done.stderr or done.stdout)[-2000:]


def _build(folder: Path, python: Path) -> tuple[Path | None, str]:
    if folder.exists():
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    t0 = time.monotonic()
    steps = [
        [find_uv_bin(), "venv", "--quiet", "--python", sys.executable, str(folder)],
        # One resolution for Elyra and this package's dependencies together, so neither breaks the other.
        _uv_install(python, *ELYRA_REQUIREMENTS, "-e", str(REPO)),
        [find_uv_bin(), "pip", "uninstall", "--quiet", "--python", str(python), "rfc3987-syntax"],
    ]
    for step in steps:
        failed = _run(step)
        if failed:
            return None, failed
    (folder / ".complete").write_text(f"built in {time.monotonic() - t0:.0f} s\n")
    return python, f"built in {time.monotonic() - t0:.0f} s"


if __name__ == "__main__":
    python, how = build_elyra_venv(venv_folder())
    print(f"Elyra venv for tests/test_elyra.py: {how}")
    sys.exit(0 if python else 1)
