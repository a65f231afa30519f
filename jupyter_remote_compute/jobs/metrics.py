"""Live training metrics: what a running job logs to MLflow on its machine, read while someone watches.

A job's far-side MLflow file store keeps one file per run and metric
(``<experiment>/<run>/metrics/<key>``), one ``<timestamp> <value> <step>`` line per point, only
ever appended to. Like the log, each file is read by byte offset: the engine's ``poll_watched``
brings the bytes past the offsets given, in the poll's own round trip, and only for jobs someone
asked about within ``WATCH_FOR`` seconds, so nothing more is read or sent when no one looks.

The points read so far are kept here, in this process, in arrival order. A reader's cursor is
``<series>.<count>``: the points after the first ``count`` of that series. A series is new
whenever this process starts reading a job afresh, so a cursor from an earlier server is
answered from the start with ``reset``.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..engines.base import MetricBytes
from ..errors import InvalidSettings

#: Seconds a job stays watched after someone last asked for its metrics.
WATCH_FOR = 60.0
#: Points kept per job; older ones are dropped (a reader starting now sees the newest).
MAX_POINTS = 50_000
#: Jobs whose points are kept; the one asked about least recently is forgotten first.
MAX_JOBS = 64


@dataclasses.dataclass(frozen=True)
class Point:
    run: str
    key: str
    step: int
    value: float | None  # NaN and infinities have no JSON form
    timestamp: int  # milliseconds since the epoch, as MLflow keeps it


@dataclasses.dataclass
class _Series:
    id: str
    offsets: dict[str, int] = dataclasses.field(default_factory=dict)
    points: list[Point] = dataclasses.field(default_factory=list)
    dropped: int = 0  # points removed from the front to keep MAX_POINTS
    watched_until: float = 0.0
    asked: float = 0.0


@dataclasses.dataclass(frozen=True)
class MetricsPage:
    """Points past a cursor, grouped per run and metric, with the cursor to ask from next."""

    job_id: str
    points: list[Point]
    cursor: str
    reset: bool  # the cursor asked about another series (a restarted server): these are all points

    def latest(self) -> dict[str, tuple[int, float | None]]:
        """The last (step, value) of each metric on this page (``<run>/key`` when several runs log it)."""
        runs_of: dict[str, set[str]] = {}
        for p in self.points:
            runs_of.setdefault(p.key, set()).add(p.run)
        out: dict[str, tuple[int, float | None]] = {}
        for p in self.points:
            out[p.key if len(runs_of[p.key]) == 1 else f"{p.run[:8]}/{p.key}"] = (p.step, p.value)
        return out

    def to_json(self, watching: bool, complete: bool) -> dict[str, Any]:
        series: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for p in self.points:
            series.setdefault((p.run, p.key), []).append({"step": p.step, "value": p.value, "timestamp": p.timestamp})
        return {
            "job_id": self.job_id,
            "cursor": self.cursor,
            "reset": self.reset,
            "watching": watching,
            "complete": complete,
            "metrics": [{"run": run, "key": key, "points": pts} for (run, key), pts in series.items()],
        }


def parse_points(path: str, data: bytes) -> tuple[list[Point], int]:
    """The whole lines of a metric file's new bytes as points, and how many bytes they took.

    ``path`` is ``<experiment>/<run>/metrics/<key>``; an unfinished last line is left for the next read.
    """
    parts = path.split("/", 3)
    if len(parts) < 4 or parts[2] != "metrics" or not parts[3]:
        return [], len(data)  # not a run metric: skip its bytes
    run, key = parts[1], parts[3]
    end = data.rfind(b"\n") + 1
    points = []
    for line in data[:end].split(b"\n"):
        words = line.split()
        if len(words) < 3:
            continue
        try:
            timestamp, value, step = int(words[0]), float(words[1]), int(words[2])
        except ValueError:
            continue  # not MLflow's format: skipped, never shown wrong
        points.append(Point(run, key, step, value if math.isfinite(value) else None, timestamp))
    return points, end


class MetricWatch:
    """Which jobs someone watches, what of their metric files was read, and the points so far."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._series: dict[str, _Series] = {}
        self._listeners: list[Callable[[str], None]] = []

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Called with a job id (from the polling thread) whenever new points of it arrived."""
        self._listeners.append(listener)

    def watch(self, job_id: str, seconds: float = WATCH_FOR) -> None:
        """Someone looks at this job's metrics: read them with its polls for the next ``seconds``."""
        now = self._clock()
        with self._lock:
            series = self._series.get(job_id)
            if series is None:
                series = self._series[job_id] = _Series(uuid.uuid4().hex[:12])
                self._forget_oldest()
            series.watched_until = max(series.watched_until, now + seconds)
            series.asked = now

    def watching(self, job_id: str) -> bool:
        with self._lock:
            series = self._series.get(job_id)
            return series is not None and series.watched_until > self._clock()

    def watched(self, job_ids: Iterable[str]) -> dict[str, dict[str, int]]:
        """The offsets to read from, for those of ``job_ids`` someone watches now."""
        now = self._clock()
        with self._lock:
            return {
                job_id: dict(series.offsets)
                for job_id in job_ids
                if (series := self._series.get(job_id)) is not None and series.watched_until > now
            }

    def absorb(self, found: Mapping[str, MetricBytes]) -> None:
        """Take what a poll brought: new points, and the offsets past their whole lines."""
        changed = []
        with self._lock:
            for job_id, files in found.items():
                series = self._series.get(job_id)
                if series is None:
                    continue
                before = series.dropped + len(series.points)
                for path, (offset, data) in sorted(files.items()):
                    if offset != series.offsets.get(path, 0):
                        continue  # an answer to an older question: these bytes were taken already
                    points, used = parse_points(path, data)
                    series.points.extend(points)
                    series.offsets[path] = offset + used
                excess = len(series.points) - MAX_POINTS
                if excess > 0:
                    del series.points[:excess]
                    series.dropped += excess
                if series.dropped + len(series.points) != before:
                    changed.append(job_id)
        for job_id in changed:
            for listener in self._listeners:
                listener(job_id)

    def read(self, job_id: str, since: str | None) -> MetricsPage:
        """The points after cursor ``since`` (all of them without one, or for another series)."""
        count, series_id = 0, None
        if since:
            series_id, _, number = since.partition(".")
            if not number.isdigit() or not series_id:
                raise InvalidSettings(
                    "since: expected a cursor from an earlier answer (<series>.<count>)", field="since"
                )
            count = int(number)
        with self._lock:
            series = self._series.get(job_id)
            if series is None:
                return MetricsPage(job_id, [], "", reset=bool(since))
            reset = series_id is not None and series_id != series.id
            start = 0 if reset or series_id is None else max(0, count - series.dropped)
            points = series.points[start:]
            return MetricsPage(job_id, points, f"{series.id}.{series.dropped + len(series.points)}", reset)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._series.pop(job_id, None)

    def _forget_oldest(self) -> None:
        while len(self._series) > MAX_JOBS:
            oldest = min(self._series, key=lambda j: self._series[j].asked)
            del self._series[oldest]
