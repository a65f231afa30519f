"""A job's state changes along the edges of its life only, and through one function."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_remote_compute.jobs.job import Job
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.jobs.transitions import (
    ACTIVE_STATES,
    EDGES,
    STATES,
    TERMINAL_STATES,
    IllegalTransition,
    move,
)


def _job(state: str) -> Job:
    return Job(
        id="j1", key="k", machine="local", kind="local", spec=JobSpec(machine="local", command="true"), state=state
    )


def test_the_path_of_a_job_that_trains_is_allowed_step_by_step() -> None:
    job = _job("queued")
    for to in ("sending", "pending", "queued", "sending", "running", "pending", "running", "collecting", "succeeded"):
        move(job, to)
        assert job.state == to


@pytest.mark.parametrize("ended", sorted(TERMINAL_STATES))
def test_an_ended_job_goes_nowhere(ended: str) -> None:
    for to in STATES:
        job = _job(ended)
        with pytest.raises(IllegalTransition, match=f"{ended} → {to}"):
            move(job, to)
        assert job.state == ended


@pytest.mark.parametrize(
    ("source", "to"),
    [
        ("queued", "running"),
        ("queued", "succeeded"),
        ("running", "succeeded"),
        ("running", "queued"),
        ("sending", "failed"),
    ],
)
def test_skipping_collection_or_going_back_is_refused(source: str, to: str) -> None:
    job = _job(source)
    before = job.updated
    with pytest.raises(IllegalTransition):
        move(job, to)
    assert (job.state, job.updated) == (source, before)


def test_every_state_is_in_the_table_and_every_active_state_can_end() -> None:
    assert set(EDGES) == set(STATES)
    reachable = {"queued"}
    frontier = ["queued"]
    while frontier:
        for nxt in EDGES[frontier.pop()]:
            if nxt not in reachable:
                reachable.add(nxt)
                frontier.append(nxt)
    assert reachable == set(STATES)
    for state in ACTIVE_STATES:
        assert "collecting" in EDGES[state] or state == "collecting"
    assert EDGES["collecting"] >= TERMINAL_STATES


def test_a_jobs_state_cannot_be_assigned_once_it_is_made() -> None:
    job = _job("running")
    with pytest.raises(IllegalTransition, match=r"transitions\.move"):
        job.state = "succeeded"
    assert job.state == "running"
    assert Job.from_json(job.to_json()).state == "running"  # read back from the state file as written


def test_a_job_cannot_be_made_in_a_state_that_does_not_exist() -> None:
    with pytest.raises(ValueError, match="'finished' is not a job state"):
        _job("finished")


def test_field_updates_refuse_a_state_that_bypasses_the_table(tmp_path: Path) -> None:
    from jupyter_remote_compute.jobs.leases import Leases

    with pytest.raises(TypeError, match="to="):
        Leases.update(object.__new__(Leases), "j1", state="succeeded")  # type: ignore[arg-type]
