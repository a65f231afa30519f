"""A job's states, the edges between them, and the one function that moves a job along one.

    queued → sending → [pending ⇄] running → collecting → succeeded | failed | cancelled | lost

``pending``: the machine accepted the job and it waits for someone else (a scheduler, an agent, a
cloud provisioning); ``Job.reason`` says for what, in that party's words. A pending job whose machine
became ready for its files goes back to ``queued`` and is sent as usual.

Every change of ``Job.state`` is a call of ``move`` inside a store transaction; an edge that is not
in ``EDGES`` is a bug on this side and raises ``IllegalTransition`` instead of writing a state no
part of the lifecycle expects. ``StateField`` makes ``move`` the only writer: assigning a job's state
anywhere else raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from .job import Job

State = Literal["queued", "sending", "pending", "running", "collecting", "succeeded", "failed", "cancelled", "lost"]
STATES: tuple[State, ...] = get_args(State)
ACTIVE_STATES: frozenset[str] = frozenset({"queued", "sending", "pending", "running", "collecting"})
#: The states a job's machine has it in: polled, cancelled and timed out the same way.
ON_MACHINE_STATES: frozenset[str] = frozenset({"pending", "running"})
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "lost"})

#: Where a job may go from each state. Collection decides the end (an ``Outcome``) and the job
#: moves to ``collecting`` from wherever it was when that was decided: cancelled before it started
#: (queued, sending), stopped on its machine (pending, running), or given up while collecting.
EDGES: Mapping[str, frozenset[str]] = {
    # A job's sender that died is sent again by whoever picks it up: sending → sending.
    "queued": frozenset({"sending", "collecting"}),
    "sending": frozenset({"sending", "pending", "running", "collecting"}),
    "pending": frozenset({"queued", "running", "collecting"}),
    "running": frozenset({"pending", "collecting"}),
    # A collection that keeps failing ends with a new outcome decided while collecting.
    "collecting": frozenset({"collecting"}) | TERMINAL_STATES,
    **{state: frozenset() for state in TERMINAL_STATES},
}


class IllegalTransition(RuntimeError):
    """This side tried to move a job along an edge its life does not have (a bug, never the user's)."""


_SLOT = "_state"  # where a Job keeps its state, behind ``StateField``


class StateField:
    """``Job.state``: set once when the job is made; after that, only ``move`` changes it.

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
        if value not in EDGES:
            raise ValueError(f"job {job.id}: {value!r} is not a job state (one of {', '.join(STATES)})")
        job.__dict__[_SLOT] = value


#: The descriptor behind ``Job.state``.
JOB_STATE = StateField()


def move(job: Job, to: State, *, now: str | None = None) -> None:
    """Move ``job`` (read inside a store transaction) to ``to``, or raise ``IllegalTransition``."""
    from .job import utcnow

    if to not in EDGES.get(job.state, frozenset()):
        raise IllegalTransition(f"job {job.id}: {job.state} → {to} is not an edge of a job's life")
    job.__dict__[_SLOT] = to
    job.updated = now or utcnow()
