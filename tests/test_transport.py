"""A kind is a transport and a launcher: one written here, in a few lines, gets the whole far side.

The transport below reaches "a machine" that is this computer under another home folder, through
``env`` as its client program (as a ``kubectl exec`` or ``docker exec`` transport would start its
client: only ``argv`` differs from the local transport): nothing of ssh, nothing of the local kind's
engine. If ``ShellEngine`` leaned on either, the job below could not be prepared, sent, run,
watched, read, fetched and removed.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from test_engine_ssh import input_file

from jupyter_remote_compute.engines.base import EngineContext, EngineError, Features, LaunchSpec, RemoteJob
from jupyter_remote_compute.engines.local import LocalEngine
from jupyter_remote_compute.engines.shell import ShellEngine
from jupyter_remote_compute.engines.transport import (
    FEED_IN_THREAD,
    LocalTransport,
    Transport,
)


class OtherHomeTransport(LocalTransport):
    """Every call is ``env HOME=<home> sh -c <command>``: a client program in front of the shell."""

    transport_name = "other-home"

    def __init__(self, name: str, home: Path) -> None:
        super().__init__(name)
        self.home = home

    def argv(self, command: str) -> list[str]:
        return ["env", f"HOME={self.home}", "sh", "-c", command]


class OtherHomeEngine(ShellEngine):
    """The whole kind: a transport and a base folder; the far side and the launcher are the shared ones."""

    kind = "other-home"
    label = "Another home"
    features = Features()

    def make_transport(self) -> Transport:
        return OtherHomeTransport(self.name, Path(self.address))

    def default_base_dir(self) -> str:
        return "~/.far"


def wait_for_exit(engine: ShellEngine, job: RemoteJob, deadline: float = 30.0) -> int:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        status = engine.poll([job])[job.job_id]
        if status.state == "exited":
            assert status.exit_code is not None
            return status.exit_code
        time.sleep(0.05)
    raise AssertionError(f"job {job.job_id} did not exit within {deadline}s")


def test_a_kind_written_as_only_a_transport_runs_a_whole_job(tmp_path: Path) -> None:
    home = tmp_path / "far-home"
    home.mkdir()
    engine = OtherHomeEngine("elsewhere", str(home), {}, EngineContext(lambda name: None, tmp_path / "scratch"))
    facts = engine.check()
    assert facts["transport"] == "other-home" and facts["cpus"] >= 1

    job = engine.prepare(RemoteJob(f"job-{uuid.uuid4().hex[:8]}", "k" * 8, {}))
    # The base folder is "~/.far" as the transport's machine sees ~, not this process's HOME.
    assert Path(job.handle["dir"]).parent == (home / ".far" / "jobs").resolve()

    src = tmp_path / "src"
    files = [input_file(src, "data/in.txt", b"through another transport\n")]
    stats = engine.send(job, files)
    assert stats.files_sent == 1 and stats.bytes_sent == len(b"through another transport\n")
    started = engine.start(
        job,
        LaunchSpec(
            command='echo started; tr a-z A-Z < data/in.txt > out.txt; echo "$GREETING"',
            env={"GREETING": "hello"},
            secret_env={},
        ),
    )
    assert isinstance(started.handle["pid"], int)
    assert wait_for_exit(engine, started) == 0
    assert engine.read_log(started, 0, 1 << 20) == b"started\nhello\n"
    assert engine.read_log(started, 8, 3) == b"hel"

    fetched = engine.fetch(started, ["out.txt"], tmp_path / "back")
    assert (tmp_path / "back" / "work" / "out.txt").read_bytes() == b"THROUGH ANOTHER TRANSPORT\n"
    assert set(fetched.digests) == {"out.txt"}

    # A second send of the same set costs nothing: the input cache is the transport's machine's.
    again = engine.prepare(RemoteJob(f"job-{uuid.uuid4().hex[:8]}", "k" * 8, {}))
    assert engine.send(again, files).files_sent == 0
    assert (home / ".far" / "cache").is_dir()

    engine.cleanup(started)
    assert not Path(started.handle["dir"]).exists()
    with pytest.raises(EngineError, match="job directory is missing"):
        engine.read_log(started, 0, 10)  # a removed job reads as removed, not as a quiet one
    assert engine.transport.channels_opened > 0


def test_the_local_transport_carries_a_long_stdin_and_the_far_sides_words(tmp_path: Path) -> None:
    transport = LocalTransport("here")
    data = os.urandom(FEED_IN_THREAD * 3)  # fed from a thread while the answer streams back
    res = transport.run("cat; echo done >&2; exit 7", data)
    assert res.code == 7 and res.out == data and res.err == b"done\n"
    assert "exit code 7" in res.error("echoing") and "done" in res.error("echoing")


def test_a_local_job_with_no_log_yet_reads_empty_and_a_removed_one_is_an_error(tmp_path: Path) -> None:
    engine = LocalEngine("local", "", {}, EngineContext(lambda name: None, tmp_path))
    job = engine.prepare(RemoteJob("job-nolog", "k" * 8, {}))
    assert engine.read_log(job, 0, 100) == b""
    engine.cleanup(job)
    with pytest.raises(EngineError, match="job directory is missing"):
        engine.read_log(job, 0, 100)
