"""The job state file: every job of a workspace, shared by every process that uses it.

The server, a kernel running the magic, the CLI and a pipeline runner all read
and change ``.punica/jobs.json`` at once. Every change happens inside
``transaction()``: an inter-process lock, a fresh read, the change, then
write-temp-fsync-rename, so readers without the lock always see a whole file.
A file that cannot be read is moved aside (kept, never deleted) and reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
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

SCHEMA_VERSION = 1
LOCK_TIMEOUT = 30.0

State = Literal["queued", "sending", "running", "collecting", "succeeded", "failed", "cancelled", "lost"]
ACTIVE_STATES: frozenset[str] = frozenset({"queued", "sending", "running", "collecting"})
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


def holder_alive(holder: dict[str, Any] | None) -> bool:
    """Whether the process that took a lease still runs. Another host's lease counts as alive."""
    if not holder:
        return False
    if holder.get("host") != socket.gethostname():
        return True
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


@dataclasses.dataclass
class Job:
    id: str
    key: str
    machine: str
    kind: str
    spec: dict[str, Any]
    state: str = "queued"
    reason: str | None = None
    created: str = dataclasses.field(default_factory=utcnow)
    updated: str = dataclasses.field(default_factory=utcnow)
    started: str | None = None
    ended: str | None = None
    machine_snapshot: dict[str, Any] = dataclasses.field(default_factory=dict)  # kind, address, options at submit
    handle: dict[str, Any] = dataclasses.field(default_factory=dict)  # the engine's own record
    exit_code: int | None = None
    outcome: dict[str, Any] | None = None  # the terminal state collection will set
    cancel_requested: str | None = None  # who asked
    outputs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # path -> {sha256, size}
    inputs: dict[str, int] = dataclasses.field(default_factory=dict)  # files, bytes
    transfer: dict[str, int] = dataclasses.field(default_factory=dict)  # bytes sent, files reused …
    mlflow_run_id: str | None = None
    log_size: int = 0
    lease: dict[str, Any] | None = None
    retries: int = 0

    @property
    def name(self) -> str:
        return self.spec.get("name") or (
            self.spec["command"] if isinstance(self.spec["command"], str) else " ".join(self.spec["command"])
        )

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def public_json(self) -> dict[str, Any]:
        """What the API and the CLI show: no lease bookkeeping, a display name."""
        data = self.to_json()
        data.pop("lease")
        data["name"] = self.name
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class StoreUnreadable(RemoteComputeError):
    code = "state_file_unreadable"
    status = 500


class JobStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT)
        self._cache: tuple[tuple[int, int, int], dict[str, Job]] | None = None
        #: Set when a broken state file was moved aside, for the API and CLI to report.
        self.recovered_from: Path | None = None

    # -- reading ----------------------------------------------------------
    def _stat_token(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _parse(self, raw_bytes: bytes) -> dict[str, Job]:
        raw = json.loads(raw_bytes)
        if not isinstance(raw, dict) or not isinstance(raw.get("jobs"), dict):
            raise ValueError("no 'jobs' object")
        if raw.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"schema {raw.get('schema')!r}, this version reads {SCHEMA_VERSION}")
        return {job_id: Job.from_json(data) for job_id, data in raw["jobs"].items()}

    def _read(self, *, locked: bool) -> tuple[bytes, dict[str, Job]]:
        """The file's bytes and its jobs, freshly parsed (the caller may change them)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return b"", {}
        try:
            return data, self._parse(data)
        except (ValueError, TypeError, KeyError) as e:
            if not locked:
                # Only a writer holding the lock may move the file; readers take it to do so.
                with self._lock:
                    return self._read(locked=True)
            return b"", self._move_aside(e)

    def _load(self) -> dict[str, Job]:
        token = self._stat_token()
        if token is None:
            return {}
        if self._cache and self._cache[0] == token:
            return self._cache[1]
        _, jobs = self._read(locked=False)
        self._cache = (token, jobs)
        return jobs

    def _move_aside(self, error: Exception) -> dict[str, Job]:
        aside = self.path.with_name(f"{self.path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}")
        os.replace(self.path, aside)
        self.recovered_from = aside
        log.error("job state file %s could not be read (%s); moved it to %s", self.path, error, aside)
        return {}

    def jobs(self) -> dict[str, Job]:
        """Every job by id, as on disk now. Callers must not change what they get."""
        try:
            return self._load()
        except Timeout:
            raise StoreUnreadable(f"{self.path}: another process holds its lock; try again") from None

    def get(self, job_id: str) -> Job:
        try:
            return self.jobs()[job_id]
        except KeyError:
            raise NotFound(f"no job {job_id!r} in {self.path}") from None

    # -- changing ---------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[dict[str, Job]]:
        """Lock, read, let the caller change the mapping, write it back atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            raise StoreUnreadable(f"{self.path}: could not take its lock within {LOCK_TIMEOUT:.0f} s") from None
        try:
            before, jobs = self._read(locked=True)
            yield jobs
            after = self._serialise(jobs)
            if after != before:
                atomic_write(self.path, after, mode=0o600)
                token = self._stat_token()
                self._cache = (token, jobs) if token else None
        finally:
            self._lock.release()

    @staticmethod
    def _serialise(jobs: dict[str, Job]) -> bytes:
        payload = {"schema": SCHEMA_VERSION, "jobs": {job_id: job.to_json() for job_id, job in jobs.items()}}
        return json.dumps(payload, separators=(",", ":")).encode()
