"""A script that registers its model only where the store is not a folder registers it, as it would here.

MLflow's own ElasticNet example logs ``registered_model_name`` only when the tracking URI's scheme is not
``file``. The job's store is MLflow's folder store on every machine; where the user's store is not a folder
(the product's default is sqlite) the job sees it as ``remote-compute:///<job folder>/mlruns``, served by
MLflow's plugin mechanism (``engines/farside/mlflow_store.py``), so the example registers there and the
version comes home. Where the user's store is a folder the job sees ``file://`` as before.

Real parts: jobs on the built-in machine, an ssh machine (sshd on loopback, the far side's own MLflow) and
a Slurm cluster; a real sqlite store (or a folder store) here, read with MLflow's own client.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import mlflow
import pytest
import slurm_fixture
import sshd_fixture
import test_mlflow_every_kind as every_kind
from conftest import job_runs
from mlflow.tracking import MlflowClient
from test_mlflow_every_kind import _sized, _train_here

from jupyter_remote_compute.engines import farside
from jupyter_remote_compute.engines.launcher import JOB_ENV_SH, STORE_PLUGIN_DIR
from jupyter_remote_compute.jobs.service import JobService, ServiceSettings
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.recording.tracking import TrackingSettings, is_folder_store
from jupyter_remote_compute.schema.spec import STORE_SCHEME_VAR
from jupyter_remote_compute.workspace import Workspace

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
slurm_bed = slurm_fixture.slurm_bed
# The machines the MLflow tests of every kind run on.
local_machine, ssh_machine, slurm_machine = every_kind.local_machine, every_kind.ssh_machine, every_kind.slurm_machine

REGISTERED = "ElasticnetWineModel"

# MLflow's examples/sklearn_elasticnet_wine/train.py as people copy it, on a dataset scikit-learn ships (the
# example downloads the wine-quality CSV; nothing here reaches out), the model saved with cloudpickle. It
# also says what it saw: the scheme, the PYTHONPATH, and a module found on the PYTHONPATH the job's env gave.
ELASTICNET_SCRIPT = textwrap.dedent(
    f"""\
    import os
    import sys
    import warnings
    from urllib.parse import urlparse

    import numpy as np
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import ElasticNet
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score
    from sklearn.model_selection import train_test_split

    import mlflow
    import mlflow.sklearn
    from mlflow.models import infer_signature


    # skops, MLflow's default for scikit-learn, is not in the far side's set (far_python.py)
    SAVED_AS = {{"serialization_format": "cloudpickle"}}


    def eval_metrics(actual, pred):
        rmse = np.sqrt(mean_squared_error(actual, pred))
        mae = mean_absolute_error(actual, pred)
        r2 = r2_score(actual, pred)
        return rmse, mae, r2


    if __name__ == "__main__":
        warnings.filterwarnings("ignore")
        np.random.seed(40)
        X, y = load_diabetes(return_X_y=True, as_frame=True)
        train_x, test_x, train_y, test_y = train_test_split(X, y, random_state=0)
        alpha = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
        l1_ratio = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5

        with mlflow.start_run():
            lr = ElasticNet(alpha=alpha, l1_ratio=l1_ratio, random_state=42)
            lr.fit(train_x, train_y)
            predicted_qualities = lr.predict(test_x)
            (rmse, mae, r2) = eval_metrics(test_y, predicted_qualities)
            print(f"Elasticnet model (alpha={{alpha:f}}, l1_ratio={{l1_ratio:f}}):")
            print(f"  RMSE: {{rmse}}")
            mlflow.log_param("alpha", alpha)
            mlflow.log_param("l1_ratio", l1_ratio)
            mlflow.log_metric("rmse", rmse)
            mlflow.log_metric("r2", r2)
            mlflow.log_metric("mae", mae)

            predictions = lr.predict(train_x)
            signature = infer_signature(train_x, predictions)

            tracking_url_type_store = urlparse(mlflow.get_tracking_uri()).scheme
            print(f"tracking scheme: {{tracking_url_type_store}}", flush=True)
            print(f"pythonpath: {{os.environ.get('PYTHONPATH', '')}}", flush=True)
            if os.environ.get("EXPECT_HELPER"):
                import helper

                print(f"helper: {{helper.WORD}}", flush=True)

            # Model registry does not work with file store
            if tracking_url_type_store != "file":
                mlflow.sklearn.log_model(
                    lr, name="model", registered_model_name="{REGISTERED}", signature=signature, **SAVED_AS
                )
            else:
                mlflow.sklearn.log_model(lr, name="model", signature=signature, **SAVED_AS)
    """
)


def _seen(log: str, what: str) -> str:
    found = re.findall(rf"^(?:\[.*?\] )?{what}: (.*)$", log, re.MULTILINE)
    assert found, f"the script did not say its {what}:\n{log[-3000:]}"
    return found[-1]


def _requirements(client: MlflowClient, model: Any, into: Path) -> str:
    folder = mlflow.artifacts.download_artifacts(artifact_uri=model.artifact_location, dst_path=str(into))
    return (Path(folder) / "requirements.txt").read_text()


# What a job's Python does with the store the launcher's environment gives it: a run and a registered
# version, through MLflow's fluent API and its client, as a script would.
STORE_PROGRAM = textwrap.dedent(
    """\
    import os
    import mlflow

    print("uri:", mlflow.get_tracking_uri())
    print("pythonpath:", os.environ["PYTHONPATH"])
    print("flag:", os.environ.get("REMOTE_COMPUTE_STORE_SCHEME", "unset"))
    with mlflow.start_run() as run:
        mlflow.log_param("x", "1")
    client = mlflow.MlflowClient()
    client.create_registered_model("m")
    print("version:", client.create_model_version("m", f"runs:/{run.info.run_id}/model", run.info.run_id).version)
    print("run:", run.info.run_id)
    """
)


def test_the_launchers_environment_opens_the_jobs_folder_store_under_its_own_scheme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JOB_ENV_SH with the variable this side sets: MLflow there opens the folder store through the plugin,
    ahead of the PYTHONPATH the job had; what it writes is the folder store MLflow reads as ``file://``;
    a rank other than 0 keeps the scheme."""
    jobdir = tmp_path / "job"
    (jobdir / "work").mkdir(parents=True)
    (jobdir / "program.py").write_text(STORE_PROGRAM)
    env = {
        **os.environ,
        STORE_SCHEME_VAR: "remote-compute",
        "PYTHONPATH": "/elsewhere",
        "MLFLOW_TRACKING_URI": "sqlite:///nowhere.db",
        # The built-in machine's jobs inherit the server's environment: a registry set there is not the job's
        "MLFLOW_REGISTRY_URI": f"sqlite:///{tmp_path / 'elsewhere.db'}",
    }
    script = "jobdir=$1\n" + JOB_ENV_SH + f'exec {shlex.quote(sys.executable)} "$jobdir/program.py"\n'
    done = subprocess.run(["sh", "-c", script, "sh", str(jobdir)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert seen["uri"] == f"remote-compute://{jobdir}/mlruns"
    assert seen["pythonpath"] == f"{jobdir}/{STORE_PLUGIN_DIR}:/elsewhere"
    assert seen["flag"] == "unset" and seen["version"] == "1"
    # MLflow's own folder store, as a file:// URI opens it (what status.sh, manifest.sh and the replay read).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(f"file://{jobdir}/mlruns")
    assert client.get_run(seen["run"]).data.params == {"x": "1"}
    assert (jobdir / "mlruns" / "models" / "m" / "version-1").is_dir()
    assert not (tmp_path / "elsewhere.db").exists()

    # A rank other than 0 (rank.sh) records to a store of its own under the same scheme.
    (jobdir / "command.sh").write_text('echo "uri: $MLFLOW_TRACKING_URI"\n')
    ranked = {**env, "MLFLOW_TRACKING_URI": seen["uri"], "RANK": "1", "LOCAL_RANK": "0", "NODE_RANK": "0"}
    done = subprocess.run(
        ["sh", "-c", farside.script("rank"), "sh", str(jobdir), "plain"], env=ranked, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"uri: remote-compute://{jobdir}/ranks/1/mlruns"), done.stdout


def test_which_stores_are_folders() -> None:
    assert is_folder_store("file:///home/a/mlruns") and is_folder_store("/home/a/mlruns") and is_folder_store("mlruns")
    assert not is_folder_store("sqlite:////home/a/mlflow.db") and not is_folder_store("https://mlflow.example")
    assert not is_folder_store("databricks")


@pytest.mark.parametrize("kind", ["local", "ssh", "slurm"])
def test_the_elasticnet_example_registers_its_model_there_and_the_version_comes_home(
    kind: str,
    request: pytest.FixtureRequest,
    tracking_uri: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    service, name = request.getfixturevalue(f"{kind}_machine")
    root = service.workspace.root
    (root / "train.py").write_text(ELASTICNET_SCRIPT)
    (root / "lib").mkdir()
    (root / "lib" / "helper.py").write_text('WORD = "found on the PYTHONPATH the job gave"\n')
    spec = {
        "machine": name,
        "command": "python train.py",
        "send": ["train.py", "lib/helper.py"],
        # The job's own PYTHONPATH (relative to its work folder) stays, behind the store's plugin.
        "env": {"PYTHONPATH": "lib", "EXPECT_HELPER": "1"},
    }
    job = service.wait(service.submit(_sized(service, spec)).job.id, timeout=300)
    assert job.state == "succeeded", job.reason
    log = service.read_log(job.id).data.decode()
    assert _seen(log, "tracking scheme") == "remote-compute"
    assert _seen(log, "helper") == "found on the PYTHONPATH the job gave"
    path = _seen(log, "pythonpath").split(":")
    assert path[0].endswith("/" + STORE_PLUGIN_DIR) and path[1:] == ["lib"], path

    # The version registered there is a version of the same name here, made from the replayed run's model.
    client = MlflowClient(tracking_uri)
    (run,) = job_runs(tracking_uri, job.id)
    assert run.info.run_id == job.mlflow_run_id
    (version,) = client.search_model_versions(f"name = '{REGISTERED}'")
    assert version.run_id == run.info.run_id
    (model,) = client.search_logged_models([run.info.experiment_id])
    assert version.source == f"models:/{model.model_id}"
    assert client.get_registered_model(REGISTERED).name == REGISTERED

    # The plugin is nowhere in what the model says it needs: the files are those of a run made here.
    there = _requirements(client, model, tmp_path / "there")
    assert "remote" not in there.lower(), there
    if kind == "local":  # the same Python as here: the very same requirements
        here_uri = _train_here(tmp_path_factory, "train.py", ELASTICNET_SCRIPT)
        here_client = MlflowClient(here_uri)
        (here_model,) = here_client.search_logged_models(["0"])
        assert there == _requirements(here_client, here_model, tmp_path / "here-model")
        assert here_client.search_model_versions(f"name = '{REGISTERED}'"), "the example registers here too"


def test_a_folder_store_here_is_a_file_store_there(
    quickstart: Path, scratch_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the user's own store is a folder, the job sees ``file://`` exactly as before, and the example
    keeps its own choice: no registry."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tmp_path / "mlruns-here"
    uri = store.as_uri()
    settings = ServiceSettings(
        poll_interval=0.2, scratch_dir=scratch_dir, tracking=TrackingSettings(tracking_uri=uri, experiment="tests")
    )
    service = JobService(Workspace(quickstart), settings)
    try:
        (quickstart / "train.py").write_text(ELASTICNET_SCRIPT)
        command = 'echo "uri: $MLFLOW_TRACKING_URI" && python train.py'
        spec = {"machine": "local", "command": command, "send": ["train.py"]}
        job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=300)
        assert job.state == "succeeded", job.reason
        log = service.read_log(job.id).data.decode()
        assert _seen(log, "tracking scheme") == "file"
        assert re.fullmatch(r"file:///.+/mlruns", _seen(log, "uri"))
        assert STORE_PLUGIN_DIR not in _seen(log, "pythonpath")
        client = MlflowClient(uri)
        assert client.get_run(job.mlflow_run_id).data.params["alpha"] == "0.5"
        assert client.search_registered_models() == []
    finally:
        service.close()
