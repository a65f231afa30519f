"""Forgetting old finished jobs, so the state file stays small over months of work.

Only finished jobs are ever pruned. They leave the state file in one transaction; then, best
effort, their folders on the far side (``engine.cleanup``) and their private folder under
``.punica/jobs/`` go too. Their MLflow runs stay: the record of what was trained outlives the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..engines.base import EngineError, RemoteJob
from ..errors import InvalidSettings, RemoteComputeError
from .job import Job, parse_time
from .listing import parse_states
from .spec import parse_duration
from .transitions import TERMINAL_STATES

if TYPE_CHECKING:
    from .service import JobService

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PruneResult:
    removed: list[str]  # job ids, newest first
    cleaned: int  # far-side folders removed
    #: machine -> why its jobs' far-side folders were left in place (unreachable, removed machine …)
    left_on_machines: dict[str, str]
    state_file_bytes: tuple[int, int]  # before, after
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "removed": self.removed,
            "count": len(self.removed),
            "cleaned": self.cleaned,
            "left_on_machines": self.left_on_machines,
            "state_file_bytes": {"before": self.state_file_bytes[0], "after": self.state_file_bytes[1]},
            "dry_run": self.dry_run,
        }


def prune_states(value: str | Iterable[str] | None) -> frozenset[str]:
    """Which finished states to prune (default: all of them); an active state is refused by name."""
    states = parse_states(value) or TERMINAL_STATES
    active = sorted(states - TERMINAL_STATES)
    if active:
        raise InvalidSettings(
            f"state: {active[0]!r} jobs are not finished and are never pruned; "
            f"choose from {', '.join(sorted(TERMINAL_STATES))}",
            field="state",
        )
    return states


def _finished_at(job: Job) -> float:
    return parse_time(job.ended or job.updated or job.created)


def _select(jobs: Iterable[Job], states: frozenset[str], cutoff: float | None, keep_newest: int | None) -> list[Job]:
    finished = sorted((j for j in jobs if j.state in states), key=lambda j: (j.created, j.id), reverse=True)
    if keep_newest is not None:
        finished = finished[keep_newest:]
    if cutoff is not None:
        finished = [j for j in finished if _finished_at(j) < cutoff]
    return finished


def _size(service: JobService) -> int:
    """The state file's bytes with its journal's."""
    total = 0
    for path in (service.store.path, service.store.journal_path):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def prune_jobs(
    service: JobService,
    *,
    older_than: str | float | None = None,
    states: str | Iterable[str] | None = None,
    keep_newest: int | None = None,
    dry_run: bool = False,
) -> PruneResult:
    """Remove finished jobs that ended more than ``older_than`` ago and/or beyond the newest ``keep_newest``."""
    age = parse_duration(older_than, "older_than")
    wanted = prune_states(states)
    if keep_newest is not None and (
        not isinstance(keep_newest, int) or isinstance(keep_newest, bool) or keep_newest < 0
    ):
        raise InvalidSettings("keep_newest: expected a whole number of at least 0", field="keep_newest")
    if age is None and keep_newest is None:
        raise InvalidSettings("older_than: say how old a finished job must be to go, e.g. 90d", field="older_than")
    cutoff = None if age is None else time.time() - age
    before = _size(service)

    if dry_run:
        chosen = _select(service.store.jobs().values(), wanted, cutoff, keep_newest)
        return PruneResult([j.id for j in chosen], 0, {}, (before, before), dry_run=True)

    with service.store.transaction() as jobs:
        # Chosen again under the lock: a job that changed meanwhile is judged as it is now.
        chosen = _select(jobs.values(), wanted, cutoff, keep_newest)
        for job in chosen:
            jobs.pop(job.id)
    if chosen:
        service.store.compact()  # forgetting is recorded in the journal: fold it in, so the file shrinks now
    after = _size(service)

    cleaned = 0
    left: dict[str, str] = {}
    for job in chosen:
        shutil.rmtree(service.workspace.job_dir(job.id), ignore_errors=True)
        if not job.handle or job.machine in left:
            continue  # never started, or its machine already failed to answer: do not wait on it again
        try:
            service.engine(job.machine, job.machine_snapshot).cleanup(RemoteJob(job.id, job.key, job.handle))
            cleaned += 1
        except (EngineError, RemoteComputeError, OSError) as e:
            left[job.machine] = str(e) or type(e).__name__
            log.warning("pruning: left the folders of %s's jobs in place: %s", job.machine, e)
    if chosen:
        log.info("pruned %d finished jobs; state file %d -> %d bytes", len(chosen), before, after)
    return PruneResult([j.id for j in chosen], cleaned, left, (before, after))
