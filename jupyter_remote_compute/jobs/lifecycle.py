"""Submitted to running to stopped: driving a job forward, one step at a time.

    queued → sending → running ⇄ pending → collecting → succeeded | failed | cancelled | lost

``pending``: the machine holds the job but someone else decides when it runs (a scheduler's
queue); the engine's poll says so with the reason, and the job moves back and forth as polls say.

Any process may drive a job (the server's poller, a kernel waiting in the magic, the CLI, a
pipeline runner); they coordinate through the state file. Sending and starting are taken under
the job's lease (leases.py); polling a running job needs none: it only reads, and its transition
is a compare-and-set inside a store transaction. Collection is collect.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from ..engines.base import (
    Engine,
    EngineError,
    InputFile,
    LaunchSpec,
    NotReady,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
)
from ..engines.farside import BUILDING
from ..engines.launcher import STORE_SCHEME
from ..environments import image as images
from ..environments import image_registry as registry
from ..environments.environment import builds, environment_inputs, launch_command, local_uv, tool_inputs, wheel_inputs
from ..errors import InvalidSettings, RemoteComputeError
from ..machines.facts import known_facts
from ..recording.tracking import is_folder_store, tracking_uri
from ..schema.retry import CAUSES, Cause
from ..schema.spec import CHECKPOINTS_VAR, STORE_SCHEME_VAR
from ..transfer.manifest import DigestCache
from . import recording
from .checkpoints import Checkpoints
from .collect import Collector
from .context import JobContext, remote_of
from .job import Job, Outcome, parse_time, utcnow
from .leases import Leases
from .liveness import holder_alive
from .logs import secret_env
from .placement import Placement
from .retries import attempt_record, checkpoint_inputs, end_attempt, unreachable_after, wait_left
from .spec import format_duration
from .transitions import ON_MACHINE_STATES, TERMINAL_STATES, State, move

log = logging.getLogger(__name__)


class Driver:
    def __init__(
        self, ctx: JobContext, leases: Leases, collector: Collector, digests: DigestCache, checkpoints: Checkpoints
    ) -> None:
        self.ctx = ctx
        self.leases = leases
        self.collector = collector
        self.digests = digests
        self.checkpoints = checkpoints
        self.placement = Placement(ctx)
        #: Bytes moved so far for jobs this process is sending: job id -> (done, total).
        self.progress: dict[str, tuple[int, int]] = {}

    def advance(self, job_id: str, *, progress: ProgressCallback | None = None) -> Job:
        """Take the job as far as it can go now, without waiting for it to finish."""
        job = self.ctx.store.get(job_id)
        if job.waiting and job.pool is not None:
            self.place([job.pool])  # whoever follows a pool's job places it (the CLI, the magic)
            job = self.ctx.store.get(job_id)
        self._drive(job, progress=progress)
        return self.ctx.store.get(job_id)

    def _drive(
        self,
        job: Job,
        status: RemoteStatus | None = None,
        *,
        progress: ProgressCallback | None = None,
        transfer: Callable[[Job], None] | None = None,
    ) -> None:
        """One step for one job. ``transfer`` takes sending and collecting elsewhere (the server's pool)."""
        lock = self.leases.job_lock(job.id)
        if not lock.acquire(blocking=False):
            return  # another thread of this process is on it
        try:
            job = self.ctx.store.get(job.id)
            if job.waiting and not job.cancel_requested:
                return  # in its pool's queue: a placement pass moves it (placement.py)
            if job.state in ON_MACHINE_STATES:
                self._watch(job, status)
                job = self.ctx.store.get(job.id)
                self.checkpoints.tick(job)  # handed to its own threads when due
            if job.state in ("queued", "sending", "collecting") and transfer is not None:
                if job.lease is None or not holder_alive(job.lease):
                    transfer(job)
                return
            if job.state in ("queued", "sending"):
                self._launch(job, progress)
                job = self.ctx.store.get(job.id)
                if job.state in ON_MACHINE_STATES:
                    self._watch(job)
                    job = self.ctx.store.get(job.id)
            if job.state == "collecting":
                self.collector.collect(job)
                if self.ctx.store.get(job.id).state in TERMINAL_STATES and not job.waiting:
                    self.place()  # its machine has room again: a pool's next job takes it now
        except Exception as e:  # a bug or an unexpected OS error must not leave the job active for ever
            current = self.ctx.store.jobs().get(job.id)
            if current is None:
                # Removed from the state file while being driven (the file or the workspace deleted):
                # there is nothing left to record its progress in.
                log.info("job %s is no longer in %s: no longer followed", job.id, self.ctx.store.path)
                return
            log.exception("job %s: %s", job.id, e)
            if current.active:
                if current.state == "collecting" and current.lease and self.leases.holds(current.lease):
                    # A full disk must not stay full of a half fetch: the next attempt fetches again.
                    shutil.rmtree(self.ctx.workspace.job_dir(job.id) / "incoming", ignore_errors=True)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.ctx.workspace.job_dir(job.id) / "log.part")
                self.leases.retry_later(current, e, "failed", f"{current.state} failed on this side")
        finally:
            lock.release()

    def poll_active(self, transfer: Callable[[Job], None] | None = None) -> None:
        """One pass over every unfinished job: one poll per machine, then each job advanced.

        With ``transfer``, sending and collecting (long) are handed to it instead of run here.
        Runs whose recorder died are handed to a new one (recording.py).
        """
        recording.resume(self.ctx)
        # Jobs waiting in pools take the room that came free since the last pass (a job ended, a machine
        # enabled or checked); before the pass, so those placed are sent in it.
        self.place()
        jobs = self.ctx.store.active_jobs()
        running: dict[str, list[Job]] = {}
        for job in jobs:
            if job.state in ON_MACHINE_STATES:
                running.setdefault(job.machine, []).append(job)
        statuses: dict[str, RemoteStatus] = {}
        for machine, group in running.items():
            try:
                statuses.update(self._poll(self.ctx.engine_of(group[0]), group))
            except EngineError as e:
                log.warning("polling %s failed: %s", machine, e)
                for job in group:
                    self._unanswered(job, e)
            except Exception:
                log.exception("polling %s failed", machine)
        for job in jobs:
            if job.state not in ON_MACHINE_STATES or job.id in statuses:
                self._drive(job, statuses.get(job.id), transfer=transfer)

    def place(self, pools: list[str] | None = None) -> None:
        """A placement pass (placement.py); a broken compute.yaml must not stop the other jobs being driven."""
        try:
            self.placement.place(pools)
        except RemoteComputeError as e:
            log.warning("placing the pools' waiting jobs failed: %s", e.message)

    def _poll(self, engine: Engine, jobs: list[Job]) -> dict[str, RemoteStatus]:
        """One round trip for the jobs' states, bringing the new metrics of those someone watches."""
        remotes = [remote_of(j) for j in jobs]
        watched = self.ctx.metrics.watched(j.id for j in jobs)
        if not watched:
            return engine.poll(remotes)
        statuses, found = engine.poll_watched(remotes, watched)
        self.ctx.metrics.absorb(found)
        return statuses

    # -- queued / sending → running -----------------------------------------
    def _launch(self, job: Job, progress: ProgressCallback | None) -> None:
        if job.state == "queued" and not job.cancel_requested and wait_left(job) > 0:
            return  # a next attempt waits out its retry policy's backoff
        claimed = self.leases.claim(job.id, {"queued", "sending"})
        if claimed is None:
            return
        job = claimed
        if job.cancel_requested:
            self.leases.finish_later(job.id, "cancelled", cancelled_by(job.cancel_requested, before_start=True))
            return
        engine = self.ctx.engine_of(job)
        remote = remote_of(job)
        try:
            if job.state == "queued" and job.attempts and engine.is_prepared(remote):
                # A next attempt on the machine of one whose folder could not be removed then: the
                # launcher would find that attempt's pid in the folder of the same name.
                engine.cleanup(remote)
                remote = RemoteJob(job.id, job.key, {})
            # Every step is idempotent (the launcher finds a command it started already), so a
            # job whose sender died is simply sent and started again by whoever picks it up.
            job = self.leases.update(job.id, to="sending", handle=dict(remote.handle))
            remote = engine.prepare(remote)
            self.leases.update(job.id, handle=dict(remote.handle))
            jobdir = self.ctx.workspace.job_dir(job.id)
            punica = self.ctx.workspace.punica_dir
            facts = known_facts(punica, job.machine) if builds(job.spec) else None
            wheels = wheel_inputs(job, jobdir, self.digests, punica / "wheels", facts)
            files = self._inputs(job) + environment_inputs(job, jobdir, self.digests)
            files += tool_inputs(job, self.digests, facts) + wheels
            # A next attempt starts from the newest checkpoint set that came home (retries.py).
            files += checkpoint_inputs(job, punica, self.digests)

            def report(done: int, total: int) -> None:
                self.progress[job.id] = (done, total)
                if progress:
                    progress(done, total)

            report = self.leases.renewer(job.id, report)

            stats = engine.send(remote, files, report)
            env, secrets = job.spec.plain_env(), secret_env(self.ctx.secrets, job)
            # The environment goes ahead of the command, and both into the image when the job names one.
            uv = local_uv(job)
            command = images.launch_command(
                job.spec,
                launch_command(job, jobdir, files),
                [*env, *secrets],
                engine,
                env_cache=builds(job.spec),
                read_only=[str(uv)] if uv else (),
            )
            # After the command: the pull's variables are container.sh's, not the container's.
            pull_env, pull_secrets = registry.pull_env(job, engine.machine_options, self.ctx.secrets)
            # The launcher makes the checkpoint folder and gives the job its path (launcher.JOB_ENV_SH).
            folder = {CHECKPOINTS_VAR: job.spec.checkpoints} if job.spec.checkpoints else {}
            # The job's store shows the scheme of the one its run lands in: a folder, or not (launcher.JOB_ENV_SH).
            lands_in = job.tracking_uri or tracking_uri(self.ctx.workspace.root, self.ctx.settings.tracking)
            store = {} if is_folder_store(lands_in) else {STORE_SCHEME_VAR: STORE_SCHEME}
            launch = LaunchSpec(
                command=command,
                env={**env, **pull_env, **folder, **store},
                secret_env={**secrets, **pull_secrets},
                resources=job.spec.resources,
                timeout=job.spec.timeout,
            )
            # Asked while it was sent: by whom is the store's (``job`` is from before).
            if who := self.ctx.store.get(job.id).cancel_requested:
                self.leases.finish_later(job.id, "cancelled", cancelled_by(who, before_start=True))
                return
            remote = engine.start(remote, launch)
            self.leases.update(
                job.id,
                to="running",
                reason=None,
                started=utcnow(),
                handle=dict(remote.handle),
                transfer=dataclasses.asdict(stats),
                lease=None,
                retries=0,
                failing_since=None,
            )
        except NotReady as e:
            # The machine is still being made (a cloud cluster provisioning): wait for it as pending,
            # keeping what the engine needs to follow it; poll says when it is ready to send.
            self.leases.update(
                job.id, to="pending", reason=e.reason, handle=e.handle, lease=None, retries=0, failing_since=None
            )
        except EngineError as e:
            if e.transient:
                self.leases.retry_later(job, e, "failed", f"could not start on {job.machine}")
            else:
                self.leases.finish_later(job.id, "failed", f"could not start on {job.machine}: {e}")
        except RemoteComputeError as e:
            self.leases.finish_later(job.id, "failed", f"could not start on {job.machine}: {e.message}")
        finally:
            self.progress.pop(job.id, None)

    def _inputs(self, job: Job) -> list[InputFile]:
        """The inputs as hashed at submit; a file changed since then fails the job rather than send other data."""
        manifest = json.loads((self.ctx.workspace.job_dir(job.id) / "inputs.json").read_bytes())
        files = []
        for entry in manifest["files"]:
            path = self.ctx.workspace.root / entry["path"]
            try:
                st = path.stat()
                digest = self.digests.digest(path.resolve(), st)
            except OSError:
                raise InvalidSettings(f"send: {entry['path']!r} disappeared after the job was submitted") from None
            if digest != entry["sha256"]:
                raise InvalidSettings(f"send: {entry['path']!r} changed after the job was submitted; submit again")
            files.append(
                InputFile(entry["path"], path.resolve(), st.st_size, digest, 0o755 if st.st_mode & 0o111 else 0o644)
            )
        self.digests.save()
        return files

    # -- running ------------------------------------------------------------
    def _watch(self, job: Job, status: RemoteStatus | None = None) -> None:
        engine = self.ctx.engine_of(job)
        remote = remote_of(job)
        stop: tuple[str, str] | None = None
        if job.cancel_requested:
            stop = ("cancelled", cancelled_by(job.cancel_requested))
        elif (
            job.state == "running"
            and job.spec.timeout
            and job.started
            and time.time() - parse_time(job.started) > job.spec.timeout
        ):
            stop = ("failed", f"timed out after {format_duration(job.spec.timeout)}")
        try:
            if stop is not None:
                engine.cancel(remote, self.ctx.settings.cancel_grace)
                self._to_collecting(job, *stop)
                return
            if status is None:
                status = self._poll(engine, [job])[job.id]
        except EngineError as e:
            if stop is not None:
                reason = f"{stop[1]}; the process could not be stopped on {job.machine} and may still run"
                self.leases.retry_later(job, e, stop[0], reason)
            else:
                # A dropped connection is not a dead job: look again on the next poll.
                log.warning("job %s: %s", job.id, e)
                self._unanswered(job, e)
            return
        if status.state == "queued" and job.state == "pending":
            self._requeue(job)
            return
        if status.warned and job.spec.checkpoints:
            self.checkpoints.warned(job.id)  # its last checkpoints before it is stopped: every poll from now
        if status.notices and list(status.notices) != job.notices:
            # The organization's quota notices (a job on its machines): on the job, whatever the poll says.
            job = self.leases.update(job.id, notices=list(status.notices))
        times = scheduler_times(job, status)
        if status.state in ("pending", "running") and job.state != status.state:
            self._move(job, status, times)
            return
        changes: dict[str, Any] = {"times": times} if times is not None else {}
        if job.failing_since is not None:
            changes["failing_since"] = None  # it answered
        if status.state == "pending" and (status.detail or None) != job.reason:
            changes["reason"] = status.detail or None
        elif status.state == "running" and (status.detail or None) != job.reason and _building(status, job):
            changes["reason"] = status.detail or None  # the environment's build, while it lasts
        if status.state == "exited":
            outcome = "succeeded" if status.exit_code == 0 else "failed"
            cause: Cause | None = "failed" if status.exit_code != 0 else None
            self._to_collecting(job, outcome, None, exit_code=status.exit_code, times=times, cause=cause)
        elif status.state in ("failed", "cancelled"):
            cause = _cause(status.cause) or ("failed" if status.state == "failed" else None)
            detail = status.detail or None
            self._to_collecting(job, status.state, detail, exit_code=status.exit_code, times=times, cause=cause)
        elif status.state == "gone":
            cause = _cause(status.cause)
            if cause is not None:
                reason = f"{cause}: {status.detail}"  # the machine said why (its node failed, its agent went quiet)
            else:
                reason = f"lost: the process vanished on {job.machine} ({status.detail})"
                cause = "lost" if status.detail != "cancelled" else None
            self._to_collecting(job, "lost", reason, times=times, cause=cause, cancelled=status.detail == "cancelled")
        else:
            if status.log_size is not None and status.log_size != job.log_size:
                changes["log_size"] = status.log_size
            if changes:
                self.leases.update(job.id, **changes)

    def _unanswered(self, job: Job, error: EngineError) -> None:
        """A poll of the job's machine failed: past the machine's limit (retries.unreachable_after) the
        attempt ends machine_unreachable, without asking the machine for anything more."""
        limit = unreachable_after(job)
        if limit is None or job.state != "running":
            return
        now = time.time()
        if job.failing_since is None:
            with self.ctx.store.transaction() as jobs:
                current = jobs[job.id]
                if current.state == job.state and current.failing_since is None:
                    current.failing_since = now
            return
        if now - job.failing_since > limit:
            reason = f"machine_unreachable: {job.machine} did not answer for {format_duration(limit)} ({error})"
            self._to_collecting(job, "lost", reason, cause="machine_unreachable", reach_machine=False)

    def _move(self, job: Job, status: RemoteStatus, times: dict[str, float] | None = None) -> None:
        """running ⇄ pending as the machine says (compare-and-set); a pending job carries the reason.

        The time limit counts from when it last started running: time spent waiting is not the job's.
        """
        # Back in the queue after the scheduler said it started: that attempt ended, the next one waits.
        requeued = status.state == "pending" and job.state == "running" and job.times.get("started_at") is not None
        with self.ctx.store.transaction() as jobs:
            current = jobs[job.id]
            if current.state != job.state:
                return
            move(current, status.state)
            if status.state == "pending":
                current.reason = status.detail or "waiting"
            else:
                current.reason = status.detail if (status.detail or "").startswith(BUILDING) else None
                current.started = utcnow()
            if status.log_size is not None:
                current.log_size = status.log_size
            if requeued:
                current.times = {}  # the next attempt's times are its own
                current.attempts = [*current.attempts, attempt_record(job, "requeued", status.detail or None)]
            elif times is not None:
                current.times = times
        if requeued:
            end_attempt(self.ctx, job, ended=job.times.get("ended_at") or time.time())
        self.ctx.emit(current)

    def _requeue(self, job: Job) -> None:
        """pending → queued (compare-and-set): the machine the job waited for is ready for its files."""
        with self.ctx.store.transaction() as jobs:
            current = jobs[job.id]
            if current.state != "pending":
                return
            move(current, "queued")
            current.reason = None
        self.ctx.emit(current)

    def _to_collecting(
        self,
        job: Job,
        state: State,
        reason: str | None,
        exit_code: int | None = None,
        times: dict[str, float] | None = None,
        *,
        cause: Cause | None = None,
        reach_machine: bool = True,
        cancelled: bool = False,
    ) -> None:
        """running → collecting, once (compare-and-set); collection is the next step's work.

        ``cancelled``: the machine says a cancel stopped it. Whoever asked for it (another process, the
        CLI, after this poll read the job) is the reason, not a vanished process."""
        # ``at``: when it stopped, the end of its metered time; ``cause``: what a retry policy reads.
        outcome = Outcome(state, reason, reach_machine, at=time.time(), cause=cause)
        with self.ctx.store.transaction() as jobs:
            current = jobs[job.id]
            if current.state not in ON_MACHINE_STATES:
                return
            if cancelled and current.cancel_requested:
                outcome = Outcome("cancelled", cancelled_by(current.cancel_requested), reach_machine, at=outcome.at)
            move(current, "collecting")
            current.outcome, current.exit_code, current.failing_since = outcome, exit_code, None
            if times is not None:
                current.times = times
        self.ctx.emit(current)


#: RemoteStatus fields a scheduler may fill, kept on the job under the same names.
SCHEDULER_TIMES = ("queued_at", "started_at", "ended_at")


def cancelled_by(person: str, *, before_start: bool = False) -> str:
    """A cancelled job's reason: who asked (``people.shown``), and whether it never started."""
    return f"cancelled by {person} before it started" if before_start else f"cancelled by {person}"


def scheduler_times(job: Job, status: RemoteStatus) -> dict[str, float] | None:
    """The job's scheduler times with what this poll reported; None when nothing changed (no write)."""
    reported = {name: value for name in SCHEDULER_TIMES if (value := getattr(status, name)) is not None}
    merged = {**job.times, **reported}
    return merged if merged != job.times else None


def _cause(said: str | None) -> Cause | None:
    """A cause the machine gave (RemoteStatus.cause), if it is one a retry policy knows."""
    return said if said in CAUSES else None  # type: ignore[return-value]


def _building(status: RemoteStatus, job: Job) -> bool:
    """Whether a running job's reason is the far side's environment build, starting or ended: the only
    reason a running job takes from its status."""
    return (status.detail or "").startswith(BUILDING) or (job.reason or "").startswith(BUILDING)
