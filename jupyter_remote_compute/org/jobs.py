"""Jobs users run on the organization's machines, as the service does them: each step with the real engine.

A user's own server drives the job (its lifecycle, its outputs, its MLflow run) through an engine of kind
``organization`` (``engines/organization/engine.py``); every call of that engine is a route of the
service, which does the step on the machine with the organization's credentials, through the engine
``MachineAdmin`` builds from the service's compute.yaml and Secret Manager. So the user never holds a
key or token of the machine.

What the service keeps of a job is small (``OrgJob``): whose it is (the hub user, bound when it is
prepared), the machine as it was then (a snapshot, so an admin's later edit leaves it be), and the real
engine's handle. One JSON file per job, written whole, under the user's own folder::

    <state>/.punica/org-users/<user>/        0700, one per hub user
        jobs/<job id>.json                   the record
        blobs/<sha256>                       inputs uploaded, by content (the user's own: no one else's
                                             upload is ever found by its digest)
        fetched/<job id>/                    outputs fetched from the machine, until they are downloaded

A job id is looked up under the caller's folder only, so another user's job is not there: "not found",
never "not yours", and ids tell nothing. Far from here, each user's jobs are apart too: the real engine
is given ``<machine's base>/users/<user>/`` as its base (made 0700 by prepare.sh's umask), so their job
folders, input caches and environments never mix. Every method blocks: the service calls them in threads.

The record also meters the job for the organization's ledger (``<state>/.punica/usage.jsonl``, the
same ``Attempt`` lines as a user's own, with the user's hub groups): when the service started it, what
it holds, when the service saw it end (a poll, a cancel, its removal). The quotas (``quotas.py``) are
checked against those figures before a job is prepared and started, and ``enforce`` stops a running
job whose user or group used up a hard quota.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..engines.base import (
    Engine,
    Handle,
    InputFile,
    LaunchSpec,
    MetricBytes,
    MetricOffsets,
    RemoteJob,
    RemoteStatus,
)
from ..engines.organization.wire import status_json
from ..engines.resources import Resources
from ..engines.shell import ShellEngine
from ..environments import image_registry
from ..errors import Conflict, InvalidSettings, NotFound
from ..fsutil import atomic_write
from ..jobs.job import parse_time, utcnow
from ..machines.admin import MachineAdmin, snapshot_of
from ..machines.facts import known_facts
from ..schema.job import QuotaNotices
from ..schema.spec import PULL_TIMEOUT_VAR, REGISTRY_AUTH_VAR
from ..schema.usage import Attempt
from ..secrets import mask
from ..usage.ledger import USAGE_FILE, UsageRecord, summarize
from .outputs import write_manifest_stream
from .quotas import HOURS, NOTICE_AT, Quotas, describe, month_start, refusal

log = logging.getLogger(__name__)

USERS_DIR = "org-users"
#: What a poll says of a job that stopped on its machine.
ENDED = ("exited", "failed", "cancelled", "gone")
#: Uploaded inputs not used by any send for this long are removed (the machine keeps its own cache).
BLOB_MAX_AGE = 7 * 24 * 3600.0
_SHA = re.compile(r"[0-9a-f]{64}")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_PLAIN_USER = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def user_folder(user: str) -> str:
    """A hub user's folder name, here and on the machines: the name itself when it is a plain one,
    else a digest of it (hub names may hold '@', spaces, capitals)."""
    if _PLAIN_USER.fullmatch(user) and ".." not in user:
        return user
    return "u-" + hashlib.sha256(user.encode()).hexdigest()[:24]


def ledger_job(user: str, job_id: str) -> str:
    return f"{user_folder(user)}/{job_id}"


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise InvalidSettings("id: expected a job id (letters, digits, '.', '_', '-')", field="id")
    return job_id


def check_sha(sha: Any, field: str = "sha256") -> str:
    if not isinstance(sha, str) or not _SHA.fullmatch(sha):
        raise InvalidSettings(f"{field}: expected a sha256 in lowercase hex", field=field)
    return sha


@dataclasses.dataclass
class OrgJob:
    """One user's job on one of the organization's machines."""

    id: str
    user: str
    machine: str
    key: str
    snapshot: dict[str, Any]  # the machine at prepare, with the user's own base
    handle: Handle
    created: str
    groups: list[str] = dataclasses.field(default_factory=list)  # the user's hub groups at prepare
    # The metering: when it started here, what it held, when the service saw it end.
    started: float | None = None
    gpus: int = 0
    nodes: int = 1  # the nodes it asked for: its hours count on each (node-hours)
    ended: float | None = None
    #: Why the service stopped it (a quota): the reason its user's server is told.
    stopped: str | None = None
    #: When a hard quota it counts against was first seen used up (its grace runs from then).
    over_since: float | None = None
    notices: QuotaNotices = dataclasses.field(default_factory=list)
    #: Which attempt of the user's job this record is: a retry removes the record and prepares the same id
    #: again, and the ledger keeps one line per (job, attempt).
    number: int = 1

    @property
    def ledger_job(self) -> str:
        """The job as the ledger names it: the user's id under their folder, since ids are the users' own
        (another user's same id is another job, never a line the ledger takes for one it has)."""
        return ledger_job(self.user, self.id)

    @property
    def active(self) -> bool:
        return self.started is not None and self.ended is None

    def remote(self) -> RemoteJob:
        return RemoteJob(self.id, self.key, self.handle)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> dict[str, Any]:
        """What a listing shows: never the snapshot's options (paths of the organization's keys)."""
        return {
            "id": self.id,
            "user": self.user,
            "machine": self.machine,
            "created": self.created,
            "running": self.active,
            "stopped": self.stopped,
            "notices": self.notices,
        }

    def attempt(self, state: str, ended: float | None) -> Attempt:
        """The job's attempt, as the organization's ledger keeps it (``usage/ledger.py``'s line)."""
        return Attempt(
            job=self.ledger_job,
            attempt=self.number,
            name=self.id,
            machine=self.machine,
            kind=str(self.snapshot.get("kind") or ""),
            user=self.user,
            queued=parse_time(self.created),
            started=self.started,
            ended=ended,
            state=state,
            gpus=self.gpus,
            nodes=self.nodes,
            source="engine",
            running=ended is None,
            groups=tuple(self.groups),
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OrgJob:
        # Fields a record written before metering lacks take their defaults.
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


class OrgJobs:
    """Every user's jobs on the organization's machines; one per service."""

    def __init__(self, punica_dir: Path, admin: MachineAdmin) -> None:
        self.root = punica_dir / USERS_DIR
        self.root.mkdir(mode=0o700, exist_ok=True)
        self.admin = admin
        self._lock = threading.Lock()
        #: The organization's ledger: one line per ended attempt, as a user's own (``usage/ledger.py``).
        self.usage = UsageRecord(punica_dir / USAGE_FILE)
        self.quotas = Quotas(punica_dir)

    # -- the records -----------------------------------------------------------------
    def folder(self, user: str) -> Path:
        path = self.root / user_folder(user)
        for sub in ("", "jobs", "blobs", "fetched"):
            (path / sub).mkdir(mode=0o700, exist_ok=True)
        return path

    def _record_path(self, user: str, job_id: str) -> Path:
        return self.folder(user) / "jobs" / f"{check_job_id(job_id)}.json"

    def get(self, user: str, job_id: str) -> OrgJob:
        """The caller's job; any other id (another user's included) is not found."""
        try:
            data = json.loads(self._record_path(user, job_id).read_bytes())
        except FileNotFoundError:
            raise NotFound(f"no job {job_id!r} of {user}'s on the organization's machines") from None
        return OrgJob.from_json(data)

    def _save(self, job: OrgJob) -> None:
        atomic_write(self._record_path(job.user, job.id), json.dumps(job.to_json(), indent=1).encode(), mode=0o600)

    def records(self, user: str | None = None) -> list[OrgJob]:
        """One user's job records, or every user's (``None``)."""
        folders = [self.root / user_folder(user)] if user is not None else sorted(self.root.iterdir())
        found = []
        for folder in folders:
            for path in (folder / "jobs").glob("*.json"):
                try:
                    found.append(OrgJob.from_json(json.loads(path.read_bytes())))
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # one unreadable record does not hide the others
        return found

    def list(self, user: str | None = None) -> list[dict[str, Any]]:
        """One user's jobs, or every user's (``None``: an admin's listing), newest first."""
        found = [job.summary() for job in self.records(user)]
        return sorted(found, key=lambda j: (j["created"], j["id"]), reverse=True)

    # -- usage and quotas ------------------------------------------------------------------
    def attempts(self, user: str | None = None) -> list[Attempt]:
        """Every metered attempt (one user's, or everyone's): those ended from the ledger, those
        running from the records, counted up to now."""
        ended = [a for a in self.usage.attempts() if user is None or a.user == user]
        return ended + [job.attempt("running", None) for job in self.records(user) if job.active]

    def _meter_end(self, job: OrgJob, state: str) -> OrgJob:
        """The job's attempt ended: one line in the ledger, then the record says so (a crash between
        the two writes the line again, and the ledger keeps the first). Under the lock, so two polls
        that see the same end at once (the user's server and a CLI following the job) meter it once."""
        with self._lock:
            job = self.get(job.user, job.id)
            if not job.active:
                return job
            ended = time.time()
            self.usage.append(job.attempt(state, ended))
            job.ended = ended
            self._save(job)
        return job

    def standing(self, user: str, groups: Sequence[str], now: float | None = None) -> list[dict[str, Any]]:
        """Each quota binding ``user`` with what its user or group used this period and has left."""
        now = time.time() if now is None else now
        attempts = self.attempts()
        active = [job for job in self.records() if job.active]
        return [
            self._standing(key, quota, attempts, active, now)
            for key, quota in self.quotas.applying(user, groups).items()
        ]

    def every_standing(self, now: float | None = None) -> list[dict[str, Any]]:
        now = time.time() if now is None else now
        attempts, active = self.attempts(), [job for job in self.records() if job.active]
        return [self._standing(key, quota, attempts, active, now) for key, quota in sorted(self.quotas.all().items())]

    def _standing(
        self, key: str, quota: Mapping[str, Any], attempts: Sequence[Attempt], active: Sequence[OrgJob], now: float
    ) -> dict[str, Any]:
        who, _, name = key.partition(":")
        mine = [a for a in attempts if (a.user == name if who == "user" else name in a.groups)]
        rows = summarize(mine, ("month",), since=month_start(now), now=now)["rows"]
        used: dict[str, float] = {limit: sum(row[limit] for row in rows) for limit in HOURS}
        used["jobs"] = sum(1 for job in active if (job.user == name if who == "user" else name in job.groups))
        left = {limit: max(0.0, quota[limit] - used[limit]) for limit in (*HOURS, "jobs") if limit in quota}
        return {"who": key, **quota, "used": used, "left": left}

    def admit(self, user: str, groups: Sequence[str], gpus: int | None) -> None:
        """Refuse (``QuotaExceeded``: which quota, used, left) a job a quota has no room for: one more
        running job, or hours already used up (GPU-hours only for a job that holds GPUs, once known)."""
        for standing in self.standing(user, groups):
            key = standing["who"]
            running = standing["used"]["jobs"]  # this job is not among them: it has not started
            if "jobs" in standing and running >= standing["jobs"]:
                raise refusal(key, "jobs", standing, running)
            for limit in HOURS:
                if limit == "gpu_hours" and not gpus:
                    continue
                if limit in standing and standing["used"][limit] >= standing[limit]:
                    raise refusal(key, limit, standing, standing["used"][limit])

    def enforce(self, now: float | None = None) -> None:
        """What the service does every few seconds: a running job whose user or group used up a quota's
        hours gets a notice at 90 %; under a hard quota it is stopped once the grace has passed."""
        now = time.time() if now is None else now
        records = [job for job in self.records() if job.active]
        for job in records:
            if job.stopped:  # stopped before, but its machine did not take the cancel: again
                try:
                    self._cancel(job, 10.0, "failed")
                except Exception as e:  # the next round tries again; the other jobs are looked at now
                    log.warning("job %s of %s: could not stop it: %s", job.id, job.user, e)
        active = [job for job in records if not job.stopped]
        if not active:
            return
        standings = self.every_standing(now)
        for job in active:
            for standing in standings:
                who, _, name = standing["who"].partition(":")
                if not (job.user == name if who == "user" else name in job.groups):
                    continue
                for limit in HOURS:
                    if limit not in standing or (limit == "gpu_hours" and not job.gpus):
                        continue
                    used, allowed = standing["used"][limit], standing[limit]
                    if used >= NOTICE_AT * allowed:
                        self._notice(job, standing, limit, used)
                    if used >= allowed and not standing["soft"]:
                        self._over(job, standing, limit, used, now)

    def _notice(self, job: OrgJob, standing: Mapping[str, Any], limit: str, used: float) -> None:
        """Once per quota and limit: kept on the job's record (its ``notices``), added to the job's own
        log on its machine (which its user reads through their server), and in the service's log."""
        about = f"{describe(standing['who'])} {limit} {'soft' if standing['soft'] else 'hard'} quota"
        share = int(100 * used / standing[limit]) if standing[limit] else 100
        text = f"{about}: {share} % of {standing[limit]:g} h per {standing['period']} used ({used:.4f} h)"
        if not standing["soft"]:
            text += f"; the job is stopped at 100 % after a grace of {standing['grace_seconds']:g} s"
        with self._lock:
            current = self.get(job.user, job.id)
            if any(n.startswith(about + ":") for n in current.notices):
                return
            current.notices.append(text)
            self._save(current)
        log.info("job %s of %s: %s", job.id, job.user, text)
        self._note(current, f"notice: {text}")

    def _note(self, job: OrgJob, text: str) -> None:
        """A line of the organization's in the job's log on its machine; one that cannot be written there
        is in the record and the service's log all the same."""
        engine = self.engine(job)
        if not isinstance(engine, ShellEngine):
            return
        try:
            engine.note(job.remote(), f"[organization] {text}")
        except Exception as e:
            log.warning("job %s of %s: could not add to its log: %s", job.id, job.user, e)

    def _over(self, job: OrgJob, standing: Mapping[str, Any], limit: str, used: float, now: float) -> None:
        with self._lock:
            current = self.get(job.user, job.id)
            if current.stopped:
                return  # stopped already, by another quota it counts against
            if current.over_since is None:
                current.over_since = now
                self._save(current)
        if now - current.over_since < standing["grace_seconds"]:
            return
        reason = (
            f"stopped by the organization: {describe(standing['who'])} {limit} quota of {standing[limit]:g} h "
            f"per {standing['period']} is used up: {used:.4f} h used"
        )
        with self._lock:
            current = self.get(job.user, job.id)
            current.stopped = reason
            self._save(current)
        log.info("job %s of %s: %s", job.id, job.user, reason)
        self._note(current, reason)
        self._cancel(current, 10.0, "failed")

    def engine(self, job: OrgJob) -> Engine:
        return self.admin.engine(job.machine, job.snapshot)

    # -- the job's life, as the user's engine asks for it ------------------------------------
    def prepare(self, user: str, job_id: str, machine_name: str, key: str, groups: Sequence[str] = ()) -> OrgJob:
        """Bind ``job_id`` to ``user`` on the machine and make its folder there (idempotent); a new job
        a quota of the user or their ``groups`` has no room for is refused before anything is made."""
        check_job_id(job_id)
        if not isinstance(key, str) or not key:
            raise InvalidSettings("key: expected the job's key", field="key")
        with self._lock:
            path = self._record_path(user, job_id)
            if path.exists():
                job = self.get(user, job_id)
            else:
                machine = self.admin.get(machine_name)  # NotFound names it
                if machine.builtin:
                    raise NotFound(f"{machine_name!r} is not one of the organization's machines")
                if not machine.enabled:
                    raise InvalidSettings(f"machine: {machine_name!r} is disabled by the organization", field="machine")
                snapshot = self._user_snapshot(machine, user)
                self.admit(user, groups, None)
                job = OrgJob(job_id, user, machine.name, key, snapshot, {}, utcnow(), groups=sorted(groups))
                # A retry prepares the id again: its attempt is the next of those the ledger has.
                job.number = 1 + sum(1 for a in self.usage.attempts() if a.job == job.ledger_job)
                self._save(job)
            if job.machine != machine_name or job.key != key:
                raise Conflict(f"job {job_id} was prepared on {job.machine} for other work")
        remote = self.engine(job).prepare(job.remote())
        return self._set_handle(job, remote.handle)

    def _user_snapshot(self, machine: Any, user: str) -> dict[str, Any]:
        """The machine as this user's jobs see it: its own base, with ``users/<user>`` under it."""
        snapshot = snapshot_of(machine)
        engine = self.admin.engine(machine.name)
        if not isinstance(engine, ShellEngine) or "base_dir" not in type(engine).options:
            raise InvalidSettings(
                f"machine: {machine.name} is a {machine.kind} machine; jobs through the organization run on its "
                "ssh and slurm machines for now",
                field="machine",
            )
        snapshot["options"]["base_dir"] = f"{engine.base_dir.rstrip('/') or '/'}/users/{user_folder(user)}"
        return snapshot

    def _set_handle(self, job: OrgJob, handle: Mapping[str, Any]) -> OrgJob:
        with self._lock:
            job = self.get(job.user, job.id)
            job.handle = dict(handle)  # type: ignore[assignment]
            self._save(job)
        return job

    def blob(self, user: str, sha: str) -> Path:
        return self.folder(user) / "blobs" / check_sha(sha)

    def missing(self, user: str, digests: Iterable[str]) -> list[str]:
        """The digests of ``digests`` the user has not uploaded yet."""
        return sorted({check_sha(d, "digests") for d in digests if not self.blob(user, d).is_file()})

    def send(self, user: str, job_id: str, files: Sequence[Mapping[str, Any]]) -> dict[str, int]:
        """Put the uploaded inputs in the job's work tree on the machine (its own cache sends only what it lacks)."""
        job = self.get(user, job_id)
        inputs = []
        for i, entry in enumerate(files):
            try:
                sha = check_sha(entry["sha256"])
                inputs.append(
                    InputFile(str(entry["path"]), self.blob(user, sha), int(entry["size"]), sha, int(entry["mode"]))
                )
            except (KeyError, TypeError, ValueError):
                raise InvalidSettings(f"files[{i}]: expected path, sha256, size and mode", field="files") from None
        lacking = sorted({f.sha256 for f in inputs if not f.source.is_file()})
        if lacking:
            raise Conflict(f"upload these inputs first: {', '.join(lacking)}")
        for f in inputs:
            os.utime(f.source)  # used now: kept another BLOB_MAX_AGE
        stats = self.engine(job).send(job.remote(), inputs)
        self._forget_old_blobs(user)
        return dataclasses.asdict(stats)

    def _forget_old_blobs(self, user: str) -> None:
        old = time.time() - BLOB_MAX_AGE
        for path in (self.folder(user) / "blobs").iterdir():
            try:
                if path.stat().st_mtime < old:
                    path.unlink()
            except FileNotFoundError:
                pass

    def start(self, user: str, job_id: str, launch: Mapping[str, Any]) -> OrgJob:
        job = self.get(user, job_id)
        try:
            spec = LaunchSpec(
                command=launch["command"],
                env=dict(launch.get("env") or {}),
                secret_env=dict(launch.get("secret_env") or {}),  # on the machine's stdin only, never kept here
                resources=Resources.from_json(launch.get("resources"), "resources."),
                timeout=launch.get("timeout"),
            )
        except (KeyError, TypeError):
            raise InvalidSettings(
                "command: expected the launch's command, env and secret_env", field="command"
            ) from None
        spec = self._with_registry_credentials(job, spec)
        gpus = self._gpus(job, spec.resources)
        if job.started is None:
            self.admit(user, job.groups, gpus)  # again: another job may have started meanwhile
        remote = self.engine(job).start(job.remote(), spec)
        with self._lock:
            job = self.get(user, job_id)
            job.handle = dict(remote.handle)  # type: ignore[assignment]
            if job.started is None:
                job.started, job.gpus = time.time(), gpus
                job.nodes = (spec.resources.nodes if spec.resources else None) or 1
            self._save(job)
        return job

    def _registry_credentials(self, job: OrgJob) -> str | None:
        """``user:password`` of the machine's ``registry_secret``, from the service's Secret Manager (None
        where the machine names none). A member's server never sees the machine's option nor its value."""
        name = (job.snapshot.get("options") or {}).get("registry_secret")
        if not name:
            return None
        value = image_registry.stored(self.admin.secrets, str(name))
        if value is None:
            raise InvalidSettings(
                f"registry_secret: the organization's machine {job.machine} pulls images with the secret {name!r}, "
                "which the organization service does not hold as user:password; ask an admin to store it "
                f"(`jupyter remote-compute secrets set {name} --org`)",
                field="registry_secret",
            )
        return value

    def _with_registry_credentials(self, job: OrgJob, launch: LaunchSpec) -> LaunchSpec:
        """A job in an image (its server set the pull's variables) gets the machine's registry credentials on
        the machine's standard input, as a user's own machine gives its own; a member's own registry secret
        (their job's ``registry_secret``, sent with the launch) comes first, as it does there."""
        if PULL_TIMEOUT_VAR not in launch.env or REGISTRY_AUTH_VAR in launch.secret_env:
            return launch
        value = self._registry_credentials(job)
        if value is None:
            return launch
        return dataclasses.replace(launch, secret_env={**launch.secret_env, REGISTRY_AUTH_VAR: value})

    def _gpus(self, job: OrgJob, resources: Resources | None) -> int:
        """GPUs the job holds: what it asks for (per node x nodes), else all its machine's last check saw."""
        if resources is not None and resources.gpus:
            return resources.gpus * (resources.nodes or 1)
        facts = known_facts(self.root.parent, job.machine) or {}
        gpus = facts.get("gpus")
        return gpus if isinstance(gpus, int) and gpus > 0 else 0

    def poll(
        self, user: str, job_ids: Sequence[str], watched: Mapping[str, MetricOffsets] | None = None
    ) -> tuple[dict[str, dict[str, Any]], dict[str, MetricBytes]]:
        """The states of the user's jobs, one round trip per machine (an id that is not theirs is gone),
        and what the ``watched`` ones logged to MLflow since their offsets (``Engine.poll_watched``)."""
        groups: dict[str, list[OrgJob]] = {}
        statuses: dict[str, dict[str, Any]] = {}
        metrics: dict[str, MetricBytes] = {}
        for job_id in job_ids:
            try:
                job = self.get(user, job_id)
            except NotFound:
                statuses[str(job_id)] = status_json(RemoteStatus("gone", detail="the organization has no such job"))
                continue
            groups.setdefault(json.dumps(job.snapshot, sort_keys=True), []).append(job)
        for jobs in groups.values():
            engine, remotes = self.engine(jobs[0]), [j.remote() for j in jobs]
            offsets = {j.id: (watched or {})[j.id] for j in jobs if j.id in (watched or {})}
            found, logged = engine.poll_watched(remotes, offsets) if offsets else (engine.poll(remotes), {})
            for job in jobs:
                if job.id in found:
                    status = self._seen(job, found[job.id])
                    # Its notices ride along, so the user's job shows them (``Job.notices``).
                    found[job.id] = dataclasses.replace(status, notices=tuple(job.notices)) if job.notices else status
            statuses.update({job_id: status_json(status) for job_id, status in found.items()})
            metrics.update(logged)
        return statuses, metrics

    def _seen(self, job: OrgJob, status: RemoteStatus) -> RemoteStatus:
        """A job seen ended is metered; one the service stopped ends failed, saying why."""
        if status.state not in ENDED:
            return status
        if job.active:
            state = {"exited": "succeeded" if status.exit_code == 0 else "failed", "gone": "lost"}.get(
                status.state, status.state
            )
            job = self._meter_end(job, "failed" if job.stopped else state)
        if job.stopped:
            return dataclasses.replace(status, state="failed", detail=job.stopped)
        return status

    def read_log(self, user: str, job_id: str, offset: int, limit: int) -> bytes:
        job = self.get(user, job_id)
        data = self.engine(job).read_log(job.remote(), offset, limit)
        try:
            credentials = self._registry_credentials(job)
        except InvalidSettings:
            credentials = None  # removed since: nothing of it to hide
        # never in a log, should a tool print it
        return mask(data, image_registry.hidden(credentials)) if credentials else data

    def cancel(self, user: str, job_id: str, grace: float) -> None:
        self._cancel(self.get(user, job_id), grace, "cancelled")

    def _cancel(self, job: OrgJob, grace: float, state: str) -> None:
        """Stop the job on its machine and meter its end: the user's server, having cancelled it, may
        not poll it again."""
        self.engine(job).cancel(job.remote(), grace)
        if job.active:
            self._meter_end(job, state)

    def fetch(self, user: str, job_id: str, outputs: Sequence[str]) -> dict[str, Any]:
        """Fetch the outputs and the job's MLflow store from the machine to here, ready to download once."""
        job = self.get(user, job_id)
        if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
            raise InvalidSettings("outputs: expected a list of paths", field="outputs")
        dest = self.folder(user) / "fetched" / job_id
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(mode=0o700)
        result = self.engine(job).fetch(job.remote(), outputs, dest / "tree")
        fetched = {"outputs": outputs, "digests": result.digests, "missing": result.missing}
        atomic_write(dest / "result.json", json.dumps(fetched).encode(), mode=0o600)
        return {"manifest": f".fetch-{uuid.uuid4().hex}"}

    def write_outputs(self, user: str, job_id: str, manifest: str, out: IO[bytes]) -> None:
        """What ``fetch`` brought, as the tar stream every engine's fetch reads (manifest.sh's layout:
        the list first, the files, the far side's digests last), so the user's server lands and verifies
        it as it does any machine's. Removed here once written whole."""
        self.get(user, job_id)
        dest = self.folder(user) / "fetched" / check_job_id(job_id)
        try:
            fetched = json.loads((dest / "result.json").read_bytes())
        except FileNotFoundError:
            raise NotFound(f"job {job_id}: nothing fetched to download; fetch first") from None
        if not manifest.startswith(".fetch-") or "/" in manifest:
            raise InvalidSettings("manifest: expected the name fetch gave", field="manifest")
        write_manifest_stream(dest / "tree", fetched, manifest, out)
        shutil.rmtree(dest, ignore_errors=True)

    def cleanup(self, user: str, job_id: str) -> None:
        """Remove the job's folder on the machine, then everything of it here."""
        job = self.get(user, job_id)
        if job.active:
            self._meter_end(job, "cancelled")  # removed while running: it ran until now
        engine = self.engine(job)
        if engine.is_prepared(job.remote()):
            engine.cleanup(job.remote())
        shutil.rmtree(self.folder(user) / "fetched" / job_id, ignore_errors=True)
        self._record_path(user, job_id).unlink(missing_ok=True)


__all__ = ["OrgJob", "OrgJobs", "user_folder"]
