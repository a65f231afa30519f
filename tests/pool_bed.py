"""A test bed for pools: jobs that hold their machine until their gate opens, and a pool of the ssh test
bed's two sshds (``a`` on the main one, ``b`` on the jump one, each with a folder of its own)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_remote_compute.jobs.service import JobService
from jupyter_remote_compute.schema.pool import PoolInput

# Each job notes that it ran (once per run), then holds its machine until its gate opens.
GATED = 'echo "$JOB" >> "$RUNS/$JOB"; while [ ! -e "$GATES/$JOB" ]; do sleep 0.05; done'


class Gates:
    """Folders the far user writes (runs) and reads (gates): the bed's sshd runs jobs as another user."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="jrc-pool-gates-"))
        self.runs, self.gates = self.root / "runs", self.root / "gates"
        for folder, mode in ((self.root, 0o755), (self.runs, 0o777), (self.gates, 0o755)):
            folder.mkdir(exist_ok=True)
            os.chmod(folder, mode)

    def spec(self, name: str, machine: str = "pair", **more: Any) -> dict[str, Any]:
        env = {"JOB": name, "RUNS": str(self.runs), "GATES": str(self.gates)}
        return {"machine": machine, "command": GATED, "env": env, "name": name, **more}

    def open(self, name: str) -> None:
        (self.gates / name).touch()

    def runs_of(self, name: str) -> int:
        path = self.runs / name
        return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def gates() -> Iterator[Gates]:
    made = Gates()
    yield made
    shutil.rmtree(made.root, ignore_errors=True)


def add_pair(service: JobService, bed: Any, placement: str = "first", **options: Any) -> None:
    """Machines ``a`` and ``b`` on the bed's two sshds, and pool ``pair`` of them."""
    service.machines.add("a", "ssh", "127.0.0.1", bed.options(ssh_transport="openssh", **options))
    service.machines.add(
        "b",
        "ssh",
        "127.0.0.1",
        bed.options(ssh_transport="openssh", port=bed.jump.port, base_dir=bed.base_dir + "-b", **options),
    )
    service.machines.put_pool("pair", PoolInput.from_json({"machines": ["a", "b"], "placement": placement}))


def remove_b_folder(bed: Any) -> None:
    shutil.rmtree(bed.far_path(bed.base_dir.removeprefix("~/") + "-b"), ignore_errors=True)
