"""The job lifecycle, written once for every entry point and every kind of machine.

``JobService`` is the one door the faces (the server's handlers, the CLI, the magic, a pipeline
step) use. It submits, reads, cancels and deletes jobs itself and hands the rest to its parts:

- ``lifecycle.Driver``: advancing a job, queued → sending → running → collecting (lifecycle.py);
- ``collect.Collector``: fetching, verifying and landing outputs, recording the run (collect.py);
- ``leases.Leases``: which process drives a job now (leases.py);
- ``admin.MachineAdmin``: adding, editing, checking and trusting machines, and their engines (admin.py);
- ``logs``: reading and following a job's log, secrets masked (logs.py).

Everything here blocks (engines, hashing, MLflow): the server calls it from worker threads,
never from the event loop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..engines import engine_class, engine_kinds
from ..engines.base import Engine, EngineError, InputFile, ProgressCallback, refuse_distributed
from ..engines.organization.client import ORG_KIND, ORG_PREFIX, tracking_server
from ..engines.resources import Resources
from ..environments import environment as environments
from ..environments import image as images
from ..environments import image_registry as registry
from ..errors import (
    Conflict,
    InvalidSettings,
    NotFound,
    NotTrained,
    RemoteComputeError,
    SecretInUse,
    SecretStoreUnavailable,
)
from ..fsutil import atomic_write, sha256_file
from ..guards import check_egress, load_detectors, screen_settings
from ..machines.admin import MachineAdmin, snapshot_of
from ..machines.facts import recorded_facts
from ..machines.options import COMMON_OPTIONS, LOCAL
from ..machines.registry import Machine, MachineRegistry
from ..people import local_person
from ..schema.pool import Pool
from ..secrets import SecretStore
from ..transfer.manifest import DigestCache, build_manifest, manifest_json
from ..usage.ledger import UsageRecord, live_attempts, parse_group_by, parse_instant, summarize
from ..workspace import Workspace
from . import logs, recording
from .checkpoints import Checkpoints
from .collect import Collector
from .context import JobContext, ServiceSettings, remote_of
from .job import Job, new_job_id, utcnow
from .key import job_key
from .leases import Leases
from .lifecycle import Driver
from .listing import JobPage, JobQuery, list_page
from .logs import LOG_CHUNK, LogChunk
from .metrics import MetricsPage
from .notify import Notifier, admit_machine_webhook
from .placement import POOL_KIND, never_fits, place_in
from .prune import PruneResult, prune_jobs
from .spec import JobSpec
from .store import JobStore
from .transitions import ACTIVE_STATES, TERMINAL_STATES

__all__ = ["JobService", "LogChunk", "ServiceSettings", "SubmitResult", "require_trained"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SubmitResult:
    job: Job
    attached: bool  # True: the same work was already under way and nothing new started


def require_trained(job: Job) -> Job:
    """The one definition of "trained": succeeded, every declared output fetched, verified and in place,
    and its MLflow run recorded (done means recorded: a gate reading the store right after finds it)."""
    if job.state == "succeeded" and job.mlflow_run_id:
        return job
    if job.state == "succeeded":
        message = f"job {job.id} succeeded but its MLflow run is not recorded: {job.reason or 'still being recorded'}"
        raise NotTrained(message, job_id=job.id, state=job.state, reason=job.reason)
    if job.state in ACTIVE_STATES:
        message = f"job {job.id} is not trained yet: it is still {job.state}"
    else:
        message = f"job {job.id} did not train: {job.state}: {job.reason}"
    raise NotTrained(message, job_id=job.id, state=job.state, reason=job.reason)


class JobService:
    def __init__(
        self,
        workspace: Workspace,
        settings: ServiceSettings | None = None,
        *,
        secrets: SecretStore | None = None,
    ) -> None:
        settings = settings or ServiceSettings()
        self.workspace = workspace
        workspace.keep_private()  # every face comes through here: the first one tightens an open .punica/
        self.machines = MachineRegistry(workspace.compute_yaml)
        self.store = JobStore(workspace.state_file)
        self.secrets = secrets or SecretStore()
        self.digests = DigestCache(workspace.digest_cache)
        self.admin = MachineAdmin(self.machines, self.secrets, settings.scratch_dir)
        self._listeners: list[Callable[[Job], None]] = []
        self.usage_record = UsageRecord(workspace.usage_record)
        self.ctx = JobContext(workspace, settings, self.store, self.secrets, self.admin, self._emit, self.usage_record)
        self.leases = Leases(self.ctx)
        self.checkpoints = Checkpoints(self.ctx, self.leases)
        self.collector = Collector(self.ctx, self.leases, self.checkpoints)
        self.driver = Driver(self.ctx, self.leases, self.collector, self.digests, self.checkpoints)
        self.notifier = Notifier(self.secrets, self.store, self._emit)  # webhooks, told what this process changes
        self.add_listener(self.notifier)

    @property
    def settings(self) -> ServiceSettings:
        return self.ctx.settings

    @settings.setter
    def settings(self, value: ServiceSettings) -> None:
        self.ctx.settings = value  # every part reads it from the shared context

    @property
    def progress(self) -> dict[str, tuple[int, int]]:
        """Bytes moved so far for jobs this process is sending: job id -> (done, total)."""
        return self.driver.progress

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

    # -- machines: through MachineAdmin, the one door for every face -----------------
    def engine(self, machine_name: str, snapshot: dict[str, Any] | None = None) -> Engine:
        """The cached engine of a machine (built from a job's snapshot once the machine is gone)."""
        return self.admin.engine(machine_name, snapshot)

    def close(self) -> None:
        self.checkpoints.close()
        self.notifier.close()
        self.admin.close()

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

    def list_page(self, query: JobQuery) -> JobPage:
        """One page of job summaries, newest first (``listing.py``)."""
        return list_page(self.store, query)

    def usage(
        self, group_by: str | Sequence[str] | None = None, since: str | None = None, until: str | None = None
    ) -> dict[str, Any]:
        """Job-hours, GPU-hours, queue time, bytes moved and cost estimates per group (``usage.py``).

        Ended attempts come from the usage record; those under way from the state file, counted up to now.
        """
        keys = parse_group_by(group_by)
        start, end = parse_instant(since, "since"), parse_instant(until, "until")
        if start is not None and end is not None and end < start:
            raise InvalidSettings("until: must not be before since", field="until")
        attempts = self.usage_record.attempts()
        attempts += live_attempts(self.store.jobs().values(), self.usage_record, self.workspace.punica_dir)
        return summarize(attempts, keys, since=start, until=end)

    def prune(self, **options: Any) -> PruneResult:
        """Forget old finished jobs (``prune.py``; options as ``prune_jobs``)."""
        return prune_jobs(self, **options)

    # -- submit -------------------------------------------------------------
    def warm_up(self) -> None:
        """Load what a first submit needs and a short-lived CLI loads only on use: the secret detectors
        and the Secret Manager's backend (~0.6 s together here). A long-lived server calls this at start."""
        load_detectors()
        self.secrets.where()

    def submit(self, spec: JobSpec, *, new: bool = False, user: str | None = None) -> SubmitResult:
        """Validate, screen, check policy, hash inputs; then attach to the same work or queue a new job.

        Nothing is stored and nothing leaves this machine until every check passed.
        """
        # A pool's job waits for a machine of the pool (placement.py); one naming a machine runs there.
        machine, pool, members = self._target(spec.machine)
        if machine is not None and not machine.enabled:
            raise InvalidSettings(f"machine: {machine.name!r} is disabled; enable it first", field="machine")
        for each in [machine] if machine is not None else members.values():  # what each job on it tells
            admit_machine_webhook(each, self.secrets)

        # Stored values are read only if some setting is long enough to hold one (see screen_settings).
        screen_settings(spec.screened_settings(), self._stored_secret_values)
        named = {f"env.{env_name}": secret_name for env_name, secret_name in spec.secret_refs().items()}
        for i, hook in enumerate(spec.notify):
            named.update({f"notify[{i}].{setting}": name for setting, name in hook.secret_names().items()})
        for field, secret_name in named.items():
            if self.secrets.get(secret_name) is None:
                raise InvalidSettings(
                    f"{field}: no secret named {secret_name!r} in the Secret Manager; "
                    f"store it with `jupyter remote-compute secrets set {secret_name}`",
                    field=field,
                )

        if machine is not None:
            spec = environments.with_machine_default(spec, machine.options)
            spec = registry.with_machine_default(spec, machine.options)
        registry.admit(spec, self.secrets)
        if spec.image and machine is not None:
            self._admit_image(machine, spec.image, spec.resources)
        files, key, resolved = self._inputs_and_key(spec)
        experiment = self.settings.tracking.experiment
        if experiment and "MLFLOW_EXPERIMENT_NAME" not in spec.env:
            # The far side's script sees the experiment a local run would use; after the key, so the
            # same work submitted from a process without the variable still attaches.
            spec = dataclasses.replace(spec, env={**spec.env, "MLFLOW_EXPERIMENT_NAME": experiment})
        inputs = [f.relpath for f in files]
        if pool is not None:
            self._admit_pool(pool, members, spec, inputs)
        else:
            assert machine is not None
            cls = engine_class(machine.kind)
            features = cls.features_for(machine.options)
            check_egress(self.workspace.policy_yaml, machine.name, features.remote, inputs)
            if spec.resources.to_json():
                self._admit(machine, spec)
            if spec.checkpoints and not features.checkpoints:
                raise InvalidSettings(
                    f"checkpoints: {machine.name} is a {machine.kind} machine, whose checkpoints do not come home "
                    "yet; run on a local, ssh or Slurm machine, or leave checkpoints out",
                    field="checkpoints",
                )
            self._admit_fallback(spec, machine, inputs)

        # A job on the organization's machine is recorded on its tracking server, where an admin set one.
        tracking = tracking_server() if machine is not None and machine.kind == ORG_KIND else None
        job_id = new_job_id()
        jobdir = self.workspace.job_dir(job_id)
        manifest = json.dumps({"files": manifest_json(files)}, indent=1).encode()
        atomic_write(jobdir / "inputs.json", manifest)
        if resolved:
            environments.save(jobdir, resolved)

        placed: list[str] = []
        facts = recorded_facts(self.workspace.punica_dir) if pool is not None else {}  # read before the lock
        with self.store.transaction() as jobs:
            if not new:
                for existing in jobs.unfinished():
                    if existing.key == key and existing.active and not existing.cancel_requested:
                        shutil.rmtree(jobdir, ignore_errors=True)
                        return SubmitResult(existing, attached=True)
            job = Job(
                id=job_id,
                key=key,
                machine=machine.name if machine is not None else spec.machine,
                kind=machine.kind if machine is not None else POOL_KIND,
                spec=spec,
                machine_snapshot=snapshot_of(machine) if machine is not None else {},
                inputs={"files": len(files), "bytes": sum(f.size for f in files)},
                user=user or local_person(),
                pool=pool.name if pool is not None else None,
                tracking_uri=tracking,
            )
            jobs[job_id] = job
            if pool is not None:
                # In this same write: a machine of the pool with room takes the job at once, in its turn.
                placed = place_in(jobs, pool, members, facts, new=job)
        for changed in placed:
            if changed != job_id:
                self._emit(self.store.get(changed))
        self._emit(job)
        recording.resume(self.ctx)  # a run some earlier face left unrecorded (it was killed, say)
        return SubmitResult(job, attached=False)

    def _target(self, name: str) -> tuple[Machine | None, Pool | None, dict[str, Machine]]:
        """What a job names: a machine, or a pool and its machines by name; compute.yaml read once."""
        if name == LOCAL or name.startswith(ORG_PREFIX):
            return self.admin.resolve(name), None, {}  # the built-in machine is answered without the file
        machines, pools = self.machines.machines_and_pools()
        pool = next((p for p in pools if p.name == name), None)
        if pool is not None:
            return None, pool, {m.name: m for m in machines if m.name in pool.machines}
        own = next((m for m in machines if m.name == name), None)
        try:
            return own or self.admin.resolve(name), None, {}  # not its own: the organization's, on a hub
        except NotFound as e:
            raise NotFound(f"{e.message}, nor a pool of that name (machines pools lists them)") from None

    def _admit_pool(self, pool: Pool, members: Mapping[str, Machine], spec: JobSpec, inputs: list[str]) -> None:
        """Every machine of the pool may receive the inputs (the egress policy), bring the job's
        checkpoints home and run its image, and one at least could ever give what it asks."""
        if spec.fallback:
            raise InvalidSettings(
                f"fallback: a job on pool {pool.name} moves within its pool, not to fallback machines; leave "
                "fallback out, or name a machine",
                field="fallback",
            )
        self._admit_members(pool, members, spec, inputs, "")
        never = never_fits(pool, members, spec.resources, recorded_facts(self.workspace.punica_dir))
        if never is not None:
            raise InvalidSettings(f"resources: no machine of pool {pool.name} can give it: {never}", field="resources")

    def _admit_members(
        self, pool: Pool, members: Mapping[str, Machine], spec: JobSpec, inputs: list[str], field: str
    ) -> None:
        """Each machine of ``pool`` could run the job (any may be the one with room); ``field``: the setting
        that named the pool when it is not the job's machine (``fallback[1]``), else ""."""
        for machine in members.values():
            features = engine_class(machine.kind).features_for(machine.options)
            check_egress(self.workspace.policy_yaml, machine.name, features.remote, inputs)
            refuse_distributed(spec.resources, features, machine.name, machine.kind)
            if spec.checkpoints and not features.checkpoints:
                raise InvalidSettings(
                    f"{field or 'checkpoints'}: pool {pool.name}'s machine {machine.name} is a {machine.kind} "
                    "machine, whose checkpoints do not come home yet; take it out of the pool, or leave "
                    "checkpoints out",
                    field=field or "checkpoints",
                )
        if spec.image:
            # Any machine may be the one with room: each must run the image (its kind, its runtimes).
            cannot = []
            for machine in members.values():
                try:
                    self._admit_image(machine, spec.image, spec.resources)
                except InvalidSettings as e:
                    cannot.append(e.message.split(": ", 1)[-1])
            if cannot:
                raise InvalidSettings(
                    f"{field or images.FIELD}: not every machine of pool {pool.name} can run {spec.image.ref}: "
                    + "; ".join(cannot)
                    + "; take those out of the pool, or name a machine",
                    field=field or images.FIELD,
                )

    def _admit_fallback(self, spec: JobSpec, machine: Machine, inputs: list[str]) -> None:
        """Each fallback machine exists, is enabled, may receive the inputs and can bring checkpoints home;
        each fallback pool's machines could run the job."""
        pools: dict[str, Pool] = {}
        machines: dict[str, Machine] = {}
        if spec.fallback:
            listed, known = self.machines.machines_and_pools()
            pools, machines = {p.name: p for p in known}, {m.name: m for m in listed}
        for i, name in enumerate(spec.fallback):
            field = f"fallback[{i}]"
            pool = pools.get(name)
            if pool is not None:
                members = {m: machines[m] for m in pool.machines if m in machines}
                self._admit_members(pool, members, spec, inputs, field)
                never = never_fits(pool, members, spec.resources, recorded_facts(self.workspace.punica_dir))
                if never is not None:
                    raise InvalidSettings(f"{field}: no machine of pool {pool.name} can give it: {never}", field=field)
                continue
            try:
                other = self.admin.resolve(name)
            except NotFound as e:
                raise InvalidSettings(f"{field}: {e.message}", field=field) from None
            if other.name == machine.name:
                raise InvalidSettings(f"{field}: {name!r} is the job's own machine", field=field)
            admit_machine_webhook(other, self.secrets)
            if not other.enabled:
                raise InvalidSettings(f"{field}: {other.name!r} is disabled; enable it first", field=field)
            features = engine_class(other.kind).features_for(other.options)
            refuse_distributed(spec.resources, features, other.name, other.kind)
            if spec.checkpoints and not features.checkpoints:
                raise InvalidSettings(
                    f"{field}: {other.name} is a {other.kind} machine, whose checkpoints do not come home yet",
                    field=field,
                )
            check_egress(self.workspace.policy_yaml, other.name, features.remote, inputs)

    def _admit(self, machine: Machine, spec: JobSpec) -> None:
        """The machine refuses, before anything is stored, resources it cannot give."""
        # Every kind, whatever its own admit does: several processes need a kind that starts them. The
        # engine's own features: its machine's options' (an ssh host list), the organization's machine
        # those of the kind it really is.
        engine = self.engine(machine.name)
        refuse_distributed(spec.resources, engine.features, machine.name, engine.machine_kind)
        try:
            engine.admit(spec.resources)
        except EngineError as e:
            raise InvalidSettings(
                f"resources: could not learn what {machine.name} can give ({e}); try again", field="resources"
            ) from None

    def _admit_image(self, machine: Machine, image: images.Image, resources: Resources) -> None:
        """The machine refuses, before anything is stored, an image it has no runtime for, or GPUs
        its runtime cannot give a container."""
        if resources.distributed:
            # Each process's rank and rendezvous would have to reach its own container.
            raise InvalidSettings(
                f"{images.FIELD}: a job of several processes (resources.nodes, processes_per_node, launcher) does "
                "not run in a container image yet; leave the image out, or run one process",
                field=images.FIELD,
            )
        engine = self.engine(machine.name)
        runtimes = engine.image_runtimes()
        try:
            facts = engine.image_facts() if runtimes else None
        except EngineError as e:
            raise InvalidSettings(
                f"{images.FIELD}: could not learn whether {machine.name} runs images ({e}); try again",
                field=images.FIELD,
            ) from None
        kind = engine.machine_kind  # a Slurm machine of the organization's is one, as to its GPUs' facts
        images.admit(image, machine.name, kind, runtimes, facts)
        gpus = images.gpu_request(resources, machine.options, engine)
        images.admit_gpus(image, gpus, machine.name, kind, runtimes, facts)

    def _inputs_and_key(self, spec: JobSpec) -> tuple[list[InputFile], str, environments.ResolvedEnvironment | None]:
        """The inputs, hashed, the environment as content, and the idempotency key: the one place all are derived."""
        files = build_manifest(self.workspace.root, spec.send, self.digests)
        # An image alone builds nothing: its jobs' keys hold no environment digest.
        resolved = environments.resolve(spec.environment, self.workspace.root) if environments.builds(spec) else None
        return files, spec.key or job_key(spec, files, resolved.digest if resolved else None), resolved

    def latest_same_work(self, spec: JobSpec) -> Job | None:
        """The newest job doing the same work as ``spec`` (same key), whatever its state."""
        machine, _, _ = self._target(spec.machine)
        if machine is None:
            # A pool's jobs ran on any of its machines, with no machine's defaults (as submit keys them).
            _, key, _ = self._inputs_and_key(spec)
            same = [j for j in self.list_jobs() if j.pool == spec.machine and j.key == key]
            return same[0] if same else None
        spec = environments.with_machine_default(spec, machine.options)
        _, key, _ = self._inputs_and_key(spec)
        same = [j for j in self.list_jobs(machine=machine.name) if j.key == key]
        return same[0] if same else None

    def place(self) -> None:
        """Place the pools' waiting jobs that fit now (placement.py): a face that enabled or checked a
        machine calls it, so a pool's job takes the room at once rather than at the next poll."""
        self.driver.place()

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

    # -- secrets the panel manages ------------------------------------------------
    def secret_users(self, name: str, jobs: Mapping[str, Job] | None = None) -> list[str]:
        """What needs secret ``name`` now: machines whose options name it, unfinished jobs referencing it."""
        users = []
        for machine in self.machines.list():
            fields = {
                **COMMON_OPTIONS,
                **(engine_class(machine.kind).options if machine.kind in engine_kinds() else {}),
            }
            if any(field.secret_name and machine.options.get(key) == name for key, field in fields.items()):
                users.append(f"machine {machine.name}")
        for job in (self.store.jobs() if jobs is None else jobs).values():
            if job.active and (name in job.spec.secret_refs().values() or job.spec.registry_secret == name):
                users.append(f"job {job.name or job.id} ({job.id}, {job.state})")
        return users

    def delete_secret(self, name: str) -> None:
        """Delete a secret of the user's store unless something still needs it (SecretInUse names what).

        Checked under the state file's lock, so a job referencing it cannot be queued in between.
        """
        with self.store.transaction() as jobs:
            users = self.secret_users(name, jobs)
            if users:
                raise SecretInUse(name, users)
            self.secrets.delete(name)

    # -- driving: lifecycle.Driver ------------------------------------------------
    def advance(self, job_id: str, *, progress: ProgressCallback | None = None) -> Job:
        """Take the job as far as it can go now, without waiting for it to finish."""
        return self.driver.advance(job_id, progress=progress)

    def poll_active(self, transfer: Callable[[Job], None] | None = None) -> None:
        """One pass over every unfinished job; with ``transfer``, sending and collecting are handed to it."""
        self.driver.poll_active(transfer)

    def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        *,
        on_log: Callable[[bytes], None] | None = None,
        progress: ProgressCallback | None = None,
        interval: float | None = None,
        stop: threading.Event | None = None,
        on_wait: Callable[[Job], None] | None = None,
        on_metrics: Callable[[MetricsPage], None] | None = None,
    ) -> Job:
        """Drive the job until it ends, ``timeout`` passes or ``stop`` is set; stream its log to ``on_log``.

        ``on_wait`` hears a job go pending (with the reason) and start running after it;
        ``on_metrics`` the live metrics it logs to MLflow on its machine, as they arrive.

        Returns the job in whatever state it reached: a wait that ends early does not stop the job.
        The CLI (``run``, ``jobs log -f``), the magic and pipeline steps all follow a job through here.
        Done means recorded: a job that ended is returned once its MLflow run is (``mlflow_run_id``),
        or once the recorder has said on it why it could not be.
        """
        if timeout is None:
            # Recording a small job is mostly importing MLflow: done while the job runs.
            current = self.store.get(job_id)
            if current.mlflow_run_id is None and current.spec is not None:
                recording.prewarm(self.ctx, current)
        job = logs.follow(
            self.advance,
            self.read_log,
            job_id,
            interval=interval or min(self.settings.poll_interval, 1.0),
            timeout=timeout,
            on_log=on_log,
            progress=progress,
            stop=stop,
            on_wait=on_wait,
            read_metrics=self.read_metrics,
            on_metrics=on_metrics,
        )
        if job.state in TERMINAL_STATES and job.mlflow_run_id is None:
            recording.await_recorded(self.ctx, job.id)
            job = self.store.get(job.id)
        return job

    def read_log(self, job_id: str, offset: int = 0, limit: int = LOG_CHUNK) -> LogChunk:
        """Part of a job's log from a byte offset, whole lines where possible, secrets masked."""
        return logs.read_log(self.ctx, job_id, offset, limit)

    def read_metrics(self, job_id: str, since: str | None = None) -> tuple[MetricsPage, bool]:
        """A job's live metrics past cursor ``since``, and whether more may come (the job is unfinished).

        Asking marks an unfinished job watched (``metrics.WATCH_FOR``): its next polls bring what it
        logs to MLflow on its machine. Points are kept in this process only, while it reads them.
        """
        job = self.store.get(job_id)
        if job.active:
            self.ctx.metrics.watch(job_id)
        return self.ctx.metrics.read(job_id, since), job.active

    # -- user actions ---------------------------------------------------------
    def cancel(self, job_id: str, by: str = "user") -> Job:
        with self.store.transaction() as jobs:
            job = jobs.get(job_id)
            if job is None:
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
                self.ctx.engine_of(job).cleanup(remote_of(job))
            except (EngineError, RemoteComputeError) as e:
                log.warning("job %s: cleaning up on %s failed: %s", job_id, job.machine, e)
        shutil.rmtree(self.workspace.job_dir(job_id), ignore_errors=True)
        with self.store.transaction() as jobs:
            jobs.pop(job_id, None)
