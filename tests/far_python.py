"""A far-side Python that has MLflow, as a user's training machine would.

The ssh test user must run the same training scripts the local tests run, so
it gets Debian's ``python3`` in a virtualenv with ``mlflow-skinny`` at the
version this side uses (what a lean training image carries), plus scikit-learn,
pandas and psutil at this side's versions (the autolog parity script, MLflow's
system metrics; a model pickled there loads here), installed by uv. The virtualenv is
built once per machine and MLflow version, under a world-readable folder, and
reused by every later session; a half-built one is never used (it is built
beside its final place and renamed into it).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import zipfile
from importlib.metadata import version
from pathlib import Path

from filelock import FileLock
from uv import find_uv_bin

DEBIAN_PYTHON = "/usr/bin/python3"
ROOT = Path("/var/tmp/jrc-far-python")
#: What a training machine carries beside MLflow, at this side's versions.
TRAINING_PACKAGES = ("scikit-learn", "numpy", "scipy", "pandas", "psutil")


@functools.cache
def far_python_bin() -> Path:
    """The ``bin/`` folder of a virtualenv whose ``python`` imports MLflow; built on first use, looked
    for once per test process (every fixture of a far side asks)."""
    mlflow_version = version("mlflow")
    home = ROOT / f"mlflow-skinny-{mlflow_version}-sklearn-{version('scikit-learn')}"
    python = home / "bin" / "python"
    ROOT.mkdir(mode=0o755, exist_ok=True)
    with FileLock(str(ROOT / ".build.lock"), timeout=600):
        if not _works(python, mlflow_version):
            _build(home, mlflow_version)
    return home / "bin"


def _works(python: Path, mlflow_version: str) -> bool:
    if not python.exists():
        return False
    # Its installed version, read from its metadata: importing MLflow would cost 2 s of CPU per look.
    probe = subprocess.run(
        [str(python), "-c", "from importlib.metadata import version; print(version('mlflow-skinny'))"],
        capture_output=True,
        text=True,
    )
    return probe.returncode == 0 and probe.stdout.strip() == mlflow_version


def _build(home: Path, mlflow_version: str) -> None:
    shutil.rmtree(home, ignore_errors=True)
    venv_with(home, [f"mlflow-skinny=={mlflow_version}", *(f"{name}=={version(name)}" for name in TRAINING_PACKAGES)])


def venv_with(home: Path, pins: list[str]) -> None:
    """Build at ``home`` a virtualenv of Debian's python with ``pins``, world-readable; built beside it
    and renamed into it whole, so a half-built one is never used."""
    if not os.path.exists(DEBIAN_PYTHON):
        raise RuntimeError(f"{DEBIAN_PYTHON} is missing: apt-get install python3 python3-venv")
    staging = home.with_name(home.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    # The venv as Debian's python makes it (pip and setuptools from its ensurepip: a model MLflow logs
    # there pins pip); the packages by uv, with their bytecode, as pip writes it: the test users who run
    # it cannot write it, and would compile MLflow, pandas and scikit-learn at every import.
    subprocess.run([DEBIAN_PYTHON, "-m", "venv", str(staging)], check=True, capture_output=True)
    installed = subprocess.run(
        # The system's certificates, as pip here uses them: a TLS-inspecting proxy's CA is among them.
        [find_uv_bin(), "pip", "install", "--quiet", "--system-certs", "--compile-bytecode",
         "--python", str(staging / "bin" / "python"), *pins],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if installed.returncode != 0:
        raise RuntimeError(f"could not install {' '.join(pins)} for the far side:\n{installed.stderr}")
    # The test user reads and runs it; nothing in it is secret.
    subprocess.run(["chmod", "-R", "a+rX", str(staging)], check=True)
    # The interpreter finds its pyvenv.cfg next to bin/, so the tree may move; the packages' scripts may not.
    staging.rename(home)


#: Where ``training_wheels`` keeps its wheels, once per machine and set of versions.
WHEELS_ROOT = Path("/var/tmp/jrc-training-wheels")


@functools.cache
def training_wheels() -> Path:
    """A folder of wheels (a ``find_links`` source) of MLflow's lean distribution and the training
    packages at this side's versions, with everything they need and pip: what a job's environment,
    built by the product on the far side, installs instead of the far side's virtualenv above. Written
    back from this side's installed distributions once per machine (the same bytes every session, so
    uv's caches keep them), world-readable for the ssh test user; a half-written one is never used."""
    from package_index import closure, installed_wheel

    names = ["mlflow-skinny", *TRAINING_PACKAGES, "pip"]
    key = "-".join(f"{name}-{version(name)}" for name in names)
    folder = WHEELS_ROOT / hashlib.sha256(key.encode()).hexdigest()[:16]
    WHEELS_ROOT.mkdir(mode=0o755, exist_ok=True)
    with FileLock(str(WHEELS_ROOT / ".build.lock"), timeout=600):
        if not folder.is_dir():
            staging = folder.with_name(folder.name + ".building")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            for dist in closure(names):
                installed_wheel(dist, staging, zipfile.ZIP_STORED)  # written and read at disk speed
            subprocess.run(["chmod", "-R", "a+rX", str(staging)], check=True)
            staging.rename(folder)
    return folder


#: Where a CPU wheel of torch may wait on this machine's image (TESTBED.md), else torch comes from the index.
TORCH_WHEELS = Path("/opt/wheels")
TORCH_ROOT = Path("/var/tmp/jrc-far-torch")


@functools.cache
def far_torch_bin() -> Path:
    """The ``bin/`` folder of a virtualenv with torch (CPU), whose ``torchrun`` and ``python`` a far-side
    job of several processes uses; built once per machine and wheel under a world-readable folder."""
    wheels = sorted(TORCH_WHEELS.glob("torch-*+cpu-*.whl")) if TORCH_WHEELS.is_dir() else []
    source = str(wheels[-1]) if wheels else "torch"
    home = TORCH_ROOT / (wheels[-1].name.split("-")[1] if wheels else "index")
    TORCH_ROOT.mkdir(mode=0o755, exist_ok=True)
    done = home / ".complete"
    with FileLock(str(TORCH_ROOT / ".build.lock"), timeout=900):
        if not done.exists():
            # Built in its place (torchrun's first line names its python), marked whole at the end.
            shutil.rmtree(home, ignore_errors=True)
            subprocess.run([DEBIAN_PYTHON, "-m", "venv", str(home)], check=True, capture_output=True)
            pip = [str(home / "bin" / "python"), "-m", "pip", "install", "-q", source, "numpy"]
            installed = subprocess.run(pip, capture_output=True, text=True)
            if installed.returncode != 0:
                raise RuntimeError(f"could not install torch for the far side:\n{installed.stderr}")
            subprocess.run(["chmod", "-R", "a+rX", str(home)], check=True)
            done.touch()
    return home / "bin"
