"""What MLflow 3 keeps beside a run comes back with a job: registry versions (once, also across a
replay cut short), the far side's system metrics, what cannot be carried, the outputs' digests.

Real parts throughout: jobs on the built-in machine, MLflow's own file store on its far side, a real
sqlite store here, read back with MLflow's own client.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from jupyter_remote_compute.jobs.service import JobService
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.recording import replay as mlflow_replay
from jupyter_remote_compute.recording import tracking
from jupyter_remote_compute.recording.tracking import JobRecord, TrackingSettings

REGISTERED = "rf-parity"
REGISTERING_SCRIPT = textwrap.dedent(
    f"""\
    import mlflow
    from sklearn.datasets import load_diabetes
    from sklearn.ensemble import RandomForestRegressor

    mlflow.sklearn.autolog(registered_model_name="{REGISTERED}")
    X, y = load_diabetes(return_X_y=True, as_frame=True)
    with mlflow.start_run():
        RandomForestRegressor(n_estimators=5, max_depth=3, random_state=0).fit(X, y)
    mlflow.MlflowClient().set_registered_model_alias("{REGISTERED}", "champion", "1")
    """
)

# Waits on its own run until MLflow's monitor has logged a few samples (a condition, with a deadline).
SYSTEM_METRICS_SCRIPT = textwrap.dedent(
    """\
    import os
    import time
    import mlflow

    # Until three samples are in, or the window the test gives: ten sampling periods where none is
    # expected (one would be logged in the first), a minute where they are.
    with mlflow.start_run() as run:
        mlflow.log_param("kind", "system")
        client, deadline = mlflow.MlflowClient(), time.monotonic() + float(os.environ["SAMPLES_WINDOW"])
        while time.monotonic() < deadline:
            if len(client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")) >= 3:
                break
            time.sleep(0.05)
    """
)

TRACING_SCRIPT = textwrap.dedent(
    """\
    import mlflow

    @mlflow.trace
    def answer(question):
        return 42

    with mlflow.start_run():
        mlflow.log_param("traced", "yes")
        answer("why")
    with open("answer.txt", "w") as f:
        f.write("42\\n")
    """
)


def _run_job(service: JobService, root: Path, script: str, **spec: Any) -> Any:
    (root / "job.py").write_text(script)
    job_spec = {"machine": "local", "command": "python job.py", "send": ["job.py"], **spec}
    job = service.wait(service.submit(JobSpec.from_json(job_spec)).job.id, timeout=300)
    # A script's MLflow errors are in its output: the log's tail says why, where the reason has one line
    assert job.state == "succeeded", f"{job.reason}\n{service.read_log(job.id).data[-4000:].decode(errors='replace')}"
    assert job.mlflow_run_id, job.reason
    return job


def _far_store(scratch_dir: Path, job_id: str) -> Path:
    """The job's own MLflow file store where its machine (the built-in one) keeps it."""
    found = [p for p in scratch_dir.rglob("mlruns") if job_id in str(p)]
    assert found, f"no far store of {job_id} under {scratch_dir}"
    return found[0]


def _versions(client: MlflowClient) -> list[Any]:
    return sorted(client.search_model_versions(f"name = '{REGISTERED}'"), key=lambda v: int(v.version))


def test_a_registered_model_is_registered_here_once_with_its_alias(
    make_service: Callable[..., JobService], quickstart: Path, tracking_uri: str
) -> None:
    job = _run_job(make_service(quickstart), quickstart, REGISTERING_SCRIPT)
    assert_registered_once_with_its_alias(tracking_uri, job.mlflow_run_id)


def assert_registered_once_with_its_alias(tracking_uri: str, run_id: str) -> None:
    """REGISTERING_SCRIPT's model, trained as the job whose run is ``run_id``, is in the registry here once,
    its alias on that version, and loads from the registry as a deployment would load it."""
    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    (model,) = client.search_logged_models([run.info.experiment_id])
    (version,) = _versions(client)
    assert version.source == f"models:/{model.model_id}" and version.run_id == run.info.run_id
    assert client.get_model_version_by_alias(REGISTERED, "champion").version == version.version
    # The registry's model loads here, as a deployment reading it would.
    mlflow.set_tracking_uri(tracking_uri)
    try:
        assert mlflow.pyfunc.load_model(f"models:/{REGISTERED}/1").metadata.model_id == model.model_id
    finally:
        mlflow.set_tracking_uri(None)


class Cut(BaseException):
    """Where the recording process stops dead (as a kill would: nothing after it runs, nothing catches it)."""


@pytest.mark.parametrize("cut_at", ["_upload_model_artifacts", "_not_replayed"])
def test_a_replay_cut_short_and_run_again_makes_one_model_and_one_version(
    make_service: Callable[..., JobService],
    quickstart: Path,
    tracking_uri: str,
    scratch_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cut_at: str,
) -> None:
    """Cut while the model's files go up (it exists, not READY), or after its version is registered
    (the run not yet marked replayed): the next recorder finishes it, without a second of either."""
    job = _run_job(make_service(quickstart), quickstart, REGISTERING_SCRIPT)
    client = MlflowClient(tracking_uri)
    # The same far store recorded as another job's, by a recorder that is cut short, then by the next.
    record = JobRecord(
        job_id="replayed-after-a-crash", key="k", name="again", machine="local", engine="local",
        state="succeeded", reason=None, command="python job.py", started=None, ended=job_ended(job),
        log_path=None, outputs={}, inputs_manifest=None, far_store=_far_store(scratch_dir, job.id),
    )  # fmt: skip
    settings = TrackingSettings(tracking_uri=tracking_uri, experiment="tests")
    original = getattr(mlflow_replay, cut_at)

    def cut(*args: Any, **kwargs: Any) -> Any:
        original(*args, **kwargs)
        raise Cut

    monkeypatch.setattr(mlflow_replay, cut_at, cut)
    with pytest.raises(Cut):
        tracking.record_job(quickstart, settings, record)
    monkeypatch.setattr(mlflow_replay, cut_at, original)
    run_id = tracking.record_job(quickstart, settings, dataclasses.replace(record))

    run = client.get_run(run_id)
    models = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'")
    assert [(m.name, m.status.name) for m in models] == [("model", "READY")]
    versions = _versions(client)
    assert [v.run_id for v in versions] == [job.mlflow_run_id, run_id]  # one per job
    assert versions[1].source == f"models:/{models[0].model_id}"
    mlflow.set_tracking_uri(tracking_uri)
    try:
        loaded = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    finally:
        mlflow.set_tracking_uri(None)
    assert loaded.metadata.run_id == run_id and loaded.metadata.model_id == models[0].model_id


def job_ended(job: Any) -> float:
    from jupyter_remote_compute.jobs.job import parse_time

    return parse_time(job.ended)


SYSTEM_ENV = {
    "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "true",
    "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2",
    "MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING": "1",
}


@pytest.mark.parametrize("asks", [True, False], ids=["asks", "does-not-ask"])
def test_system_metrics_come_back_with_their_timestamps_when_the_job_asks(
    make_service: Callable[..., JobService], quickstart: Path, tracking_uri: str, asks: bool
) -> None:
    env = SYSTEM_ENV if asks else {k: v for k, v in SYSTEM_ENV.items() if k != "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"}
    env = {**env, "SAMPLES_WINDOW": "60" if asks else "2"}
    job = _run_job(make_service(quickstart), quickstart, SYSTEM_METRICS_SCRIPT, env=env)
    client = MlflowClient(tracking_uri)
    run = client.get_run(job.mlflow_run_id)
    system = {k for k in run.data.metrics if k.startswith("system/")}
    if not asks:
        assert system == set()
        return
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= system
    cpu = client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert len({m.timestamp for m in cpu}) >= 3
    assert all(run.info.start_time <= m.timestamp <= run.info.end_time for m in cpu)


def test_what_cannot_be_carried_is_said_and_every_output_has_its_digest(
    make_service: Callable[..., JobService], quickstart: Path, tracking_uri: str
) -> None:
    job = _run_job(make_service(quickstart), quickstart, TRACING_SCRIPT, bring_back=["answer.txt"])
    client = MlflowClient(tracking_uri)
    run = client.get_run(job.mlflow_run_id)
    assert run.data.params == {"traced": "yes"}
    assert json.loads(run.data.tags["remote_compute.not_replayed"]) == ["1 trace"]
    log = Path(client.download_artifacts(run.info.run_id, "remote_compute/log")).read_text()
    assert log.splitlines()[-1] == "[remote-compute] not replayed into the local MLflow run: 1 trace"
    listing = json.loads(Path(client.download_artifacts(run.info.run_id, "remote_compute/outputs.json")).read_text())
    digest = hashlib.sha256((quickstart / "answer.txt").read_bytes()).hexdigest()
    assert listing == {"answer.txt": {"sha256": digest, "size": 3}}
    assert job.outputs["answer.txt"]["sha256"] == digest


def test_an_output_changed_or_removed_before_its_run_is_recorded_is_listed_as_it_landed_and_not_copied(
    workspace: Path, tracking_uri: str
) -> None:
    """Once landed, an output is the person's: they may open, rewrite or delete it before the recorder
    runs. The run lists each output as it landed and copies only those still as they landed."""
    kept, rewritten = workspace / "kept.txt", workspace / "out" / "rewritten.txt"
    rewritten.parent.mkdir()
    kept.write_text("kept\n")
    rewritten.write_text("the person's own now\n")
    landed = {"kept.txt": 5, "gone.txt": 7, "out/rewritten.txt": 9}
    record = JobRecord(
        job_id="j-landed", key="k", name="landed", machine="local", engine="local", state="succeeded",
        reason=None, command="python train.py", started=None, ended=time.time(), log_path=None,
        outputs={rel: workspace / rel for rel in landed}, inputs_manifest=None, far_store=None,
        digests={rel: f"{i}" * 64 for i, rel in enumerate(landed)}, sizes=landed,
    )  # fmt: skip
    run_id = tracking.record_job(workspace, TrackingSettings(tracking_uri, "tests"), record)
    client = MlflowClient(tracking_uri)
    listing = json.loads(Path(client.download_artifacts(run_id, "remote_compute/outputs.json")).read_text())
    assert listing == {rel: {"sha256": record.digests[rel], "size": size} for rel, size in landed.items()}
    assert [a.path for a in client.list_artifacts(run_id, "outputs")] == ["outputs/kept.txt"]
    tags = client.get_run(run_id).data.tags
    assert json.loads(tags["remote_compute.outputs_changed"]) == ["gone.txt", "out/rewritten.txt"]
    assert "remote_compute.outputs_not_copied" not in tags
    # A to-do written before sizes were kept reads, and sizes the files as they are now: a gone one is named.
    raw = {**record.to_json(), "job_id": "j-older", "key": "k-older"}
    del raw["sizes"]
    older = JobRecord.from_json(raw)
    assert older.sizes == {}
    run_id = tracking.record_job(workspace, TrackingSettings(tracking_uri, "tests"), older)
    assert json.loads(client.get_run(run_id).data.tags["remote_compute.outputs_changed"]) == ["gone.txt"]
    assert sorted(a.path for a in client.list_artifacts(run_id, "outputs")) == ["outputs/kept.txt", "outputs/out"]


def test_a_model_param_autolog_read_half_written_in_the_far_store_comes_back_whole(
    quickstart: Path, tracking_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sklearn autolog logs the estimator's params from a thread while it trains, and the model logged
    after takes the run's params as the store reads them then: a file store (the far side's) makes a
    param's file before filling it, so the model may hold a param empty. Made here as MLflow leaves it."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    far_store = tmp_path / "mlruns"
    far = MlflowClient(far_store.as_uri())
    run = far.create_run("0")
    for key, value in (("criterion", "squared_error"), ("n_estimators", "10"), ("note", "")):
        far.log_param(run.info.run_id, key, value)
    torn = {"criterion": "", "n_estimators": "10", "note": ""}
    model = far.create_logged_model("0", name="model", source_run_id=run.info.run_id, params=torn)
    far.finalize_logged_model(model.model_id, "READY")
    far.set_terminated(run.info.run_id)
    assert far.get_logged_model(model.model_id).params == torn

    record = JobRecord(
        job_id="torn-param", key="k", name="torn", machine="local", engine="local", state="succeeded",
        reason=None, command="python job.py", started=None, ended=time.time(), log_path=None, outputs={},
        inputs_manifest=None, far_store=far_store,
    )  # fmt: skip
    run_id = tracking.record_job(quickstart, TrackingSettings(tracking_uri=tracking_uri, experiment="tests"), record)
    client = MlflowClient(tracking_uri)
    (replayed,) = client.search_logged_models(
        [client.get_run(run_id).info.experiment_id], filter_string=f"source_run_id = '{run_id}'"
    )
    # The value the run holds; a param empty on the run too stays empty.
    assert replayed.params == {"criterion": "squared_error", "n_estimators": "10", "note": ""}
