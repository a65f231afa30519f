"""The whole lifecycle on an SSH machine: a real sshd and ssh-agent on loopback (see sshd_fixture.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sshd_fixture
from mlflow.tracking import MlflowClient
from waiting import wait_for

from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
ssh_transport = sshd_fixture.ssh_transport

SCRIPT = 'echo "read $(wc -c < data/in.bin) bytes"; mkdir -p out; sha256sum data/in.bin > out/digest.txt; echo done\n'


@pytest.fixture
def ssh_workspace(workspace: Path, make_service, ssh_agent_env, ssh_transport):  # type: ignore[no-untyped-def]
    (workspace / "data").mkdir()
    (workspace / "data/in.bin").write_bytes(os.urandom(300_000))
    (workspace / "job.sh").write_text(SCRIPT)
    service = make_service(workspace)
    service.machines.add("box", "ssh", "127.0.0.1", ssh_agent_env.options(ssh_transport=ssh_transport))
    return workspace, service


def _spec() -> JobSpec:
    return JobSpec.from_json(
        {"machine": "box", "command": "sh job.sh", "send": ["job.sh", "data/"], "bring_back": ["out/digest.txt"]}
    )


def test_an_ssh_job_sends_runs_and_brings_back_verified_outputs(ssh_workspace, tracking_uri):
    workspace, service = ssh_workspace
    job = service.wait(service.submit(_spec()).job.id, timeout=120)
    assert job.state == "succeeded", job.reason
    digest = (workspace / "out/digest.txt").read_text().split()[0]
    import hashlib

    assert digest == hashlib.sha256((workspace / "data/in.bin").read_bytes()).hexdigest()
    assert job.transfer["bytes_sent"] >= 300_000
    assert b"read 300000 bytes" in service.read_log(job.id).data
    run = MlflowClient(tracking_uri).get_run(job.mlflow_run_id)
    assert run.data.tags["remote_compute.engine"] == "ssh" and run.data.tags["remote_compute.machine"] == "box"

    # The same inputs for a new job: the far side's cache already holds them.
    again = service.wait(service.submit(_spec(), new=True).job.id, timeout=120)
    assert again.state == "succeeded", again.reason
    assert again.transfer["bytes_sent"] == 0 and again.transfer["files_reused"] == 2


def test_a_job_outlives_the_process_that_started_it(ssh_workspace, tracking_uri, scratch_dir):
    """The CLI that submitted the job is SIGKILLed mid-run; another process finds and finishes the job."""
    workspace, service = ssh_workspace
    (workspace / "job.sh").write_text("echo waiting; while [ ! -f go ]; do sleep 0.05; done\n" + SCRIPT)
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch_dir)}
    cli = subprocess.Popen(
        [sys.executable, "-m", "jupyter_remote_compute.cli", "run", "--machine", "box",
         "--send", "job.sh", "--send", "data/", "--bring-back", "out/digest.txt", "--", "sh", "job.sh"],
        cwd=workspace, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        job = wait_for(
            lambda: next((j for j in service.list_jobs() if j.state == "running"), None),
            timeout=120,
            message="the CLI's job to run",
        )
        cli.send_signal(signal.SIGKILL)
        cli.wait(timeout=30)
    finally:
        cli.kill()
    far_dir = Path(job.handle["dir"])
    (far_dir / "work" / "go").write_text("")  # same machine: the far side's folder is reachable
    done = service.wait(job.id, timeout=120)
    assert done.state == "succeeded", done.reason
    assert (workspace / "out/digest.txt").is_file()
    assert json.loads((far_dir / "job.json").read_text())["key"] == job.key


def test_an_unknown_host_key_is_reported_with_its_fingerprint_then_trusted(
    workspace, make_service, ssh_agent_env, ssh_transport
):
    from jupyter_remote_compute.errors import MachineError

    empty = workspace / "known_hosts"
    empty.write_text("")
    service = make_service(workspace)
    service.machines.add(
        "fresh", "ssh", "127.0.0.1", ssh_agent_env.options(known_hosts=str(empty), ssh_transport=ssh_transport)
    )
    with pytest.raises(MachineError) as info:
        service.admin.check("fresh")
    payload = info.value.to_json()
    fingerprint = payload["details"]["host_key"]["fingerprint"]
    assert fingerprint.startswith("SHA256:") and payload["details"]["can_trust"] is True
    assert service.admin.trust("fresh")["fingerprint"] == fingerprint
    assert service.admin.check("fresh")["cpus"] >= 1
    assert empty.read_text().strip()
