"""A job as the state file keeps it and the API shows it (``Job``), how it will end (``Outcome``), its
states, its id and its times.

``Job`` stays a plain dataclass read without validation (``Job.from_json``: the state file was
written by this code; 100,000 jobs are read at a server's start); its spec and outcome are read
through their models, and pydantic describes it to ``openapi.yaml``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, ConfigDict, Field, with_config
from typing_extensions import NotRequired, TypedDict

from ..errors import InvalidSettings
from .base import to_json, validate
from .retry import Cause
from .spec import JobSpec

State = Literal["queued", "sending", "pending", "running", "collecting", "succeeded", "failed", "cancelled", "lost"]
STATES: tuple[State, ...] = get_args(State)
ACTIVE_STATES: frozenset[str] = frozenset({"queued", "sending", "pending", "running", "collecting"})
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "lost"})


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def parse_given_time(value: str, field: str) -> datetime:
    """A time a user gave (a filter's ``since``/``until``): ISO 8601, UTC unless it says otherwise."""
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidSettings(
            f"{field}: {value!r} is not an ISO 8601 time such as 2026-01-31 or 2026-01-31T12:00:00Z", field=field
        ) from None
    when = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
    try:
        when.astimezone(timezone.utc)  # 0001-01-01T00:00+23:59 is a valid RFC 3339 time before year 1 in UTC
    except OverflowError:
        raise InvalidSettings(f"{field}: {value!r} is out of range once turned into UTC", field=field) from None
    return when


def new_job_id() -> str:
    # Sortable by creation time, unique without coordination.
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


class IllegalTransition(RuntimeError):
    """This side tried to move a job along an edge its life does not have (a bug, never the user's)."""


_SLOT = "_state"  # where a Job keeps its state, behind ``StateField``


class StateField:
    """``Job.state``: set once when the job is made; after that, only ``jobs.transitions.move`` changes it.

    A data descriptor, so a stray ``job.state = …`` anywhere raises at once instead of writing a
    state the table never allowed; reading costs an attribute lookup, as a plain field would.
    """

    def __get__(self, job: Job | None, owner: type | None = None) -> str:
        if job is None:
            return "queued"  # the dataclass field's default
        return job.__dict__[_SLOT]

    def __set__(self, job: Job, value: str) -> None:
        if _SLOT in job.__dict__:
            raise IllegalTransition(f"job {job.id}: its state changes through transitions.move, not by assignment")
        if value not in STATES:
            raise ValueError(f"job {job.id}: {value!r} is not a job state (one of {', '.join(STATES)})")
        job.__dict__[_SLOT] = value


#: The descriptor behind ``Job.state``.
JOB_STATE = StateField()


def _number_or_none(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@with_config(ConfigDict(extra="ignore", json_schema_serialization_defaults_required=True))
@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a job will end, decided when it stopped running; collection records it and ends the job."""

    state: State  # one of TERMINAL_STATES
    reason: str | None = None
    # False: the machine could not be reached, collect without asking it
    reach_machine: Annotated[bool, BeforeValidator(bool)] = True
    # when the job stopped on its machine, as this side saw it (epoch seconds); absent when unknown,
    # so a record an older version wrote reads back the same
    at: Annotated[float | None, BeforeValidator(_number_or_none), Field(exclude_if=lambda v: v is None)] = None
    # why the attempt ended, where this side could tell (a retry policy names these); absent: not a
    # cause any policy retries (it succeeded, was cancelled or timed out)
    cause: Annotated[Cause | None, Field(exclude_if=lambda v: v is None)] = None

    def to_json(self) -> dict[str, Any]:
        return to_json(Outcome, self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return validate(cls, data, "outcome")


class OutputFile(TypedDict, total=False):
    """An output brought back: its content's digest and size."""

    sha256: str
    size: int


class SchedulerTimes(TypedDict, total=False):
    """What the machine's scheduler said (epoch seconds), only those it reported."""

    queued_at: float
    started_at: float
    ended_at: float


class CheckpointSet(TypedDict):
    """The newest complete set of a job's checkpoints at home (``.punica/checkpoints/<job id>/``)."""

    at: str  # when it landed (ISO 8601, UTC)
    files: int
    bytes: int
    fetched_bytes: int  # every byte brought home for the job's checkpoints so far, all sets together


class JobAttempt(TypedDict):
    """An attempt of a job that ended (``Job.attempts``): those before the one under way, and at the job's
    end its last, for a job that had more than one or whose retry policy allowed it."""

    machine: str
    started: str | None  # when it started running (ISO 8601, UTC); None: it never did
    ended: str
    #: how it ended: a retry policy's cause (lost, preempted, machine_unreachable, failed), ``requeued``
    #: (its scheduler put it back in its queue), or the job's end state for its last attempt
    end: str
    reason: str | None
    #: seconds of its work lost: from its newest checkpoint that came home (else its start) to its end;
    #: absent for an attempt that succeeded or never started
    lost_s: NotRequired[float]


class Progress(TypedDict):
    """How far a send has come (``GET /jobs/{id}`` while sending)."""

    done: int
    total: int


class Shown(TypedDict):
    """What the API shows of a job beside its record (``Job.public_json``, which leaves out ``lease``)."""

    name: str
    progress: NotRequired[Progress]


class StateNotice(TypedDict):
    """The JSON body POSTed to a job's webhooks (``JobSpec.notify``) when its state changed."""

    event: Literal["job.state"]
    job: str  # the job's id
    name: str  # its name, or its command when unnamed
    machine: str  # where the attempt runs, or ran
    state: State
    previous_state: State | None  # None: the job was just submitted
    attempt: int  # 1, 2, …: once a retry sent the job back to the queue, the next attempt's number
    reason: str | None  # why it is where it is: its end's reason, its retry's, what it waits for
    cause: Cause | None  # why the attempt that ended did (lost, preempted, machine_unreachable, failed)
    at: str  # when the state changed (ISO 8601, UTC)


class WebhookDelivery(TypedDict):
    """How the last notice to one of a job's webhooks went (``Job.deliveries``): kept per webhook, replaced by
    the next notice's, once the notice landed or its tries were given up."""

    url: str  # without its query or any credentials; secret:NAME for one kept in the Secret Manager
    source: Literal["job", "machine"]  # the job's own webhook (notify), or its machine's (compute.yaml)
    state: State  # the change it told: the state the job went to
    status: int | None  # the HTTP status the receiver answered last; None: no answer (refused, timed out)
    error: str | None  # why it did not land (HTTP 500, a redirect not followed, connection refused); None: it did
    at: str  # when (ISO 8601, UTC)


#: A job's fields the API does not show: who drives it now is bookkeeping between processes.
HIDDEN = ("lease",)

#: The organization's quota notices about a job on one of its machines, oldest first, one line each
#: ("user NAME's job_hours hard quota: 91 % of 10 h per month used (…)"): kept on the service's record
#: (``org/jobs.py``, its ``GET api/jobs/<id>``) and brought to the user's job by its polls.
QuotaNotices = Annotated[
    list[str],
    Field(description="the organization's quota notices about the job (also `[organization] notice: …` in its log)"),
]


# Written whole but for ``times``, ``user``, ``checkpoint``, ``attempts``, ``pool``, ``placement``,
# ``notices``, ``tracking_uri`` and ``deliveries`` (left out when unset, as before they existed).
@with_config(ConfigDict(json_schema_serialization_defaults_required=True))
@dataclasses.dataclass
class Job:
    id: str
    key: str
    machine: str
    kind: str
    spec: JobSpec  # a mapping given here (as the state file holds it) is parsed once, in __post_init__
    state: State = JOB_STATE  # type: ignore[assignment]  # "queued" at first; then only transitions.move
    reason: str | None = None
    created: str = dataclasses.field(default_factory=utcnow)
    updated: str = dataclasses.field(default_factory=utcnow)
    started: str | None = None
    ended: str | None = None
    # kind, address, options at submit
    machine_snapshot: Annotated[dict[str, Any], Field(description="the machine's kind, address, options at submit")] = (
        dataclasses.field(default_factory=dict)
    )
    # the engine's own record
    handle: Annotated[dict[str, Any], Field(description="the engine's own record (a pid, a Slurm job id)")] = (
        dataclasses.field(default_factory=dict)
    )
    exit_code: int | None = None
    outcome: Annotated[Outcome | None, Field(description="the end state collection will set")] = None
    cancel_requested: Annotated[str | None, Field(description="who asked to cancel")] = None
    outputs: Annotated[dict[str, OutputFile], Field(description="workspace-relative path → its digest and size")] = (
        dataclasses.field(default_factory=dict)
    )
    inputs: Annotated[dict[str, int], Field(description="files, bytes")] = dataclasses.field(default_factory=dict)
    transfer: Annotated[dict[str, int], Field(description="bytes sent, files reused …")] = dataclasses.field(
        default_factory=dict
    )
    mlflow_run_id: str | None = None
    log_size: int = 0
    lease: dict[str, Any] | None = None
    retries: Annotated[int, Field(ge=0)] = 0
    # when reaching the machine started failing (epoch seconds)
    failing_since: Annotated[
        float | None, Field(description="when reaching the machine started failing (epoch seconds)")
    ] = None
    # What the machine's scheduler said (epoch seconds): queued_at, started_at, ended_at, only those it
    # reported (RemoteStatus); usage prefers them to this side's own created/started/ended.
    times: Annotated[
        SchedulerTimes,
        Field(
            description="what the machine's scheduler said (epoch seconds), only those it reported; absent when none"
        ),
        Field(exclude_if=lambda v: not v),
    ] = dataclasses.field(default_factory=dict)  # type: ignore[assignment]
    user: Annotated[str | None, Field(description="who submitted the job", exclude_if=lambda v: v is None)] = None
    checkpoint: Annotated[
        CheckpointSet | None,
        Field(
            description="the newest complete checkpoint set at home: when, its files and bytes; absent when none",
            exclude_if=lambda v: v is None,
        ),
    ] = None
    attempts: Annotated[
        list[JobAttempt],
        Field(
            description="the attempts that ended, oldest first (at the end the last one too, for a job with a retry "
            "policy or more than one attempt): the machine, when each started and ended, and how; absent when none",
            exclude_if=lambda v: not v,
        ),
    ] = dataclasses.field(default_factory=list)
    # The pool the job named (jobs/placement.py): until it is placed, ``machine`` is the pool's name and
    # ``kind`` is ``pool``; once placed, they are the machine's and ``placement`` says why that one.
    pool: Annotated[
        str | None,
        Field(description="the pool the job named; absent when it named a machine", exclude_if=lambda v: v is None),
    ] = None
    placement: Annotated[
        str | None,
        Field(
            description="why its pool placed it on its machine (`placed on b: first with 1 free GPU`); absent "
            "until placed",
            exclude_if=lambda v: v is None,
        ),
    ] = None
    notices: Annotated[QuotaNotices, Field(exclude_if=lambda v: not v)] = dataclasses.field(default_factory=list)
    # The organization's tracking server, asked of its service at submit, for a job on one of its machines.
    tracking_uri: Annotated[
        str | None,
        Field(
            description="the MLflow tracking server its run is recorded on: the organization's, for a job on one of "
            "its machines where an admin set one; absent for the user's own store",
            exclude_if=lambda v: v is None,
        ),
    ] = None
    # The state before its last change (transitions.move writes it for a job with webhooks): what their
    # notice says it left.
    previous_state: Annotated[
        State | None,
        Field(
            description="the state it was in before its last change, for a job with webhooks (notify); absent "
            "until it first changed, and for a job without",
            exclude_if=lambda v: v is None,
        ),
    ] = None

    # Its webhooks' last deliveries (jobs/notify.py), one per webhook.
    deliveries: Annotated[
        list[WebhookDelivery],
        Field(
            description="how the last notice to each of its webhooks went (its own and its machine's): landed, "
            "or why not; absent until one was told",
            exclude_if=lambda v: not v,
        ),
    ] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.spec, JobSpec):
            self.spec = JobSpec.from_stored(self.spec)
        if self.outcome is not None and not isinstance(self.outcome, Outcome):
            self.outcome = Outcome.from_json(self.outcome)

    @property
    def name(self) -> str:
        return self.spec.display_name

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def waiting(self) -> bool:
        """In its pool's queue, on no machine yet (pools and machines never share a name)."""
        return self.pool is not None and self.machine == self.pool

    def to_json(self) -> dict[str, Any]:
        # Shallow on purpose: values are JSON already, and a deep copy dominates large stores.
        data = {name: getattr(self, name) for name in _JOB_FIELDS}
        data["spec"] = self.spec.to_json()
        data["outcome"] = None if self.outcome is None else self.outcome.to_json()
        for name, unset in _ADDED_FIELDS:
            if data[name] == unset:  # left out when unset: a record an older version wrote reads back the same
                del data[name]
        return data

    def public_json(self) -> dict[str, Any]:
        """What the API and the CLI show (``JobDetail``): no lease bookkeeping, a display name."""
        data = self.to_json()
        for name in HIDDEN:
            data.pop(name)
        data["name"] = self.name
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        if _JOB_FIELD_SET.issuperset(data):  # as this version writes it: no copy (100,000 jobs at start)
            return cls(**data)
        return cls(**{k: v for k, v in data.items() if k in _JOB_FIELD_SET})


class JobSummary(TypedDict):
    """A row of the job list (``GET /jobs``); ``reason`` is its first line only."""

    id: str
    name: str
    machine: str
    kind: str
    state: State
    reason: str | None
    created: str
    updated: str
    started: str | None
    ended: str | None
    exit_code: int | None
    mlflow_run_id: str | None


class SubmitResult(TypedDict):
    """``POST /jobs``'s answer: the job, and whether it was the same work already under way."""

    job: Job
    attached: bool


_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job))
_JOB_FIELD_SET = frozenset(_JOB_FIELDS)
#: Fields added after schema 1's first release, with the value that means "not set".
_ADDED_FIELDS: tuple[tuple[str, Any], ...] = (
    ("times", {}),
    ("user", None),
    ("checkpoint", None),
    ("attempts", []),
    ("pool", None),
    ("placement", None),
    ("previous_state", None),
    ("notices", []),
    ("tracking_uri", None),
    ("deliveries", []),
)
