"""SIGKILL a real `jupyter server` where a long job's recovery could lose or double something, and start
it again.

In the middle of putting a retried job back in the queue: the attempt that ended is metered once, the
job gets exactly one next attempt, its command runs once per attempt, and its attempts are one MLflow
run. The point is reached through something the test can see: the test bed's ``sh`` (first on the
server's PATH, nowhere in the product) holds the far side's ``cleanup.sh``, which the requeue runs after
metering the ended attempt and before the job goes back to the queue, until the test has killed the server.

While a checkpoint comes home (the server has the look's incoming folder open, in /proc): the set at
home stays the last whole one, and the next server brings the new one home whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import job_runs
from recorders import OwnRecorder
from server_process import Server, open_files
from waiting import wait_for

from jupyter_remote_compute.jobs.store import JobStore
from jupyter_remote_compute.usage.ledger import UsageRecord

# Test bed only: a stand-in for /bin/sh that holds the far side's cleanup once, when the test arms it.
HOLDING_SH = """\
#!/bin/sh
faults={faults}
# The far-side scripts come as `sh -c SCRIPT sh ARGS…`: cleanup.sh is the one that says this.
case "${{1:-}} ${{2:-}}" in
"-c "*"is not a job directory (no job.json)"*)
  if mv "$faults/arm-cleanup" "$faults/claimed-cleanup" 2>/dev/null; then
    touch "$faults/held-cleanup"
    # The local kind's shell outlives a killed server: the test releases it once the server is gone.
    while [ ! -e "$faults/release" ]; do sleep 0.05; done
    exit 1
  fi ;;
esac
exec /bin/sh "$@"
"""


@pytest.fixture
def server(
    workspace: Path, tmp_path: Path, scratch_dir: Path, tracking_uri: str, own_recorder: OwnRecorder
) -> Iterator[Server]:
    faults, bin_dir = tmp_path / "faults", tmp_path / "bin"
    faults.mkdir()
    bin_dir.mkdir()
    (bin_dir / "sh").write_text(HOLDING_SH.format(faults=faults))
    (bin_dir / "sh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **own_recorder.env}
    server = Server(workspace, scratch_dir, tracking_uri, tmp_path / "server.log", env=env)
    yield server
    server.stop()
    (faults / "release").touch()


def test_a_server_killed_while_it_requeues_an_attempt_resumes_without_a_second_one(
    server: Server, workspace: Path, tmp_path: Path, tracking_uri: str
) -> None:
    faults, runs, marker = tmp_path / "faults", tmp_path / "runs", tmp_path / "failed-once"
    (faults / "arm-cleanup").touch()
    server.start()
    command = f"echo ran >> {runs}; test -e {marker} || {{ touch {marker}; exit 3; }}"
    spec = {"command": command, "retry": {"max": 3, "on": ["failed"]}}
    job_id = server.request("POST", "jobs", spec)["job"]["id"]
    wait_for(lambda: (faults / "held-cleanup").exists(), 120, "the requeue to be removing the far folder")
    server.kill()
    (faults / "release").touch()

    def on_disk() -> dict:
        return JobStore(workspace / ".punica/jobs.json").get(job_id).to_json()

    usage = UsageRecord(workspace / ".punica/usage.jsonl")
    # Killed in the middle: the ended attempt metered, the job not yet back in the queue.
    assert on_disk()["state"] == "collecting" and not on_disk().get("attempts")
    assert [(a.attempt, a.state) for a in usage.attempts_of(job_id)] == [(1, "requeued")]

    server.start()
    done = wait_for(lambda: (j := on_disk())["state"] in ("succeeded", "failed", "lost") and j, 180, "the job to end")
    assert done["state"] == "succeeded", done["reason"]
    assert [(a["machine"], a["end"]) for a in done["attempts"]] == [("local", "failed"), ("local", "succeeded")]
    assert runs.read_text() == "ran\nran\n"  # the command ran once per attempt
    assert [(a.attempt, a.state) for a in usage.attempts_of(job_id)] == [(1, "requeued"), (2, "succeeded")]
    wait_for(lambda: on_disk().get("mlflow_run_id"), 120, "the job's MLflow run")
    (run,) = job_runs(tracking_uri, job_id)
    assert run.data.tags["remote_compute.attempts"] == "2" and run.info.status == "FINISHED"


BIG_CHECKPOINT = 768 << 20  # sparse on the far side: made at once, long enough to fetch to be seen doing it


def test_a_server_killed_while_a_checkpoint_comes_home_leaves_the_last_whole_set(
    server: Server, workspace: Path, tmp_path: Path
) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    server.start()
    d = '"$REMOTE_COMPUTE_CHECKPOINT_DIR"'
    command = (
        f"echo one > {d}/a.tmp && mv {d}/a.tmp {d}/a.txt; while [ ! -e {gates}/big ]; do sleep 0.05; done; "
        f"truncate -s {BIG_CHECKPOINT} {d}/big.tmp && mv {d}/big.tmp {d}/big.pt; "
        f"while [ ! -e {gates}/end ]; do sleep 0.05; done"
    )
    spec = {"command": command, "checkpoints": "ckpt", "checkpoint_every": 0.5}
    job_id = server.request("POST", "jobs", spec)["job"]["id"]
    home = workspace / ".punica/checkpoints" / job_id
    incoming = str(workspace / ".punica/jobs" / job_id / "checkpoints-incoming")
    wait_for(lambda: (home / "a.txt").is_file(), 120, "the first set to come home")
    (gates / "big").touch()
    wait_for(lambda: any(incoming in f for f in open_files(server.pid)), 120, "the server to be fetching big.pt")
    server.kill()
    # The set at home is the last whole one: the file being fetched is not in it, not even in part.
    assert sorted(p.name for p in home.iterdir()) == ["a.txt"]

    server.start()
    wait_for(lambda: (home / "big.pt").is_file(), 120, "the next server to bring the set home")
    assert (home / "big.pt").stat().st_size == BIG_CHECKPOINT
    assert sorted(p.name for p in home.iterdir()) == ["a.txt", "big.pt"]
    (gates / "end").touch()
    wait_for(lambda: server.request("GET", f"jobs/{job_id}")["state"] == "succeeded", 120, "the job to succeed")
    sets = workspace / ".punica/checkpoints/.sets"
    assert not [p.name for p in sets.iterdir() if p.name.endswith(".part")]  # no half set left behind
