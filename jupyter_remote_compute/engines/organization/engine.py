"""The ``organization`` kind: a machine of the hub's organization, reached through its service.

A job on ``org:NAME`` is the user's job like any other: this server's lifecycle drives it, keeps its
handle across restarts, fetches and verifies its outputs into the workspace and records its MLflow run
in the user's own store. Only the transport differs: each engine call is a route of the organization
service (``org/service.py``), which makes the same call on the real engine of the machine with the
organization's credentials (``org/jobs.py``). So no key or token of the machine ever reaches the user.
The service's answers are this server's hub token's: it names the user, who reaches only their own jobs.

Files move as for a pull agent, by digest: ``send`` asks which inputs the service lacks, uploads those
(streamed, checked there against their sha256), and has the service send them on; ``fetch`` has the
service fetch the outputs from the machine, then reads them as the one tar stream every engine's fetch
reads (the far side's digests last), landed under the one extraction policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import requests

from ...errors import InvalidSettings
from .. import BUILT_IN_KINDS, engine_class, farside
from ..base import (
    Engine,
    EngineContext,
    EngineError,
    Features,
    FetchResult,
    InputFile,
    LaunchSpec,
    MetricBytes,
    MetricOffsets,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
    SendStats,
)
from ..resources import Resources
from .client import ORG_KIND, OrganizationClient, OrganizationUnavailable, organization
from .wire import metrics_from_json, status_from_json

#: Sending, starting, fetching and cancelling wait on the machine, through the service: give them time.
LONG = (10.0, 3600.0)
UPLOAD_CHUNK = 1 << 20


class OrganizationEngine(Engine):
    kind = ORG_KIND
    label = "The organization's machine (through its service on the hub)"
    # What the machine's own kind can do, but no host keys to trust here (the organization's admin does).
    # Set per machine in __init__, from the kind the service reports.
    features = Features(live_metrics=False)

    def __init__(self, name: str, address: str, options: Mapping[str, Any], context: EngineContext) -> None:
        super().__init__(name, address, options, context)
        self.machine = str(options.get("machine") or name.removeprefix("org:"))
        real = options.get("kind")
        #: The container runtimes the machine's own kind runs a job's image in (its launcher's).
        self._image_runtimes: tuple[str, ...] = ()
        if real in BUILT_IN_KINDS:
            own = engine_class(str(real))
            self.features = dataclasses.replace(own.features, remote=True, host_keys=False, unavailable=None)
            launcher = getattr(own, "launcher_class", None)
            self._image_runtimes = tuple(getattr(launcher, "image_runtimes", ()))

    @classmethod
    def validate_address(cls, address: str) -> str:
        return address  # the organization's machine's, as its service lists it: only shown, never dialled

    @property
    def client(self) -> OrganizationClient:
        client = organization()
        if client is None:
            raise EngineError(
                f"{self.name}: no organization service here: a job on one of the organization's machines is "
                "followed from a server its JupyterHub started"
            )
        return client

    def _ask(
        self,
        method: str,
        path: str,
        timeout: float | tuple[float, float] = 10.0,
        *,
        settings: bool = False,
        **kw: Any,
    ) -> requests.Response:
        """The service's answer, or its refusal or the machine's failure as an ``EngineError``; with
        ``settings``, a setting the machine refuses as the ``InvalidSettings`` naming it."""
        try:
            answer = self.client.request(method, path, timeout=timeout, **kw)
        except OrganizationUnavailable as e:
            raise EngineError(f"{self.name}: {e.message}", transient=True) from None
        if answer.ok:
            return answer
        try:
            data = answer.json()
        except ValueError:
            data = {}
        message = str(data.get("message") or answer.reason) if isinstance(data, dict) else answer.reason
        if settings and answer.status_code == 400 and isinstance(data, dict) and data.get("code") == "invalid":
            raise InvalidSettings(message, field=data.get("field"))
        if isinstance(data, dict) and data.get("code") == "engine_error":
            raise EngineError(message, transient=bool(data.get("transient")), details=data.get("details") or {})
        # Refused (a scope, a job that is not the user's) is for good; the service failing may pass.
        raise EngineError(f"{self.name}: the organization service: {message}", transient=answer.status_code >= 500)

    def _job(self, job: RemoteJob, action: str = "") -> str:
        return f"api/jobs/{job.job_id}" + (f"/{action}" if action else "")

    # -- the machine -----------------------------------------------------------------
    @property
    def machine_kind(self) -> str:
        return str(self.machine_options.get("kind") or self.kind)

    def image_runtimes(self) -> tuple[str, ...]:
        return self._image_runtimes

    def image_pins(self) -> str:
        # The service gives each user a base of their own on the machine (``<base>/users/<user>``), which
        # this side does not know; the job's folder is ``jobs/<id>`` under it, and container.sh is
        # started with ``$jobdir`` set: the user's pins are beside their jobs, as on their own machine.
        return '"${jobdir%/jobs/*}/images"'

    def check(self) -> dict[str, Any]:
        return dict(self._ask("POST", f"api/machines/{self.machine}/check", timeout=LONG).json())

    def admit(self, resources: Resources) -> None:
        body = {"resources": resources.to_json()}
        self._ask("POST", f"api/machines/{self.machine}/admit", timeout=LONG, settings=True, json=body)

    # -- the job's life ------------------------------------------------------------------
    def prepare(self, job: RemoteJob) -> RemoteJob:
        answer = self._ask("PUT", self._job(job), timeout=LONG, json={"machine": self.machine, "key": job.key}).json()
        return RemoteJob(job.job_id, job.key, {**job.handle, "dir": str(answer.get("dir") or "")})

    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        digests = sorted({f.sha256 for f in files})
        missing = set(self._ask("POST", "api/inputs/missing", json={"digests": digests}).json()["missing"])
        uploads = {f.sha256: f for f in files if f.sha256 in missing}
        total = sum(f.size for f in uploads.values())
        done = 0

        def chunks(f: InputFile) -> Iterator[bytes]:
            nonlocal done
            with open(f.source, "rb") as source:
                while chunk := source.read(UPLOAD_CHUNK):
                    done += len(chunk)
                    if progress:
                        progress(done, total)
                    yield chunk

        for sha, f in uploads.items():
            self._ask("PUT", f"api/inputs/{sha}", timeout=LONG, data=chunks(f))
        listed = [{"path": f.relpath, "sha256": f.sha256, "size": f.size, "mode": f.mode} for f in files]
        far = self._ask("POST", self._job(job, "send"), timeout=LONG, json={"files": listed}).json()
        return SendStats(files_sent=len(uploads), bytes_sent=total, files_reused=int(far.get("files_reused") or 0))

    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        body = {
            "command": launch.command if isinstance(launch.command, str) else list(launch.command),
            "env": dict(launch.env),
            "secret_env": dict(launch.secret_env),  # to the machine's stdin, through the service; kept nowhere
            "resources": launch.resources.to_json() if launch.resources else None,
            "timeout": launch.timeout,
        }
        self._ask("POST", self._job(job, "start"), timeout=LONG, json=body)
        return job

    def poll(self, jobs: Sequence[RemoteJob]) -> dict[str, RemoteStatus]:
        return self.poll_watched(jobs, {})[0]

    def poll_watched(
        self, jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]
    ) -> tuple[dict[str, RemoteStatus], dict[str, MetricBytes]]:
        if not jobs:
            return {}, {}
        body = {"jobs": [j.job_id for j in jobs], "watched": {k: dict(v) for k, v in watched.items()}}
        answer = self._ask("POST", "api/poll", timeout=LONG, json=body).json()
        statuses = {job_id: status_from_json(status) for job_id, status in answer["statuses"].items()}
        return statuses, metrics_from_json(answer.get("metrics") or {})

    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must not be negative")
        if limit == 0:
            return b""
        return self._ask("GET", self._job(job, "log"), timeout=LONG, params={"offset": offset, "limit": limit}).content

    def cancel(self, job: RemoteJob, grace: float) -> None:
        self._ask("POST", self._job(job, "cancel"), timeout=(10.0, grace + 120.0), json={"grace": grace})

    def fetch(
        self,
        job: RemoteJob,
        outputs: Sequence[str],
        dest: Path,
        progress: ProgressCallback | None = None,
    ) -> FetchResult:
        manifest = self._ask("POST", self._job(job, "fetch"), timeout=LONG, json={"outputs": list(outputs)}).json()
        name = str(manifest["manifest"])
        answer = self._ask("GET", self._job(job, "outputs"), timeout=LONG, params={"manifest": name}, stream=True)
        with answer:
            try:
                return farside.receive_outputs(answer.raw.read, outputs, dest, name, self.name, progress)
            except farside.ArchiveCut as e:
                # The service's stream stopped short of the digests: it, or the way here, failed midway.
                raise EngineError(f"{self.name}: the outputs' download was cut short ({e})", transient=True) from None

    def cleanup(self, job: RemoteJob) -> None:
        self._ask("DELETE", self._job(job), timeout=LONG)
