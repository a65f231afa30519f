"""Old finished jobs, as months of work leave them, written to a workspace's job state file.

Written through ``JobStore`` (its lock and journal), as the CLI would, so jobs the server or other
tests recorded are kept. Used by jupyter_server_test_config.py (before the server starts) and by
the job list spec (while it runs):

    python ui-tests/seed_jobs.py <state file> <count> [<id prefix> [<name>]]

and one job waiting in a Slurm queue, as the engine leaves it when Slurm says PENDING, for the sidebar
spec (its machine a slurm one whose login node does not answer: polls fail, which is not an end):

    python ui-tests/seed_jobs.py <state file> pending <id> <machine> <name> <reason>
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from jupyter_remote_compute.jobs.store import Job, JobStore

EPOCH = datetime(2025, 1, 1, tzinfo=timezone.utc)


def seed_jobs(state_file: Path, count: int, prefix: str = "ui", name: str = "seed") -> None:
    """``count`` finished jobs named ``<name> <i>``, one a second from 2025-01-01, every fifth failed."""
    with JobStore(state_file).transaction() as jobs:
        for i in range(count):
            job_id = f"20250101-000000-{prefix}{i:06d}"
            at = (EPOCH + timedelta(seconds=i)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            failed = i % 5 == 0
            jobs[job_id] = Job(
                id=job_id,
                key=f"seed{prefix}{i}",
                machine="local",
                kind="local",
                spec={"machine": "local", "command": "python train.py", "name": f"{name} {i}"},
                state="failed" if failed else "succeeded",
                reason="exit code 1" if failed else None,
                created=at,
                updated=at,
                started=at,
                ended=at,
                exit_code=1 if failed else 0,
            )


def seed_pending(state_file: Path, job_id: str, machine: str, name: str, reason: str) -> None:
    """One job of ``machine`` (kind slurm) pending with ``reason``, started a minute ago."""
    at = (datetime.now(timezone.utc) - timedelta(minutes=1)).isoformat(timespec="milliseconds")
    at = at.replace("+00:00", "Z")
    with JobStore(state_file).transaction() as jobs:
        jobs[job_id] = Job(
            id=job_id,
            key=f"seed{job_id}",
            machine=machine,
            kind="slurm",
            spec={"machine": machine, "command": "python train.py", "name": name},
            state="pending",
            reason=reason,
            created=at,
            updated=at,
            started=at,
            machine_snapshot={"kind": "slurm", "address": "127.0.0.1", "options": {"port": 9}},
            handle={"dir": f"/tmp/{job_id}", "slurm_job_id": "48213"},
        )


if __name__ == "__main__":
    if sys.argv[2] == "pending":
        seed_pending(Path(sys.argv[1]), *sys.argv[3:7])
    else:
        seed_jobs(Path(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:5])
