"""A job's state changes along the edges of its life only, and through one function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.jobs.store import Job
from jupyter_remote_compute.jobs.transitions import (
    ACTIVE_STATES,
    EDGES,
    STATES,
    TERMINAL_STATES,
    IllegalTransition,
    move,
)

PACKAGE = Path(__file__).resolve().parents[1] / "jupyter_remote_compute"


def _job(state: str) -> Job:
    return Job(id="j1", key="k", machine="local", kind="local", spec=JobSpec(machine="local", command="true"), state=state)


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
    [("queued", "running"), ("queued", "succeeded"), ("running", "succeeded"), ("running", "queued"), ("sending", "failed")],
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
    assert TERMINAL_STATES <= EDGES["collecting"]


def _state_writes(tree: ast.AST) -> list[int]:
    """Lines that assign to some object's ``state`` attribute outside a constructor."""
    lines = []

    class Finder(ast.NodeVisitor):
        def __init__(self) -> None:
            self.in_init = False

        def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
            was, self.in_init = self.in_init, node.name == "__init__"
            self.generic_visit(node)
            self.in_init = was

        def _targets(self, targets: list[ast.expr], line: int) -> None:
            for target in targets:
                parts = target.elts if isinstance(target, ast.Tuple) else [target]
                for part in parts:
                    if isinstance(part, ast.Attribute) and part.attr == "state" and not self.in_init:
                        lines.append(line)

        def visit_Assign(self, node: ast.Assign) -> None:
            self._targets(node.targets, node.lineno)
            self.generic_visit(node)

        def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
            self._targets([node.target], node.lineno)
            self.generic_visit(node)

        def visit_Call(self, node: ast.Call) -> None:
            func = node.func
            if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and name.value == "state":
                    lines.append(node.lineno)
            self.generic_visit(node)

    Finder().visit(tree)
    return lines


def test_transitions_move_is_the_only_code_that_sets_a_jobs_state() -> None:
    writers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = _state_writes(ast.parse(path.read_text(), str(path)))
        if found:
            writers[str(path.relative_to(PACKAGE))] = found
    assert list(writers) == ["jobs/transitions.py"], writers


def test_the_finder_sees_the_ways_a_state_could_be_written() -> None:
    code = "a.state = 1\nb.state, b.x = 2, 3\nsetattr(c, 'state', 4)\nclass K:\n    def __init__(s):\n        s.state = 0\n"
    assert _state_writes(ast.parse(code)) == [1, 2, 3]


def test_field_updates_refuse_a_state_that_bypasses_the_table(tmp_path: Path) -> None:
    from jupyter_remote_compute.jobs.leases import Leases

    with pytest.raises(TypeError, match="to="):
        Leases.update(object.__new__(Leases), "j1", state="succeeded")  # type: ignore[arg-type]
