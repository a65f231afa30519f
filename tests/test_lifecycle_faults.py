"""A permanent fault ends a job at once with a reason naming it; a passing one is retried (real engines).

Every wait here is far shorter than ``give_up_after`` (an hour): a job that ends within it, with no
retry counted, was ended by the fault itself, not by running out of patience.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import ports
import sshd_fixture

from jupyter_remote_compute.jobs.service import JobService
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.workspace import Workspace

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env


def test_a_local_scratch_folder_that_cannot_be_made_fails_the_job_at_once(workspace: Path, make_service) -> None:
    blocker = workspace.parent / "a-file"
    blocker.write_text("not a folder\n")
    base = make_service(workspace).settings
    service = JobService(Workspace(workspace), dataclasses.replace(base, scratch_dir=blocker / "jobs"))
    try:
        job = service.wait(service.submit(JobSpec.from_json({"command": "true"})).job.id, timeout=60)
    finally:
        service.close()
    assert job.state == "failed"
    assert job.reason.startswith("could not start on local:") and "Not a directory" in job.reason, job.reason
    assert job.retries == 0 and job.failing_since is None


def test_an_ssh_base_folder_under_a_regular_file_fails_the_job_at_once(
    workspace: Path, make_service, ssh_agent_env: sshd_fixture.TestBed
) -> None:
    blocker = f".jrc-blocker-{uuid.uuid4().hex[:8]}"
    ssh_agent_env.far_path(blocker).write_text("not a folder\n")
    try:
        service = make_service(workspace)
        service.machines.add("box", "ssh", "127.0.0.1", ssh_agent_env.options(base_dir=f"~/{blocker}/jobs"))
        job = service.wait(service.submit(JobSpec.from_json({"machine": "box", "command": "true"})).job.id, timeout=60)
    finally:
        ssh_agent_env.far_path(blocker).unlink()
    assert job.state == "failed"
    assert job.reason.startswith("could not start on box:") and blocker in job.reason, job.reason
    assert job.retries == 0 and job.failing_since is None


def test_a_machine_that_cannot_be_reached_is_retried_until_the_grace_runs_out(
    workspace: Path, make_service, ssh_agent_env: sshd_fixture.TestBed
) -> None:
    service = make_service(workspace)
    service.machines.add("gone", "ssh", "127.0.0.1", ssh_agent_env.options(port=ports.free_port()))
    job = service.submit(JobSpec.from_json({"machine": "gone", "command": "true"})).job
    first = service.advance(job.id)
    second = service.advance(job.id)
    assert first.active and second.active, second.reason
    assert (first.retries, second.retries) == (1, 2) and second.failing_since is not None
    service.settings = dataclasses.replace(service.settings, give_up_after=0.0)
    ended = service.wait(job.id, timeout=60)
    assert ended.state == "failed"
    assert ended.reason.startswith("could not start on gone") and "refused" in ended.reason, ended.reason
