"""What every job used: an append-only usage record, one line per ended attempt, apart from the state file.

``.punica/usage.jsonl`` gets one complete JSON line when an attempt ends (the job reached its end
state, or a scheduler put it back in its queue), appended under a file lock and fsynced. Pruning or
deleting jobs never touches it. Reading is by offset, like a log: a process parses only what was
appended since it last looked; a last line without its newline (a writer cut short) is left for the
next read, and a line that does not parse is skipped with a warning. Collection may run twice for
one job (a crash between recording and ending it): the first line of an attempt is the one kept.

An attempt still under way is not in the file: ``live_attempts`` computes it from the state file,
counting up to now, marked ``running``.

Times come, in order of trust, from the machine's scheduler (``Job.times``: ``source: scheduler``),
else from this side's lifecycle (``engine``); a lost attempt's end is when this side noticed
(``estimated``). Queue time runs from submit (or the requeue) to the start, so for a push machine
it includes sending the inputs.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import InvalidSettings
from ..fsutil import SharedFileLock, private_dir
from ..machines.facts import recorded_facts
from ..schema.job import ACTIVE_STATES, Job, parse_given_time, parse_time
from ..schema.usage import Attempt

log = logging.getLogger(__name__)

USAGE_FILE = "usage.jsonl"
LOCK_TIMEOUT = 30.0
#: A scheduler put the job back in its queue: the attempt ended, the next starts queued.
REQUEUED = "requeued"
GROUP_KEYS = ("machine", "user", "month", "kind", "state")
#: The organization's ledger also sums per hub group (an attempt counts in each of its user's groups).
ORG_GROUP_KEYS = (*GROUP_KEYS, "group")


class UsageRecord:
    """``.punica/usage.jsonl``: appended under a lock, read incrementally by offset."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = SharedFileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT)
        self._read_lock = threading.Lock()
        self._offset = 0
        self._identity: tuple[int, int] | None = None
        self._attempts: dict[tuple[str, int], Attempt] = {}

    def append(self, attempt: Attempt) -> None:
        """One whole line, flushed to disk before returning."""
        line = (json.dumps(attempt.to_json(), separators=(",", ":")) + "\n").encode()
        private_dir(self.path.parent)
        with self._lock:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size and not _ends_with_newline(fd):
                    # A writer died mid-line: end its fragment so this line stays whole and readable.
                    os.write(fd, b"\n")
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)

    def attempts(self) -> list[Attempt]:
        """Every ended attempt in the record, the first line of each (job, attempt) kept."""
        with self._read_lock:
            self._catch_up()
            return list(self._attempts.values())

    def attempts_of(self, job_id: str) -> list[Attempt]:
        return sorted((a for a in self.attempts() if a.job == job_id), key=lambda a: a.attempt)

    def _catch_up(self) -> None:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                identity = (st.st_dev, st.st_ino)
                if identity != self._identity or st.st_size < self._offset:
                    # Replaced or cut (by hand): read it again from the start.
                    self._identity, self._offset, self._attempts = identity, 0, {}
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            self._identity, self._offset, self._attempts = None, 0, {}
            return
        whole = data[: data.rfind(b"\n") + 1]  # a torn last line waits for the rest (or is ended by append)
        for raw in whole.splitlines():
            if not raw.strip():
                continue
            try:
                attempt = Attempt.from_json(json.loads(raw))
            except (ValueError, TypeError, InvalidSettings) as e:
                log.warning("%s: skipped a line that does not read (%s) near byte %d", self.path, e, self._offset)
                continue
            self._attempts.setdefault((attempt.job, attempt.attempt), attempt)
        self._offset += len(whole)


def _ends_with_newline(fd: int) -> bool:
    return os.pread(fd, 1, os.fstat(fd).st_size - 1) == b"\n"


def nodes_held(job: Job) -> int:
    """Nodes the job held: what it asked for, else one."""
    return job.spec.resources.nodes or 1


def gpus_held(job: Job, punica_dir: Path) -> int:
    """GPUs the job held: what it asked for (per node x nodes), else every GPU its machine's last check saw."""
    resources = job.spec.resources
    if resources.gpus:
        return resources.gpus * nodes_held(job)
    facts = recorded_facts(punica_dir).get(job.machine) or {}
    gpus = facts.get("gpus")
    return gpus if isinstance(gpus, int) and gpus > 0 else 0


def price_of(job: Job) -> float | None:
    price = (job.machine_snapshot.get("options") or {}).get("price_per_hour")
    return float(price) if isinstance(price, (int, float)) and not isinstance(price, bool) and price >= 0 else None


# -- metering one attempt ------------------------------------------------------------------------------
def current_attempt(job: Job, record: UsageRecord) -> tuple[int, float]:
    """The number of the job's attempt under way, and when it was queued (submit, or the last requeue)."""
    before = record.attempts_of(job.id)
    if not before:
        return 1, parse_time(job.created)
    last = before[-1]
    if last.state != REQUEUED:
        # That attempt already ended: this is it collected again after a crash, not a new one (the
        # record keeps the first line of each attempt, so it is counted once).
        return last.attempt, last.queued
    return last.attempt + 1, last.end(time.time())


def meter(
    job: Job,
    record: UsageRecord,
    punica_dir: Path,
    *,
    state: str,
    ended: float | None,
    bytes_fetched: int = 0,
    running: bool = False,
    number: int | None = None,
) -> Attempt:
    """The attempt under way for ``job``, ending at ``ended`` in ``state`` (None: still running);
    ``number``: its number when the caller knows it (else counted from the record)."""
    counted, queued = current_attempt(job, record)
    number = number or counted
    times = job.times or {}
    started = job.started and parse_time(job.started)
    source = "engine"
    if times.get("started_at") is not None or times.get("ended_at") is not None:
        source = "scheduler"
        queued = times.get("queued_at", queued)
        started = times.get("started_at", started)
        if ended is not None:
            ended = times.get("ended_at", ended)
    if state == "lost":
        source = "estimated"  # nobody saw it end: its end is when this side noticed
    return Attempt(
        job=job.id,
        attempt=number,
        name=job.name,
        machine=job.machine,
        kind=job.kind,
        user=job.user,
        queued=queued,
        started=started or None,
        ended=ended,
        state=state,
        gpus=gpus_held(job, punica_dir),
        nodes=nodes_held(job),
        source=source,
        bytes_sent=int(job.transfer.get("bytes_sent", 0) or 0),
        bytes_fetched=bytes_fetched,
        price_per_hour=price_of(job),
        running=running,
    )


def live_attempts(jobs: Iterable[Job], record: UsageRecord, punica_dir: Path) -> list[Attempt]:
    """Attempts under way now, from the unfinished jobs: counted up to now, marked ``running``."""
    return [
        meter(job, record, punica_dir, state=job.state, ended=None, running=True)
        for job in jobs
        if job.state in ACTIVE_STATES
    ]


def job_metrics(attempts: Iterable[Attempt], now: float) -> dict[str, float]:
    """A job's figures over all its attempts (a requeued job ran more than once), for its MLflow run."""
    total: dict[str, float] = {}
    for attempt in attempts:
        for key, value in attempt.metrics(now).items():
            total[key] = total.get(key, 0.0) + value
    return total


# -- summing -----------------------------------------------------------------------------------------
def parse_instant(value: str | None, field: str) -> float | None:
    """An ISO 8601 date or time (UTC unless it says otherwise) as epoch seconds; None stays None."""
    if value is None:
        return None
    return parse_given_time(value, field).timestamp()


def parse_group_by(value: str | Sequence[str] | None, allowed: Sequence[str] = GROUP_KEYS) -> tuple[str, ...]:
    if value is None or value == "":
        return ("machine",)
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value) if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise InvalidSettings(
            f"group_by: {unknown[0] if unknown else value!r} is not a grouping; use one or more of "
            + ", ".join(allowed),
            field="group_by",
        )
    return tuple(dict.fromkeys(names))


def _month(when: float) -> str:
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m")


def _keys(attempt: Attempt, group_by: Sequence[str], now: float) -> list[tuple[str, ...]]:
    """The groups an attempt is summed in: one, or one per hub group of its user when grouped by ``group``."""
    values = {
        "machine": attempt.machine,
        "user": attempt.user or "",
        "month": _month(attempt.end(now)),
        "kind": attempt.kind,
        "state": attempt.state,
    }
    return [
        tuple(group if name == "group" else values[name] for name in group_by)
        for group in ((attempt.groups or ("",)) if "group" in group_by else ("",))
    ]


def summarize(
    attempts: Iterable[Attempt],
    group_by: Sequence[str],
    *,
    since: float | None = None,
    until: float | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Sums per group of the attempts that ended (running ones: now) within ``[since, until]``.

    An attempt belongs to the month it ended in. Cost is an estimate, summed only over attempts on
    machines with a ``price_per_hour``; ``priced_hours`` says how many job-hours it covers.
    """
    now = time.time() if now is None else now
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for attempt in attempts:
        end = attempt.end(now)
        if (since is not None and end < since) or (until is not None and end > until):
            continue
        for key in _keys(attempt, group_by, now):
            _add(groups, key, attempt, group_by, now)
    rows = []
    for key in sorted(groups):
        row = groups[key]
        row["jobs"] = len(row["jobs"])
        for name in ("job_hours", "node_hours", "gpu_hours", "queue_hours", "priced_hours"):
            row[name] = round(row[name], 6)
        if row["cost_estimate"] is not None:
            row["cost_estimate"] = round(row["cost_estimate"], 4)
        rows.append(row)
    return {
        "group_by": list(group_by),
        "since": since,
        "until": until,
        "generated": now,
        "rows": rows,
        "note": "job_hours is wall time; node_hours is wall time x nodes held; gpu_hours is allocated "
        "(wall time x GPUs held, on every node); "
        "cost_estimate is an estimate from each machine's price_per_hour, where one is set",
    }


def _add(
    groups: dict[tuple[str, ...], dict[str, Any]],
    key: tuple[str, ...],
    attempt: Attempt,
    group_by: Sequence[str],
    now: float,
) -> None:
    row = groups.get(key)
    if row is None:
        row = groups[key] = {
            **dict(zip(group_by, key, strict=True)),
            "attempts": 0,
            "jobs": set(),
            "running": 0,
            "job_hours": 0.0,
            "node_hours": 0.0,
            "gpu_hours": 0.0,
            "queue_hours": 0.0,
            "bytes_sent": 0,
            "bytes_fetched": 0,
            "cost_estimate": None,
            "priced_hours": 0.0,
            "estimated_attempts": 0,
        }
    wall_h = attempt.wall_s(now) / 3600
    row["attempts"] += 1
    row["jobs"].add(attempt.job)
    row["running"] += attempt.running
    row["job_hours"] += wall_h
    row["node_hours"] += wall_h * attempt.nodes
    row["gpu_hours"] += wall_h * attempt.gpus
    row["queue_hours"] += attempt.queue_s(now) / 3600
    row["bytes_sent"] += attempt.bytes_sent
    row["bytes_fetched"] += attempt.bytes_fetched
    row["estimated_attempts"] += attempt.source == "estimated"
    if attempt.price_per_hour is not None:
        row["cost_estimate"] = (row["cost_estimate"] or 0.0) + wall_h * attempt.price_per_hour
        row["priced_hours"] += wall_h


CSV_FIELDS = (
    "attempts",
    "jobs",
    "running",
    "job_hours",
    "node_hours",
    "gpu_hours",
    "queue_hours",
    "bytes_sent",
    "bytes_fetched",
    "cost_estimate",
    "priced_hours",
    "estimated_attempts",
)


def summary_csv(summary: Mapping[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = [*summary["group_by"], *CSV_FIELDS]
    writer.writerow(columns)
    for row in summary["rows"]:
        writer.writerow(["" if row[c] is None else row[c] for c in columns])
    return out.getvalue()
