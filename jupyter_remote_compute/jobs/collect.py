"""Collection and landing: from a job that stopped running to its end state, outputs in place.

Under the job's lease: fetch the declared outputs and the log from the machine into a private
folder, verify every file against the far side's sha256, move them into the workspace (each file
whole or not at all), record the MLflow run, then end the job with its outcome.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..engines.base import WORK_DIR, EngineError, FetchResult
from ..errors import InvalidSettings, RemoteComputeError
from ..fsutil import private_dir, sha256_file
from ..machines.facts import known_facts, remember_facts
from ..recording import recorder
from ..recording.tracking import JobRecord, without_far_records
from ..secrets import mask
from ..usage.ledger import job_metrics, meter
from . import recording
from .checkpoints import Checkpoints
from .context import JobContext, remote_of
from .job import Job, Outcome, parse_time, utcnow
from .leases import Leases
from .logs import fetch_masked_log, mask_values
from .reasons import failure_reason
from .retries import Retries, attempt_record, run_attempts, with_last_attempt
from .spec import check_relative_path

log = logging.getLogger(__name__)

#: A machine's facts (OS, Python, GPUs) older than this are read again when one of its jobs ends.
FACTS_MAX_AGE = 24 * 3600.0


class Collector:
    def __init__(self, ctx: JobContext, leases: Leases, checkpoints: Checkpoints) -> None:
        self.ctx = ctx
        self.leases = leases
        self.checkpoints = checkpoints
        self.retries = Retries(ctx, leases)

    def collect(self, job: Job) -> None:
        """collecting → its outcome: fetch and verify outputs, land them, record the run, end the job."""
        claimed = self.leases.claim(job.id, {"collecting"})
        if claimed is None:
            return
        job = claimed
        recorder.wait_unheld(self.ctx.workspace, job.id)  # before its folder is fetched into again
        outcome = job.outcome or Outcome("lost", "lost: no outcome was recorded")
        # A job cancelled while it waited in its pool's queue was never on a machine: nothing to ask one.
        engine = None if job.waiting else self.ctx.engine_of(job)
        remote = remote_of(job)
        local_dir = self.ctx.workspace.job_dir(job.id)
        incoming = local_dir / "incoming"
        shutil.rmtree(incoming, ignore_errors=True)
        private_dir(incoming)
        wanted = list(job.spec.bring_back) if outcome.state == "succeeded" else []
        # An attempt its retry policy retries brings home its checkpoints and log, then goes back to the queue.
        retried = self.retries.retried(job, outcome)
        secrets = mask_values(self.ctx.secrets, job)
        result = FetchResult()
        log_path: Path | None = None
        if engine is not None and engine.is_prepared(remote) and outcome.reach_machine:
            # Only the engine's own faults are handled here; this side's (a full disk while the log
            # lands) go up to the Driver, which retries them as every fault of this side.
            # The last checkpoint set first: the job has ended, so every file of its folder is complete.
            self.checkpoints.final(job)
            try:
                # A retried attempt too: its MLflow store goes into the job's one run (no outputs: wanted is empty).
                result = engine.fetch(remote, wanted, incoming, self.leases.renewer(job.id))
                log_path = fetch_masked_log(engine, remote, local_dir / "log", secrets)
            except EngineError as e:
                if e.transient:
                    shutil.rmtree(incoming, ignore_errors=True)  # the next attempt starts afresh: keep no part
                    state = "lost" if outcome.state == "succeeded" else outcome.state
                    why = outcome.reason or f"exit code {job.exit_code}"
                    self.leases.retry_later(job, e, state, f"{why}; could not collect from {job.machine}")
                    return
                if outcome.state == "succeeded":
                    outcome = Outcome("failed", f"could not fetch outputs from {job.machine}: {e}")
        elif engine is not None and engine.is_prepared(remote):
            engine.abandon(remote)  # given up unanswered: what of it still answers stops (several hosts)

        if outcome.state == "failed" and outcome.reason is None:
            reason = failure_reason(job.exit_code, log_path, job.spec.send, self.ctx.workspace.root)
            # The log is masked already; a secret printed in pieces between terminal codes is whole here.
            outcome = dataclasses.replace(outcome, reason=mask(reason.encode(), secrets or []).decode())
        machine = self.retries.next_machine(job, outcome) if retried and engine is not None else None
        if machine is not None:
            # The attempt's records are left for the job's run before the job is queued again: a crash in
            # between collects this attempt again, which replaces the to-do.
            self._keep_attempt(job, outcome, log_path, incoming, secrets)
            if self.retries.requeue(job, outcome, engine, remote, log_path, machine):
                recording.start(self.ctx, job.id, secrets)
            return

        # What came back (outputs, the job's MLflow store, the log), measured before anything moves on.
        fetched = _bytes_under(incoming) + (log_path.stat().st_size if log_path and log_path.exists() else 0)
        landed: dict[str, Path] = {}
        sizes: dict[str, int] = {}
        verified: dict[str, str] = {}
        if outcome.state == "succeeded":
            verified, problem = _verify(incoming, wanted, result)
            if not problem:
                problem = self._check_landing(verified)
            if problem:
                outcome = Outcome("failed", problem)
            else:
                landed, sizes = self._land(incoming, verified)

        ended = utcnow()
        attempt = meter(
            job,
            self.ctx.usage,
            self.ctx.workspace.punica_dir,
            state=outcome.state,
            ended=outcome.at or parse_time(ended),
            bytes_fetched=fetched,
        )
        attempts = [a for a in self.ctx.usage.attempts_of(job.id) if a.attempt < attempt.attempt] + [attempt]
        metrics = job_metrics(attempts, parse_time(ended))
        record = self._job_record(job, outcome, log_path, landed, incoming, ended, secrets or [], metrics)
        record = dataclasses.replace(
            record,
            digests={rel: verified[rel] for rel in landed},
            sizes=sizes,
            machine_facts={} if engine is None else self._machine_facts(job),
        )
        if secrets is None:
            record = without_far_records(record)
        # The to-do is written first, whichever way the run is recorded: a crash from here on leaves it
        # for the next collection, or for resume() once the job has ended.
        recorder.queue(self.ctx.workspace, record, cleanup=incoming)
        run_id = None
        background = self.ctx.settings.record_in_background
        if not background:
            # A server ends the job with its run (what its panel shows at the end links the run).
            run_id, outcome = self._record(job.id, outcome, secrets)
        # Before the end state: a crash in between writes the line again, and the record keeps the first.
        self.ctx.usage.append(attempt)
        self.leases.update(
            job.id,
            to=outcome.state,
            reason=outcome.reason,
            ended=ended,
            outputs={rel: {"sha256": verified[rel], "size": sizes[rel]} for rel in landed},
            # Never None over an id: a recorder of an earlier collection may have put it there meanwhile.
            **({"mlflow_run_id": run_id} if run_id else {}),
            lease=None,
            failing_since=None,
            # As the store has it now: with the checkpoint set the final look brought.
            **with_last_attempt(self.ctx.store.get(job.id), outcome, ended),
        )
        if background:
            recording.start(self.ctx, job.id, secrets)

    def _keep_attempt(
        self, job: Job, outcome: Outcome, log_path: Path | None, incoming: Path, secrets: Sequence[str] | None
    ) -> None:
        """The to-do that records an attempt that is retried into the job's run, without ending the run:
        its MLflow store moves out of ``incoming`` (which the next collection empties) to
        ``.punica/jobs/<id>/attempt-<n>/``, its log is the one ``requeue`` keeps as ``attempt-<n>.log``."""
        number = len(job.attempts) + 1
        kept = self.ctx.workspace.job_dir(job.id) / f"attempt-{number}"
        shutil.rmtree(kept, ignore_errors=True)  # this attempt collected before, cut short
        os.replace(incoming, kept)
        attempt_log = log_path.with_name(f"attempt-{number}.log") if log_path else None
        record = self._job_record(job, outcome, attempt_log, {}, kept, utcnow(), secrets or [], {})
        record = dataclasses.replace(
            record,
            attempt=number,
            ends=False,
            attempts=run_attempts([*job.attempts, attempt_record(job, outcome.cause or outcome.state, outcome.reason)]),
            # Never asked now: the machine may be gone.
            machine_facts=known_facts(self.ctx.workspace.punica_dir, job.machine) or {},
        )
        recorder.queue(self.ctx.workspace, without_far_records(record) if secrets is None else record, cleanup=kept)

    def _check_landing(self, verified: dict[str, str]) -> str | None:
        """Before anything moves: every destination is inside the workspace and can take a file."""
        root = self.ctx.workspace.root.resolve()
        for rel in verified:
            dst = self.ctx.workspace.root / rel
            parent = dst.parent.resolve()
            if not (parent == root or root in parent.parents):
                return f"output {rel} would land outside the workspace (a folder on its path is a link)"
            if dst.is_dir() and not dst.is_symlink():
                return f"output {rel} cannot land: a folder of that name is in the workspace"
        return None

    def _land(self, incoming: Path, verified: dict[str, str]) -> tuple[dict[str, Path], dict[str, int]]:
        """Move verified outputs into the workspace; each file appears whole or not at all. Their sizes
        are read before: once landed, a file is the person's to change or remove at once."""
        landed = {}
        sizes = {}
        for rel in verified:
            src, dst = incoming / WORK_DIR / rel, self.ctx.workspace.root / rel
            sizes[rel] = src.stat().st_size
            dst.parent.mkdir(parents=True, exist_ok=True)
            move_into_place(src, dst)
            landed[rel] = dst
        return landed, sizes

    def _job_record(
        self,
        job: Job,
        outcome: Outcome,
        log_path: Path | None,
        landed: dict[str, Path],
        incoming: Path,
        ended: str,
        secrets: Sequence[str],
        metrics: Mapping[str, float],
    ) -> JobRecord:
        return JobRecord(
            job_id=job.id,
            key=job.key,
            name=job.name,
            machine=job.machine,
            engine=job.kind,
            state=outcome.state,
            reason=outcome.reason,
            command=job.spec.command_line,
            started=parse_time(job.started) if job.started else None,
            ended=parse_time(ended),
            log_path=log_path,
            outputs=landed,
            inputs_manifest=self.ctx.workspace.job_dir(job.id) / "inputs.json",
            far_store=incoming / "mlruns",
            mask_values=tuple(secrets),
            attempt=len(job.attempts) + 1,
            attempts=run_attempts(with_last_attempt(job, outcome, ended).get("attempts", [])),
            experiment=job.spec.plain_env().get("MLFLOW_EXPERIMENT_NAME"),
            metrics=dict(metrics),
            user=job.user,
            host=job.machine_snapshot.get("address"),
            pool=job.pool,
            placement=job.placement,
            tracking_uri=job.tracking_uri,
        )

    def _machine_facts(self, job: Job) -> dict[str, Any]:
        """The OS, Python and GPUs of the machine the job ran on, for its run's tags: its last check's,
        else read now. A scheduler's machine is not checked here (its check reads the login node or
        brings a cluster up): its run names what the user's own last check found, if any."""
        punica = self.ctx.workspace.punica_dir
        facts = known_facts(punica, job.machine, FACTS_MAX_AGE)
        if facts is not None:
            return facts
        engine = self.ctx.engine_of(job)
        if engine.features.pending:
            return known_facts(punica, job.machine) or {}
        try:
            remember_facts(punica, job.machine, engine.check())
        except (EngineError, RemoteComputeError, OSError) as e:  # the run goes without them, the job goes on
            log.warning("job %s: could not read %s's facts for its MLflow run: %s", job.id, job.machine, e)
        return known_facts(punica, job.machine) or {}

    def _record(self, job_id: str, outcome: Outcome, secrets: Sequence[str] | None) -> tuple[str | None, Outcome]:
        """The job's MLflow run id, recorded by the workspace's recorder, and its outcome (which says so
        if the run could not be recorded)."""
        try:
            run_id, problem = recording.record_now(self.ctx, job_id, secrets)
        except recorder.RecorderUnavailable as e:  # the to-do stays: resume() asks again once the job ended
            log.warning("job %s: its MLflow run is left for a later recorder: %s", job_id, e)
            return None, outcome
        if problem is None:
            return run_id, outcome
        log.error("job %s: recording the MLflow run failed", job_id)  # the problem, masked, is on the job
        reason = ((outcome.reason or "") + f" (not recorded in MLflow: {problem})").strip()
        return None, dataclasses.replace(outcome, reason=reason)


def move_into_place(src: Path, dst: Path) -> None:
    """Atomic per file, also when ``dst`` is on another file system (a linked data folder)."""
    try:
        os.replace(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        tmp = dst.with_name(f".{dst.name}.incoming")
        try:
            shutil.copyfile(src, tmp)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # a disk that filled up keeps no partial file
            raise
        os.replace(tmp, dst)
        os.unlink(src)


def _plain_path(rel: str) -> bool:
    """Whether a path the far side reported is a plain relative path (nothing that climbs out)."""
    try:
        return check_relative_path(rel, "bring_back") == rel
    except InvalidSettings:
        return False


def _verify(incoming: Path, wanted: Sequence[str], result: FetchResult) -> tuple[dict[str, str], str | None]:
    """Every declared output present and matching the far side's sha256; else the reason."""
    verified: dict[str, str] = {}
    missing = list(result.missing)
    mismatched = []
    for rel in result.digests:
        if not _plain_path(rel):
            return {}, f"the machine reported an output path that is not allowed: {rel!r}"
    for output in wanted:
        if output in missing:
            continue
        entries = {k: v for k, v in result.digests.items() if k == output or k.startswith(output + "/")}
        if not entries:
            missing.append(output)
        for rel, far_digest in entries.items():
            here = incoming / WORK_DIR / rel
            # Hashed as it landed where the engine could (receive_outputs); read again only otherwise.
            if not here.is_file() or (result.received.get(rel) or sha256_file(here)) != far_digest:
                mismatched.append(rel)
            else:
                verified[rel] = far_digest
    if missing:
        return {}, "missing outputs: " + ", ".join(missing)
    if mismatched:
        return {}, "outputs damaged in transit (sha256 differs): " + ", ".join(mismatched)
    return verified, None


def _bytes_under(folder: Path) -> int:
    """What a fetch brought into ``folder`` (outputs and the job's MLflow store), in bytes."""
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total
