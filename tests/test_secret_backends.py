"""The backend matrix: each place a secret can live, through the real CLI in its own process.

keyring chooses its backend once per process, so every case runs ``jupyter remote-compute`` in
subprocesses with its own environment: keyring's fail backend, keyrings.alt's plaintext file picked
by keyring itself and named explicitly, a real Secret Service (gnome-keyring under dbus-run-session),
deployment variables and files, and the private file. Where a secret can be stored, a job on the
built-in machine references it as ``secret:NAME``, writes its sha256, and the value must then be in
no file under the test's folder (workspace, job state, scratch, MLflow store) but the store's own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PLAINTEXT = "keyrings.alt.file.PlaintextKeyring"
FAIL = "keyring.backends.fail.Keyring"
# The job: the secret's digest in a file it brings back, so the value itself is never written.
JOB = (
    "import hashlib, os, pathlib; "
    "pathlib.Path('digest.txt').write_text(hashlib.sha256(os.environ['TOKEN'].encode()).hexdigest())"
)


@dataclasses.dataclass
class Bed:
    root: Path  # everything the case writes is under here
    workspace: Path
    env: dict[str, str]
    value: str

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jupyter_remote_compute.cli", *args],
            cwd=self.workspace,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=180,
        )

    def ok(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = self.cli(*args, stdin=stdin)
        assert proc.returncode == 0, proc.stderr
        return proc

    def listing(self) -> dict[str, Any]:
        return json.loads(self.ok("secrets", "list", "--json").stdout)

    def job_gets_the_value(self, name: str, *, stored_in: list[Path]) -> None:
        """A job on `local` with TOKEN=secret:NAME sees the value; no other file under root holds it."""
        self.ok(
            "run",
            "--machine",
            "local",
            "--env",
            f"TOKEN=secret:{name}",
            "--bring-back",
            "digest.txt",
            "--",
            sys.executable,
            "-c",
            JOB,
        )
        digest = (self.workspace / "digest.txt").read_text()
        assert digest == hashlib.sha256(self.value.encode()).hexdigest()
        assert files_holding(self.root, self.value) == sorted(stored_in)


def files_holding(root: Path, value: str) -> list[Path]:
    raw = value.encode()
    found = []
    for folder, _, files in os.walk(root):
        for file in files:
            path = Path(folder, file)
            if path.is_file() and not path.is_symlink() and raw in path.read_bytes():
                found.append(path)
    return sorted(found)


@pytest.fixture
def bed(tmp_path: Path, scratch_dir: Path) -> Bed:
    workspace = tmp_path / "ws"
    (workspace / ".punica").mkdir(parents=True)
    home = tmp_path / "home"
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PYTHON_KEYRING_BACKEND"
        and not k.startswith(
            ("JUPYTER_REMOTE_COMPUTE_SECRETS", "JUPYTER_REMOTE_COMPUTE_KEYRING", "REMOTE_COMPUTE_SECRET_")
        )
    }
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        JUPYTER_REMOTE_COMPUTE_SCRATCH=str(scratch_dir),
        MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
        MLFLOW_EXPERIMENT_NAME="tests",
    )
    return Bed(tmp_path, workspace, env, f"tok-{uuid.uuid4().hex}")


def test_the_fail_backend_is_refused_with_guidance(bed: Bed) -> None:
    bed.env["PYTHON_KEYRING_BACKEND"] = FAIL
    proc = bed.cli("secrets", "set", "compute/box", stdin=bed.value + "\n")
    assert proc.returncode == 1
    assert "No usable system keyring" in proc.stderr and "gnome-keyring" in proc.stderr
    assert "JUPYTER_REMOTE_COMPUTE_SECRETS_STORE=file" in proc.stderr and "REMOTE_COMPUTE_SECRET_" in proc.stderr
    store = bed.listing()["store"]
    assert not store["usable"] and "No usable system keyring" in store["problem"]
    proc = bed.cli("run", "--machine", "local", "--env", "TOKEN=secret:compute/box", "--", "true")
    assert proc.returncode == 1 and "No usable system keyring" in proc.stderr
    assert files_holding(bed.root, bed.value) == []


def test_a_plaintext_file_keyring_picks_by_itself_is_refused(bed: Bed) -> None:
    pytest.importorskip("keyrings.alt")  # a test extra: the case is keyring finding it installed
    proc = bed.cli("secrets", "set", "compute/box", stdin=bed.value + "\n")
    assert proc.returncode == 1, proc.stdout
    assert "No usable system keyring" in proc.stderr and PLAINTEXT in proc.stderr
    assert "without encryption" in proc.stderr
    assert not (Path(bed.env["XDG_DATA_HOME"]) / "python_keyring").exists()  # nothing written


def test_a_plaintext_file_named_explicitly_is_used_and_noted(bed: Bed) -> None:
    pytest.importorskip("keyrings.alt")
    bed.env["PYTHON_KEYRING_BACKEND"] = PLAINTEXT
    proc = bed.ok("secrets", "set", "compute/box", stdin=bed.value + "\n")
    assert f"the keyring backend {PLAINTEXT}" in proc.stdout and "PYTHON_KEYRING_BACKEND" in proc.stderr
    listing = bed.listing()
    assert "named in PYTHON_KEYRING_BACKEND" in listing["store"]["note"]
    assert listing["secrets"] == [
        {
            "name": "compute/box",
            "source": "keyring",
            "where": f"the keyring backend {PLAINTEXT}",
            "read_only": False,
            "problem": None,
        }
    ]
    # keyrings.alt keeps it base64-encoded: the plain value is in no file at all.
    bed.job_gets_the_value("compute/box", stored_in=[])


@pytest.fixture
def secret_service(bed: Bed) -> Iterator[None]:
    """A real Secret Service: gnome-keyring, unlocked, on a private session bus for this test."""
    missing = [tool for tool in ("dbus-run-session", "gnome-keyring-daemon") if shutil.which(tool) is None]
    if missing:
        message = f"{', '.join(missing)} missing: apt-get install gnome-keyring libsecret-tools dbus (scripts/setup.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)  # CI must run this case, not skip it
        pytest.skip(message)
    runtime = bed.root / "run"
    runtime.mkdir(mode=0o700)
    script = (
        f"export XDG_RUNTIME_DIR={runtime}\n"
        'eval "$(printf pw | gnome-keyring-daemon --unlock --components=secrets)"\n'
        'echo "bus=$DBUS_SESSION_BUS_ADDRESS"\n'
        # Holds the session (and with it the bus and the daemon) open until the test closes stdin.
        "exec cat >/dev/null\n"
    )
    session = subprocess.Popen(
        ["dbus-run-session", "--", "sh", "-c", script],
        env=bed.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert session.stdout is not None
        line = session.stdout.readline()  # blocks until the daemon is up (or the session died: "")
        assert line.startswith("bus=unix:"), f"the Secret Service did not start: {line!r}"
        bed.env["DBUS_SESSION_BUS_ADDRESS"] = line.strip().removeprefix("bus=")
        yield
    finally:
        assert session.stdin is not None
        session.stdin.close()
        session.wait(timeout=30)


@pytest.mark.usefixtures("secret_service")
def test_the_secret_service_is_used_without_being_named(bed: Bed) -> None:
    proc = bed.ok("secrets", "set", "compute/box", stdin=bed.value + "\n")
    assert "the system keyring (Secret Service)" in proc.stdout and "note:" not in proc.stderr
    listing = bed.listing()
    assert listing["store"] == {
        "kind": "keyring",
        "where": "the system keyring (Secret Service)",
        "note": None,
        "usable": True,
        "problem": None,
    }
    assert [(s["name"], s["source"]) for s in listing["secrets"]] == [("compute/box", "keyring")]
    # keyring by itself chains the Secret Service with keyrings.alt's files; only the former was used.
    found = subprocess.run(
        [sys.executable, "-c", "import keyring; print([type(b).__name__ for b in keyring.get_keyring().backends])"],
        env=bed.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "'Keyring'" in found and "PlaintextKeyring" in found
    assert not (Path(bed.env["XDG_DATA_HOME"]) / "python_keyring").exists()
    bed.job_gets_the_value("compute/box", stored_in=[])  # gnome-keyring's file is encrypted


def test_a_deployment_variable_works_without_a_keyring(bed: Bed) -> None:
    bed.env["PYTHON_KEYRING_BACKEND"] = FAIL
    bed.env["REMOTE_COMPUTE_SECRET_COMPUTE_BOX"] = bed.value
    listing = bed.listing()
    assert listing["secrets"] == [
        {
            "name": "COMPUTE_BOX",
            "source": "deployment-env",
            "where": "environment variable REMOTE_COMPUTE_SECRET_COMPUTE_BOX",
            "read_only": True,
            "problem": None,
        }
    ]
    proc = bed.cli("secrets", "set", "compute/box", stdin="other-value\n")
    assert proc.returncode == 1 and "provided by the deployment" in proc.stderr
    assert "deployment (read-only)" in bed.ok("secrets", "list").stdout
    bed.job_gets_the_value("compute/box", stored_in=[])


def test_deployment_files_work_and_one_others_can_read_is_refused(bed: Bed) -> None:
    bed.env["PYTHON_KEYRING_BACKEND"] = FAIL
    mounted = bed.root / "mounted"
    (mounted / "compute").mkdir(parents=True)
    (mounted / "compute" / "box").write_text(bed.value + "\n")
    (mounted / "compute" / "box").chmod(0o400)
    (mounted / "open").write_text("tok-open-" + uuid.uuid4().hex)
    (mounted / "open").chmod(0o644)
    bed.env["JUPYTER_REMOTE_COMPUTE_SECRETS_DIR"] = str(mounted)
    entries = {s["name"]: s for s in bed.listing()["secrets"]}
    assert entries["compute/box"]["source"] == "deployment-dir" and entries["compute/box"]["problem"] is None
    assert str(mounted / "open") in entries["open"]["problem"]
    proc = bed.cli("run", "--machine", "local", "--env", "TOKEN=secret:open", "--", "true")
    assert proc.returncode == 1 and str(mounted / "open") in proc.stderr and "chmod 600" in proc.stderr
    bed.job_gets_the_value("compute/box", stored_in=[mounted / "compute" / "box"])


def test_the_private_file_store(bed: Bed) -> None:
    bed.env["PYTHON_KEYRING_BACKEND"] = FAIL  # the server it is for has no keyring
    bed.env["JUPYTER_REMOTE_COMPUTE_SECRETS_STORE"] = "file"
    path = Path(bed.env["XDG_CONFIG_HOME"]) / "jupyter-remote-compute" / "secrets.json"
    proc = bed.ok("secrets", "set", "compute/box", stdin=bed.value + "\n")
    assert str(path) in proc.stdout and "private file readable by this user" in proc.stderr
    assert path.stat().st_mode & 0o777 == 0o600
    listing = bed.listing()
    assert listing["store"]["kind"] == "file" and "private file readable by this user" in listing["store"]["note"]
    assert [(s["name"], s["source"], s["read_only"]) for s in listing["secrets"]] == [("compute/box", "file", False)]
    bed.job_gets_the_value("compute/box", stored_in=[path])
    bed.ok("secrets", "delete", "compute/box")
    assert files_holding(bed.root, bed.value) == []
