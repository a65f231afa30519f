"""Pipelines (``*.rcpipeline``) run on the built-in machine: order, reuse, failure, cancel, validation.

Real jobs through the real lifecycle on ``local`` (the job key decides reuse); the CLI in a real
subprocess where the file must be left as it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from waiting import wait_for

from jupyter_remote_compute.errors import ConfigFileError
from jupyter_remote_compute.pipelines import PipelineInvalid, dump_pipeline, parse_pipeline
from jupyter_remote_compute.pipelines.runner import PipelineRunner

PY = sys.executable
PREPARE = f"{PY} -c \"open('data.txt', 'w').write('42')\""
TRAIN = f"{PY} -c \"x = open('data.txt').read(); open('model.txt', 'w').write(x + '!')\""
# Touch the first path, then wait for the second (absolute paths: jobs run in folders of their own).
GATE = (
    "import pathlib, sys, time\n"
    "pathlib.Path(sys.argv[1]).touch()\n"
    "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.05)\n"
)


def node(node_id: str, settings: dict[str, Any], step: str = "train-on-remote-machine", x: int = 0) -> dict[str, Any]:
    return {"id": node_id, "step": step, "settings": settings, "position": {"x": x, "y": 0}}


def two_steps(prepare: str | list[str] = PREPARE, train: str = TRAIN) -> dict[str, Any]:
    return {
        "version": 1,
        "nodes": [
            node("prepare", {"machine": "local", "command": prepare, "bring_back": ["data.txt"]}),
            node("train", {"machine": "local", "command": train, "bring_back": ["model.txt"]}, x=200),
        ],
        "edges": [{"from": "prepare", "to": "train"}],
    }


def write(workspace: Path, document: dict[str, Any], name: str = "flow.rcpipeline") -> str:
    (workspace / name).write_text(json.dumps(document, indent=2))
    return name


@pytest.fixture
def runner(workspace: Path, make_service):  # type: ignore[no-untyped-def]
    runner = PipelineRunner(make_service(workspace))
    yield runner
    runner.close()


def run_here(runner: PipelineRunner, file: str):  # type: ignore[no-untyped-def]
    run, attached = runner.start(file, background=False)
    assert not attached
    return runner.drive(run.id)


def parent_of(runner: PipelineRunner, run) -> str:  # type: ignore[no-untyped-def]
    """The run's MLflow parent run, once its detached recorder has left its id for the run store."""
    return wait_for(lambda: runner.get(run.id).mlflow_run_id, timeout=120, message="the MLflow parent run")


def test_the_second_step_consumes_what_the_first_brings_back(workspace, runner, tracking_uri):
    run = run_here(runner, write(workspace, two_steps()))
    assert run.state == "succeeded", run.to_json()
    assert [n.state for n in run.nodes.values()] == ["succeeded", "succeeded"]
    assert (workspace / "model.txt").read_text() == "42!"
    train_job = runner.service.get(run.nodes["train"].job_id)
    # The edge made prepare's output one of train's inputs (so it is part of train's job key).
    assert "data.txt" in train_job.spec.send
    assert set(run.nodes["train"].outputs) == {"model.txt"}
    stored = json.loads((workspace / ".punica" / "pipelines" / f"{run.id}.json").read_text())
    assert stored["state"] == "succeeded" and stored["nodes"]["train"]["job_id"] == train_job.id
    # One MLflow parent run for the pipeline run, the nodes' job runs its children.
    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_of(runner, run))
    assert parent.data.tags["remote_compute.pipeline_run_id"] == run.id and parent.info.status == "FINISHED"
    for node_id in ("prepare", "train"):
        job = runner.service.get(run.nodes[node_id].job_id)
        assert client.get_run(job.mlflow_run_id).data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert parent.data.tags[f"remote_compute.node.{node_id}"] == f"succeeded run {job.mlflow_run_id}"


def test_running_it_again_reuses_both_unchanged_steps(workspace, runner, tracking_uri):
    file = write(workspace, two_steps())
    first = run_here(runner, file)
    first_parent = parent_of(runner, first)
    jobs_before = {j.id for j in runner.service.list_jobs()}
    second = run_here(runner, file)
    second_parent = parent_of(runner, second)
    assert second.state == "succeeded"
    for node_id in ("prepare", "train"):
        assert second.nodes[node_id].state == "reused"
        assert second.nodes[node_id].job_id == first.nodes[node_id].job_id
        assert "reused" in second.nodes[node_id].reason
    assert {j.id for j in runner.service.list_jobs()} == jobs_before  # no job was started
    # A reused node's run keeps the parent it had; the new parent names it.
    client = MlflowClient(tracking_uri)
    train_run = runner.service.get(first.nodes["train"].job_id).mlflow_run_id
    assert client.get_run(train_run).data.tags["mlflow.parentRunId"] == first_parent
    tags = client.get_run(second_parent).data.tags
    assert second_parent != first_parent and tags["remote_compute.node.train"] == f"reused run {train_run}"

    # A changed setting of the first step is new work: it runs, and train (same input content) is reused.
    changed = two_steps(prepare=PREPARE.replace("write('42')", "write('42' )"))
    third = run_here(runner, write(workspace, changed))
    assert (
        third.nodes["prepare"].state == "succeeded" and third.nodes["prepare"].job_id != first.nodes["prepare"].job_id
    )
    assert third.nodes["train"].state == "reused"


def test_a_failing_first_step_leaves_the_second_not_run_with_the_reason(workspace, runner):
    failing = f"{PY} -c \"import sys; print('no data today'); sys.exit(7)\""
    run = run_here(runner, write(workspace, two_steps(prepare=failing)))
    assert run.state == "failed"
    prepare, train = run.nodes["prepare"], run.nodes["train"]
    assert prepare.state == "failed" and "exit code 7" in prepare.reason and "no data today" in prepare.reason
    assert train.state == "not_run" and train.job_id is None
    assert "prepare" in train.reason and "exit code 7" in train.reason
    assert [j.id for j in runner.service.list_jobs()] == [prepare.job_id]  # train never became a job
    assert "prepare" in run.reason


def test_independent_branches_run_at_once(workspace, runner):
    """Two nodes with no edge between them each wait for the other's file: only running together ends them."""
    left = [PY, "-c", GATE, str(workspace / "left.flag"), str(workspace / "right.flag")]
    right = [PY, "-c", GATE, str(workspace / "right.flag"), str(workspace / "left.flag")]
    document = {
        "version": 1,
        "nodes": [node("left", {"command": left}), node("right", {"command": right})],
        "edges": [],
    }
    run = run_here(runner, write(workspace, document))
    assert run.state == "succeeded", run.to_json()


def drive_until_prepare_runs(runner, run_id: str, ended: list[Any]) -> tuple[threading.Thread, str]:  # type: ignore[no-untyped-def]
    """Drive the run in a thread (its end appended to ``ended``) until its prepare node's job runs;
    the thread and that job's id."""
    driver = threading.Thread(target=lambda: ended.append(runner.drive(run_id)))
    driver.start()
    try:
        job_id = wait_for(lambda: runner.get(run_id).nodes["prepare"].job_id, timeout=60, message="prepare's job")
        wait_for(lambda: runner.service.get(job_id).state == "running", timeout=60, message="prepare to run")
    except BaseException:
        with contextlib.suppress(Exception):  # the run ends, so its thread does
            runner.cancel(run_id, by="a failed wait")
        driver.join(timeout=60)
        raise
    return driver, job_id


def test_cancel_stops_the_run_and_its_running_job(workspace, runner):
    gate = workspace / "never"
    waiting = [PY, "-c", GATE, str(workspace / "started"), str(gate)]
    run, _ = runner.start(write(workspace, two_steps(prepare=waiting)), background=False)
    ended: list[Any] = []
    driver, job_id = drive_until_prepare_runs(runner, run.id, ended)
    try:
        runner.cancel(run.id, by="tester")
        driver.join(timeout=60)
    finally:
        gate.touch()
        driver.join(timeout=60)
    [final] = ended
    assert final.state == "cancelled" and final.reason == "cancelled by tester"
    assert final.nodes["prepare"].state == "cancelled"
    assert final.nodes["train"].state in ("cancelled", "not_run") and final.nodes["train"].job_id is None
    assert runner.service.get(job_id).state == "cancelled"


# -- validation ---------------------------------------------------------------------------------
def test_a_cycle_a_missing_setting_an_unknown_step_and_a_missing_input_are_reported(workspace, runner):
    document = {
        "version": 1,
        "nodes": [
            node("a", {"command": "true", "bring_back": ["a.out"]}),
            node("b", {"command": "true", "send": ["a.out"]}),
            node("c", {"machine": "local"}),  # no command
            node("d", {"anything": 1}, step="made-up-step"),
            node("e", {"command": "true", "send": ["nowhere.csv", "b.out"]}),
            node("f", {"command": "true", "bring_back": ["b.out"]}),
        ],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}],
    }
    file = write(workspace, document)
    with pytest.raises(PipelineInvalid) as caught:
        runner.start(file)
    problems = {(p.kind, p.node, p.field) for p in caught.value.problems}
    assert ("cycle", "a", None) in problems
    assert ("missing_setting", "c", "command") in problems
    assert ("unknown_step", "d", "step") in problems
    assert ("missing_input", "e", "send") in problems
    messages = " | ".join(p.text() for p in caught.value.problems)
    assert "nowhere.csv" in messages and "connect f → e" in messages and "made-up-step" in messages
    assert caught.value.to_json()["code"] == "pipeline_invalid"
    assert not list((workspace / ".punica").glob("pipelines/*.json"))  # no run was recorded

    # The unknown step stays a node of the document, written back as it was read.
    pipeline = parse_pipeline((workspace / file).read_text())
    assert [n.id for n in pipeline.nodes] == ["a", "b", "c", "d", "e", "f"]
    again = parse_pipeline(dump_pipeline(pipeline))
    assert again == pipeline and again.node("d").settings == {"anything": 1}


def test_an_input_outside_the_workspace_is_refused_whether_or_not_it_exists(workspace, runner):
    (workspace.parent / "outside.txt").write_text("not the workspace's\n")
    document = {
        "version": 1,
        "nodes": [
            node("there", {"command": "true", "send": ["../outside.txt"]}),
            node("absent", {"command": "true", "send": ["../absent.txt"]}),
            node("absolute", {"command": "true", "send": [str(workspace.parent / "outside.txt")]}),
        ],
        "edges": [],
    }
    with pytest.raises(PipelineInvalid) as caught:
        runner.start(write(workspace, document))
    assert sorted((p.kind, p.node) for p in caught.value.problems) == [
        ("outside_workspace", "absent"),
        ("outside_workspace", "absolute"),
        ("outside_workspace", "there"),
    ]
    problems = {p.node: p for p in caught.value.problems}
    # The answer is the same for a file that exists and one that does not: nothing outside is looked up.
    there = problems["there"].message.replace("../outside.txt", "F")
    assert there == problems["absent"].message.replace("../absent.txt", "F")


def test_the_document_is_written_in_a_stable_order() -> None:
    pipeline = parse_pipeline(json.dumps(two_steps()))
    text = dump_pipeline(pipeline)
    assert text == dump_pipeline(parse_pipeline(text))
    assert list(json.loads(text)) == ["version", "nodes", "edges"]
    assert list(json.loads(text)["nodes"][0]) == ["id", "step", "settings", "position"]
    assert list(json.loads(text)["nodes"][0]["settings"]) == ["bring_back", "command", "machine"]


def test_an_edge_to_an_unknown_node_names_it() -> None:
    document = two_steps()
    document["edges"].append({"from": "prepare", "to": "ghost"})
    with pytest.raises(ConfigFileError, match=r"edges\[1\]\.to: no node has the id 'ghost'"):
        parse_pipeline(json.dumps(document))


def cli(workspace: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "jupyter_remote_compute.cli", "pipeline", *args],
        cwd=workspace, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


@pytest.fixture
def cli_env(scratch_dir: Path, tracking_uri: str) -> dict[str, str]:
    return {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch_dir)}


def test_a_malformed_file_is_reported_with_its_line_and_left_as_it_is(workspace, cli_env):
    broken = '{\n  "version": 1,\n  "nodes": [\n    {"id": "a",, "step": "x"}\n  ]\n}\n'
    (workspace / "broken.rcpipeline").write_text(broken)
    before = os.stat(workspace / "broken.rcpipeline")
    for action in ("validate", "run"):
        done = cli(workspace, action, "broken.rcpipeline", env=cli_env)
        assert done.returncode == 1
        assert "broken.rcpipeline: line 4 column" in done.stderr, done.stderr
    assert (workspace / "broken.rcpipeline").read_text() == broken
    assert os.stat(workspace / "broken.rcpipeline").st_mtime_ns == before.st_mtime_ns


def test_the_cli_validates_and_runs_a_pipeline(workspace, cli_env):
    file = write(workspace, two_steps())
    valid = cli(workspace, "validate", file, env=cli_env)
    assert valid.returncode == 0 and "valid (2 nodes, 1 edges)" in valid.stdout
    done = cli(workspace, "run", file, "--json", env=cli_env)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    assert run["state"] == "succeeded" and (workspace / "model.txt").read_text() == "42!"
    again = cli(workspace, "run", file, env=cli_env)
    assert again.returncode == 0 and again.stdout.count(": reused") == 2, again.stdout
    listed = json.loads(cli(workspace, "list", "--json", env=cli_env).stdout)
    assert [r["state"] for r in listed] == ["succeeded", "succeeded"] and listed[1]["id"] == run["id"]
    shown = cli(workspace, "show", run["id"], env=cli_env)
    assert f"pipeline run {run['id']} of {file}: succeeded" in shown.stdout and "train: succeeded" in shown.stdout
    ended = cli(workspace, "cancel", run["id"], env=cli_env)
    assert ended.returncode == 1 and "has already ended (succeeded)" in ended.stderr

    bad = write(workspace, {"version": 1, "nodes": [node("c", {"machine": "local"})], "edges": []}, "bad.rcpipeline")
    invalid = cli(workspace, "validate", bad, env=cli_env)
    assert invalid.returncode == 1 and "node c, command: Command is required" in invalid.stderr


def test_a_run_cancelled_from_the_cli_says_who_cancelled_it(workspace, runner, cli_env):
    """The person, as every face names one (the hub's user name here), not the word 'user'."""
    run, _ = runner.start(write(workspace, two_steps(prepare="echo up; sleep 120")), background=False)
    ended: list[Any] = []
    driver, job_id = drive_until_prepare_runs(runner, run.id, ended)
    try:
        cancelled = cli(workspace, "cancel", run.id, env={**cli_env, "JUPYTERHUB_USER": "grace"})
        assert cancelled.returncode == 0, cancelled.stderr
    finally:
        driver.join(timeout=60)
    [final] = ended
    assert final.state == "cancelled" and final.reason == "cancelled by grace", final.reason
    assert runner.service.get(job_id).reason == "cancelled by grace"


def test_a_literal_secret_or_a_bad_path_is_refused_before_the_run_is_recorded(workspace, runner):
    document = two_steps()
    document["nodes"][0]["settings"]["env"] = {"TOKEN": "AKIAFAKEEXAMPLE00001"}
    document["nodes"][1]["settings"]["send"] = ["../outside.csv"]
    with pytest.raises(PipelineInvalid) as caught:
        runner.start(write(workspace, document))
    problems = {(p.kind, p.node, p.field) for p in caught.value.problems}
    assert ("secret_in_settings", "prepare", "env.TOKEN") in problems
    assert ("outside_workspace", "train", "send") in problems, problems
    assert "AKIAFAKEEXAMPLE00001" not in caught.value.message
    assert not list((workspace / ".punica").glob("pipelines/*.json"))  # the settings were never stored


FOREIGN_STEP = """
import pathlib

STEP = {
    "id": "write-a-note",
    "label": "Write a note",
    "executor": "jrc_test_steps:write_note",
    "settings": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
}


def write_note(settings, context):
    path = pathlib.Path(context.workspace) / "note.txt"
    path.write_text(settings["text"] + " from run " + context.run_id)
    return {"outputs": {"note.txt": {"size": path.stat().st_size}}}
"""


def test_another_packages_step_is_offered_and_run_through_its_executor(workspace, runner, tmp_path, monkeypatch):
    from jupyter_remote_compute.steps import describe_steps

    site = tmp_path / "site"
    (site / "jrc_test_steps-1.0.dist-info").mkdir(parents=True)
    (site / "jrc_test_steps-1.0.dist-info" / "METADATA").write_text("Name: jrc-test-steps\nVersion: 1.0\n")
    (site / "jrc_test_steps-1.0.dist-info" / "entry_points.txt").write_text(
        "[punica.mlops.steps]\nwrite-a-note = jrc_test_steps:STEP\n"
    )
    (site / "jrc_test_steps.py").write_text(FOREIGN_STEP)
    monkeypatch.syspath_prepend(str(site))
    assert [s["id"] for s in describe_steps(installed=True)][-1] == "write-a-note"
    assert "write-a-note" not in [s["id"] for s in describe_steps()]

    document = {"version": 1, "nodes": [node("n", {"text": "hello"}, step="write-a-note")], "edges": []}
    with pytest.raises(PipelineInvalid, match="node m, text: text is required"):
        bad = {"version": 1, "nodes": [node("m", {}, step="write-a-note")], "edges": []}
        runner.start(write(workspace, bad, "bad.rcpipeline"))
    run = run_here(runner, write(workspace, document))
    assert run.state == "succeeded" and run.nodes["n"].outputs == {
        "note.txt": {"size": len(f"hello from run {run.id}")}
    }
    assert (workspace / "note.txt").read_text() == f"hello from run {run.id}"
