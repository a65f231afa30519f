"""Who drives a job now: the lease on a job, and the store writes that take or give it up.

Steps that must not run twice (sending and starting, collecting and recording) are taken under a
lease stored on the job: the process that holds it does the work; a lease whose process died is
free again, so a job outlives whoever started it. Inside one process, a lock per job keeps two
threads from driving the same job at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..engines.base import ProgressCallback
from ..errors import NotFound
from .context import JobContext
from .job import Job, Outcome, utcnow
from .liveness import holder_alive, process_identity
from .transitions import State, move

log = logging.getLogger(__name__)

LEASE_RENEW_EVERY = 60.0  # seconds; well inside store.FOREIGN_LEASE_TTL

# One lock per job for every JobService of this process (a pipeline runner may hold several), so two
# threads of one process never drive the same job at once; across processes the job's lease decides.
_JOB_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_JOB_LOCKS_GUARD = threading.Lock()


class Leases:
    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.identity = process_identity()

    def job_lock(self, job_id: str) -> threading.Lock:
        with _JOB_LOCKS_GUARD:
            return _JOB_LOCKS.setdefault((str(self.ctx.store.path), job_id), threading.Lock())

    def claim(self, job_id: str, states: set[str], **changes: Any) -> Job | None:
        """Take the job's lease if it is in one of ``states`` and nobody alive holds it."""
        if "state" in changes:
            raise TypeError("a job's state changes through transitions.move, not by claiming it")
        with self.ctx.store.transaction() as jobs:
            job = jobs[job_id]
            if job.state not in states:
                return None
            if job.lease and not self.holds(job.lease) and holder_alive(job.lease):
                return None
            job.lease = {**self.identity, "renewed": time.time()}
            for name, value in changes.items():
                setattr(job, name, value)
            job.updated = utcnow()
        self.ctx.emit(job)
        return job

    def holds(self, lease: dict[str, Any]) -> bool:
        return all(lease.get(k) == v for k, v in self.identity.items())

    def renewer(self, job_id: str, then: ProgressCallback | None = None) -> ProgressCallback:
        """A progress callback that also keeps this process's lease fresh during a long transfer."""
        last = time.monotonic()

        def renew(done: int, total: int) -> None:
            nonlocal last
            if time.monotonic() - last > LEASE_RENEW_EVERY:
                last = time.monotonic()
                with self.ctx.store.transaction() as jobs:
                    job = jobs.get(job_id)
                    if job is not None and job.lease and self.holds(job.lease):
                        job.lease = {**job.lease, "renewed": time.time()}
            if then:
                then(done, total)

        return renew

    def update(self, job_id: str, *, to: State | None = None, **changes: Any) -> Job:
        """Change fields of a job, and with ``to`` move it to that state (``transitions.move``)."""
        if "state" in changes:
            raise TypeError("a job's state changes through transitions.move: pass to=")
        with self.ctx.store.transaction() as jobs:
            job = jobs.get(job_id)
            if job is None:
                raise NotFound(f"job {job_id} is no longer in {self.ctx.store.path}")
            for name, value in changes.items():
                setattr(job, name, value)
            job.updated = utcnow()
            if to is not None:
                move(job, to, now=job.updated)
        self.ctx.emit(job)
        return job

    def retry_later(self, job: Job, error: Exception, give_up_state: State, give_up_reason: str) -> None:
        """A passing failure (a dropped connection): let go and try on a later poll, for a while.

        Past ``give_up_after`` seconds of failing, the job ends with ``give_up_reason`` and nothing
        more is asked of the machine.
        """
        now = time.time()
        since = job.failing_since or now
        log.warning("job %s: %s (failing for %.0f s)", job.id, error, now - since)
        if now - since > self.ctx.settings.give_up_after:
            self.finish_later(job.id, give_up_state, f"{give_up_reason}: {error}", reach_machine=False)
        else:
            # The reason says why it is stuck (a full disk, a machine down) while it tries again.
            reason = f"{give_up_reason}: {error}; trying again"
            self.update(job.id, lease=None, retries=job.retries + 1, failing_since=since, reason=reason)

    def finish_later(self, job_id: str, state: State, reason: str, *, reach_machine: bool = True) -> None:
        """Decide the outcome now; collection records it (log, MLflow) and ends the job.

        ``reach_machine=False``: collect without asking the machine for anything (it could not be reached).
        """
        outcome = Outcome(state, reason, reach_machine, at=time.time())
        self.update(job_id, to="collecting", outcome=outcome, lease=None)
