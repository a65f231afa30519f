"""Engines raise EngineError only, marked permanent or transient for what the fault really is.

A permanent fault (a folder that cannot be made) must end a job at once with a
reason naming it; only what can pass (a dropped connection) is retried.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sshd_fixture
from sshd_fixture import TestBed
from test_engine_ssh import make_engine, run_job, wait_exited
from tool_path import only_these_tools

from jupyter_remote_compute.engines.base import EngineContext, EngineError, RemoteJob
from jupyter_remote_compute.engines.local import LocalEngine

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
ssh_transport = sshd_fixture.ssh_transport


def new_job() -> RemoteJob:
    return RemoteJob(job_id=f"job-{uuid.uuid4().hex[:12]}", key=uuid.uuid4().hex, handle={})


def test_local_scratch_under_a_regular_file_is_a_permanent_fault(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way\n")
    engine = LocalEngine("local", "", {}, EngineContext(get_secret=lambda n: None, scratch_dir=blocker / "scratch"))
    with pytest.raises(EngineError) as err:
        engine.prepare(new_job())
    assert err.value.transient is False
    assert "cannot create the base folder" in str(err.value) and "Not a directory" in str(err.value)
    assert "scratch_dir" in str(err.value)  # the setting to change


def test_a_stray_error_inside_an_engine_leaves_as_a_permanent_engine_error(tmp_path: Path):
    engine = LocalEngine("local", "", {}, EngineContext(get_secret=lambda n: None, scratch_dir=tmp_path))
    # An offset that is no number: a TypeError inside the engine, never let out as such.
    with pytest.raises(EngineError, match="local: read log failed") as err:
        engine.read_log(RemoteJob("j", "k", {"dir": str(tmp_path)}), "0", 10)  # type: ignore[arg-type]
    assert err.value.transient is False
    assert isinstance(err.value.__cause__, TypeError)


def test_ssh_base_dir_under_a_regular_file_is_a_permanent_fault(
    ssh_agent_env: TestBed, tmp_path: Path, ssh_transport: str
):
    engine = make_engine(ssh_agent_env, tmp_path, transport=ssh_transport, base_dir="/etc/passwd/jrc")
    try:
        with pytest.raises(EngineError) as err:
            engine.prepare(new_job())
        assert err.value.transient is False
        assert "cannot create the base folder" in str(err.value) and "Not a directory" in str(err.value)
    finally:
        engine.close()


def test_ssh_bad_argument_is_a_permanent_engine_error(ssh_agent_env: TestBed, tmp_path: Path, ssh_transport: str):
    engine = make_engine(ssh_agent_env, tmp_path, transport=ssh_transport)
    try:
        with pytest.raises(EngineError, match="must not be negative") as err:
            engine.read_log(RemoteJob("j", "k", {"dir": "/nowhere"}), -1, 10)
        assert err.value.transient is False
    finally:
        engine.close()


def test_ssh_session_killed_during_a_fetch_is_transient(ssh_agent_env: TestBed, tmp_path: Path, ssh_transport: str):
    engine = make_engine(ssh_agent_env, tmp_path, transport=ssh_transport)
    try:
        job = run_job(engine, [], "head -c 33554432 /dev/zero > big.bin")
        assert wait_exited(engine, job).exit_code == 0
        killed: list[int] = []

        def kill_session(done: int, total: int) -> None:
            # The first chunk has arrived: cut the connection under the stream.
            if not killed:
                killed.extend(ssh_agent_env.sshd.cut_sessions())

        with pytest.raises(EngineError) as err:
            engine.fetch(job, ["big.bin"], tmp_path / "dest", kill_session)
        assert killed
        assert err.value.transient is True
        assert any(words in str(err.value) for words in ("lost", "no answer", "ended in the middle"))
    finally:
        engine.close()


def test_a_machine_without_tar_is_a_permanent_fault_naming_tar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    engine = LocalEngine("local", "", {}, EngineContext(get_secret=lambda n: None, scratch_dir=tmp_path / "s"))
    job = engine.prepare(new_job())
    (Path(job.handle["dir"]) / "work" / "out.txt").write_text("made\n")
    # Every tool manifest.sh uses except tar, and no python3 (which packs without tar).
    only_these_tools(tmp_path / "bin", ("sh", "find", "sha256sum", "du", "rm"), monkeypatch)
    with pytest.raises(EngineError, match="tar is not installed") as err:
        engine.fetch(job, ["out.txt"], tmp_path / "dest")
    assert err.value.transient is False
