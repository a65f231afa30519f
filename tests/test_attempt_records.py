"""An attempt's to-do that no recorder took before the job's next attempt ended is carried into the next
to-do, never written over: the real recorder then puts both attempts' far MLflow stores into the job's
one run, in order, and removes both attempts' folders."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import job_runs
from mlflow.tracking import MlflowClient
from waiting import wait_for

from jupyter_remote_compute.jobs import recording
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.recording import recorder
from jupyter_remote_compute.recording.tracking import JobRecord


def far_store(folder: Path, steps: range, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A job's own MLflow file store, as its far side leaves it: a param and a loss per step."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = folder / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    run_id = client.create_run("0").info.run_id
    client.log_param(run_id, "lr", "0.1")
    for step in steps:
        client.log_metric(run_id, "loss", 1.0 / (step + 1), step=step)
    client.set_terminated(run_id)
    return store


def test_an_attempt_not_yet_recorded_goes_into_the_run_with_the_next(
    workspace, make_service, tracking_uri, tmp_path, monkeypatch
):
    service = make_service(workspace)
    gate = tmp_path / "go"
    spec = JobSpec.from_json({"command": f"while [ ! -e {gate} ]; do sleep 0.05; done", "retry": 1})
    job = service.submit(spec).job  # a job the recorder finds in the state file; its own end comes later
    wait_for(lambda: service.advance(job.id).state == "running", 60, "the job to run")
    attempts = ({"machine": "box", "end": "lost"}, {"machine": "box2", "end": "succeeded"})
    folders = []
    for number, (steps, ends) in enumerate(((range(0, 4), False), (range(3, 6), True)), 1):
        folder = service.workspace.job_dir(job.id) / f"attempt-{number}"
        folders.append(folder)
        record = JobRecord(
            job_id=job.id, key=job.key, name="train", machine=attempts[number - 1]["machine"], engine="ssh",
            state="succeeded", reason=None, command="python train.py", started=None, ended=1.0e9 + number,
            log_path=None, outputs={}, inputs_manifest=None, far_store=far_store(folder, steps, monkeypatch),
            attempt=number, ends=ends, attempts=attempts[:number],
        )  # fmt: skip
        recorder.queue(service.workspace, record, cleanup=folder)  # the first is never asked for

    run_id, problem = recording.record_now(service.ctx, job.id, [])
    assert problem is None
    (run,) = job_runs(tracking_uri, job.id)
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1"}
    history = MlflowClient(tracking_uri).get_metric_history(run_id, "loss")
    assert [m.step for m in history] == [0, 1, 2, 3, 4, 5]
    tags = run.data.tags
    assert (tags["remote_compute.attempts"], tags["remote_compute.attempt.1.end"]) == ("2", "lost")
    assert not any(folder.exists() for folder in folders)
    gate.touch()
    service.wait(job.id, timeout=60)
