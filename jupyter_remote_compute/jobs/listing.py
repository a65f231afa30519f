"""Jobs a page at a time, newest first, without serialising the whole state file.

The state file (``store.py``) stays the record. Beside it each process keeps, in memory, every job
ordered by ``(created, id)``: rebuilt when another process rewrote the file, patched job by job
when this process's own transaction changed it. A page then costs a bisect and ``limit`` summaries,
whatever the number of jobs; a filter scans from the cursor only until the page is full.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import json
import threading
import weakref
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator
from datetime import timezone
from typing import Any

from ..errors import InvalidSettings
from ..schema.job import JobSummary
from .job import Job, parse_given_time
from .snapshot import Snapshot
from .store import JobStore
from .transitions import ACTIVE_STATES, TERMINAL_STATES

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
ALL_STATES: frozenset[str] = ACTIVE_STATES | TERMINAL_STATES
_STATE_ORDER = ("queued", "sending", "pending", "running", "collecting", "succeeded", "failed", "cancelled", "lost")

Key = tuple[str, str]  # (created, id): the order of the list, and what a cursor points after


def summary(job: Job) -> JobSummary:
    """What a row of the job list shows; the whole job is ``GET /jobs/{id}``."""
    reason = job.reason.split("\n", 1)[0] if job.reason else job.reason
    return {
        "id": job.id,
        "name": job.name,
        "machine": job.machine,
        "kind": job.kind,
        "state": job.state,
        "reason": reason,
        "created": job.created,
        "updated": job.updated,
        "started": job.started,
        "ended": job.ended,
        "exit_code": job.exit_code,
        "mlflow_run_id": job.mlflow_run_id,
    }


def encode_cursor(key: Key) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key), separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> Key:
    """The position a cursor from an earlier page points after; a mangled cursor names the field."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, job_id = json.loads(raw)
        if isinstance(created, str) and isinstance(job_id, str):
            return (created, job_id)
    except (ValueError, TypeError, binascii.Error):
        pass
    raise InvalidSettings(
        "cursor: not a cursor this server gave out; start again without one", field="cursor"
    ) from None


def _iso_time(value: str, field: str) -> str:
    """An ISO 8601 time in the state file's own form (UTC, milliseconds, Z), so strings compare as times."""
    when = parse_given_time(value, field)  # the state file's times are UTC; so is a bare time
    return when.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_states(value: str | Iterable[str] | None, field: str = "state") -> frozenset[str] | None:
    """``"running"``, ``"succeeded,failed"`` or a list of them; an unknown state names the field."""
    if value is None or value == "":
        return None
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple, set, frozenset)) or not all(isinstance(n, str) for n in names):
        raise InvalidSettings(f"{field}: expected state names, e.g. succeeded,failed", field=field)
    states = frozenset(n.strip() for n in names if n.strip())
    unknown = sorted(states - ALL_STATES)
    if unknown:
        raise InvalidSettings(
            f"{field}: {unknown[0]!r} is not a job state; use one or more of {', '.join(_STATE_ORDER)}", field=field
        )
    return states or None


@dataclasses.dataclass(frozen=True)
class JobQuery:
    """Which jobs a list asks for. Build it with ``parse`` from user input."""

    limit: int = DEFAULT_LIMIT
    cursor: Key | None = None
    machine: str | None = None
    states: frozenset[str] | None = None
    name: str | None = None  # a case-insensitive substring of the job's name
    since: str | None = None  # created at or after (state-file form)
    until: str | None = None  # created at or before

    @classmethod
    def parse(
        cls,
        *,
        limit: str | int | None = None,
        cursor: str | None = None,
        machine: str | None = None,
        state: str | Iterable[str] | None = None,
        name: str | None = None,
        since: str | None = None,
        until: str | None = None,
        max_limit: int = MAX_LIMIT,
    ) -> JobQuery:
        if limit is None or limit == "":
            count = min(DEFAULT_LIMIT, max_limit)
        else:
            try:
                count = int(limit)
            except (TypeError, ValueError):
                count = 0
            if isinstance(limit, bool) or count < 1 or count > max_limit:
                raise InvalidSettings(f"limit: expected a whole number from 1 to {max_limit}", field="limit")
        return cls(
            limit=count,
            cursor=decode_cursor(cursor) if cursor else None,
            machine=machine or None,
            states=parse_states(state),
            name=name.casefold() if name else None,
            # Given but empty is a mistake, not "no filter": the panel and the CLI leave an unused filter out.
            since=_iso_time(since, "since") if since is not None else None,
            until=_iso_time(until, "until") if until is not None else None,
        )


@dataclasses.dataclass(frozen=True)
class JobPage:
    jobs: list[Job]
    next_cursor: str | None  # None: this was the last page

    def to_json(self) -> dict[str, Any]:
        return {"jobs": [summary(j) for j in self.jobs], "next_cursor": self.next_cursor}


class JobIndex:
    """Every job of one store in list order, kept in step with the store's snapshots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = -1
        self._keys: list[Key] = []  # ascending (created, id)
        self._jobs: list[Job] = []  # aligned with _keys
        self._names: list[str] = []  # casefolded display names, aligned, for the name filter
        self._key_of: dict[str, Key] = {}
        #: The unfinished jobs' keys, ascending: few, so the panel's "active" filter never scans them all.
        self._active: list[Key] = []
        self._snapshot: Snapshot | None = None  # the one the index was brought to: looks jobs up by id

    def _rebuild(self, snapshot: Snapshot) -> None:
        jobs = sorted(snapshot.jobs.values(), key=lambda j: (j.created, j.id))
        self._jobs = jobs
        self._keys = [(j.created, j.id) for j in jobs]
        self._names = [j.name.casefold() for j in jobs]
        self._key_of = {j.id: (j.created, j.id) for j in jobs}
        self._active = [(j.created, j.id) for j in jobs if j.state in ACTIVE_STATES]

    def _remove(self, job_id: str) -> None:
        key = self._key_of.pop(job_id, None)
        if key is None:
            return
        i = bisect_left(self._keys, key)
        del self._keys[i], self._jobs[i], self._names[i]
        self._set_active(key, False)

    def _set_active(self, key: Key, active: bool) -> None:
        i = bisect_left(self._active, key)
        present = i < len(self._active) and self._active[i] == key
        if active and not present:
            self._active.insert(i, key)
        elif present and not active:
            del self._active[i]

    def _apply(self, snapshot: Snapshot, touched: frozenset[str], removed: frozenset[str]) -> None:
        for job_id in removed:
            self._remove(job_id)
        for job_id in touched:
            job = snapshot.held(job_id)  # changes_since keeps only the touched jobs the snapshot holds
            key = (job.created, job.id)
            if self._key_of.get(job_id) == key:
                i = bisect_left(self._keys, key)
                self._jobs[i] = job
                self._names[i] = job.name.casefold()
            else:
                self._remove(job_id)
                i = bisect_right(self._keys, key)
                insort(self._keys, key)
                self._jobs.insert(i, job)
                self._names.insert(i, job.name.casefold())
                self._key_of[job_id] = key
            self._set_active(key, job.state in ACTIVE_STATES)

    def _sync(self, snapshot: Snapshot) -> None:
        if snapshot.generation <= self._generation:
            # Already there, or past it: the server's watch may have brought the index to a newer
            # snapshot than the one a request read a moment before (generations only grow).
            return
        # Patched even when several snapshots were made since the last page (a replay, commits).
        delta = snapshot.changes_since(self._generation) if self._generation >= 0 else None
        if delta is not None:
            self._apply(snapshot, delta.touched, delta.removed)
        else:
            self._rebuild(snapshot)
        self._generation = snapshot.generation
        self._snapshot = snapshot

    def _matches(self, job: Job, name: str | None, query: JobQuery) -> bool:
        return (
            (query.states is None or job.state in query.states)
            and (query.machine is None or job.machine == query.machine)
            and (query.name is None or query.name in (name if name is not None else job.name.casefold()))
        )

    def _scan(self, query: JobQuery, lo: int, hi: int) -> list[Job]:
        """Rows hi-1 down to lo that match; one match past the page tells whether another page exists."""
        found: list[Job] = []
        i = hi - 1
        while i >= lo and len(found) <= query.limit:
            job = self._jobs[i]
            if self._matches(job, self._names[i], query):
                found.append(job)
            i -= 1
        return found

    def _page_of_active(self, query: JobQuery, lowest: Key | None, hi: int) -> list[Job]:
        """Like ``_scan``, over the unfinished jobs only."""
        if lowest is None:
            return []
        top = bisect_left(self._active, self._keys[hi]) if hi < len(self._keys) else len(self._active)
        bottom = bisect_left(self._active, lowest)
        found: list[Job] = []
        assert self._snapshot is not None  # synced before any page
        for key in reversed(self._active[bottom:top]):
            job = self._snapshot.held(key[1])
            if self._matches(job, None, query):
                found.append(job)
                if len(found) > query.limit:
                    break
        return found

    @property
    def generation(self) -> int:
        """The store snapshot the index was last brought to (-1: never)."""
        return self._generation

    def follow(self, snapshot: Snapshot) -> None:
        """Bring the index up to ``snapshot`` now (the server does as it reads), so a page need not."""
        with self._lock:
            self._sync(snapshot)

    def page(self, snapshot: Snapshot, query: JobQuery) -> JobPage:
        with self._lock:
            self._sync(snapshot)
            keys = self._keys
            hi = len(keys)
            if query.cursor is not None:
                hi = bisect_left(keys, query.cursor)
            if query.until is not None:
                hi = min(hi, bisect_right(keys, (query.until, "\U0010ffff")))
            lo = bisect_left(keys, (query.since, "")) if query.since is not None else 0
            if query.states is not None and query.states <= ACTIVE_STATES:
                found = self._page_of_active(query, keys[lo] if lo < len(keys) else None, hi)
            else:
                found = self._scan(query, lo, hi)
        if len(found) > query.limit:
            found = found[: query.limit]
            last = found[-1]
            return JobPage(found, encode_cursor((last.created, last.id)))
        return JobPage(found, None)


_INDEXES: weakref.WeakKeyDictionary[JobStore, JobIndex] = weakref.WeakKeyDictionary()
_INDEXES_GUARD = threading.Lock()


def index_of(store: JobStore) -> JobIndex:
    with _INDEXES_GUARD:
        index = _INDEXES.get(store)
        if index is None:
            index = _INDEXES[store] = JobIndex()
        return index


def list_page(store: JobStore, query: JobQuery) -> JobPage:
    """One page of jobs, newest first, as on disk now."""
    return index_of(store).page(store.snapshot(), query)


def iter_jobs(store: JobStore, query: JobQuery, total: int | None = None) -> Iterator[Job]:
    """Jobs matching ``query``, newest first, page after page; at most ``total`` (None: all)."""
    left = total
    cursor = query.cursor
    while left is None or left > 0:
        size = query.limit if left is None else min(left, MAX_LIMIT)
        page = list_page(store, dataclasses.replace(query, limit=size, cursor=cursor))
        yield from page.jobs
        if left is not None:
            left -= len(page.jobs)
        if page.next_cursor is None:
            return
        cursor = decode_cursor(page.next_cursor)


def add_list_arguments(parser: argparse.ArgumentParser, default_limit: int) -> None:
    """The job-list options the CLI and ``%remote_jobs`` share."""
    parser.add_argument("--machine", help="only jobs of this machine")
    parser.add_argument("--state", help="only jobs in these states (comma-separated, e.g. failed,lost)")
    parser.add_argument("--name", help="only jobs whose name contains this (any case)")
    parser.add_argument("--since", help="only jobs created at or after this ISO 8601 time")
    parser.add_argument("--until", help="only jobs created at or before this ISO 8601 time")
    parser.add_argument("--limit", type=int, help=f"at most this many jobs, newest first (default {default_limit})")
    parser.add_argument("--all", action="store_true", help="every matching job")


def list_arguments(args: argparse.Namespace, default_limit: int | None) -> tuple[JobQuery, int | None]:
    """The query and how many jobs to show at most (None: all) from ``add_list_arguments``' options."""
    if args.limit is not None and args.limit < 1:
        raise InvalidSettings("--limit: expected a whole number of at least 1", field="limit")
    total = None if args.all else (args.limit or default_limit)
    query = JobQuery.parse(
        limit=min(total or MAX_LIMIT, MAX_LIMIT),
        machine=args.machine,
        state=args.state,
        name=args.name,
        since=args.since,
        until=args.until,
    )
    return query, total
