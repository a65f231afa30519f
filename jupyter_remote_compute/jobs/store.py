"""The job state file: every job of a workspace, shared by every process that uses it.

The server, a kernel running the magic, the CLI and a pipeline runner all read
and change ``.punica/jobs.json`` at once. Every change happens inside
``transaction()``: an inter-process lock, a fresh read, the change, then
write-temp-fsync-rename, so readers without the lock always see a whole file.
A file that cannot be read is moved aside (kept, never deleted) and reported.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock, Timeout

from ..errors import NotFound, RemoteComputeError
from ..fsutil import atomic_write
from .spec import JobSpec

SCHEMA_VERSION = 1
UNREADABLE = ".unreadable-"  # jobs.json.unreadable-<time>: a state file that could not be read, kept
LOCK_TIMEOUT = 30.0

# pending: the machine accepted the job and it waits for someone else (a scheduler, an agent, a
# cloud provisioning); ``Job.reason`` says for what, in that party's words.
State = Literal["queued", "sending", "pending", "running", "collecting", "succeeded", "failed", "cancelled", "lost"]
ACTIVE_STATES: frozenset[str] = frozenset({"queued", "sending", "pending", "running", "collecting"})
#: The states a job's machine has it in: polled, cancelled and timed out the same way.
ON_MACHINE_STATES: frozenset[str] = frozenset({"pending", "running"})
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "lost"})

log = logging.getLogger(__name__)


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def new_job_id() -> str:
    # Sortable by creation time, unique without coordination.
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def _process_start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The command name may hold spaces and parentheses: split after the last ')'.
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def process_identity() -> dict[str, Any]:
    """Who holds a lease: host, pid and the process's start time (so a reused pid is not mistaken)."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _process_start_ticks(pid)}


#: A lease taken on another host (a workspace on shared storage, a pod that came back under a new
#: name) is alive only while its holder keeps renewing it; on this host the process table decides.
FOREIGN_LEASE_TTL = 600.0


def holder_alive(holder: dict[str, Any] | None) -> bool:
    """Whether the process that took a lease still runs (another host's: whether it renewed lately)."""
    if not holder:
        return False
    if holder.get("host") != socket.gethostname():
        renewed = holder.get("renewed")
        return isinstance(renewed, (int, float)) and time.time() - renewed < FOREIGN_LEASE_TTL
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = _process_start_ticks(pid)
    return start is None or holder.get("start") in (None, start)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a job will end, decided when it stopped running; collection records it and ends the job."""

    state: str  # one of TERMINAL_STATES
    reason: str | None = None
    reach_machine: bool = True  # False: the machine could not be reached, collect without asking it
    at: float | None = None  # when the job stopped on its machine, as this side saw it (epoch seconds)

    def to_json(self) -> dict[str, Any]:
        data = {"state": self.state, "reason": self.reason, "reach_machine": self.reach_machine}
        if self.at is not None:  # absent when unknown, so a record an older version wrote reads back the same
            data["at"] = self.at
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        at = data.get("at")
        return cls(
            data["state"], data.get("reason"), bool(data.get("reach_machine", True)), at if _is_number(at) else None
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass
class Job:
    id: str
    key: str
    machine: str
    kind: str
    spec: JobSpec  # a mapping given here (as the state file holds it) is parsed once, in __post_init__
    state: str = "queued"
    reason: str | None = None
    created: str = dataclasses.field(default_factory=utcnow)
    updated: str = dataclasses.field(default_factory=utcnow)
    started: str | None = None
    ended: str | None = None
    machine_snapshot: dict[str, Any] = dataclasses.field(default_factory=dict)  # kind, address, options at submit
    handle: dict[str, Any] = dataclasses.field(default_factory=dict)  # the engine's own record
    exit_code: int | None = None
    outcome: Outcome | None = None  # the terminal state collection will set
    cancel_requested: str | None = None  # who asked
    outputs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # path -> {sha256, size}
    inputs: dict[str, int] = dataclasses.field(default_factory=dict)  # files, bytes
    transfer: dict[str, int] = dataclasses.field(default_factory=dict)  # bytes sent, files reused …
    mlflow_run_id: str | None = None
    log_size: int = 0
    lease: dict[str, Any] | None = None
    retries: int = 0
    failing_since: float | None = None  # when reaching the machine started failing (epoch seconds)
    # queued_at/started_at/ended_at as the machine's scheduler reported them (epoch seconds), where it did.
    times: dict[str, float] = dataclasses.field(default_factory=dict)
    user: str | None = None  # who submitted it, for the usage record

    def __post_init__(self) -> None:
        if not isinstance(self.spec, JobSpec):
            self.spec = JobSpec.from_stored(self.spec)
        if self.outcome is not None and not isinstance(self.outcome, Outcome):
            self.outcome = Outcome.from_json(self.outcome)

    @property
    def name(self) -> str:
        return self.spec.display_name

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def to_json(self) -> dict[str, Any]:
        # Shallow on purpose: values are JSON already, and asdict's deep copy dominates large stores.
        data = {name: getattr(self, name) for name in _JOB_FIELDS}
        data["spec"] = self.spec.to_json()
        data["outcome"] = None if self.outcome is None else self.outcome.to_json()
        for name, unset in _ADDED_FIELDS:
            if data[name] == unset:  # left out when unset: a record an older version wrote reads back the same
                del data[name]
        return data

    def public_json(self) -> dict[str, Any]:
        """What the API and the CLI show: no lease bookkeeping, a display name."""
        data = self.to_json()
        data.pop("lease")
        data["name"] = self.name
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(**{k: v for k, v in data.items() if k in _JOB_FIELDS})


_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job))
#: Fields added after schema 1's first release, with the value that means "not set".
_ADDED_FIELDS: tuple[tuple[str, Any], ...] = (("times", {}), ("user", None))


@dataclasses.dataclass(frozen=True)
class Delta:
    """How a snapshot this process wrote differs from the one it was made from (for the list index)."""

    base: int  # the generation it was made from
    touched: frozenset[str]  # jobs added or changed
    removed: frozenset[str]


@dataclasses.dataclass
class Snapshot:
    """The file as this process last read or wrote it: its stat, bytes, jobs, each job's JSON text.

    ``generation`` counts the snapshots this store made; ``delta`` is set when this process's own
    commit made it, so whoever keeps something derived from the jobs can patch it, not rebuild it.
    """

    token: tuple[int, int, int] | None
    raw: bytes
    jobs: dict[str, Job]
    fragments: dict[str, str]
    generation: int = 0
    delta: Delta | None = None


def _fragment(job: Job) -> str:
    return json.dumps(job.to_json(), separators=(",", ":"))


class JobMap(dict):  # type: ignore[type-arg]
    """A transaction's view of the jobs: a job is copied the first time it is looked up by id.

    Looking a job up (``jobs[id]``, ``jobs.get(id)``) gives a private copy to change; iterating
    gives the shared snapshot, to read only. Only looked-up jobs are serialised again on commit.
    """

    def __init__(self, jobs: dict[str, Job]) -> None:
        super().__init__(jobs)
        self.touched: set[str] = set()
        self.removed: set[str] = set()

    def __getitem__(self, job_id: str) -> Job:
        job = super().__getitem__(job_id)
        if job_id not in self.touched:
            job = copy.deepcopy(job)
            super().__setitem__(job_id, job)
            self.touched.add(job_id)
        return job

    def get(self, job_id: str, default: Job | None = None) -> Job | None:  # type: ignore[override]
        return self[job_id] if job_id in self else default  # noqa: SIM401 - self.get would recurse

    def __setitem__(self, job_id: str, job: Job) -> None:
        super().__setitem__(job_id, job)
        self.touched.add(job_id)
        self.removed.discard(job_id)

    def pop(self, job_id: str, *default: Any) -> Any:  # type: ignore[override]
        if job_id in self:
            self.removed.add(job_id)
            self.touched.discard(job_id)
        return super().pop(job_id, *default)


class StoreUnreadable(RemoteComputeError):
    code = "state_file_unreadable"
    status = 500


class JobStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT)
        self._generations = itertools.count(1)
        self._snapshot = Snapshot(None, b"", {}, {})
        #: Set when a broken state file was moved aside, for the API and CLI to report.
        self.recovered_from: Path | None = None

    def _new_snapshot(
        self,
        token: tuple[int, int, int] | None,
        raw: bytes,
        jobs: dict[str, Job],
        fragments: dict[str, str],
        delta: Delta | None = None,
    ) -> Snapshot:
        return Snapshot(token, raw, jobs, fragments, next(self._generations), delta)

    # -- reading ----------------------------------------------------------
    def _stat_token(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    @staticmethod
    def _parse(raw_bytes: bytes) -> dict[str, Job]:
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
        if schema != SCHEMA_VERSION:
            raise ValueError(f"schema {schema!r}, this version reads {SCHEMA_VERSION}")
        return {job_id: Job.from_json(data) for job_id, data in raw["jobs"].items()}

    def _refresh(self, *, locked: bool) -> Snapshot:
        """The snapshot, read again only if the file changed since this process last saw it.

        Readers trust the stat token; a writer holding the lock compares the bytes too, since
        write-rename can bring back the same inode, size and (coarse) mtime.
        """
        token = self._stat_token()
        if token is None:
            self._snapshot = self._new_snapshot(None, b"", {}, {})
            return self._snapshot
        if token == self._snapshot.token and not locked:
            return self._snapshot
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self._snapshot = self._new_snapshot(None, b"", {}, {})
            return self._snapshot
        if raw == self._snapshot.raw and self._snapshot.token is not None:
            self._snapshot.token = token
            return self._snapshot
        try:
            jobs = self._parse(raw)
        except (ValueError, TypeError, KeyError) as e:
            if not locked:
                # Only a writer holding the lock may move the file; readers take it to do so.
                with self._lock:
                    return self._refresh(locked=True)
            jobs, token, raw = self._move_aside(e), None, b""
        self._snapshot = self._new_snapshot(token, raw, jobs, {})
        return self._snapshot

    def _move_aside(self, error: Exception) -> dict[str, Job]:
        stamp = f"{self.path.name}{UNREADABLE}{time.strftime('%Y%m%dT%H%M%S')}"
        aside = self.path.with_name(stamp)
        # Under the lock: a second broken file within the same second gets a name of its own, never the first's.
        for n in itertools.count(1):
            if not aside.exists():
                break
            aside = self.path.with_name(f"{stamp}-{n}")
        os.replace(self.path, aside)
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

    def get(self, job_id: str) -> Job:
        try:
            return self.jobs()[job_id]
        except KeyError:
            raise NotFound(f"no job {job_id!r} in {self.path}") from None

    # -- changing ---------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[JobMap]:
        """Lock, read what changed, let the caller change jobs, write the file back atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            raise StoreUnreadable(f"{self.path}: could not take its lock within {LOCK_TIMEOUT:.0f} s") from None
        try:
            snapshot = self._refresh(locked=True)
            jobs = JobMap(snapshot.jobs)
            yield jobs
            self._commit(snapshot, jobs)
        finally:
            self._lock.release()

    def _commit(self, snapshot: Snapshot, jobs: JobMap) -> None:
        fragments = {job_id: frag for job_id, frag in snapshot.fragments.items() if job_id not in jobs.removed}
        touched = set()
        for job_id in jobs.touched:
            job = dict.__getitem__(jobs, job_id)
            if job_id not in snapshot.jobs or job != snapshot.jobs[job_id]:
                touched.add(job_id)
                fragments[job_id] = _fragment(job)
        if not touched and not jobs.removed:
            return
        # Unchanged jobs keep the text they had; only jobs never serialised here are dumped.
        parts = [f"{json.dumps(job_id)}:{fragments.get(job_id) or _fragment(job)}" for job_id, job in dict.items(jobs)]
        payload = '{"schema":' + str(SCHEMA_VERSION) + ',"jobs":{' + ",".join(parts) + "}}"
        raw = payload.encode()
        atomic_write(self.path, raw, mode=0o600)
        full = {job_id: fragments.get(job_id) or _fragment(job) for job_id, job in dict.items(jobs)}
        delta = Delta(snapshot.generation, frozenset(touched), frozenset(jobs.removed))
        self._snapshot = self._new_snapshot(self._stat_token(), raw, dict(dict.items(jobs)), full, delta)
