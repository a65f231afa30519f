"""Fixtures shared by every test: a throw-away workspace and a real keyring backend.

The keyring is keyrings.alt's file backend in a private temporary directory:
a real backend (it stores and reads values), never the user's own keyring.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path

import pytest
from recorders import OwnRecorder

pytest_plugins = ["pytest_jupyter.jupyter_server"]

# Set before any test imports keyring, so the backend is chosen once, here.
_KEYRING_HOME = tempfile.mkdtemp(prefix="jrc-keyring-")
os.environ["PYTHON_KEYRING_BACKEND"] = "keyrings.alt.file.PlaintextKeyring"
os.environ["XDG_DATA_HOME"] = _KEYRING_HOME
# The tests' faces share one MLflow recorder (one per user, as a person's faces do; a test that holds or
# kills it has its own, own_recorder): it goes half a minute after the last job recorded, not ten minutes on.
os.environ.setdefault("JUPYTER_REMOTE_COMPUTE_RECORDER_IDLE", "30")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _release_shared_hub()
    shutil.rmtree(_KEYRING_HOME, ignore_errors=True)


def _release_shared_hub() -> None:
    """The hub the group ``hub``'s modules share (``hub_fixture.shared_organization``) stopped, if one runs."""
    hub_fixture = sys.modules.get("hub_fixture")  # imported by a test that started it, or none was
    if hub_fixture is not None:
        hub_fixture.release_shared_organization()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the group ``hub``'s last test (the next is outside it, or none), its shared hub stops and
    the users are free for the Galata hub run, once that test's own fixtures are torn down. After the
    group ``skypilot``'s last, its cluster goes down and its API server stops (idle, they cost CPU)."""
    try:
        return (yield)
    finally:
        group = serial_group(item.nodeid)
        if group == "hub" and (nextitem is None or serial_group(nextitem.nodeid) != "hub"):
            _release_shared_hub()
        if group == "skypilot" and _last_of_group(item, group):
            _release_skypilot()


#: The tests of a serial group this process runs (its session's items in the group), and those done.
_GROUP_TESTS: dict[str, set[str]] = {}
_GROUP_DONE: dict[str, set[str]] = {}


def _last_of_group(item: pytest.Item, group: str) -> bool:
    """Whether ``item`` was the last test of ``group`` to run in this process (they need not run in a row:
    with ``-n 0`` the module test_mlflow_every_kind's [skypilot] cases sit between its other kinds')."""
    if group not in _GROUP_TESTS:
        _GROUP_TESTS[group] = {i.nodeid for i in item.session.items if serial_group(i.nodeid) == group}
    done = _GROUP_DONE.setdefault(group, set())
    done.add(item.nodeid)
    return done >= _GROUP_TESTS[group]


def _release_skypilot() -> None:
    """The session's SkyPilot cluster torn down and its API server stopped (``skypilot_fixture.release``)."""
    skypilot_fixture = sys.modules.get("skypilot_fixture")  # imported by a SkyPilot test module, if one ran
    if skypilot_fixture is not None:
        skypilot_fixture.release()


#: Tests that share one thing on this machine with room for one user at a time, by group (fnmatch patterns of
#: test ids, from the file name on). Under pytest-xdist (scripts/test.sh runs the suite on two workers) a
#: group's tests all run on one worker, one after another, and every other test goes alone to whichever
#: worker is free. Everything else the tests share is already one per worker: its own sshd, Slurm cluster,
#: Jupyter servers, ports from the OS.
SERIAL_GROUPS = {
    # root's podman store, the test user's rootless store and its pause process
    "containers": ("test_containers.py::*", "test_container_registry.py::*", "test_container_gpus.py::*",
                   "test_container_sh.py::*"),
    # SkyPilot's cluster on the Slurm bed runs on the node user's account: one launch at a time
    "skypilot": ("test_engine_skypilot.py::*", "test_skypilot_failures.py::*",
                 "test_mlflow_every_kind.py::*[[]skypilot[]]"),
    # the hub's Linux users (rcadmin, rcalice, rcbob, rceve), their homes and their servers: every module
    # that starts the hub bed (it holds the users for its process: one outside the group would wait on it)
    "hub": ("test_hub_bed.py::*", "test_organization.py::*", "test_org_*.py::*"),
    # the Slurm cluster of two namespaced nodes: one fixed subnet and bridge (slurm_nodes.LOCK, which
    # test_org_nodes.py, in the group hub, waits on too)
    "slurm_nodes": ("test_slurm_two_nodes.py::*", "test_ssh_host_list.py::*"),
}  # fmt: skip


def serial_group(nodeid: str) -> str | None:
    """The serial group a test belongs to, if any."""
    path, sep, rest = nodeid.partition("::")  # a parameter's id may hold a "/" (a route's pattern)
    name = path.rsplit("/", 1)[-1] + sep + rest
    return next((g for g, patterns in SERIAL_GROUPS.items() if any(fnmatch(name, p) for p in patterns)), None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """xdist's load scheduling, with each serial group one unit of work.

    Units are handed out largest first, so the groups start at once and end long before the single tests
    around them. (xdist's own ``loadgroup`` marks tests by rewriting their ids, which pytest 9.2 ignores.)
    """
    if config.getoption("dist") != "load":
        return None  # a --dist the caller chose
    from xdist.scheduler import LoadScopeScheduling

    class SerialGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return serial_group(nodeid) or nodeid

    return SerialGroupScheduling(config, log)


@pytest.fixture
def own_recorder() -> Iterator[OwnRecorder]:
    """A recorder of the test's own, for a test that holds, kills or idles it out (``recorders.py``)."""
    own = OwnRecorder()
    yield own
    own.close()


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
    from jupyter_remote_compute.recording.tracking import TrackingSettings
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
            "mlflow_ui_prestart": False,  # MLflow's UI only where a test asks for it
        },
    }


def job_runs(tracking_uri: str, job_id: str) -> list:  # type: ignore[type-arg]
    """The MLflow runs tagged with ``job_id``, in any experiment (there should be exactly one)."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).exists():
        # Nothing recorded yet. A client opened now would make the store and migrate it while the recorder
        # writes its own (sqlite3: "duplicate column name", CI of 2026-12-07 00:43).
        return []
    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    if not experiments:
        return []
    return client.search_runs(experiments, filter_string=f"tags.`remote_compute.job_id` = '{job_id}'")
