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
import copy
import dataclasses
import gc
import itertools
import json
import logging
import os
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator, MutableMapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import Timeout

from ..errors import InvalidSettings, NotFound, RemoteComputeError
from ..fsutil import SharedFileLock, atomic_write
from .spec import JobSpec
from .transitions import ACTIVE_STATES, JOB_STATE, State

#: 2: the file names its journal (``"journal"``) on its first line; 1 (no journal) is still read.
SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
JOURNAL_SUFFIX = ".journal"
JOURNAL_FORMAT = 1
#: Compact once the journal is larger than both of these: a compaction rewrites the whole file, so
#: waiting until the journal is a fixed share of it keeps the rewrite's cost per change constant.
COMPACT_MIN_BYTES = 256 * 1024
COMPACT_SHARE = 0.25
RECENT_DELTAS = 32  # how many snapshots back ``Snapshot.changes_since`` can reach
#: Changes a snapshot keeps over the map it was made from before they are folded into a new map: a
#: fold copies every job (3-4 ms at 100,000, under the file lock), so it is paid once per this many.
FOLD_AT = 1024
UNREADABLE = ".unreadable-"  # jobs.json.unreadable-<time>: a state file that could not be read, kept
LOCK_TIMEOUT = 30.0

log = logging.getLogger(__name__)


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def parse_given_time(value: str, field: str) -> datetime:
    """A time a user gave (a filter's ``since``/``until``): ISO 8601, UTC unless it says otherwise."""
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidSettings(
            f"{field}: {value!r} is not an ISO 8601 time such as 2026-01-31 or 2026-01-31T12:00:00Z", field=field
        ) from None
    when = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
    try:
        when.astimezone(timezone.utc)  # 0001-01-01T00:00+23:59 is a valid RFC 3339 time before year 1 in UTC
    except OverflowError:
        raise InvalidSettings(f"{field}: {value!r} is out of range once turned into UTC", field=field) from None
    return when


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

    state: State  # one of TERMINAL_STATES
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
    state: State = JOB_STATE  # type: ignore[assignment]  # "queued" at first; then only transitions.move
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
    # What the machine's scheduler said (epoch seconds): queued_at, started_at, ended_at, only those it
    # reported (RemoteStatus); usage prefers them to this side's own created/started/ended.
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
        if _JOB_FIELD_SET.issuperset(data):  # as this version writes it: no copy (100,000 jobs at start)
            return cls(**data)
        return cls(**{k: v for k, v in data.items() if k in _JOB_FIELD_SET})


_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job))
_JOB_FIELD_SET = frozenset(_JOB_FIELDS)
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
    """The file and its journal as this process last read or wrote them, and the jobs in them.

    ``base_id`` is the journal generation the file names, ``journal_end`` how far this process read
    that journal (None: not at all yet). ``generation`` counts the snapshots this store made;
    ``delta`` is set when it was made from the previous one by a commit or a journal replay, so
    whoever keeps something derived from the jobs can patch it, not rebuild it.
    """

    token: tuple[int, int, int] | None
    base_id: str | None
    #: The jobs: a map shared with earlier snapshots, and the changes over it since (see ``Layers``).
    layers: Layers
    generation: int = 0
    delta: Delta | None = None
    journal_end: int | None = None
    base_size: int = 0
    #: The last few (generation, delta) pairs that led here, newest first: lets whoever last looked a few
    #: snapshots ago patch what it derived instead of rebuilding it (see ``changes_since``).
    recent: tuple[tuple[int, Delta], ...] = ()
    #: The ids of the unfinished jobs: the poller and submit's same-work check look at these, not at all.
    active: frozenset[str] = frozenset()

    def job(self, job_id: str) -> Job | None:
        """One job, or None; without making the whole map."""
        return _job_in(self.layers, job_id)

    def held(self, job_id: str) -> Job:
        """A job the snapshot is known to hold: an id from its own ``changes_since`` or an index of it."""
        job = _job_in(self.layers, job_id)
        assert job is not None, f"snapshot {self.generation} lacks job {job_id}"
        return job

    @property
    def jobs(self) -> dict[str, Job]:
        """Every job by id, as one map: made from the layers on first use, then kept."""
        layers = self.layers
        jobs = _whole(layers)
        if jobs is not layers[0]:
            self.layers = (jobs, {})  # one assignment: a reader takes both layers at once, old or new
        return jobs

    def changes_since(self, generation: int) -> Delta | None:
        """The jobs touched and removed since snapshot ``generation`` of this store; None if not known."""
        touched: set[str] = set()
        removed: set[str] = set()
        want = self.generation
        for made, delta in self.recent:
            if want == generation or made != want:
                break
            touched |= delta.touched
            removed |= delta.removed
            want = delta.base
        if want != generation:
            return None
        return Delta(
            generation,
            frozenset(job_id for job_id in touched if self.job(job_id) is not None),
            frozenset(job_id for job_id in removed if self.job(job_id) is None),
        )


#: A map of jobs shared by snapshots, and the changes over it (a job, or None where it was removed).
#: A commit makes the next snapshot's changes from this one's; the whole map is copied only every
#: ``FOLD_AT`` changes, or when a reader asks for it (``Snapshot.jobs``).
Layers = tuple[dict[str, Job], dict[str, "Job | None"]]


def _job_in(layers: Layers, job_id: str) -> Job | None:
    base, changes = layers
    if job_id in changes:
        return changes[job_id]
    return base.get(job_id)


def _folded(base: dict[str, Job], changes: dict[str, Job | None]) -> dict[str, Job]:
    jobs = dict.copy(base)  # the stored values, not copies; ten times faster than dict(items())
    for job_id, job in changes.items():
        if job is None:
            jobs.pop(job_id, None)
        else:
            jobs[job_id] = job
    return jobs


def _whole(layers: Layers) -> dict[str, Job]:
    return _folded(*layers) if layers[1] else layers[0]


def _with_changes(layers: Layers, changes: dict[str, Job | None]) -> Layers:
    base, earlier = layers
    merged = {**earlier, **changes}
    if len(merged) >= FOLD_AT:
        return _folded(base, merged), {}
    return base, merged


def _fragment(job: Job) -> str:
    return json.dumps(job.to_json(), separators=(",", ":"))


class JobMap(MutableMapping[str, Job]):
    """A transaction's view of the jobs: the snapshot's, with this transaction's changes over them.

    Looking a job up (``jobs[id]``, ``jobs.get(id)``) gives a private copy to change; iterating
    (``values()``, ``items()``) gives the shared jobs, to read only. Nothing is copied up front: with
    100,000 jobs a copy of the whole map costs milliseconds, and most transactions change one job.
    """

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._changed: dict[str, Job] = {}
        #: Ids looked up or set (their jobs may have changed), and ids removed, since the transaction began.
        self.touched: set[str] = set()
        self.removed: set[str] = set()

    def stored(self, job_id: str) -> Job:
        """The job as this transaction holds it now, without copying it (for the commit to compare)."""
        if job_id in self._changed:
            return self._changed[job_id]
        if job_id in self.removed:
            raise KeyError(job_id)
        job = self._snapshot.job(job_id)
        if job is None:
            raise KeyError(job_id)
        return job

    def merged(self) -> Layers:
        """Every job after this transaction: the snapshot's layers with this transaction's changes added."""
        changes: dict[str, Job | None] = dict.fromkeys(self.removed)
        changes.update(self._changed)
        return _with_changes(self._snapshot.layers, changes)

    def unfinished(self) -> list[Job]:
        """The jobs unfinished when the transaction began (shared: read only), without looking at every job."""
        return [self.stored(i) for i in self._snapshot.active if i in self]

    def __getitem__(self, job_id: str) -> Job:
        job = self.stored(job_id)
        if job_id not in self.touched:
            job = self._changed[job_id] = copy.deepcopy(job)
            self.touched.add(job_id)
        return job

    def __setitem__(self, job_id: str, job: Job) -> None:
        self._changed[job_id] = job
        self.touched.add(job_id)
        self.removed.discard(job_id)

    def __delitem__(self, job_id: str) -> None:
        if job_id not in self:
            raise KeyError(job_id)
        self._changed.pop(job_id, None)
        self.removed.add(job_id)
        self.touched.discard(job_id)

    def pop(self, job_id: str, *default: Any) -> Any:  # type: ignore[override]
        if job_id not in self:
            if default:
                return default[0]
            raise KeyError(job_id)
        job = self.stored(job_id)  # not a copy: a removed job is not changed
        del self[job_id]
        return job

    def __contains__(self, job_id: object) -> bool:
        if not isinstance(job_id, str):
            return False
        return job_id in self._changed or (job_id not in self.removed and self._snapshot.job(job_id) is not None)

    def __iter__(self) -> Iterator[str]:
        base, removed = self._snapshot.jobs, self.removed  # iterating looks at every job: the whole map
        yield from (job_id for job_id in base if job_id not in removed)
        yield from (job_id for job_id in self._changed if job_id not in base)

    def __len__(self) -> int:
        base = self._snapshot.jobs
        gone = sum(1 for job_id in self.removed if job_id in base)
        added = sum(1 for job_id in self._changed if job_id not in base)
        return len(base) - gone + added

    # Lists, not views: a view would look each job up through __getitem__, copying every one.
    def values(self) -> list[Job]:  # type: ignore[override]
        return [self.stored(job_id) for job_id in self]

    def items(self) -> list[tuple[str, Job]]:  # type: ignore[override]
        return [(job_id, self.stored(job_id)) for job_id in self]


class _FragmentCache:
    """Each job's JSON text, kept for the job object it was made from.

    Shared by every snapshot of a store: an entry is used only for the very object it was made from
    (jobs in snapshots are never changed in place), so no snapshot needs a copy of its own. Used under
    the store's ``_refreshing`` lock.
    """

    def __init__(self) -> None:
        self._texts: dict[str, tuple[Job, str]] = {}

    def text(self, job_id: str, job: Job) -> str:
        cached = self._texts.get(job_id)
        if cached is not None and cached[0] is job:
            return cached[1]
        text = _fragment(job)
        self._texts[job_id] = (job, text)
        return text

    def forget(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self._texts.pop(job_id, None)

    def clear(self) -> None:
        self._texts.clear()


class _WriterNeeded(Exception):
    """A reader found the state file broken: it is moved aside only under the file lock."""


class StoreUnreadable(RemoteComputeError):
    code = "state_file_unreadable"
    status = 500


def _journal_head(base_id: str) -> bytes:
    return json.dumps({"journal": JOURNAL_FORMAT, "base": base_id}, separators=(",", ":")).encode() + b"\n"


def _frame(text: str) -> bytes:
    """One journal line: the record's CRC-32, a space, the record, a newline. Torn or damaged lines fail it."""
    body = text.encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _unframe(data: bytes, start: int) -> tuple[list[dict[str, Any]], int]:
    """The whole, intact records at the start of ``data``, and the offset just past the last of them.

    The first line that is unfinished (no newline: a writer is still appending, or died while it did)
    or fails its checksum ends the replay; what follows is not trusted.
    """
    records: list[dict[str, Any]] = []
    pos = 0
    while (newline := data.find(b"\n", pos)) >= 0:
        line = data[pos:newline]
        body = line[9:]
        if line[8:9] != b" " or line[:8] != b"%08x" % zlib.crc32(body):
            break
        try:
            record = json.loads(body)
        except ValueError:
            break
        if not isinstance(record, dict):
            break
        records.append(record)
        pos = newline + 1
    return records, start + pos


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


def _read_head(f: Any, limit: int = 4096) -> dict[str, Any] | None:
    """The JSON object on the first line of a file written by this module, or None (an older or other file)."""
    line = f.readline(limit)
    if not line.endswith(b"\n"):
        return None
    text = line[:-1]
    if text.startswith(b"{") and not text.endswith(b"}"):
        text += b"}"  # the state file's first line opens the object its second line continues
    try:
        head = json.loads(text)
    except ValueError:
        return None
    return head if isinstance(head, dict) else None


class JobStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal_path = path.with_name(path.name + JOURNAL_SUFFIX)
        self._lock = SharedFileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT)
        # Threads of one process refresh one after another, so each journal line is replayed once.
        self._refreshing = threading.RLock()
        self._generations = itertools.count(1)
        self._snapshot = Snapshot(None, None, ({}, {}))
        self._fragments = _FragmentCache()
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
                i for i in delta.touched if (job := _job_in(layers, i)) is not None and job.state in ACTIVE_STATES
            }
        else:
            layers = (_whole(layers), {})
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
            head = _read_head(f) or {}
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
            head = _read_head(f) or {}
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
        records, end = _unframe(data, start)
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
            seen.token, seen.base_id, _with_changes(seen.layers, changes), delta, end, seen.base_size, previous=seen
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
        self.path.parent.mkdir(parents=True, exist_ok=True)
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
            if seen.base_id is not None and seen.journal_end == len(_journal_head(seen.base_id)):
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
        puts = ",".join(f"{json.dumps(job_id)}:{text(job_id, _job_in(after, job_id))}" for job_id in sorted(touched))
        line = _frame('{"put":{' + puts + '},"del":' + json.dumps(sorted(removed)) + "}")
        limit = max(COMPACT_MIN_BYTES, snapshot.base_size * COMPACT_SHARE)
        if snapshot.base_id is None or snapshot.journal_end is None or len(line) > limit:
            # No journal of this file's yet (a new or schema-1 file, a compaction cut short), or a change
            # as large as a good share of the file: write the whole file.
            self._write_base(_whole(after), None, delta, snapshot)
            return
        try:
            end = self._append(snapshot.journal_end, line)
        except FileNotFoundError:
            self._write_base(_whole(after), None, delta, snapshot)
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
        journal_head = _journal_head(base_id)
        atomic_write(self.journal_path, journal_head, mode=0o600)
        self._snapshot = self._new_snapshot(
            token, base_id, (jobs, {}), delta, len(journal_head), len(raw), previous=previous
        )
