"""The job lifecycle, written once for every entry point and every kind of machine.

    queued → sending → running → collecting → succeeded | failed | cancelled | lost

Any process may drive a job forward (the server's poller, a kernel waiting in
the magic, the CLI, a pipeline runner); they coordinate through the state
file. Steps that must not run twice — sending and starting, collecting and
recording — are taken under a *lease* stored on the job: the process that
holds it does the work; a lease whose process has died is free again, so a job
outlives whoever started it. Polling a running job needs no lease: it only
reads, and its transition is a compare-and-set inside a store transaction.

Everything here blocks (engines, hashing, MLflow): the server calls it from
worker threads, never from the event loop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..engines import engine_class
from ..engines.base import (
    WORK_DIR,
    Engine,
    EngineContext,
    EngineError,
    FetchResult,
    InputFile,
    LaunchSpec,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
)
from ..errors import (
    Conflict,
    InvalidSettings,
    MachineError,
    NotTrained,
    RemoteComputeError,
    SecretStoreUnavailable,
)
from ..fsutil import atomic_write, sha256_file
from ..guards import check_egress, screen_settings
from ..machines import Machine, MachineRegistry
from ..secrets import SecretStore
from ..tracking import JobRecord, TrackingSettings, record_job
from ..transfer.manifest import DigestCache, build_manifest, manifest_json
from ..workspace import Workspace, default_scratch_dir
from .key import job_key
from .spec import JobSpec, format_duration
from .store import ACTIVE_STATES, TERMINAL_STATES, Job, JobStore, holder_alive, new_job_id, process_identity, utcnow

log = logging.getLogger(__name__)

LOG_CHUNK = 1 << 20
REASON_TAIL_LINES = 10
MAX_TRANSIENT_RETRIES = 20


@dataclasses.dataclass(frozen=True)
class ServiceSettings:
    poll_interval: float = 2.0  # seconds between polls of a running job
    cancel_grace: float = 10.0  # seconds between TERM and KILL
    scratch_dir: Path | None = None  # the built-in machine's job base; None: the default
    tracking: TrackingSettings = dataclasses.field(default_factory=TrackingSettings)


@dataclasses.dataclass(frozen=True)
class SubmitResult:
    job: Job
    attached: bool  # True: the same work was already under way and nothing new started


@dataclasses.dataclass(frozen=True)
class LogChunk:
    data: bytes
    offset: int
    next_offset: int
    complete: bool  # the job has ended and this is the end of its log


def require_trained(job: Job) -> Job:
    """The one definition of "trained": succeeded, every declared output fetched, verified and in place."""
    if job.state == "succeeded":
        return job
    if job.state in ACTIVE_STATES:
        message = f"job {job.id} is not trained yet: it is still {job.state}"
    else:
        message = f"job {job.id} did not train: {job.state}: {job.reason}"
    raise NotTrained(message, job_id=job.id, state=job.state, reason=job.reason)


def mask(data: bytes, secrets: Iterable[str]) -> bytes:
    """Hide secret values, keeping the length so byte offsets stay valid."""
    for value in secrets:
        raw = value.encode()
        if len(raw) >= 4:
            data = data.replace(raw, b"*" * len(raw))
    return data


class JobService:
    def __init__(
        self,
        workspace: Workspace,
        settings: ServiceSettings | None = None,
        *,
        secrets: SecretStore | None = None,
    ) -> None:
        self.workspace = workspace
        self.settings = settings or ServiceSettings()
        self.machines = MachineRegistry(workspace.compute_yaml)
        self.store = JobStore(workspace.state_file)
        self.secrets = secrets or SecretStore()
        self.digests = DigestCache(workspace.digest_cache)
        self.identity = process_identity()
        self._engines: dict[str, tuple[str, Engine]] = {}
        self._engines_lock = threading.Lock()
        self._job_locks: dict[str, threading.Lock] = {}
        self._job_locks_guard = threading.Lock()
        self._listeners: list[Callable[[Job], None]] = []
        #: Bytes moved so far for jobs this process is sending: job id -> (done, total).
        self.progress: dict[str, tuple[int, int]] = {}

    # -- listeners ----------------------------------------------------------
    def add_listener(self, listener: Callable[[Job], None]) -> None:
        """Called (from whatever thread changed it) with every job this process changes."""
        self._listeners.append(listener)

    def _emit(self, job: Job) -> None:
        for listener in self._listeners:
            try:
                listener(job)
            except Exception:  # a listener's bug must not stop a job
                log.exception("job listener failed")

    # -- machines and engines -------------------------------------------------
    def _machine(self, name: str) -> Machine:
        return self.machines.get(name)

    def engine(self, machine_name: str, snapshot: dict[str, Any] | None = None) -> Engine:
        """The cached engine of a machine (built from the job's snapshot once the machine is gone)."""
        if snapshot is None:
            m = self._machine(machine_name)
            snapshot = {"kind": m.kind, "address": m.address, "options": dict(m.options)}
        fingerprint = json.dumps(snapshot, sort_keys=True, default=str)
        with self._engines_lock:
            cached = self._engines.get(machine_name)
            if cached and cached[0] == fingerprint:
                return cached[1]
            if cached:
                cached[1].close()
            cls = engine_class(snapshot["kind"])
            context = EngineContext(
                get_secret=self.secrets.get,
                scratch_dir=self.settings.scratch_dir or default_scratch_dir(),
            )
            engine = cls(machine_name, snapshot["address"], snapshot.get("options", {}), context)
            self._engines[machine_name] = (fingerprint, engine)
            return engine

    def _job_engine(self, job: Job) -> Engine:
        return self.engine(job.machine, job.machine_snapshot)

    def add_machine(
        self,
        name: Any,
        kind: Any,
        address: Any,
        options: dict[str, Any] | None = None,
        *,
        enabled: bool = True,
        token: str | None = None,
        expected_version: str | None = None,
    ) -> Machine:
        """Add a machine; a token goes to the Secret Manager and the file keeps only its name."""
        for field, value in (("name", name), ("kind", kind), ("address", address)):
            if not isinstance(value, str) or not value:
                raise InvalidSettings(f"{field}: required", field=field)
        engine_class(kind)  # an unknown kind is reported before a token is stored
        options = self._store_token(kind, name, dict(options or {}), token)
        return self.machines.add(name, kind, address, options, enabled=enabled, expected_version=expected_version)

    def update_machine(self, name: str, *, token: str | None = None, **changes: Any) -> Machine:
        if token:
            machine = self.machines.get(name)
            options = dict(changes.get("options") or {})
            stored = self._store_token(machine.kind, name, {**machine.options, **options}, token)
            changes["options"] = {**options, "token_secret": stored["token_secret"]}
        return self.machines.update(name, **changes)

    def _store_token(self, kind: str, name: str, options: dict[str, Any], token: Any) -> dict[str, Any]:
        if token in (None, ""):
            return options
        if not isinstance(token, str):
            raise InvalidSettings("token: expected a string", field="token")
        if "token_secret" not in engine_class(kind).options:
            raise InvalidSettings(f"token: machines of kind {kind!r} do not take a token", field="token")
        secret_name = options.get("token_secret") or f"compute/{name}"
        self.secrets.set(secret_name, token)
        return {**options, "token_secret": secret_name}

    def check_machine(self, name: str) -> dict[str, Any]:
        try:
            return self.engine(name).check()
        except EngineError as e:
            raise MachineError(f"{name}: {e}", details=e.details) from e

    def trust_machine(self, name: str) -> dict[str, Any]:
        """Record an SSH machine's current host key as known (an explicit user action)."""
        engine = self.engine(name)
        trust = getattr(engine, "trust_host", None)
        if trust is None:
            raise InvalidSettings(f"machine: {name!r} ({engine.kind}) has no host key to trust", field="machine")
        try:
            return {"name": name, "fingerprint": trust()}
        except EngineError as e:
            raise MachineError(f"{name}: {e}", details=e.details) from e

    def close(self) -> None:
        with self._engines_lock:
            for _, engine in self._engines.values():
                engine.close()
            self._engines.clear()

    # -- reading ------------------------------------------------------------
    def get(self, job_id: str) -> Job:
        return self.store.get(job_id)

    def list_jobs(self, machine: str | None = None, state: str | None = None) -> list[Job]:
        jobs = [
            j
            for j in self.store.jobs().values()
            if (machine is None or j.machine == machine) and (state is None or j.state == state)
        ]
        jobs.sort(key=lambda j: (j.created, j.id), reverse=True)
        return jobs

    # -- submit -------------------------------------------------------------
    def submit(self, spec: JobSpec, *, new: bool = False, progress: ProgressCallback | None = None) -> SubmitResult:
        """Validate, screen, check policy, hash inputs; then attach to the same work or queue a new job.

        Nothing is stored and nothing leaves this machine until every check passed.
        """
        machine = self._machine(spec.machine)
        if not machine.enabled:
            raise InvalidSettings(f"machine: {machine.name!r} is disabled; enable it first", field="machine")
        cls = engine_class(machine.kind)

        screen_settings(spec.screened_settings(), self._stored_secret_values())
        for env_name, secret_name in spec.secret_refs().items():
            if self.secrets.get(secret_name) is None:
                raise InvalidSettings(
                    f"env.{env_name}: no secret named {secret_name!r} in the Secret Manager; "
                    f"store it with `jupyter remote-compute secrets set {secret_name}`",
                    field=f"env.{env_name}",
                )

        files, key = self._inputs_and_key(spec)
        check_egress(self.workspace.policy_yaml, machine.name, cls.remote, [f.relpath for f in files])

        job_id = new_job_id()
        jobdir = self.workspace.job_dir(job_id)
        manifest = json.dumps({"files": manifest_json(files)}, indent=1).encode()
        atomic_write(jobdir / "inputs.json", manifest)

        with self.store.transaction() as jobs:
            if not new:
                for existing in jobs.values():
                    if existing.key == key and existing.active:
                        shutil.rmtree(jobdir, ignore_errors=True)
                        return SubmitResult(existing, attached=True)
            job = Job(
                id=job_id,
                key=key,
                machine=machine.name,
                kind=machine.kind,
                spec=spec.to_json(),
                machine_snapshot={"kind": machine.kind, "address": machine.address, "options": dict(machine.options)},
                inputs={"files": len(files), "bytes": sum(f.size for f in files)},
            )
            jobs[job_id] = job
        self._emit(job)
        return SubmitResult(job, attached=False)

    def _inputs_and_key(self, spec: JobSpec) -> tuple[list[InputFile], str]:
        """The inputs, hashed, and the idempotency key: the one place both are derived."""
        files = build_manifest(self.workspace.root, spec.send, self.digests)
        return files, spec.key or job_key(spec, files)

    def latest_same_work(self, spec: JobSpec) -> Job | None:
        """The newest job doing the same work as ``spec`` (same key), whatever its state."""
        _, key = self._inputs_and_key(spec)
        same = [j for j in self.list_jobs(machine=spec.machine) if j.key == key]
        return same[0] if same else None

    def changed_outputs(self, job: Job) -> list[str]:
        """Outputs of ``job`` no longer in the workspace as it brought them back."""
        changed = []
        for rel, info in sorted(job.outputs.items()):
            path = self.workspace.root / rel
            try:
                same = path.is_file() and sha256_file(path) == info["sha256"]
            except OSError:
                same = False
            if not same:
                changed.append(rel)
        return changed

    def _stored_secret_values(self) -> list[str]:
        try:
            return self.secrets.values()
        except SecretStoreUnavailable:
            return []

    # -- driving ------------------------------------------------------------
    def _job_lock(self, job_id: str) -> threading.Lock:
        with self._job_locks_guard:
            return self._job_locks.setdefault(job_id, threading.Lock())

    def advance(self, job_id: str, *, progress: ProgressCallback | None = None) -> Job:
        """Take the job as far as it can go now, without waiting for it to finish."""
        lock = self._job_lock(job_id)
        if not lock.acquire(blocking=False):
            return self.store.get(job_id)  # another thread of this process is on it
        try:
            job = self.store.get(job_id)
            if job.state in ("queued", "sending"):
                self._launch(job, progress)
                job = self.store.get(job_id)
            if job.state == "running":
                self._watch(job)
                job = self.store.get(job_id)
            if job.state == "collecting":
                self._collect(job)
            return self.store.get(job_id)
        finally:
            lock.release()

    def poll_active(self) -> list[Job]:
        """One pass over every unfinished job: one poll per machine, then each job advanced."""
        jobs = [j for j in self.store.jobs().values() if j.active]
        running: dict[str, list[Job]] = {}
        for job in jobs:
            if job.state == "running":
                running.setdefault(job.machine, []).append(job)
        statuses: dict[str, RemoteStatus] = {}
        for machine, group in running.items():
            try:
                engine = self._job_engine(group[0])
                statuses.update(engine.poll([RemoteJob(j.id, j.key, j.handle) for j in group]))
            except EngineError as e:
                log.warning("polling %s failed: %s", machine, e)
            except Exception:
                log.exception("polling %s failed", machine)
        changed = []
        for job in jobs:
            if job.state != "running" or job.id in statuses:
                lock = self._job_lock(job.id)
                if not lock.acquire(blocking=False):
                    continue
                try:
                    before = job.updated
                    if job.state == "running":
                        self._watch(job, statuses[job.id])
                        job = self.store.get(job.id)
                    if job.state in ("queued", "sending"):
                        self._launch(job, None)
                    elif job.state == "collecting":
                        self._collect(job)
                    after = self.store.get(job.id)
                    if after.updated != before:
                        changed.append(after)
                except Exception:
                    log.exception("advancing job %s failed", job.id)
                finally:
                    lock.release()
        return changed

    def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        *,
        on_log: Callable[[bytes], None] | None = None,
        progress: ProgressCallback | None = None,
        interval: float | None = None,
    ) -> Job:
        """Drive the job until it ends or ``timeout`` passes; stream its log to ``on_log``.

        Returns the job in whatever state it reached: a wait that ends early does not stop the job.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = interval or min(self.settings.poll_interval, 1.0)
        offset = 0
        while True:
            job = self.advance(job_id, progress=progress)
            if on_log is not None:
                while True:
                    chunk = self.read_log(job_id, offset)
                    if chunk.data:
                        on_log(chunk.data)
                    offset = chunk.next_offset
                    if len(chunk.data) < LOG_CHUNK // 2:
                        break
            if job.state in TERMINAL_STATES:
                return job
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return job
            time.sleep(interval if remaining is None else min(interval, remaining))

    # -- leases ---------------------------------------------------------------
    def _claim(self, job_id: str, states: set[str], **changes: Any) -> Job | None:
        """Take the job's lease if it is in one of ``states`` and nobody alive holds it."""
        with self.store.transaction() as jobs:
            job = jobs[job_id]
            if job.state not in states:
                return None
            if job.lease and job.lease != self.identity and holder_alive(job.lease):
                return None
            job.lease = dict(self.identity)
            for name, value in changes.items():
                setattr(job, name, value)
            job.updated = utcnow()
        self._emit(job)
        return job

    def _update(self, job_id: str, **changes: Any) -> Job:
        with self.store.transaction() as jobs:
            job = jobs[job_id]
            for name, value in changes.items():
                setattr(job, name, value)
            job.updated = utcnow()
        self._emit(job)
        return job

    def _transient(self, job: Job, error: Exception) -> None:
        """A passing failure (connection dropped): give the lease back and try again on the next poll."""
        retries = job.retries + 1
        log.warning("job %s: %s (attempt %d)", job.id, error, retries)
        if retries > MAX_TRANSIENT_RETRIES:
            self._finish_later(job.id, "failed", f"gave up after {retries} attempts: {error}")
        else:
            self._update(job.id, lease=None, retries=retries)

    def _finish_later(self, job_id: str, state: str, reason: str, *, lease: bool = True) -> None:
        """Decide the outcome now; collection records it (log, MLflow) and ends the job."""
        changes: dict[str, Any] = {"state": "collecting", "outcome": {"state": state, "reason": reason}}
        if not lease:
            changes["lease"] = None
        self._update(job_id, **changes)

    # -- queued / sending → running -----------------------------------------
    def _launch(self, job: Job, progress: ProgressCallback | None) -> None:
        claimed = self._claim(job.id, {"queued", "sending"})
        if claimed is None:
            return
        job = claimed
        if job.cancel_requested:
            self._finish_later(job.id, "cancelled", f"cancelled by {job.cancel_requested} before it started")
            return
        engine = self._job_engine(job)
        remote = RemoteJob(job.id, job.key, job.handle)
        try:
            if job.state == "sending" and job.handle.get("pid"):
                # This side stopped after starting the command: find it instead of starting it twice.
                status = engine.poll([remote])[job.id]
                if status.state in ("running", "exited"):
                    self._update(job.id, state="running", lease=None, started=job.started or utcnow())
                    return
            job = self._update(job.id, state="sending")
            remote = engine.prepare(remote)
            self._update(job.id, handle=dict(remote.handle))
            files = self._inputs(job)

            def report(done: int, total: int) -> None:
                self.progress[job.id] = (done, total)
                if progress:
                    progress(done, total)

            stats = engine.send(remote, files, report)
            launch = LaunchSpec(
                command=job.spec["command"],
                env=JobSpec.from_json(job.spec).plain_env(),
                secret_env=self._secret_env(job),
            )
            if self.store.get(job.id).cancel_requested:
                self._finish_later(job.id, "cancelled", f"cancelled by {job.cancel_requested} before it started")
                return
            remote = engine.start(remote, launch)
            self._update(
                job.id,
                state="running",
                started=utcnow(),
                handle=dict(remote.handle),
                transfer=dataclasses.asdict(stats),
                lease=None,
                retries=0,
            )
        except EngineError as e:
            if e.transient:
                self._transient(job, e)
            else:
                self._finish_later(job.id, "failed", f"could not start on {job.machine}: {e}")
        except RemoteComputeError as e:
            self._finish_later(job.id, "failed", f"could not start on {job.machine}: {e.message}")
        finally:
            self.progress.pop(job.id, None)

    def _inputs(self, job: Job) -> list[InputFile]:
        """The inputs as hashed at submit; a file changed since then fails the job rather than send other data."""
        manifest = json.loads((self.workspace.job_dir(job.id) / "inputs.json").read_bytes())
        files = []
        for entry in manifest["files"]:
            path = self.workspace.root / entry["path"]
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

    def _secret_env(self, job: Job) -> dict[str, str]:
        values = {}
        for env_name, secret_name in JobSpec.from_json(job.spec).secret_refs().items():
            value = self.secrets.get(secret_name)
            if value is None:
                raise InvalidSettings(f"env.{env_name}: the secret {secret_name!r} is no longer in the Secret Manager")
            values[env_name] = value
        return values

    def _job_secrets(self, job: Job) -> list[str]:
        try:
            return list(self._secret_env(job).values())
        except (RemoteComputeError, SecretStoreUnavailable):
            return []

    # -- running ------------------------------------------------------------
    def _watch(self, job: Job, status: RemoteStatus | None = None) -> None:
        engine = self._job_engine(job)
        remote = RemoteJob(job.id, job.key, job.handle)
        try:
            if job.cancel_requested:
                engine.cancel(remote, self.settings.cancel_grace)
                self._to_collecting(job, "cancelled", f"cancelled by {job.cancel_requested}")
                return
            if job.spec.get("timeout") and job.started:
                from .store import parse_time

                elapsed = time.time() - parse_time(job.started)
                if elapsed > job.spec["timeout"]:
                    engine.cancel(remote, self.settings.cancel_grace)
                    self._to_collecting(job, "failed", f"timed out after {format_duration(job.spec['timeout'])}")
                    return
            if status is None:
                status = engine.poll([remote])[job.id]
        except EngineError as e:
            # A dropped connection is not a dead job: look again on the next poll.
            log.warning("job %s: %s", job.id, e)
            return
        if status.state == "exited":
            outcome = "succeeded" if status.exit_code == 0 else "failed"
            self._to_collecting(job, outcome, None, exit_code=status.exit_code)
        elif status.state == "gone":
            self._to_collecting(job, "lost", f"lost: the process vanished on {job.machine} ({status.detail})")
        elif status.log_size is not None and status.log_size != job.log_size:
            self._update(job.id, log_size=status.log_size)

    def _to_collecting(self, job: Job, state: str, reason: str | None, exit_code: int | None = None) -> None:
        """running → collecting, once: whoever makes the move holds the lease and collects."""
        outcome = {"state": state, "reason": reason}
        claimed = self._claim(job.id, {"running"}, state="collecting", outcome=outcome, exit_code=exit_code)
        if claimed is not None:
            self._collect(claimed)

    # -- collecting → terminal ------------------------------------------------
    def _collect(self, job: Job) -> None:
        claimed = self._claim(job.id, {"collecting"})
        if claimed is None:
            return
        job = claimed
        outcome = dict(job.outcome or {"state": "lost", "reason": "lost: no outcome was recorded"})
        engine = self._job_engine(job)
        remote = RemoteJob(job.id, job.key, job.handle)
        local_dir = self.workspace.job_dir(job.id)
        incoming = local_dir / "incoming"
        shutil.rmtree(incoming, ignore_errors=True)
        incoming.mkdir(parents=True)
        wanted = list(job.spec.get("bring_back", [])) if outcome["state"] == "succeeded" else []
        result = FetchResult()
        log_path: Path | None = None
        if job.handle.get("dir"):
            try:
                result = engine.fetch(remote, wanted, incoming)
                log_path = self._fetch_log(job, engine, remote, local_dir / "log")
            except EngineError as e:
                if e.transient:
                    self._transient(job, e)
                    return
                if outcome["state"] == "succeeded":
                    outcome = {"state": "failed", "reason": f"could not fetch outputs from {job.machine}: {e}"}

        landed: dict[str, Path] = {}
        verified: dict[str, str] = {}
        if outcome["state"] == "succeeded":
            verified, problem = _verify(incoming, wanted, result)
            if problem:
                outcome = {"state": "failed", "reason": problem}
            else:
                landed = self._land(incoming, verified)
        if outcome["state"] == "failed" and outcome.get("reason") is None:
            outcome["reason"] = f"exit code {job.exit_code}: {_tail(log_path)}"

        ended = utcnow()
        run_id = self._record(job, outcome, log_path, landed, incoming, ended)
        shutil.rmtree(incoming, ignore_errors=True)
        self._update(
            job.id,
            state=outcome["state"],
            reason=outcome.get("reason"),
            ended=ended,
            outputs={rel: {"sha256": verified[rel], "size": path.stat().st_size} for rel, path in landed.items()},
            mlflow_run_id=run_id,
            lease=None,
        )

    def _fetch_log(self, job: Job, engine: Engine, remote: RemoteJob, dest: Path) -> Path:
        secrets = self._job_secrets(job)
        tmp = dest.with_suffix(".part")
        offset = 0
        with open(tmp, "wb") as f:
            while chunk := engine.read_log(remote, offset, LOG_CHUNK):
                f.write(mask(chunk, secrets))
                offset += len(chunk)
        os.replace(tmp, dest)
        return dest

    def _land(self, incoming: Path, verified: dict[str, str]) -> dict[str, Path]:
        """Move verified outputs into the workspace; each file appears whole or not at all."""
        landed = {}
        for rel in verified:
            dst = self.workspace.root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(incoming / WORK_DIR / rel, dst)
            landed[rel] = dst
        return landed

    def _record(
        self,
        job: Job,
        outcome: dict[str, Any],
        log_path: Path | None,
        landed: dict[str, Path],
        incoming: Path,
        ended: str,
    ) -> str | None:
        from .store import parse_time

        record = JobRecord(
            job_id=job.id,
            key=job.key,
            name=job.name,
            machine=job.machine,
            engine=job.kind,
            state=outcome["state"],
            reason=outcome.get("reason"),
            command=job.spec["command"] if isinstance(job.spec["command"], str) else " ".join(job.spec["command"]),
            started=parse_time(job.started) if job.started else None,
            ended=parse_time(ended),
            log_path=log_path,
            outputs=landed,
            inputs_manifest=self.workspace.job_dir(job.id) / "inputs.json",
            far_store=incoming / "mlruns",
        )
        try:
            return record_job(self.workspace.root, self.settings.tracking, record)
        except Exception as e:  # MLflow down must not lose the job: keep the reason, record later by hand
            log.exception("job %s: recording the MLflow run failed", job.id)
            outcome["reason"] = ((outcome.get("reason") or "") + f" (not recorded in MLflow: {e})").strip()
            return None

    # -- user actions ---------------------------------------------------------
    def cancel(self, job_id: str, by: str = "user") -> Job:
        with self.store.transaction() as jobs:
            job = jobs.get(job_id)
            if job is None:
                from ..errors import NotFound

                raise NotFound(f"no job {job_id!r}")
            if job.state in TERMINAL_STATES:
                raise Conflict(f"job {job_id} has already ended ({job.state})")
            job.cancel_requested = by
            job.updated = utcnow()
        self._emit(job)
        return self.advance(job_id)

    def delete(self, job_id: str) -> None:
        job = self.store.get(job_id)
        if job.state not in TERMINAL_STATES:
            raise Conflict(f"job {job_id} is still {job.state}: cancel it first")
        if job.handle:
            try:
                self._job_engine(job).cleanup(RemoteJob(job.id, job.key, job.handle))
            except (EngineError, RemoteComputeError) as e:
                log.warning("job %s: cleaning up on %s failed: %s", job_id, job.machine, e)
        shutil.rmtree(self.workspace.job_dir(job_id), ignore_errors=True)
        with self.store.transaction() as jobs:
            jobs.pop(job_id, None)

    def read_log(self, job_id: str, offset: int = 0, limit: int = LOG_CHUNK) -> LogChunk:
        """Part of a job's log from a byte offset, whole lines where possible, secrets masked."""
        job = self.store.get(job_id)
        local = self.workspace.job_dir(job_id) / "log"
        if job.state in TERMINAL_STATES:
            if not local.exists():
                return LogChunk(b"", offset, offset, True)
            with open(local, "rb") as f:
                f.seek(offset)
                data = f.read(limit)
            return LogChunk(data, offset, offset + len(data), len(data) < limit)
        if not job.handle.get("dir"):
            return LogChunk(b"", offset, offset, False)
        try:
            data = self._job_engine(job).read_log(RemoteJob(job.id, job.key, job.handle), offset, limit)
        except EngineError:
            return LogChunk(b"", offset, offset, False)
        # Stop at a line end so a secret is never split across two reads (and escapes masking).
        cut = data.rfind(b"\n")
        if cut >= 0:
            data = data[: cut + 1]
        elif len(data) < limit:
            data = b""
        return LogChunk(mask(data, self._job_secrets(job)), offset, offset + len(data), False)


def _verify(incoming: Path, wanted: Sequence[str], result: FetchResult) -> tuple[dict[str, str], str | None]:
    """Every declared output present and matching the far side's sha256; else the reason."""
    verified: dict[str, str] = {}
    missing = list(result.missing)
    mismatched = []
    for output in wanted:
        if output in missing:
            continue
        entries = {k: v for k, v in result.digests.items() if k == output or k.startswith(output + "/")}
        if not entries:
            missing.append(output)
        for rel, far_digest in entries.items():
            here = incoming / WORK_DIR / rel
            if not here.is_file() or sha256_file(here) != far_digest:
                mismatched.append(rel)
            else:
                verified[rel] = far_digest
    if missing:
        return {}, "missing outputs: " + ", ".join(missing)
    if mismatched:
        return {}, "outputs damaged in transit (sha256 differs): " + ", ".join(mismatched)
    return verified, None


def _tail(log_path: Path | None) -> str:
    if log_path is None or not log_path.exists():
        return "(no log)"
    with open(log_path, "rb") as f:
        f.seek(max(0, log_path.stat().st_size - 4096))
        lines = f.read().decode(errors="replace").splitlines()
    tail = "\n".join(lines[-REASON_TAIL_LINES:]).strip()
    return tail or "(empty log)"
