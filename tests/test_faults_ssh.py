"""The SSH connection cut (the far side's sshd session processes killed) while a job's inputs are
being sent and while its outputs are being fetched: the lifecycle tries again, the job succeeds,
and nothing partial is left in the workspace.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sshd_fixture
from sshd_fixture import TestBed
from waiting import wait_for

from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
ssh_transport = sshd_fixture.ssh_transport

BIG = 128 << 20  # long enough on loopback to be cut in the middle


def _cut(bed: TestBed) -> int:
    """Kill every sshd process serving a connection: the network drops under the client."""
    return len(bed.sshd.cut_sessions())


@contextlib.contextmanager
def driven(service, job_id: str) -> Iterator[dict]:  # type: ignore[no-untyped-def]
    """Drive the job to its end in a thread, as a CLI or a kernel would; ``result["job"]`` once it ended."""
    result: dict = {}

    def run() -> None:
        result["job"] = service.wait(job_id, timeout=300)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield result
    thread.join(timeout=320)
    assert "job" in result, "the job was not driven to its end"


def _partial_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith((".incoming", ".part", ".tmp")) or p.name == "incoming"]


def _retried(caplog: pytest.LogCaptureFixture, job_id: str) -> bool:
    """The lifecycle said it would try the job again (its warning names the job and how long it failed)."""
    return any(job_id in r.getMessage() and "failing for" in r.getMessage() for r in caplog.records)


@pytest.fixture
def box(workspace: Path, make_service, ssh_agent_env: TestBed, ssh_transport: str):  # type: ignore[no-untyped-def]
    service = make_service(workspace)
    # A far-side cache per transport: a file the other transport's test already sent would not be sent again.
    options = ssh_agent_env.options(ssh_transport=ssh_transport, base_dir=f"{ssh_agent_env.base_dir}/{ssh_transport}")
    service.machines.add("box", "ssh", "127.0.0.1", options)
    return service


def test_a_connection_cut_while_sending_is_sent_again_and_the_job_succeeds(box, ssh_agent_env: TestBed, caplog) -> None:  # type: ignore[no-untyped-def]
    service = box
    root = service.workspace.root
    with open(root / "big.bin", "wb") as f:
        f.truncate(BIG)
    spec = {"machine": "box", "command": "sha256sum big.bin > digest.txt", "send": ["big.bin"]}
    job_id = service.submit(JobSpec.from_json({**spec, "bring_back": ["digest.txt"]})).job.id
    with driven(service, job_id) as result:
        wait_for(lambda: 0 < service.progress.get(job_id, (0, 1))[0] < BIG // 2, 120, "big.bin to be half way across")
        assert _cut(ssh_agent_env) > 0
    job = result["job"]
    assert job.state == "succeeded", job.reason
    assert _retried(caplog, job_id) and job.reason is None  # tried again, then ran: the retry's reason is gone
    digest = (root / "digest.txt").read_text().split()[0]
    assert digest == hashlib.sha256(b"\0" * BIG).hexdigest()  # what arrived is the whole file
    assert not _partial_files(root)


def test_a_connection_cut_while_fetching_is_fetched_again_and_lands_whole(box, ssh_agent_env: TestBed, caplog) -> None:  # type: ignore[no-untyped-def]
    service = box
    root = service.workspace.root
    command = f"head -c {BIG} /dev/zero > out.bin"
    spec = {"machine": "box", "command": command, "bring_back": ["out.bin"]}
    job_id = service.submit(JobSpec.from_json(spec)).job.id
    incoming = service.workspace.job_dir(job_id) / "incoming" / "work" / "out.bin"
    with driven(service, job_id) as result:
        wait_for(lambda: incoming.exists() and incoming.stat().st_size > 0, 120, "out.bin to be on its way back")
        assert _cut(ssh_agent_env) > 0
    job = result["job"]
    assert job.state == "succeeded", job.reason
    assert _retried(caplog, job_id)
    assert (root / "out.bin").stat().st_size == BIG
    assert job.outputs["out.bin"]["sha256"] == hashlib.sha256(b"\0" * BIG).hexdigest()
    assert not _partial_files(root)
