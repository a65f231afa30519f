"""Two real servers and the CLI on one workspace at once: every job is driven once, one MLflow run each.

Both servers poll every job of the workspace, whoever submitted it; the job's lease decides who
sends and who collects. Each command counts its own starts in a file outside the workspace, so a
job started twice, collected twice or recorded twice shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import job_runs
from server_process import Server
from waiting import wait_for

PER_FACE = 4
TERMINAL = ("succeeded", "failed", "cancelled", "lost")


@pytest.fixture
def servers(quickstart: Path, scratch_dir: Path, tracking_uri: str, tmp_path: Path) -> Iterator[list[Server]]:
    pair = [Server(quickstart, scratch_dir, tracking_uri, tmp_path / f"server-{n}.log") for n in "ab"]
    starting = [threading.Thread(target=s.start) for s in pair]  # both start-ups overlap, as they would
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join(timeout=180)
    yield pair
    for server in pair:
        server.stop()


def _spec(name: str, runs: Path) -> dict:
    command = f"echo {name} >> {runs / name}; echo {name} > out-{name}.txt"
    return {"command": command, "bring_back": [f"out-{name}.txt"], "name": name}


@pytest.mark.timeout(600)
def test_two_servers_and_the_cli_drive_every_job_once(
    servers: list[Server], quickstart: Path, scratch_dir: Path, tracking_uri: str, tmp_path: Path
) -> None:
    a, b = servers
    for server in servers:
        assert server.proc is not None and server.proc.poll() is None, server.log.read_text()[-2000:]
    runs = tmp_path / "runs"
    runs.mkdir()
    names: list[str] = []

    # The same work asked of both servers at the same moment is one job.
    same = _spec("same", runs)
    answers: list[dict] = []
    barrier = threading.Barrier(2)

    def ask(server: Server) -> None:
        barrier.wait()
        answers.append(server.request("POST", "jobs", same))

    askers = [threading.Thread(target=ask, args=(s,)) for s in servers]
    for thread in askers:
        thread.start()
    for thread in askers:
        thread.join(timeout=120)
    assert len({answer["job"]["id"] for answer in answers}) == 1, answers
    assert sorted(answer["attached"] for answer in answers) == [False, True]
    names.append("same")

    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_EXPERIMENT_NAME": "tests",  # the servers' experiment: a CLI may be the one that collects
        "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch_dir),
    }
    cli_jobs = []
    for i in range(PER_FACE):
        for face, server in (("a", a), ("b", b)):
            name = f"{face}{i}"
            server.request("POST", "jobs", _spec(name, runs))
            names.append(name)
        name = f"cli{i}"
        spec = _spec(name, runs)
        cli_jobs.append(
            subprocess.Popen(
                [sys.executable, "-m", "jupyter_remote_compute.cli", "run", "--detach", "--name", name,
                 "--bring-back", f"out-{name}.txt", "--", "sh", "-c", spec["command"]],
                cwd=quickstart, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )
        )  # fmt: skip
        names.append(name)
    for proc in cli_jobs:
        assert proc.wait(timeout=180) == 0, proc.stderr.read() if proc.stderr else ""

    def recorded(job: dict) -> bool:  # a CLI that collects leaves its run to a detached recorder
        return bool(job["mlflow_run_id"]) or "not recorded" in (job["reason"] or "")

    def all_ended() -> list[dict] | None:
        jobs = a.request("GET", "jobs?limit=1000")["jobs"]
        done = len(jobs) == len(names) and all(j["state"] in TERMINAL and recorded(j) for j in jobs)
        return jobs if done else None

    jobs = wait_for(all_ended, 300, "every job to end and be recorded in MLflow")
    assert {j["name"] for j in b.request("GET", "jobs")["jobs"]} == set(names)  # both servers see them all
    for job in jobs:
        name = job["name"]
        assert job["state"] == "succeeded", (name, job["reason"])
        assert (runs / name).read_text() == f"{name}\n", f"{name} was started more than once"
        assert (quickstart / f"out-{name}.txt").read_text() == f"{name}\n"
        assert [run.info.run_id for run in job_runs(tracking_uri, job["id"])] == [job["mlflow_run_id"]], name
