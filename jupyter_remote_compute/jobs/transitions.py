"""A job's states, the edges between them, and the one function that moves a job along one.

    queued → sending → [pending ⇄] running → collecting → succeeded | failed | cancelled | lost
                                                  ↘ queued (the next attempt, under a retry policy)

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
from typing import TYPE_CHECKING

from ..schema.job import (
    _SLOT,
    ACTIVE_STATES,
    JOB_STATE,
    STATES,
    TERMINAL_STATES,
    IllegalTransition,
    State,
    StateField,
    utcnow,
)

if TYPE_CHECKING:
    from .job import Job

__all__ = [
    "ACTIVE_STATES",
    "EDGES",
    "JOB_STATE",
    "ON_MACHINE_STATES",
    "STATES",
    "TERMINAL_STATES",
    "IllegalTransition",
    "State",
    "StateField",
    "move",
]

#: The states a job's machine has it in: polled, cancelled and timed out the same way.
ON_MACHINE_STATES: frozenset[str] = frozenset({"pending", "running"})

#: Where a job may go from each state. Collection decides the end (an ``Outcome``) and the job
#: moves to ``collecting`` from wherever it was when that was decided: cancelled before it started
#: (queued, sending), stopped on its machine (pending, running), or given up while collecting.
EDGES: Mapping[str, frozenset[str]] = {
    # A job's sender that died is sent again by whoever picks it up: sending → sending.
    "queued": frozenset({"sending", "collecting"}),
    "sending": frozenset({"sending", "pending", "running", "collecting"}),
    "pending": frozenset({"queued", "running", "collecting"}),
    "running": frozenset({"pending", "collecting"}),
    # A collection that keeps failing ends with a new outcome decided while collecting; an attempt its
    # job's retry policy retries goes back to the queue as the next attempt (jobs/retries.py).
    "collecting": frozenset({"collecting", "queued"}) | TERMINAL_STATES,
    **{state: frozenset() for state in TERMINAL_STATES},
}


def move(job: Job, to: State, *, now: str | None = None) -> None:
    """Move ``job`` (read inside a store transaction) to ``to``, or raise ``IllegalTransition``."""
    if to not in EDGES.get(job.state, frozenset()):
        raise IllegalTransition(f"job {job.id}: {job.state} → {to} is not an edge of a job's life")
    # What its webhooks, or its machine's, are told it left (jobs/notify.py); others' records stay as small.
    if job.spec.notify or (job.machine_snapshot.get("options") or {}).get("notify"):
        job.previous_state = job.state
    job.__dict__[_SLOT] = to
    job.updated = now or utcnow()
