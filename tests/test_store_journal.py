"""The state file's journal: torn lines, concurrent appends, compaction under readers."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from waiting import wait_for

from jupyter_remote_compute.jobs import snapshot as snapshot_module
from jupyter_remote_compute.jobs import store as store_module
from jupyter_remote_compute.jobs.job import Job
from jupyter_remote_compute.jobs.store import JobStore


def _job(job_id: str, state: str = "queued") -> Job:
    return Job(id=job_id, key=f"k-{job_id}", machine="local", kind="local", spec={"command": "true"}, state=state)


def _put(store: JobStore, *jobs: Job) -> None:
    with store.transaction() as stored:
        for job in jobs:
            stored[job.id] = job


@pytest.fixture
def path(workspace: Path) -> Path:
    return workspace / ".punica" / "jobs.json"


def test_a_change_is_one_journal_line_not_a_new_file(path: Path) -> None:
    store = JobStore(path)
    _put(store, _job("a"))  # the first change writes the file, naming its journal
    file_before = path.read_bytes()
    journal_before = store.journal_path.stat().st_size
    _put(store, _job("b"))
    with store.transaction() as jobs:
        jobs["a"] = dataclasses.replace(jobs["a"], state="running")
    assert path.read_bytes() == file_before
    lines = store.journal_path.read_bytes()[journal_before:].splitlines()
    assert len(lines) == 2 and b'"b"' in lines[0] and b'"running"' in lines[1]
    fresh = JobStore(path).jobs()
    assert set(fresh) == {"a", "b"} and fresh["a"].state == "running"


def test_a_torn_last_line_is_ignored_and_nothing_else_is_lost(path: Path) -> None:
    store = JobStore(path)
    _put(store, _job("a"))
    _put(store, _job("b"))
    reader = JobStore(path)
    assert set(reader.jobs()) == {"a", "b"}
    _put(store, _job("c"))
    whole = store.journal_path.read_bytes()
    # A writer died halfway through appending c's line: the bytes are there, the newline is not.
    store.journal_path.write_bytes(whole[: len(whole) - 20])
    assert set(JobStore(path).jobs()) == {"a", "b"} and set(reader.jobs()) == {"a", "b"}
    # The next writer drops the torn bytes before appending; c never happened, d did.
    _put(JobStore(path), _job("d"))
    assert set(JobStore(path).jobs()) == {"a", "b", "d"}
    assert store.journal_path.read_bytes().endswith(b"\n")
    assert not list(path.parent.glob("jobs.json.journal.unreadable-*"))
    # A reader that stopped at the torn line goes on from there.
    assert set(reader.jobs()) == {"a", "b", "d"}


def test_a_line_that_fails_its_checksum_ends_the_replay_and_is_kept_aside(path: Path) -> None:
    store = JobStore(path)
    _put(store, _job("a"))
    _put(store, _job("b"))
    data = bytearray(store.journal_path.read_bytes())
    at = data.rindex(b'"queued"')
    data[at + 1 : at + 7] = b"runnin"  # same length, complete line, wrong checksum
    store.journal_path.write_bytes(bytes(data))
    reader = JobStore(path)
    assert set(reader.jobs()) == {"a"}
    _put(reader, _job("c"))
    assert set(JobStore(path).jobs()) == {"a", "c"}
    [aside] = path.parent.glob("jobs.json.journal.unreadable-*")
    assert b"runnin" in aside.read_bytes()  # kept for someone to look at, never silently dropped


CONCURRENT = textwrap.dedent(
    """
    import dataclasses, sys, time
    from pathlib import Path
    from jupyter_remote_compute.jobs import store as store_module
    from jupyter_remote_compute.jobs.job import Job
    from jupyter_remote_compute.jobs.store import JobStore

    path, tag, gate, n = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    store_module.COMPACT_MIN_BYTES = 4096  # compact every few changes: readers meet compactions often
    store = JobStore(path)
    (gate.parent / f"ready-{tag}").touch()
    while not gate.exists():
        time.sleep(0.001)
    for i in range(n):
        job_id = f"{tag}-{i:03d}"
        with store.transaction() as jobs:
            jobs[job_id] = Job(id=job_id, key=job_id, machine="local", kind="local", spec={"command": "true"})
        if i % 3 == 0:
            with store.transaction() as jobs:
                jobs[job_id] = dataclasses.replace(jobs[job_id], state="running")
    """
)


def test_two_processes_append_and_compact_while_a_third_reads(path: Path, tmp_path: Path) -> None:
    gate, n = tmp_path / "go", 120
    _put(JobStore(path), _job("seed", state="succeeded"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT, str(path), tag, str(gate), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for tag in ("p", "q")
    ]
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, timeout=120, message="both writers at the barrier")
    reader = JobStore(path)
    seen: set[str] = set()
    journal_generations: set[str] = set()
    gate.touch()
    while any(proc.poll() is None for proc in procs):
        jobs = reader.jobs()
        # Whatever a compaction did meanwhile, a job once seen never disappears and none is half-read.
        assert seen <= set(jobs), sorted(seen - set(jobs))[:5]
        assert all(isinstance(job, Job) for job in jobs.values())
        seen = set(jobs)
        journal_generations.add(reader.snapshot().base_id or "")
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    expected = {"seed"} | {f"{tag}-{i:03d}" for tag in "pq" for i in range(n)}
    final = reader.jobs()
    assert set(final) == expected
    assert {job_id for job_id, job in final.items() if job.state == "running"} == {
        f"{tag}-{i:03d}" for tag in "pq" for i in range(0, n, 3)
    }
    assert JobStore(path).jobs().keys() == final.keys()
    assert len(journal_generations) > 2, "the reader met compactions while reading"
    assert not list(path.parent.glob("*.unreadable-*")) and not list(path.parent.glob("*.tmp"))


def test_a_reader_that_last_read_before_a_compaction_converges(path: Path, monkeypatch) -> None:
    monkeypatch.setattr(store_module, "COMPACT_MIN_BYTES", 1 << 30)  # compactions only when asked
    writer, reader = JobStore(path), JobStore(path)
    _put(writer, _job("a"), _job("b"))
    _put(writer, _job("c"))
    before = reader.jobs()
    assert set(before) == {"a", "b", "c"}

    # Compacted from exactly what the reader holds: the reader takes the new file without parsing it.
    assert writer.compact()
    assert json.loads(path.read_bytes())["compacted"] is not None
    assert reader.jobs() is before
    _put(writer, _job("d"))
    assert set(reader.jobs()) == {"a", "b", "c", "d"}

    # Changes the reader never read, folded into the file and followed by more journal lines.
    with writer.transaction() as jobs:
        jobs.pop("a")
        jobs["b"] = dataclasses.replace(jobs["b"], state="failed")
    assert writer.compact()
    _put(writer, _job("e"))
    after = reader.jobs()
    assert set(after) == {"b", "c", "d", "e"} and after["b"].state == "failed"
    assert writer.compact()  # e was in the journal
    assert not writer.compact()  # and now nothing is


def test_a_compaction_cut_short_leaves_the_old_journal_ignored(path: Path, monkeypatch) -> None:
    monkeypatch.setattr(store_module, "COMPACT_MIN_BYTES", 1 << 30)
    store = JobStore(path)
    _put(store, _job("x"))
    with store.transaction() as jobs:
        jobs["x"] = dataclasses.replace(jobs["x"], state="running")
    old_journal = store.journal_path.read_bytes()
    with store.transaction() as jobs:
        jobs["x"] = dataclasses.replace(jobs["x"], state="succeeded")
    store.compact()
    # As if the process died after writing the file but before starting its journal.
    store.journal_path.write_bytes(old_journal)
    assert JobStore(path).get("x").state == "succeeded"  # the stale "running" line is not replayed
    _put(JobStore(path), _job("y"))  # the next writer starts a journal of the file's own
    assert (
        json.loads(store.journal_path.read_bytes().splitlines()[0])["base"] == json.loads(path.read_bytes())["journal"]
    )
    fresh = JobStore(path).jobs()
    assert set(fresh) == {"x", "y"} and fresh["x"].state == "succeeded"


def test_a_schema_one_file_is_read_and_upgraded_by_its_first_change(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    old = {"schema": 1, "jobs": {"a": _job("a").to_json()}}
    path.write_text(json.dumps(old))
    store = JobStore(path)
    assert set(store.jobs()) == {"a"}
    _put(store, _job("b"))
    written = json.loads(path.read_bytes())
    assert written["schema"] == store_module.SCHEMA_VERSION and set(written["jobs"]) == {"a", "b"}
    assert set(JobStore(path).jobs()) == {"a", "b"}


def test_changes_since_an_older_snapshot_span_commits_and_replays(path: Path) -> None:
    """What a list index or the event watch that looked a few snapshots ago needs to patch itself."""
    store, other = JobStore(path), JobStore(path)
    _put(store, _job("a"), _job("b"))
    start = store.snapshot().generation
    _put(store, _job("c"))  # this process's commit
    _put(other, _job("d"))  # another's, replayed below
    with other.transaction() as jobs:
        jobs.pop("a")
        jobs["b"] = dataclasses.replace(jobs["b"], state="running")
    now = store.snapshot()
    delta = now.changes_since(start)
    assert delta is not None and delta.touched == {"b", "c", "d"} and delta.removed == {"a"}
    assert now.changes_since(now.generation) == snapshot_module.Delta(now.generation, frozenset(), frozenset())
    assert now.changes_since(-1) is None  # from before any snapshot it knows: rebuild


def test_the_unfinished_jobs_follow_commits_replays_and_compactions(path: Path, monkeypatch) -> None:
    """The poller and submit's same-work check read ``active`` instead of every job: it must never drift."""
    monkeypatch.setattr(store_module, "COMPACT_MIN_BYTES", 1 << 30)  # compactions only when asked
    store, other = JobStore(path), JobStore(path)

    def unfinished_by_looking(s: JobStore) -> set[str]:
        return {job_id for job_id, job in s.jobs().items() if job.active}

    _put(store, _job("a"), _job("b", "succeeded"), _job("c", "running"))
    assert store.snapshot().active == {"a", "c"} == unfinished_by_looking(JobStore(path))
    with other.transaction() as jobs:  # another process: a job ends, one is removed, one starts
        jobs["a"] = dataclasses.replace(jobs["a"], state="failed")
        jobs.pop("c")
        jobs["d"] = _job("d", "sending")
    assert store.snapshot().active == {"d"}  # replayed
    with store.transaction() as jobs:
        jobs["b"] = dataclasses.replace(
            jobs["b"], state="queued"
        )  # finished, then queued again (a retried collection, say)
        assert [j.id for j in jobs.unfinished()] == ["d"]  # as the transaction began
    assert store.snapshot().active == {"b", "d"}
    assert other.compact()
    _put(other, _job("e", "pending"))
    assert store.snapshot().active == {"b", "d", "e"} == unfinished_by_looking(JobStore(path))
    assert [j.id for j in store.active_jobs()] == sorted(["b", "d", "e"], key=lambda i: (store.get(i).created, i))


def test_changes_kept_over_a_shared_map_read_the_same_as_the_file_across_folds(path: Path, monkeypatch) -> None:
    """A commit adds its change to the snapshot's layers instead of copying every job; every FOLD_AT changes
    they are folded into a new map. Whatever the layers, each snapshot reads as the file does, and one
    taken earlier keeps reading as it did then."""
    monkeypatch.setattr(snapshot_module, "FOLD_AT", 5)
    writer, reader = JobStore(path), JobStore(path)  # the reader follows by replaying the journal
    expected: dict[str, str] = {}
    kept: list[tuple[object, dict[str, str]]] = []
    for i in range(40):
        with writer.transaction() as jobs:
            jobs[f"j{i}"] = _job(f"j{i}")
            expected[f"j{i}"] = "queued"
            if i % 3 == 0 and i:
                jobs[f"j{i - 1}"] = dataclasses.replace(jobs[f"j{i - 1}"], state="running")
                expected[f"j{i - 1}"] = "running"
            if i % 4 == 0 and i:
                del jobs[f"j{i - 2}"]
                expected.pop(f"j{i - 2}")
            if i % 10 == 9:
                jobs[f"j{i - 5}"] = _job(f"j{i - 5}", "succeeded")  # removed earlier or not: put back either way
                expected[f"j{i - 5}"] = "succeeded"
        for store in (writer, reader):
            snapshot = store.snapshot()
            assert {i: snapshot.job(i).state for i in expected} == expected  # type: ignore[union-attr]
            assert all(snapshot.job(f"j{k}") is None for k in range(i + 1) if f"j{k}" not in expected)
            assert snapshot.active == {i for i, s in expected.items() if s in store_module.ACTIVE_STATES}
        if i % 7 == 0:
            kept.append((writer.snapshot(), dict(expected)))
            assert {i: j.state for i, j in reader.jobs().items()} == expected  # made whole mid-way too
    assert {i: j.state for i, j in JobStore(path).jobs().items()} == expected  # a fresh read of the file
    assert {i: j.state for i, j in writer.jobs().items()} == expected
    for snapshot, then in kept:
        assert {i: j.state for i, j in snapshot.jobs.items()} == then  # type: ignore[attr-defined]
    with writer.transaction() as jobs:  # a transaction iterating every job sees the same
        assert {j.id: j.state for j in jobs.values()} == expected and len(jobs) == len(expected)
