"""The pipeline step "Train on a Remote Machine": its description, and its executor run as pipeline runs do.

Pipeline runs are separate processes, so the executor runs in real
subprocesses (``python -c``) wherever two runs meet; the failure reasons are
driven in-process against the same state file.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
from importlib.metadata import entry_points
from pathlib import Path
from pkgutil import resolve_name
from typing import Any

import jsonschema
import pytest
import sshd_fixture
from mlflow.tracking import MlflowClient
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings, NotTrained
from jupyter_remote_compute.steps import TRAIN_ON_REMOTE_MACHINE, describe_steps, run_step

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pipeline_step.py"

PIPELINE_RUN = """
import json, sys
from jupyter_remote_compute.errors import NotTrained
from jupyter_remote_compute.steps import run_step

def on_log(data):
    for line in data.decode().splitlines():
        print("log:", line, flush=True)

try:
    result = run_step(json.loads(sys.argv[1]), {"workspace": sys.argv[2], "on_log": on_log})
except NotTrained as e:
    print("not-trained:", json.dumps({"job_id": e.job_id, "state": e.state, "reason": e.reason}), flush=True)
else:
    print("result:", json.dumps(result.to_json()), flush=True)
print("mlflow imported:", "mlflow" in sys.modules, flush=True)
"""


class PipelineRun:
    """One pipeline run in its own process; its lines are read as they come."""

    def __init__(self, settings: dict[str, Any], workspace: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PIPELINE_RUN, json.dumps(settings), str(workspace)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _drain(self) -> None:
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                return
            if line is not None:
                self.lines.append(line)

    def saw(self, text: str) -> bool:
        self._drain()
        return any(text in line for line in self.lines)

    def outcome(self, timeout: float = 120) -> tuple[str, dict[str, Any]]:
        self.proc.wait(timeout=timeout)
        wait_for(lambda: self.saw("result:") or self.saw("not-trained:"), timeout=10, message="the run's outcome")
        for line in self.lines:
            for kind in ("result:", "not-trained:"):
                if line.startswith(kind):
                    return kind[:-1], json.loads(line[len(kind) :])
        raise AssertionError("\n".join(self.lines))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def pipeline_env(scratch_dir: Path, tracking_uri: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a pipeline run: this test's scratch dir, MLflow store and keyring."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)  # for runs in this process too
    return {**os.environ, "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch_dir), "MLFLOW_TRACKING_URI": tracking_uri}


def _blocked_until(go: Path, then: str = "true") -> str:
    """A command that says it is up, then waits for the test to create ``go``."""
    return f"echo up; while [ ! -f {go} ]; do sleep 0.05; done; {then}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the description ------------------------------------------------------------
def test_every_step_is_named_in_title_case_as_jupyterlab_names_commands_and_launcher_items() -> None:
    """The palette of the canvas lists them side by side: one style, JupyterLab's (articles and short
    prepositions lower case). A saved pipeline names a step by its id, so a label may change."""
    small = {"a", "an", "the", "and", "or", "of", "on", "in", "to", "for", "with", "at", "by"}
    for step in describe_steps():
        words = step["label"].split()
        wrong = [w for i, w in enumerate(words) if w[0].islower() and (i == 0 or w not in small)]
        assert not wrong, f"{step['id']}: {step['label']!r} is not in title case ({wrong})"
    assert [s["label"] for s in describe_steps()] == [
        "Train on a Remote Machine",
        "Run a Notebook on a Remote Machine",
    ]


def test_the_entry_point_names_the_step_with_a_valid_settings_schema() -> None:
    [entry_point] = [ep for ep in entry_points(group="punica.mlops.steps") if ep.name == "train-on-remote-machine"]
    step = entry_point.load()
    assert step is TRAIN_ON_REMOTE_MACHINE
    assert step["id"] == "train-on-remote-machine" and step["label"] == "Train on a Remote Machine"
    assert step["icon"].startswith("<svg")
    assert resolve_name(step["executor"]) is run_step
    jsonschema.Draft202012Validator.check_schema(step["settings"])
    assert set(step["settings"]["properties"]) >= {"machine", "command", "send", "bring_back", "env", "timeout", "wait"}
    valid = {"machine": "local", "command": ["python", "train.py"], "env": {"TOKEN": "secret:hf"}, "wait": "10m"}
    jsonschema.validate(valid, step["settings"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"command": "x", "wait": "soon"}, step["settings"])


def test_describe_steps_offers_the_configured_machines() -> None:
    steps = describe_steps(["local", "gpu-box"])
    assert [s["id"] for s in steps] == ["train-on-remote-machine", "run-notebook-on-remote-machine"]
    for step in steps:
        assert step["settings"]["properties"]["machine"]["enum"] == ["local", "gpu-box"]
    for other in describe_steps(["gpu-box"]):
        assert "default" not in other["settings"]["properties"]["machine"]  # a default outside the choices
    for plain in describe_steps():
        assert "enum" not in plain["settings"]["properties"]["machine"]
    assert "enum" not in TRAIN_ON_REMOTE_MACHINE["settings"]["properties"]["machine"]  # never changed in place


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"command": ""}, "command"),
        ({"command": "true", "wait": "soon"}, "wait"),
        ({"command": "true", "timeout": "-1"}, "timeout"),
        ({"command": "true", "send": ["../elsewhere"]}, "send[0]"),
        ({"command": "true", "env": {"1ABC": "x"}}, "env.1ABC"),
        ({"command": "true", "colour": "red"}, "colour"),
    ],
)
def test_bad_settings_name_the_field(settings: dict[str, Any], field: str, quickstart: Path, pipeline_env) -> None:
    with pytest.raises(InvalidSettings) as raised:
        run_step(settings, {"workspace": str(quickstart)})
    assert raised.value.field == field and raised.value.message.startswith(field)


# -- two pipeline runs ------------------------------------------------------------
def test_two_pipeline_runs_with_the_same_settings_share_one_job(quickstart: Path, pipeline_env, make_service) -> None:
    go = quickstart.parent / "go"
    settings = {"command": _blocked_until(go, "echo trained > model.txt"), "bring_back": ["model.txt"]}
    runs = [PipelineRun(settings, quickstart, pipeline_env) for _ in range(2)]
    try:
        # Both runs are following the job once each has streamed its log.
        for run in runs:
            wait_for(lambda run=run: run.saw("log: up"), timeout=120, message="the run to follow the job")
        go.touch()
        outcomes = [run.outcome() for run in runs]
    finally:
        for run in runs:
            run.kill()
    assert [kind for kind, _ in outcomes] == ["result", "result"], outcomes
    [job] = make_service(quickstart).list_jobs()
    assert {result["job_id"] for _, result in outcomes} == {job.id}
    assert sorted(result["attached"] for _, result in outcomes) == [False, True]
    for _, result in outcomes:
        assert result["outputs"]["model.txt"]["sha256"] == _sha256(quickstart / "model.txt")


def test_a_run_whose_wait_ends_is_not_trained_and_the_next_run_picks_the_job_up(
    quickstart: Path, pipeline_env, make_service
) -> None:
    go = quickstart.parent / "go"
    settings = {"command": _blocked_until(go, "echo trained > model.txt"), "bring_back": ["model.txt"], "wait": "2s"}
    first = PipelineRun(settings, quickstart, pipeline_env)
    try:
        kind, error = first.outcome()
    finally:
        first.kill()
    assert kind == "not-trained" and error["state"] == "running"
    service = make_service(quickstart)
    # The run has ended; the job has not.
    assert service.get(error["job_id"]).state == "running"
    assert not (quickstart / "model.txt").exists()

    go.touch()
    second = PipelineRun({**settings, "wait": "2m"}, quickstart, pipeline_env)
    try:
        kind, result = second.outcome()
    finally:
        second.kill()
    assert kind == "result" and result["job_id"] == error["job_id"] and result["attached"]
    assert [j.id for j in service.list_jobs()] == [error["job_id"]]


# -- outcomes -------------------------------------------------------------------------
def test_outputs_come_back_verified_with_their_mlflow_run(
    quickstart: Path, pipeline_env, make_service, tracking_uri: str
) -> None:
    settings = {
        "command": "python train.py",
        "send": ["train.py", "data/*.csv"],
        "bring_back": ["model.pkl", "metrics.json"],
    }
    run = PipelineRun(settings, quickstart, pipeline_env)
    try:
        kind, result = run.outcome()
    finally:
        run.kill()
    assert kind == "result" and result["state"] == "succeeded" and not result["attached"]
    for name in ("model.pkl", "metrics.json"):
        assert result["outputs"][name]["sha256"] == _sha256(quickstart / name)
        assert result["outputs"][name]["path"] == str(quickstart / name)
        assert result["outputs"][name]["size"] == (quickstart / name).stat().st_size
    # MLflow stayed out of the step's process; the detached recorder made exactly one run for the job,
    # before the step returned (done means recorded).
    assert run.saw("mlflow imported: False")
    run_id = make_service(quickstart).get(result["job_id"]).mlflow_run_id
    assert run_id and result["mlflow_run_id"] == run_id
    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, f"tags.`remote_compute.job_id` = '{result['job_id']}'")
    assert [r.info.run_id for r in runs] == [run_id]
    # Its artifacts are in the workspace, not wherever the step's process happened to be started.
    assert runs[0].info.artifact_uri.startswith(quickstart.as_uri()), runs[0].info.artifact_uri
    # Taken as it was by the next run: the result now carries the run id.
    assert run_step(settings, {"workspace": str(quickstart)}).mlflow_run_id == run_id


def recorded_run(service: Any, job_id: str) -> str:
    """The job's MLflow run id once the detached recorder has written it."""
    return wait_for(lambda: service.get(job_id).mlflow_run_id, timeout=120, message="the MLflow run to be recorded")


def test_a_trained_job_is_reused_until_its_outputs_change(quickstart: Path, pipeline_env, make_service) -> None:
    settings = {"command": "echo trained > model.txt", "bring_back": ["model.txt"]}
    first = run_step(settings, {"workspace": str(quickstart)})
    again = run_step(settings, {"workspace": str(quickstart)})
    assert again.job_id == first.job_id and again.attached
    (quickstart / "model.txt").write_text("edited by hand\n")
    third = run_step(settings, {"workspace": str(quickstart)})
    assert third.job_id != first.job_id and not third.attached
    assert len(make_service(quickstart).list_jobs()) == 2


def test_a_failing_command_is_not_trained_and_lands_nothing(quickstart: Path, pipeline_env) -> None:
    settings = {"command": "echo half > model.txt; echo boom >&2; exit 3", "bring_back": ["model.txt"]}
    with pytest.raises(NotTrained) as raised:
        run_step(settings, {"workspace": str(quickstart)})
    assert raised.value.state == "failed"
    assert raised.value.reason.startswith("exit code 3") and "boom" in raised.value.reason
    assert not (quickstart / "model.txt").exists()  # outputs only after a verified success


def test_missing_outputs_are_not_trained(quickstart: Path, pipeline_env) -> None:
    settings = {"command": "echo only-this > a.txt", "bring_back": ["a.txt", "model.pkl"]}
    with pytest.raises(NotTrained) as raised:
        run_step(settings, {"workspace": str(quickstart)})
    assert raised.value.state == "failed" and raised.value.reason == "missing outputs: model.pkl"
    assert not (quickstart / "a.txt").exists()


def test_a_cancelled_job_is_not_trained(quickstart: Path, pipeline_env, make_service) -> None:
    settings = {"command": "echo up; sleep 300", "bring_back": ["model.txt"]}
    raised: list[BaseException] = []

    def pipeline_run() -> None:
        try:
            run_step(settings, {"workspace": str(quickstart)})
        except BaseException as e:
            raised.append(e)

    thread = threading.Thread(target=pipeline_run)
    thread.start()
    service = make_service(quickstart)
    [job] = wait_for(lambda: [j for j in service.list_jobs() if j.state == "running"], message="the job to run")
    service.cancel(job.id, by="a test")
    thread.join(timeout=120)
    assert not thread.is_alive()
    [error] = raised
    assert isinstance(error, NotTrained) and error.state == "cancelled" and error.job_id == job.id
    assert error.reason == "cancelled by a test"


# -- the runnable example -------------------------------------------------------------
def test_the_example_discovers_the_step_and_trains(quickstart: Path, pipeline_env) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(quickstart)],
        env=pipeline_env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert '"bring_back"' in proc.stdout and "trained on 40 rows" in proc.stdout
    result = json.loads(proc.stdout[proc.stdout.index("result:") + len("result:") :])
    assert result["state"] == "succeeded"
    assert result["outputs"]["model.pkl"]["sha256"] == _sha256(quickstart / "model.pkl")


# -- the step on an SSH machine: a real sshd and ssh-agent on loopback ---------------------------
sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env


def test_the_step_trains_on_an_ssh_machine_and_records_what_the_script_logged(
    quickstart: Path, pipeline_env, make_service, ssh_agent_env, tracking_uri: str
) -> None:
    make_service(quickstart).machines.add("box", "ssh", "127.0.0.1", ssh_agent_env.options())
    settings = {
        "machine": "box",
        "command": "python train.py",
        "send": ["train.py", "data/*.csv"],
        "bring_back": ["model.pkl", "metrics.json"],
    }
    result = run_step(settings, {"workspace": str(quickstart)})
    assert result.state == "succeeded"
    assert result.outputs["model.pkl"]["sha256"] == _sha256(quickstart / "model.pkl")
    run_id = recorded_run(make_service(quickstart), result.job_id)
    run = MlflowClient(tracking_uri).get_run(run_id)
    assert run.data.params["rows"] == "40" and run.data.tags["remote_compute.engine"] == "ssh"
    # Recorded by a detached process: its artifacts are in the workspace, not in this process's directory.
    assert run.info.artifact_uri.startswith(quickstart.as_uri()), run.info.artifact_uri
    assert len(MlflowClient(tracking_uri).get_metric_history(run_id, "residual")) == 40
