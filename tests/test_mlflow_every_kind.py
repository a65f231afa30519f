"""The README's kind of training script, logging to MLflow, end to end on every kind of machine.

Each kind this installation registers is a parameter, and each needs a
``<kind>_machine`` fixture below that adds a real machine of that kind to the
service: a new engine cannot ship without running these scripts on its far
side. The far side's Python has MLflow (for ssh, a virtualenv with
mlflow-skinny, see far_python.py), and whatever the script logged there must
come back as one local run.
"""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Callable
from pathlib import Path

import agent_fixture
import jupyter_server_fixture
import pytest
import skypilot_fixture
import slurm_fixture
import sshd_fixture
from conftest import job_runs
from mlflow.tracking import MlflowClient

from jupyter_remote_compute.engines import engine_kinds
from jupyter_remote_compute.jobs.service import JobService, require_trained
from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
remote_server = jupyter_server_fixture.remote_server
slurm_bed = slurm_fixture.slurm_bed
agent_bed = agent_fixture.agent_bed
sky_home = skypilot_fixture.sky_home
sky_client = skypilot_fixture.sky_client
skypilot_bed = skypilot_fixture.skypilot_bed

# A script that names its own experiment and run, and logs every kind of record MLflow has.
NAMED_EXPERIMENT = textwrap.dedent(
    """\
    import mlflow

    mlflow.set_experiment("named-on-the-far-side")
    with mlflow.start_run(run_name="far-run"):
        mlflow.log_param("lr", 0.1)
        for step in range(5):
            mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        mlflow.set_tag("stage", "far")
        with open("notes.txt", "w") as f:
            f.write("written on the far side\\n")
        mlflow.log_artifact("notes.txt")
    """
)


@pytest.fixture
def local_machine(make_service: Callable[..., JobService], quickstart: Path) -> tuple[JobService, str]:
    return make_service(quickstart), "local"


@pytest.fixture
def ssh_machine(
    make_service: Callable[..., JobService], quickstart: Path, ssh_agent_env: sshd_fixture.TestBed
) -> tuple[JobService, str]:
    service = make_service(quickstart)
    service.machines.add("box", "ssh", "127.0.0.1", ssh_agent_env.options())
    return service, "box"


@pytest.fixture
def jupyter_machine(
    make_service: Callable[..., JobService], quickstart: Path, remote_server: jupyter_server_fixture.RemoteServer
) -> tuple[JobService, str]:
    service = make_service(quickstart)
    service.machines.add("far", "jupyter", remote_server.url, {"token_secret": "compute/remote"})
    return service, "far"


@pytest.fixture
def slurm_machine(
    make_service: Callable[..., JobService], quickstart: Path, slurm_bed: slurm_fixture.SlurmBed
) -> tuple[JobService, str]:
    service = make_service(quickstart)
    service.machines.add("hpc", "slurm", "127.0.0.1", slurm_bed.machine_options())
    return service, "hpc"


@pytest.fixture
def agent_machine(
    make_service: Callable[..., JobService], quickstart: Path, agent_bed: agent_fixture.AgentBed
) -> tuple[JobService, str]:
    """A pull agent, as another user, connected to a server on the same workspace; this service queues for it."""
    agent_bed.add_machine("lab")
    agent_bed.start_agent("lab")
    return make_service(quickstart), "lab"


@pytest.fixture
def skypilot_machine(
    make_service: Callable[..., JobService],
    quickstart: Path,
    skypilot_bed: skypilot_fixture.SkyBed,
    sky_client: Path,
) -> tuple[JobService, str]:
    """The session's SkyPilot cluster on the Slurm test bed (launched here if no earlier test did)."""
    service = make_service(quickstart)
    service.machines.add("cloud", "skypilot", skypilot_bed.infra, skypilot_bed.machine_options())
    skypilot_fixture.ensure_up(service.engine("cloud"))
    return service, "cloud"


@pytest.fixture(params=engine_kinds())
def machine(request: pytest.FixtureRequest) -> tuple[JobService, str]:
    """A service over a copy of the quickstart workspace, and a machine of one kind in it."""
    return request.getfixturevalue(f"{request.param}_machine")


def test_the_quickstart_script_logs_there_and_its_run_lands_here(machine, quickstart: Path, tracking_uri: str) -> None:
    """examples/quickstart/train.py logs without naming an experiment: MLflow's Default one must exist there."""
    service, name = machine
    spec = {
        "machine": name,
        "command": "python train.py",
        "send": ["train.py", "data/*.csv"],
        "bring_back": ["model.pkl", "metrics.json"],
        "name": "quickstart",
    }
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=180)
    assert job.state == "succeeded", job.reason
    require_trained(job)
    for output in ("model.pkl", "metrics.json"):
        assert job.outputs[output]["sha256"] == hashlib.sha256((quickstart / output).read_bytes()).hexdigest()

    runs = job_runs(tracking_uri, job.id)
    assert len(runs) == 1 and runs[0].info.run_id == job.mlflow_run_id
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["rows"] == "40"
    assert run.data.tags["model"] == "ols"
    assert run.data.tags["remote_compute.engine"] == service.engine(name).kind
    client = MlflowClient(tracking_uri)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "residual")) == list(range(40))
    assert "metrics.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_a_script_naming_its_own_experiment_is_replayed_whole(machine, quickstart: Path, tracking_uri: str) -> None:
    service, name = machine
    (quickstart / "named.py").write_text(NAMED_EXPERIMENT)
    spec = {"machine": name, "command": "python named.py", "send": ["named.py"]}
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=180)
    assert job.state == "succeeded", job.reason

    runs = job_runs(tracking_uri, job.id)
    assert len(runs) == 1
    run = runs[0]
    assert run.data.params == {"lr": "0.1"}
    assert run.data.tags["stage"] == "far"
    client = MlflowClient(tracking_uri)
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(s, 1.0 / (s + 1)) for s in range(5)]
    artifact = Path(client.download_artifacts(run.info.run_id, "notes.txt"))
    assert artifact.read_text() == "written on the far side\n"
