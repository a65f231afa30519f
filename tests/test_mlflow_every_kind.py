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
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import agent_fixture
import far_python
import jupyter_server_fixture
import mlflow
import pytest
import skypilot_fixture
import slurm_fixture
import sshd_fixture
import yaml
from conftest import job_runs
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from test_mlflow_parity import REGISTERING_SCRIPT, assert_registered_once_with_its_alias

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


# A grid search under autolog: GridSearchCV makes a parent run (autolog's own) and a child per candidate.
# Then a metric logged against the model for each step, as XGBoost's autolog does for each boosting round.
STEPS = 5
GRID_SCRIPT = textwrap.dedent(
    f"""\
    import mlflow
    from sklearn.datasets import load_iris
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    mlflow.sklearn.autolog()
    X, y = load_iris(return_X_y=True, as_frame=True)
    GridSearchCV(SVC(), {{"C": [0.5, 1.0]}}, cv=3).fit(X, y)
    run_id = mlflow.last_active_run().info.run_id
    print(f"far run id: {{run_id}}", flush=True)
    model_id = mlflow.last_logged_model().model_id
    for step in range({STEPS}):
        mlflow.MlflowClient().log_metric(run_id, "train-mlogloss", 1.0 / (step + 1), step=step, model_id=model_id)
    """
)
AUTOLOGGED = "tags.mlflow.autologging = 'sklearn'"
#: What a local child run says of where it came from, as its parent does.
SOURCE_TAGS = ("mlflow.user", "mlflow.source.name", "mlflow.source.type")


def _sized(service: JobService, spec: dict[str, Any]) -> JobSpec:
    """``spec`` as a job, with room for scikit-learn, pandas and MLflow where a scheduler limits memory.

    The test cluster's default per-job limit is 256M, and it enforces it by sampling the summed RSS of the
    job's processes every second (no cgroups here): MLflow alone peaks at 131 MB, but its client runs
    ``uname -p`` as it starts (``platform.uname()``), and a child caught between vfork and exec counts at its
    parent's size, so a sample there reads 262 MB and Slurm ends the job as out of memory."""
    if service.engine(spec["machine"]).kind in ("slurm", "skypilot"):
        spec = {**spec, "resources": {"memory": "1G"}}
    return JobSpec.from_json(spec)


def _train_here(tmp_path_factory: pytest.TempPathFactory, name: str, script: str) -> str:
    """``script`` run here as ``name`` with plain ``python`` into a store of its own: its tracking URI."""
    folder = tmp_path_factory.mktemp("here")
    (folder / name).write_text(script)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true"}
    done = subprocess.run([sys.executable, name], cwd=folder, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return uri


@pytest.fixture(scope="module")
def trained_here(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The autolog script trained here: (tracking URI, run id)."""
    uri = _train_here(tmp_path_factory, "train_rf.py", AUTOLOG_SCRIPT)
    (run,) = MlflowClient(uri).search_runs(["0"])
    return uri, run.info.run_id


@pytest.fixture(scope="module")
def grid_trained_here(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The grid search trained here: its tracking URI."""
    return _train_here(tmp_path_factory, "grid.py", GRID_SCRIPT)


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


def _autologged(client: MlflowClient) -> list[Any]:
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    return client.search_runs(experiments, filter_string=AUTOLOGGED)


def _tree(runs: list[Any]) -> tuple[Any, list[Any]]:
    """(the parent, its children) of one grid search's runs."""
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1
    return parent, children


def _models_by_name(client: MlflowClient, experiment_id: str) -> dict[str, Any]:
    """Each logged model of the experiment by name, read whole (``get_logged_model``)."""
    return {m.name: client.get_logged_model(m.model_id) for m in client.search_logged_models([experiment_id])}


def _steps(model: Any) -> dict[str, list[int]]:
    """The steps each of a model's metrics has (timings differ from run to run; steps do not)."""
    found: dict[str, list[int]] = {}
    for m in model.metrics:
        found.setdefault(m.key, []).append(m.step)
    return {key: sorted(steps) for key, steps in found.items()}


def _model_files(model: Any, into: Path) -> dict[str, str]:
    """The model's text files as they are stored (read from its artifact location, as a loader does)."""
    folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=model.artifact_location, dst_path=str(into)))
    return {
        str(p.relative_to(folder)): p.read_text()
        for p in folder.rglob("*")
        if p.is_file() and p.suffix in ("", ".yaml", ".txt", ".json")
    }


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
    job = service.wait(service.submit(_sized(service, spec)).job.id, timeout=180)
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
    job = service.wait(service.submit(_sized(service, spec)).job.id, timeout=180)
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
    job = service.wait(service.submit(_sized(service, spec)).job.id, timeout=300)
    assert job.state == "succeeded", job.reason
    here_uri, here_id = trained_here
    here_client, there_client = MlflowClient(here_uri), MlflowClient(tracking_uri)
    here, there = here_client.get_run(here_id), there_client.get_run(job.mlflow_run_id)

    assert there.info.status == here.info.status == "FINISHED"
    assert there.data.params == here.data.params and "n_estimators" in there.data.params
    # The job's run carries its usage figures besides (remote_compute.*), and nothing else.
    trained = {k: v for k, v in there.data.metrics.items() if not k.startswith("remote_compute.")}
    # autolog swallows its own errors as warnings in the job's log: the log says why a metric is missing
    assert trained == here.data.metrics and "training_r2_score" in trained, service.read_log(job.id).data[-4000:]
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
    facts = service.admin.check(name)
    assert tags["remote_compute.os"] == facts["os"] != ""
    assert tags["remote_compute.python"] == facts["python"] and facts["python"][0].isdigit()
    assert tags["remote_compute.cpus"] == str(facts["cpus"])
    assert tags["remote_compute.gpus"] == str(len(facts["gpus"]))
    assert ("remote_compute.gpu_names" in tags) == bool(facts["gpus"])


@pytest.mark.parametrize("kind", ["local", "ssh", "slurm"])
def test_a_grid_search_trained_there_is_found_and_read_like_one_trained_here(
    kind: str, request: pytest.FixtureRequest, tracking_uri: str, grid_trained_here: str, tmp_path: Path
) -> None:
    service, name = request.getfixturevalue(f"{kind}_machine")
    (service.workspace.root / "grid.py").write_text(GRID_SCRIPT)
    spec = {"machine": name, "command": "python grid.py", "send": ["grid.py"], "name": "grid"}
    job = service.wait(service.submit(_sized(service, spec)).job.id, timeout=300)
    assert job.state == "succeeded", job.reason
    here_client, there_client = MlflowClient(grid_trained_here), MlflowClient(tracking_uri)

    # The query a user types finds the job's runs as it finds the local ones: the parent and each child.
    here_parent, here_children = _tree(_autologged(here_client))
    there_parent, there_children = _tree(_autologged(there_client))
    assert there_parent.info.run_id == job.mlflow_run_id
    assert len(there_children) == len(here_children) == 2
    # Each child says where it came from as its parent does, as a local child does.
    for parent, children in ((here_parent, here_children), (there_parent, there_children)):
        for child in children:
            assert {k: child.data.tags.get(k) for k in SOURCE_TAGS} == {k: parent.data.tags[k] for k in SOURCE_TAGS}
    assert there_parent.data.tags["mlflow.user"] == job.user

    # The run id the job's log printed (the far side's) finds the job's run here.
    log = service.read_log(job.id).data.decode()
    (far_run_id,) = re.findall(r"^far run id: (\w+)$", log, re.MULTILINE)
    assert there_parent.data.tags["remote_compute.source_run_id"] == far_run_id

    # Every model's metrics have every step, as here (get_logged_model is what reads them).
    here_models = _models_by_name(here_client, here_parent.info.experiment_id)
    there_models = _models_by_name(there_client, there_parent.info.experiment_id)
    assert sorted(there_models) == sorted(here_models) == ["best_estimator", "model"]
    assert {n: _steps(m) for n, m in there_models.items()} == {n: _steps(m) for n, m in here_models.items()}
    for models in (here_models, there_models):
        trained = sorted(
            (m.step, m.value) for model in models.values() for m in model.metrics if m.key == "train-mlogloss"
        )
        assert trained == [(s, 1.0 / (s + 1)) for s in range(STEPS)]

    # The model's files name the local store (where it is), as a model logged here does; nothing of
    # the far side's job folder is left in them.
    for where, models in (("here", here_models), ("there", there_models)):
        for model_name, model in models.items():
            files = _model_files(model, tmp_path / where / model_name)
            mlmodel = yaml.safe_load(files["MLmodel"])
            assert mlmodel["artifact_path"] == model.artifact_location
            assert (mlmodel["model_id"], mlmodel["run_id"]) == (model.model_id, model.source_run_id)
            assert [path for path, text in files.items() if job.id in text] == []


@pytest.mark.parametrize("kind", ["ssh", "slurm"])
def test_a_model_registered_there_is_registered_here_once_with_its_alias(
    kind: str, request: pytest.FixtureRequest, tracking_uri: str
) -> None:
    """As on the built-in machine (test_mlflow_parity.py): autolog's registered_model_name and an alias."""
    service, name = request.getfixturevalue(f"{kind}_machine")
    (service.workspace.root / "register.py").write_text(REGISTERING_SCRIPT)
    spec = {"machine": name, "command": "python register.py", "send": ["register.py"]}
    job = service.wait(service.submit(_sized(service, spec)).job.id, timeout=300)
    assert job.state == "succeeded", job.reason
    assert_registered_once_with_its_alias(tracking_uri, job.mlflow_run_id)


# A model logged by hand, as most scripts that are not autologged do; its environment files are MLflow's.
MODEL_SCRIPT = textwrap.dedent(
    """\
    import mlflow
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    X, y = load_iris(return_X_y=True)
    with mlflow.start_run():
        model = LogisticRegression(max_iter=300).fit(X, y)
        mlflow.sklearn.log_model(model, name="model", serialization_format="cloudpickle")  # skops: not in the set
    """
)


def _pip_pins(files: dict[str, str]) -> dict[str, Any]:
    """What a model's environment files say of pip: pinned or not (the version is the environment's). The
    requirements MLflow infers differ with what else is installed (the full mlflow here, mlflow-skinny there)."""
    conda = yaml.safe_load(files["conda.yaml"])["dependencies"]
    build = yaml.safe_load(files["python_env.yaml"])["build_dependencies"]
    return {
        "conda.yaml": [re.sub(r"<=.*", "<=…", d) for d in conda if isinstance(d, str) and d.startswith("pip")],
        "python_env.yaml": [re.sub(r"==.*", "==…", d) for d in build if d.startswith("pip")],
    }


@pytest.mark.parametrize("kind", ["local", "ssh", "slurm"])
def test_a_model_logged_in_an_environment_built_there_pins_pip_as_one_logged_here(
    kind: str, request: pytest.FixtureRequest, tracking_uri: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The product builds the job's environment there (uv): it has pip, so MLflow pins it in the model's
    conda.yaml and python_env.yaml as it does in a local run's, and never warns that it cannot."""
    service, name = request.getfixturevalue(f"{kind}_machine")
    (service.workspace.root / "log_model.py").write_text(MODEL_SCRIPT)
    # The packages from a folder of this side's own wheels, with no index (nothing reached outside).
    env = {"UV_FIND_LINKS": str(far_python.training_wheels()), "UV_NO_INDEX": "1"}
    packages = [f"{n}=={importlib.metadata.version(n)}" for n in ("mlflow-skinny", "scikit-learn", "pandas")]
    spec = {"machine": name, "command": "python log_model.py", "send": ["log_model.py"], "env": env}
    spec["environment"] = {"packages": packages}
    job = service.wait(service.submit(_sized(service, spec)).job.id, timeout=600)
    assert job.state == "succeeded", job.reason
    log = service.read_log(job.id).data.decode()
    assert "building with uv" in log and "Failed to resolve installed pip version" not in log

    here_uri = _train_here(tmp_path_factory, "log_model.py", MODEL_SCRIPT)
    here_client, there_client = MlflowClient(here_uri), MlflowClient(tracking_uri)
    (here,) = here_client.search_logged_models(["0"])
    there_run = there_client.get_run(job.mlflow_run_id)
    (there,) = there_client.search_logged_models([there_run.info.experiment_id])
    root = tmp_path_factory.mktemp("models")
    here_files, there_files = _model_files(here, root / "here"), _model_files(there, root / "there")
    assert _pip_pins(there_files) == _pip_pins(here_files)
    assert _pip_pins(there_files) == {"conda.yaml": ["pip<=…"], "python_env.yaml": ["pip==…"]}
