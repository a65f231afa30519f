"""A job's run lands beside the runs a local run of the same script would make, in a real MLflow store.

The rule, in order: the experiment the script sets on the far side; else MLFLOW_EXPERIMENT_NAME as
set where the job is submitted (the far side sees the same); else MLflow's default experiment. The
run keeps the script's run name, else it takes the job's.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from jupyter_remote_compute.jobs.service import JobService, ServiceSettings
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.recording.tracking import USAGE_METRICS, TrackingSettings
from jupyter_remote_compute.workspace import Workspace

# Logs without naming an experiment or a run, and reports the experiment variable it was given.
UNNAMED = textwrap.dedent(
    """\
    import os
    import mlflow

    with mlflow.start_run():
        mlflow.log_param("seen_experiment", os.environ.get("MLFLOW_EXPERIMENT_NAME", "(unset)"))
        mlflow.log_metric("loss", 0.5)
    """
)

NAMED = textwrap.dedent(
    """\
    import mlflow

    mlflow.set_experiment("set-by-the-script")
    with mlflow.start_run(run_name="script-run"):
        mlflow.log_metric("loss", 0.25)
    """
)


@pytest.fixture
def run_job(workspace: Path, scratch_dir: Path, tracking_uri: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    services = []

    def run(script: str, experiment: str | None, name: str) -> MlflowClient:
        (workspace / "train.py").write_text(script)
        settings = ServiceSettings(
            poll_interval=0.2,
            scratch_dir=scratch_dir,
            tracking=TrackingSettings(tracking_uri=tracking_uri, experiment=experiment),
        )
        service = JobService(Workspace(workspace), settings)
        services.append(service)
        spec = JobSpec.from_json({"command": "python train.py", "send": ["train.py"], "name": name})
        job = service.wait(service.submit(spec).job.id, timeout=120)
        assert job.state == "succeeded", job.reason
        return MlflowClient(tracking_uri).get_run(job.mlflow_run_id)

    yield run
    for service in services:
        service.close()


def _local_run(tracking_uri: str, experiment: str | None, monkeypatch: pytest.MonkeyPatch) -> str:
    """A run of the same kind made here, as the user would: the one the job's run must sit beside."""
    # set_experiment exports MLFLOW_EXPERIMENT_ID to this process: undone when the test ends.
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "")
    mlflow.set_tracking_uri(tracking_uri)
    if experiment:
        mlflow.set_experiment(experiment)
    else:
        mlflow.set_experiment(experiment_id="0")
    with mlflow.start_run() as run:
        mlflow.log_metric("loss", 0.75)
    return run.info.experiment_id


def test_the_experiment_the_script_sets_wins(run_job, tracking_uri: str) -> None:
    run = run_job(NAMED, "set-here", "job-name")
    client = MlflowClient(tracking_uri)
    assert client.get_experiment(run.info.experiment_id).name == "set-by-the-script"
    assert run.info.run_name == "script-run"  # the script named its run
    assert run.data.metrics["loss"] == 0.25
    assert client.get_experiment_by_name("remote-compute") is None


def test_mlflow_experiment_name_set_here_reaches_the_far_side_and_the_run(
    run_job, tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_job(UNNAMED, "team-runs", "nightly")
    assert run.data.params["seen_experiment"] == "team-runs"  # the script saw the same variable
    assert MlflowClient(tracking_uri).get_experiment(run.info.experiment_id).name == "team-runs"
    assert run.info.run_name == "nightly"  # MLflow made a name up there: the job's name is used
    assert _local_run(tracking_uri, "team-runs", monkeypatch) == run.info.experiment_id
    # Its usage figures, as metrics.
    assert set(USAGE_METRICS) <= set(run.data.metrics)
    assert run.data.metrics["remote_compute.wall_s"] > 0
    assert run.data.metrics["remote_compute.bytes_sent"] == len(UNNAMED.encode())


def test_with_nothing_set_the_run_goes_to_mlflows_default_experiment(
    run_job, tracking_uri: str, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    run = run_job(UNNAMED, None, "plain")
    assert run.info.experiment_id == "0"
    assert run.data.params["seen_experiment"] == "(unset)"
    assert run.info.run_name == "plain"
    assert _local_run(tracking_uri, None, monkeypatch) == "0"
    # The store was made here: its default experiment keeps artifacts in the workspace, not the cwd.
    assert (
        MlflowClient(tracking_uri)
        .get_experiment("0")
        .artifact_location.startswith((workspace / "mlartifacts").as_uri())
    )
    assert [e.name for e in MlflowClient(tracking_uri).search_experiments()] == ["Default"]
