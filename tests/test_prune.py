"""Pruning old finished jobs: a real server, real local jobs, a real MLflow store."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import job_runs
from test_job_list import _job, _seed, _stamp

from jupyter_remote_compute.jobs.job import Job
from jupyter_remote_compute.jobs.store import JobStore

OLD = "2025-01-01T00:00:00.000Z"


async def _call(jp_fetch, *path, method="GET", body=None):
    kwargs = {"method": method, "raise_error": False}
    if body is not None:
        kwargs["body"] = json.dumps(body)
    response = await jp_fetch("remote-compute", *path, **kwargs)
    return response.code, json.loads(response.body) if response.body else None


async def _until_state(jp_fetch, job_id: str, states: set[str]) -> dict:
    deadline = time.monotonic() + 90
    while True:
        _, job = await _call(jp_fetch, "jobs", job_id)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job["state"]
        await asyncio.sleep(0.1)


def _finished(i: int, state: str = "succeeded", at: str | None = None) -> Job:
    at = at or _stamp(i)
    return dataclasses.replace(_job(i, created=at, state=state), updated=at, ended=at)


def _age(state_file: Path, *job_ids: str) -> None:
    """Make jobs look months old, as if the workspace had been used since."""
    with JobStore(state_file).transaction() as jobs:
        for job_id in job_ids:
            job = jobs[job_id]
            job.created = job.started = OLD
            if job.ended:
                job.ended = OLD


async def test_prune_removes_only_old_finished_jobs_and_keeps_their_runs(
    jp_fetch, server_workspace: Path, tracking_uri: str
):
    state_file = server_workspace / ".punica" / "jobs.json"
    spec = {"command": "python train.py", "send": ["train.py", "data/points.csv"], "bring_back": ["model.pkl"]}
    _, trained = await _call(jp_fetch, "jobs", method="POST", body=spec)
    trained = await _until_state(jp_fetch, trained["job"]["id"], {"succeeded", "failed"})
    assert trained["state"] == "succeeded" and trained["mlflow_run_id"]
    far_side = Path(trained["handle"]["dir"])
    assert far_side.is_dir() and (server_workspace / ".punica/jobs" / trained["id"]).is_dir()
    _, running = await _call(jp_fetch, "jobs", method="POST", body={"command": "sleep 300"})
    running = await _until_state(jp_fetch, running["job"]["id"], {"running"})

    old = [_finished(i, ("succeeded", "failed", "cancelled", "lost")[i % 4]) for i in range(40)]
    recent = _finished(99, at=time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()))
    _seed(state_file, [*old, recent])
    _age(state_file, trained["id"], running["id"])
    size_before = state_file.stat().st_size

    code, err = await _call(jp_fetch, "jobs", "prune", method="POST", body={"older_than": "90d", "state": "running"})
    assert code == 400 and err["field"] == "state" and "never pruned" in err["message"]
    code, err = await _call(jp_fetch, "jobs", "prune", method="POST", body={"state": "failed"})
    assert code == 400 and err["field"] == "older_than"

    code, dry = await _call(jp_fetch, "jobs", "prune", method="POST", body={"older_than": "90d", "dry_run": True})
    assert code == 200 and dry["count"] == 41 and state_file.stat().st_size == size_before

    code, failed = await _call(jp_fetch, "jobs", "prune", method="POST", body={"older_than": "90d", "state": "failed"})
    assert code == 200 and sorted(failed["removed"]) == sorted(j.id for j in old if j.state == "failed")

    code, result = await _call(jp_fetch, "jobs", "prune", method="POST", body={"older_than": "90d"})
    assert code == 200
    assert set(result["removed"]) == {j.id for j in old if j.state != "failed"} | {trained["id"]}
    assert result["cleaned"] >= 1 and result["left_on_machines"] == {}
    assert result["state_file_bytes"]["after"] < result["state_file_bytes"]["before"]
    assert set(JobStore(state_file).jobs()) == {running["id"], recent.id}
    assert not far_side.exists() and not (server_workspace / ".punica/jobs" / trained["id"]).exists()
    assert [r.info.run_id for r in job_runs(tracking_uri, trained["id"])] == [trained["mlflow_run_id"]]
    assert (server_workspace / "model.pkl").is_file()  # what a job brought back is the user's: it stays

    code, _ = await _call(jp_fetch, "jobs", running["id"], "cancel", method="POST", body={})
    assert code == 200
    await _until_state(jp_fetch, running["id"], {"cancelled"})


def test_cli_prune(workspace: Path):
    state_file = workspace / ".punica" / "jobs.json"
    _seed(state_file, [_finished(i, ("succeeded", "failed")[i % 2]) for i in range(10)])
    _seed(state_file, [_job(50, created=_stamp(50), state="running")])

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jupyter_remote_compute.cli", "jobs", "prune", *args],
            cwd=workspace,
            capture_output=True,
            text=True,
            timeout=120,
        )

    proc = cli("--older-than", "90d", "--state", "queued")
    assert proc.returncode != 0 and "never pruned" in proc.stderr
    assert "would remove 10 finished jobs" in cli("--older-than", "90d", "--dry-run").stdout
    result = json.loads(cli("--older-than", "90d", "--state", "succeeded", "--json").stdout)
    assert result["count"] == 5
    assert "removed 5 finished jobs" in cli("--older-than", "2160h").stdout
    assert list(JobStore(state_file).jobs()) == [_job(50, created="").id]


class TestRetention:
    """A server that keeps only the newest finished jobs by itself."""

    @pytest.fixture
    def jp_server_config(self, jp_server_config: dict, server_workspace: Path) -> dict:
        """The usual test server, with retention on and a state file already holding 30 finished jobs."""
        _seed(server_workspace / ".punica" / "jobs.json", [_finished(i) for i in range(30)])
        jp_server_config["RemoteComputeApp"]["keep_finished_jobs"] = 12
        return jp_server_config

    async def test_the_server_keeps_the_newest_n_finished_jobs(self, jp_fetch, server_workspace: Path):
        state_file = server_workspace / ".punica" / "jobs.json"
        deadline = time.monotonic() + 30
        # The server runs on this loop: wait without blocking it.
        while len(JobStore(state_file).jobs()) > 12:
            assert time.monotonic() < deadline, "the server did not prune"
            await asyncio.sleep(0.05)
        assert sorted(JobStore(state_file).jobs()) == sorted(_job(i, created="").id for i in range(18, 30))
        code, page = await _call(jp_fetch, "jobs")
        assert code == 200 and len(page["jobs"]) == 12
