"""The JupyterHub bed's build, once per machine (``hub_fixture.py`` starts hubs from it).

A venv from Debian's ``/usr/bin/python3`` (the default ``python3`` is pyenv's, under root's 0700 home, which
the spawned users cannot run) holding JupyterHub, JupyterLab and this package's dependencies, and
configurable-http-proxy from npm, in ``/var/tmp/jrc-hub/<key>/``, keyed by what made it. It is built beside
its place and renamed into it whole (``uv venv --relocatable``: its scripts do not name the folder they were
built in), so a half-built one is never used.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from importlib.metadata import requires
from pathlib import Path

from uv import find_uv_bin

DEBIAN_PYTHON = "/usr/bin/python3"
CACHE = Path("/var/tmp/jrc-hub")
#: What the venv holds besides this package's dependencies (the file keyring the servers' extension uses).
HUB_REQUIREMENTS = ["jupyterhub==6.1.1", "jupyterlab==4.6.6", "keyrings.alt>=5"]
PROXY = "configurable-http-proxy@5.3.0"
BUILD_TIMEOUT = 20 * 60


def hub_key() -> str:
    """Changes when what the build installs changes: the pins, this package's dependencies, the Python, uv."""
    dependencies = [r for r in requires("jupyter-remote-compute") or [] if "extra ==" not in r]
    python = subprocess.run([DEBIAN_PYTHON, "-c", "import sys; print(sys.version)"], capture_output=True, text=True)
    uv = subprocess.run([find_uv_bin(), "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256()
    for part in (*HUB_REQUIREMENTS, PROXY, *sorted(dependencies), python.stdout, uv, "bytecode"):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class HubBuild:
    """The cached venv and proxy: ``folder/venv``, ``folder/proxy``."""

    folder: Path

    @property
    def bin(self) -> Path:
        return self.folder / "venv" / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    @property
    def proxy(self) -> Path:
        return self.folder / "proxy" / "bin" / "configurable-http-proxy"


def build_hub(folder: Path | None = None) -> tuple[HubBuild | None, str]:
    """The build (made now unless cached) and what happened; None and why when it cannot be made.

    One builder at a time per machine (a lock beside the folder); a later one finds it done."""
    folder = folder or CACHE / hub_key()
    build = HubBuild(folder)
    CACHE.mkdir(mode=0o755, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / ".complete").exists():
            return build, "cached"
        return _build(build)


def _run(step: Sequence[str]) -> str:
    """Run one build step; what went wrong, or "" when it worked."""
    done = subprocess.run(list(step), capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    if done.returncode == 0:
        return ""
    return f"{' '.join(step[:6])} failed: " + (done.stderr or done.stdout)[-2000:]


def _build(build: HubBuild) -> tuple[HubBuild | None, str]:
    for tool in (DEBIAN_PYTHON, shutil.which("npm")):
        if not tool or not os.path.exists(tool):
            return None, f"{tool or 'npm'} is missing"
    t0 = time.monotonic()
    staging = build.folder.with_name(build.folder.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    venv = staging / "venv"
    dependencies = [r for r in requires("jupyter-remote-compute") or [] if "extra ==" not in r]
    steps = [
        [find_uv_bin(), "venv", "--quiet", "--relocatable", "--python", DEBIAN_PYTHON, str(venv)],
        # The system's certificates, as pip here uses them: a TLS-inspecting proxy's CA is among them. The
        # bytecode too, as pip writes it: the hub's users cannot write it, and each server they spawn
        # compiled jupyter_server, JupyterLab and JupyterHub from source (1.6 s of CPU; 1.2 s with it).
        [find_uv_bin(), "pip", "install", "--quiet", "--system-certs", "--compile-bytecode",
         "--python", str(venv / "bin" / "python"), *HUB_REQUIREMENTS, *dependencies],
        # 3 s of CPU at each server's start for a format nothing checks (tests/README.md).
        [find_uv_bin(), "pip", "uninstall", "--quiet", "--python", str(venv / "bin" / "python"), "rfc3987-syntax"],
        ["npm", "install", "--silent", "--no-fund", "--no-audit", "--prefix", str(staging / "proxy"), "-g", PROXY],
    ]  # fmt: skip
    for step in steps:
        failed = _run(step)
        if failed:
            shutil.rmtree(staging, ignore_errors=True)
            return None, failed
    # The spawned users run it; nothing in it is secret.
    subprocess.run(["chmod", "-R", "a+rX", str(staging)], check=True)
    (staging / ".complete").write_text(f"built in {time.monotonic() - t0:.0f} s\n")
    shutil.rmtree(build.folder, ignore_errors=True)
    staging.rename(build.folder)
    return build, f"built in {time.monotonic() - t0:.0f} s"
