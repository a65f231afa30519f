"""An attempt that ended, and the next one: retries with a reason, on the next machine, from the last checkpoint.

A job with ``retry: {max, on, exit_codes, backoff}`` whose attempt ended for a cause its policy names
(``Outcome.cause``: lost, preempted, machine_unreachable, failed) does not end: collection brings its
checkpoints and log home, then ``requeue`` puts it back in the queue as its next attempt, in one store
transaction, with the same id and key. The ended attempt joins ``Job.attempts`` (machine, started, ended,
how it ended, why) and is metered as a scheduler's requeue is (``end_attempt``, which the Slurm requeue
path uses too). An attempt that ended lost, preempted or machine_unreachable moves to the next machine
of ``[first machine, *fallback]`` that is still there and enabled (round the list: a machine that was
down may be back); a failed one stays where it was.

The next attempt is sent as the first was, with the newest complete checkpoint set at home
(``.punica/checkpoints/<job id>/``) among its inputs, in its ``checkpoints`` folder: a script that
resumes from its newest checkpoint continues. On the same machine, the ended attempt's far folder
(same name: the job's id) is removed first, so the launcher does not find the old process's pid.

A machine that does not answer past its ``unreachable_after`` (seconds; a job whose policy retries
``machine_unreachable`` and whose machine sets none: ``DEFAULT_UNREACHABLE_AFTER``) ends the attempt
without asking it anything more: ``machine_unreachable``. A machine that sets none, for a job that
retries nothing for it, is waited for as before.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from ..engines.base import Engine, EngineError, InputFile, RemoteJob
from ..errors import RemoteComputeError
from ..machines.admin import snapshot_of
from ..machines.registry import Machine
from ..schema.job import JobAttempt
from ..schema.pool import Pool
from ..schema.retry import MACHINE_FAULTS
from ..transfer.manifest import DigestCache
from ..usage.ledger import REQUEUED, meter
from .checkpoints import home_of
from .context import JobContext
from .job import Job, Outcome, parse_time, utcnow
from .leases import Leases
from .placement import POOL_KIND
from .transitions import move

log = logging.getLogger(__name__)

#: How long a machine may not answer before a job that retries ``machine_unreachable`` gives up on it,
#: when the machine does not say (its ``unreachable_after`` option; seconds).
DEFAULT_UNREACHABLE_AFTER = 600.0


def end_attempt(ctx: JobContext, job: Job, *, ended: float, number: int | None = None) -> None:
    """Meter the attempt of ``job`` (as it was when it ended) that a next attempt follows.

    ``number``: the attempt's number when the caller knows it (``len(job.attempts) + 1``), so a line
    written again after a crash is the same attempt's, which the usage record keeps once.
    """
    attempt = meter(job, ctx.usage, ctx.workspace.punica_dir, state=REQUEUED, ended=ended, number=number)
    ctx.usage.append(attempt)


def attempt_record(job: Job, end: str, reason: str | None, ended: str | None = None) -> JobAttempt:
    """``job``'s attempt under way as ``Job.attempts`` keeps it once it ended."""
    ended = ended or utcnow()
    record = JobAttempt(machine=job.machine, started=job.started, ended=ended, end=end, reason=reason)
    if job.started and end != "succeeded":
        # What the next attempt does again: the work since the newest checkpoint that came home.
        since = parse_time(job.started)
        if job.checkpoint:
            since = max(since, parse_time(job.checkpoint["at"]))
        record["lost_s"] = round(max(0.0, parse_time(ended) - since), 3)
    return record


def with_last_attempt(job: Job, outcome: Outcome, ended: str) -> dict[str, list[JobAttempt]]:
    """The job's ``attempts`` with its last one, as its end writes them: only for a job that had more
    than one or whose policy allowed more (a job without either shows none, as before)."""
    if not job.attempts and job.spec.retry is None:
        return {}
    return {"attempts": [*job.attempts, attempt_record(job, outcome.cause or outcome.state, outcome.reason, ended)]}


def run_attempts(attempts: Sequence[JobAttempt]) -> tuple[dict[str, str], ...]:
    """Attempts as the job's MLflow run tags them: where each ran and how it ended."""
    return tuple({"machine": a["machine"], "end": a["end"]} for a in attempts)


def unreachable_after(job: Job) -> float | None:
    """Seconds the job's machine may not answer before its attempt ends ``machine_unreachable``; None: no limit."""
    limit = (job.machine_snapshot.get("options") or {}).get("unreachable_after")
    if isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit > 0:
        return float(limit)
    policy = job.spec.retry
    if policy is not None and "machine_unreachable" in policy.on:
        return DEFAULT_UNREACHABLE_AFTER
    return None


def wait_left(job: Job, now: float | None = None) -> float:
    """Seconds before a queued next attempt may be sent (its policy's backoff); 0 for a first attempt."""
    policy = job.spec.retry
    if not job.attempts or policy is None or not policy.backoff:
        return 0.0
    due = parse_time(job.attempts[-1]["ended"]) + policy.wait_before(len(job.attempts) + 1)
    return max(0.0, due - (time.time() if now is None else now))


def checkpoint_inputs(job: Job, punica: Path, digests: DigestCache) -> list[InputFile]:
    """The newest complete checkpoint set at home, as inputs into the job's ``checkpoints`` folder."""
    folder = job.spec.checkpoints
    if not folder or not job.attempts:
        return []
    home = home_of(job, punica)
    try:
        root = home.resolve(strict=True)  # the set the link names now: it does not change while no attempt runs
    except OSError:
        return []  # none came home
    files = []
    for dirpath, _dirs, names in os.walk(root):
        for name in sorted(names):
            path = Path(dirpath) / name
            st = path.stat()
            rel = path.relative_to(root).as_posix()
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            files.append(InputFile(f"{folder}/{rel}", path, st.st_size, digests.digest(path, st), mode))
    return files


class Retries:
    """Whether an ended attempt is retried, and its requeue."""

    def __init__(self, ctx: JobContext, leases: Leases) -> None:
        self.ctx = ctx
        self.leases = leases

    def retried(self, job: Job, outcome: Outcome) -> bool:
        """Whether the job's policy sends the attempt that ended with ``outcome`` back to the queue."""
        policy = job.spec.retry
        if policy is None or job.cancel_requested or outcome.state in ("succeeded", "cancelled"):
            return False
        return len(job.attempts) < policy.max and policy.retries(outcome.cause, job.exit_code)

    def requeue(
        self,
        job: Job,
        outcome: Outcome,
        engine: Engine,
        remote: RemoteJob,
        log_path: Path | None,
        machine: Machine | Pool,
    ) -> bool:
        """collecting → queued as the next attempt on ``machine``, or in a pool's queue, where placement
        gives it a machine (``next_machine``; compare-and-set, under this process's lease); False when the
        job was no longer this process's to move."""
        cause = outcome.cause or outcome.state
        number = len(job.attempts) + 1
        # Metered first, before the requeue commits: after a crash anywhere from here on (the far
        # folder's removal may take a while), the same attempt is metered again under the same number,
        # which the usage record keeps once.
        end_attempt(self.ctx, job, ended=outcome.at or time.time(), number=number)
        handle: dict[str, object] = {}
        if engine.is_prepared(remote) and outcome.reach_machine:
            try:
                engine.cleanup(remote)  # on the same machine the next attempt's folder has the same name
            except (EngineError, RemoteComputeError) as e:
                log.warning("job %s: the ended attempt's folder stays on %s: %s", job.id, job.machine, e)
                if machine.name == job.machine:
                    handle = dict(job.handle)  # removed before the next attempt starts there (Driver._launch)
        elif machine.name == job.machine:
            handle = dict(job.handle)
        if log_path is not None and log_path.exists():  # the next attempt's log lands where this one's is
            os.replace(log_path, log_path.with_name(f"attempt-{number}.log"))
        total = (job.spec.retry.max if job.spec.retry else 0) + 1
        where = f" on {machine.name}" if machine.name != job.machine else ""
        if isinstance(machine, Pool):
            where = f" in pool {machine.name}"
        with self.ctx.store.transaction() as jobs:
            current = jobs[job.id]
            if current.state != "collecting" or not (current.lease and self.leases.holds(current.lease)):
                return False
            move(current, "queued")
            record = attempt_record(current, cause, outcome.reason)  # with the checkpoint its last look brought
            current.attempts = [*current.attempts, record]
            if isinstance(machine, Pool):
                # Waiting in the pool's queue (Job.waiting) until a placement pass gives it a machine.
                current.machine, current.kind, current.pool = machine.name, POOL_KIND, machine.name
                current.machine_snapshot, current.placement = {}, None
            else:
                current.machine, current.kind = machine.name, machine.kind
                current.machine_snapshot = snapshot_of(machine)
            current.handle = handle
            current.reason = f"attempt {number + 1} of at most {total}{where}: attempt {number} {cause}" + (
                f" ({outcome.reason})" if outcome.reason else ""
            )
            current.started = current.exit_code = current.outcome = current.lease = current.failing_since = None
            current.times, current.transfer, current.log_size, current.retries = {}, {}, 0, 0
        self.ctx.emit(current)
        log.info("job %s: %s", job.id, current.reason)
        return True

    def next_machine(self, job: Job, outcome: Outcome) -> Machine | Pool | None:
        """Where the attempt after the one that ended with ``outcome`` runs: after a machine's fault, a job
        of a pool goes back to its pool's queue, and another job to the next usable entry of its list (a
        machine, or a pool whose queue it joins); else (and when no other can take it) the machine it ran
        on; None: not even that one."""
        cause = outcome.cause or outcome.state
        if cause in MACHINE_FAULTS and job.pool is not None and job.spec.machine == job.pool:
            pool = self._pool(job.pool)
            if pool is not None:
                return pool
        order = [job.attempts[0]["machine"] if job.attempts else job.machine, *job.spec.fallback]
        if cause in MACHINE_FAULTS and len(order) > 1:
            at = order.index(job.machine) if job.machine in order else 0
            for name in order[at + 1 :] + order[:at]:
                pool = self._pool(name)
                if pool is not None:
                    return pool
                try:
                    machine = self.ctx.admin.resolve(name)
                except RemoteComputeError as e:
                    log.warning("job %s: fallback machine %s is not usable: %s", job.id, name, e)
                    continue
                if machine.enabled:
                    return machine
        try:
            current = self.ctx.admin.resolve(job.machine)
        except RemoteComputeError as e:
            log.warning("job %s: its machine %s is not usable for another attempt: %s", job.id, job.machine, e)
            return None
        return current if current.enabled else None

    def _pool(self, name: str) -> Pool | None:
        """compute.yaml's pool of that name, if there is one (pools and machines never share a name)."""
        try:
            _machines, pools = self.ctx.admin.registry.machines_and_pools()
        except RemoteComputeError as e:
            log.warning("could not read the pools: %s", e)
            return None
        return next((pool for pool in pools if pool.name == name), None)
