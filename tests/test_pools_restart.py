"""A pool's queue outlives its server: a real `jupyter server` SIGKILLed with jobs waiting in a pool is
started again, and each job is placed once and runs once, with a second process placing and driving the
same jobs at the same time (the CLI, say)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sshd_fixture
from pool_bed import Gates, add_pair, gates, remove_b_folder
from recorders import OwnRecorder
from server_process import Server
from waiting import wait_for

from jupyter_remote_compute.jobs.service import JobService
from jupyter_remote_compute.jobs.store import JobStore

gates = gates  # the fixture, used here
sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env


@pytest.fixture
def server(
    workspace: Path, tmp_path: Path, scratch_dir: Path, tracking_uri: str, own_recorder: OwnRecorder, ssh_agent_env: Any
) -> Iterator[Server]:
    # The server reaches the bed's sshds through its agent (SSH_AUTH_SOCK, set for this test).
    env = {**os.environ, **own_recorder.env}
    started = Server(workspace, scratch_dir, tracking_uri, tmp_path / "server.log", env=env)
    yield started
    started.stop()


@pytest.mark.timeout(600)
def test_a_server_killed_with_a_queue_places_each_job_once_after_its_restart(
    workspace: Path, make_service: Any, ssh_agent_env: Any, server: Server, gates: Gates
) -> None:
    bed = ssh_agent_env
    here: JobService = make_service(workspace)  # the second process's view: this test's own service
    add_pair(here, bed, max_jobs=1)
    names = ["k1", "k2", "k3", "k4", "k5"]
    try:
        server.start()
        ids = {name: server.request("POST", "jobs", gates.spec(name))["job"]["id"] for name in names}
        wait_for(lambda: gates.runs_of("k1") and gates.runs_of("k2"), 120, "k1 and k2 to run on a and b")
        store = JobStore(workspace / ".punica/jobs.json")
        waiting = [name for name in names if store.get(ids[name]).waiting]
        assert waiting == ["k3", "k4", "k5"]
        assert store.get(ids["k5"]).reason == "3rd in line for pool pair: a runs 1 of 1 jobs, b runs 1 of 1 jobs"

        server.kill()
        # Both machines come free while no server runs.
        gates.open("k1")
        gates.open("k2")
        server.start()

        # This process places and drives the same jobs as the restarted server does, at the same time.
        def placed_and_ran(name: str) -> bool:
            here.poll_active()
            return gates.runs_of(name) > 0

        for name in ("k3", "k4"):
            wait_for(lambda name=name: placed_and_ran(name), 120, f"{name} to be placed and run")
        assert store.get(ids["k5"]).waiting
        assert store.get(ids["k5"]).reason == "1st in line for pool pair: a runs 1 of 1 jobs, b runs 1 of 1 jobs"
        gates.open("k3")
        wait_for(lambda: placed_and_ran("k5"), 120, "k5 to take the machine k3 left")
        gates.open("k4")
        gates.open("k5")

        def all_ended() -> bool:
            here.poll_active()
            return all(store.get(job_id).state == "succeeded" for job_id in ids.values())

        wait_for(all_ended, 180, "every job to succeed")
        jobs = {name: store.get(job_id) for name, job_id in ids.items()}
        assert [gates.runs_of(name) for name in names] == [1, 1, 1, 1, 1]
        assert {name: job.machine for name, job in jobs.items()} == {
            "k1": "a",
            "k2": "b",
            "k3": jobs["k3"].machine,
            "k4": jobs["k4"].machine,
            "k5": jobs["k3"].machine,
        }
        assert {jobs["k3"].machine, jobs["k4"].machine} == {"a", "b"}
        assert all(job.placement and job.placement.startswith(f"placed on {job.machine}: ") for job in jobs.values())
        # One attempt each: nothing was sent or started twice.
        assert all(not job.attempts for job in jobs.values())
    finally:
        for name in names:
            gates.open(name)
        server.stop()
        remove_b_folder(bed)
