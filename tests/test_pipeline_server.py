"""Pipelines run by a real `jupyter server`: the REST routes, and a run that outlives a SIGKILLed server."""

from __future__ import annotations

import asyncio
import getpass
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import ApiError, Server
from tornado.httpclient import HTTPClientError
from waiting import wait_for

from jupyter_remote_compute.pipelines.events import RUN_EVENT_ID

PY = sys.executable
GATE = (
    "import pathlib, sys, time\n"
    "while not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.05)\n"
    "open('data.txt', 'w').write('42')\n"
)
TRAIN = f"{PY} -c \"x = open('data.txt').read(); open('model.txt', 'w').write(x + '!')\""


@pytest.fixture
def server(quickstart: Path, scratch_dir: Path, tracking_uri: str, tmp_path: Path) -> Iterator[Server]:
    srv = Server(quickstart, scratch_dir, tracking_uri, tmp_path / "server.log")
    yield srv
    srv.stop()


def write_pipeline(root: Path, prepare: str | list[str], name: str = "flow.rcpipeline") -> str:
    document = {
        "version": 1,
        "nodes": [
            {"id": "prepare", "step": "train-on-remote-machine", "position": {"x": 0, "y": 0},
             "settings": {"command": prepare, "bring_back": ["data.txt"]}},
            {"id": "train", "step": "train-on-remote-machine", "position": {"x": 200, "y": 0},
             "settings": {"command": TRAIN, "bring_back": ["model.txt"]}},
        ],
        "edges": [{"from": "prepare", "to": "train"}],
    }  # fmt: skip
    (root / name).write_text(json.dumps(document, indent=2))
    return name


def ended(server: Server, run_id: str) -> dict | None:
    run = server.request("GET", f"pipelines/runs/{run_id}")
    return run if run["state"] != "running" else None


def test_the_rest_api_runs_lists_reuses_and_refuses(server: Server, quickstart: Path):
    server.start()
    file = write_pipeline(quickstart, f"{PY} -c \"open('data.txt', 'w').write('42')\"")
    started = server.request("POST", "pipelines/runs", {"file": file})
    assert started["attached"] is False and started["run"]["state"] == "running"
    run = wait_for(lambda: ended(server, started["run"]["id"]), timeout=120, message="the run to end")
    assert run["state"] == "succeeded", run
    assert (quickstart / "model.txt").read_text() == "42!"
    assert [r["id"] for r in server.request("GET", "pipelines/runs")["runs"]] == [run["id"]]

    again = server.request("POST", "pipelines/runs", {"file": file})["run"]
    second = wait_for(lambda: ended(server, again["id"]), timeout=120, message="the second run to end")
    assert {n["state"] for n in second["nodes"].values()} == {"reused"}
    assert second["nodes"]["train"]["job_id"] == run["nodes"]["train"]["job_id"]

    with pytest.raises(ApiError) as finished:
        server.request("POST", f"pipelines/runs/{run['id']}/cancel")
    assert finished.value.status == 409
    with pytest.raises(ApiError) as missing:
        server.request("GET", "pipelines/runs/20990101-000000-abcdef")
    assert missing.value.status == 404 and missing.value.body["code"] == "not_found"

    (quickstart / "bad.rcpipeline").write_text(json.dumps({"version": 1, "nodes": [
        {"id": "x", "step": "no-such-step", "settings": {}}], "edges": []}))  # fmt: skip
    with pytest.raises(ApiError) as invalid:
        server.request("POST", "pipelines/runs", {"file": "bad.rcpipeline"})
    assert invalid.value.status == 422 and invalid.value.body["code"] == "pipeline_invalid"
    [problem] = invalid.value.body["details"]["problems"]
    assert problem["node"] == "x" and problem["kind"] == "unknown_step" and "no-such-step" in problem["message"]
    with pytest.raises(ApiError) as outside:
        server.request("POST", "pipelines/runs", {"file": "/etc/x.rcpipeline"})
    assert outside.value.status == 400 and outside.value.body["field"] == "file"


def test_a_pipeline_run_survives_a_server_restart_and_attaches_again(server: Server, quickstart: Path, tmp_path):
    gate = tmp_path / "go"
    file = write_pipeline(quickstart, [PY, "-c", GATE, str(gate)])
    server.start()
    run_id = server.request("POST", "pipelines/runs", {"file": file})["run"]["id"]

    def prepare_running() -> str | None:
        job_id = server.request("GET", f"pipelines/runs/{run_id}")["nodes"]["prepare"]["job_id"]
        return job_id if job_id and server.request("GET", f"jobs/{job_id}")["state"] == "running" else None

    job_id = wait_for(prepare_running, timeout=120, message="prepare's job to run")
    server.kill()
    record = json.loads((quickstart / ".punica" / "pipelines" / f"{run_id}.json").read_text())
    assert record["state"] == "running" and record["nodes"]["train"]["state"] == "waiting"

    server.start()
    gate.touch()
    run = wait_for(lambda: ended(server, run_id), timeout=180, message="the restarted server to finish the run")
    assert run["state"] == "succeeded", run
    assert run["nodes"]["prepare"]["job_id"] == job_id  # attached to the job it had started, not a new one
    assert (quickstart / "model.txt").read_text() == "42!"
    jobs = server.request("GET", "jobs")["jobs"]
    assert sorted(j["id"] for j in jobs) == sorted([job_id, run["nodes"]["train"]["job_id"]])
    assert "taken up pipeline runs " + run_id in server.log.read_text()


async def test_each_node_change_is_an_event_on_the_server_bus(jp_fetch, jp_serverapp, server_workspace: Path):
    seen: list[dict] = []

    async def listener(logger, schema_id, data):  # type: ignore[no-untyped-def]
        seen.append(data)

    jp_serverapp.event_logger.add_listener(schema_id=RUN_EVENT_ID, listener=listener)
    file = write_pipeline(server_workspace, f"{PY} -c \"open('data.txt', 'w').write('42')\"")
    response = await jp_fetch("remote-compute", "pipelines", "runs", method="POST", body=json.dumps({"file": file}))
    assert response.code == 201
    run_id = json.loads(response.body)["run"]["id"]
    deadline = time.monotonic() + 120
    while not any(e["id"] == run_id and e["state"] == "succeeded" for e in seen):
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.05)
    mine = [e for e in seen if e["id"] == run_id]
    train_states = [e["nodes"]["train"]["state"] for e in mine]
    assert train_states[0] == "waiting" and "running" in train_states and train_states[-1] == "succeeded"
    assert mine[-1]["nodes"]["prepare"]["job_id"] and mine[-1]["file"] == file
    assert {e["user"] for e in mine} == {getpass.getuser()}  # who started it, for a panel that heard only events


async def test_the_validate_route_names_each_problem_of_an_unsaved_document_and_writes_nothing(
    jp_fetch, server_workspace: Path
):
    saved = write_pipeline(server_workspace, f"{PY} -c \"open('data.txt', 'w').write('42')\"")
    on_disk = (server_workspace / saved).read_text()
    drawn = json.loads(on_disk)
    # As a canvas may hold it before saving: train loops back to prepare, and prepare lost its command.
    drawn["edges"].append({"from": "train", "to": "prepare"})
    del drawn["nodes"][0]["settings"]["command"]

    async def check(document: dict) -> list[dict]:
        body = json.dumps({"file": saved, "document": document})
        response = await jp_fetch("remote-compute", "pipelines", "validate", method="POST", body=body)
        assert response.code == 200
        return json.loads(response.body)["problems"]

    problems = await check(drawn)
    by_kind = {p["kind"]: p for p in problems}
    assert by_kind["missing_setting"]["node"] == "prepare" and by_kind["missing_setting"]["field"] == "command"
    assert "prepare" in by_kind["cycle"]["message"] and "train" in by_kind["cycle"]["message"]
    assert (server_workspace / saved).read_text() == on_disk  # checked as drawn, never written
    assert await check(json.loads(on_disk)) == []

    with pytest.raises(HTTPClientError) as shapeless:
        body = json.dumps({"file": saved, "document": {"version": 1, "nodes": "x"}})
        await jp_fetch("remote-compute", "pipelines", "validate", method="POST", body=body)
    assert shapeless.value.code == 422 and b"nodes" in shapeless.value.response.body
    with pytest.raises(HTTPClientError) as no_document:
        await jp_fetch("remote-compute", "pipelines", "validate", method="POST", body=json.dumps({"file": saved}))
    assert no_document.value.code == 400 and json.loads(no_document.value.response.body)["field"] == "document"
