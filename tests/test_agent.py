"""Agent machines end to end: a real server and real agents (another user, own processes) on loopback."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import agent_fixture
from conftest import job_runs
from server_process import Server
from waiting import wait_for

agent_bed = agent_fixture.agent_bed

GATED = "echo first line; while [ ! -f go ]; do sleep 0.05; done; python train.py\n"
TRAIN = {"send": ["gated.sh", "train.py", "data/points.csv"], "bring_back": ["model.pkl", "metrics.json"]}


def submit(server: Server, machine: str, command: str = "sh gated.sh", **spec: Any) -> dict[str, Any]:
    return server.request("POST", "jobs", {"machine": machine, "command": command, **TRAIN, **spec})["job"]


def state_of(server: Server, job_id: str) -> dict[str, Any]:
    return server.request("GET", f"jobs/{job_id}")


def ended(server: Server, job_id: str, timeout: float = 180) -> dict[str, Any]:
    return wait_for(
        lambda: (j := state_of(server, job_id))["state"] in ("succeeded", "failed", "cancelled", "lost") and j,
        timeout=timeout,
        message=f"job {job_id} to end",
    )


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(pid)


def test_an_agent_takes_a_job_streams_its_log_and_returns_verified_outputs(
    agent_bed: agent_fixture.AgentBed, quickstart: Path, tracking_uri: str
) -> None:
    server = agent_bed.server
    agent_bed.add_machine("lab")
    agent = agent_bed.start_agent("lab")
    (quickstart / "gated.sh").write_text(GATED)
    job = submit(server, "lab")

    wait_for(lambda: state_of(server, job["id"])["state"] == "running", timeout=30, message="the agent to start it")
    log = wait_for(
        lambda: "first line" in (text := server.request("GET", f"jobs/{job['id']}/log")["data"]) and text,
        timeout=30,
        message="the live log",
    )
    assert log == "first line\n"
    # It runs on the agent's side, as the agent's user, in the agent's own state folder.
    jobdir = agent.state / "jobs" / job["id"]
    assert uid_of(int((jobdir / "pid").read_text())) == agent_bed.uid
    (jobdir / "work" / "go").write_text("")

    done = ended(server, job["id"])
    assert done["state"] == "succeeded", done["reason"]
    for output in ("model.pkl", "metrics.json"):
        assert done["outputs"][output]["sha256"] == hashlib.sha256((quickstart / output).read_bytes()).hexdigest()
    runs = job_runs(tracking_uri, job["id"])
    assert len(runs) == 1 and runs[0].data.params["rows"] == "40"
    assert server.request("GET", f"jobs/{job['id']}/log")["data"].startswith("first line\n")
    # The agent forgets a job once the server has all of it.
    wait_for(lambda: not jobdir.exists(), timeout=30, message="the agent to drop the finished job")
