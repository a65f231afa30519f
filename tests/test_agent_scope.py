"""What an agent token opens (its own machine's agent routes and jobs) and what it does not (everything else)."""

from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import agent_fixture
import pytest
from test_agent import state_of, submit
from waiting import wait_for

from jupyter_remote_compute.agent.server import Server

module_bed = agent_fixture.module_bed

SHA = "0" * 64


def status(bed: agent_fixture.AgentBed, method: str, path: str, authorization: str | None, body: bytes = b"{}") -> int:
    headers = {"Authorization": authorization} if authorization else {}
    data = body if method in ("POST", "PUT", "PATCH") else None
    req = urllib.request.Request(bed.url + path, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture(scope="module")
def two_machines(module_bed: agent_fixture.AgentBed) -> tuple[str, str]:
    return module_bed.add_machine("scope-a"), module_bed.add_machine("scope-b")


def test_an_agent_token_opens_nothing_but_agent_routes(module_bed: agent_fixture.AgentBed, two_machines) -> None:
    token, _ = two_machines
    elsewhere = [
        ("GET", "/api/contents"),
        ("GET", "/api/contents/train.py"),
        ("GET", "/api/kernels"),
        ("POST", "/api/kernels"),
        ("GET", "/api/terminals"),
        ("POST", "/api/terminals"),
        ("GET", "/api/sessions"),
        ("GET", "/remote-compute/jobs"),
        ("POST", "/remote-compute/jobs"),
        ("GET", "/remote-compute/machines"),
        ("POST", "/remote-compute/machines/scope-a/check"),
        ("POST", "/remote-compute/machines/scope-a/agent-token"),
        ("GET", "/remote-compute/secrets"),
    ]
    for method, path in elsewhere:
        for authorization in (f"Bearer {token}", f"token {token}"):
            assert status(module_bed, method, path, authorization) == 403, (method, path, authorization)
        assert status(module_bed, method, f"{path}?token={token}", None) == 403, (method, path)


def test_an_agent_token_opens_only_its_own_machine_and_jobs(module_bed: agent_fixture.AgentBed, two_machines) -> None:
    token_a, _ = two_machines
    server = module_bed.server
    job_b = submit(server, "scope-b", command="true", send=[], bring_back=[])["id"]
    wait_for(lambda: state_of(server, job_b)["state"] == "pending", timeout=60, message="the job to wait for scope-b")
    own = "/remote-compute/agent/scope-a"
    other = "/remote-compute/agent/scope-b"
    bearer_a = f"Bearer {token_a}"
    # The other machine's routes: refused outright.
    for method, path in [
        ("POST", f"{other}/hello"),
        ("POST", f"{other}/claim"),
        ("POST", f"{other}/jobs/{job_b}/heartbeat"),
        ("GET", f"{other}/jobs/{job_b}/inputs/{SHA}?attempt=1"),
        ("PUT", f"{other}/jobs/{job_b}/outputs?attempt=1&manifest=.fetch-x"),
    ]:
        assert status(module_bed, method, path, bearer_a) == 403, path
    # The other machine's job through this machine's routes: it does not exist here.
    for method, path in [
        ("POST", f"{own}/jobs/{job_b}/heartbeat"),
        ("GET", f"{own}/jobs/{job_b}/inputs/{SHA}?attempt=1"),
        ("PUT", f"{own}/jobs/{job_b}/outputs?attempt=1&manifest=.fetch-x"),
    ]:
        assert status(module_bed, method, path, bearer_a) == 404, path
    # Without a token, with a made-up one or with Jupyter's own token, agent routes are closed.
    for authorization in (None, "Bearer jrca_made-up", f"Bearer {server.token}", f"token {server.token}"):
        assert status(module_bed, "POST", f"{own}/hello", authorization) == 403, authorization
        assert status(module_bed, "GET", "/remote-compute/agent/agent.pyz", authorization) == 403, authorization
    # The job of scope-b was not handed to scope-a's claim.
    _, answer = Server(module_bed.url, "scope-a", token_a).request("POST", "claim", {"hold": 0.5})
    assert answer is None
    assert state_of(server, job_b)["state"] == "pending"


def test_an_upload_refused_before_its_body_came_says_its_connection_closes(
    module_bed: agent_fixture.AgentBed, two_machines
) -> None:
    """tornado closes a connection whose request body it did not read. The refusal says so: a proxy that reuses
    connections (the hub's, in front of the organization's uploads) would send its next request into the
    closing one and answer that request 503 itself."""
    token_a, _ = two_machines
    url = urllib.parse.urlsplit(module_bed.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        path = "/remote-compute/agent/scope-b/jobs/j-1/outputs?attempt=1&manifest=.fetch-x"
        connection.request("PUT", path, body=b"not yours", headers={"Authorization": f"Bearer {token_a}"})
        answer = connection.getresponse()
        answer.read()
        assert (answer.status, answer.getheader("Connection")) == (403, "close")
    finally:
        connection.close()


def test_revoking_and_rotating_a_token(module_bed: agent_fixture.AgentBed) -> None:
    server = module_bed.server
    old = module_bed.add_machine("rotated")
    hello = "/remote-compute/agent/rotated/hello"
    assert status(module_bed, "POST", hello, f"Bearer {old}") == 200
    new = server.request("POST", "machines/rotated/agent-token", {"action": "rotate"})["agent_token"]
    assert status(module_bed, "POST", hello, f"Bearer {old}") == 403
    assert status(module_bed, "POST", hello, f"Bearer {new}") == 200
    server.request("POST", "machines/rotated/agent-token", {"action": "revoke"})
    assert status(module_bed, "POST", hello, f"Bearer {new}") == 403
    # Only the hash is kept on this side.
    kept = (server.root / ".punica" / "agents" / "rotated").rglob("*")
    assert not any(new in p.read_text(errors="replace") for p in kept if p.is_file())


def test_a_second_agent_sees_nothing_of_the_first_machines_jobs(module_bed: agent_fixture.AgentBed) -> None:
    server = module_bed.server
    module_bed.add_machine("iso-a")
    module_bed.add_machine("iso-b")
    agent_b = module_bed.start_agent("iso-b")
    job_a = submit(server, "iso-a", command="true", send=[], bring_back=[])["id"]
    waiting = wait_for(
        lambda: (j := state_of(server, job_a))["state"] == "pending" and j, timeout=60, message="iso-a's job to wait"
    )
    assert "the agent of iso-a has never connected" in waiting["reason"]
    job_b = submit(server, "iso-b", command="python train.py", send=["train.py", "data/points.csv"])["id"]
    wait_for(lambda: state_of(server, job_b)["state"] == "succeeded", timeout=120, message="iso-b's job to succeed")
    assert state_of(server, job_a)["state"] == "pending"
    assert not (agent_b.state / "jobs" / job_a).exists()
    assert job_a not in agent_b.log.read_text()
    shown = {m["name"]: m.get("agent") for m in server.request("GET", "machines")["machines"]}
    assert shown["iso-b"]["online"] is True and shown["iso-a"]["online"] is False
    # check shows the facts the agent reported when it connected, and when it was last seen.
    facts = server.request("POST", "machines/iso-b/check")["facts"]
    assert facts["online"] is True and facts["last_seen"] and facts["cpus"] >= 1 and facts["python"]


def socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[len("socket:[") : -1])
    return found


def sockets_by_state(pid: int) -> dict[str, set[str]]:
    """Inodes of the process's network namespace's TCP and UDP sockets, by state (0A: listening, 01: established)."""
    states: dict[str, set[str]] = {}
    for table in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            kind = "udp" if table.startswith("udp") else fields[3]
            states.setdefault(kind, set()).add(fields[9])
    return states


def test_the_agent_opens_no_listening_socket(module_bed: agent_fixture.AgentBed) -> None:
    module_bed.add_machine("quiet")
    agent = module_bed.start_agent("quiet")
    mine = wait_for(lambda: socket_inodes(agent.pid), timeout=30, message="the agent's claim connection")
    states = sockets_by_state(agent.pid)
    assert not mine & states.get("0A", set()), "the agent listens on a TCP port"
    assert not mine & states.get("udp", set()), "the agent holds a UDP socket"
    assert mine & states.get("01", set()), "the agent's sockets should be connections it made"
