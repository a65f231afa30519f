"""The job state file under concurrent writers, and what happens when it is damaged."""

from __future__ import annotations

import errno
import gc
import json
import subprocess
import sys
import textwrap
import threading
import weakref
from pathlib import Path

import pytest
from waiting import wait_for

from jupyter_remote_compute.jobs.job import Job
from jupyter_remote_compute.jobs.store import JobStore, StoreUnreadable
from jupyter_remote_compute.jobs.transitions import move

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from jupyter_remote_compute.jobs.spec import JobSpec
    from jupyter_remote_compute.jobs.service import JobService
    from jupyter_remote_compute.workspace import Workspace

    root, tag, gate = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    service = JobService(Workspace(root))
    (gate.parent / f"ready-{tag}").touch()
    while not gate.exists():  # a barrier across processes: every writer starts at once
        time.sleep(0.001)
    began = time.monotonic()
    for i in range(50):
        service.submit(JobSpec.from_json({"command": f"echo {tag}-{i}"}))
    print(began, time.monotonic())
    """
)


def test_three_processes_submitting_fifty_jobs_each_lose_nothing(workspace: Path, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(workspace), f"p{n}", str(gate)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(3)
    ]
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 3, timeout=120, message="three writers at the barrier")
    gate.touch()
    spans = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err.decode()
        spans.append(tuple(map(float, out.split())))
    # The writers really overlapped: the last to begin began before the first to end ended.
    assert max(begin for begin, _ in spans) < min(end for _, end in spans)
    # Read as a process that starts now would: the file and its journal.
    stored = JobStore(workspace / ".punica/jobs.json").jobs()
    commands = sorted(job.spec.command for job in stored.values())
    assert commands == sorted(f"echo p{n}-{i}" for n in range(3) for i in range(50))
    assert len(stored) == 150
    assert not list((workspace / ".punica").glob("*.tmp"))


def test_an_unreadable_state_file_is_moved_aside_and_reported(workspace: Path) -> None:
    path = workspace / ".punica/jobs.json"
    path.write_text('{"schema": 1, "jobs": {"x": ')
    store = JobStore(path)
    assert store.jobs() == {}
    assert store.recovered_from is not None
    assert store.recovered_from.read_text() == '{"schema": 1, "jobs": {"x": '  # kept, byte for byte
    # The store works again, and a new job is written to a fresh file.
    with store.transaction() as jobs:
        jobs["a"] = Job(id="a", key="k", machine="local", kind="local", spec={"command": "true"})
    assert set(JobStore(path).jobs()) == {"a"}


def _waiting_for_the_file_lock(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        code = frame.f_code
        if "filelock" in code.co_filename or (code.co_filename.endswith("fsutil.py") and code.co_name == "acquire"):
            return True
        frame = frame.f_back
    return False


def test_a_reader_finding_the_file_broken_does_not_deadlock_a_writer_of_the_same_store(workspace: Path) -> None:
    """The reader waits for the file lock to move the file aside; a transaction holding it must still commit."""
    path = workspace / ".punica/jobs.json"
    store = JobStore(path)
    inside, go = threading.Event(), threading.Event()

    def write() -> None:
        with store.transaction() as jobs:
            inside.set()
            go.wait(30)
            jobs["a"] = Job(id="a", key="k", machine="local", kind="local", spec={"command": "true"})

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert inside.wait(10)
    path.write_text('{"schema": 1, "jobs": {"x": ')  # broken (by hand, say) while the writer holds the lock
    reader = threading.Thread(target=store.jobs, daemon=True)
    reader.start()
    wait_for(lambda: _waiting_for_the_file_lock(reader), 10, "the reader to wait for the file lock")
    go.set()
    writer.join(15)
    reader.join(15)
    assert not writer.is_alive() and not reader.is_alive(), "deadlocked"
    assert set(JobStore(path).jobs()) == {"a"}  # the writer's commit stands


def test_a_file_from_a_newer_version_is_left_alone_and_reported(workspace: Path) -> None:
    path = workspace / ".punica/jobs.json"
    path.write_text('{"schema": 99, "jobs": {}}')
    store = JobStore(path)
    with pytest.raises(StoreUnreadable) as info:
        store.jobs()
    assert "newer" in info.value.message
    with pytest.raises(StoreUnreadable), store.transaction():
        pass
    assert path.read_text() == '{"schema": 99, "jobs": {}}'


def test_a_write_that_keeps_inode_size_and_mtime_is_still_seen_by_a_writer(workspace: Path) -> None:
    """write-rename may bring back the same inode, size and (coarse) mtime: a writer compares the journal generation."""
    import os

    path = workspace / ".punica/jobs.json"
    store = JobStore(path)
    with store.transaction() as jobs:
        jobs["a"] = Job(id="a", key="k", machine="local", kind="local", spec={"command": "true"}, state="running")
    st = path.stat()
    # Another process's compaction (a new journal generation) of the same size, in place, with the
    # mtime a coarse clock would give.
    old_generation = json.loads(path.read_text())["journal"]
    with open(path, "r+b") as f:
        data = f.read().replace(b'"running"', b'"sending"').replace(old_generation.encode(), b"f" * len(old_generation))
        f.seek(0)
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_ino, path.stat().st_size, path.stat().st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    with store.transaction() as jobs:
        seen = jobs["a"].state
    assert seen == "sending"


def test_a_reader_sees_changes_made_by_another_store(workspace: Path) -> None:
    path = workspace / ".punica/jobs.json"
    reader, writer = JobStore(path), JobStore(path)
    assert reader.jobs() == {}
    with writer.transaction() as jobs:
        jobs["a"] = Job(id="a", key="k", machine="local", kind="local", spec={"command": "true"})
    assert set(reader.jobs()) == {"a"}
    with writer.transaction() as jobs:
        move(jobs["a"], "sending")
    assert reader.get("a").state == "sending"


def test_a_transaction_changes_only_its_own_view_until_it_commits(workspace: Path) -> None:
    """The transaction's map lies over the shared snapshot: what it looks up, sets and removes shows
    in the map at once and in the store after the commit, and never in a snapshot a reader holds."""
    store = JobStore(workspace / ".punica/jobs.json")
    with store.transaction() as jobs:
        for job_id in "abc":
            jobs[job_id] = Job(id=job_id, key=job_id, machine="local", kind="local", spec={"command": "true"})
    before = store.jobs()
    with store.transaction() as jobs:
        move(jobs["a"], "sending")  # a looked-up job is the transaction's own copy
        assert jobs.pop("b").id == "b" and "b" not in jobs and jobs.pop("b", None) is None
        jobs["d"] = Job(id="d", key="d", machine="local", kind="local", spec={"command": "true"})
        del jobs["c"]
        jobs["c"] = Job(id="c", key="c2", machine="local", kind="local", spec={"command": "true"})
        assert sorted(jobs) == ["a", "c", "d"] and len(jobs) == 3
        assert {job_id: job.key for job_id, job in jobs.items()} == {"a": "a", "c": "c2", "d": "d"}
        assert sorted(j.id for j in jobs.unfinished()) == ["a", "c"]  # unfinished then, and in the map now
        assert before["a"].state == "queued" and set(before) == {"a", "b", "c"}
    after = store.jobs()
    assert {job_id: (job.key, job.state) for job_id, job in after.items()} == {
        "a": ("a", "sending"),
        "c": ("c2", "queued"),
        "d": ("d", "queued"),
    }
    assert before["a"].state == "queued" and set(before) == {"a", "b", "c"}
    assert JobStore(store.path).jobs() == after  # what was written is what this process holds


def test_a_store_that_reads_the_file_again_keeps_none_of_the_old_jobs_alive(workspace: Path) -> None:
    """The JSON text kept for each job (to write the file without serialising every job again) is
    forgotten with the jobs it was made from, once another process rewrote the file."""
    path = workspace / ".punica/jobs.json"
    server, other = JobStore(path), JobStore(path)
    with server.transaction() as jobs:
        for job_id in "abc":
            jobs[job_id] = Job(id=job_id, key=job_id, machine="local", kind="local", spec={"command": "true"})
    # That first change wrote the whole file (there was no journal yet): the server kept every job's text.
    old = weakref.ref(server.jobs()["a"])
    with other.transaction() as jobs:
        jobs["d"] = Job(id="d", key="d", machine="local", kind="local", spec={"command": "true"})
    other.compact()  # the file is new: the server parses it whole
    assert set(server.jobs()) == {"a", "b", "c", "d"}
    gc.collect()
    assert old() is None


def test_reading_a_big_state_file_starts_no_garbage_collection(workspace: Path) -> None:
    """Each full collection walks every object: during a parse of 100,000 jobs they took 2.5 s."""
    path = workspace / ".punica/jobs.json"
    with JobStore(path).transaction() as jobs:
        for i in range(3000):
            jobs[f"j{i}"] = Job(id=f"j{i}", key=str(i), machine="local", kind="local", spec={"command": "true"})
    started: list[int] = []

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(note)
    try:
        read = JobStore(path).jobs()
    finally:
        gc.callbacks.remove(note)
    assert len(read) == 3000
    # At most one, once the parse is over: the objects it made count towards the next collection.
    assert len(started) <= 1, started
    assert gc.isenabled()  # on again afterwards


def test_a_change_that_could_not_be_written_leaves_nothing_behind(workspace: Path, monkeypatch) -> None:
    """A full disk fails the commit; the same job changed and set again is then written as it is now."""
    store = JobStore(workspace / ".punica/jobs.json")
    with store.transaction() as jobs:
        jobs["seed"] = Job(id="seed", key="seed", machine="local", kind="local", spec={"command": "true"})
    job = Job(id="x", key="x", machine="local", kind="local", spec={"command": "true"})

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr("jupyter_remote_compute.jobs.store.os.fsync", disk_full)
        with pytest.raises(OSError), store.transaction() as jobs:
            jobs["x"] = job
    assert "x" not in store.jobs()
    move(job, "sending")
    with store.transaction() as jobs:
        jobs["x"] = job
    assert store.get("x").state == "sending"
    assert JobStore(store.path).get("x").state == "sending"  # what is on disk, read by another process


def test_state_file_is_private_to_its_owner(workspace: Path) -> None:
    store = JobStore(workspace / ".punica/jobs.json")
    with store.transaction() as jobs:
        jobs["a"] = Job(id="a", key="k", machine="local", kind="local", spec={"command": "true"})
    assert (workspace / ".punica/jobs.json").stat().st_mode & 0o077 == 0


# A job as 0.1.0 wrote it (one field per line here for reading; the file holds it on one line).
OLD_JOB = {
    "id": "20261130-080000-abcdef", "key": "k1", "machine": "box", "kind": "ssh",
    "spec": {"machine": "box", "command": ["python", "train.py"], "send": ["train.py", "data/"],
             "bring_back": ["model.pkl"], "env": {"SEED": "1", "TOKEN": "secret:team/token"}, "timeout": 7200.0,
             "name": "", "key": None},
    "state": "collecting", "reason": None, "created": "2026-11-30T08:00:00.000Z",
    "updated": "2026-11-30T08:05:00.000Z", "started": "2026-11-30T08:00:02.000Z", "ended": None,
    "machine_snapshot": {"kind": "ssh", "address": "gpu", "options": {"port": 22}}, "handle": {"dir": "/x"},
    "exit_code": 0, "outcome": {"state": "succeeded", "reason": None, "reach_machine": True},
    "cancel_requested": None, "outputs": {}, "inputs": {"files": 2, "bytes": 10}, "transfer": {},
    "mlflow_run_id": None, "log_size": 12, "lease": None, "retries": 0, "failing_since": None,
}  # fmt: skip


def test_a_stored_job_is_read_into_typed_records_and_written_back_the_same(workspace: Path) -> None:
    path = workspace / ".punica/jobs.json"
    old = {"id": "20261130-070000-000000", **{k: v for k, v in OLD_JOB.items() if k != "id"}}
    raw = json.dumps({"schema": 1, "jobs": {old["id"]: old, OLD_JOB["id"]: OLD_JOB}}, separators=(",", ":"))
    path.write_text(raw)
    store = JobStore(path)
    job = store.get(OLD_JOB["id"])
    assert job.spec.command == ("python", "train.py") and job.spec.timeout == 7200.0
    assert job.spec.secret_refs() == {"TOKEN": "team/token"} and job.outcome.state == "succeeded"
    assert job.name == "python train.py"
    assert job.to_json() == OLD_JOB and list(job.to_json()["spec"]) == list(OLD_JOB["spec"])
    # Touching one job serialises only that one; the other keeps its bytes. (A schema-1 file has no
    # journal yet, so this first change writes the file again, naming one.)
    with store.transaction() as jobs:
        jobs[OLD_JOB["id"]].log_size = 13

    def fragment(job: dict) -> str:
        return json.dumps(job, separators=(",", ":"))

    written = path.read_text()
    assert json.loads(written)["schema"] == 2 and isinstance(json.loads(written)["journal"], str)
    assert fragment(old) in written and fragment({**OLD_JOB, "log_size": 13}) in written
