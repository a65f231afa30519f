"""When a job's attempt that ended goes back to the queue as its next attempt (``RetryPolicy``), and why
an attempt ended (``Cause``).

An attempt ends for a cause the lifecycle tells apart where the machine says so: ``lost`` (its process
vanished, its node failed), ``preempted`` (the scheduler took the machine back), ``machine_unreachable``
(the machine did not answer past its limit) or ``failed`` (the command exited non-zero). A policy names
the causes it retries; jobs/retries.py applies it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field, with_config
from pydantic_core import core_schema

from . import values
from .base import STRICT, absent, problem, to_json

Cause = Literal["lost", "preempted", "machine_unreachable", "failed"]
CAUSES: tuple[Cause, ...] = get_args(Cause)
#: What a policy retries when it does not say: the machine's faults, not the command's.
DEFAULT_ON: tuple[Cause, ...] = ("lost", "preempted", "machine_unreachable")
#: The causes after which the next attempt leaves the machine (jobs/retries.py, jobs/placement.py).
MACHINE_FAULTS: frozenset[str] = frozenset(DEFAULT_ON)
#: The most attempts after the first a job may ask for.
MAX_RETRIES = 100
#: The longest wait between two attempts, however the backoff doubles (seconds).
MAX_BACKOFF = 3600.0


def _max(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise problem(f"expected a whole number of retries (0 to {MAX_RETRIES}), got {value!r}")
    if not 0 <= value <= MAX_RETRIES:
        raise problem(f"must be 0 to {MAX_RETRIES}, got {value}")
    return value


def _causes(value: Any) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_ON
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)):
        raise problem(f"expected a list of {', '.join(CAUSES)}")
    for i, cause in enumerate(value):
        if cause not in CAUSES:
            raise problem(f"{cause!r} is not one of {', '.join(CAUSES)}", at=i)
    return tuple(dict.fromkeys(value))


def _exit_codes(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise problem("expected a list of exit codes (1 to 255)")
    for i, code in enumerate(value):
        if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= 255:
            raise problem(f"{code!r} is not an exit code of a failure (1 to 255; 0 is success)", at=i)
    return tuple(dict.fromkeys(value))


def _backoff(value: Any) -> float | None:
    seconds = values.duration(value)
    if seconds is not None and seconds > MAX_BACKOFF:
        raise problem(f"must be at most {MAX_BACKOFF:g} s")
    return seconds


@with_config(STRICT)
@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How many attempts after the first a job gets, and for which causes."""

    max: Annotated[
        int,
        BeforeValidator(_max, json_schema_input_type=Annotated[int, Field(ge=0, le=MAX_RETRIES)]),
        Field(description="attempts after the first, at most"),
    ] = 3
    on: Annotated[
        tuple[Cause, ...],
        BeforeValidator(_causes, json_schema_input_type=list[Cause] | None),
        Field(description=f"the causes of an attempt's end that are retried; none given: {', '.join(DEFAULT_ON)}"),
    ] = DEFAULT_ON
    exit_codes: Annotated[
        tuple[int, ...],
        BeforeValidator(_exit_codes, json_schema_input_type=list[Annotated[int, Field(ge=1, le=255)]] | None),
        Field(
            description="a failed attempt is retried when its exit code is one of these (with or without failed in "
            "on); none given: every failed attempt, when on names failed"
        ),
    ] = ()
    backoff: Annotated[
        float | None,
        BeforeValidator(_backoff, json_schema_input_type=float | str | None),
        Field(
            description="the wait before the first retry, doubled for each one after (seconds, or 30s, 5m; at most "
            f"{MAX_BACKOFF:g} s); null: none",
            exclude_if=absent,
        ),
    ] = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_before_validator_function(_policy_in, handler(source))

    @classmethod
    def from_stored(cls, data: Mapping[str, Any] | None) -> RetryPolicy | None:
        """As the state file keeps it: checked at submit, only rebuilt here."""
        if not data:
            return None
        return cls(
            max=int(data.get("max", 3)),
            on=tuple(data.get("on") or DEFAULT_ON),
            exit_codes=tuple(data.get("exit_codes") or ()),
            backoff=data.get("backoff"),
        )

    def to_json(self) -> dict[str, Any]:
        return to_json(RetryPolicy, self)

    def retries(self, cause: str | None, exit_code: int | None) -> bool:
        """Whether an attempt that ended for ``cause`` (with ``exit_code``) goes back to the queue."""
        if cause == "failed" and self.exit_codes:
            return exit_code in self.exit_codes
        return cause is not None and cause in self.on

    def wait_before(self, attempt: int) -> float:
        """Seconds between the end of attempt ``attempt - 1`` and the start of ``attempt`` (2, 3, …)."""
        if not self.backoff or attempt < 2:
            return 0.0
        return min(self.backoff * 2 ** min(attempt - 2, 32), MAX_BACKOFF)


def _policy_in(data: Any) -> Any:
    if isinstance(data, RetryPolicy):
        return data
    if isinstance(data, int) and not isinstance(data, bool):
        return {"max": data}  # ``retry: 3`` is short for ``retry: {max: 3}``
    if not isinstance(data, Mapping):
        raise problem("expected {max: N, on: [...], exit_codes: [...], backoff: 30s} or a number of retries")
    return data
