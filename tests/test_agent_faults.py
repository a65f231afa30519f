"""Agent machines when things go wrong: cancel, an agent killed or restarted, a tampered upload, a server restart."""

from __future__ import annotations

import io
import re
import signal
import tarfile
import uuid
from pathlib import Path
from typing import Any

import agent_fixture
from procs import group_members
from test_agent import GATED, ended, state_of, submit
from waiting import wait_for

from jupyter_remote_compute.agent.client import STARTING_FIELDS, Agent
from jupyter_remote_compute.agent.server import Refused, Server

module_bed = agent_fixture.module_bed


def running_job(
    bed: agent_fixture.AgentBed, agent: agent_fixture.AgentProcess, machine: str, **spec: Any
) -> tuple[str, Path]:
    (bed.server.root / "gated.sh").write_text(GATED)
    job = submit(bed.server, machine, **spec)
    jobdir = agent.state / "jobs" / job["id"]
    wait_for(lambda: (jobdir / "pid").exists(), timeout=30, message="the agent to start the job")
    wait_for(lambda: state_of(bed.server, job["id"])["state"] == "running", timeout=30, message="the job to run")
    return job["id"], jobdir


def hand_made_agent(bed: agent_fixture.AgentBed, machine: str) -> tuple[Server, dict[str, Any], int]:
    """The agent's own HTTP client, driven by hand: it claims a quickstart job and says it runs."""
    token = bed.add_machine(machine)
    client = Server(bed.url, machine, token)
    client.request("POST", "hello", {"version": "test"})
    job = submit(bed.server, machine, command="python train.py", send=["train.py", "data/points.csv"])
    status, answer = client.request("POST", "claim", {"agent": "test", "hold": 20}, timeout=40)
    assert status == 200 and answer["job"]["job_id"] == job["id"]
    attempt = answer["job"]["attempt"]
    client.request(
        "POST", f"jobs/{job['id']}/heartbeat", {"attempt": attempt, "state": "running", "log_offset": 0, "log": ""}
    )
    return client, job, attempt


def upload_and_end(client: Server, job_id: str, attempt: int, entries: list[tuple[str, bytes]], manifest: str) -> None:
    """Upload ``entries`` as the outputs' tar stream, then say the command exited 0."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    body = stream.getvalue()
    query = {"attempt": attempt, "manifest": manifest, "output": ["model.pkl", "metrics.json"]}
    client.request("PUT", f"jobs/{job_id}/outputs", query=query, raw=body, length=len(body))
    client.request(
        "POST",
        f"jobs/{job_id}/heartbeat",
        {"attempt": attempt, "state": "ended", "how": "exited", "exit_code": 0, "log_offset": 0},
    )


def test_cancel_stops_the_process_group_on_the_agent(module_bed: agent_fixture.AgentBed) -> None:
    module_bed.add_machine("cancel-me")
    agent = module_bed.start_agent("cancel-me")
    job_id, jobdir = running_job(module_bed, agent, "cancel-me")
    group = int((jobdir / "pid").read_text())
    assert group_members(group)

    module_bed.server.request("POST", f"jobs/{job_id}/cancel")
    done = ended(module_bed.server, job_id)
    assert done["state"] == "cancelled", done["reason"]
    assert group_members(group) == []
    assert "first line" in module_bed.server.request("GET", f"jobs/{job_id}/log")["data"]


def test_an_agent_killed_mid_job_loses_it_after_its_lease(module_bed: agent_fixture.AgentBed) -> None:
    module_bed.add_machine("killed")
    agent = module_bed.start_agent("killed")
    job_id, jobdir = running_job(module_bed, agent, "killed")
    agent.kill()

    done = ended(module_bed.server, job_id, timeout=180)
    assert done["state"] == "lost"
    assert "stopped reporting: no heartbeat for" in done["reason"], done["reason"]
    # Started again later, the agent holds a stale attempt: the server refuses it and the agent stops the job.
    group = int((jobdir / "pid").read_text())
    module_bed.start_agent("killed", state=agent.state)
    wait_for(lambda: not jobdir.exists(), timeout=30, message="the agent to drop the stale job")
    assert group_members(group) == []


def test_an_agent_that_stops_reporting_loses_its_attempt_and_the_retry_runs_once_it_is_back(
    module_bed: agent_fixture.AgentBed,
) -> None:
    """The agent's process is stopped (SIGSTOP: a hung agent, a box frozen) while its job runs: past its
    lease the attempt ends lost, saying so, and the job waits for the agent; once the agent is back it drops
    the stale attempt (stopping its process) and runs the next one."""
    server = module_bed.server
    module_bed.add_machine("stalled")
    agent = module_bed.start_agent("stalled")
    job_id, jobdir = running_job(module_bed, agent, "stalled", retry={"max": 1, "on": ["lost"]})
    group = int((jobdir / "pid").read_text())
    assert agent.proc is not None
    agent.proc.send_signal(signal.SIGSTOP)
    try:
        requeued = wait_for(
            lambda: (job := state_of(server, job_id)).get("attempts") and job, timeout=120, message="the attempt to end"
        )
        assert requeued["state"] in ("queued", "pending"), requeued
        lost = requeued["attempts"][0]
        assert lost["end"] == "lost", lost
        quiet = re.fullmatch(
            r"lost: the agent of stalled stopped reporting: no heartbeat for (\d+) s \(its lease is 30 s\)",
            lost["reason"],
        )
        assert quiet and int(quiet.group(1)) >= 30, lost["reason"]
        assert group_members(group)  # the job itself ran on while its agent was stopped
    finally:
        agent.proc.send_signal(signal.SIGCONT)

    def next_attempt_started() -> bool:
        pid = jobdir / "pid"
        return pid.exists() and int(pid.read_text()) != group

    wait_for(next_attempt_started, timeout=60, message="the agent to start the next attempt")
    assert group_members(group) == []  # the stale attempt's process was stopped
    (jobdir / "work" / "go").write_text("")
    done = ended(server, job_id)
    assert done["state"] == "succeeded", done["reason"]
    assert [a["end"] for a in done["attempts"]] == ["lost", "succeeded"]
    assert set(done["outputs"]) == {"model.pkl", "metrics.json"}


def test_an_agent_stopped_and_started_within_its_lease_adopts_the_job_again(module_bed: agent_fixture.AgentBed) -> None:
    server = module_bed.server
    module_bed.add_machine("restarted")
    agent = module_bed.start_agent("restarted")
    job_id, jobdir = running_job(module_bed, agent, "restarted")
    agent.kill(signal.SIGTERM)
    # Stopping the agent stops its claims, not its jobs.
    assert agent.proc is not None and agent.proc.returncode == 0
    assert group_members(int((jobdir / "pid").read_text()))
    module_bed.start_agent("restarted", state=agent.state)
    (jobdir / "work" / "go").write_text("")

    done = ended(server, job_id)
    assert done["state"] == "succeeded", done["reason"]
    assert set(done["outputs"]) == {"model.pkl", "metrics.json"}


def test_an_output_that_does_not_match_its_sha256_is_refused(module_bed: agent_fixture.AgentBed) -> None:
    """A hand-made agent (the agent's own HTTP client) uploads a model whose bytes differ from its digest."""
    server = module_bed.server
    client, job, attempt = hand_made_agent(module_bed, "tamper")
    manifest = f".fetch-{uuid.uuid4().hex}"
    listed = b"0" * 64 + b"  work/model.pkl\n" + b"0" * 64 + b"  work/metrics.json\nT 1\n"
    entries = [(manifest, listed), ("work/model.pkl", b"not the model"), ("work/metrics.json", b"{}")]
    upload_and_end(client, job["id"], attempt, entries, manifest)

    done = ended(server, job["id"])
    assert done["state"] == "failed"
    assert "sha256 differs" in done["reason"] and "model.pkl" in done["reason"]
    assert not (server.root / "model.pkl").exists() or done["outputs"] == {}
    # And the attempt is over for the agent: acting on it again is a conflict.
    try:
        client.request("POST", f"jobs/{job['id']}/heartbeat", {"attempt": attempt + 1, "state": "running"})
        raise AssertionError("a heartbeat on an attempt that never was was accepted")
    except Refused as e:
        assert e.status == 409


def test_a_job_cancelled_before_any_agent_took_it(module_bed: agent_fixture.AgentBed) -> None:
    server = module_bed.server
    module_bed.add_machine("nobody")
    job = submit(server, "nobody", command="true", send=[], bring_back=[])
    wait_for(lambda: state_of(server, job["id"])["state"] == "pending", timeout=60, message="the job to wait")
    server.request("POST", f"jobs/{job['id']}/cancel")
    done = ended(server, job["id"], timeout=180)
    assert done["state"] == "cancelled", done["reason"]


def test_each_job_gets_its_own_gpus(module_bed: agent_fixture.AgentBed) -> None:
    server = module_bed.server
    module_bed.add_machine("gpus")
    module_bed.start_agent("gpus", "--max-jobs", "2", "--gpus-per-job", "1", "--gpu-ids", "0,1")
    # Each waits until both GPUs are held, so the two jobs run at the same time (markers fresh per run).
    marks = f"$HOME/gpus-{uuid.uuid4().hex}"
    (server.root / "both.sh").write_text(
        f'echo "gpu=$CUDA_VISIBLE_DEVICES"; mkdir -p "{marks}"; touch "{marks}/$CUDA_VISIBLE_DEVICES"\n'
        f'while [ ! -f "{marks}/0" ] || [ ! -f "{marks}/1" ]; do sleep 0.05; done\n'
    )
    ids = [submit(server, "gpus", command="sh both.sh", send=["both.sh"], bring_back=[], new=True)["id"] for _ in "ab"]
    logs = []
    for job_id in ids:
        done = ended(server, job_id)
        assert done["state"] == "succeeded", done["reason"]
        logs.append(server.request("GET", f"jobs/{job_id}/log")["data"].strip())
    assert sorted(logs) == ["gpu=0", "gpu=1"]


def test_agents_waiting_through_a_server_restart_take_the_next_job(module_bed: agent_fixture.AgentBed) -> None:
    server = module_bed.server
    module_bed.add_machine("patient")
    agent = module_bed.start_agent("patient")
    server.kill()
    server.start()
    wait_for(server.reconciled, timeout=60, message="the restarted server to catch up")

    job = submit(server, "patient", command="python train.py", send=["train.py", "data/points.csv"])
    done = ended(server, job["id"])
    assert done["state"] == "succeeded", done["reason"]
    assert agent.proc is not None and agent.proc.poll() is None


def test_an_upload_that_stops_before_its_digests_fails_the_job_at_once(module_bed: agent_fixture.AgentBed) -> None:
    """The agent's packing died midway (an output it could not read): the stored upload has no digests.

    Reading the same stored file again can never help, so the job fails with that reason instead of
    being retried as if a connection had dropped until it ends lost."""
    server = module_bed.server
    client, job, attempt = hand_made_agent(module_bed, "cut-upload")
    manifest = f".fetch-{uuid.uuid4().hex}"
    entries = [(manifest, b"T 1\n"), ("work/model.pkl", b"the model")]  # no <manifest>.sums
    upload_and_end(client, job["id"], attempt, entries, manifest)

    done = ended(server, job["id"], timeout=120)
    assert done["state"] == "failed", (done["state"], done["reason"])
    assert "upload of the outputs is incomplete" in done["reason"], done["reason"]
    assert done["outputs"] == {}  # nothing of it was kept


def test_a_heartbeat_saving_its_log_offset_keeps_what_the_job_thread_saved(tmp_path: Path) -> None:
    """The heartbeats read a job's agent.json, post, then save the new log offset; meanwhile the job's
    own thread saved it as running. Writing back the whole stale copy made it "preparing" again, and the
    next beat threw the running job away (its lease then ran out)."""
    agent = Agent(Server("http://127.0.0.1:9", "m", "t"), tmp_path, max_jobs=1, gpu_ids=[], gpus_per_job=0)
    jobdir = tmp_path / "jobs" / "j1"
    jobdir.mkdir(parents=True)
    agent._save(jobdir, {"job_id": "j1", "attempt": 1, "phase": "preparing", "log_sent": 0, "gpus": []})
    read_by_heartbeat = agent._meta(jobdir)

    started = {**agent._meta(jobdir), "phase": "running", "started_at": 1.0, "gpus": ["1"]}
    agent._save(jobdir, started, *STARTING_FIELDS)
    agent._save(jobdir, {**read_by_heartbeat, "log_sent": 42}, "log_sent")

    assert agent._meta(jobdir) == {**started, "log_sent": 42}
