"""What the product writes is its user's only, whatever the umask: ``.punica/`` and job folders 0700, the
state, journal, usage, digests, logs and locks 0600, the default MLflow store 0600 and its artifacts 0700.

Another local user of a hub host (Debian's homes are 0755) reads none of it; ``test_hub_bed.py`` proves
that with real Linux users. Here: the modes, with umask 022, and a workspace an earlier version left open.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_remote_compute.fsutil import SharedFileLock, atomic_write, private_dir, private_open
from jupyter_remote_compute.jobs.service import JobService, ServiceSettings
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.recording.local_store import keep_store_private
from jupyter_remote_compute.recording.tracking import TrackingSettings
from jupyter_remote_compute.workspace import Workspace


@pytest.fixture
def open_umask() -> Iterator[None]:
    """umask 022, as a login on Debian has it: new files 0644, new folders 0755 unless made otherwise."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _open_to_others(root: Path) -> list[str]:
    """Everything under ``root`` (itself included) that a group or other user may read, write or enter."""
    found = [root] if _mode(root) & 0o077 else []
    for folder, folders, files in os.walk(root):
        found += [Path(folder, n) for n in (*folders, *files) if _mode(Path(folder, n)) & 0o077]
    return [f"{p} {_mode(p):o}" for p in found]


def test_the_file_primitives_make_private_files_and_folders_whatever_the_umask(tmp_path: Path) -> None:
    before = os.umask(0)
    try:
        atomic_write(tmp_path / "a" / "b" / "state.json", b"{}")
        with private_open(tmp_path / "c" / "log") as f:
            f.write(b"line\n")
        private_dir(tmp_path / "d" / "e")
        with SharedFileLock(tmp_path / "f.lock", timeout=5):
            pass
        atomic_write(tmp_path / "user" / "script.py", b"", mode=0o644)  # a file of the user's, as asked
    finally:
        os.umask(before)
    for folder in ("a", "a/b", "c", "d", "d/e"):
        assert _mode(tmp_path / folder) == 0o700, folder
    for file in ("a/b/state.json", "c/log", "f.lock"):
        assert _mode(tmp_path / file) == 0o600, file
    assert _mode(tmp_path / "user" / "script.py") == 0o644


def test_what_a_job_leaves_in_the_workspace_and_its_default_store_is_the_users_only(
    quickstart: Path, scratch_dir: Path, open_umask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the workspace's default store, mlflow.db
    tracking = TrackingSettings(experiment="tests")
    settings = ServiceSettings(poll_interval=0.2, scratch_dir=scratch_dir, tracking=tracking)
    service = JobService(Workspace(quickstart), settings)
    try:
        spec = {"machine": "local", "command": "cat train.py > /dev/null", "send": ["train.py"], "name": "private"}
        job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=120)
    finally:
        service.close()
    assert job.state == "succeeded" and job.mlflow_run_id, job.reason

    punica = quickstart / ".punica"
    kept = ["jobs.json", "jobs.json.journal", "jobs.json.lock", "usage.jsonl", "digests.json", "compute.yaml"]
    for name in kept:
        assert _mode(punica / name) == 0o600, name
    assert _mode(punica / "jobs" / job.id) == 0o700
    assert _mode(punica / "jobs" / job.id / "log") == 0o600
    # The quickstart's .punica/ came as a copy made with umask 022: tightened on first use, all through.
    assert _open_to_others(punica) == []
    assert _mode(quickstart / "mlflow.db") == 0o600
    assert _mode(quickstart / "mlartifacts") == 0o700
    assert _mode(scratch_dir / job.id) == 0o700  # the built-in machine's job folder: its inputs, log, records


def test_a_workspace_an_earlier_version_left_open_is_tightened_on_first_use(tmp_path: Path, open_umask: None) -> None:
    root = tmp_path / "ws"
    job = root / ".punica" / "jobs" / "j1"
    job.mkdir(parents=True)
    for path in (root / ".punica" / "jobs.json", root / ".punica" / "usage.jsonl", job / "log", root / "mlflow.db"):
        path.write_text("x")
    (root / "mlartifacts" / "0").mkdir(parents=True)
    assert _open_to_others(root / ".punica")

    JobService(Workspace(root)).close()
    assert _open_to_others(root / ".punica") == []
    keep_store_private(root, f"sqlite:///{root / 'mlflow.db'}")
    assert (_mode(root / "mlflow.db"), _mode(root / "mlartifacts")) == (0o600, 0o700)
