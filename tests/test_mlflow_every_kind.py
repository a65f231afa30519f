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
import os
import platform
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import agent_fixture
import jupyter_server_fixture
import mlflow
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

# The most common way people log today: autolog around a fit, plus one metric and one tag of their own.
# A dataset scikit-learn ships, so nothing is downloaded; a fixed seed, so here and there train alike.
AUTOLOG_SCRIPT = textwrap.dedent(
    """\
    import mlflow
    from sklearn.datasets import load_diabetes
    from sklearn.ensemble import RandomForestRegressor

    mlflow.sklearn.autolog()
    X, y = load_diabetes(return_X_y=True, as_frame=True)
    with mlflow.start_run():
        RandomForestRegressor(n_estimators=10, max_depth=4, random_state=0).fit(X, y)
        mlflow.log_metric("extra", 1.5)
        mlflow.set_tag("stage", "parity")
    """
)


@pytest.fixture(scope="module")
def trained_here(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The autolog script run here with plain ``python`` into a store of its own: (tracking URI, run id)."""
    folder = tmp_path_factory.mktemp("here")
    (folder / "train_rf.py").write_text(AUTOLOG_SCRIPT)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true"}
    done = subprocess.run([sys.executable, "train_rf.py"], cwd=folder, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (run,) = MlflowClient(uri).search_runs(["0"])
    return uri, run.info.run_id


def _user_tags(run: Any) -> dict[str, str]:
    return {k: v for k, v in run.data.tags.items() if not k.startswith(("mlflow.", "remote_compute."))}


def _datasets(run: Any) -> list[tuple[Any, ...]]:
    return sorted(
        (d.dataset.name, d.dataset.digest, d.dataset.source_type, d.dataset.schema, d.dataset.profile,
         tuple(sorted((t.key, t.value) for t in d.tags)))
        for d in run.inputs.dataset_inputs
    )  # fmt: skip


def _models(client: MlflowClient, run: Any) -> list[tuple[str, dict[str, str], dict[str, float]]]:
    models = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
    return sorted((m.name, dict(m.params), {x.key: x.value for x in m.metrics}) for m in models)


def _predict(uri: str, run_id: str, rows: Any) -> list[float]:
    mlflow.set_tracking_uri(uri)
    try:
        return list(mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(rows))
    finally:
        mlflow.set_tracking_uri(None)


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


def test_an_autologged_run_trained_there_reads_like_one_trained_here(
    machine, quickstart: Path, tracking_uri: str, trained_here: tuple[str, str]
) -> None:
    """What a quality gate reads with MLflow's own client is the same for the job's run as for a local one."""
    from sklearn.datasets import load_diabetes

    service, name = machine
    (quickstart / "train_rf.py").write_text(AUTOLOG_SCRIPT)
    spec: dict[str, Any] = {"machine": name, "command": "python train_rf.py", "send": ["train_rf.py"], "name": "parity"}
    if service.engine(name).kind in ("slurm", "skypilot"):
        # scikit-learn, pandas and MLflow outgrow the test cluster's default per-job memory limit (256M).
        spec["resources"] = {"memory": "1G"}
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=300)
    assert job.state == "succeeded", job.reason
    here_uri, here_id = trained_here
    here_client, there_client = MlflowClient(here_uri), MlflowClient(tracking_uri)
    here, there = here_client.get_run(here_id), there_client.get_run(job.mlflow_run_id)

    assert there.info.status == here.info.status == "FINISHED"
    assert there.data.params == here.data.params and "n_estimators" in there.data.params
    # The job's run carries its usage figures besides (remote_compute.*), and nothing else.
    trained = {k: v for k, v in there.data.metrics.items() if not k.startswith("remote_compute.")}
    assert trained == here.data.metrics and "training_r2_score" in trained
    assert (
        _user_tags(there)
        == _user_tags(here)
        == {
            "stage": "parity",
            "estimator_class": "sklearn.ensemble._forest.RandomForestRegressor",
            "estimator_name": "RandomForestRegressor",
        }
    )
    assert len(there.inputs.dataset_inputs) == 1 and _datasets(there) == _datasets(here)
    assert _models(there_client, there) == _models(here_client, here)
    assert [m.name for m in there_client.search_logged_models([there.info.experiment_id])] == ["model"]
    assert there.data.tags["mlflow.source.name"] == "train_rf.py"
    assert there.data.tags["mlflow.user"] == job.user
    assert there.data.tags["remote_compute.host"] == job.machine_snapshot["address"]
    # The model loads from the run, as a gate would load it, and predicts exactly what the local one does.
    rows = load_diabetes(return_X_y=True, as_frame=True)[0].head(20)
    assert _predict(tracking_uri, there.info.run_id, rows) == _predict(here_uri, here_id, rows)


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_the_run_names_the_os_python_and_gpus_of_the_machine_it_ran_on(
    kind: str, request: pytest.FixtureRequest, tracking_uri: str
) -> None:
    """Read when the job ends if no check of the machine is at hand: a gate can tell where it trained."""
    service, name = request.getfixturevalue(f"{kind}_machine")
    job = service.wait(service.submit(JobSpec.from_json({"machine": name, "command": "true"})).job.id, timeout=180)
    assert job.state == "succeeded", job.reason
    tags = MlflowClient(tracking_uri).get_run(job.mlflow_run_id).data.tags
    # The test beds' machines are this computer (over loopback for ssh): the same kernel as here.
    assert tags["remote_compute.kernel"] == f"{platform.system()} {platform.release()}"
    facts = service.check_machine(name)
    assert tags["remote_compute.os"] == facts["os"] != ""
    assert tags["remote_compute.python"] == facts["python"] and facts["python"][0].isdigit()
    assert tags["remote_compute.cpus"] == str(facts["cpus"])
    assert tags["remote_compute.gpus"] == str(len(facts["gpus"]))
    assert ("remote_compute.gpu_names" in tags) == bool(facts["gpus"])
