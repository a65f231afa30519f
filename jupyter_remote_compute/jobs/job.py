"""A job as the state file keeps it (``Job``, how it will end: ``Outcome``), its id and its times."""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from ..errors import InvalidSettings
from .spec import JobSpec
from .transitions import ACTIVE_STATES, JOB_STATE, State


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


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a job will end, decided when it stopped running; collection records it and ends the job."""

    state: State  # one of TERMINAL_STATES
    reason: str | None = None
    reach_machine: bool = True  # False: the machine could not be reached, collect without asking it
    at: float | None = None  # when the job stopped on its machine, as this side saw it (epoch seconds)

    def to_json(self) -> dict[str, Any]:
        data = {"state": self.state, "reason": self.reason, "reach_machine": self.reach_machine}
        if self.at is not None:  # absent when unknown, so a record an older version wrote reads back the same
            data["at"] = self.at
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        at = data.get("at")
        return cls(
            data["state"], data.get("reason"), bool(data.get("reach_machine", True)), at if _is_number(at) else None
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
    machine_snapshot: dict[str, Any] = dataclasses.field(default_factory=dict)  # kind, address, options at submit
    handle: dict[str, Any] = dataclasses.field(default_factory=dict)  # the engine's own record
    exit_code: int | None = None
    outcome: Outcome | None = None  # the terminal state collection will set
    cancel_requested: str | None = None  # who asked
    outputs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # path -> {sha256, size}
    inputs: dict[str, int] = dataclasses.field(default_factory=dict)  # files, bytes
    transfer: dict[str, int] = dataclasses.field(default_factory=dict)  # bytes sent, files reused …
    mlflow_run_id: str | None = None
    log_size: int = 0
    lease: dict[str, Any] | None = None
    retries: int = 0
    failing_since: float | None = None  # when reaching the machine started failing (epoch seconds)
    # What the machine's scheduler said (epoch seconds): queued_at, started_at, ended_at, only those it
    # reported (RemoteStatus); usage prefers them to this side's own created/started/ended.
    times: dict[str, float] = dataclasses.field(default_factory=dict)
    user: str | None = None  # who submitted it, for the usage record

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

    def to_json(self) -> dict[str, Any]:
        # Shallow on purpose: values are JSON already, and asdict's deep copy dominates large stores.
        data = {name: getattr(self, name) for name in _JOB_FIELDS}
        data["spec"] = self.spec.to_json()
        data["outcome"] = None if self.outcome is None else self.outcome.to_json()
        for name, unset in _ADDED_FIELDS:
            if data[name] == unset:  # left out when unset: a record an older version wrote reads back the same
                del data[name]
        return data

    def public_json(self) -> dict[str, Any]:
        """What the API and the CLI show: no lease bookkeeping, a display name."""
        data = self.to_json()
        data.pop("lease")
        data["name"] = self.name
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        if _JOB_FIELD_SET.issuperset(data):  # as this version writes it: no copy (100,000 jobs at start)
            return cls(**data)
        return cls(**{k: v for k, v in data.items() if k in _JOB_FIELD_SET})


_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job))
_JOB_FIELD_SET = frozenset(_JOB_FIELDS)
#: Fields added after schema 1's first release, with the value that means "not set".
_ADDED_FIELDS: tuple[tuple[str, Any], ...] = (("times", {}), ("user", None))
