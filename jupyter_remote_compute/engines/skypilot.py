"""Your own cloud (or Slurm, or Kubernetes) through SkyPilot: a cluster appears for the first job
and stops itself when idle.

SkyPilot (``pip install "jupyter-remote-compute[skypilot]"``, the ``skypilot`` package, not the
unrelated ``sky``) provisions; this engine never does. Every SDK call returns a request id that
its API server (a local one starts by itself) works on; the engine only submits requests and
asks how they are doing (``api_status``), so no server thread waits on a launch.

- ``prepare``: the cluster (``cluster``, default ``jrc-<machine name>``) is looked up. If it is
  UP, the job's folder is made on its head node. Otherwise a ``launch`` (which also restarts a
  STOPPED cluster) is submitted, or one already under way for this cluster is adopted, and the
  job waits ``pending`` (``NotReady``) with the request id in its handle: a restart of this side
  follows the same request. ``poll`` reports SkyPilot's own progress as the job's reason, and
  ``queued`` once the cluster is UP; the job is then sent and started.
- Files, poll, log, cancel and fetch are the ssh engine's, against the head node SkyPilot
  reports (its address, port, user and key; for Slurm the login node, whose home the allocation
  shares): the content-addressed cache, verified outputs and the MLflow replay work as for ssh.
- A job whose process vanished (or ended by a signal), or whose head does not answer, is asked of
  SkyPilot too (its status, refreshed from the cloud or Slurm): a cluster that is no longer UP ends
  the job ``gone`` naming the cluster and its state, cause ``lost``, or ``preempted`` for a spot
  cluster, so a retry policy runs it again and the next attempt launches the cluster again.
- ``start`` writes the command and environment over ssh (secrets in a 0600 file that is read and
  removed as the job starts, as for Slurm), then submits a SkyPilot job (``exec``) that starts the
  far-side launcher and lasts as long as the command. So the job runs where SkyPilot places work
  (inside a Slurm allocation, on the head VM), and autostop sees a busy cluster until it ends.
- ``autostop`` and ``down`` go with the launch. On Slurm, where SkyPilot stops only Pyxis
  container clusters, an idle cluster is torn down instead (its allocation released).
- ``check``: ``sky check`` for the infra, the cluster's state (UP, STOPPED, INIT, absent), its
  resources, autostop and hourly price when SkyPilot knows it; with nothing enabled, an error
  that names ``sky check``.
- ``usage()``: the cluster's hours and SkyPilot's cost estimate (``cost_report``), for the usage
  report.

The SDK is imported only when a machine of this kind is used, so the kind is listed (and says
what to install) where SkyPilot is not.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import farside
from .base import (
    Engine,
    EngineContext,
    EngineError,
    Features,
    FetchResult,
    InputFile,
    LaunchSpec,
    MetricBytes,
    MetricOffsets,
    NotReady,
    OptionField,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
    SendStats,
)
from .launcher import command_script, launch_input
from .resources import Resources
from .skypilot_cluster import cluster_gone, cluster_state, default_known_hosts, head_route, hourly_price, on_spot
from .skypilot_failures import error_line, error_text, no_infra_message, request_failure, said_plainly
from .skypilot_launch import (
    DEFAULT_AUTOSTOP,
    INSTALL_HINT,
    SkyPilotSettings,
    cloud_key,
    launch_task,
    load_sdk,
    sky_installed,
    sky_module,
    sky_resources,
)
from .ssh import SSHEngine
from .transport import quote

log = logging.getLogger(__name__)

#: How long SkyPilot's cluster record (and the head's route) is trusted before asking again.
RECORD_TTL = 10.0
#: How often, at most, SkyPilot refreshes the cluster's status from the cloud (or Slurm) for a job whose
#: head answered badly: each refresh costs seconds of CPU, and a head that stays unreachable while its
#: cluster is UP would otherwise have one every poll. Between, the record as SkyPilot last knew it.
REFRESH_TTL = 30.0
#: How long SkyPilot's word on a job not started yet is kept: each asking runs Python on the head node
#: (through the API server's executor), while the head's own poll, every poll, sees the start at once.
JOB_STATE_TTL = 10.0
#: How long after its exec request is done a job not started yet is simply pending, SkyPilot not asked:
#: its job normally starts the launcher within seconds, and each asking (``job_status``) costs a status
#: check of the cluster and Python on the head node, seconds of CPU there. A job SkyPilot ended before
#: the command started is reported this much later, as it is by the asking after it.
START_GRACE = 30.0
#: How long one quick SDK request (status, api_status, check) may take before we give up on it.
QUICK_TIMEOUT = 120.0
#: The file start writes the job's environment to, read and removed by the SkyPilot job (``farside/skypilot-start.sh``).
ENV_FILE = "skypilot.env"
START_SCRIPT = "skypilot-start.sh"
_FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")


class SkyPilotEngine(Engine):
    """A SkyPilot cluster, launched for the first job and stopped by itself when idle."""

    kind = "skypilot"
    label = "SkyPilot (your cloud, Kubernetes or Slurm)"
    # ``unavailable`` where the SDK cannot be imported: the panel lists the kind with it instead of its form.
    features = Features(
        host_keys=True,
        pending=True,
        resources=frozenset({"cpus", "gpus", "memory", "nodes"}),
        unavailable=None if sky_installed() else INSTALL_HINT,
    )
    options = {
        **farside.CACHE_OPTIONS,
        "infra": OptionField(str, "SkyPilot infra: aws, gcp/us-central1, k8s, slurm/<cluster> (default: the address)"),
        "accelerator": OptionField(str, "GPU type, e.g. A100, H100, L4 (a job's resources.gpus says how many)"),
        "use_spot": OptionField(bool, "Use spot/preemptible instances"),
        "cluster": OptionField(str, "SkyPilot cluster to create or reuse (default: jrc-<machine name>)"),
        "autostop": OptionField(int, f"Idle minutes before the cluster stops itself (default {DEFAULT_AUTOSTOP})"),
        "down": OptionField(bool, "Tear the cluster down when idle instead of stopping it"),
        "resources": OptionField(dict, "Default resources of the cluster: {gpus, cpus, memory}"),
        "base_dir": OptionField(str, "Directory for jobs and the input cache on the head node"),
        "known_hosts": OptionField(
            str, "known_hosts file for the head node (default: one per cluster, written at launch)"
        ),
    }

    def __init__(self, name: str, address: str, options: Mapping[str, Any], context: EngineContext) -> None:
        super().__init__(name, address or "-", options, context)
        self.settings = SkyPilotSettings.from_options(name, address, self.machine_options)
        self._lock = threading.Lock()
        self._record: tuple[float, Any] | None = None
        self._refreshed = float("-inf")  # when SkyPilot last refreshed the cluster's status for this engine
        self._head: tuple[tuple[Any, ...], SSHEngine] | None = None
        self._job_states: dict[str, tuple[float, str]] = {}  # exec request -> (when asked, SkyPilot's state)
        self._exec_done: dict[str, tuple[float, Any]] = {}  # exec request -> (first seen done, SkyPilot job id)

    @classmethod
    def validate_address(cls, address: str) -> str:
        # The address is the infra (or anything, when the infra option says it).
        return address.strip() or "-"

    # -- SkyPilot's view ----------------------------------------------------------------

    def _quick(self, request_id: Any) -> Any:
        """The result of a short request (status, check); a slow API server is a transient fault."""
        sdk = load_sdk()
        deadline = time.monotonic() + QUICK_TIMEOUT
        pause = 0.05
        while True:
            [payload] = sdk.api_status([request_id]) or [None]
            if payload is None or payload.status in _FINISHED:
                return sdk.get(request_id)
            if time.monotonic() > deadline:
                raise EngineError(
                    f"{self.name}: SkyPilot's API server did not answer in time; try again", transient=True
                )
            # A status is read in a tenth of a second, a check or a job's state can take ten: each look is
            # a request the API server answers, so the looks thin out (at most one a second).
            time.sleep(pause)
            pause = min(pause * 1.5, 1.0)

    def cluster_record(self, fresh: bool = False, refresh: bool = False) -> Any | None:
        """SkyPilot's record of the cluster (status, handle, credentials), or None when it does not exist.

        ``refresh``: SkyPilot asks the cloud (or Slurm) first, so a cluster that went away behind its back
        (a spot reclaim, an ended allocation) is no longer UP; seconds of CPU, where a plain read is a look
        at its own database."""
        with self._lock:
            cached = self._record
        if cached is not None and not (fresh or refresh) and time.monotonic() - cached[0] < RECORD_TTL:
            return cached[1]
        sdk = load_sdk()
        mode = {"refresh": sky_module().StatusRefreshMode.FORCE} if refresh else {}
        records = self._quick(sdk.status([self.settings.cluster], _include_credentials=True, **mode))
        record = next((r for r in records if r["name"] == self.settings.cluster), None)
        with self._lock:
            self._record = (time.monotonic(), record)
        return record

    def _request(self, request_id: str) -> Any | None:
        sdk = load_sdk()
        found = sdk.api_status([request_id])
        return found[0] if found else None

    def _launch_in_flight(self) -> str | None:
        """The id of a launch or start of this cluster SkyPilot is still working on (another job's)."""
        sdk = load_sdk()
        for payload in sdk.api_status(cluster_name=self.settings.cluster) or []:
            if payload.name in ("launch", "start") and payload.status not in _FINISHED:
                return payload.request_id
        return None

    def launch_arguments(self) -> dict[str, Any]:
        """What ``sky.launch`` gets besides the task: the cluster and when it stops itself."""
        autostop = self.settings.autostop if self.settings.autostop >= 0 else None
        down = self.settings.down
        if self.settings.cloud == "slurm" and autostop is not None:
            # SkyPilot 0.14 stops a Slurm cluster only in a Pyxis container ("Autostop is supported
            # only for container clusters on Slurm clusters with Pyxis installed") but can tear one
            # down when idle. Stopping there would only end the allocation too, so idle means down.
            down = True
        return {"cluster_name": self.settings.cluster, "idle_minutes_to_autostop": autostop, "down": down}

    def _launch(self, resources: Resources | None) -> str:
        sdk = load_sdk()
        in_flight = self._launch_in_flight()
        if in_flight:
            return in_flight
        return str(sdk.launch(launch_task(self.settings, resources), **self.launch_arguments()))

    def launch_cluster(self) -> str | None:
        """Launch (or restart) the cluster now, without a job: the request id, or None when it is up."""
        if cluster_state(self.cluster_record(fresh=True)) == "UP":
            return None
        return self._launch(None)

    def request_state(self, request_id: str) -> tuple[str, str]:
        """(SkyPilot's status of a request, its progress or error in words)."""
        payload = self._request(request_id)
        if payload is None:
            return ("UNKNOWN", f"SkyPilot no longer knows request {request_id}")
        words = self._request_failure(payload) if payload.status in ("FAILED", "CANCELLED") else self._progress(payload)
        return (payload.status, words)

    # -- the head node, reached like an ssh machine --------------------------------------

    def head(self) -> SSHEngine:
        """The ssh engine for the cluster's head node (for Slurm, the login node SkyPilot signs in to)."""
        record = self.cluster_record()
        if (
            record is None
            or str(record["status"].value if hasattr(record["status"], "value") else record["status"]) != "UP"
        ):
            raise EngineError(f"{self.name}: cluster {self.settings.cluster} is not up; submit a job to launch it")
        route = head_route(record)
        with self._lock:
            if self._head is not None and self._head[0] == route:
                return self._head[1]
        host, port, user, key = route
        options: dict[str, Any] = {
            "user": user,
            "port": port,
            "ssh_config": "/dev/null",
            "known_hosts": self._known_hosts(),
            "base_dir": self.machine_options.get("base_dir") or "~/.jupyter-remote-compute",
        }
        if key:
            options["identity_file"] = key
        for name in farside.CACHE_OPTIONS:
            if name in self.machine_options:
                options[name] = self.machine_options[name]
        engine = SSHEngine(self.name, host, options, self.context)
        with self._lock:
            old, self._head = self._head, (route, engine)
        if old is not None:
            old[1].close()
        return engine

    def _known_hosts(self) -> str:
        return self.machine_options.get("known_hosts") or str(default_known_hosts(self.settings.cluster))

    def _trust_new_head(self) -> None:
        """Record the head's host key right after the launch we asked for made (or restarted) it.

        SkyPilot itself signs in to its clusters without checking host keys; this side trusts the key
        the head presents just after the launch, and checks it on every connection from then on.
        A machine naming its own ``known_hosts`` is left alone: its keys are the user's to trust.
        """
        if self.machine_options.get("known_hosts"):
            return
        path = Path(self._known_hosts())
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.unlink(missing_ok=True)  # a new cluster (or a new address) has new keys
        self.close()
        self.head().trust_host()

    # -- the job's life -----------------------------------------------------------------

    def check(self) -> dict[str, Any]:
        sdk = load_sdk()
        infra = self.settings.infra
        cloud = self.settings.cloud
        enabled = self._quick(sdk.check((cloud,) if cloud else None, verbose=False))
        clouds = sorted({c for per_workspace in (enabled or {}).values() for c in per_workspace})
        if not clouds or (cloud and not any(cloud_key(c) == cloud for c in clouds)):
            raise EngineError(
                f"{self.name}: "
                + no_infra_message(
                    infra or "every cloud",
                    "no credentials SkyPilot can use; set them up for your cloud, Kubernetes or Slurm",
                )
            )
        record = self.cluster_record(fresh=True)
        extras: dict[str, Any] = {"sky_check": clouds, "cluster": self.settings.cluster, "cluster_state": "absent"}
        if self.settings.cloud == "slurm":
            extras["autostop_note"] = (
                "SkyPilot cannot stop a Slurm cluster (without Pyxis containers): when idle it is torn down"
            )
        facts: dict[str, Any] | None = None
        if record is not None:
            status = record["status"]
            extras["cluster_state"] = getattr(status, "value", str(status))
            extras["cluster_resources"] = record.get("resources_str_full") or record.get("resources_str")
            autostop = record.get("autostop")
            extras["autostop_minutes"] = autostop if isinstance(autostop, int) and autostop >= 0 else None
            extras["autostop_down"] = record.get("to_down")
            price = hourly_price(record)
            if price is not None:
                extras["hourly_price_usd"] = price
            if extras["cluster_state"] == "UP":
                facts = self.head().check()
        if facts is None:
            # Nothing to reach yet: the common facts are what the cluster will be, as far as known.
            facts = {
                "os": "",
                "kernel": "",
                "python": None,
                "cpus": self.settings.defaults.cpus or 0,
                "memory_bytes": None,
                "gpus": [],
                "disk_free_bytes": None,
                "rtt_ms": 0.0,
            }
        return {**{k: v for k, v in extras.items() if k not in facts}, **facts}

    def _request_failure(self, payload: Any) -> str:
        """Why a request (a launch, an exec) failed, said plainly (``request_failure``); for a catalogue or
        credentials failure `sky check` is asked here whether it finds any infra it can use."""
        text = error_text(payload)
        tried = self.settings.infra or "every cloud"
        if payload.status == "CANCELLED" or not said_plainly(text):
            return error_line(payload)
        # A failure that names no cause (SkyPilot's error can be a bare null) is asked of `sky check` too.
        try:
            sdk = load_sdk()
            cloud = self.settings.cloud
            enabled = self._quick(sdk.check((cloud,) if cloud else None, verbose=False))
            clouds = {cloud_key(c) for per_workspace in (enabled or {}).values() for c in per_workspace}
            no_infra = not clouds or bool(cloud and cloud not in clouds)
        except Exception:  # the check failing too says nothing new: keep SkyPilot's own words
            no_infra = None
        return request_failure(payload, tried, no_infra)

    # A job's image runs where its command does (a Slurm allocation, the head VM), through container.sh
    # as on an ssh machine. Not SkyPilot's own `image_id: docker:`, which makes the whole cluster the
    # container: one image per cluster, and on Slurm only with Pyxis. In an allocation podman only, as
    # for the slurm kind: docker's containers are its daemon's, out of Slurm's reach.
    def image_runtimes(self) -> tuple[str, ...]:
        return ("podman",) if self.settings.cloud == "slurm" else ("podman", "docker")

    def image_pins(self) -> str:
        return self.head().image_pins()

    def image_facts(self) -> dict[str, Any] | None:
        # The head's facts once the cluster is up; before, nothing is known and no launch is asked for.
        if cluster_state(self.cluster_record()) != "UP":
            return None
        facts = self.head().check()
        if self.settings.cloud == "slurm":
            # The head is the login node: its runtimes are the nodes', its GPU support says nothing of theirs.
            facts["containers"] = [{k: v for k, v in c.items() if k != "nvidia"} for c in facts.get("containers") or ()]
        return facts

    def admit(self, resources: Resources) -> None:
        # What the cloud can give is SkyPilot's to find out; here only what no SkyPilot machine takes.
        if resources != Resources():
            sky_resources(self.settings, resources)

    def prepare(self, job: RemoteJob) -> RemoteJob:
        handle = dict(job.handle or {})
        request_id = handle.get("launch_request")
        if request_id and not handle.get("cluster_ready"):
            payload = self._request(request_id)
            if payload is not None and payload.status not in _FINISHED:
                raise NotReady(self._progress(payload), handle)
            if payload is not None and payload.status != "SUCCEEDED":
                raise EngineError(
                    f"{self.name}: launching cluster {self.settings.cluster} failed: {self._request_failure(payload)}"
                )
            handle["cluster_ready"] = True
            self._record = None
            self._trust_new_head()
        record = self.cluster_record(fresh=not handle.get("cluster_ready"))
        state = cluster_state(record)
        if state != "UP":
            resources = Resources.from_json(handle.get("resources")) if handle.get("resources") else None
            request_id = self._launch(resources)
            handle.update(launch_request=request_id, cluster=self.settings.cluster, launch_submitted=time.time())
            handle.pop("cluster_ready", None)
            what = "restarting" if state == "STOPPED" else "launching"
            raise NotReady(f"{what} SkyPilot cluster {self.settings.cluster}", handle)
        prepared = self._fresh_folder(self.head(), job)
        return dataclasses.replace(prepared, handle={**handle, **prepared.handle, "cluster": self.settings.cluster})

    def _fresh_folder(self, head: SSHEngine, job: RemoteJob) -> RemoteJob:
        """The job's folder on the head, prepared; one an earlier attempt left there is removed first.

        A job is started only after the folder prepare made is in its handle, so a folder with a ``pid`` for
        a job whose handle names none is an earlier attempt's, whose cluster went away mid-job (nothing could
        remove it then: ``cleanup`` needs the cluster UP). On Slurm the login node's home outlives the
        cluster, on a cloud a stopped VM's disk does: its pid would pass for this attempt's start.
        """
        prepared = head.prepare(job)
        if job.handle.get("dir"):
            return prepared
        if head.transport.run(f"test -f {quote(head.job_dir(prepared) + '/pid')}", timeout=60).code == 0:
            head.cleanup(prepared)
            prepared = head.prepare(job)
        return prepared

    def is_prepared(self, job: RemoteJob) -> bool:
        return bool(job.handle.get("dir"))

    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        return self.head().send(job, files, progress)

    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        head = self.head()
        d = head.job_dir(job)
        if job.handle.get("exec_request"):
            return job  # started already; the SkyPilot job finds the launcher's pid
        # The job runs with the head's login environment, like an ssh job (not SkyPilot's runtime env).
        payload = launch_input(launch.env, launch.secret_env)
        body = f"""cd -- {quote(d)} || exit 97
umask 077
if [ -f pid ]; then echo started; exit 0; fi
printf '%s' {quote(command_script(launch.command))} > command.sh
printf '%s' {quote(farside.script("skypilot-start"))} > {START_SCRIPT}
{farside.command_line("envfile", ENV_FILE, "--login-path")}
echo written
"""
        res = head.transport.run(body, payload, timeout=60, retry=False)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: writing job {job.job_id} on the head node"))
        sky = sky_module()
        task = sky.Task(name=f"jrc-{job.job_id}", run=f"sh {quote(d + '/' + START_SCRIPT)} {quote(d)}")
        request_id = load_sdk().exec(task, cluster_name=self.settings.cluster)
        return dataclasses.replace(job, handle={**job.handle, "exec_request": str(request_id)})

    def poll(self, jobs: Sequence[RemoteJob]) -> dict[str, RemoteStatus]:
        return self.poll_watched(jobs, {})[0]

    def poll_watched(
        self, jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]
    ) -> tuple[dict[str, RemoteStatus], dict[str, MetricBytes]]:
        # Jobs on the head are polled as ssh polls them, live metrics in the same round trip.
        statuses: dict[str, RemoteStatus] = {}
        metrics: dict[str, MetricBytes] = {}
        on_head = []
        for job in jobs:
            if job.handle.get("dir"):
                on_head.append(job)
                continue
            request_id = job.handle.get("launch_request")
            payload = self._request(request_id) if request_id else None
            if payload is not None and payload.status not in _FINISHED:
                statuses[job.job_id] = RemoteStatus("pending", detail=self._progress(payload))
            elif payload is not None and payload.status != "SUCCEEDED":
                why = self._request_failure(payload)
                statuses[job.job_id] = RemoteStatus(
                    "failed", detail=f"launching SkyPilot cluster {self.settings.cluster} failed: {why}"
                )
            else:
                statuses[job.job_id] = RemoteStatus("queued", detail=f"cluster {self.settings.cluster} is up")
        if on_head:
            head_ids = {job.job_id for job in on_head}
            try:
                far, metrics = self.head().poll_watched(on_head, {k: v for k, v in watched.items() if k in head_ids})
            except EngineError:
                # The head did not answer (or SkyPilot no longer lists it as UP): gone with its cluster, if
                # SkyPilot says the cluster went away; otherwise a head not answering, as for ssh.
                went = self._cluster_went_away(final=False)
                if went is None:
                    raise
                far, metrics = {job.job_id: went for job in on_head}, {}
            else:
                # Only a bad answer is asked of SkyPilot: a healthy job's poll costs no SkyPilot call.
                went = self._cluster_went_away(final=True) if any(_ended_badly(s) for s in far.values()) else None
                if went is not None:
                    far = {
                        job_id: dataclasses.replace(went, log_size=status.log_size) if _ended_badly(status) else status
                        for job_id, status in far.items()
                    }
            for job in on_head:
                status = far[job.job_id]
                if status.state == "gone" and status.detail == "never started":
                    status = self._starting(job, status)
                statuses[job.job_id] = status
        return statuses, metrics

    def _cluster_went_away(self, final: bool) -> RemoteStatus | None:
        """A job's end when SkyPilot, asked afresh, says the cluster is not UP; None while it is UP (the head's
        own answer stands) or when SkyPilot cannot be asked (a job whose process vanished is lost anyway).

        ``final``: the head's answer ends the job (its process vanished), so SkyPilot refreshes the cluster's
        status now, once for the job. Otherwise the head did not answer, which may last many polls: at most
        every REFRESH_TTL, SkyPilot's record as last read between."""
        with self._lock:
            known = self._record[1] if self._record is not None else None
            refresh = final or time.monotonic() - self._refreshed >= REFRESH_TTL
            if refresh:
                self._refreshed = time.monotonic()
        try:
            record = self.cluster_record(refresh=refresh)
        except Exception as e:  # the API server down, a refresh that failed: says nothing of the cluster
            log.warning("%s: could not ask SkyPilot about cluster %s: %s", self.name, self.settings.cluster, e)
            return None
        # A torn-down cluster has no record: whether it ran on spot is in the last one this engine read.
        gone = cluster_gone(self.settings.cluster, record, on_spot(record or known, self.settings.use_spot))
        if gone is None:
            return None
        cause, words = gone
        return RemoteStatus("gone", detail=words, cause=cause)

    def _starting(self, job: RemoteJob, status: RemoteStatus) -> RemoteStatus:
        """A job whose SkyPilot job has not run the launcher yet: pending while SkyPilot works on it."""
        request_id = job.handle.get("exec_request")
        payload = self._request(request_id) if request_id else None
        if payload is not None and payload.status not in _FINISHED:
            return RemoteStatus("pending", detail=self._progress(payload, "SkyPilot is starting the job"))
        if payload is not None and payload.status != "SUCCEEDED":
            return RemoteStatus("failed", detail=f"SkyPilot could not start the job: {self._request_failure(payload)}")
        if payload is None:
            return status
        # The exec request only queued a SkyPilot job: ask that job how it is doing, once it had time to start.
        sky_job_id, since = self._queued_job(request_id)
        if time.monotonic() - since < START_GRACE:
            return RemoteStatus("pending", detail=f"SkyPilot job {sky_job_id} is starting")
        sky_job_id, words = self._job_state(request_id)
        if words in ("INIT", "PENDING", "SETTING_UP", "RUNNING"):
            return RemoteStatus("pending", detail=f"SkyPilot job {sky_job_id} is {words.lower().replace('_', ' ')}")
        # A short command may have started and ended between the look at the folder and this one.
        again = self.head().poll([job])[job.job_id]
        if not (again.state == "gone" and again.detail == "never started"):
            return again
        return RemoteStatus(
            "failed",
            detail=f"SkyPilot job {sky_job_id} ended ({words}) before the command started: see `sky logs "
            f"{self.settings.cluster} {sky_job_id}`",
        )

    def _queued_job(self, request_id: str) -> tuple[Any, float]:
        """(SkyPilot's job id, when this side first saw it queued) for a finished exec request; asked once."""
        with self._lock:
            known = self._exec_done.get(request_id)
        if known is not None:
            return known[1], known[0]
        sky_job_id = load_sdk().get(request_id)[0]
        with self._lock:
            since, _ = self._exec_done.setdefault(request_id, (time.monotonic(), sky_job_id))
            # Kept while the job could still be waiting for its start; an hour covers any queue ahead of it.
            now = time.monotonic()
            self._exec_done = {k: v for k, v in self._exec_done.items() if now - v[0] < 3600}
        return sky_job_id, since

    def _job_state(self, request_id: str) -> tuple[Any, str]:
        """(SkyPilot's job id, its state) for the job an exec request queued, asked at most every JOB_STATE_TTL."""
        sdk = load_sdk()
        sky_job_id, _ = self._queued_job(request_id)
        with self._lock:
            cached = self._job_states.get(request_id)
        if cached is not None and time.monotonic() - cached[0] < JOB_STATE_TTL:
            return sky_job_id, cached[1]
        states = self._quick(sdk.job_status(self.settings.cluster, [sky_job_id])) or {}
        sky_state = states.get(sky_job_id) or states.get(str(sky_job_id))
        words = str(getattr(sky_state, "value", sky_state) or "unknown")
        now = time.monotonic()
        with self._lock:
            self._job_states = {k: v for k, v in self._job_states.items() if now - v[0] < JOB_STATE_TTL}
            self._job_states[request_id] = (now, words)
        return sky_job_id, words

    def _progress(self, payload: Any, default: str | None = None) -> str:
        """SkyPilot's own words on a request: its status message, else the cluster's latest launch progress."""
        msg = (payload.status_msg or "").strip()
        if not msg and default is None:
            try:
                record = self.cluster_record()
            except EngineError:
                record = None
            if record is not None:
                msg = str(record.get("init_status_reason") or record.get("last_event") or "").strip()
        what = default or f"SkyPilot cluster {self.settings.cluster}: {payload.name} {payload.status.lower()}"
        return f"{what}: {' '.join(msg.split())[:300]}" if msg else what

    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        if not job.handle.get("dir"):
            return b""
        return self.head().read_log(job, offset, limit)

    def cancel(self, job: RemoteJob, grace: float) -> None:
        if not job.handle.get("dir"):
            return  # still waiting for the cluster: nothing of the job is there (the launch serves the machine)
        self.head().cancel(job, grace)

    def fetch(
        self, job: RemoteJob, outputs: Sequence[str], dest: Path, progress: ProgressCallback | None = None
    ) -> FetchResult:
        return self.head().fetch(job, outputs, dest, progress)

    def cleanup(self, job: RemoteJob) -> None:
        if not job.handle.get("dir") or cluster_state(self.cluster_record()) != "UP":
            return  # a stopped or removed cluster: its folders went (or wait) with it
        self.head().cleanup(job)

    def trust_host(self, expected_fingerprint: str | None = None) -> str:
        return self.head().trust_host(expected_fingerprint)

    def close(self) -> None:
        with self._lock:
            head, self._head = self._head, None
        if head is not None:
            head[1].close()


def _ended_badly(status: RemoteStatus) -> bool:
    """The head's answer that may mean the cluster went away: the job's process (or its folder) vanished, or
    it ended by a signal (128 + N: a stopping VM or an ending Slurm allocation terminates every process, and
    run.sh may outlive its command long enough to write the code)."""
    if status.state == "gone":
        return status.detail not in ("never started", "cancelled")
    return status.state == "exited" and (status.exit_code or 0) > 128


__all__ = ["INSTALL_HINT", "SkyPilotEngine", "SkyPilotSettings", "launch_task", "load_sdk", "sky_resources"]
