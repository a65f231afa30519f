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

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
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
from ..secrets import SecretStore, mask
from ..tracking import JobRecord, TrackingSettings, record_job
from ..transfer.manifest import DigestCache, build_manifest, manifest_json
from ..workspace import Workspace, default_scratch_dir
from .key import job_key
from .spec import JobSpec, check_relative_path, format_duration
from .store import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    Job,
    JobStore,
    holder_alive,
    new_job_id,
    parse_time,
    process_identity,
    utcnow,
)

log = logging.getLogger(__name__)

LOG_CHUNK = 1 << 20
MIN_LOG_READ = 64 << 10
LEASE_RENEW_EVERY = 60.0  # seconds; well inside store.FOREIGN_LEASE_TTL
REASON_TAIL_LINES = 10

# One lock per job for every JobService of this process (a pipeline runner may hold several), so two
# threads of one process never drive the same job at once; across processes the job's lease decides.
_JOB_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_JOB_LOCKS_GUARD = threading.Lock()


@dataclasses.dataclass(frozen=True)
class ServiceSettings:
    poll_interval: float = 2.0  # seconds between polls of a running job
    cancel_grace: float = 10.0  # seconds between TERM and KILL
    scratch_dir: Path | None = None  # the built-in machine's job base; None: the default
    give_up_after: float = 3600.0  # seconds of failing to reach a machine to start, stop or collect a job
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


def settled_length(masked: bytes, secrets: Sequence[str]) -> int:
    """How much of a masked log no later byte can change: it ends where a secret may be beginning."""
    raws = [s.encode() for s in secrets if len(s.encode()) >= 4]
    longest = max(map(len, raws), default=0)
    for start in range(max(0, len(masked) - longest + 1), len(masked)):
        tail = masked[start:]
        if any(raw.startswith(tail) for raw in raws):
            return start
    return len(masked)


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
        self._engines: dict[tuple[str, str], Engine] = {}
        self._engines_lock = threading.Lock()
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
        # Keyed by configuration too: a job started before an edit keeps the engine it started with.
        cache_key = (machine_name, json.dumps(snapshot, sort_keys=True, default=str))
        with self._engines_lock:
            cached = self._engines.get(cache_key)
            if cached is not None:
                return cached
            cls = engine_class(snapshot["kind"])
            context = EngineContext(
                get_secret=self.secrets.get,
                scratch_dir=self.settings.scratch_dir or default_scratch_dir(),
            )
            engine = cls(machine_name, snapshot["address"], snapshot.get("options", {}), context)
            self._engines[cache_key] = engine
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
        try:
            return {"name": name, "fingerprint": engine.trust_host()}
        except EngineError as e:
            raise MachineError(f"{name}: {e}", details=e.details) from e

    def close(self) -> None:
        with self._engines_lock:
            for engine in self._engines.values():
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
    def submit(self, spec: JobSpec, *, new: bool = False) -> SubmitResult:
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
                    if existing.key == key and existing.active and not existing.cancel_requested:
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
        with _JOB_LOCKS_GUARD:
            return _JOB_LOCKS.setdefault((str(self.store.path), job_id), threading.Lock())

    def advance(self, job_id: str, *, progress: ProgressCallback | None = None) -> Job:
        """Take the job as far as it can go now, without waiting for it to finish."""
        self._drive(self.store.get(job_id), progress=progress)
        return self.store.get(job_id)

    def _drive(
        self,
        job: Job,
        status: RemoteStatus | None = None,
        *,
        progress: ProgressCallback | None = None,
        transfer: Callable[[Job], None] | None = None,
    ) -> None:
        """One step for one job. ``transfer`` takes sending and collecting elsewhere (the server's pool)."""
        lock = self._job_lock(job.id)
        if not lock.acquire(blocking=False):
            return  # another thread of this process is on it
        try:
            job = self.store.get(job.id)
            if job.state == "running":
                self._watch(job, status)
                job = self.store.get(job.id)
            if job.state in ("queued", "sending", "collecting") and transfer is not None:
                if job.lease is None or not holder_alive(job.lease):
                    transfer(job)
                return
            if job.state in ("queued", "sending"):
                self._launch(job, progress)
                job = self.store.get(job.id)
                if job.state == "running":
                    self._watch(job)
                    job = self.store.get(job.id)
            if job.state == "collecting":
                self._collect(job)
        except Exception as e:  # a bug or an unexpected OS error must not leave the job active for ever
            log.exception("job %s: %s", job.id, e)
            current = self.store.get(job.id)
            if current.active:
                if current.state == "collecting" and current.lease and self._holds(current.lease):
                    # A full disk must not stay full of a half fetch: the next attempt fetches again.
                    shutil.rmtree(self.workspace.job_dir(job.id) / "incoming", ignore_errors=True)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.workspace.job_dir(job.id) / "log.part")
                self._retry_later(current, e, "failed", f"{current.state} failed on this side")
        finally:
            lock.release()

    def poll_active(self, transfer: Callable[[Job], None] | None = None) -> None:
        """One pass over every unfinished job: one poll per machine, then each job advanced.

        With ``transfer``, sending and collecting (long) are handed to it instead of run here.
        """
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
        for job in jobs:
            if job.state != "running" or job.id in statuses:
                self._drive(job, statuses.get(job.id), transfer=transfer)

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
            if job.lease and not self._holds(job.lease) and holder_alive(job.lease):
                return None
            job.lease = {**self.identity, "renewed": time.time()}
            for name, value in changes.items():
                setattr(job, name, value)
            job.updated = utcnow()
        self._emit(job)
        return job

    def _holds(self, lease: dict[str, Any]) -> bool:
        return all(lease.get(k) == v for k, v in self.identity.items())

    def _renewer(self, job_id: str, then: ProgressCallback | None = None) -> ProgressCallback:
        """A progress callback that also keeps this process's lease fresh during a long transfer."""
        last = time.monotonic()

        def renew(done: int, total: int) -> None:
            nonlocal last
            if time.monotonic() - last > LEASE_RENEW_EVERY:
                last = time.monotonic()
                with self.store.transaction() as jobs:
                    job = jobs.get(job_id)
                    if job is not None and job.lease and self._holds(job.lease):
                        job.lease = {**job.lease, "renewed": time.time()}
            if then:
                then(done, total)

        return renew

    def _update(self, job_id: str, **changes: Any) -> Job:
        with self.store.transaction() as jobs:
            job = jobs[job_id]
            for name, value in changes.items():
                setattr(job, name, value)
            job.updated = utcnow()
        self._emit(job)
        return job

    def _retry_later(self, job: Job, error: Exception, give_up_state: str, give_up_reason: str) -> None:
        """A passing failure (a dropped connection): let go and try on a later poll, for a while.

        Past ``give_up_after`` seconds of failing, the job ends with ``give_up_reason`` and nothing
        more is asked of the machine.
        """
        now = time.time()
        since = job.failing_since or now
        log.warning("job %s: %s (failing for %.0f s)", job.id, error, now - since)
        if now - since > self.settings.give_up_after:
            self._finish_later(job.id, give_up_state, f"{give_up_reason}: {error}", reach_machine=False)
        else:
            # The reason says why it is stuck (a full disk, a machine down) while it tries again.
            reason = f"{give_up_reason}: {error}; trying again"
            self._update(job.id, lease=None, retries=job.retries + 1, failing_since=since, reason=reason)

    def _finish_later(self, job_id: str, state: str, reason: str, *, reach_machine: bool = True) -> None:
        """Decide the outcome now; collection records it (log, MLflow) and ends the job.

        ``reach_machine=False``: collect without asking the machine for anything (it could not be reached).
        """
        outcome = {"state": state, "reason": reason, "reach_machine": reach_machine}
        self._update(job_id, state="collecting", outcome=outcome, lease=None)

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
            # Every step is idempotent (the launcher finds a command it started already), so a
            # job whose sender died is simply sent and started again by whoever picks it up.
            job = self._update(job.id, state="sending")
            remote = engine.prepare(remote)
            self._update(job.id, handle=dict(remote.handle))
            files = self._inputs(job)

            def report(done: int, total: int) -> None:
                self.progress[job.id] = (done, total)
                if progress:
                    progress(done, total)

            report = self._renewer(job.id, report)

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
                reason=None,
                started=utcnow(),
                handle=dict(remote.handle),
                transfer=dataclasses.asdict(stats),
                lease=None,
                retries=0,
                failing_since=None,
            )
        except EngineError as e:
            if e.transient:
                self._retry_later(job, e, "failed", f"could not start on {job.machine}")
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

    def _mask_values(self, job: Job) -> list[str] | None:
        """The values to hide in this job's log and records; None when one cannot be read (fail closed)."""
        if not JobSpec.from_json(job.spec).secret_refs():
            return []
        try:
            return list(self._secret_env(job).values())
        except (RemoteComputeError, SecretStoreUnavailable):
            return None

    # -- running ------------------------------------------------------------
    def _watch(self, job: Job, status: RemoteStatus | None = None) -> None:
        engine = self._job_engine(job)
        remote = RemoteJob(job.id, job.key, job.handle)
        stop: tuple[str, str] | None = None
        if job.cancel_requested:
            stop = ("cancelled", f"cancelled by {job.cancel_requested}")
        elif job.spec.get("timeout") and job.started and time.time() - parse_time(job.started) > job.spec["timeout"]:
            stop = ("failed", f"timed out after {format_duration(job.spec['timeout'])}")
        try:
            if stop is not None:
                engine.cancel(remote, self.settings.cancel_grace)
                self._to_collecting(job, *stop)
                return
            if status is None:
                status = engine.poll([remote])[job.id]
        except EngineError as e:
            if stop is not None:
                reason = f"{stop[1]}; the process could not be stopped on {job.machine} and may still run"
                self._retry_later(job, e, stop[0], reason)
            else:
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
        """running → collecting, once (compare-and-set); collection is the next step's work."""
        outcome = {"state": state, "reason": reason, "reach_machine": True}
        with self.store.transaction() as jobs:
            current = jobs[job.id]
            if current.state != "running":
                return
            current.state, current.outcome, current.exit_code = "collecting", outcome, exit_code
            current.failing_since, current.updated = None, utcnow()
        self._emit(current)

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
        secrets = self._mask_values(job)
        result = FetchResult()
        log_path: Path | None = None
        if engine.is_prepared(remote) and outcome.get("reach_machine", True):
            try:
                result = engine.fetch(remote, wanted, incoming, self._renewer(job.id))
                log_path = self._fetch_log(job, engine, remote, local_dir / "log", secrets)
            except EngineError as e:
                if e.transient:
                    state = "lost" if outcome["state"] == "succeeded" else outcome["state"]
                    why = outcome.get("reason") or f"exit code {job.exit_code}"
                    self._retry_later(job, e, state, f"{why}; could not collect from {job.machine}")
                    return
                if outcome["state"] == "succeeded":
                    outcome = {"state": "failed", "reason": f"could not fetch outputs from {job.machine}: {e}"}

        landed: dict[str, Path] = {}
        verified: dict[str, str] = {}
        if outcome["state"] == "succeeded":
            verified, problem = _verify(incoming, wanted, result)
            if not problem:
                problem = self._check_landing(verified)
            if problem:
                outcome = {"state": "failed", "reason": problem}
            else:
                landed = self._land(incoming, verified)
        if outcome["state"] == "failed" and outcome.get("reason") is None:
            outcome["reason"] = f"exit code {job.exit_code}: {_tail(log_path)}"

        ended = utcnow()
        run_id = self._record(job, outcome, log_path, landed, incoming, ended, secrets or [])
        shutil.rmtree(incoming, ignore_errors=True)
        self._update(
            job.id,
            state=outcome["state"],
            reason=outcome.get("reason"),
            ended=ended,
            outputs={rel: {"sha256": verified[rel], "size": path.stat().st_size} for rel, path in landed.items()},
            mlflow_run_id=run_id,
            lease=None,
            failing_since=None,
        )

    def _fetch_log(
        self, job: Job, engine: Engine, remote: RemoteJob, dest: Path, secrets: Sequence[str] | None
    ) -> Path:
        """The whole log, masked across chunk boundaries; withheld when a secret cannot be read to mask it."""
        tmp = dest.with_suffix(".part")
        if secrets is None:
            tmp.write_bytes(WITHHELD_LOG)
            os.replace(tmp, dest)
            return dest
        offset = 0
        pending = b""  # masked bytes that a secret continuing in the next chunk could still change
        with open(tmp, "wb") as f:
            while chunk := engine.read_log(remote, offset, LOG_CHUNK):
                offset += len(chunk)
                buffer = mask(pending + chunk, secrets)
                settled = settled_length(buffer, secrets)
                f.write(buffer[:settled])
                pending = buffer[settled:]
            f.write(mask(pending, secrets))
        os.replace(tmp, dest)
        return dest

    def _check_landing(self, verified: dict[str, str]) -> str | None:
        """Before anything moves: every destination is inside the workspace and can take a file."""
        root = self.workspace.root.resolve()
        for rel in verified:
            dst = self.workspace.root / rel
            parent = dst.parent.resolve()
            if not (parent == root or root in parent.parents):
                return f"output {rel} would land outside the workspace (a folder on its path is a link)"
            if dst.is_dir() and not dst.is_symlink():
                return f"output {rel} cannot land: a folder of that name is in the workspace"
        return None

    def _land(self, incoming: Path, verified: dict[str, str]) -> dict[str, Path]:
        """Move verified outputs into the workspace; each file appears whole or not at all."""
        landed = {}
        for rel in verified:
            dst = self.workspace.root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            move_into_place(incoming / WORK_DIR / rel, dst)
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
        secrets: Sequence[str],
    ) -> str | None:
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
            mask_values=tuple(secrets),
        )
        try:
            return record_job(self.workspace.root, self.settings.tracking, record)
        except Exception as e:  # MLflow down must not lose the job: keep the reason, record later by hand
            log.error("job %s: recording the MLflow run failed: %s", job.id, type(e).__name__)
            error = mask(str(e).encode(), secrets).decode(errors="replace")[:500]
            outcome["reason"] = ((outcome.get("reason") or "") + f" (not recorded in MLflow: {error})").strip()
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
        engine = self._job_engine(job)
        remote = RemoteJob(job.id, job.key, job.handle)
        if not engine.is_prepared(remote):
            return LogChunk(b"", offset, offset, False)
        secrets = self._mask_values(job)
        if secrets is None:
            raise SecretStoreUnavailable(
                f"the log of job {job_id} is withheld: a secret it uses cannot be read from the Secret Manager "
                "to hide it in the log"
            )
        # Read from a little before the offset, so a secret the last read stopped inside is seen whole.
        back = min(offset, max((len(s.encode()) for s in secrets), default=0))
        limit = max(limit, MIN_LOG_READ)
        try:
            window = engine.read_log(remote, offset - back, limit + back)
        except EngineError:
            return LogChunk(b"", offset, offset, False)
        # Return only what no later byte can change: a secret starting near the end comes next time, whole.
        masked = mask(window, secrets)
        data = masked[back : max(back, settled_length(masked, secrets))]
        return LogChunk(data, offset, offset + len(data), False)


WITHHELD_LOG = (
    b"[jupyter-remote-compute] This job's log is withheld: a secret it uses could not be read from the\n"
    b"Secret Manager to hide it. Read the log on the machine itself.\n"
)


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
