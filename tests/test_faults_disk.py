"""The disk fills up while outputs come back: a real small file system (a tmpfs the test mounts).

The job does not end as if nothing happened, nor stay stuck without a word: it tries again with a
reason that says the disk is full, keeps no partial file in the workspace, and the state file stays
whole. Once there is room again, the next attempt brings the outputs back whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import job_runs
from tmpfs import tmpfs
from waiting import wait_for

from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.jobs.store import JobStore

OUTPUT = 1536 << 10  # 1.5 MiB of random bytes: more than the room left, less than the file system


def _fill(where: Path, leave: int) -> Path:
    """A filler file that leaves about ``leave`` bytes free on ``where``'s file system."""
    filler = where / "filler.bin"
    free = shutil.disk_usage(where).free
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def _partial_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith((".incoming", ".part", ".tmp")) or p.name == "incoming"]


def _spec(output: str) -> JobSpec:
    command = f"mkdir -p $(dirname {output}) && head -c {OUTPUT} /dev/urandom > {output}"
    return JobSpec.from_json({"command": command, "bring_back": [output]})


def _retries_for_want_of_space(service, job_id: str) -> None:  # type: ignore[no-untyped-def]
    """Drive the job until its first attempt to bring the output back has failed; it must say why."""
    wait_for(
        lambda: (j := service.advance(job_id)).retries >= 1 or not j.active,
        timeout=120,
        message="the job's first attempt to bring its output back",
    )
    job = service.get(job_id)
    assert job.state == "collecting" and job.retries >= 1, (job.state, job.reason)
    assert "No space left on device" in job.reason and "trying again" in job.reason, job.reason


@pytest.fixture
def small_workspace(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "small", "4m") as root:
        (root / ".punica").mkdir()
        yield root


def test_a_full_workspace_disk_retries_with_the_reason_and_keeps_no_partial_file(
    small_workspace: Path, make_service, tracking_uri: str
) -> None:
    root = small_workspace
    service = make_service(root)
    filler = _fill(root, 1 << 20)
    job_id = service.submit(_spec("out/big.bin")).job.id
    _retries_for_want_of_space(service, job_id)
    assert not _partial_files(root), _partial_files(root)
    assert not (root / "out/big.bin").exists()
    json.loads((root / ".punica/jobs.json").read_bytes())  # whole and readable
    assert JobStore(root / ".punica/jobs.json").get(job_id).state == "collecting"  # with its journal

    filler.unlink()  # room again: the next attempt brings the output back whole
    job = service.wait(job_id, timeout=120)
    assert job.state == "succeeded", job.reason
    far = Path(job.handle["dir"]) / "work/out/big.bin"
    assert (
        hashlib.sha256((root / "out/big.bin").read_bytes()).hexdigest() == hashlib.sha256(far.read_bytes()).hexdigest()
    )
    assert not _partial_files(root)
    assert len(job_runs(tracking_uri, job_id)) == 1


def test_a_full_disk_under_an_output_folder_keeps_no_partial_file_there(
    workspace: Path, make_service, tmp_path: Path
) -> None:
    """Landing on another file system is a copy then a rename: a copy cut short by a full disk is removed."""
    service = make_service(workspace)
    with tmpfs(workspace / "landing", "1m"):
        job_id = service.submit(_spec("landing/big.bin")).job.id
        _retries_for_want_of_space(service, job_id)
        assert os.listdir(workspace / "landing") == []  # not even a hidden .big.bin.incoming
        assert not _partial_files(workspace)
        json.loads((workspace / ".punica/jobs.json").read_bytes())


def test_a_full_disk_while_the_log_lands_is_retried_not_taken_for_the_machines_fault(
    small_workspace: Path, make_service
) -> None:
    """The log is written here as it is read from the machine: a full disk then is this side's, and passes.

    Outputs may be none at all: the job printed more than the room left, so only the log fills the disk.
    """
    root = small_workspace
    service = make_service(root)
    filler = _fill(root, 1 << 20)
    printed = 3 << 20  # more than the room left
    spec = JobSpec.from_json({"command": f"head -c {printed} /dev/zero | tr '\\0' x"})
    job_id = service.submit(spec).job.id
    _retries_for_want_of_space(service, job_id)
    assert "could not fetch" not in service.get(job_id).reason
    assert not _partial_files(root), _partial_files(root)

    filler.unlink()
    job = service.wait(job_id, timeout=120)
    assert job.state == "succeeded", job.reason
    assert (root / f".punica/jobs/{job_id}/log").read_bytes() == b"x" * printed
