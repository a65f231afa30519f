"""The one small interface every kind of machine implements.

An engine moves files and starts, watches and stops one job's process on its
machine. It knows nothing about the job store, MLflow or the other engines:
the lifecycle (``jobs/service.py``) drives it, always from a worker thread,
never from the server's event loop, so every method here may block.

The far side of every push engine is laid out the same way (``JobDir``), so a
job can be found again after this side restarts:

    <job base>/<job id>/
        job.json      marker: job id and key, written before anything starts
        work/         the command's working directory: inputs in, outputs out
        mlruns/       the job-local MLflow file store (MLFLOW_TRACKING_URI); MLflow
                      creates it: an engine must not create it empty, or MLflow
                      finds no default experiment there
        log           stdout and stderr, unbuffered
        pid           the process group id of the command
        exit_code     written atomically (temp + rename) when the command ends

A pull agent or a batch scheduler implements the same methods with another
meaning underneath (``start`` queues, ``poll`` reads what the far side
reported); the lifecycle does not change.
"""

from __future__ import annotations

import abc
import dataclasses
import errno
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypedDict

from ..errors import InvalidSettings

if TYPE_CHECKING:
    from .resources import Resources

#: Where the command writes its MLflow records, relative to the job directory.
TRACKING_DIR = "mlruns"
#: The command's working directory, relative to the job directory.
WORK_DIR = "work"
#: Made in the job directory when its scheduler warned it will be stopped soon (Slurm's time limit near,
#: ``sbatch --signal``: slurm_commands' ``WARNING_FILE``); status.sh reads it by this name and says ``warned``.
WARNED_FILE = "time_limit_warning"

#: ``pending``: accepted by the machine and waiting for someone else (a scheduler, an agent, a cloud
#: provisioning), with that party's reason in ``RemoteStatus.detail``. ``failed`` and ``cancelled``:
#: the machine ended the job itself (a scheduler's time or memory limit, a cancel made there), with
#: the reason in ``detail``.
RemoteState = Literal["pending", "running", "exited", "failed", "cancelled", "gone", "queued"]
ProgressCallback = Callable[[int, int], None]
"""Called with (bytes done, bytes total) while files move."""


class EngineError(Exception):
    """A machine could not do what was asked; the message is shown to the user.

    ``transient`` marks failures (a dropped connection, a timeout, a busy
    server) after which the same call may succeed later: the lifecycle retries
    those. Everything else (a folder that cannot be made, a missing ``tar``, a
    path the far side refuses) is permanent and ends the job with its message.
    The only exception type an engine method lets out.
    """

    def __init__(self, message: str, *, transient: bool = False, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        #: Facts a face can act on (e.g. an unknown host key to offer "Trust this host"); never secrets.
        self.details = dict(details or {})


class NotReady(EngineError):
    """The machine accepted the job but cannot take its files yet (a cluster being provisioned).

    Raised by ``prepare``: the lifecycle keeps ``handle`` (what the engine needs to follow the
    provisioning, e.g. a request id, so a restart of this side resumes it) and holds the job
    ``pending`` with ``reason``. While it waits, ``poll`` says ``pending`` with the progress, and
    ``queued`` once the machine is ready: the lifecycle then sends and starts the job as usual.
    Transient, so a lifecycle that does not know it simply tries again.
    """

    def __init__(self, reason: str, handle: Mapping[str, Any]) -> None:
        super().__init__(reason, transient=True)
        self.reason = reason
        self.handle = dict(handle)


@dataclasses.dataclass(frozen=True)
class InputFile:
    """One file to send: where it sits here, where it goes, and its digest."""

    relpath: str  # POSIX path inside the job's work tree
    source: Path  # absolute path on this machine
    size: int
    sha256: str
    mode: int = 0o644


@dataclasses.dataclass
class SendStats:
    files_sent: int = 0
    bytes_sent: int = 0
    files_reused: int = 0  # already present on the far side, not sent again


class Handle(TypedDict, total=False):
    """An engine's JSON-able record of where its job is, kept in the state file across restarts.

    Every key any kind writes is here, with the kind that writes it. The lifecycle reads only
    ``dir`` (through ``Engine.is_prepared``); the rest is the kind's own, handed back unchanged.
    """

    dir: str  #: the job's folder on the machine, once prepared (every kind)
    pid: int  #: the detached launcher's process group (local, ssh, jupyter, skypilot's head)
    abs_dir: str  #: jupyter: the folder as the kernel sees it (``dir`` is relative to the server's root)
    transport: str  #: jupyter: "contents" or "kernel", how the job's bytes move
    slurm_job_id: str  #: slurm: the batch job's id
    queued: bool  #: agent: on the machine's queue, not claimed yet
    launch_request: str  #: skypilot: the SDK request launching the cluster
    launch_submitted: float  #: skypilot: when that request was made
    cluster: str  #: skypilot: the cluster the job runs on
    cluster_ready: bool  #: skypilot: the launch finished
    exec_request: str  #: skypilot: the SDK request of the job's exec
    resources: dict[str, Any]  #: skypilot: what the launch asked for
    nodes: list[dict[str, Any]]  #: ssh host list: each host's own handle (its folder, its launcher's pid)
    rendezvous: str  #: ssh host list: a torchrun job's rendezvous, host:port


@dataclasses.dataclass(frozen=True)
class RemoteJob:
    """What an engine needs to find a job again, across restarts of this side.

    ``handle`` is the engine's own record (``Handle``: a job directory, a pid, a batch id); the
    lifecycle stores it and hands it back unchanged.
    """

    job_id: str
    key: str
    handle: Handle


@dataclasses.dataclass(frozen=True)
class RemoteStatus:
    state: RemoteState
    exit_code: int | None = None
    log_size: int | None = None
    detail: str = ""
    # When the far side's scheduler says the job was queued, started and ended (epoch seconds);
    # None where it does not say.
    queued_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    # Why a job that ended without its command's exit did, where the machine says (a retry policy's
    # cause: ``preempted``, ``lost``); None: the lifecycle's own reading of the state.
    cause: str | None = None
    # What an organization's service said of the job so far (its quota notices, ``QuotaNotices``), kept on
    # the user's job; none from the other kinds.
    notices: tuple[str, ...] = ()
    # The machine warned the job it will be stopped soon (WARNED_FILE): its checkpoints are looked at
    # every poll from then on, so the last complete set is as recent as it can be (jobs/checkpoints.py).
    warned: bool = False


#: New bytes of one job's MLflow metric files: path under ``mlruns/`` -> (the offset they start at, the bytes).
MetricBytes = dict[str, tuple[int, bytes]]
#: What of a watched job's metric files was read already: path under ``mlruns/`` -> bytes read.
MetricOffsets = Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """How to run the command. Secret values travel here and nowhere else."""

    command: str | Sequence[str]
    env: Mapping[str, str]
    secret_env: Mapping[str, str]
    #: What the job asked for and how long it may run: a scheduler passes both on (sbatch --time).
    resources: Resources | None = None
    timeout: float | None = None


@dataclasses.dataclass
class FetchResult:
    """Declared outputs as the far side saw them.

    ``digests`` maps each fetched output file, as a POSIX path relative to the
    work tree (``model.pkl``, ``out/sub/b``; the file itself lands at
    ``dest/work/<path>``), to the sha256 the far side computed before sending;
    the lifecycle checks what landed here against it. ``mlruns/`` is not listed.

    ``received`` maps the files this side wrote to the sha256 of the bytes written, hashed as they
    landed (``farside.receive_outputs`` fills it), so the lifecycle need not read them again; a
    file not in it is hashed from disk.
    """

    digests: dict[str, str] = dataclasses.field(default_factory=dict)
    missing: list[str] = dataclasses.field(default_factory=list)
    received: dict[str, str] = dataclasses.field(default_factory=dict)


class Gpu(TypedDict):
    name: str
    memory_bytes: int | None


@dataclasses.dataclass
class Facts:
    """What ``check`` reports, the same shape for every kind (``to_json`` is what faces see).

    ``extras`` holds what only one kind knows (a server's version, its transfer route); they never
    replace a common fact.
    """

    os: str  # the distribution's name where known, else the system's (Linux, Darwin)
    kernel: str  # the OS kernel and its release ("Linux 6.8.0"), never a Jupyter kernel's name
    python: str | None  # the version `python3` answers with there
    cpus: int
    memory_bytes: int | None
    gpus: list[Gpu]  # from nvidia-smi where it is installed, else none
    disk_free_bytes: int | None  # where jobs are kept
    rtt_ms: float  # one round trip to the machine
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        common = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extras"}
        return {**{k: v for k, v in self.extras.items() if k not in common}, **common}


@dataclasses.dataclass(frozen=True)
class OptionField:
    """A kind-specific machine option, validated when a machine is saved."""

    type: type
    description: str
    required: bool = False
    secret_name: bool = False  # the value names a Secret Manager entry


#: The resources a job may ask for (``Resources``' fields, by their names in a job's settings).
RESOURCE_NAMES = ("cpus", "gpus", "memory", "nodes", "partition")


@dataclasses.dataclass(frozen=True)
class Features:
    """What a kind of machine can do, declared once on its engine class.

    Admission, the handlers, the CLI and the panel (``GET /remote-compute/kinds``) read these, so no
    part of the product finds out what a kind does by probing its methods or its handle.
    """

    #: False for the built-in machine: its files never leave this computer (the egress policy).
    remote: bool = True
    #: Reached over SSH: it presents host keys, and ``trust_host`` records one.
    host_keys: bool = False
    #: Its jobs may wait for someone else (a scheduler, an agent, a cluster being made): ``pending``.
    pending: bool = False
    #: What a job may ask of it (``RESOURCE_NAMES``); ``admit`` refuses the rest by name.
    resources: frozenset[str] = frozenset({"cpus", "gpus", "memory"})
    #: Its poll brings what a watched job logged to MLflow since the last look (live metrics).
    live_metrics: bool = True
    #: Its jobs' checkpoint folders come home while they run (``list_checkpoints``, ``fetch_checkpoints``).
    checkpoints: bool = False
    #: How it starts a job of several processes (``Resources.launcher``: torchrun, plain), across its
    #: nodes where it declares ``nodes``; none: each job is one process (``refuse_distributed``).
    launchers: tuple[str, ...] = ()
    #: Why the kind cannot be used on this installation (what to install), or None when it can.
    unavailable: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["resources"] = [name for name in RESOURCE_NAMES if name in self.resources]
        data["launchers"] = list(self.launchers)
        if self.unavailable is None:
            del data["unavailable"]
        return data


def refuse_distributed(resources: Resources, features: Features, name: str, kind: str) -> None:
    """Refuse, at submit, a job of several nodes or processes, or a launcher, on a machine whose kind
    (``features``) cannot start it: InvalidSettings naming the field, the machine and its kind."""
    nodes, per_node = resources.nodes or 1, resources.processes_per_node or 1
    if nodes > 1 and not ("nodes" in features.resources and features.launchers):
        raise InvalidSettings(
            f"resources.nodes: {name} is a {kind} machine, which runs a job on one node, not {nodes}; "
            "leave nodes out, or use a Slurm machine or an ssh machine with hosts",
            field="resources.nodes",
        )
    if per_node > 1 and not features.launchers:
        raise InvalidSettings(
            f"resources.processes_per_node: {name} is a {kind} machine, which starts the command as one "
            f"process, not {per_node}; leave processes_per_node out (the command may start its own), or use a "
            "Slurm machine or an ssh machine with hosts",
            field="resources.processes_per_node",
        )
    if resources.launcher is not None and resources.launcher not in features.launchers:
        can = f"it starts with {' or '.join(features.launchers)}" if features.launchers else "it has no launcher"
        raise InvalidSettings(
            f"resources.launcher: {name} is a {kind} machine, which cannot start {resources.launcher} ({can}); "
            "leave launcher out, or use a Slurm machine or an ssh machine with hosts",
            field="resources.launcher",
        )


# errno values that describe a moment, not a state: the same call may well work later.
_PASSING_ERRNOS = frozenset(
    {
        errno.EAGAIN,
        errno.EBUSY,
        errno.EINTR,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        # A full disk or quota passes once someone makes room; meanwhile the job waits and says why.
        errno.ENOSPC,
        errno.EDQUOT,
    }
)

#: What the lifecycle calls on an engine; each is wrapped so only EngineError leaves it.
_GUARDED = (
    "__init__",
    "check",
    "prepare",
    "send",
    "start",
    "poll",
    "poll_watched",
    "read_log",
    "cancel",
    "fetch",
    "list_checkpoints",
    "fetch_checkpoints",
    "cleanup",
    "trust_host",
)


def is_passing(error: BaseException) -> bool:
    """Whether an error that is not an EngineError says "try again later" (a timeout, a reset connection)."""
    if isinstance(error, TimeoutError | ConnectionError):
        return True
    return isinstance(error, OSError) and error.errno in _PASSING_ERRNOS


def _guard(method: Callable[..., Any], what: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def guarded(self: Engine, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except EngineError:
            raise
        except Exception as e:
            # A stray error (a bug, a refused path): say where it came from and whether to retry.
            name = getattr(self, "name", "?")
            raise EngineError(
                f"{name}: {what} failed: {str(e) or type(e).__name__}", transient=type(self).is_transient(e)
            ) from e

    guarded.__jrc_guarded__ = True  # type: ignore[attr-defined]
    return guarded


class Engine(abc.ABC):
    """One machine of one kind. Subclasses set ``kind`` and implement the rest.

    Every lifecycle method of a subclass is wrapped so that any other exception
    leaves it as an ``EngineError`` whose ``transient`` is ``is_transient(e)``.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _GUARDED:
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "__jrc_guarded__", False):
                setattr(cls, name, _guard(method, "setting up" if name == "__init__" else name.replace("_", " ")))

    @classmethod
    def is_transient(cls, error: Exception) -> bool:
        """Whether a stray (non-EngineError) error may pass; kinds add their own transport's errors."""
        return is_passing(error)

    kind: ClassVar[str]
    label: ClassVar[str]
    options: ClassVar[Mapping[str, OptionField]] = {}
    #: What the kind can do; an engine's own are its machine's (``features_for`` its options).
    features: Features = Features()
    #: The machine gives each job GPUs of its own choosing (CUDA_VISIBLE_DEVICES) without the job
    #: asking for any: the agent's --gpus-per-job. A job's container gets those (environments/image.py).
    gpus_chosen_per_job: ClassVar[bool] = False

    @property
    def machine_kind(self) -> str:
        """The kind of the machine the jobs run on, as refusals name it: this engine's, but for one that
        reaches a machine of another kind (the organization's, through its service)."""
        return self.kind

    def __init__(self, name: str, address: str, options: Mapping[str, Any], context: EngineContext) -> None:
        self.name = name
        self.address = address
        self.machine_options = dict(options)
        self.context = context
        self.features = self.features_for(options)

    @classmethod
    def features_for(cls, options: Mapping[str, Any]) -> Features:
        """What a machine of this kind with these options can do: ``features``, unless an option changes it
        (an ssh machine's ``hosts`` make it run jobs of several nodes)."""
        return cls.features

    @classmethod  # noqa: B027 - optional: most kinds' settings are each checked on their own
    def check_settings(cls, address: str, options: Mapping[str, Any]) -> None:
        """Refuse, when a machine is saved, settings that do not go together (InvalidSettings naming the field)."""

    @classmethod
    def validate_address(cls, address: str) -> str:
        """Return the normalised address or raise ValueError saying what is wrong."""
        if not address or address != address.strip() or any(c in address for c in "\r\n\t\0"):
            raise ValueError("address must be a non-empty host or URL without spaces or line breaks")
        return address

    # -- the job's life, in the order the lifecycle calls it ----------------
    @abc.abstractmethod
    def check(self) -> dict[str, Any]:
        """Reach the machine and report its ``Facts`` (``Facts.to_json()``: the same keys for every kind)."""

    @abc.abstractmethod
    def prepare(self, job: RemoteJob) -> RemoteJob:
        """Create the job's place on the far side (idempotent); return the job with its handle."""

    @abc.abstractmethod
    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        """Put every input in the job's work tree, sending only what the far side lacks."""

    @abc.abstractmethod
    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        """Start the command detached so it outlives this process; return the updated handle."""

    @abc.abstractmethod
    def poll(self, jobs: Sequence[RemoteJob]) -> dict[str, RemoteStatus]:
        """The state of many jobs of this machine in one round trip, by job id."""

    def poll_watched(
        self, jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]
    ) -> tuple[dict[str, RemoteStatus], dict[str, MetricBytes]]:
        """``poll``, plus what the jobs in ``watched`` (by id) logged to MLflow since the offsets given.

        Someone watches those jobs' live metrics: kinds with a far-side store read the new bytes of
        each metric file in the same round trip as the poll. Kinds without one report no metrics.
        """
        return self.poll(jobs), {}

    @abc.abstractmethod
    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        """At most ``limit`` bytes of the log from byte ``offset``."""

    @abc.abstractmethod
    def cancel(self, job: RemoteJob, grace: float) -> None:
        """TERM the job's process group, KILL after ``grace`` seconds, verify none remains."""

    @abc.abstractmethod
    def fetch(
        self,
        job: RemoteJob,
        outputs: Sequence[str],
        dest: Path,
        progress: ProgressCallback | None = None,
    ) -> FetchResult:
        """Copy declared outputs (files or directories under ``work/``) and ``mlruns/`` into ``dest``.

        ``dest`` receives ``work/<output>`` and ``mlruns/...``; it is a private
        temporary directory, so nothing partial reaches the workspace.
        """

    def list_checkpoints(self, job: RemoteJob, folder: str) -> dict[str, tuple[int, int]]:
        """The files of the job's checkpoint folder (``work/<folder>``) now: path under the folder ->
        (size, mtime in ns); names a writer uses for files not yet whole are left out (farside/checkpoints.sh)."""
        raise EngineError(f"{self.name} is a {self.kind} machine, whose checkpoints do not come home yet")

    def fetch_checkpoints(self, job: RemoteJob, paths: Sequence[str], dest: Path) -> FetchResult:
        """``fetch`` of these files (paths under ``work/``) alone, without ``mlruns/``: one checkpoint look."""
        raise EngineError(f"{self.name} is a {self.kind} machine, whose checkpoints do not come home yet")

    def image_runtimes(self) -> tuple[str, ...]:
        """The container runtimes a job's image may run in here (``environments/image.py``); none: no images."""
        return ()

    def image_pins(self) -> str:
        """The far-side folder of image pins (``farside/container.sh``'s PINS), as a sh word."""
        raise EngineError(f"{self.name} is a {self.kind} machine, which does not run container images")

    def image_facts(self) -> dict[str, Any] | None:
        """What submit knows of the runtimes here (``check``'s ``containers``); None: nothing can be
        known yet, and container.sh names what is missing when the job starts."""
        return self.check()

    def admit(self, resources: Resources) -> None:
        """Refuse, at submit, resources this machine cannot give (InvalidSettings naming the field).

        A machine that runs the command itself (local, ssh, jupyter) has one node, no partitions,
        and the CPUs, GPUs and memory its facts report: asking for more is refused rather than run
        on less. Schedulers override this with their own limits.
        """
        if resources.partition and "partition" not in self.features.resources:
            raise InvalidSettings(
                f"resources.partition: {self.name} is a {self.kind} machine and has no partitions; "
                "leave partition empty or use a scheduler's machine",
                field="resources.partition",
            )
        refuse_distributed(resources, self.features, self.name, self.kind)
        if resources.cpus is None and not resources.gpus and resources.memory_mb is None:
            return
        facts = self.check()
        memory = facts.get("memory_bytes")
        offered = (
            ("cpus", resources.cpus, facts.get("cpus"), "CPUs"),
            ("gpus", resources.gpus, len(facts.get("gpus") or []), "GPUs"),
            ("memory", resources.memory_mb, memory // (1 << 20) if memory else None, "MiB of memory"),
        )
        for field, asked, has, what in offered:
            if asked is not None and has is not None and asked > has:
                raise InvalidSettings(
                    f"resources.{field}: {asked} asked, but {self.name} has {has} {what}", field=f"resources.{field}"
                )

    def is_prepared(self, job: RemoteJob) -> bool:
        """Whether ``prepare`` made the job's place on the far side (there is something to read or clean)."""
        return bool(job.handle.get("dir"))

    def trust_host(self, expected_fingerprint: str | None = None) -> str:
        """Record the machine's current host key as known (an explicit user action); return its fingerprint.

        With ``expected_fingerprint`` (the one the user compared), a key with any other fingerprint is
        refused on the same connection that would record it, with ``details.host_key`` naming what was
        presented. Only kinds with ``features.host_keys`` have host keys; the others refuse clearly.
        """
        raise EngineError(f"{self.name} is a {self.kind} machine: it has no host key to trust")

    @abc.abstractmethod
    def cleanup(self, job: RemoteJob) -> None:
        """Remove the job's directory on the far side (best effort, idempotent)."""

    def abandon(self, job: RemoteJob) -> None:  # noqa: B027 - optional: only engines of several hosts need it
        """The job's machine stopped answering and its attempt was given up without asking it anything
        more: stop what of the job can still be reached, best effort, never waiting on what cannot."""

    def close(self) -> None:  # noqa: B027 - optional: only engines holding connections need it
        """Release connections. Engines are cached per machine and closed on shutdown."""


@dataclasses.dataclass(frozen=True)
class EngineContext:
    """What an engine may use from this side: a secret lookup and the built-in machine's job base."""

    get_secret: Callable[[str], str | None]
    scratch_dir: Path  # the built-in machine's job base
    #: The workspace's ``.punica/`` folder: where a kind that keeps state on this side (agent queues) keeps it.
    punica_dir: Path | None = None
