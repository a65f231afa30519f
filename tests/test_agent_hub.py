"""The server side of agent machines, on its files: claims, leases, log offsets, tokens (no processes needed)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jupyter_remote_compute.engines.agent_hub import AgentHub, StaleAttempt


@pytest.fixture
def hub(tmp_path: Path):  # type: ignore[no-untyped-def]
    return AgentHub(tmp_path / ".punica").machine("lab")


def test_log_bytes_arrive_once_whatever_the_offsets(hub) -> None:  # type: ignore[no-untyped-def]
    hub.prepare("j1")
    hub.enqueue("j1", "key", {"command": "true"})
    attempt = hub.claim("agent")["attempt"]
    assert hub.heartbeat("j1", attempt, {"state": "running"}, b"hello ", 0)["log_size"] == 6
    # A reconnect sends again from an older offset: only the new bytes are kept.
    assert hub.heartbeat("j1", attempt, {"state": "running"}, b"hello world", 0)["log_size"] == 11
    # A gap is refused; the answer says where to resume.
    assert hub.heartbeat("j1", attempt, {"state": "running"}, b"!!", 20)["log_size"] == 11
    assert (hub.job_dir("j1") / "log").read_bytes() == b"hello world"
    assert hub.state("j1")["state"] == "running"


def test_a_lease_that_runs_out_queues_an_unstarted_job_and_loses_a_started_one(hub) -> None:  # type: ignore[no-untyped-def]
    for job_id in ("idle", "busy"):
        hub.prepare(job_id)
        hub.enqueue(job_id, "key", {"command": "true"})
        time.sleep(0.01)  # claimed oldest first
    first = hub.claim("agent")
    second = hub.claim("agent")
    assert (first["job_id"], second["job_id"]) == ("idle", "busy")
    hub.heartbeat("busy", second["attempt"], {"state": "running"}, b"", 0)
    assert hub.expire(lease=60, since=0) == []
    assert sorted(hub.expire(lease=0, since=0)) == ["busy", "idle"]
    assert hub.state("idle")["state"] == "queued"
    assert hub.state("busy")["state"] == "lost" and "stopped reporting" in hub.state("busy")["detail"]
    # The old attempt can no longer act; the next claim is a new attempt.
    with pytest.raises(StaleAttempt):
        hub.heartbeat("busy", second["attempt"], {"state": "running"}, b"", 0)
    again = hub.claim("agent")
    assert again["job_id"] == "idle" and again["attempt"] == first["attempt"] + 1
    with pytest.raises(StaleAttempt):
        hub.heartbeat("idle", first["attempt"], {"state": "running"}, b"", 0)


def test_a_job_queued_again_after_its_attempt_was_lost_numbers_its_attempts_on(hub) -> None:  # type: ignore[no-untyped-def]
    """A retried job's folder is removed and made again; an agent back from a stall still holds its
    lost attempt, which must not pass for the new one."""
    hub.prepare("j1")
    hub.enqueue("j1", "key", {"command": "true"})
    lost = hub.claim("agent")["attempt"]
    hub.heartbeat("j1", lost, {"state": "running"}, b"", 0)
    assert hub.expire(lease=0, since=0) == ["j1"]
    hub.remove_job("j1")  # the lifecycle's cleanup before the next attempt
    hub.prepare("j1")
    hub.enqueue("j1", "key", {"command": "true"})
    with pytest.raises(StaleAttempt):
        hub.heartbeat("j1", lost, {"state": "ended", "how": "gone"}, b"", 0)
    again = hub.claim("agent")["attempt"]
    assert again == lost + 1
    with pytest.raises(StaleAttempt):
        hub.heartbeat("j1", lost, {"state": "ended", "how": "gone"}, b"", 0)
    # Queued again, the job is no longer among those retired; removed once its attempt ended, it is not either.
    assert hub._retired() == {}
    hub.heartbeat("j1", again, {"state": "ended", "how": "exited", "exit_code": 0}, b"", 0)
    hub.remove_job("j1")
    assert hub._retired() == {}


def test_a_lease_counts_from_the_servers_start_at_the_earliest(hub) -> None:  # type: ignore[no-untyped-def]
    hub.prepare("j1")
    hub.enqueue("j1", "key", {"command": "true"})
    attempt = hub.claim("agent")["attempt"]
    hub.heartbeat("j1", attempt, {"state": "running"}, b"", 0)
    state = hub.state("j1")
    hub._save("j1", {**state, "renewed_at": time.time() - 100})
    # Silent for longer than the lease, but the server started a second ago: its agents could not reach it.
    assert hub.expire(lease=10, since=time.time() - 1) == []
    assert hub.expire(lease=10, since=0) == ["j1"]


def test_tokens_are_kept_as_hashes_and_rotate(hub) -> None:  # type: ignore[no-untyped-def]
    assert not hub.accepts("jrca_anything")
    first = hub.issue_token()
    assert hub.accepts(first) and not hub.accepts(first + "x")
    assert first not in (hub.dir / "token.json").read_text()
    assert (hub.dir / "token.json").stat().st_mode & 0o777 == 0o600
    second = hub.issue_token()
    assert hub.accepts(second) and not hub.accepts(first)
    assert hub.revoke_token() and not hub.accepts(second)
