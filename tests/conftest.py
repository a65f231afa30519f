"""Fixtures shared by every test: a throw-away workspace and a real keyring backend.

The keyring is keyrings.alt's file backend in a private temporary directory:
a real backend (it stores and reads values), never the user's own keyring.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["pytest_jupyter.jupyter_server"]

# Set before any test imports keyring, so the backend is chosen once, here.
_KEYRING_HOME = tempfile.mkdtemp(prefix="jrc-keyring-")
os.environ["PYTHON_KEYRING_BACKEND"] = "keyrings.alt.file.PlaintextKeyring"
os.environ["XDG_DATA_HOME"] = _KEYRING_HOME
# Each test workspace gets its own MLflow recorder: it goes soon after the test, not ten minutes on.
os.environ.setdefault("JUPYTER_REMOTE_COMPUTE_RECORDER_IDLE", "30")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_KEYRING_HOME, ignore_errors=True)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """An empty workspace (a folder holding ``.punica/``)."""
    root = tmp_path / "ws"
    (root / ".punica").mkdir(parents=True)
    return root


@pytest.fixture
def scratch_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The built-in machine's job base for this test only."""
    path = tmp_path / "scratch"
    path.mkdir()
    monkeypatch.setenv("JUPYTER_REMOTE_COMPUTE_SCRATCH", str(path))
    yield path


QUICKSTART = Path(__file__).resolve().parent.parent / "examples" / "quickstart"


@pytest.fixture
def quickstart(tmp_path: Path) -> Path:
    """A copy of examples/quickstart as a workspace: train.py, data/points.csv, .punica/compute.yaml."""
    root = tmp_path / "quickstart"
    shutil.copytree(
        QUICKSTART,
        root,
        ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts", "model.pkl", "metrics.json", "jobs*", "digests*"),
    )
    return root


@pytest.fixture
def tracking_uri(tmp_path: Path) -> str:
    """A real MLflow sqlite store of this test's own."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def make_service(scratch_dir: Path, tracking_uri: str):  # type: ignore[no-untyped-def]
    """Build the lifecycle service over a workspace, with fast polls and a private MLflow store."""
    from jupyter_remote_compute.jobs.service import JobService, ServiceSettings
    from jupyter_remote_compute.tracking import TrackingSettings
    from jupyter_remote_compute.workspace import Workspace

    services = []

    def make(root: Path, **overrides: object) -> JobService:
        settings = ServiceSettings(
            poll_interval=0.2,
            cancel_grace=overrides.pop("cancel_grace", 3.0),  # type: ignore[arg-type]
            scratch_dir=scratch_dir,
            tracking=TrackingSettings(tracking_uri=tracking_uri, experiment="tests"),
        )
        service = JobService(Workspace(root), settings)
        services.append(service)
        return service

    yield make
    for service in services:
        service.close()


@pytest.fixture
def server_workspace(quickstart: Path) -> Path:
    """The workspace the test server serves: a copy of the quickstart example."""
    return quickstart


@pytest.fixture
def jp_server_config(server_workspace: Path, scratch_dir: Path, tracking_uri: str) -> dict:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_remote_compute": True}},
        "RemoteComputeApp": {
            "workspace": str(server_workspace),
            "scratch_dir": str(scratch_dir),
            "mlflow_tracking_uri": tracking_uri,
            "mlflow_experiment": "tests",
            "poll_interval": 0.2,
            "cancel_grace": 1.0,
        },
    }


def job_runs(tracking_uri: str, job_id: str) -> list:  # type: ignore[type-arg]
    """The MLflow runs tagged with ``job_id``, in any experiment (there should be exactly one)."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    if not experiments:
        return []
    return client.search_runs(experiments, filter_string=f"tags.`remote_compute.job_id` = '{job_id}'")
