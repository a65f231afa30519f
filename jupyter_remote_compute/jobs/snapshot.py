"""What a process last read of the state file (``Snapshot``), and a transaction's view over it (``JobMap``).

Snapshots share one map of jobs and keep their changes over it in a second layer (``Layers``); each
job's JSON text is kept for the object it was made from (``FragmentCache``), so a commit writes only
what changed.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

from .job import Job

RECENT_DELTAS = 32  # how many snapshots back ``Snapshot.changes_since`` can reach
#: Changes a snapshot keeps over the map it was made from before they are folded into a new map: a
#: fold copies every job (3-4 ms at 100,000, under the file lock), so it is paid once per this many.
FOLD_AT = 1024


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
        return job_in(self.layers, job_id)

    def held(self, job_id: str) -> Job:
        """A job the snapshot is known to hold: an id from its own ``changes_since`` or an index of it."""
        job = job_in(self.layers, job_id)
        assert job is not None, f"snapshot {self.generation} lacks job {job_id}"
        return job

    @property
    def jobs(self) -> dict[str, Job]:
        """Every job by id, as one map: made from the layers on first use, then kept."""
        layers = self.layers
        jobs = whole_map(layers)
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


def job_in(layers: Layers, job_id: str) -> Job | None:
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


def whole_map(layers: Layers) -> dict[str, Job]:
    return _folded(*layers) if layers[1] else layers[0]


def with_changes(layers: Layers, changes: dict[str, Job | None]) -> Layers:
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
        return with_changes(self._snapshot.layers, changes)

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


class FragmentCache:
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
