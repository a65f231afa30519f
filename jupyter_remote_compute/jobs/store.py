"""The job state file: every job of a workspace, shared by every process that uses it.

The server, a kernel running the magic, the CLI and a pipeline runner all read
and change ``.punica/jobs.json`` at once. Every change happens inside
``transaction()``: an inter-process lock, a fresh read, the change, then one
checksummed line appended to the journal beside the file (``jobs.json.journal``)
and fsynced. Readers replay the journal from where they last stopped, so a
change costs its own size, not the file's. Once the journal outgrows a share of
the file, the next writer compacts: the file is written again (temp, fsync,
rename) naming a fresh journal, then that journal replaces the old one. The file
and the journal each name the journal generation they belong to, so a journal
left over from a compaction that was cut short is recognised and ignored.
A file that cannot be read is moved aside (kept, never deleted) and reported.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from filelock import Timeout

from ..errors import NotFound, RemoteComputeError
from ..fsutil import SharedFileLock, atomic_write, private_dir
from .job import Job
from .journal import JOURNAL_SUFFIX, frame, journal_head, read_head, unframe
from .snapshot import RECENT_DELTAS, Delta, FragmentCache, JobMap, Layers, Snapshot, job_in, whole_map, with_changes
from .transitions import ACTIVE_STATES

#: 2: the file names its journal (``"journal"``) on its first line; 1 (no journal) is still read.
SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
#: Compact once the journal is larger than both of these: a compaction rewrites the whole file, so
#: waiting until the journal is a fixed share of it keeps the rewrite's cost per change constant.
COMPACT_MIN_BYTES = 256 * 1024
COMPACT_SHARE = 0.25
UNREADABLE = ".unreadable-"  # jobs.json.unreadable-<time>: a state file that could not be read, kept
LOCK_TIMEOUT = 30.0

log = logging.getLogger(__name__)


class _WriterNeeded(Exception):
    """A reader found the state file broken: it is moved aside only under the file lock."""


class StoreUnreadable(RemoteComputeError):
    code = "state_file_unreadable"
    status = 500


class _CollectorPause:
    """The cyclic garbage collector off while a state file is parsed, in whichever threads parse at once.

    Parsing makes a few objects per job, each batch of which would start a collection; the full ones
    walk every object made so far: eleven, 2.5 s in all, while a server read a 100,000-job file. Jobs
    hold no reference cycles, so nothing waits for the collector meanwhile.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._resume = False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._resume:
                    gc.enable()


_collector_paused = _CollectorPause()


class JobStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal_path = path.with_name(path.name + JOURNAL_SUFFIX)
        self._lock = SharedFileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT)
        # Threads of one process refresh one after another, so each journal line is replayed once.
        self._refreshing = threading.RLock()
        self._generations = itertools.count(1)
        self._snapshot = Snapshot(None, None, ({}, {}))
        self._fragments = FragmentCache()
        #: Set when a broken state file was moved aside, for the API and CLI to report.
        self.recovered_from: Path | None = None

    def _new_snapshot(
        self,
        token: tuple[int, int, int] | None,
        base_id: str | None,
        layers: Layers,
        delta: Delta | None = None,
        journal_end: int | None = None,
        base_size: int = 0,
        previous: Snapshot | None = None,
    ) -> Snapshot:
        generation = next(self._generations)
        recent: tuple[tuple[int, Delta], ...] = ()
        if delta is not None and previous is not None and previous.generation == delta.base:
            recent = ((generation, delta), *previous.recent[: RECENT_DELTAS - 1])
            # Patched from the change: a look at every job costs tens of milliseconds at 100,000.
            changed = delta.touched | delta.removed
            active = (previous.active - changed) | {
                i for i in delta.touched if (job := job_in(layers, i)) is not None and job.state in ACTIVE_STATES
            }
        else:
            layers = (whole_map(layers), {})
            active = frozenset(i for i, job in layers[0].items() if job.state in ACTIVE_STATES)
        if delta is None:
            # Every job is a new object now: texts kept for the old ones would only hold them in memory.
            self._fragments.clear()
        return Snapshot(token, base_id, layers, generation, delta, journal_end, base_size, recent, active)

    # -- reading ----------------------------------------------------------
    def _stat_token(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    @staticmethod
    def _parse(raw_bytes: bytes) -> tuple[dict[str, Job], str | None]:
        """The jobs in a state file's bytes and the journal generation it names (None: schema 1)."""
        with _collector_paused():
            return JobStore._parse_jobs(raw_bytes)

    @staticmethod
    def _parse_jobs(raw_bytes: bytes) -> tuple[dict[str, Job], str | None]:
        raw = json.loads(raw_bytes)
        if not isinstance(raw, dict) or not isinstance(raw.get("jobs"), dict):
            raise ValueError("no 'jobs' object")
        schema = raw.get("schema")
        if isinstance(schema, int) and schema > SCHEMA_VERSION:
            # A newer version's file is not broken: leave it for that version and say so.
            raise StoreUnreadable(
                f"the job state file was written by a newer jupyter-remote-compute (schema {schema}); "
                "upgrade this installation to use it"
            )
        if schema not in READABLE_SCHEMAS:
            raise ValueError(f"schema {schema!r}, this version reads {READABLE_SCHEMAS}")
        base_id = raw.get("journal") if schema >= 2 else None
        if base_id is not None and not isinstance(base_id, str):
            raise ValueError(f"'journal' is {base_id!r}, expected a string")
        return {job_id: Job.from_json(data) for job_id, data in raw["jobs"].items()}, base_id

    def _refresh(self, *, locked: bool) -> Snapshot:
        """The file and its journal as on disk now, read again only as far as they changed."""
        try:
            with self._refreshing:
                for _ in range(5):
                    replayed = self._replay(self._refresh_base(locked=locked))
                    if replayed is not None:
                        self._snapshot = replayed
                        return replayed
                # Compactions overtook every attempt (other processes writing fast): what was read is whole.
                return self._snapshot
        except _WriterNeeded:
            # The file lock is always taken before ``_refreshing`` (transactions, compaction): taking it
            # while holding ``_refreshing`` would deadlock against them, so it is taken after letting go.
            with self._locked():
                return self._refresh(locked=True)

    def _refresh_base(self, *, locked: bool) -> Snapshot:
        """The snapshot as of the state file itself, read again only if it changed since last seen.

        Readers trust the stat token; a writer holding the lock also compares the journal generation
        on the file's first line, since write-rename can bring back the same inode, size and (coarse)
        mtime. A file that names the point of the journal this process had read up to (it was
        compacted from exactly what this process holds) is taken without parsing it.
        """
        seen = self._snapshot
        token = self._stat_token()
        if token is not None and token == seen.token and not locked:
            return seen
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below, on every path
        except FileNotFoundError:
            token = None
        if token is None:
            if seen.token is None and seen.base_id is None and not seen.jobs:
                return seen
            self._snapshot = self._new_snapshot(None, None, ({}, {}))
            return self._snapshot
        with f:
            st = os.fstat(f.fileno())
            token = (st.st_ino, st.st_size, st.st_mtime_ns)
            head = read_head(f) or {}
            base_id = head.get("journal") if isinstance(head.get("journal"), str) else None
            if token == seen.token and base_id is not None and base_id == seen.base_id:
                return seen
            if (
                base_id is not None
                and seen.base_id is not None
                and seen.journal_end is not None
                and head.get("compacted") == f"{seen.base_id}:{seen.journal_end}"
            ):
                delta = Delta(seen.generation, frozenset(), frozenset())
                return self._new_snapshot(token, base_id, seen.layers, delta, None, st.st_size, previous=seen)
            f.seek(0)
            raw = f.read()
        try:
            jobs, base_id = self._parse(raw)
        except (ValueError, TypeError, KeyError) as e:
            if not locked:
                raise _WriterNeeded from e  # only a writer holding the lock may move the file aside
            self._snapshot = self._new_snapshot(None, None, (self._move_aside(e), {}))
            return self._snapshot
        self._snapshot = self._new_snapshot(token, base_id, (jobs, {}), None, None, len(raw))
        return self._snapshot

    def _replay(self, seen: Snapshot) -> Snapshot | None:
        """``seen`` with the journal lines appended since it was read; None: read the file again first."""
        if seen.base_id is None:
            return seen  # no file, or one from before the journal: nothing in a journal belongs to it
        try:
            f = open(self.journal_path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return seen
        with f:
            head = read_head(f) or {}
            if head.get("base") != seen.base_id:
                # Either a compaction was cut short after writing the file (the file holds everything,
                # this journal is ignored until the next writer replaces it), or the file was compacted
                # after this process read it (read the file again).
                return seen if self._stat_token() == seen.token else None
            start = seen.journal_end if seen.journal_end is not None else f.tell()
            if start > os.fstat(f.fileno()).st_size:
                # Shorter than what this process read: not a journal only ever appended to. Read it all again.
                seen.token = None
                return None
            f.seek(start)
            data = f.read()
        records, end = unframe(data, start)
        if not records:
            seen.journal_end = end  # this process's own bookkeeping: readers of the snapshot never look at it
            return seen
        changes: dict[str, Job | None] = {}
        touched: set[str] = set()
        removed: set[str] = set()
        for record in records:
            for job_id, data_of_job in record.get("put", {}).items():
                try:
                    changes[job_id] = Job.from_json(data_of_job)
                except (TypeError, ValueError, KeyError, AttributeError) as e:
                    log.error(
                        "job state journal %s: job %s could not be read (%s); skipped", self.journal_path, job_id, e
                    )
                    continue
                touched.add(job_id)
                removed.discard(job_id)
            for job_id in record.get("del", []):
                changes[job_id] = None
                removed.add(job_id)
                touched.discard(job_id)
        delta = Delta(seen.generation, frozenset(touched), frozenset(removed))
        self._fragments.forget(touched | removed)  # the replaced objects go, not only the removed ones
        return self._new_snapshot(
            seen.token, seen.base_id, with_changes(seen.layers, changes), delta, end, seen.base_size, previous=seen
        )

    def _move_aside(self, error: Exception) -> dict[str, Job]:
        stamp = f"{self.path.name}{UNREADABLE}{time.strftime('%Y%m%dT%H%M%S')}"
        aside = self.path.with_name(stamp)
        # Under the lock: a second broken file within the same second gets a name of its own, never the first's.
        for n in itertools.count(1):
            if not aside.exists():
                break
            aside = self.path.with_name(f"{stamp}-{n}")
        os.replace(self.path, aside)
        # Its journal goes with it (it holds changes to the jobs the broken file listed), out of the way.
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.journal_path, aside.with_name(aside.name.replace(UNREADABLE, JOURNAL_SUFFIX + UNREADABLE)))
        self.recovered_from = aside
        log.error("job state file %s could not be read (%s); moved it to %s", self.path, error, aside)
        return {}

    def set_aside(self) -> list[dict[str, str]]:
        """State files moved aside as unreadable (kept until someone deletes them), each with where it broke."""
        found = []
        for aside in sorted(self.path.parent.glob(f"{self.path.name}{UNREADABLE}*")):
            try:
                self._parse(aside.read_bytes())
                problem = "it reads now"
            except json.JSONDecodeError as e:
                problem = f"line {e.lineno}, column {e.colno}: {e.msg}"
            except (ValueError, TypeError, KeyError, RemoteComputeError) as e:
                problem = f"line 1: {e}"
            except OSError as e:
                problem = f"cannot be read: {e.strerror}"
            found.append(
                {
                    "path": str(aside),
                    "problem": problem,
                    "message": f"{self.path} could not be read ({problem}); it was moved to {aside} and a new "
                    "state file started. Jobs it listed are not shown: look at it, then delete it.",
                }
            )
        return found

    def jobs(self) -> dict[str, Job]:
        """Every job by id, as on disk now. Shared: callers read it and must not change it."""
        return self.snapshot().jobs

    def snapshot(self) -> Snapshot:
        """The file as on disk now, with its generation (see ``Snapshot``). Shared: read only."""
        try:
            return self._refresh(locked=False)
        except Timeout:
            raise StoreUnreadable(f"{self.path}: another process holds its lock; try again") from None

    def active_jobs(self) -> list[Job]:
        """The unfinished jobs as on disk now, oldest first, without looking at the finished ones."""
        snapshot = self.snapshot()
        active = (job for i in snapshot.active if (job := snapshot.job(i)) is not None)
        return sorted(active, key=lambda j: (j.created, j.id))

    def get(self, job_id: str) -> Job:
        job = self.snapshot().job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r} in {self.path}")
        return job

    # -- changing ---------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        private_dir(self.path.parent)
        try:
            self._lock.acquire()
        except Timeout:
            raise StoreUnreadable(f"{self.path}: could not take its lock within {LOCK_TIMEOUT:.0f} s") from None
        try:
            yield
        finally:
            self._lock.release()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[JobMap]:
        """Lock, read what changed, let the caller change jobs, record the change (one journal line)."""
        with self._locked():
            snapshot = self._refresh(locked=True)
            jobs = JobMap(snapshot)
            yield jobs
            with self._refreshing:
                self._commit(snapshot, jobs)

    def compact(self) -> bool:
        """Fold the journal into the state file now (the server does at start); False if it held nothing."""
        with self._locked(), self._refreshing:
            seen = self._refresh(locked=True)
            if seen.token is None and not seen.jobs:
                return False
            if seen.base_id is not None and seen.journal_end == len(journal_head(seen.base_id)):
                return False
            self._compact(seen)
            return True

    def _commit(self, snapshot: Snapshot, jobs: JobMap) -> None:
        touched = {
            job_id
            for job_id in jobs.touched
            if (before := snapshot.job(job_id)) is None or jobs.stored(job_id) != before
        }
        removed = {job_id for job_id in jobs.removed if snapshot.job(job_id) is not None}
        if not touched and not removed:
            return
        after = jobs.merged()
        self._fragments.forget(removed)
        delta = Delta(snapshot.generation, frozenset(touched), frozenset(removed))
        try:
            self._write_change(snapshot, after, touched, removed, delta)
        except BaseException:
            # Texts made for a change that was not written must not outlive it: a caller that changes the
            # same object and sets it again would otherwise have the text of before written.
            self._fragments.forget(touched)
            raise

    def _write_change(
        self, snapshot: Snapshot, after: Layers, touched: set[str], removed: set[str], delta: Delta
    ) -> None:
        text = self._fragments.text
        puts = ",".join(f"{json.dumps(job_id)}:{text(job_id, job_in(after, job_id))}" for job_id in sorted(touched))
        line = frame('{"put":{' + puts + '},"del":' + json.dumps(sorted(removed)) + "}")
        limit = max(COMPACT_MIN_BYTES, snapshot.base_size * COMPACT_SHARE)
        if snapshot.base_id is None or snapshot.journal_end is None or len(line) > limit:
            # No journal of this file's yet (a new or schema-1 file, a compaction cut short), or a change
            # as large as a good share of the file: write the whole file.
            self._write_base(whole_map(after), None, delta, snapshot)
            return
        try:
            end = self._append(snapshot.journal_end, line)
        except FileNotFoundError:
            self._write_base(whole_map(after), None, delta, snapshot)
            return
        self._snapshot = self._new_snapshot(
            snapshot.token, snapshot.base_id, after, delta, end, snapshot.base_size, previous=snapshot
        )
        if end > limit:
            self._compact(self._snapshot)

    def _append(self, valid_end: int, line: bytes) -> int:
        """Append one line to the journal after its last intact line; the journal's new end."""
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            if size > valid_end:
                self._keep_damaged_tail(valid_end, size)
                os.ftruncate(fd, valid_end)
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError:
                # A full disk, say: take back what was written, so the next line starts on a clean end.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, valid_end)
                raise
        finally:
            os.close(fd)
        return valid_end + len(line)

    def _keep_damaged_tail(self, valid_end: int, size: int) -> None:
        with open(self.journal_path, "rb") as f:
            f.seek(valid_end)
            tail = f.read(size - valid_end)
        if b"\n" not in tail:
            # A writer died while appending its line: the change it was making never happened.
            log.warning("job state journal %s: dropped a torn last line (%d bytes)", self.journal_path, len(tail))
            return
        aside = self.journal_path.with_name(f"{self.journal_path.name}{UNREADABLE}{time.strftime('%Y%m%dT%H%M%S')}")
        atomic_write(aside, tail, mode=0o600)
        log.error(
            "job state journal %s: %d bytes after offset %d failed their checksum; moved them to %s",
            self.journal_path,
            len(tail),
            valid_end,
            aside,
        )

    def _compact(self, seen: Snapshot) -> None:
        compacted = None
        if seen.base_id is not None and seen.journal_end is not None:
            # Readers that had read the journal this far take the new file as it is, without parsing it.
            compacted = f"{seen.base_id}:{seen.journal_end}"
        unchanged = Delta(seen.generation, frozenset(), frozenset())
        self._write_base(seen.jobs, compacted, unchanged, seen)

    def _write_base(self, jobs: dict[str, Job], compacted: str | None, delta: Delta, previous: Snapshot) -> None:
        """Write the whole state file naming a fresh journal, then start that journal (under the lock)."""
        base_id = uuid.uuid4().hex
        text = self._fragments.text
        parts = [f"{json.dumps(job_id)}:{text(job_id, job)}" for job_id, job in jobs.items()]
        head = json.dumps({"schema": SCHEMA_VERSION, "journal": base_id, "compacted": compacted}, separators=(",", ":"))
        raw = (head[:-1] + '\n,"jobs":{' + ",".join(parts) + "}}").encode()
        atomic_write(self.path, raw, mode=0o600)
        token = self._stat_token()
        # Until this rename, the old journal names the old file: readers ignore it, the new file holds it all.
        first_line = journal_head(base_id)
        atomic_write(self.journal_path, first_line, mode=0o600)
        self._snapshot = self._new_snapshot(
            token, base_id, (jobs, {}), delta, len(first_line), len(raw), previous=previous
        )
