"""A job's folder on its machine is that job's: every kind makes, marks and removes it the same way.

``prepare.sh`` writes job.json and refuses a folder another job marked; ``cleanup.sh`` removes only
the folder whose job.json names the job. Checked on the built-in machine, over ssh against a real
sshd, and through a real Jupyter Server's kernel.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import jupyter_server_fixture
import pytest
import sshd_fixture
from test_engine_jupyter import _engine as jupyter_engine
from test_engine_ssh import make_engine as ssh_engine

from jupyter_remote_compute.engines.base import Engine, EngineContext, EngineError, RemoteJob
from jupyter_remote_compute.engines.local import LocalEngine

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
remote_server = jupyter_server_fixture.remote_server


@pytest.fixture(params=["local", "ssh", "jupyter"])
def engine_and_reader(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, Callable]]:
    """An engine of each kind, and a way to read a file of a job's folder as the machine holds it."""
    if request.param == "local":
        engine: Engine = LocalEngine("local", "localhost", {}, EngineContext(lambda name: None, tmp_path / "scratch"))

        def read(job: RemoteJob, name: str) -> bytes | None:
            path = Path(job.handle["dir"]) / name
            return path.read_bytes() if path.exists() else None

    elif request.param == "ssh":
        engine = ssh_engine(request.getfixturevalue("ssh_agent_env"), tmp_path)

        def read(job: RemoteJob, name: str) -> bytes | None:
            res = engine._run(f"cat -- '{job.handle['dir']}/{name}' 2>/dev/null || echo MISSING", timeout=30)
            return None if res.out == b"MISSING\n" else res.out

    else:
        server = request.getfixturevalue("remote_server")
        engine = jupyter_engine(server, tmp_path, base_dir=f"jrc-folders-{uuid.uuid4().hex[:6]}")

        def read(job: RemoteJob, name: str) -> bytes | None:
            path = server.root_dir / job.handle["dir"] / name
            return path.read_bytes() if path.exists() else None

    try:
        yield engine, read
    finally:
        engine.close()


def _job(job_id: str | None = None) -> RemoteJob:
    return RemoteJob(job_id or f"job-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex, {})


def test_a_folder_another_job_marked_is_refused_and_left_as_it_is(engine_and_reader) -> None:
    engine, read = engine_and_reader
    mine = engine.prepare(_job())
    marker = read(mine, "job.json")
    assert json.loads(marker) == {"job_id": mine.job_id, "key": mine.key}
    assert engine.prepare(mine).handle["dir"] == mine.handle["dir"]  # the same job again: idempotent

    impostor = RemoteJob(mine.job_id, uuid.uuid4().hex, {})  # same id, other work: not this folder's job
    with pytest.raises(EngineError, match="belongs to another job"):
        engine.prepare(impostor)
    assert read(mine, "job.json") == marker
    engine.cleanup(mine)


def test_cleanup_removes_only_the_folder_its_job_json_names(engine_and_reader) -> None:
    engine, read = engine_and_reader
    mine = engine.prepare(_job())
    other = RemoteJob(f"{mine.job_id}-other", mine.key, dict(mine.handle))  # pointed at a folder not its own
    with pytest.raises(EngineError, match="belongs to another job"):
        engine.cleanup(other)
    assert read(mine, "job.json") is not None

    engine.cleanup(mine)
    assert read(mine, "job.json") is None
    engine.cleanup(mine)  # gone already: nothing to do, no error


def test_a_job_id_that_is_not_a_plain_name_never_reaches_the_machine(tmp_path: Path) -> None:
    engine = LocalEngine("local", "localhost", {}, EngineContext(lambda name: None, tmp_path))
    for bad in ("../escape", "a b", "-rf", "x;rm"):
        with pytest.raises(EngineError, match="plain name"):
            engine.prepare(RemoteJob(bad, "k", {}))
    assert list(tmp_path.iterdir()) == []
